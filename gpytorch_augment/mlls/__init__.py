"""GPyTorch marginal log-likelihoods (bounds) for augmented models."""

from .augmented_elbo import AugmentedELBO

__all__ = ["AugmentedELBO"]
