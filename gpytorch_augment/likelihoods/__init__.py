"""Augmented likelihoods: one file per likelihood, all implementing :class:`AugmentedLikelihood`."""

from .augmented_likelihood import AugmentedLikelihood
from .bernoulli import BernoulliLogitLikelihood
from .binomial import BinomialLogitLikelihood
from .heteroscedastic import HeteroscedasticGaussianLikelihood, HeteroscedasticStudentTLikelihood, NoiseVariance
from .laplace import LaplaceLikelihood, NormalLaplace
from .logistic_softmax import LogisticSoftmaxLikelihood
from .negative_binomial import NegativeBinomialLogitLikelihood
from .poisson import PoissonLogitLikelihood
from .student_t import StudentTLikelihood, StudentTPredictive

__all__ = [
    "AugmentedLikelihood",
    "BernoulliLogitLikelihood",
    "BinomialLogitLikelihood",
    "HeteroscedasticGaussianLikelihood",
    "HeteroscedasticStudentTLikelihood",
    "LaplaceLikelihood",
    "LogisticSoftmaxLikelihood",
    "NegativeBinomialLogitLikelihood",
    "NoiseVariance",
    "NormalLaplace",
    "PoissonLogitLikelihood",
    "StudentTLikelihood",
    "StudentTPredictive",
]
