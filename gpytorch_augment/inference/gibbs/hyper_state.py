r"""The state of :class:`~gpytorch_augment.inference.gibbs.HyperparameterGibbsKernel`'s chains between transitions
(:class:`HyperChains`) and the prior at a batch of hyper-parameters (:class:`PriorAt`), shared by the kernel, the
collapsed density of :math:`\theta` (:mod:`~gpytorch_augment.inference.gibbs.collapsed_density`) and its moves
(:mod:`~gpytorch_augment.inference.gibbs.theta_moves`)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from ...likelihoods.augmented_likelihood import AuxDict

if TYPE_CHECKING:
    from ..mcmc.target import PosteriorTarget

__all__ = ["HMC_LENGTH", "HyperChains", "PriorAt", "chain_likelihood", "whitened_latents"]

#: the HMC move's trajectory length a run of :math:`\theta` starts from (warm-up adapts it by ChEES)
HMC_LENGTH = 1.0


class HyperChains(NamedTuple):
    """The chains of :class:`~gpytorch_augment.inference.gibbs.HyperparameterGibbsKernel` between transitions: latents
    ``f`` (C, T, N), the last :math:`\\Omega` draw ``aux``, the likelihood's sampled ``constants``, the targets
    ``y``, the coordinates ``theta`` (C, P) and the prior at them (``mean`` (C, T, N), ``A`` = :math:`L^\\top` (C,
    T, N, N), ``log_prior`` (C,)), the slice ``width`` (C,) (HMC: the step sizes), the warm-up iterations adapted so
    far (``adapted``), and HMC's ``scale`` (P,) and trajectory ``length``. Inducing-point model: ``A`` =
    :math:`L_Z^{-1}K_{ZX}` (C, T, M, N), and at the same :math:`\\theta` the variances ``d`` (C, T, N) of
    :math:`p(f_i \\mid u)`, ``mu_Z`` (C, T, M), ``L`` = chol(K_ZZ + jitter I) (C, T, M, M), with the whitened
    inducing values ``v`` (C, T, M) of the last draw (``None`` before one). With the surrogate-data move: its
    ``noise`` :math:`S` (T, N) and slice width ``surrogate_width`` (C,). With latent moves: their step sizes
    ``latent_step`` (C,)."""

    f: Tensor
    aux: AuxDict
    constants: dict[str, Tensor]
    y: Tensor
    theta: Tensor
    mean: Tensor
    A: Tensor
    log_prior: Tensor
    width: Tensor
    adapted: int
    scale: Tensor | None = None
    length: float = HMC_LENGTH
    d: Tensor | None = None
    mu_Z: Tensor | None = None
    L: Tensor | None = None
    v: Tensor | None = None
    noise: Tensor | None = None
    surrogate_width: Tensor | None = None
    latent_step: Tensor | None = None

    @property
    def prior(self) -> PriorAt:
        """The prior at the chains' :math:`\\theta` (``ok`` ``None``: it was factorised when accepted)."""
        return PriorAt(self.mean, self.A, self.log_prior, None, self.d, self.mu_Z, self.L)


class PriorAt(NamedTuple):
    """The prior at a batch of coordinates (n, P): ``mean`` :math:`\\mu_X` (n, T, N), ``A`` (exact:
    :math:`L^\\top`, (n, T, N, N); inducing points: :math:`L_Z^{-1}K_{ZX}`, (n, T, M, N)), ``log_prior`` (n,),
    ``ok`` (n,) where every factorisation succeeded (``None``: known to), and for the inducing-point model ``d``,
    ``mu_Z``, ``L`` (see :class:`HyperChains`)."""

    mean: Tensor
    A: Tensor
    log_prior: Tensor
    ok: Tensor | None
    d: Tensor | None = None
    mu_Z: Tensor | None = None
    L: Tensor | None = None

    def extras(self) -> tuple[Tensor, ...]:
        """``(d, mu_Z, L)`` of the inducing-point model, else ``()`` (the tail of a slice move's payload)."""
        return () if self.d is None else (self.d, self.mu_Z, self.L)


def chain_likelihood(
    target: PosteriorTarget, chains: HyperChains, index: Tensor
) -> tuple[Tensor, AbstractContextManager]:
    """The targets of the chains ``index`` (their own where the chains carry targets per chain, as in Geweke's test)
    and the ``with`` block that evaluates the likelihood at their sampled constants."""
    per_chain = chains.y.dim() > target.y.dim()
    y = chains.y[index] if per_chain else chains.y
    return y, target.constants({k: v[index] for k, v in chains.constants.items()})


def whitened_latents(chains: HyperChains) -> Tensor:
    """The chains' whitened latents :math:`v = L_\\theta^{-1}(f - \\mu_\\theta)` (``A`` = :math:`L^\\top`), flattened
    to ``(C, T·N)``: the coordinates of the moves on the latents (exact model)."""
    v = torch.linalg.solve_triangular(chains.A.mT, (chains.f - chains.mean).unsqueeze(-1), upper=False)
    return v.squeeze(-1).reshape(chains.f.shape[0], -1)
