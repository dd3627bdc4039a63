r"""The driver: :class:`MCMC` runs any :class:`~gpytorch_augment.inference.mcmc.MCMCKernel` -- chains as one batch,
warm-up, thinning, recording, ``resume`` and chains spread over ``torch.distributed`` processes -- and returns the
draws as :class:`~gpytorch_augment.inference.mcmc.PosteriorSamples` (diagnostics, ArviZ export, prediction)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ...core.distributed import all_gather_objects, is_distributed, rank, world_size
from ...core.prior import with_linalg_advice
from ._arguments import check_count, check_init_state, check_seed, initial_state
from .kernel import MCMCKernel
from .recorder import Recorder
from .samples import PosteriorSamples
from .state import ChainState
from .target import PosteriorTarget

__all__ = ["MCMC", "rank_seed"]


class MCMC:
    r"""Runs vectorised chains of a sampler kernel and records the draws.

    :param kernel: the :class:`~gpytorch_augment.inference.mcmc.MCMCKernel` (e.g.
        :class:`~gpytorch_augment.inference.gibbs.GibbsKernel`,
        :class:`~gpytorch_augment.inference.hmc.HMCKernel`).

    The driver is composed with its kernel and forwards nothing: its own are the loop (:meth:`sample`,
    :meth:`resume`, :meth:`sweep`), :attr:`kernel` (the transition and its settings) and :attr:`target` (the
    kernel's posterior: model, likelihood, data, cached prior). :class:`~gpytorch_augment.GibbsSampler` and
    :class:`~gpytorch_augment.HMCSampler` are constructors of this driver with their kernel; build ``MCMC(kernel)``
    directly to run a kernel of your own.

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GPPrior
        >>> from gpytorch_augment.inference.hmc import HMCKernel
        >>> from gpytorch_augment.inference.mcmc import MCMC, PosteriorTarget
        >>> x = torch.linspace(-2, 2, 8, dtype=torch.float64).unsqueeze(-1)
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
        >>> target = PosteriorTarget(prior, BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double())
        >>> mcmc = MCMC(HMCKernel(target))
        >>> samples = mcmc.sample(20, warmup=20, num_chains=2, seed=0, progress=False)
        >>> samples.f.shape, mcmc.resume(samples, 5, progress=False).f.shape
        (torch.Size([2, 20, 8]), torch.Size([2, 25, 8]))
    """

    def __init__(self, kernel: MCMCKernel) -> None:
        if not isinstance(kernel, MCMCKernel):
            raise TypeError(f"kernel must be an MCMCKernel, got {type(kernel).__name__}")
        #: the transition kernel (its settings, e.g. ``kernel.overrelaxation`` or ``kernel.step_size``, live on it)
        self.kernel = kernel
        #: the posterior the kernel samples (model, likelihood, data, cached prior: ``target.likelihood``,
        #: ``target.jitter``, ``target.terms``, ``target.refresh()``, ...)
        self.target: PosteriorTarget = kernel.target

    @with_linalg_advice("sampling")
    def sample(
        self,
        num_samples: int,
        warmup: int = 200,
        thin: int = 1,
        num_chains: int = 1,
        seed: int | None = None,
        init: ChainState | Mapping[str, Any] | Tensor | None = None,
        progress: bool = True,
        process_group: Any = None,
    ) -> PosteriorSamples:
        r"""Run ``num_chains`` vectorised chains for ``warmup + num_samples * thin`` transitions.

        :param num_samples: draws kept per chain.
        :param warmup: transitions discarded at the start (the kernel adapts during them, if it adapts).
        :param thin: keep every ``thin``-th transition after warm-up.
        :param num_chains: chains, run as one batch.
        :param seed: seed of the ``torch.Generator`` driving every draw (the kernel's and the initial state). ``None``
            continues the generator state stored in ``init`` (a :class:`ChainState`), or draws a fresh seed
            from torch's global RNG (recorded in the result).
        :param init: starting point: a :class:`ChainState` (e.g. ``samples.last_state()``), a dict with key
            ``"f"``, or a tensor of latents, ``(N,)`` / ``(chains, N)`` (``(T, N)`` / ``(chains, T, N)``).
            Default: one prior draw per chain.
        :param progress: show a ``tqdm`` progress bar (silently none if ``tqdm`` is not installed).
        :param process_group: with ``torch.distributed`` initialised (this group, default: the default group), the
            ``num_chains`` chains are spread over the ranks (rank :math:`r` runs chains
            ``[r C / R, (r + 1) C / R)``), each rank seeded with its own seed derived from ``seed`` and its rank
            (:func:`rank_seed`, so a run is reproducible for a given world size), and rank 0 returns every rank's
            draws joined along the chain dimension (the other ranks return their own).
        :return: :class:`~gpytorch_augment.inference.mcmc.PosteriorSamples`.
        """
        check_seed(seed)
        if not is_distributed(process_group):
            return self._sample(num_samples, warmup, thin, num_chains, seed, init, progress)
        if seed is None or init is not None:
            raise ValueError("sampling over several processes needs an integer seed and no init")
        world, me = world_size(process_group), rank(process_group)
        bounds = [num_chains * r // world for r in range(world + 1)]
        local = bounds[me + 1] - bounds[me]
        if local < 1:
            raise ValueError(f"num_chains = {num_chains} is fewer than the {world} processes")
        samples = self._sample(num_samples, warmup, thin, local, rank_seed(seed, me, world), None, progress)
        gathered = all_gather_objects(samples.state_dict(), process_group)
        if me != 0:
            return samples
        runs = [PosteriorSamples.from_state_dict(state, sampler=self.target) for state in gathered]
        return PosteriorSamples.cat(runs, dim="chain")

    @torch.no_grad()
    def _sample(
        self,
        num_samples: int,
        warmup: int,
        thin: int,
        num_chains: int,
        seed: int | None,
        init: ChainState | Mapping[str, Any] | Tensor | None,
        progress: bool,
    ) -> PosteriorSamples:
        """:meth:`sample` in this process alone."""
        num_samples = check_count("num_samples", num_samples, 1)
        warmup = check_count("warmup", warmup, 0)
        thin = check_count("thin", thin, 1)
        num_chains = check_count("num_chains", num_chains, 1)
        check_seed(seed)
        kernel, target = self.kernel, self.target
        target.ensure_fresh()
        state = initial_state(init)
        if state is not None:
            check_init_state(target, state, num_chains, kernel.samples_constants)
        generator = torch.Generator(device=target.device)
        if seed is None and state is not None and state.rng_state is not None:
            try:
                generator.set_state(state.rng_state)
            except (RuntimeError, TypeError) as err:
                raise ValueError(
                    f"init.rng_state is not a generator state of this sampler's device ({target.device}): {err}; "
                    "pass seed= to start a fresh stream"
                ) from err
        else:
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,)).item())
            generator.manual_seed(int(seed))
        f = target.from_storage(state.f, num_chains) if state is not None else target.initial_f(num_chains, generator)
        start = time.perf_counter()
        chains = kernel.init(f, target.y, state, warmup)
        if state is None:
            chains = kernel.overdisperse(chains, generator)
        if warmup == 0:
            chains = kernel.end_warmup(chains)
        record = Recorder(num_chains, num_samples)
        total = warmup + num_samples * thin
        bar = _progress_bar(total, progress, type(kernel).__name__.removesuffix("Kernel"))
        try:
            for it in range(total):
                chains = kernel.step(chains, generator, adapt=it < warmup)
                if it == warmup - 1:
                    chains = kernel.end_warmup(chains)
                elif it >= warmup and (it - warmup + 1) % thin == 0:
                    record.keep(kernel.kept(chains))
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        draws = kernel.draws(record.stacked())
        kernel.finish(chains, total - warmup)
        elapsed = time.perf_counter() - start
        last = kernel.last_state(chains)
        last.rng_state = generator.get_state()
        last.num_sweeps = (state.num_sweeps if state is not None else 0) + total
        return PosteriorSamples(
            f=draws["f"],
            aux=draws["aux"],
            u=draws["u"],
            hyperparameters=draws["hyper"],
            f_update=kernel.name,
            jitter=target.jitter,
            seed=seed,
            warmup=warmup,
            thin=thin,
            elapsed=elapsed,
            num_sweeps=total,
            last=last,
            target=target,
        )

    def resume(self, samples: PosteriorSamples, num_samples: int, progress: bool = True) -> PosteriorSamples:
        """Continue the chains of ``samples`` for ``num_samples`` more draws (same thinning, no warm-up).

        The random stream continues from the stored generator state, so ``sample(n1)`` followed by
        ``resume(·, n2)`` gives bit for bit the draws of ``sample(n1 + n2)`` (a kernel whose chains move in
        coordinates other than ``f``, as HMC's, continues from the coordinates stored in the last state, not from
        ``f`` mapped back). Returns all draws, concatenated.
        (Runs joined with ``PosteriorSamples.cat(..., dim="chain")`` have no single generator state; they continue
        with a fresh seed.)

        :raises ValueError: naming ``samples`` if they do not fit the sampler's target, or were drawn by the other
            kind of sampler (HMC draws resumed by Gibbs, or the converse), before any transition runs.
        """
        samples.check_fits(self.target, "samples")
        kinds = {"hmc": "HMC", "hyper": "Gibbs with sampled hyper-parameters",
                 "hyper_hmc": "HMC with sampled hyper-parameters"}  # fmt: skip
        drawn_by, runs = kinds.get(samples.f_update, "Gibbs"), kinds.get(self.kernel.name, "Gibbs")
        if drawn_by != runs:  # the chain states differ (aux, step sizes, coordinates, θ)
            raise ValueError(
                f"samples were drawn by {drawn_by}, but this sampler runs {runs}: resume them with the kind of "
                "sampler that drew them (GibbsSampler or HMCSampler, with the same sample_hyperparameters), or start "
                "a new run with sample(..., init=samples.last_state().f)"
            )
        more = self.sample(
            num_samples,
            warmup=0,
            thin=samples.thin,
            num_chains=samples.num_chains,
            init=samples.last_state(),
            progress=progress,
        )
        return PosteriorSamples.cat([samples, more], dim="draw")


    @with_linalg_advice("sampling")
    @torch.no_grad()
    def sweep(
        self,
        f: Tensor,
        y: Tensor | None = None,
        generator: torch.Generator | None = None,
        hyper: Mapping[str, Tensor] | None = None,
    ) -> ChainState:
        r"""One transition of the kernel for a batch of chains, outside a run: no warm-up, no recording, and the
        kernel's starting settings (``init`` without a state, e.g. HMC's ``initial_step_size``). A building block
        (Geweke tests, custom schemes that also update hyper-parameters); to continue a run's chains with their
        adapted settings use ``sample(..., warmup=0, init=samples.last_state())``.

        :param f: current latents in storage layout, ``(chains, N)`` / ``(chains, T, N)`` (or without the chain
            dimension).
        :param y: targets to condition on (default: the training targets); may carry a chain dimension,
            ``(chains, N)``, e.g. for the successive-conditional simulator of a Geweke test.
        :param generator: a ``torch.Generator`` for reproducible draws.
        :param hyper: the chains' current values of the likelihood's sampled constants, and of the prior's
            hyper-parameters for a kernel that samples them (e.g. ``state.hyper`` of the previous sweep; default: the
            likelihood's and the model's own values; ignored by a kernel that does not sample them). The likelihood and
            the model themselves are never modified.
        :return: the kernel's :meth:`~gpytorch_augment.inference.mcmc.MCMCKernel.last_state` (``rng_state`` is
            ``None``; ``hyper`` holds the constants after the transition).

        Example::

            >>> import gpytorch, torch
            >>> from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler, GPPrior
            >>> x, y = torch.arange(4.0).double().unsqueeze(-1), torch.tensor([0.0, 0.0, 1.0, 1.0]).double()
            >>> sampler = GibbsSampler(GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel()),
            ...                        BernoulliLogitLikelihood(), x, y)
            >>> y_per_chain = torch.stack([y, 1.0 - y])                  # other targets for the second chain
            >>> state = sampler.sweep(torch.zeros(2, 4), y=y_per_chain, generator=torch.Generator().manual_seed(0))
            >>> state.f.shape, state.f.dtype
            (torch.Size([2, 4]), torch.float64)
        """
        kernel, target = self.kernel, self.target
        target.ensure_fresh()
        y = target.checked_targets(y)
        f_int = target.from_storage(f, None, name="f")
        state = ChainState(f=f, hyper=dict(hyper or {})) if hyper else None
        chains = kernel.end_warmup(kernel.init(f_int, y, state, 0))
        return kernel.last_state(kernel.step(chains, generator, adapt=False))


def _progress_bar(total: int, enabled: bool, desc: str) -> Any:
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, leave=False)


def rank_seed(seed: int, rank: int, world_size: int) -> int:
    """The seed of rank ``rank`` of ``world_size`` processes sampling with ``seed``
    (``numpy.random.SeedSequence(seed).spawn(world_size)[rank]``, as a 62-bit integer).

    Example::

        >>> from gpytorch_augment.inference.mcmc import rank_seed
        >>> seeds = [rank_seed(0, r, world_size=4) for r in range(4)]
        >>> len(set(seeds)), all(0 <= s < 2**62 for s in seeds)   # distinct, 62-bit
        (4, True)
        >>> rank_seed(0, 2, world_size=4) == seeds[2]              # reproducible
        True
    """
    child = np.random.SeedSequence(int(seed)).spawn(int(world_size))[int(rank)]
    return int(child.generate_state(1, dtype=np.uint64)[0] >> np.uint64(2))
