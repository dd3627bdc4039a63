"""Inference engines: closed-form CAVI (full-batch or stochastic, with step-size schedules and convergence
criteria), and the samplers -- kernels (blocked Gibbs, Laplace-preconditioned HMC) run by one driver
(:mod:`~gpytorch_augment.inference.mcmc`); :func:`posterior_sampler` picks between them."""

from .cavi import CAVI
from .convergence import CAVITrace, Convergence, HeldOut, RelativeChange
from .gibbs import GibbsKernel, GibbsSampler, HyperparameterGibbsKernel
from .hmc import HMCKernel, HMCSampler
from .mcmc import MCMC, ChainState, MCMCKernel, PosteriorPrediction, PosteriorSamples, PosteriorSummary, PosteriorTarget
from .sampler_choice import posterior_sampler
from .schedules import AdaptiveStep, ConstantStep, RobbinsMonro, StepSchedule, make_schedule

__all__ = [
    "AdaptiveStep",
    "CAVI",
    "CAVITrace",
    "ChainState",
    "ConstantStep",
    "Convergence",
    "GibbsKernel",
    "GibbsSampler",
    "HMCKernel",
    "HMCSampler",
    "HeldOut",
    "HyperparameterGibbsKernel",
    "MCMC",
    "MCMCKernel",
    "PosteriorPrediction",
    "PosteriorSamples",
    "PosteriorSummary",
    "PosteriorTarget",
    "RelativeChange",
    "RobbinsMonro",
    "StepSchedule",
    "make_schedule",
    "posterior_sampler",
]
