"""Variational strategies accepting closed-form CAVI updates."""

from .cavi_variational_strategy import CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy

__all__ = ["CAVIVariationalStrategy", "UnwhitenedCAVIVariationalStrategy"]
