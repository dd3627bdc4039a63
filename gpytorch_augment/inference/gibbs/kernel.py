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

Numerics: the prior is evaluated and factorised once, in
``linalg_dtype`` (float64 unless the sampler was built with float32, whatever the data's dtype), and cached while
the hyper-parameters are fixed (one :class:`~gpytorch_augment.core.PriorCache`); every solve is an explicit
(batched) Cholesky / triangular solve; the exact model's :math:`f`-update uses the GPML-stable matrix
:math:`B' = I + \Lambda^{1/2}(K + \epsilon I)\Lambda^{1/2}` when every :math:`\lambda_i > 0` and the whitened
:math:`B = I + L^\top\Lambda L` otherwise (both have eigenvalues :math:`\ge 1`).
"""

from __future__ import annotations

import copy
import math
import warnings
from contextlib import nullcontext
from typing import Any, NamedTuple

import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from ..._validation import check_finite
from ...core import PriorCache, SufficientStatistics, WhitenedGaussian
from ...core.linalg import add_to_diagonal, tri_solve, vecmat
from ...core.prior import prior_cholesky, split_prior, whiten_prior, with_linalg_advice
from ...likelihoods.augmented_likelihood import AugmentedLikelihood, AuxDict

#: default dtype of every factorisation and of the chain state (``GibbsSampler(linalg_dtype=...)`` overrides it)
LINALG_DTYPE = torch.float64


class GibbsPriorTerms(NamedTuple):
    r"""The cached prior, latent-major with an explicit latent dimension ``T`` (``T = 1`` for one latent).

    Exact model: ``mu`` (T, N), ``K`` = K + jitter I (T, N, N), ``L`` = chol(K) (T, N, N), ``A`` = Lᵀ
    (contiguous: ``v @ A`` is :math:`Lv` for every chain at once).
    Sparse model: ``mu`` = μ_X (T, N), ``mu_Z`` (T, M), ``L`` = chol(K_ZZ + jitter I) (T, M, M),
    ``A`` = L⁻¹ K_ZX (T, M, N) (the core's whitened prior terms), ``d`` the variances of :math:`p(f_i \mid u)`
    (T, N) (:func:`conditional_variances`); ``K`` is ``None``.

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler, GPPrior
        >>> x = torch.linspace(-2, 2, 5, dtype=torch.float64).unsqueeze(-1)
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
        >>> sampler = GibbsSampler(prior, BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double())
        >>> terms = sampler.terms                            # exact model, one latent: T = 1, N = 5
        >>> terms.mu.shape, terms.L.shape, terms.K.shape, terms.d is None
        (torch.Size([1, 5]), torch.Size([1, 5, 5]), torch.Size([1, 5, 5]), True)
    """

    mu: Tensor
    L: Tensor
    A: Tensor
    K: Tensor | None = None
    mu_Z: Tensor | None = None
    d: Tensor | None = None


def _coarser(t: Tensor, dtype: torch.dtype) -> bool:
    """Whether ``t`` is a floating tensor of a coarser dtype than ``dtype``."""
    return t.is_floating_point() and torch.finfo(t.dtype).eps > torch.finfo(dtype).eps


def conditional_variances(k_diag: Tensor, a_sq: Tensor, jitter: float) -> Tensor:
    r"""The variances :math:`d_i = k_{ii} - q_{ii}` of :math:`p(f_i \mid u)`, computed as
    :math:`\max(k_{ii} - \lVert a_i\rVert^2 - \epsilon, 0)`.

    Rule: factorising :math:`K_{ZZ} + \epsilon I` makes :math:`\lVert a_i\rVert^2` fall short of the Nyström diagonal
    :math:`q_{ii}` by at most :math:`\epsilon`, so the shifted value is within :math:`\epsilon` of the exact
    :math:`d_i`, never negative, and 0 where :math:`x_i` is an inducing input (:math:`d_i = 0` in exact arithmetic):
    with :math:`Z = X` the sparse sweep is the exact (whitened) sweep, draw for draw.

    Example::

        >>> import torch
        >>> from gpytorch_augment.inference.gibbs.kernel import conditional_variances
        >>> k_diag, a_sq = torch.tensor([1.0, 1.0, 2.0]), torch.tensor([0.5, 1.0, 2.5])
        >>> conditional_variances(k_diag, a_sq, jitter=1e-6)  # never negative
        tensor([0.5000, 0.0000, 0.0000])
    """
    return (k_diag - a_sq - jitter).clamp_min(0.0)


class BlockedGibbsKernel:
    """One sweep of the blocked Gibbs sampler over a batch of chains (see the module docstring): the prior terms,
    the chain layouts and the :math:`f \\mid \\Omega` draws. :class:`~gpytorch_augment.GibbsSampler` drives it.

    Attributes set by the driver before :meth:`refresh`: ``model``, ``likelihood``, ``x``, ``y`` (canonical
    targets), ``inducing_points``, ``jitter``, ``alpha``, ``f_update``, ``overrelaxation``, ``num_latents``, ``dtype``,
    ``device`` and ``_blocks``.

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler, GPPrior
        >>> x = torch.linspace(-2, 2, 5, dtype=torch.float64).unsqueeze(-1)
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
        >>> sampler = GibbsSampler(prior, BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double())
        >>> from gpytorch_augment.inference.gibbs.kernel import BlockedGibbsKernel
        >>> isinstance(sampler, BlockedGibbsKernel), sampler.is_sparse, sampler.num_data
        (True, False, 5)
    """

    model: Any
    likelihood: AugmentedLikelihood
    x: Tensor
    y: Tensor
    inducing_points: Tensor | None
    jitter: float
    alpha: float
    f_update: str
    overrelaxation: float
    num_latents: int
    dtype: torch.dtype
    device: torch.device
    #: dtype of every factorisation and of the chain state
    linalg_dtype: torch.dtype = LINALG_DTYPE
    _blocks: list[list[int]] | None

    @property
    def is_sparse(self) -> bool:
        """Whether the sampler uses inducing points."""
        return self.inducing_points is not None

    @property
    def num_data(self) -> int:
        return int(self.y.shape[-1])

    # ------------------------------------------------------------------ prior terms
    def _forward(self, x: Tensor) -> Any:
        """``model.forward(x)``, evaluated in ``linalg_dtype`` where that is finer than the inputs' dtype (inputs cast
        up) or the model's (a copy of the model cast up at :meth:`refresh`, :attr:`_forward_model`; the model itself is
        never modified), because a kernel matrix rounded to float32 is often not positive definite even with
        jitter. A copy, not parameters swapped for the call: GPyTorch evaluates kernels lazily, after the call."""
        if _coarser(x, self.linalg_dtype):
            x = x.to(self.linalg_dtype)
        model = getattr(self, "_forward_model", None)
        return (model if model is not None else self.model).forward(x)

    def _cast_model(self) -> Any:
        """A copy of the model in ``linalg_dtype`` if some floating parameter or buffer of it is coarser, else
        ``None`` (the model is used as it is)."""
        dt, model = self.linalg_dtype, self.model
        if not isinstance(model, torch.nn.Module) or not any(_coarser(t, dt) for t in self._model_tensors()):
            return None
        try:
            copied = copy.deepcopy(model)
        except (RuntimeError, TypeError) as err:  # e.g. non-leaf tensors cached on the model
            warnings.warn(
                f"the sampler could not copy the model to evaluate its prior in {dt} ({err}); it is evaluated in the "
                f"model's dtype instead: cast the model (model.to({dt})) if the factorisation fails",
                UserWarning,
                stacklevel=4,
            )
            return None
        return copied.to(dt)

    def _prior(self, x: Tensor) -> tuple[Tensor, Any]:
        """``model.forward(x)`` as (mean (T, n), covariance operator (T, n, n)), validated."""
        prior = self._forward(x)
        if not isinstance(prior, MultivariateNormal):
            raise TypeError(f"model.forward(x) must return a MultivariateNormal, got {type(prior).__name__}")
        mean, covar = prior.mean, prior.lazy_covariance_matrix
        T, n = self.num_latents, x.shape[-2]
        if mean.shape[-1] != n:
            raise ValueError(f"model.forward(x) returned a prior over {mean.shape[-1]} points for {n} inputs")
        if T == 1:
            if mean.dim() != 1:
                raise ValueError(
                    f"the likelihood has one latent but model.forward(x) returned a batch of priors "
                    f"(mean shape {tuple(mean.shape)}); use an un-batched model"
                )
        elif mean.dim() == 1:
            mean, covar = mean.expand(T, n), covar.expand(T, n, n)
        elif tuple(mean.shape[:-1]) != (T,):
            raise ValueError(
                f"the likelihood has {T} latents: model.forward(x) must return batch_shape [{T}] "
                f"(independent latent GPs); got mean shape {tuple(mean.shape)}"
            )
        if T == 1:
            mean, covar = mean.unsqueeze(0), covar.unsqueeze(0)
        return mean, covar

    def _model_tensors(self) -> list[Tensor]:
        return list(self.model.parameters()) + list(self.model.buffers())

    def _params_changed(self) -> bool:
        """Whether the model's parameters or buffers changed since the prior was cached."""
        return not self._prior_cache.valid([], self._model_tensors())

    @with_linalg_advice("the sampler's prior")
    @torch.no_grad()
    def refresh(self) -> None:
        r"""(Re)compute and cache the prior: :math:`\mu`, :math:`K + \epsilon I` and its Cholesky factor :math:`L`
        (exact), or :math:`\mu_X`, :math:`\mu_Z`, :math:`L = \mathrm{chol}(K_{ZZ} + \epsilon I)`, :math:`A` (sparse).

        Call after changing the model's hyper-parameters; the cached factor is otherwise reused by every sweep.
        """
        dt = self.linalg_dtype
        x = self.x
        self._workspace: dict[tuple, Any] = {}  # work buffers and per-block prior terms
        self._forward_model = self._cast_model()
        if not self.is_sparse:
            mean, covar = self._prior(x)
            K = covar.to_dense().to(dt)
            K = add_to_diagonal((K + K.mT) / 2, self.jitter)  # exactly symmetric (the f-draw reads either triangle)
            L = prior_cholesky(K, "K + jitter I of the sampler", source_dtype=covar.dtype)
            self._terms = GibbsPriorTerms(mu=mean.to(dt), L=L, A=L.mT.contiguous(), K=K)
        else:
            Z = self.inducing_points
            if Z.shape[:-2] != x.shape[:-2]:
                batch = torch.broadcast_shapes(Z.shape[:-2], x.shape[:-2])
                Z, x = Z.expand(*batch, *Z.shape[-2:]), x.expand(*batch, *x.shape[-2:])
            M = Z.shape[-2]
            mean, covar = self._prior(torch.cat([Z, x], dim=-2))
            terms = whiten_prior(*split_prior(mean, covar, M, dense=False), self.jitter, dt)
            d = conditional_variances(terms.k_diag, terms.a_sq, self.jitter)
            self._terms = GibbsPriorTerms(mu=terms.mu_X, L=terms.L, A=terms.A, mu_Z=terms.mu_Z, d=d)
        if not hasattr(self, "_prior_cache"):
            self._prior_cache = PriorCache()
        self._prior_cache.put([], self._model_tensors(), (), ())

    @property
    def terms(self) -> GibbsPriorTerms:
        """The cached prior terms (see :class:`GibbsPriorTerms`)."""
        return self._terms

    def _to_likelihood(self, f: Tensor) -> Tensor:
        """internal (C, T, N) float64 -> the likelihood's layout (C, N) / (C, N, T) in the model dtype."""
        f = f.to(self.dtype)
        return f[..., 0, :] if self.num_latents == 1 else f.mT

    def _from_likelihood(self, t: Tensor, shape: torch.Size) -> Tensor:
        """(h or λ) in the likelihood's layout (..., N) / (..., T, N) -> internal (C, T, N) float64."""
        t = t.to(self.linalg_dtype)
        if self.num_latents == 1:
            t = t.unsqueeze(-2)
        return t.expand(shape)

    def _to_storage(self, t: Tensor) -> Tensor:
        """internal (..., T, n) -> (..., n) for one latent, unchanged otherwise."""
        return t.squeeze(-2) if self.num_latents == 1 else t

    def _from_storage(self, t: Tensor, num_chains: int | None, name: str = "init f") -> Tensor:
        """User/storage layout (n,), (T, n), (C, n), (C, T, n) -> internal (C, T, n) float64."""
        T, n = self.num_latents, self.num_data
        given = tuple(torch.as_tensor(t).shape)
        t = torch.as_tensor(t).to(device=self.device, dtype=self.linalg_dtype)
        check_finite(name, t)
        if T == 1 and t.dim() >= 1:
            t = t.unsqueeze(-2)
        if t.dim() not in (2, 3) or t.shape[-2:] != (T, n):
            expected = f"(N,) or (chains, N), N = {n}" if T == 1 else f"(T, N) or (chains, T, N), T = {T}, N = {n}"
            raise ValueError(f"{name} must have shape {expected}; got shape {given}")
        if t.dim() == 2:
            t = t.unsqueeze(0)
        if num_chains is not None and t.shape[0] not in (1, num_chains):
            raise ValueError(f"{name} holds {t.shape[0]} chains but num_chains = {num_chains}")
        C = num_chains if num_chains is not None else t.shape[0]
        return t.expand(C, T, n).clone()
    def _buffer(
        self, name: str, shape: torch.Size, dtype: torch.dtype | None = None, column_major: bool = False
    ) -> Tensor:
        """A work tensor reused across sweeps (a fresh multi-megabyte tensor per sweep costs page faults)."""
        dtype = dtype or self.linalg_dtype
        key = (name, tuple(shape), dtype, column_major)
        buf = self._workspace.get(key)
        if buf is None:
            if column_major:
                buf = torch.empty(*shape[:-2], shape[-1], shape[-2], dtype=dtype, device=self.device).mT
            else:
                buf = torch.empty(shape, dtype=dtype, device=self.device)
            self._workspace[key] = buf
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
    ) -> tuple[Tensor, Tensor | None]:
        r"""``(f, v)`` with :math:`f = \mu + A^\top v` and :math:`v \sim \mathcal N(B^{-1}b, B^{-1})`: the
        core's optimal whitened Gaussian for the statistics of ``(h, lam)`` and its pathwise draw.

        With ``f_old`` (and ``overrelaxation`` :math:`a \ne 0`) the over-relaxed update
        :math:`f' = a f_{\text{old}} + (1 - a - c)\,m + c\tilde f` (:math:`c = \sqrt{1 - a^2}`, :math:`m` the
        conditional mean, :math:`\tilde f` a draw) instead; by linearity it is one solve,
        :math:`f' = a f_{\text{old}} + (1 - a)\mu + A^\top C^{-1}\big((1 - a) C^{-\top} b + c\,\varepsilon\big)`,
        and ``v`` is ``None``."""
        a, c = self._relaxation(f_old)
        q = WhitenedGaussian.optimal(SufficientStatistics.from_batch(A, mu, h, lam))
        eps = torch.randn(q.theta1.shape, generator=generator, dtype=q.theta1.dtype, device=q.theta1.device)
        if a == 0.0:
            v = q.draw(eps)
            return mu + vecmat(v, A), v
        v = q.draw(eps, mean_weight=1.0 - a, noise_weight=c)
        return a * f_old + (1.0 - a) * mu + vecmat(v, A), None

    def _gpml_draw(
        self,
        terms: GibbsPriorTerms,
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
        terms = self._terms
        if latents is not None:
            key = ("terms", tuple(latents))
            if key not in self._workspace:
                idx = torch.as_tensor(latents, device=terms.L.device)
                picked = (t.index_select(0, idx) if t is not None else None for t in terms)
                self._workspace[key] = GibbsPriorTerms(*picked)
            terms = self._workspace[key]
        if self.is_sparse:
            return self._sparse_draw(terms, h, lam, generator, tuple(latents) if latents is not None else None)
        if self.f_update == "auto" and bool((lam >= torch.finfo(lam.dtype).tiny).all()):
            return self._gpml_draw(terms, h, lam, generator, f_old), None
        return self._whitened_draw(terms.A, terms.mu, h, lam, generator, f_old)

    def _q_alpha(self, terms: GibbsPriorTerms, h: Tensor, lam: Tensor) -> WhitenedGaussian:
        r""":math:`q^*_\alpha(v)`, the Power-EP fixed point of the Gaussian problem with tilts :math:`(h, \lambda)`:
        the core's optimal whitened Gaussian for the statistics of the pseudo-observations
        :math:`(h_i, \lambda_i) / (1 + \alpha\lambda_i d_i)` (``alpha = 0``: Titsias's :math:`q(v)`)."""
        if self.alpha != 0.0:
            shrink = (lam * terms.d).mul_(self.alpha).add_(1.0).reciprocal_()
            h, lam = h * shrink, lam * shrink
        return WhitenedGaussian.optimal(SufficientStatistics.from_batch(terms.A, terms.mu, h, lam))

    def _sparse_draw(
        self,
        terms: GibbsPriorTerms,
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
        noisy = self._workspace.get(("noisy", key))
        if noisy is None:
            noisy = self._workspace[("noisy", key)] = bool((terms.d > 0).any())
        if noisy:
            eps_f = torch.randn(f.shape, generator=generator, dtype=f.dtype, device=f.device)
            f = f.addcmul_(terms.d.sqrt(), eps_f)
        return f, v

    def _u_from_v(self, v: Tensor) -> Tensor:
        return self._terms.mu_Z + vecmat(v, self._terms.L.mT)

    def _initial_f(self, num_chains: int, generator: torch.Generator) -> Tensor:
        """A prior draw per chain (over-dispersed starting points for R-hat)."""
        terms = self._terms
        T, n = terms.L.shape[0], terms.L.shape[-1]
        eps = torch.randn((num_chains, T, n), generator=generator, dtype=terms.L.dtype, device=terms.L.device)
        f = terms.mu + vecmat(eps, terms.A)  # sparse: mu + A^T eps; exact: mu + L eps
        if self.is_sparse and bool((terms.d > 0).any()):  # f ~ p(f | u), u ~ p(u)
            f = f.addcmul_(terms.d.sqrt(), torch.randn(f.shape, generator=generator, dtype=f.dtype, device=f.device))
        return f

    # ------------------------------------------------------------------ one sweep
    def _constants(self, values: dict[str, Tensor]) -> Any:
        """The likelihood evaluated at per-chain sampled constants (nothing to do without any)."""
        return self.likelihood.constants(values) if values else nullcontext()

    def _sweep(
        self, f: Tensor, y: Tensor, generator: torch.Generator | None, constants: dict[str, Tensor]
    ) -> tuple[Tensor, AuxDict, Tensor | None, dict[str, Tensor]]:
        """internal f (C, T, N) -> (f, Ω, v, constants) after Ω | f, y (then the likelihood's sampled constants
        | Ω, f) and f | Ω, y. ``constants`` are the per-chain values of the likelihood's sampled constants: they
        live in the chain state and are handed to the likelihood for each call, never written into it."""
        likelihood = self.likelihood
        blocks = self._blocks or [None]
        v_all = None
        for block in blocks:
            f_lik = self._to_likelihood(f)
            with self._constants(constants):
                aux = likelihood.sample_aux(y, f_lik, generator=generator)
                if self._samples_hyperparameters:
                    new, fresh = likelihood.sample_hyperparameters(y, aux, f_lik, generator=generator)
                    constants = {**constants, **new}
                    if fresh is not None:  # Ω redrawn under the new constants
                        aux = fresh
            with self._constants(constants):
                h, lam = likelihood.potential_and_precision(y, aux, f_lik)
            h, lam = self._from_likelihood(h, f.shape), self._from_likelihood(lam, f.shape)
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

    @with_linalg_advice("the sampler's prior")
    @torch.no_grad()
    def conditional_terms(self, x_new: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        r"""For new inputs: prior mean :math:`\mu_*` (T, n), projection :math:`P` (T, n_cond, n) such that the
        conditional mean is :math:`\mu_* + P^\top w` (:math:`w = f - \mu_0`, or :math:`w = v`), the conditional
        covariance (T, n, n) and its diagonal."""
        dt = self.linalg_dtype
        terms = self._terms
        cond_x = self.inducing_points if self.is_sparse else self.x
        if cond_x.shape[:-2] != x_new.shape[:-2]:
            batch = torch.broadcast_shapes(cond_x.shape[:-2], x_new.shape[:-2])
            cond_x, x_new = cond_x.expand(*batch, *cond_x.shape[-2:]), x_new.expand(*batch, *x_new.shape[-2:])
        n_c = cond_x.shape[-2]
        mean, covar = self._prior(torch.cat([cond_x, x_new], dim=-2))
        mu_new = mean[..., n_c:].to(dt)
        K_cn = covar[..., :n_c, n_c:].to_dense().to(dt)
        K_nn = covar[..., n_c:, n_c:].to_dense().to(dt)
        W = tri_solve(terms.L, K_cn)  # L^{-1} K_{c,new}
        cov = K_nn - W.mT @ W
        P = W if self.is_sparse else tri_solve(terms.L.mT, W, upper=True)  # sparse: A_*; exact: K^{-1} K_{X,new}
        return mu_new, P, cov, cov.diagonal(dim1=-1, dim2=-2).clamp_min(0)
