"""Augmented likelihoods: one file per likelihood, all implementing :class:`AugmentedLikelihood`."""

from ..distributions.noise_variance import NoiseVariance
from ..distributions.normal_laplace import NormalLaplace
from ..distributions.student_t_predictive import StudentTPredictive
from .augmented_likelihood import AugmentedLikelihood
from .bayesian_svm import BayesianSVMLikelihood
from .bernoulli import BernoulliLogitLikelihood
from .binomial import BinomialLogitLikelihood
from .heteroscedastic_gaussian import HeteroscedasticGaussianLikelihood
from .heteroscedastic_student_t import HeteroscedasticStudentTLikelihood
from .laplace import LaplaceLikelihood
from .laplace_transform import LaplaceTransformLikelihood
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
    "LogisticSoftmaxLikelihood",
    "MaternThreeHalvesLikelihood",
    "MixingLaw",
    "NegativeBinomialLogitLikelihood",
    "NoiseVariance",
    "NormalLaplace",
    "OrdinalLogitLikelihood",
    "PairwiseLogitLikelihood",
    "PoissonLogitLikelihood",
    "PolyaGammaMixing",
    "StudentTLikelihood",
    "StudentTPredictive",
]
