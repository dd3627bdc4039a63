r"""The blocked Gibbs sweep: :math:`\Omega \mid f`, then the latents :math:`\mid \Omega`, for a batch of chains.

Given the auxiliary variables :math:`\Omega`, every augmented likelihood contributes a Gaussian tilt
:math:`\exp(h_i f_i - \tfrac12 \lambda_i f_i^2)` to the latent GP, so one sweep is

1. :math:`\Omega \sim p(\Omega \mid y, f)` (``likelihood.sample_aux``), independently over data points, then the
   likelihood's own constants given :math:`(\Omega, f)` (``likelihood.sample_hyperparameters``, a no-op unless the
   likelihood has a conjugate prior on them);
2. :math:`(h, \lambda) = ` ``likelihood.potential_and_precision(y, Ω, f)``;
3. :math:`f \sim \mathcal N\big(\mu_0 + \Sigma (h - \Lambda \mu_0),\ \Sigma\big)`,
   :math:`\Sigma = (K^{-1} + \Lambda)^{-1}` (exact model), or, with inducing points :math:`Z`, the VI-Gibbs step:
   the core's whitened draw :math:`v \sim q^*_\alpha(v) = \mathcal N(B^{-1} b, B^{-1})` for the statistics of the
   Power-EP pseudo-observations :math:`(h_i, \lambda_i) / (1 + \alpha\lambda_i d_i)`, :math:`u = \mu_Z + L v`, then
   :math:`f_i \sim p(f_i \mid u) = \mathcal N(\mu_i + a_i^\top v,\ d_i)` (:mod:`gpytorch_augment.core`).

The kernel talks to the likelihood only through the :class:`~gpytorch_augment.likelihoods.AugmentedLikelihood`
protocol and to the model only through ``model.forward(x)`` (the prior). Chains are a batch dimension: one batched
Cholesky factorisation and one pair of batched triangular solves per sweep serve every chain.

:class:`GibbsKernel` implements the :class:`~gpytorch_augment.inference.mcmc.MCMCKernel` protocol on a
:class:`~gpytorch_augment.inference.mcmc.PosteriorTarget` (which caches the prior, in ``linalg_dtype``);
:class:`~gpytorch_augment.GibbsSampler` constructs the driver composed with one. Numerics: every solve is an explicit
(batched) Cholesky / triangular solve; the exact model's :math:`f`-update uses the GPML-stable matrix
:math:`B' = I + \Lambda^{1/2}(K + \epsilon I)\Lambda^{1/2}` when every :math:`\lambda_i > 0` and the whitened
:math:`B = I + L^\top\Lambda L` otherwise (both have eigenvalues :math:`\ge 1`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from ...core import SufficientStatistics, WhitenedGaussian
from ...core.linalg import add_to_diagonal, tri_solve, vecmat
from ...core.prior import with_linalg_advice
from ...likelihoods.augmented_likelihood import AuxDict
from ..mcmc.kernel import MCMCKernel
from ..mcmc.state import ChainState
from ..mcmc.target import PosteriorTarget, TargetPriorTerms

__all__ = ["F_UPDATES", "GibbsChains", "GibbsKernel"]

#: the ``f_update`` options of :class:`GibbsKernel`
F_UPDATES = ("auto", "whitened")


class GibbsChains(NamedTuple):
    """The chains of a Gibbs run between sweeps: latents ``f`` (C, T, N, internal layout), the last Ω draw ``aux``,
    the whitened inducing values ``v`` of the sparse model (else ``None``), the chains' sampled likelihood
    ``constants`` (empty unless the likelihood samples them) and the targets ``y`` the chains condition on."""

    f: Tensor
    aux: AuxDict
    v: Tensor | None
    constants: dict[str, Tensor]
    y: Tensor


class GibbsKernel(MCMCKernel[GibbsChains]):
    r"""One sweep of the blocked Gibbs sampler over a batch of chains (see the module docstring and
    :class:`~gpytorch_augment.GibbsSampler` for the maths of each option).

    :param target: the :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget` (with ``inducing_points``: the
        VI-Gibbs sampler).
    :param f_update: ``"auto"`` or ``"whitened"`` (exact model).
    :param overrelaxation: :math:`a \in (-1, 1)` of the over-relaxed :math:`f`-update (exact model; 0: plain Gibbs).
    :param alpha: the Power-EP :math:`\alpha \in [0, 1]` of the inducing-point sampler (0: Titsias).

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GPPrior
        >>> from gpytorch_augment.inference.gibbs import GibbsKernel
        >>> from gpytorch_augment.inference.mcmc import PosteriorTarget
        >>> x = torch.linspace(-2, 2, 5, dtype=torch.float64).unsqueeze(-1)
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
        >>> kernel = GibbsKernel(PosteriorTarget(prior, BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double()))
        >>> g = torch.Generator().manual_seed(0)
        >>> chains = kernel.init(torch.zeros(3, 1, 5, dtype=torch.float64), kernel.target.y, None, num_warmup=0)
        >>> kernel.last_state(kernel.step(chains, g, adapt=False)).f.shape  # one sweep of 3 chains
        torch.Size([3, 5])
    """

    def __init__(
        self, target: PosteriorTarget, f_update: str = "auto", overrelaxation: float = 0.0, alpha: float = 0.0
    ) -> None:
        if f_update not in F_UPDATES:
            raise ValueError(f"f_update must be one of {F_UPDATES}, got {f_update!r}")
        if isinstance(overrelaxation, bool) or not isinstance(overrelaxation, (int, float)) or not (
            -1.0 < overrelaxation < 1.0
        ):
            raise ValueError(f"overrelaxation must be a number in (-1, 1), got {overrelaxation!r}")
        if overrelaxation != 0.0 and target.is_sparse:
            raise ValueError(
                "overrelaxation is implemented for the exact model only (the inducing-point chain state holds f, "
                "not the inducing values v it would need); use overrelaxation=0 with inducing_points"
            )
        if target.design is not None and target.is_sparse:
            raise ValueError(
                f"{type(target.likelihood).__name__} reads linear combinations of the latents: the Gibbs sampler "
                "supports it on the exact model only (no inducing_points)"
            )
        self.alpha = check_alpha(alpha, target.is_sparse)
        self.target = target
        self.f_update = f_update
        self.overrelaxation = float(overrelaxation)
        self._workspace: dict[tuple, Any] = {}
        self._version = target.version

    @property
    def name(self) -> str:  # type: ignore[override]
        return "sparse" if self.target.is_sparse else self.f_update

    @property
    def samples_constants(self) -> bool:
        """Whether the likelihood draws its constants given (Ω, f) in every sweep (``sample_hyperparameters``)."""
        return self.target.has_constant_sampler

    @property
    def workspace(self) -> dict[tuple, Any]:
        """Work buffers and per-block prior terms, valid for the target's current prior (emptied on a refresh)."""
        if self._version != self.target.version:
            self._workspace, self._version = {}, self.target.version
        return self._workspace

    # ------------------------------------------------------------------ the MCMCKernel protocol
    def init(self, f: Tensor, y: Tensor, state: ChainState | None, num_warmup: int) -> GibbsChains:
        constants = self.target.initial_constants(state) if self.samples_constants else {}
        return GibbsChains(f, {}, None, constants, y)

    def step(self, chains: GibbsChains, generator: torch.Generator | None, adapt: bool) -> GibbsChains:
        return GibbsChains(*self._sweep(chains.f, chains.y, generator, chains.constants), chains.y)

    def last_state(self, chains: GibbsChains) -> ChainState:
        """The latents, the last Ω draw, the inducing values (sparse model) and the sampled constants; recorded
        for every kept draw too (the default ``kept`` / ``draws``)."""
        target, C = self.target, chains.f.shape[0]
        u = None
        if chains.v is not None and target.is_sparse:
            u = target.to_storage(target.u_from_v(chains.v)).to(target.dtype)
        return ChainState(
            f=target.to_storage(chains.f).to(target.dtype),
            aux={k: target.chain_batched(val, C) for k, val in chains.aux.items()},
            u=u,
            hyper=self._constants_snapshot(chains.constants, chains.f.shape[0]),
        )

    def _constants_snapshot(self, constants: Mapping[str, Tensor], num_chains: int) -> dict[str, Tensor]:
        """The likelihood's constants at the chains' values, ``(num_chains, *shape)`` each, if the chains sample them
        (else empty)."""
        return self.target.constants_snapshot(constants, num_chains) if self.samples_constants else {}

    # ------------------------------------------------------------------ public building blocks
    @with_linalg_advice("sampling")
    @torch.no_grad()
    def sample_latent(
        self, h: Tensor, lam: Tensor, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        r"""One draw of the latents given potentials and precisions (the :math:`f \mid \Omega` step).

        :param h: potentials in the likelihood's layout, ``(..., N)`` (``(..., T, N)`` for ``T`` latents);
            leading dimensions are chains.
        :param lam: precisions, same shape.
        :return: ``{"f": f}`` in storage layout, plus ``{"u": u, "v": v}`` for the sparse model
            (:math:`v \sim q^*_\alpha(v)`, for ``alpha = 0`` the CAVI :math:`q(v)` of these :math:`(h,\lambda)`,
            and :math:`f_i \sim p(f_i \mid u)`).
        """
        target = self.target
        T, N = target.num_latents, target.num_observations
        batch = torch.broadcast_shapes(h.shape, lam.shape)[: -1 if T == 1 else -2]
        shape = torch.Size(batch) + (T, N)
        h_, lam_ = target.from_likelihood(h, shape), target.from_likelihood(lam, shape)
        f, v = self._latent_draw(h_, lam_, generator)
        out = {"f": target.to_storage(f).to(target.dtype)}
        if target.is_sparse:
            out["v"] = target.to_storage(v).to(target.dtype)
            out["u"] = target.to_storage(target.u_from_v(v)).to(target.dtype)
        return out

    @with_linalg_advice("sampling")
    @torch.no_grad()
    def inducing_distribution(self, h: Tensor, lam: Tensor) -> MultivariateNormal:
        r""":math:`q^*_\alpha(u)` of the inducing-point model for potentials and precisions ``h``, ``lam`` (the
        likelihood's layout, leading dimensions batch): the distribution the sparse sweep draws :math:`u` from.

        :return: a ``MultivariateNormal`` over :math:`u`, batch ``(*batch)`` / ``(*batch, T)``, in float64.
        """
        target = self.target
        if not target.is_sparse:
            raise ValueError("inducing_distribution needs inducing_points")
        target.ensure_fresh()
        T, N = target.num_latents, target.num_data
        batch = torch.broadcast_shapes(h.shape, lam.shape)[: -1 if T == 1 else -2]
        shape = torch.Size(batch) + (T, N)
        q = self._q_alpha(target.terms, target.from_likelihood(h, shape), target.from_likelihood(lam, shape))
        root = target.terms.L @ q.chol_covariance  # u = mu_Z + L v
        mean, covar = target.u_from_v(q.mean), root @ root.mT
        if T == 1:
            mean, covar = mean.squeeze(-2), covar.squeeze(-3)
        return MultivariateNormal(mean, covar)

    # ------------------------------------------------------------------ the f | Omega draws
    def _buffer(
        self, name: str, shape: torch.Size, dtype: torch.dtype | None = None, column_major: bool = False
    ) -> Tensor:
        """A work tensor reused across sweeps (a fresh multi-megabyte tensor per sweep costs page faults)."""
        dtype = dtype or self.target.linalg_dtype
        key = (name, tuple(shape), dtype, column_major)
        buf = self.workspace.get(key)
        if buf is None:
            if column_major:
                buf = torch.empty(*shape[:-2], shape[-1], shape[-2], dtype=dtype, device=self.target.device).mT
            else:
                buf = torch.empty(shape, dtype=dtype, device=self.target.device)
            self.workspace[key] = buf
        return buf

    @staticmethod
    def _cholesky_(mat: Tensor) -> Tensor | None:
        """Lower Cholesky factor of a batch of symmetric positive definite matrices, computed *in place* over
        ``mat`` (through its column-major view, LAPACK's layout: no copy into a separate output, which costs about
        as much as the triangular zeroing torch does anyway); ``None`` if a factorisation failed (``mat`` is then
        overwritten)."""
        info = torch.empty(mat.shape[:-2], dtype=torch.int32, device=mat.device)
        torch.linalg.cholesky_ex(mat.mT, out=(mat.mT, info))  # mat symmetric: its transpose is itself
        return None if bool(info.any()) else mat.mT

    def _gpml_matrix(self, K: Tensor, s: Tensor) -> Tensor:
        r""":math:`B' = I + \Lambda^{1/2} K \Lambda^{1/2}` (``s`` the square roots of the precisions), formed in a
        reused buffer."""
        Bp = self._buffer("gpml_B", s.shape + s.shape[-1:], s.dtype)
        torch.mul(s.unsqueeze(-1), s.unsqueeze(-2), out=Bp)
        return add_to_diagonal(Bp.mul_(K), 1.0)

    def _relaxation(self, f_old: Tensor | None) -> tuple[float, float]:
        r"""Coefficients :math:`(a, \sqrt{1 - a^2})` of the over-relaxed update; :math:`(0, 1)` (the plain draw)
        without a current state."""
        a = self.overrelaxation if f_old is not None else 0.0
        return a, math.sqrt(1.0 - a * a)

    def _whitened_draw(
        self,
        A: Tensor,
        mu: Tensor,
        h: Tensor,
        lam: Tensor,
        generator: torch.Generator | None,
        f_old: Tensor | None = None,
        observed: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        r"""``(f, v)`` with :math:`f = \mu + A^\top v` and :math:`v \sim \mathcal N(B^{-1}b, B^{-1})`: the
        core's optimal whitened Gaussian for the statistics of ``(h, lam)`` and its pathwise draw. For linear
        observations :math:`g = Df`, ``observed`` holds their terms :math:`(AD^\top, D\mu)`, from which the
        statistics are formed (:math:`B = I + AD^\top\Lambda DA^\top`), while :math:`f` is still
        :math:`\mu + A^\top v`.

        With ``f_old`` (and ``overrelaxation`` :math:`a \ne 0`) the over-relaxed update
        :math:`f' = a f_{\text{old}} + (1 - a - c)\,m + c\tilde f` (:math:`c = \sqrt{1 - a^2}`, :math:`m` the
        conditional mean, :math:`\tilde f` a draw) instead; by linearity it is one solve,
        :math:`f' = a f_{\text{old}} + (1 - a)\mu + A^\top C^{-1}\big((1 - a) C^{-\top} b + c\,\varepsilon\big)`,
        and ``v`` is ``None``."""
        a, c = self._relaxation(f_old)
        q = WhitenedGaussian.optimal(SufficientStatistics.from_batch(*(observed or (A, mu)), h, lam))
        eps = torch.randn(q.theta1.shape, generator=generator, dtype=q.theta1.dtype, device=q.theta1.device)
        if a == 0.0:
            v = q.draw(eps)
            return mu + vecmat(v, A), v
        v = q.draw(eps, mean_weight=1.0 - a, noise_weight=c)
        return a * f_old + (1.0 - a) * mu + vecmat(v, A), None

    def _gpml_draw(
        self,
        terms: TargetPriorTerms,
        h: Tensor,
        lam: Tensor,
        generator: torch.Generator | None,
        f_old: Tensor | None = None,
    ) -> Tensor:
        r"""A draw of :math:`f \mid \Omega` by the GPML-stable pathwise draw through
        :math:`B' = I + \Lambda^{1/2} K \Lambda^{1/2} = RR^\top` (all :math:`\lambda_i > 0`):
        :math:`f = g + K\Lambda^{1/2}B'^{-1}\big(\Lambda^{-1/2}(h - \Lambda g) - \varepsilon_2\big)`,
        :math:`g = \mu_0 + L\varepsilon_1`.

        With ``f_old`` (and ``overrelaxation`` :math:`a \ne 0`) the over-relaxed update
        :math:`f' = a f_{\text{old}} + (1 - a - c)\,m + c\tilde f` (:math:`c = \sqrt{1 - a^2}`); the draw
        :math:`\tilde f` and the conditional mean :math:`m` are linear in :math:`(h, \varepsilon)`, so it is the same
        pathwise formula with :math:`g = (1 - a)\mu_0 + cL\varepsilon_1`, :math:`(1 - a)h` in place of :math:`h`,
        :math:`c\varepsilon_2` in place of :math:`\varepsilon_2`, plus :math:`a f_{\text{old}}`: no extra solve.

        Per sweep: one batched in-place Cholesky factorisation of :math:`B'` (formed in a reused buffer), two batched
        triangular solves with one right-hand side (faster here than ``torch.cholesky_solve``), and two products
        with the cached :math:`L` and :math:`K` as matrix-matrix products over all chains."""
        a, c = self._relaxation(f_old)
        eps = torch.randn((2,) + h.shape, generator=generator, dtype=h.dtype, device=h.device)
        g = vecmat(eps[0], terms.A).mul_(c).add_(terms.mu, alpha=1.0 - a)  # (1 - a) mu + c L eps_1
        s = lam.sqrt()
        R = self._cholesky_(self._gpml_matrix(terms.K, s))
        if R is None:  # not positive definite in floating point: GPyTorch's jittered factorisation of a fresh copy
            R = psd_safe_cholesky(self._gpml_matrix(terms.K, s))
        r = torch.addcmul(h * (1.0 - a), lam, g, value=-1.0).div_(s).sub_(eps[1], alpha=c)
        alpha = tri_solve(R.mT, tri_solve(R, r.unsqueeze(-1)), upper=True).squeeze(-1).mul_(s)
        f = g.add_(vecmat(alpha, terms.K))  # K symmetric: alpha K = (K alpha)^T
        return f if a == 0.0 else f.add_(f_old, alpha=a)

    def _latent_draw(
        self,
        h: Tensor,
        lam: Tensor,
        generator: torch.Generator | None,
        latents: list[int] | None = None,
        f_old: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Internal (C, T', N) potentials -> (f, v) for the latents ``latents`` (all if ``None``); over-relaxed
        around the conditional mean (``overrelaxation != 0``, exact model) when the current latents ``f_old`` are
        given (``v`` is then ``None``)."""
        terms = self.target.terms
        if latents is not None:
            key = ("terms", tuple(latents))
            if key not in self.workspace:
                idx = torch.as_tensor(latents, device=terms.L.device)
                picked = (t.index_select(0, idx) if t is not None else None for t in terms)
                self.workspace[key] = TargetPriorTerms(*picked)
            terms = self.workspace[key]
        if self.target.design is not None:  # linear observations: the whitened draw with their statistics
            observed = self._observed_terms(terms, latents)
            return self._whitened_draw(terms.A, terms.mu, h, lam, generator, f_old, observed)
        if self.target.is_sparse:
            return self._sparse_draw(terms, h, lam, generator, tuple(latents) if latents is not None else None)
        if self.f_update == "auto" and bool((lam >= torch.finfo(lam.dtype).tiny).all()):
            return self._gpml_draw(terms, h, lam, generator, f_old), None
        return self._whitened_draw(terms.A, terms.mu, h, lam, generator, f_old)

    def _observed_terms(self, terms: TargetPriorTerms, latents: list[int] | None) -> tuple[Tensor, Tensor]:
        r""":math:`(AD^\top, D\mu)` of the linear observations (cached per prior and block)."""
        key = ("observed", tuple(latents) if latents is not None else None)
        if key not in self.workspace:
            design = self.target.design
            self.workspace[key] = (design.apply(terms.A), design.apply(terms.mu))
        return self.workspace[key]

    def _q_alpha(self, terms: TargetPriorTerms, h: Tensor, lam: Tensor) -> WhitenedGaussian:
        r""":math:`q^*_\alpha(v)`, the Power-EP fixed point of the Gaussian problem with tilts :math:`(h, \lambda)`:
        the core's optimal whitened Gaussian for the statistics of the pseudo-observations
        :math:`(h_i, \lambda_i) / (1 + \alpha\lambda_i d_i)` (``alpha = 0``: Titsias's :math:`q(v)`)."""
        if self.alpha != 0.0:
            shrink = (lam * terms.d).mul_(self.alpha).add_(1.0).reciprocal_()
            h, lam = h * shrink, lam * shrink
        return WhitenedGaussian.optimal(SufficientStatistics.from_batch(terms.A, terms.mu, h, lam))

    def _sparse_draw(
        self,
        terms: TargetPriorTerms,
        h: Tensor,
        lam: Tensor,
        generator: torch.Generator | None,
        key: tuple[int, ...] | None = None,
    ) -> tuple[Tensor, Tensor]:
        r"""The VI-Gibbs step ``(f, v)``: :math:`v \sim q^*_\alpha(v)` (pathwise, two triangular solves), then
        :math:`f_i \sim p(f_i \mid u) = \mathcal N(\mu_i + a_i^\top v,\ d_i)`. No noise is drawn when every
        :math:`d_i` is 0 (every input an inducing input), so the random stream is then the exact whitened sweep's."""
        q = self._q_alpha(terms, h, lam)
        eps = torch.randn(q.theta1.shape, generator=generator, dtype=q.theta1.dtype, device=q.theta1.device)
        v = q.draw(eps)
        f = terms.mu + vecmat(v, terms.A)
        noisy = self.workspace.get(("noisy", key))
        if noisy is None:
            noisy = self.workspace[("noisy", key)] = bool((terms.d > 0).any())
        if noisy:
            eps_f = torch.randn(f.shape, generator=generator, dtype=f.dtype, device=f.device)
            f = f.addcmul_(terms.d.sqrt(), eps_f)
        return f, v

    # ------------------------------------------------------------------ one sweep
    def conditional_tilts(
        self, f: Tensor, y: Tensor, generator: torch.Generator | None, constants: dict[str, Tensor]
    ) -> tuple[AuxDict, dict[str, Tensor], Tensor, Tensor]:
        r"""The first half of a sweep at the internal latents ``f`` (C, T, N): :math:`\Omega \sim p(\Omega \mid y, f)`,
        then the likelihood's sampled constants given :math:`(\Omega, f)` (where it samples them; a fresh
        :math:`\Omega` it returns replaces the first), and the tilts they give.

        :return: ``(aux, constants, h, lam)``: the :math:`\Omega` draw, the chains' constants after it, and the
            potentials and precisions in the internal layout ``(C, T, n)`` (``n`` the observations) in
            ``linalg_dtype``. The latents' own draw given them is the caller's (the sweep's :math:`f`-step, or the
            hyper-parameter kernel's :math:`\theta`- and :math:`f`-steps)."""
        target = self.target
        likelihood = target.likelihood
        f_lik = target.observed(target.to_likelihood(f))
        with target.constants(constants):
            aux = likelihood.sample_aux(y, f_lik, generator=generator)
            if self.samples_constants:
                new, fresh = likelihood.sample_hyperparameters(y, aux, f_lik, generator=generator)
                constants = {**constants, **new}
                if fresh is not None:  # Ω redrawn under the new constants
                    aux = fresh
        with target.constants(constants):
            h, lam = likelihood.potential_and_precision(y, aux, f_lik)
        shape = f.shape if target.design is None else f.shape[:-1] + (target.num_observations,)
        return aux, constants, target.from_likelihood(h, shape), target.from_likelihood(lam, shape)

    def _sweep(
        self, f: Tensor, y: Tensor, generator: torch.Generator | None, constants: dict[str, Tensor]
    ) -> tuple[Tensor, AuxDict, Tensor | None, dict[str, Tensor]]:
        """internal f (C, T, N) -> (f, Ω, v, constants) after Ω | f, y (then the likelihood's sampled constants
        | Ω, f) and f | Ω, y. ``constants`` are the per-chain values of the likelihood's sampled constants: they
        live in the chain state and are handed to the likelihood for each call, never written into it."""
        target = self.target
        blocks = target.blocks or [None]
        v_all = None
        for block in blocks:
            aux, constants, h, lam = self.conditional_tilts(f, y, generator, constants)
            if block is None:
                f, v_all = self._latent_draw(h, lam, generator, f_old=f)
            else:
                f_b, v_b = self._latent_draw(h[..., block, :], lam[..., block, :], generator, block, f[..., block, :])
                f = f.clone()
                f[..., block, :] = f_b
                if v_b is not None:
                    if v_all is None:
                        v_all = torch.zeros(f.shape[:-1] + v_b.shape[-1:], dtype=v_b.dtype, device=v_b.device)
                    v_all[..., block, :] = v_b
        return f, aux, v_all, constants


def check_alpha(alpha: Any, sparse: bool) -> float:
    """``alpha`` as a float in [0, 1], or a ``ValueError`` naming it."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)):
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    if not 0.0 <= float(alpha) <= 1.0:  # NaN fails too
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    if float(alpha) != 0.0 and not sparse:
        raise ValueError(
            f"alpha = {alpha!r} needs inducing_points: the Power-EP alpha of the VI-Gibbs sampler exists only for the "
            "inducing-point model (the exact sampler has no approximation to tune)"
        )
    return float(alpha)
