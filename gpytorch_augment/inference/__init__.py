"""Inference engines: closed-form CAVI and blocked Gibbs sampling."""

from .cavi import CAVI, CAVITrace
from .gibbs import GibbsSampler, GibbsSamples

__all__ = ["CAVI", "CAVITrace", "GibbsSampler", "GibbsSamples"]
