"""GPyTorch marginal log-likelihoods (bounds) for augmented models."""

from .augmented_elbo import AugmentedELBO
from .collapsed_augmented_elbo import CollapsedAugmentedELBO

__all__ = ["AugmentedELBO", "CollapsedAugmentedELBO"]
