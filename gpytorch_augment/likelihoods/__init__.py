"""Augmented likelihoods: one file per likelihood, all implementing :class:`AugmentedLikelihood`."""

from .augmented_likelihood import AugmentedLikelihood
from .bernoulli import BernoulliLogitLikelihood

__all__ = ["AugmentedLikelihood", "BernoulliLogitLikelihood"]
