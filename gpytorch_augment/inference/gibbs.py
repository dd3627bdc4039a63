r"""Blocked Gibbs sampling for GP models with augmented likelihoods.

Given the auxiliary variables :math:`\Omega`, every augmented likelihood contributes a Gaussian tilt
:math:`\exp(h_i f_i - \tfrac12 \lambda_i f_i^2)` to the latent GP, so one sweep of the sampler is

1. :math:`\Omega \sim p(\Omega \mid y, f)` (``likelihood.sample_aux``), independently over data points, then the
   likelihood's own hyper-parameters given :math:`(\Omega, f)` (``likelihood.sample_hyperparameters``, a no-op
   unless the likelihood has a conjugate prior on them);
2. :math:`(h, \lambda) = ` ``likelihood.potential_and_precision(y, Ω, f)``;
3. :math:`f \sim \mathcal N\big(\mu_0 + \Sigma (h - \Lambda \mu_0),\ \Sigma\big)`,
   :math:`\Sigma = (K^{-1} + \Lambda)^{-1}` (exact model), or, with inducing points :math:`Z`,
   :math:`v \sim \mathcal N(B^{-1} b, B^{-1})`, :math:`u = \mu_Z + L v`, :math:`f = \mu_X + A^\top v`.

The engine talks to the likelihood only through the :class:`~gpytorch_augment.likelihoods.AugmentedLikelihood`
protocol and to the model only through ``model.forward(x)`` (the prior). Chains are a batch dimension: one
batched Cholesky factorisation and one pair of batched triangular solves per sweep serve every chain.

Numerics (see ``gpytorch-integration.md`` §7, §9, §10):

* the prior is evaluated and factorised **once**, :math:`L = \mathrm{chol}(K + \epsilon I)` in float64, and cached
  while the hyper-parameters are fixed (:meth:`GibbsSampler.refresh`);
* every solve is an explicit (batched) Cholesky / triangular solve; ``linear_operator``'s CG path is never used;
* the :math:`f`-update of the exact model uses the GPML-stable matrix :math:`B' = I + \Lambda^{1/2} (K+\epsilon I)
  \Lambda^{1/2}` (eigenvalues :math:`\ge 1`) when every :math:`\lambda_i > 0`, and the whitened matrix
  :math:`B = I + L^\top \Lambda L` (also eigenvalues :math:`\ge 1`, and exact when some :math:`\lambda_i = 0`,
  e.g. missing data) otherwise.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import gpytorch
import numpy as np
import torch
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from linear_operator.operators import DiagLinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from .._numerics import reverse_cholesky
from .._validation import check_finite, check_inputs_targets
from ..likelihoods.augmented_likelihood import AugmentedLikelihood, AuxDict

__all__ = ["GibbsPrediction", "GibbsSampler", "GibbsSamples", "GibbsState", "GibbsSummary"]

#: dtype of every factorisation and of the chain state
_LINALG_DTYPE = torch.float64

#: the ``f_update`` options of :class:`GibbsSampler`
_F_UPDATES = ("auto", "whitened")


def _vecmat(vec: Tensor, mat: Tensor) -> Tensor:
    r"""``vec @ mat`` per latent for a chain-free stack of matrices: ``vec`` (..., T, n), ``mat`` (T, n, m) ->
    (..., T, m). One matrix-matrix product per latent serves every chain (much faster than a batched
    matrix-vector product per chain, fastest with ``mat`` contiguous); :math:`Mv` is ``_vecmat(v, M.mT)``."""
    T, n, m = mat.shape
    if T == 1:
        return (vec.reshape(-1, n) @ mat[0]).reshape(*vec.shape[:-1], m)
    lead = vec.shape[:-2]
    flat = vec.reshape(-1, T, n).transpose(0, 1)  # (T, chains, n)
    return (flat @ mat).transpose(0, 1).reshape(*lead, T, m)


def _tri_solve(L: Tensor, rhs: Tensor, upper: bool = False) -> Tensor:
    return torch.linalg.solve_triangular(L, rhs, upper=upper)


def _add_to_diagonal(mat: Tensor, value: float) -> Tensor:
    mat.diagonal(dim1=-1, dim2=-2).add_(value)
    return mat


# ---------------------------------------------------------------------------------------------- containers
@dataclass
class GibbsState:
    r"""Where a chain stands after a sweep: enough to continue it exactly.

    :ivar f: latent values, ``(chains, N)`` (``(chains, T, N)`` for ``T`` latents).
    :ivar aux: the last :math:`\Omega` draw, one tensor per auxiliary variable.
    :ivar u: inducing values ``(chains, M)`` / ``(chains, T, M)`` of the sparse model, else ``None``.
    :ivar rng_state: state of the sampler's ``torch.Generator`` after the sweep (``None`` if unknown).
    :ivar num_sweeps: sweeps run so far (warm-up included).
    :ivar hyper: the likelihood's sampled hyper-parameters after the sweep (empty unless the likelihood
        implements ``sample_hyperparameters``); restored into the likelihood when the state is used as ``init``.
    """

    f: Tensor
    aux: AuxDict = field(default_factory=dict)
    u: Tensor | None = None
    rng_state: Tensor | None = None
    num_sweeps: int = 0
    hyper: dict[str, Tensor] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        return {
            "f": self.f,
            "aux": dict(self.aux),
            "u": self.u,
            "rng_state": self.rng_state,
            "num_sweeps": self.num_sweeps,
            "hyper": dict(self.hyper),
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> GibbsState:
        return cls(
            f=state["f"],
            aux=dict(state.get("aux") or {}),
            u=state.get("u"),
            rng_state=state.get("rng_state"),
            num_sweeps=int(state.get("num_sweeps", 0)),
            hyper=dict(state.get("hyper") or {}),
        )


class GibbsPrediction(NamedTuple):
    r"""Posterior predictive at new inputs, from :meth:`GibbsSamples.predict`.

    The latent predictive is the mixture :math:`\frac1S\sum_s p(f_* \mid f^{(s)})` of GP conditionals.

    :ivar f_mean: mixture mean of :math:`f_*`, ``(N*,)`` / ``(T, N*)``.
    :ivar f_var: mixture variance (conditional variance plus the spread of the conditional means).
    :ivar f_draws: one draw of :math:`f_*` per stored draw, ``(chains, draws, N*)`` / ``(chains, draws, T, N*)``.
    :ivar y_mean: predictive mean of :math:`y_*`, the average over draws of ``likelihood.marginal(...).mean``
        (``None`` if the marginal distribution has no mean).
    :ivar y_probs: the average over draws of ``likelihood.marginal(...).probs`` where the distribution has
        ``probs`` (e.g. :math:`p(y_*=1)` for Bernoulli), else ``None``.
    """

    f_mean: Tensor
    f_var: Tensor
    f_draws: Tensor
    y_mean: Tensor | None
    y_probs: Tensor | None


class GibbsSummary(NamedTuple):
    """Per-coordinate posterior summary and convergence diagnostics (Vehtari et al., 2021)."""

    mean: Tensor
    sd: Tensor
    rhat: Tensor  #: rank-normalised split-:math:`\hat R` (max of bulk and folded/tail)
    ess_bulk: Tensor  #: bulk effective sample size (rank-normalised split chains)


class _PriorTerms(NamedTuple):
    """The cached prior, latent-major with an explicit latent dimension ``T`` (``T = 1`` for one latent).

    Exact model: ``mu`` (T, N), ``K`` = K + jitter I (T, N, N), ``L`` = chol(K) (T, N, N), ``A`` = Lᵀ
    (contiguous: ``v @ A`` is :math:`Lv` for every chain at once).
    Sparse model: ``mu`` = μ_X (T, N), ``mu_Z`` (T, M), ``L`` = chol(K_ZZ + jitter I) (T, M, M),
    ``A`` = L⁻¹ K_ZX (T, M, N); ``K`` is ``None``.
    """

    mu: Tensor
    L: Tensor
    A: Tensor
    K: Tensor | None = None
    mu_Z: Tensor | None = None


# ---------------------------------------------------------------------------------------------- diagnostics
def _split_chains(x: np.ndarray) -> np.ndarray:
    """(chains, draws, K) -> (2 chains, draws // 2, K); the middle draw is dropped for odd lengths."""
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, x.shape[1] - half :]], axis=0)


