"""Preallocated storage for the kept draws of a Gibbs run (the driver's bookkeeping)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...likelihoods.augmented_likelihood import AuxDict
from .samples import GibbsSamples

if TYPE_CHECKING:
    from .sampler import GibbsSampler


class Recorder:
    """Preallocated storage for the kept draws of a run (latents, inducing values, Ω, sampled constants).

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler, GPPrior
        >>> x = torch.linspace(-2, 2, 5, dtype=torch.float64).unsqueeze(-1)
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
        >>> sampler = GibbsSampler(prior, BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double())
        >>> from gpytorch_augment.inference.gibbs.recorder import Recorder
        >>> rec = Recorder(sampler, num_chains=2, num_samples=3)
        >>> rec.f.shape, rec.u is None, rec.kept             # (chains, draws, T, N); no inducing values
        (torch.Size([2, 3, 1, 5]), True, 0)
    """

    def __init__(self, sampler: GibbsSampler, num_chains: int, num_samples: int) -> None:
        self.sampler = sampler
        self.num_chains, self.num_samples = num_chains, num_samples
        T, N = sampler.num_latents, sampler.num_data
        kw = {"dtype": sampler.dtype, "device": sampler.device}
        self.f = torch.empty((num_chains, num_samples, T, N), **kw)
        self.u = None
        if sampler.is_sparse:
            self.u = torch.empty((num_chains, num_samples, T, sampler.terms.L.shape[-1]), **kw)
        self.aux: dict[str, Tensor] = {}
        self.hyper: dict[str, list[Tensor]] = {}
        self.kept = 0

    def keep(self, f: Tensor, aux: AuxDict, v: Tensor | None, constants: Mapping[str, Tensor]) -> None:
        sampler, k = self.sampler, self.kept
        self.f[:, k] = f.to(sampler.dtype)
        if self.u is not None:
            self.u[:, k] = sampler._u_from_v(v).to(sampler.dtype)
        for name, value in aux.items():
            value = sampler._chain_batched(value, self.num_chains)
            if name not in self.aux:
                self.aux[name] = torch.empty(
                    (self.num_chains, self.num_samples) + value.shape[1:], dtype=value.dtype, device=value.device
                )
            self.aux[name][:, k] = value
        for name, value in sampler._hyper_snapshot(constants).items():
            self.hyper.setdefault(name, []).append(value)
        self.kept += 1

    def keep_block(self, f: Tensor) -> None:
        """Several kept draws ``(chains, draws, T, N)`` at once, for a sampler that records nothing but the latents
        (:class:`~gpytorch_augment.HMCSampler`)."""
        k = self.kept
        self.f[:, k : k + f.shape[1]] = f.to(self.sampler.dtype)
        self.kept += f.shape[1]

    def samples(self, **settings: Any) -> GibbsSamples:
        sampler = self.sampler
        return GibbsSamples(
            f=sampler._to_storage(self.f),
            aux=self.aux,
            u=sampler._to_storage(self.u) if self.u is not None else None,
            f_update=sampler.f_update if not sampler.is_sparse else "sparse",
            jitter=sampler.jitter,
            hyper={k: _stack_hyper(v, self.num_chains) for k, v in self.hyper.items()},
            sampler=sampler,
            **settings,
        )


def _stack_hyper(values: list[Tensor], num_chains: int) -> Tensor:
    """Per-draw hyper-parameter values -> (chains, draws, ...): per-chain values (leading dimension = chains)
    keep their chain; shared values are repeated for every chain."""
    stacked = torch.stack([torch.as_tensor(v) for v in values], dim=0)  # (draws, *shape)
    if stacked.dim() >= 2 and stacked.shape[1] == num_chains:
        return stacked.movedim(0, 1)
    return stacked.unsqueeze(0).expand((num_chains,) + stacked.shape)
