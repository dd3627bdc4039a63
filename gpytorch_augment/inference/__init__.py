"""Inference engines: closed-form CAVI (full-batch or stochastic, with step-size schedules and convergence
criteria) and blocked Gibbs sampling."""

from .cavi import CAVI
from .convergence import CAVITrace, Convergence, HeldOut, RelativeChange
from .gibbs import GibbsSampler, GibbsSamples
from .schedules import AdaptiveStep, ConstantStep, RobbinsMonro, StepSchedule, make_schedule

__all__ = [
    "AdaptiveStep",
    "CAVI",
    "CAVITrace",
    "ConstantStep",
    "Convergence",
    "GibbsSampler",
    "GibbsSamples",
    "HeldOut",
    "RelativeChange",
    "RobbinsMonro",
    "StepSchedule",
    "make_schedule",
]