def _z_scale(x: np.ndarray) -> np.ndarray:
    """Rank-normalise each coordinate over all chains and draws (Blom's offset 3/8)."""
    from scipy.special import ndtri
    from scipy.stats import rankdata

    C, S, K = x.shape
    ranks = rankdata(x.reshape(C * S, K), method="average", axis=0).reshape(C, S, K)
    return ndtri((ranks - 0.375) / (C * S + 0.25))


def _rhat_basic(x: np.ndarray) -> np.ndarray:
    """Classic :math:`\\hat R` of (chains, draws, K)."""
    S = x.shape[1]
    within = x.var(axis=1, ddof=1).mean(axis=0)
    between = S * x.mean(axis=1).var(axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt((between / within + S - 1) / S)


def _autocov(x: np.ndarray) -> np.ndarray:
    """Autocovariance at every lag along axis 1 (FFT), normalised by the chain length."""
    from scipy.fft import next_fast_len

    S = x.shape[1]
    x = x - x.mean(axis=1, keepdims=True)
    m = next_fast_len(2 * S)
    fx = np.fft.rfft(x, n=m, axis=1)
    return np.fft.irfft(fx * np.conjugate(fx), n=m, axis=1)[:, :S] / S


def _ess_one(acov: np.ndarray, chain_mean: np.ndarray) -> float:
    """ESS of one coordinate from its per-chain autocovariances (C, S): Geyer's initial monotone sequence."""
    C, S = acov.shape
    mean_var = acov[:, 0].mean() * S / (S - 1.0)
    var_plus = mean_var * (S - 1.0) / S
    if C > 1:
        var_plus += chain_mean.var(ddof=1)
    if not var_plus > 0:
        return float("nan")
    rho_all = 1.0 - (mean_var - acov.mean(axis=0)) / var_plus
    rho = np.zeros(S)
    rho[0], rho[1] = 1.0, rho_all[1]
    even, odd = 1.0, rho_all[1]
    t = 1
    while t < S - 3 and even + odd > 0.0:  # initial positive sequence
        even, odd = rho_all[t + 1], rho_all[t + 2]
        if even + odd >= 0:
            rho[t + 1], rho[t + 2] = even, odd
        t += 2
    max_t = t - 2
    if even > 0:
        rho[max_t + 1] = even
    t = 1
    while t <= max_t - 2:  # initial monotone sequence
        if rho[t + 1] + rho[t + 2] > rho[t - 1] + rho[t]:
            rho[t + 1] = rho[t + 2] = (rho[t - 1] + rho[t]) / 2.0
        t += 2
    n = C * S
    tau = -1.0 + 2.0 * rho[: max_t + 1].sum() + rho[max_t + 1 : max_t + 2].sum()
    return n / max(tau, 1.0 / math.log10(n))


def rank_normalized_rhat(x: np.ndarray) -> np.ndarray:
    r"""Rank-normalised split-:math:`\hat R` of draws ``x`` of shape (chains, draws, K), per coordinate.

    :math:`\max(\hat R_{\rm bulk}, \hat R_{\rm tail})`, the bulk value computed on rank-normalised split chains
    and the tail value on the rank-normalised :math:`|x - \mathrm{median}(x)|` (Vehtari, Gelman, Simpson,
    Carpenter and Bürkner, 2021). Constant coordinates give NaN.
    """
    split = _split_chains(np.asarray(x, dtype=np.float64))
    bulk = _rhat_basic(_z_scale(split))
    folded = np.abs(split - np.median(split.reshape(-1, split.shape[-1]), axis=0))
    tail = _rhat_basic(_z_scale(folded))
    out = np.maximum(bulk, tail)
    const = np.ptp(split.reshape(-1, split.shape[-1]), axis=0) == 0
    out[const] = np.nan
    return out


def bulk_ess(x: np.ndarray) -> np.ndarray:
    """Bulk effective sample size of draws ``x`` of shape (chains, draws, K), per coordinate."""
    z = _z_scale(_split_chains(np.asarray(x, dtype=np.float64)))
    acov = _autocov(z)
    chain_mean = z.mean(axis=1)
    return np.array([_ess_one(acov[..., k], chain_mean[:, k]) for k in range(z.shape[-1])])


# ---------------------------------------------------------------------------------------------- the sampler
class GibbsSampler:
    r"""Blocked Gibbs sampler for a GP prior and an augmented likelihood.

    **Exact model** (no ``inducing_points``): the chain targets the exact posterior
    :math:`p(f \mid y) \propto \prod_i p(y_i \mid f_i)\, \mathcal N(f \mid \mu_0, K + \epsilon I)` by alternating

    .. math::
        \Omega \mid f \sim \prod_i p(\Omega_i \mid y_i, f_i), \qquad
        f \mid \Omega \sim \mathcal N\big(\mu_0 + \Sigma (h - \Lambda \mu_0),\ \Sigma\big),\quad
        \Sigma = \big((K + \epsilon I)^{-1} + \Lambda\big)^{-1}.

    The :math:`f`-draw (``f_update``, with :math:`K` standing for :math:`K + \epsilon I = LL^\top`):

    * GPML-stable pathwise draw (method C of ``gpytorch-integration.md`` §9), with
      :math:`B' = I + \Lambda^{1/2} K \Lambda^{1/2} = R R^\top`: :math:`f_0 = \mu_0 + L\varepsilon_1`,
      :math:`f = f_0 + K \Lambda^{1/2} B'^{-1}\big(\Lambda^{-1/2}(h - \Lambda f_0) - \varepsilon_2\big)`.
      Needs every :math:`\lambda_i > 0`; forming :math:`B'` is :math:`O(N^2)`.
    * whitened draw (method A), with :math:`B = I + L^\top \Lambda L = C^\top C`:
      :math:`v = C^{-1}(C^{-\top} L^\top (h - \Lambda\mu_0) + \varepsilon)`, :math:`f = \mu_0 + L v`. Exact for
      any :math:`\lambda_i \ge 0` (e.g. missing data); forming :math:`B` is :math:`O(N^3)`.

    ``f_update="auto"`` (default) uses the GPML-stable draw in every sweep where all :math:`\lambda_i` are positive
    normal floats and the whitened draw otherwise; ``f_update="whitened"`` always uses the whitened draw. Both
    matrices have every eigenvalue in :math:`[1, 1 + \lambda_{\max}\lVert K\rVert]`, so neither factorisation
    needs jitter, however ill-conditioned :math:`K` is.

    **Over-relaxation** (``overrelaxation=a``, :math:`-1 < a < 1`, exact model; Adler 1981, Neal 1998). With
    :math:`m` and :math:`\Sigma` the mean and covariance of :math:`f \mid \Omega`, a sweep replaces the
    current :math:`f` by

    .. math::
        f' = m + a (f - m) + \sqrt{1 - a^2}\,(\tilde f - m), \qquad \tilde f \sim \mathcal N(m, \Sigma)

    (``a = 0`` is the plain Gibbs draw). If :math:`f \sim \mathcal N(m, \Sigma)` then so is :math:`f'`
    (covariance :math:`a^2\Sigma + (1 - a^2)\Sigma`), and the move is reversible, so every sweep still leaves the
    exact joint posterior :math:`p(f, \Omega \mid y)` invariant: nothing is approximated, only the Markov kernel
    changes. A negative :math:`a` anti-correlates successive draws around the conditional mean; in a
    linear-Gaussian picture the lag-1 autocorrelation :math:`\rho` of a coordinate becomes
    :math:`\rho + a (1 - \rho)`. Measured on the two posteriors of ``benchmarks/sampling.py`` (4 × 2000 draws,
    minimum over the latent coordinates): :math:`a = -0.5` raised the bulk ESS 1.9× (heart, Bernoulli-logit) and
    1.9× (Boston, Student-t) and the tail ESS 1.6× and 1.3×, while the ESS of the posterior standard deviation
    stayed about the same (heart) or fell by a fifth (Boston); :math:`a = -0.7` gave 2.3× and 2.4× bulk ESS but
    cost up to half of the sd-ESS (anti-correlated draws help means more than variances); the benchmark chooses
    :math:`a` by pilot runs on the worst of bulk, tail and sd ESS. Since :math:`\tilde f` and :math:`m` are linear
    in the same right-hand side, :math:`f'` is computed as *one* pathwise draw with a modified right-hand side:
    over-relaxation costs a few elementwise operations, no extra solve. :meth:`sample_latent` (one conditional
    draw, no current state) is never over-relaxed.

    **Inducing-point model** (``inducing_points=Z``, :math:`M` points): with
    :math:`K_{ZZ} + \epsilon I = L L^\top`, :math:`A = L^{-1} K_{ZX}` and :math:`u = \mu_Z + L v`, one sweep is

    .. math::
        \Omega \mid f,\qquad v \mid \Omega \sim \mathcal N(B^{-1} b,\ B^{-1}),\quad B = I + A \Lambda A^\top,\quad
        b = A (h - \lambda \odot \mu_X),\qquad f = \mu_X + A^\top v .

    This is the exact Gibbs sampler of the *projected-process* (DTC) model :math:`f = \mu_X + K_{XZ}K_{ZZ}^{-1}(u -
    \mu_Z)`, i.e. it targets the variational / projected-process approximation of ``augmentations.md`` §1.7 (the
    :math:`v`-draw is the CAVI :math:`q(v)` of the sampled :math:`(h, \lambda)`), **not** the exact posterior;
    with :math:`Z = X` it reduces to the exact model. Cost per sweep :math:`O(NM^2 + M^3)`.

    **Several latents** (``likelihood.num_latents = T > 1``): ``model.forward(x)`` must return a batch of ``T``
    independent priors (``batch_shape [T]``; an un-batched prior is shared by all latents). All latents are
    updated in one batched draw given :math:`\Omega`. A likelihood whose valid scan order needs fresh
    :math:`\Omega` between latent blocks (partially collapsed samplers) may declare ``latent_blocks`` (the
    attribute that also orders the CAVI updates; ``gibbs_blocks`` is a Gibbs-only alias), a sequence of lists of
    latent indices; :math:`\Omega` is then redrawn before each block.

    **Caching.** The prior (mean, kernel matrix, Cholesky factor) is computed once. :meth:`sample` compares the
    model's parameters and buffers with a snapshot and calls :meth:`refresh` itself when they changed in place;
    call :meth:`refresh` explicitly after any other change of the prior (e.g. a replaced module).

    :param model: a GPyTorch model or module whose ``forward(x)`` returns the prior ``MultivariateNormal``
        (a ``gpytorch.Module`` with a mean and a kernel, an ``ExactGP`` or an ``ApproximateGP``); only
        ``model.forward`` is called, never ``model(x)``.
    :param likelihood: an :class:`~gpytorch_augment.likelihoods.AugmentedLikelihood`.
    :param x: training inputs ``(N, D)``.
    :param y: training targets ``(N,)``.
    :param inducing_points: optional ``(M, D)`` inducing inputs :math:`Z` (or ``(T, M, D)``).
    :param jitter: :math:`\epsilon` added to the diagonal of the prior covariance before factorising
        (default ``gpytorch.settings.variational_cholesky_jitter`` for float64, ``1e-6``).
    :param f_update: ``"auto"`` or ``"whitened"`` (exact model only; see above).
    :param overrelaxation: :math:`a \in (-1, 1)` of the over-relaxed :math:`f`-update (exact model only; default
        0, the plain Gibbs draw; see above).
    :param kwargs: per-datum keyword data of the likelihood (e.g. binomial ``trials``), passed to
        ``likelihood.check_targets``; the engine works with the canonical targets it returns.

    **Likelihood hyper-parameters.** After every :math:`\Omega` draw the engine calls
    ``likelihood.sample_hyperparameters(y, Ω, f, generator)`` (a no-op by default). A likelihood that implements
    it must keep one value per chain (e.g. shape ``(chains, 1)``); the draws are recorded in
    :attr:`GibbsSamples.hyper` under the parameter names (constrained values, ``raw_`` stripped). If it returns a
    new :math:`\Omega` (a dict; e.g. because :math:`\Omega \mid f` depends on the hyper-parameter just drawn), that
    draw replaces the old one for the :math:`f`-step and in the record.

    Example::

        >>> class GP(gpytorch.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.mean_module = gpytorch.means.ZeroMean()
        ...         self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
        ...     def forward(self, x):
        ...         return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))
        >>> sampler = GibbsSampler(GP(), BernoulliLogitLikelihood(), x, y)
        >>> samples = sampler.sample(1000, warmup=200, num_chains=4, seed=0)
        >>> samples.f.shape                      # (chains, draws, N)
        >>> samples.summary().rhat.max()         # convergence check
        >>> p = samples.predict(x_test).y_probs  # p(y* = 1 | data)
        >>> more = sampler.resume(samples, 1000) # continue the same chains
    """

    def __init__(
        self,
        model: Any,
        likelihood: AugmentedLikelihood,
        x: Tensor,
        y: Tensor,
        inducing_points: Tensor | None = None,
        jitter: float | None = None,
        f_update: str = "auto",
        overrelaxation: float = 0.0,
        **kwargs: Any,
    ) -> None:
        if not isinstance(likelihood, AugmentedLikelihood):
            raise TypeError(f"GibbsSampler needs an AugmentedLikelihood, got {type(likelihood).__name__}")
        if not callable(getattr(model, "forward", None)):
            raise TypeError(f"model must define forward(x) returning the prior; got {type(model).__name__}")
        check_inputs_targets(x, y)
        if y.dim() != 1:
            raise ValueError(f"y must have shape (N,); got shape {tuple(y.shape)}")
        if x.dim() != 2 and not (x.dim() == 3 and likelihood.num_latents > 1 and x.shape[0] == likelihood.num_latents):
            raise ValueError(f"x must have shape (N, D); got shape {tuple(x.shape)}")
        self.target_kwargs = kwargs
        self.y = likelihood.check_targets(y, **kwargs)
        if inducing_points is not None:
            check_finite("inducing_points", inducing_points)
            if inducing_points.dim() < 2 or inducing_points.shape[-1] != x.shape[-1]:
                raise ValueError(
                    f"inducing_points must have shape (M, D) with D = {x.shape[-1]} (the inputs' dimension); "
                    f"got shape {tuple(inducing_points.shape)}"
                )
        if jitter is None:
            jitter = gpytorch.settings.variational_cholesky_jitter.value(_LINALG_DTYPE)
        if not (isinstance(jitter, (int, float)) and math.isfinite(jitter) and jitter >= 0):
            raise ValueError(f"jitter must be a finite non-negative number, got {jitter!r}")
        if f_update not in _F_UPDATES:
            raise ValueError(f"f_update must be one of {_F_UPDATES}, got {f_update!r}")
        if isinstance(overrelaxation, bool) or not isinstance(overrelaxation, (int, float)) or not (
            -1.0 < overrelaxation < 1.0
        ):
            raise ValueError(f"overrelaxation must be a number in (-1, 1), got {overrelaxation!r}")
        if overrelaxation != 0.0 and inducing_points is not None:
            raise ValueError(
                "overrelaxation is implemented for the exact model only (the inducing-point chain state holds f, "
                "not the inducing values v it would need); use overrelaxation=0 with inducing_points"
            )
        self.model = model
        self.likelihood = likelihood
        self.x = x
        self.inducing_points = inducing_points
        self.jitter = float(jitter)
        self.f_update = f_update
        self.overrelaxation = float(overrelaxation)
        self.num_latents = int(likelihood.num_latents)
        self.dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
        self.device = x.device
        hook = getattr(type(likelihood), "sample_hyperparameters", None)
        base_hook = getattr(AugmentedLikelihood, "sample_hyperparameters", None)
        self._samples_hyperparameters = hook is not None and hook is not base_hook
        name = "latent_blocks" if getattr(likelihood, "latent_blocks", None) is not None else "gibbs_blocks"
        self._blocks: list[list[int]] | None = self._check_blocks(getattr(likelihood, name, None), name)
        self.refresh()

    # ------------------------------------------------------------------ prior terms
    def _check_blocks(
        self, blocks: Sequence[Sequence[int]] | None, name: str = "latent_blocks"
    ) -> list[list[int]] | None:
        if blocks is None:
            return None
        blocks = [list(map(int, b)) for b in blocks]
        flat = sorted(i for b in blocks for i in b)
        if flat != list(range(self.num_latents)):
            raise ValueError(
                f"likelihood.{name} must partition the latents 0..{self.num_latents - 1}; got {blocks}"
            )
        return None if len(blocks) == 1 else blocks

    @property
    def is_sparse(self) -> bool:
        """Whether the sampler uses inducing points."""
        return self.inducing_points is not None

    @property
    def num_data(self) -> int:
        return int(self.y.shape[-1])

    def _prior(self, x: Tensor) -> tuple[Tensor, Any]:
        """``model.forward(x)`` as (mean (T, n), covariance operator (T, n, n)), validated."""
        prior = self.model.forward(x)
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

    def _params_snapshot(self) -> list[Tensor]:
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        return [t.detach().clone() for t in tensors]

    def _params_changed(self) -> bool:
        now = list(self.model.parameters()) + list(self.model.buffers())
        if len(now) != len(self._snapshot):
            return True
        return any(a.shape != b.shape or not torch.equal(a.detach(), b) for a, b in zip(now, self._snapshot))

    @torch.no_grad()
    def refresh(self) -> None:
        r"""(Re)compute and cache the prior: :math:`\mu`, :math:`K + \epsilon I` and its Cholesky factor :math:`L`
        (exact), or :math:`\mu_X`, :math:`\mu_Z`, :math:`L = \mathrm{chol}(K_{ZZ} + \epsilon I)`, :math:`A` (sparse).

        Call after changing the model's hyper-parameters; the cached factor is otherwise reused by every sweep.
        """
        dt = _LINALG_DTYPE
        x = self.x
        self._workspace: dict[tuple, Any] = {}  # work buffers and per-block prior terms
        if not self.is_sparse:
            mean, covar = self._prior(x)
            K = covar.to_dense().to(dt)
            K = _add_to_diagonal((K + K.mT) / 2, self.jitter)  # exactly symmetric (the f-draw reads either triangle)
            L = psd_safe_cholesky(K)
            self._terms = _PriorTerms(mu=mean.to(dt), L=L, A=L.mT.contiguous(), K=K)
        else:
            Z = self.inducing_points
            if Z.shape[:-2] != x.shape[:-2]:
                batch = torch.broadcast_shapes(Z.shape[:-2], x.shape[:-2])
                Z, x = Z.expand(*batch, *Z.shape[-2:]), x.expand(*batch, *x.shape[-2:])
            M = Z.shape[-2]
            mean, covar = self._prior(torch.cat([Z, x], dim=-2))
            K_ZZ = _add_to_diagonal(covar[..., :M, :M].to_dense().to(dt).clone(), self.jitter)
            K_ZX = covar[..., :M, M:].to_dense().to(dt)
            L = psd_safe_cholesky(K_ZZ)
            mean = mean.to(dt)
            self._terms = _PriorTerms(mu=mean[..., M:], L=L, A=_tri_solve(L, K_ZX), mu_Z=mean[..., :M])
        self._snapshot = self._params_snapshot()

    # ------------------------------------------------------------------ likelihood hyper-parameters
    def _hyper_snapshot(self) -> dict[str, Tensor]:
        """The likelihood's parameters, constrained (``raw_`` stripped), if it samples hyper-parameters."""
        if not self._samples_hyperparameters:
            return {}
        out = {}
        for name, param, constraint in self.likelihood.named_parameters_and_constraints():
            head, _, leaf = name.rpartition(".")
            if constraint is not None and leaf.startswith("raw_"):
                name = (head + "." if head else "") + leaf[len("raw_") :]
                param = constraint.transform(param)
            out[name] = param.detach().clone()
        return out

    @torch.no_grad()
    def _restore_hyper(self, hyper: Mapping[str, Tensor]) -> None:
        """Inverse of :meth:`_hyper_snapshot` (shapes may differ from the current ones, e.g. per chain)."""
        params = {n: (p, c) for n, p, c in self.likelihood.named_parameters_and_constraints()}
        for name, value in hyper.items():
            head, _, leaf = name.rpartition(".")
            raw_name = (head + "." if head else "") + "raw_" + leaf
            if raw_name in params and params[raw_name][1] is not None:
                param, constraint = params[raw_name]
                param.data = constraint.inverse_transform(value.to(param))
            elif name in params:
                params[name][0].data = value.to(params[name][0]).clone()
            else:
                raise ValueError(f"init holds hyper-parameter {name!r}, which the likelihood does not have")

    # ------------------------------------------------------------------ layouts
    def _to_likelihood(self, f: Tensor) -> Tensor:
        """internal (C, T, N) float64 -> the likelihood's layout (C, N) / (C, N, T) in the model dtype."""
        f = f.to(self.dtype)
        return f[..., 0, :] if self.num_latents == 1 else f.mT

    def _from_likelihood(self, t: Tensor, shape: torch.Size) -> Tensor:
        """(h or λ) in the likelihood's layout (..., N) / (..., T, N) -> internal (C, T, N) float64."""
        t = t.to(_LINALG_DTYPE)
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
        t = torch.as_tensor(t).to(device=self.device, dtype=_LINALG_DTYPE)
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

    # ------------------------------------------------------------------ the f | Ω step
    def _buffer(self, name: str, shape: torch.Size, dtype: torch.dtype = _LINALG_DTYPE, column_major: bool = False) -> Tensor:
        """A work tensor reused across sweeps (a fresh multi-megabyte tensor per sweep costs page faults)."""
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
        return _add_to_diagonal(Bp.mul_(K), 1.0)

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
        r"""``(f, v)`` with :math:`f = \mu + A^\top v` and :math:`v \sim \mathcal N(B^{-1}b, B^{-1})`,
        :math:`B = I + A\Lambda A^\top = C^\top C`, :math:`b = A(h - \lambda\mu)`.

        With ``f_old`` (and ``overrelaxation`` :math:`a \ne 0`) the over-relaxed update
        :math:`f' = a f_{\text{old}} + (1 - a - c)\,m + c\tilde f` (:math:`c = \sqrt{1 - a^2}`, :math:`m` the
        conditional mean, :math:`\tilde f` a draw) instead; by linearity it is one solve,
        :math:`f' = a f_{\text{old}} + (1 - a)\mu + A^\top C^{-1}\big((1 - a) C^{-\top} b + c\,\varepsilon\big)`,
        and ``v`` is ``None``."""
        a, c = self._relaxation(f_old)
        B = _add_to_diagonal((A * lam.unsqueeze(-2)) @ A.mT, 1.0)
        b = _vecmat(h - lam * mu, A.mT)
        C = reverse_cholesky(B)
        eps = torch.randn(b.shape, generator=generator, dtype=b.dtype, device=b.device)
        w = _tri_solve(C.mT, b.unsqueeze(-1), upper=True).squeeze(-1)
        if a == 0.0:
            v = _tri_solve(C, (w + eps).unsqueeze(-1)).squeeze(-1)
            return mu + _vecmat(v, A), v
        v = _tri_solve(C, ((1.0 - a) * w + c * eps).unsqueeze(-1)).squeeze(-1)
        return a * f_old + (1.0 - a) * mu + _vecmat(v, A), None

    def _gpml_draw(
        self, terms: _PriorTerms, h: Tensor, lam: Tensor, generator: torch.Generator | None, f_old: Tensor | None = None
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
        g = _vecmat(eps[0], terms.A).mul_(c).add_(terms.mu, alpha=1.0 - a)  # (1 - a) mu + c L eps_1
        s = lam.sqrt()
        R = self._cholesky_(self._gpml_matrix(terms.K, s))
        if R is None:  # not positive definite in floating point: GPyTorch's jittered factorisation of a fresh copy
            R = psd_safe_cholesky(self._gpml_matrix(terms.K, s))
        r = torch.addcmul(h * (1.0 - a), lam, g, value=-1.0).div_(s).sub_(eps[1], alpha=c)
        alpha = _tri_solve(R.mT, _tri_solve(R, r.unsqueeze(-1)), upper=True).squeeze(-1).mul_(s)
        f = g.add_(_vecmat(alpha, terms.K))  # K symmetric: alpha K = (K alpha)^T
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
                self._workspace[key] = _PriorTerms(*(t.index_select(0, idx) if t is not None else None for t in terms))
            terms = self._workspace[key]
        if self.is_sparse:
            return self._whitened_draw(terms.A, terms.mu, h, lam, generator)
        if self.f_update == "auto" and bool((lam >= torch.finfo(lam.dtype).tiny).all()):
            return self._gpml_draw(terms, h, lam, generator, f_old), None
        return self._whitened_draw(terms.A, terms.mu, h, lam, generator, f_old)

    def _u_from_v(self, v: Tensor) -> Tensor:
        return self._terms.mu_Z + _vecmat(v, self._terms.L.mT)

    @torch.no_grad()
    def sample_latent(
        self, h: Tensor, lam: Tensor, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        r"""One draw of the latents given potentials and precisions (the :math:`f \mid \Omega` step).

        :param h: potentials in the likelihood's layout, ``(..., N)`` (``(..., T, N)`` for ``T`` latents);
            leading dimensions are chains.
        :param lam: precisions, same shape.
        :return: ``{"f": f}`` in storage layout, plus ``{"u": u, "v": v}`` for the sparse model
            (:math:`v \sim \mathcal N(B^{-1} b, B^{-1})`, the CAVI :math:`q(v)` of these :math:`(h,\lambda)`).
        """
        T, N = self.num_latents, self.num_data
        batch = torch.broadcast_shapes(h.shape, lam.shape)[: -1 if T == 1 else -2]
        shape = torch.Size(batch) + (T, N)
        h_, lam_ = self._from_likelihood(h, shape), self._from_likelihood(lam, shape)
        f, v = self._latent_draw(h_, lam_, generator)
        out = {"f": self._to_storage(f).to(self.dtype)}
        if self.is_sparse:
            out["v"] = self._to_storage(v).to(self.dtype)
            out["u"] = self._to_storage(self._u_from_v(v)).to(self.dtype)
        return out

    # ------------------------------------------------------------------ one sweep
    def _sweep(self, f: Tensor, y: Tensor, generator: torch.Generator | None) -> tuple[Tensor, AuxDict, Tensor | None]:
        """internal f (C, T, N) -> (f, Ω, v) after Ω | f, y and f | Ω, y."""
        likelihood = self.likelihood
        blocks = self._blocks or [None]
        v_all = None
        for block in blocks:
            f_lik = self._to_likelihood(f)
            aux = likelihood.sample_aux(y, f_lik, generator=generator)
            if self._samples_hyperparameters:
                refreshed = likelihood.sample_hyperparameters(y, aux, f_lik, generator=generator)
                if refreshed is not None:  # Ω redrawn under the new hyper-parameters
                    aux = refreshed
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
        return f, aux, v_all

    @torch.no_grad()
    def sweep(
        self, f: Tensor, y: Tensor | None = None, generator: torch.Generator | None = None
    ) -> GibbsState:
        r"""One full sweep (:math:`\Omega \mid f`, then the latents :math:`\mid \Omega`) for a batch of chains.

        A low-level building block (Geweke tests, custom schemes that also update hyper-parameters).

        :param f: current latents in storage layout, ``(chains, N)`` / ``(chains, T, N)`` (or without the chain
            dimension).
        :param y: targets to condition on (default: the training targets); may carry a chain dimension,
            ``(chains, N)``, e.g. for the successive-conditional simulator of a Geweke test.
        :param generator: a ``torch.Generator`` for reproducible draws.
        :return: a :class:`GibbsState` (``rng_state`` is ``None``).
        """
        if self._params_changed():
            self.refresh()
        if y is None:
            y = self.y
        else:
            check_finite("y", y)
            if y.shape[-1] != self.num_data:
                raise ValueError(f"y must have {self.num_data} points in its last dimension; got shape {tuple(y.shape)}")
            y = self.likelihood.check_targets(y, **self.target_kwargs)
        f_int = self._from_storage(f, None, name="f")
        f_int, aux, v = self._sweep(f_int, y, generator)
        u = self._to_storage(self._u_from_v(v)).to(self.dtype) if self.is_sparse else None
        return GibbsState(f=self._to_storage(f_int).to(self.dtype), aux=aux, u=u)

    # ------------------------------------------------------------------ sampling
    def _initial_f(self, num_chains: int, generator: torch.Generator) -> Tensor:
        """A prior draw per chain (over-dispersed starting points for R-hat)."""
        terms = self._terms
        T, n = terms.L.shape[0], terms.L.shape[-1]
        eps = torch.randn((num_chains, T, n), generator=generator, dtype=_LINALG_DTYPE, device=terms.L.device)
        return terms.mu + _vecmat(eps, terms.A)  # sparse: mu + A^T eps; exact: mu + L eps

    @staticmethod
    def _check_count(name: str, value: Any, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        return int(value)

    @torch.no_grad()
    def sample(
        self,
        num_samples: int,
        warmup: int = 200,
        thin: int = 1,
        num_chains: int = 1,
        seed: int | None = None,
        init: GibbsState | Mapping[str, Any] | Tensor | None = None,
        progress: bool = True,
    ) -> GibbsSamples:
        r"""Run ``num_chains`` vectorised chains for ``warmup + num_samples * thin`` sweeps.

        :param num_samples: draws kept per chain.
        :param warmup: sweeps discarded at the start.
        :param thin: keep every ``thin``-th sweep after warm-up.
        :param num_chains: chains, run as one batch.
        :param seed: seed of the ``torch.Generator`` driving every draw (Ω, f and the initial state). ``None``
            continues the generator state stored in ``init`` (a :class:`GibbsState`), or draws a fresh seed
            from torch's global RNG (recorded in the result).
        :param init: starting point: a :class:`GibbsState` (e.g. ``samples.last_state()``), a dict with key
            ``"f"``, or a tensor of latents, ``(N,)`` / ``(chains, N)`` (``(T, N)`` / ``(chains, T, N)``).
            Default: one prior draw per chain.
        :param progress: show a ``tqdm`` progress bar (silently none if ``tqdm`` is not installed).
        :return: :class:`GibbsSamples`.
        """
        num_samples = self._check_count("num_samples", num_samples, 1)
        warmup = self._check_count("warmup", warmup, 0)
        thin = self._check_count("thin", thin, 1)
        num_chains = self._check_count("num_chains", num_chains, 1)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise ValueError(f"seed must be an integer or None, got {seed!r}")
        if self._params_changed():
            self.refresh()

        state = None
        if isinstance(init, GibbsState):
            state = init
        elif isinstance(init, Mapping):
            if "f" not in init:
                raise ValueError(f"init must contain the latents under key 'f'; got keys {sorted(init)}")
            state = GibbsState.from_state_dict(init)
        elif init is not None:
            state = GibbsState(f=init)

        generator = torch.Generator(device=self.device)
        if seed is None and state is not None and state.rng_state is not None:
            generator.set_state(state.rng_state)
        else:
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,)).item())
            generator.manual_seed(int(seed))
        f = self._from_storage(state.f, num_chains) if state is not None else self._initial_f(num_chains, generator)
        if state is not None and state.hyper:
            self._restore_hyper(state.hyper)
        sweeps_before = state.num_sweeps if state is not None else 0

        T, N = self.num_latents, self.num_data
        total = warmup + num_samples * thin
        f_draws = torch.empty((num_chains, num_samples, T, N), dtype=self.dtype, device=self.device)
        u_draws = None
        if self.is_sparse:
            M = self._terms.L.shape[-1]
            u_draws = torch.empty((num_chains, num_samples, T, M), dtype=self.dtype, device=self.device)
        aux_draws: dict[str, Tensor] = {}
        hyper_draws: dict[str, list[Tensor]] = {}
        aux: AuxDict = dict(state.aux) if state is not None else {}
        v = None

        bar = _progress_bar(total, progress)
        start = time.perf_counter()
        kept = 0
        try:
            for it in range(total):
                f, aux, v = self._sweep(f, self.y, generator)
                if it >= warmup and (it - warmup + 1) % thin == 0:
                    f_draws[:, kept] = f.to(self.dtype)
                    if u_draws is not None:
                        u_draws[:, kept] = self._u_from_v(v).to(self.dtype)
                    for name, value in aux.items():
                        value = self._chain_batched(value, num_chains)
                        if name not in aux_draws:
                            aux_draws[name] = torch.empty(
                                (num_chains, num_samples) + value.shape[1:], dtype=value.dtype, device=value.device
                            )
                        aux_draws[name][:, kept] = value
                    for name, value in self._hyper_snapshot().items():
                        hyper_draws.setdefault(name, []).append(value)
                    kept += 1
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        elapsed = time.perf_counter() - start

        u_last = self._to_storage(self._u_from_v(v)).to(self.dtype) if v is not None and self.is_sparse else None
        last = GibbsState(
            f=self._to_storage(f).to(self.dtype),
            aux={k: self._chain_batched(val, num_chains) for k, val in aux.items()},
            u=u_last,
            rng_state=generator.get_state(),
            num_sweeps=sweeps_before + total,
            hyper=self._hyper_snapshot(),
        )
        self.likelihood.aux = last.aux
        return GibbsSamples(
            f=self._to_storage(f_draws),
            aux=aux_draws,
            u=self._to_storage(u_draws) if u_draws is not None else None,
            seed=seed,
            warmup=warmup,
            thin=thin,
            f_update=self.f_update if not self.is_sparse else "sparse",
            jitter=self.jitter,
            elapsed=elapsed,
            num_sweeps=total,
            last=last,
            hyper={k: _stack_hyper(v, num_chains) for k, v in hyper_draws.items()},
            sampler=self,
        )

    @staticmethod
    def _chain_batched(value: Tensor, num_chains: int) -> Tensor:
        """Give an auxiliary draw a leading chain dimension if the likelihood returned it without one."""
        if value.dim() == 0 or value.shape[0] != num_chains:
            value = value.expand((num_chains,) + value.shape)
        return value

    def resume(self, samples: GibbsSamples, num_samples: int, progress: bool = True) -> GibbsSamples:
        """Continue the chains of ``samples`` for ``num_samples`` more draws (same thinning, no warm-up).

        The random stream continues from the stored generator state, so ``sample(n1)`` followed by
        ``resume(·, n2)`` gives exactly the draws of ``sample(n1 + n2)``. Returns all draws, concatenated.
        (Runs joined with ``GibbsSamples.cat(..., dim="chain")`` have no single generator state; they continue
        with a fresh seed.)
        """
        more = self.sample(
            num_samples,
            warmup=0,
            thin=samples.thin,
            num_chains=samples.num_chains,
            init=samples.last_state(),
            progress=progress,
        )
        return GibbsSamples.cat([samples, more], dim="draw")

    # ------------------------------------------------------------------ predictive pieces
    @torch.no_grad()
    def _conditional_terms(self, x_new: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        r"""For new inputs: prior mean :math:`\mu_*` (T, n), projection :math:`P` (T, n_cond, n) such that the
        conditional mean is :math:`\mu_* + P^\top w` (:math:`w = f - \mu_0`, or :math:`w = v`), the conditional
        covariance (T, n, n) and its diagonal."""
        dt = _LINALG_DTYPE
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
        W = _tri_solve(terms.L, K_cn)  # L^{-1} K_{c,new}
        cov = K_nn - W.mT @ W
        P = W if self.is_sparse else _tri_solve(terms.L.mT, W, upper=True)  # sparse: A_*; exact: K^{-1} K_{X,new}
        return mu_new, P, cov, cov.diagonal(dim1=-1, dim2=-2).clamp_min(0)


def _stack_hyper(values: list[Tensor], num_chains: int) -> Tensor:
    """Per-draw hyper-parameter values -> (chains, draws, ...): per-chain values (leading dimension = chains)
    keep their chain; shared values are repeated for every chain."""
    stacked = torch.stack([torch.as_tensor(v) for v in values], dim=0)  # (draws, *shape)
    if stacked.dim() >= 2 and stacked.shape[1] == num_chains:
        return stacked.movedim(0, 1)
    return stacked.unsqueeze(0).expand((num_chains,) + stacked.shape)


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="Gibbs", leave=False)


# ---------------------------------------------------------------------------------------------- the draws
@dataclass
class GibbsSamples:
    r"""Draws of a :class:`GibbsSampler` run.

    :ivar f: latent draws ``(chains, draws, N)`` (``(chains, draws, T, N)`` for ``T`` latents).
    :ivar aux: auxiliary draws, one tensor per variable, ``(chains, draws, ...)``.
    :ivar u: inducing values ``(chains, draws, M)`` / ``(chains, draws, T, M)`` (sparse model), else ``None``.
    :ivar seed: the generator seed (``None`` for a run that continued a stored generator state).
    :ivar warmup, thin: settings of the run; ``num_sweeps`` counts every sweep (warm-up included).
    :ivar f_update: the ``f``-update of the sampler (``"sparse"`` for the inducing-point model).
    :ivar elapsed: wall-clock seconds of the sampling loop.
    :ivar last: the :class:`GibbsState` after the last sweep (see :meth:`last_state`).
    :ivar hyper: draws of the likelihood's sampled hyper-parameters, ``(chains, draws, ...)`` (empty unless the
        likelihood implements ``sample_hyperparameters``).
    """

    f: Tensor
    aux: AuxDict
    u: Tensor | None
    seed: int | None
    warmup: int
    thin: int
    f_update: str
    jitter: float
    elapsed: float
    num_sweeps: int
    last: GibbsState
    hyper: dict[str, Tensor] = field(default_factory=dict)
    sampler: GibbsSampler | None = field(default=None, repr=False, compare=False)

    # ------------------------------------------------------------------ shape and state
    @property
    def num_chains(self) -> int:
        return int(self.f.shape[0])

    @property
    def num_draws(self) -> int:
        return int(self.f.shape[1])

    def last_state(self) -> GibbsState:
        """The chain state after the last sweep; pass it as ``init`` to continue (see also ``GibbsSampler.resume``)."""
        return self.last

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild this object (draws, settings, last state), for ``torch.save``."""
        return {
            "f": self.f,
            "aux": dict(self.aux),
            "u": self.u,
            "seed": self.seed,
            "warmup": self.warmup,
            "thin": self.thin,
            "f_update": self.f_update,
            "jitter": self.jitter,
            "elapsed": self.elapsed,
            "num_sweeps": self.num_sweeps,
            "last": self.last.state_dict(),
            "hyper": dict(self.hyper),
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any], sampler: GibbsSampler | None = None) -> GibbsSamples:
        """Inverse of :meth:`state_dict`; pass the ``sampler`` to enable :meth:`predict` and resuming."""
        return cls(
            f=state["f"],
            aux=dict(state["aux"]),
            u=state.get("u"),
            seed=state.get("seed"),
            warmup=int(state["warmup"]),
            thin=int(state["thin"]),
            f_update=state.get("f_update", "auto"),
            jitter=float(state.get("jitter", 0.0)),
            elapsed=float(state.get("elapsed", 0.0)),
            num_sweeps=int(state.get("num_sweeps", 0)),
            last=GibbsState.from_state_dict(state["last"]),
            hyper=dict(state.get("hyper") or {}),
            sampler=sampler,
        )

    @classmethod
    def cat(cls, runs: Sequence[GibbsSamples], dim: str = "draw") -> GibbsSamples:
        """Concatenate runs along ``"draw"`` (a run and its continuation) or ``"chain"`` (independent runs,
        e.g. different seeds). The settings and sampler of the first run are kept; for ``"draw"`` the last
        state is the last run's, for ``"chain"`` the chains' last states are concatenated."""
        if dim not in ("draw", "chain"):
            raise ValueError(f"dim must be 'draw' or 'chain', got {dim!r}")
        if not runs:
            raise ValueError("cat needs at least one GibbsSamples")
        axis = 1 if dim == "draw" else 0
        first = runs[0]
        cat = lambda ts: torch.cat(list(ts), dim=axis)  # noqa: E731
        aux = {k: cat(r.aux[k] for r in runs) for k in first.aux}
        u = cat(r.u for r in runs) if first.u is not None else None
        if dim == "draw":
            last = runs[-1].last
            seed, sweeps = first.seed, sum(r.num_sweeps for r in runs)
        else:
            last = GibbsState(
                f=torch.cat([r.last.f for r in runs]),
                aux={k: torch.cat([r.last.aux[k] for r in runs]) for k in first.last.aux},
                u=torch.cat([r.last.u for r in runs]) if first.last.u is not None else None,
                rng_state=None,
                num_sweeps=first.last.num_sweeps,
                hyper={},
            )
            seed, sweeps = None, first.num_sweeps
        return cls(
            f=cat(r.f for r in runs),
            aux=aux,
            u=u,
            seed=seed,
            warmup=first.warmup,
            thin=first.thin,
            f_update=first.f_update,
            jitter=first.jitter,
            elapsed=sum(r.elapsed for r in runs),
            num_sweeps=sweeps,
            last=last,
            hyper={k: cat(r.hyper[k] for r in runs) for k in first.hyper},
            sampler=first.sampler,
        )

    # ------------------------------------------------------------------ diagnostics
    def _variable(self, var: str) -> Tensor:
        if var == "f":
            return self.f
        if var == "u":
            if self.u is None:
                raise ValueError("no draws of u: the sampler has no inducing points")
            return self.u
        if var in self.aux:
            return self.aux[var]
        if var in self.hyper:
            return self.hyper[var]
        raise ValueError(f"unknown variable {var!r}; choose 'f', 'u' or one of {sorted(self.aux) + sorted(self.hyper)}")

    def summary(self, var: str = "f") -> GibbsSummary:
        r"""Posterior mean and sd, rank-normalised split-:math:`\hat R` and bulk ESS per coordinate of ``var``
        (``"f"``, ``"u"``, an auxiliary variable or a sampled likelihood hyper-parameter). :math:`\hat R` needs at
        least 4 draws (and is computed from split chains, so it is meaningful with a single chain too)."""
        draws = self._variable(var)
        C, S = draws.shape[:2]
        if S < 4:
            raise ValueError(f"summary needs at least 4 draws per chain, got {S}")
        flat = draws.detach().to("cpu", torch.float64).reshape(C, S, -1).numpy()
        shape = draws.shape[2:]
        as_t = lambda a: torch.as_tensor(a, dtype=torch.float64).reshape(shape)  # noqa: E731
        return GibbsSummary(
            mean=as_t(flat.mean(axis=(0, 1))),
            sd=as_t(flat.reshape(C * S, -1).std(axis=0, ddof=1)),
            rhat=as_t(rank_normalized_rhat(flat)),
            ess_bulk=as_t(bulk_ess(flat)),
        )

    def to_arviz(self):
        """The draws as ``arviz.InferenceData`` (posterior group: ``f``, ``u``, and each auxiliary variable)."""
        try:
            import arviz as az
        except ImportError as err:
            raise ImportError(
                "GibbsSamples.to_arviz needs the optional package 'arviz': pip install arviz "
                "(or pip install gpytorch-augment[gibbs])"
            ) from err
        to_np = lambda t: t.detach().to("cpu").numpy()  # noqa: E731
        latent = ["latent"] if self.f.dim() == 4 else []
        posterior = {"f": to_np(self.f)}
        dims = {"f": latent + ["data"]}
        if self.u is not None:
            posterior["u"] = to_np(self.u)
            dims["u"] = latent + ["inducing"]
        for name, value in list(self.aux.items()) + list(self.hyper.items()):
            key = name if name not in posterior else f"aux_{name}"
            posterior[key] = to_np(value)
        attrs = {"warmup": self.warmup, "thin": self.thin, "f_update": self.f_update, "jitter": self.jitter}
        if self.seed is not None:
            attrs["seed"] = int(self.seed)
        idata = az.from_dict(posterior=posterior, dims=dims)
        idata.posterior.attrs.update(attrs)
        return idata

    # ------------------------------------------------------------------ prediction
    @torch.no_grad()
    def predict(
        self,
        x_new: Tensor,
        generator: torch.Generator | None = None,
        joint: bool = True,
        chunk_size: int | None = None,
        **kwargs: Any,
    ) -> GibbsPrediction:
        r"""Posterior predictive at ``x_new`` as a mixture of GP conditionals over the stored draws.

        Exact model: :math:`\frac1S\sum_s \mathcal N\big(f_* \mid \mu_* + K_{*X}K^{-1}(f^{(s)} - \mu_0),\
        K_{**} - K_{*X}K^{-1}K_{X*}\big)`; sparse model: :math:`f_* \mid u^{(s)}` (``augmentations.md`` §1.8).
        :math:`y_*` is predicted with the **original** likelihood: ``likelihood.marginal`` of each conditional,
        averaged over draws.

        :param x_new: ``(N*, D)`` inputs.
        :param generator: for the draws of :math:`f_*`.
        :param joint: draw :math:`f_*` jointly over ``x_new`` (Cholesky of the conditional covariance) or
            independently per point.
        :param chunk_size: draws per call of ``likelihood.marginal`` (default: about :math:`2^{20}/N_*`); one draw
            per call when the likelihood's constants were sampled (:attr:`hyper`), each draw with its own values.
        :param kwargs: per-datum keyword data of the likelihood at ``x_new`` (e.g. binomial ``trials``), passed to
            ``likelihood.marginal``.
        """
        sampler = self.sampler
        if sampler is None:
            raise ValueError("predict needs the GibbsSampler: rebuild with GibbsSamples.from_state_dict(state, sampler)")
        check_finite("x_new", x_new)
        if x_new.dim() != sampler.x.dim() or x_new.shape[-1] != sampler.x.shape[-1]:
            raise ValueError(
                f"x_new must have shape (N*, D) with D = {sampler.x.shape[-1]}; got shape {tuple(x_new.shape)}"
            )
        if sampler._params_changed():
            raise ValueError(
                "the model's hyper-parameters changed since the sampler's prior was cached: the stored draws "
                "belong to the old prior; restore the parameters (or draw new samples) before predicting"
            )
        dt = _LINALG_DTYPE
        T = sampler.num_latents
        C, S = self.num_chains, self.num_draws
        mu_new, P, cov, var = sampler._conditional_terms(x_new.to(sampler.x.dtype))
        n_new = mu_new.shape[-1]

        # conditional means, one per stored draw: (C*S, T, n_new)
        if sampler.is_sparse:
            u = self.u.to(dt).reshape(C * S, T, -1) if T > 1 else self.u.to(dt).reshape(C * S, 1, -1)
            w = _tri_solve(sampler._terms.L, (u - sampler._terms.mu_Z).unsqueeze(-1)).squeeze(-1)  # v
        else:
            f = self.f.to(dt).reshape(C * S, T, -1) if T > 1 else self.f.to(dt).reshape(C * S, 1, -1)
            w = f - sampler._terms.mu
        means = mu_new + (w.unsqueeze(-2) @ P).squeeze(-2)

        f_mean = means.mean(0)
        f_var = var + means.var(0, unbiased=False)
        eps = torch.randn(means.shape, generator=generator, dtype=dt, device=means.device)
        if joint:
            Lc = psd_safe_cholesky(_add_to_diagonal(cov.clone(), sampler.jitter))
            f_draws = means + _vecmat(eps, Lc.mT)
        else:
            f_draws = means + var.sqrt() * eps

        # y: average the likelihood's marginal over the draws, in chunks of draws. With sampled likelihood constants
        # (self.hyper, (C, S, *shape)) every draw is paired with its own values: they are written into the
        # likelihood one draw at a time, in the shape of a single chain's value, because a likelihood's marginal
        # need not broadcast a batch of constants against a batch of predictive distributions.
        chunk = chunk_size or max(1, (1 << 20) // max(1, n_new * T))
        y_mean_sum, y_probs_sum = None, None
        has_mean = True
        out_dtype = sampler.dtype
        hyper = {k: v.reshape((C * S,) + tuple(v.shape[2:])) for k, v in self.hyper.items()}
        saved = sampler._hyper_snapshot() if hyper else {}
        try:
            for start in range(0, C * S, 1 if hyper else chunk):
                if hyper:
                    sampler._restore_hyper({k: v[start] for k, v in hyper.items()})
                y_mean_sum, y_probs_sum, has_mean = self._accumulate_marginal(
                    means[start : start + (1 if hyper else chunk)], var, kwargs, y_mean_sum, y_probs_sum, has_mean
                )
        finally:
            if hyper:
                sampler._restore_hyper(saved)

        def shaped(t: Tensor) -> Tensor:
            return sampler._to_storage(t).to(out_dtype)

        n_draws = C * S
        return GibbsPrediction(
            f_mean=shaped(f_mean),
            f_var=shaped(f_var),
            f_draws=shaped(f_draws).reshape((C, S) + shaped(f_mean).shape),
            y_mean=y_mean_sum / n_draws if has_mean and y_mean_sum is not None else None,
            y_probs=y_probs_sum / n_draws if y_probs_sum is not None else None,
        )

    def _accumulate_marginal(
        self,
        means: Tensor,
        var: Tensor,
        kwargs: Mapping[str, Any],
        y_mean_sum: Tensor | None,
        y_probs_sum: Tensor | None,
        has_mean: bool,
    ) -> tuple[Tensor | None, Tensor | None, bool]:
        """Add ``likelihood.marginal``'s mean and probs, summed over a chunk of draws (B, T, n_new), to the sums."""
        sampler = self.sampler
        likelihood, T, out_dtype = sampler.likelihood, sampler.num_latents, sampler.dtype
        m = means.to(out_dtype)  # (B, T, n_new)
        v_ = var.to(out_dtype).expand_as(m)
        if T == 1:
            mvn = MultivariateNormal(m[..., 0, :], DiagLinearOperator(v_[..., 0, :]))
        else:
            mvn = MultitaskMultivariateNormal.from_batch_mvn(
                MultivariateNormal(m, DiagLinearOperator(v_)), task_dim=-1
            )
        dist = likelihood.marginal(mvn, **kwargs)
        if has_mean:
            try:
                part = dist.mean.sum(0)
                y_mean_sum = part if y_mean_sum is None else y_mean_sum + part
            except NotImplementedError:
                has_mean = False
        probs = getattr(dist, "probs", None)
        if probs is not None:
            part = probs.sum(0)
            y_probs_sum = part if y_probs_sum is None else y_probs_sum + part
        return y_mean_sum, y_probs_sum, has_mean
