"""Inference engines: closed-form CAVI (full-batch or stochastic, with step-size schedules and convergence
criteria) blocked Gibbs sampling and Laplace-preconditioned HMC (:func:`posterior_sampler` picks between them)."""

from .cavi import CAVI
from .convergence import CAVITrace, Convergence, HeldOut, RelativeChange
from .gibbs import GibbsSampler, GibbsSamples
from .hmc import HMCSampler
from .sampler_choice import posterior_sampler
from .schedules import AdaptiveStep, ConstantStep, RobbinsMonro, StepSchedule, make_schedule

__all__ = [
    "AdaptiveStep",
    "CAVI",
    "CAVITrace",
    "ConstantStep",
    "Convergence",
    "GibbsSampler",
    "GibbsSamples",
    "HMCSampler",
    "HeldOut",
    "RelativeChange",
    "RobbinsMonro",
    "StepSchedule",
    "make_schedule",
    "posterior_sampler",
]
