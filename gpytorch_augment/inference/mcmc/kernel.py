r"""The sampler-kernel protocol: what a Markov transition on a :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget`
provides to the driver :class:`~gpytorch_augment.inference.mcmc.MCMC` (NumPyro's ``MCMCKernel`` / ``MCMC`` split).

A kernel moves a batch of chains, held in a kernel-specific plain container (its *chains*), and never loops over
iterations, records draws or touches generators' seeds: the driver does. One run is

.. code-block:: text

    chains = kernel.init(f0, init, num_warmup)            # f0: (C, T, N) starting latents
    for each of num_warmup iterations:  chains = kernel.step(chains, generator, adapt=True)
    chains = kernel.end_warmup(chains)                    # freeze what warm-up adapted
    for each later iteration:           chains = kernel.step(chains, generator, adapt=False)
                                        kept draws: record kernel.kept(chains)
    draws = kernel.draws(stacked kept values); last = kernel.last_state(chains)

Every ``step`` must leave the kernel's stationary distribution invariant once ``adapt`` is false (adaptation may
use the chains' history only during warm-up).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import Tensor

from .state import ChainState
from .target import PosteriorTarget

__all__ = ["MCMCKernel"]


class MCMCKernel(ABC):
    """A Markov transition kernel on a :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget`, for a batch of
    chains (see the module docstring for the protocol the driver follows).

    Subclasses set :attr:`target` and :attr:`name`, and implement :meth:`init`, :meth:`step`, :meth:`kept`,
    :meth:`draws` and :meth:`last_state`; :meth:`end_warmup`, :meth:`finish` and :attr:`samples_constants` have
    defaults.

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GPPrior
        >>> from gpytorch_augment.inference.gibbs import GibbsKernel
        >>> from gpytorch_augment.inference.mcmc import MCMC, MCMCKernel, PosteriorTarget
        >>> x = torch.linspace(-2, 2, 6, dtype=torch.float64).unsqueeze(-1)
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
        >>> kernel = GibbsKernel(PosteriorTarget(prior, BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double()))
        >>> isinstance(kernel, MCMCKernel)
        True
        >>> MCMC(kernel).sample(10, warmup=5, num_chains=2, seed=0, progress=False).f.shape
        torch.Size([2, 10, 6])
    """

    #: the posterior the kernel moves on
    target: PosteriorTarget
    #: a short name, recorded with the draws (``PosteriorSamples.f_update``)
    name: str = "mcmc"

    @property
    def samples_constants(self) -> bool:
        """Whether the chains also carry draws of the likelihood's constants (recorded as ``hyper``)."""
        return False

    @abstractmethod
    def init(self, f: Tensor, state: ChainState | None, num_warmup: int) -> Any:
        """The chains at the start of a run: starting latents ``f`` (C, T, N) (from ``state``, or prior draws),
        the validated ``init`` state if any (for what else it carries, e.g. step sizes or constants), and the number
        of warm-up iterations to come."""

    @abstractmethod
    def step(self, chains: Any, generator: torch.Generator, adapt: bool) -> Any:
        """One transition of every chain; ``adapt``: a warm-up iteration (the kernel may tune itself)."""

    def end_warmup(self, chains: Any) -> Any:
        """Called once after the last warm-up iteration (even for ``warmup=0``): freeze what warm-up tuned."""
        return chains

    @abstractmethod
    def kept(self, chains: Any) -> dict[str, Tensor]:
        """What to record of a kept iteration: named tensors, each with a leading chain dimension; the driver stacks
        them along a draw dimension and hands them to :meth:`draws` at the end of the run."""

    @abstractmethod
    def draws(self, kept: dict[str, Tensor]) -> dict[str, Any]:
        """The run's draws from the stacked kept values ``(chains, draws, ...)``: ``{"f": ..., "u": ... or None,
        "aux": {...}, "hyper": {...}}``, in the target's storage layout and the data's dtype."""

    @abstractmethod
    def last_state(self, chains: Any) -> ChainState:
        """The chains' state after the last iteration (the driver adds the generator state and the count)."""

    def finish(self, chains: Any, num_kept_iterations: int) -> None:  # noqa: B027 - optional hook
        """Called at the end of a run with the iterations after warm-up: report statistics (nothing by default)."""
