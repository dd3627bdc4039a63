"""Augmented likelihoods: one file per likelihood, all implementing :class:`AugmentedLikelihood`."""

from .augmented_likelihood import AugmentedLikelihood
from .bernoulli import BernoulliLogitLikelihood
from .binomial import BinomialLogitLikelihood
from .negative_binomial import NegativeBinomialLogitLikelihood
from .poisson import PoissonLogitLikelihood

__all__ = [
    "AugmentedLikelihood",
    "BernoulliLogitLikelihood",
    "BinomialLogitLikelihood",
    "NegativeBinomialLogitLikelihood",
    "PoissonLogitLikelihood",
]
