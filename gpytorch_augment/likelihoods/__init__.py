"""Augmented likelihoods: one file per likelihood, all implementing :class:`AugmentedLikelihood`.

``__all__`` below is the one export list of the likelihoods: the top-level package re-exports it, the API reference
documents it and the documentation build generates the likelihood tables from it. A new likelihood adds its module,
its test case (``tests/likelihoods/cases_*.py``) and its name here."""

from .augmented_likelihood import AugmentedLikelihood
from .bayesian_svm import BayesianSVMLikelihood
from .bernoulli import BernoulliLogitLikelihood
from .binomial import BinomialLogitLikelihood
from .heteroscedastic_gaussian import HeteroscedasticGaussianLikelihood
from .heteroscedastic_student_t import HeteroscedasticStudentTLikelihood
from .laplace import LaplaceLikelihood
from .laplace_transform import LaplaceTransformLikelihood
from .logistic_noise import LogisticNoiseLikelihood
from .logistic_softmax import LogisticSoftmaxLikelihood
from .matern import MaternThreeHalvesLikelihood
from .mixing_laws import GammaMixing, InverseGammaMixing, LaplaceTransformMixing, MixingLaw, PolyaGammaMixing
from .negative_binomial import NegativeBinomialLogitLikelihood
from .ordinal import OrdinalLogitLikelihood
from .pairwise import PairwiseLogitLikelihood
from .poisson import PoissonLogitLikelihood
from .student_t import StudentTLikelihood

__all__ = [
    "AugmentedLikelihood",
    "BayesianSVMLikelihood",
    "BernoulliLogitLikelihood",
    "BinomialLogitLikelihood",
    "HeteroscedasticGaussianLikelihood",
    "HeteroscedasticStudentTLikelihood",
    "GammaMixing",
    "InverseGammaMixing",
    "LaplaceLikelihood",
    "LaplaceTransformLikelihood",
    "LaplaceTransformMixing",
    "LogisticNoiseLikelihood",
    "LogisticSoftmaxLikelihood",
    "MaternThreeHalvesLikelihood",
    "MixingLaw",
    "NegativeBinomialLogitLikelihood",
    "OrdinalLogitLikelihood",
    "PairwiseLogitLikelihood",
    "PoissonLogitLikelihood",
    "PolyaGammaMixing",
    "StudentTLikelihood",
]
