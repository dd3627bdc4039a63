r"""The sampler-kernel protocol: what a Markov transition on a :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget`
provides to the driver :class:`~gpytorch_augment.inference.mcmc.MCMC` (NumPyro's ``MCMCKernel`` / ``MCMC`` split).

A kernel moves a batch of chains, held in a container of its own choosing (its *chains*), and never loops over
iterations, records draws or touches generators' seeds: the driver does. A kernel implements two methods, and may
override declared hooks, each with a default:

* ``init(f, y, state, num_warmup)`` -- the chains at the starting latents, conditioned on the targets ``y``;
* ``step(chains, generator, adapt)`` -- one transition of every chain;
* a fresh start: ``overdisperse(chains, generator)`` (default: the chains as ``init`` built them) -- spreads what the
  starting latents do not, e.g. sampled hyper-parameters, so that :math:`\hat R` can see chains that settle apart;
* adaptation: ``end_warmup(chains)`` (default: nothing to freeze) -- warm-up itself is ``adapt=True`` steps, set up
  by ``init`` from ``num_warmup``;
* end of a run: ``finish(chains, num_kept_iterations)`` (default: no report);
* output: ``last_state(chains)`` (default: the latents ``chains.f``), ``kept(chains)`` (default: the last state's
  fields) and ``draws(kept)`` (default: those fields, stacked) -- a kernel overrides them where its chains hold
  other coordinates (HMC records its coordinates and maps them to ``f`` once, at the end).

One run of the driver is

.. code-block:: text

    chains = kernel.init(f0, y, init, num_warmup)         # f0: (C, T, N) starting latents, y: the targets
    without init: chains = kernel.overdisperse(chains, generator)
    for each of num_warmup iterations:  chains = kernel.step(chains, generator, adapt=True)
    chains = kernel.end_warmup(chains)                    # also for num_warmup = 0
    for each later iteration:           chains = kernel.step(chains, generator, adapt=False)
                                        kept draws: record kernel.kept(chains)
    draws = kernel.draws(stacked kept values); kernel.finish(chains, n); last = kernel.last_state(chains)

Rules: every ``step`` with ``adapt=False`` leaves the kernel's stationary distribution invariant (adaptation may use
the chains' history only during warm-up); every random draw comes from the ``generator`` handed in; the chains
depend on nothing but ``init``'s arguments and the steps taken, so a run is reproducible from its seed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, TypedDict, TypeVar

import torch
from torch import Tensor

from ...likelihoods.augmented_likelihood import AuxDict
from .state import ChainState
from .target import PosteriorTarget

__all__ = ["Chains", "Draws", "MCMCKernel"]

#: a kernel's own container of the chains between transitions (e.g. a ``NamedTuple``)
Chains = TypeVar("Chains")


class Draws(TypedDict):
    """The draws of a run (:meth:`MCMCKernel.draws`), each with leading dimensions ``(chains, draws)``, in the
    target's storage layout and the data's dtype."""

    f: Tensor
    u: Tensor | None
    aux: AuxDict
    hyper: dict[str, Tensor]


class MCMCKernel(ABC, Generic[Chains]):
    """A Markov transition kernel on a :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget`, for a batch of
    chains (the module docstring gives the protocol the driver follows).

    Subclasses set :attr:`target` and :attr:`name` and implement :meth:`init` and :meth:`step`; the hooks
    :meth:`end_warmup`, :meth:`finish`, :meth:`last_state`, :meth:`kept`, :meth:`draws` and the flag
    :attr:`samples_constants` have defaults. The output defaults read the latents ``chains.f``, ``(C, T, N)`` in
    the target's ``linalg_dtype``; chains without them override :meth:`last_state` (and :meth:`kept` /
    :meth:`draws` to record something cheaper than the state).

    Example (random-walk Metropolis on :math:`f`: two methods run under the driver)::

        >>> import gpytorch, torch
        >>> from typing import NamedTuple
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GPPrior
        >>> from gpytorch_augment.inference.mcmc import MCMC, MCMCKernel, PosteriorTarget
        >>> class Walk(NamedTuple):
        ...     f: torch.Tensor            # (C, T, N)
        ...     y: torch.Tensor
        ...     log_p: torch.Tensor        # (C,)
        >>> class RandomWalk(MCMCKernel[Walk]):
        ...     name = "random-walk"
        ...     def __init__(self, target):
        ...         self.target = target
        ...     def _log_p(self, f, y):  # log p(y | f) + log N(f | mu, K), in the whitened coordinates
        ...         terms = self.target.terms
        ...         v = torch.linalg.solve_triangular(terms.L, (f - terms.mu).unsqueeze(-1), upper=False)
        ...         log_lik = self.target.likelihood.log_prob_at(y, self.target.to_likelihood(f))
        ...         return log_lik.reshape(f.shape[0], -1).sum(-1) - 0.5 * v.square().sum((-3, -2, -1))
        ...     def init(self, f, y, state, num_warmup):
        ...         return Walk(f, y, self._log_p(f, y))
        ...     def step(self, chains, generator, adapt):
        ...         proposal = chains.f + 0.3 * torch.randn(chains.f.shape, generator=generator, dtype=chains.f.dtype)
        ...         log_p = self._log_p(proposal, chains.y)
        ...         u = torch.rand(log_p.shape, generator=generator, dtype=log_p.dtype)
        ...         accept = u.log() < log_p - chains.log_p
        ...         f = torch.where(accept.view(-1, 1, 1), proposal, chains.f)
        ...         return Walk(f, chains.y, torch.where(accept, log_p, chains.log_p))
        >>> x = torch.linspace(-2, 2, 6, dtype=torch.float64).unsqueeze(-1)
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
        >>> target = PosteriorTarget(prior, BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double())
        >>> samples = MCMC(RandomWalk(target)).sample(10, warmup=5, num_chains=2, seed=0, progress=False)
        >>> samples.f.shape, samples.f_update
        (torch.Size([2, 10, 6]), 'random-walk')
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
    def init(self, f: Tensor, y: Tensor, state: ChainState | None, num_warmup: int) -> Chains:
        """The chains at the start of a run: starting latents ``f`` (C, T, N) in ``linalg_dtype`` (from ``state``,
        or prior draws), conditioned on the canonical targets ``y`` (the training targets in a run; they may carry a
        chain dimension, ``(C, N)``), the validated ``init`` state if any (for what else it carries, e.g. step sizes
        or constants) and the number of warm-up iterations to come (0: adapt nothing)."""

    @abstractmethod
    def step(self, chains: Chains, generator: torch.Generator | None, adapt: bool) -> Chains:
        """One transition of every chain, drawing from ``generator`` only (``None``: torch's global generator);
        ``adapt``: a warm-up iteration (the kernel may tune itself)."""

    # ------------------------------------------------------------------ hooks with defaults
    def overdisperse(self, chains: Chains, generator: torch.Generator | None) -> Chains:
        """Called once after :meth:`init` in a run without an ``init`` state (a fresh start, whose latents are prior
        draws): spread the chains' other starting coordinates, drawing from ``generator`` only. Default: the chains
        unchanged."""
        return chains

    def end_warmup(self, chains: Chains) -> Chains:
        """Called once after the last warm-up iteration (also for ``warmup=0``): freeze what warm-up tuned. Default:
        the chains unchanged."""
        return chains

    def finish(self, chains: Chains, num_kept_iterations: int) -> None:  # noqa: B027 - optional hook
        """Called at the end of a run with the iterations after warm-up: report statistics. Default: nothing."""

    def last_state(self, chains: Chains) -> ChainState:
        """The chains' state after the last iteration (the driver adds the generator state and the count). Default:
        the latents ``chains.f`` in the target's storage layout and the data's dtype."""
        f = getattr(chains, "f", None)
        if not isinstance(f, Tensor):
            raise TypeError(
                f"{type(self).__name__}.last_state: the default reads the latents chains.f, which "
                f"{type(chains).__name__} does not hold; override last_state (and kept / draws)"
            )
        return ChainState(f=self.target.to_storage(f).to(self.target.dtype))

    def kept(self, chains: Chains) -> dict[str, Tensor]:
        """What to record of a kept iteration: named tensors, each with a leading chain dimension; the driver stacks
        them along a draw dimension and hands them to :meth:`draws` at the end of the run. Default: the fields of
        :meth:`last_state` -- ``f``, ``u`` if any, ``aux/<name>`` and ``hyper/<name>`` (a constant shared by the
        chains repeated per chain)."""
        state = self.last_state(chains)
        C = state.f.shape[0]
        out = {"f": state.f} if state.u is None else {"f": state.f, "u": state.u}
        out.update({"aux/" + name: value for name, value in state.aux.items()})
        for name, value in state.hyper.items():
            per_chain = value.dim() >= 1 and value.shape[0] == C
            out["hyper/" + name] = value if per_chain else value.expand((C,) + value.shape)
        return out

    def draws(self, kept: dict[str, Tensor]) -> Draws:
        """The run's draws from the stacked kept values ``(chains, draws, ...)``. Default: the fields recorded by the
        default :meth:`kept`, sorted back into ``f``, ``u``, ``aux`` and ``hyper``."""
        return Draws(
            f=kept["f"],
            u=kept.get("u"),
            aux={k.removeprefix("aux/"): v for k, v in kept.items() if k.startswith("aux/")},
            hyper={k.removeprefix("hyper/"): v for k, v in kept.items() if k.startswith("hyper/")},
        )
