"""Inference engines: closed-form CAVI and blocked Gibbs sampling."""

from .cavi import CAVI, CAVITrace

__all__ = ["CAVI", "CAVITrace"]
