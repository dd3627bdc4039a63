"""Auxiliary-variable distributions used by the augmented likelihoods."""

from .polya_gamma import PolyaGamma

# more auxiliary distributions are added by other modules

__all__ = ["PolyaGamma"]
