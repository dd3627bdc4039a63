r"""The sampler framework, split as NumPyro splits MCMC:

* :mod:`~gpytorch_augment.inference.mcmc.target` -- :class:`PosteriorTarget`, the posterior every sampler targets
  (model, likelihood, data, the cached prior, the layouts of the latents);
* :mod:`~gpytorch_augment.inference.mcmc.kernel` -- :class:`MCMCKernel`, the protocol of a transition on it:
  ``init`` and ``step``, plus hooks with defaults (the Gibbs sweep
  :class:`~gpytorch_augment.inference.gibbs.GibbsKernel` and Laplace-preconditioned HMC
  :class:`~gpytorch_augment.inference.hmc.HMCKernel` are siblings implementing it);
* :mod:`~gpytorch_augment.inference.mcmc.driver` -- :class:`MCMC`, the driver composed with any kernel,
  ``MCMC(kernel)`` (chains, warm-up, thinning, recording, ``resume``, one ``sweep``, chains over several
  processes); :class:`~gpytorch_augment.GibbsSampler` and :class:`~gpytorch_augment.HMCSampler` are constructors
  of it;
* :mod:`~gpytorch_augment.inference.mcmc.state` and :mod:`~gpytorch_augment.inference.mcmc.samples` -- the
  containers (:class:`ChainState`; :class:`PosteriorSamples` with diagnostics, ArviZ export and prediction);
* the moves and adaptation every engine shares: :mod:`~gpytorch_augment.inference.mcmc.hmc_move` (one HMC move of
  a batch of chains), :mod:`~gpytorch_augment.inference.mcmc.slice` (a slice move) and
  :mod:`~gpytorch_augment.inference.mcmc.adaptation` (dual averaging of step sizes, ChEES trajectory lengths);
* R̂/ESS live in :mod:`gpytorch_augment.inference.diagnostics`.
"""

from .driver import MCMC, rank_seed
from .kernel import Draws, MCMCKernel
from .prediction import PosteriorPrediction
from .samples import PosteriorSamples
from .state import ChainState
from .summary import PosteriorSummary
from .target import LINALG_DTYPE, PosteriorTarget, TargetPriorTerms

__all__ = [
    "LINALG_DTYPE",
    "MCMC",
    "ChainState",
    "Draws",
    "MCMCKernel",
    "PosteriorPrediction",
    "PosteriorSamples",
    "PosteriorSummary",
    "PosteriorTarget",
    "TargetPriorTerms",
    "rank_seed",
]
