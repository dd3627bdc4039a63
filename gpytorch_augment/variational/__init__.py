"""Variational strategies accepting closed-form CAVI updates, and inducing-point initialisation."""

from .cavi_variational_strategy import CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy
from .inducing_points import greedy_variance, kmeans_plus_plus

__all__ = ["CAVIVariationalStrategy", "UnwhitenedCAVIVariationalStrategy", "greedy_variance", "kmeans_plus_plus"]
