r"""The density the hyper-parameter moves of :class:`~gpytorch_augment.inference.gibbs.HyperparameterGibbsKernel`
sample: :class:`CollapsedThetaDensity`, the prior at a batch of raw coordinates :math:`\theta` (one factorisation per
chain) and

.. math::
    \log p(\theta \mid \Omega, y) = \log p(\theta) + \log \int \mathcal N(f \mid \mu_\theta, K_\theta)
    \prod_i e^{h_i f_i - \frac12\lambda_i f_i^2}\, df + \text{const},

the latents integrated out (:func:`~gpytorch_augment.core.collapsed_log_marginal`; with inducing points :math:`u`
and :math:`f` both; with latent blocks, one block's marginal times the other latents' prior density at their current
values). The maths: :mod:`~gpytorch_augment.inference.gibbs.hyper` and :doc:`/maths/engines`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ...core import WhitenedGaussian, collapsed_log_marginal, gaussian_log_density
from ...core.linalg import add_to_diagonal, tri_solve
from ..mcmc.prior_parameters import PriorParameters
from ..mcmc.slice import LogDensity
from ..mcmc.target import PosteriorTarget, conditional_variances
from .hyper_state import HyperChains, PriorAt

__all__ = ["CollapsedThetaDensity"]


class CollapsedThetaDensity:
    r"""The prior at a batch of hyper-parameters and the collapsed density of :math:`\theta` given the tilts of
    :math:`\Omega`: the part of :class:`~gpytorch_augment.inference.gibbs.HyperparameterGibbsKernel` that evaluates
    what its moves sample. A subclass provides ``target`` (the
    :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget`) and ``hyperparameters`` (its
    :class:`~gpytorch_augment.inference.mcmc.prior_parameters.PriorParameters`); :meth:`_collapsed` is the one place
    the density is formed (a test's broken variant overrides it)."""

    target: PosteriorTarget
    hyperparameters: PriorParameters

    def _prior(self, theta: Tensor, grad: bool = False) -> PriorAt:
        r"""The prior at coordinates ``theta`` (n, P) (:class:`PriorAt`): exact, ``A = chol(K + jitter I)ᵀ``;
        inducing points, the target's whitened terms at each :math:`\theta` (:math:`L_Z`, :math:`A`, :math:`d` as
        :meth:`PosteriorTarget.refresh` computes them at the model's). ``ok`` marks the chains whose factorisation
        succeeded. ``grad``: autograd's graph from ``theta`` is kept, and a failed factor is replaced by the identity
        (``ok`` false) so that the gradient stays finite."""
        target = self.target
        if target.is_sparse:
            return self._sparse_prior(theta, grad)
        mean, covar, log_prior = self.hyperparameters.evaluate(theta, grad=grad)
        K = add_to_diagonal((covar + covar.mT) / 2, target.jitter)
        L, ok = self._factor(K, theta.shape[0], grad)
        return PriorAt(mean, L.mT, log_prior, ok)

    @staticmethod
    def _factor(K: Tensor, num_chains: int, grad: bool) -> tuple[Tensor, Tensor]:
        """``(L, ok)``: the Cholesky factors of a batch and the chains whose factorisations all succeeded."""
        L, info = torch.linalg.cholesky_ex(K)
        if grad:
            eye = torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)
            L = torch.where((info == 0)[..., None, None], L, eye)
        return L, (info == 0).reshape(num_chains, -1).all(-1)

    def _sparse_prior(self, theta: Tensor, grad: bool = False) -> PriorAt:
        target = self.target
        Z, x = target.inducing_points, target.x
        if Z.shape[:-2] != x.shape[:-2]:
            batch = torch.broadcast_shapes(Z.shape[:-2], x.shape[:-2])
            Z, x = Z.expand(*batch, *Z.shape[-2:]), x.expand(*batch, *x.shape[-2:])
        M = Z.shape[-2]
        mean, K_ZZ, K_ZX, k_diag, log_prior = self.hyperparameters.evaluate_blocks(
            theta, torch.cat([Z.to(x), x], dim=-2), M, grad=grad
        )
        L, ok = self._factor(add_to_diagonal((K_ZZ + K_ZZ.mT) / 2, target.jitter), theta.shape[0], grad)
        A = tri_solve(L, K_ZX)
        d = conditional_variances(k_diag, A.square().sum(-2), target.jitter)
        return PriorAt(mean[..., M:], A, log_prior, ok, d, mean[..., :M], L)

    def _collapsed(
        self,
        mean: Tensor,
        A: Tensor,
        log_prior: Tensor,
        ok: Tensor | None,
        h: Tensor,
        lam: Tensor,
        d: Tensor | None = None,
        others: Tensor | None = None,
    ) -> tuple[Tensor, WhitenedGaussian]:
        r""":math:`\log p(\theta) + \log Z(\theta)` per chain (``-inf`` where not ``ok`` or not finite) and
        :math:`q(v)`, for the latents whose prior ``mean``, ``A`` (and variances ``d``, inducing points) are given;
        ``others`` adds the log prior density of the other latents at their current values (latent blocks)."""
        design = self.target.design
        A_obs, mean_obs = (A, mean) if design is None else (design.apply(A), design.apply(mean))
        log_z, q = collapsed_log_marginal(A_obs, mean_obs, h, lam, d)
        log_p = log_prior + log_z.sum(-1)
        if others is not None:
            log_p = log_p + others
        valid = torch.isfinite(log_p) if ok is None else torch.isfinite(log_p) & ok
        return torch.where(valid, log_p, torch.full_like(log_p, -math.inf)), q

    def collapsed_density(
        self, chains: HyperChains, h: Tensor, lam: Tensor, block: tuple[int, ...] | None = None
    ) -> tuple[Tensor, tuple[Tensor, ...], LogDensity]:
        r"""What the :math:`\theta` move samples: the log density of :math:`\theta` at the chains' current values,
        its payload there, and the closure ``log_density(theta, index)``
        (:data:`~gpytorch_augment.inference.mcmc.slice.LogDensity`), whose payload is
        ``(mean, A, log_prior, theta1, C, *extras)`` (:class:`PriorAt`, the block's :math:`q(v)`).

        Without ``block``: :math:`\log p(\theta) + \log Z(\theta)`, every latent integrated out with the tilts
        ``h``, ``lam`` (C, T, n) (inducing points: :math:`u` and :math:`f` integrated out, :func:`noisy_tilts
        <gpytorch_augment.core.noisy_tilts>`). With the latents ``block``: :math:`\log p(\theta) + \log
        Z_b(\theta) + \sum_{t \notin b} \log \mathcal N(f_t \mid \mu_{\theta,t}, K_{\theta,t})`, ``h``, ``lam``
        the tilts of all latents (the block's are used)."""
        density = self._density(chains, h, lam, block)
        current = chains.prior
        log_p0, q0 = density(current, None)
        payload0 = (current.mean, current.A, current.log_prior, q0.theta1, q0.C, *current.extras())

        def log_density(theta: Tensor, index: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
            prior = self._prior(theta)
            log_p, q = density(prior, index)
            return log_p, (prior.mean, prior.A, prior.log_prior, q.theta1, q.C, *prior.extras())

        return log_p0, payload0, log_density

    def _density(
        self, chains: HyperChains, h: Tensor, lam: Tensor, block: tuple[int, ...] | None
    ) -> Callable[[PriorAt, Tensor | None], tuple[Tensor, WhitenedGaussian]]:
        """``density(prior, index)``: :meth:`collapsed_density`'s log density and :math:`q(v)` of the chains
        ``index`` (``None``: all) at a :class:`PriorAt` of theirs."""
        picked = list(block) if block is not None else None
        rest = None
        if picked is not None:
            h, lam = h[:, picked], lam[:, picked]
            others = [t for t in range(self.target.num_latents) if t not in picked]
            rest = (others, chains.f[:, others]) if others else None

        def density(prior: PriorAt, index: Tensor | None) -> tuple[Tensor, WhitenedGaussian]:
            h_, lam_ = (h, lam) if index is None else (h[index], lam[index])
            f_rest = None if rest is None else rest[1] if index is None else rest[1][index]
            mean, A, d = prior.mean, prior.A, prior.d
            other = None
            if picked is not None:
                mean, A, d = mean[:, picked], A[:, picked], None if d is None else d[:, picked]
                if f_rest is not None:
                    idx = rest[0]
                    other = gaussian_log_density(f_rest, prior.mean[:, idx], prior.A[:, idx].mT).sum(-1)
            return self._collapsed(mean, A, prior.log_prior, prior.ok, h_, lam_, d, other)

        return density
