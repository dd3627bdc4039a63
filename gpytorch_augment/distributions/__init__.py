"""Auxiliary-variable distributions used by the augmented likelihoods (``torch.distributions`` style)."""

from .auxiliary import AuxiliaryDistribution
from .inverse_gaussian import InverseGamma, InverseGaussian
from .polya_gamma import PolyaGamma

__all__ = ["AuxiliaryDistribution", "InverseGamma", "InverseGaussian", "PolyaGamma"]
