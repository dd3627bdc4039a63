r"""The Gaussian step both engines share: statistics of a batch, the optimal whitened :math:`q(v)`, the damped
natural-parameter step, marginals, KL and the pathwise draw.

Given potentials :math:`h_i` and precisions :math:`\lambda_i` of the data (expected ones for CAVI, sampled ones for
Gibbs), the conditional of the whitened inducing values :math:`v` (:math:`u = \mu_Z + Lv`, :math:`A = L^{-1}K_{ZX}`,
see :mod:`~gpytorch_augment.core.prior`) is Gaussian with natural parameters

.. math::
    \theta_1 = b = \sum_i a_i\,(h_i - \lambda_i\mu_i) = A(h - \lambda\odot\mu_X),\qquad
    -2\theta_2 = B = I + \sum_i a_i\lambda_i a_i^\top = I + A\,\mathrm{diag}(\lambda)\,A^\top,

:math:`a_i` the :math:`i`-th column of :math:`A`. The two sums are the **sufficient statistics** of the data
(:class:`SufficientStatistics`): they add over disjoint batches, scale by :math:`N/|\mathcal B|` for a mini-batch
estimate, and are the only thing a multi-process reduction needs to exchange (:math:`M^2 + M` numbers per latent).

:math:`B` has every eigenvalue :math:`\ge 1`; it is factorised as :math:`B = C^\top C` with :math:`C` lower
triangular (:func:`~gpytorch_augment._numerics.reverse_cholesky`), so :math:`C^{-1}` is directly the Cholesky factor
of the covariance :math:`B^{-1}`. A Gaussian is carried as :class:`WhitenedGaussian` :math:`(\theta_1, C)`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .._numerics import reverse_cholesky
from .distributed import all_reduce_sum, is_distributed
from .linalg import add_to_diagonal, block_width, mv, tri_solve, vecmat
from .prior import PriorTerms

__all__ = [
    "NaturalParameters",
    "SufficientStatistics",
    "WhitenedGaussian",
    "collapsed_log_marginal",
    "gaussian_log_density",
    "natural_gradient",
    "noisy_tilts",
    "tilted_conditional",
]


class SufficientStatistics(NamedTuple):
    r""":math:`S = \sum_i a_i\lambda_i a_i^\top` (``precision``, ``(*b, M, M)``) and
    :math:`s = \sum_i a_i(h_i - \lambda_i\mu_i)` (``shift``, ``(*b, M)``) of ``count`` data points.

    Statistics of disjoint batches add (``+``); :meth:`scale` by :math:`N/|\mathcal B|` turns those of a mini-batch
    into an unbiased estimate of the full-data ones. A leading chain dimension (Gibbs) is an ordinary batch
    dimension.

    Example::

        >>> import torch
        >>> from gpytorch_augment.core import SufficientStatistics
        >>> A, mu = torch.eye(2, 3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
        >>> stats = SufficientStatistics.from_batch(A, mu, h=torch.ones(3), lam=torch.full((3,), 0.5))
        >>> stats.count, stats.precision.diagonal().tolist(), stats.scale(2.0).shift.tolist()
        (3, [0.5, 0.5], [2.0, 2.0])
    """

    precision: Tensor
    shift: Tensor
    count: int

    @classmethod
    def from_batch(cls, A: Tensor, mu: Tensor, h: Tensor, lam: Tensor) -> SufficientStatistics:
        r"""The statistics of potentials ``h`` and precisions ``lam`` ``(*c, *b, N)`` at the data whose whitened
        cross-covariance is ``A`` ``(*b, M, N)`` and prior mean ``mu`` ``(*b, N)``. Extra leading dimensions
        ``*c`` of ``h`` (chains) are reduced with one matrix-matrix product per latent (``A`` then ``(T, M, N)``)."""
        dtype = A.dtype
        h, lam = h.to(dtype), lam.to(dtype)
        precision = None
        rows = A.shape[-2] * math.prod(torch.broadcast_shapes(lam.shape[:-1], A.shape[:-2]))
        width = block_width(A.shape[-1], rows, A.device)
        for A_b, lam_b in zip(A.split(width, -1), lam.split(width, -1)):  # (chains x) M x n products, cache-sized
            part = (A_b * lam_b.unsqueeze(-2)) @ A_b.mT
            precision = part if precision is None else precision + part
        residual = h - lam * mu
        shift = vecmat(residual, A.mT) if residual.dim() > A.dim() - 1 else mv(A, residual)
        return cls(precision, shift, int(h.shape[-1]))

    def __add__(self, other: object) -> SufficientStatistics:
        if not isinstance(other, SufficientStatistics):
            return NotImplemented
        return SufficientStatistics(
            self.precision + other.precision, self.shift + other.shift, self.count + other.count
        )

    def scale(self, factor: float) -> SufficientStatistics:
        """The statistics times ``factor`` (e.g. :math:`N/|\\mathcal B|`); ``count`` is unchanged."""
        if factor == 1.0:
            return self
        return SufficientStatistics(factor * self.precision, factor * self.shift, self.count)

    def all_reduce(
        self, group: Any = None, extras: Sequence[Tensor] = ()
    ) -> tuple[SufficientStatistics, list[Tensor]]:
        """The statistics summed over the processes of ``group`` (``torch.distributed``; the identity without one),
        together with the sums of ``extras`` (e.g. ELBO terms), in one all-reduce."""
        if not is_distributed(group):
            return self, list(extras)
        count = torch.tensor([float(self.count)], dtype=self.shift.dtype, device=self.shift.device)
        extras = [e.to(self.shift.dtype) for e in extras]
        precision, shift, count, *extras = all_reduce_sum([self.precision, self.shift, count, *extras], group)
        return SufficientStatistics(precision, shift, int(round(float(count.item())))), extras

    def natural(self) -> NaturalParameters:
        r"""The natural parameters :math:`(b, B) = (s, I + S)` of the optimal :math:`q(v)` for these statistics."""
        return NaturalParameters(self.shift, add_to_diagonal(self.precision.clone(), 1.0))


class NaturalParameters(NamedTuple):
    r"""A Gaussian over :math:`v` as :math:`(b, B)`: precision :math:`B` and :math:`b = B m`, unfactorised.

    Example::

        >>> import torch
        >>> from gpytorch_augment.core import SufficientStatistics
        >>> stats = SufficientStatistics(torch.eye(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64), 4)
        >>> target = stats.natural()                      # B = I + S, b = s
        >>> target.factorize().mean.round(decimals=12).tolist()   # B^{-1} b
        [0.5, 0.5]
    """

    b: Tensor
    B: Tensor

    def mix(self, target: NaturalParameters, rho: float) -> NaturalParameters:
        r"""The damped natural-gradient step :math:`\theta \leftarrow (1-\rho)\theta + \rho\hat\theta` toward
        ``target`` (``rho = 1`` returns ``target`` itself)."""
        if rho == 1.0:
            return target
        return NaturalParameters((1 - rho) * self.b + rho * target.b, (1 - rho) * self.B + rho * target.B)

    def factorize(self) -> WhitenedGaussian:
        """The same Gaussian with :math:`B = C^\\top C` factorised, without a host synchronisation: the precisions
        of the engines are :math:`I` plus positive semi-definite statistics, or convex combinations of positive
        definite ones, so the factorisation does not fail short of non-finite entries, which give NaN factors."""
        return WhitenedGaussian(self.b, reverse_cholesky(self.B, checked=False))


def natural_gradient(q: WhitenedGaussian, target: NaturalParameters) -> Tensor:
    r""":math:`\hat\theta - \theta` in whitened natural parameters, flattened: :math:`(\hat b - \theta_1,
    -\tfrac12(\hat B - C^\top C))` -- the natural gradient of the ELBO at ``q`` for the target's statistics.

    Example::

        >>> import torch
        >>> from gpytorch_augment.core import SufficientStatistics, WhitenedGaussian, natural_gradient
        >>> stats = SufficientStatistics(torch.eye(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64), 4)
        >>> q = WhitenedGaussian.optimal(stats)
        >>> float(natural_gradient(q, stats.natural()).abs().max()) < 1e-12   # zero at the optimum
        True
    """
    return torch.cat([(target.b - q.theta1).reshape(-1), (-0.5 * (target.B - q.C.mT @ q.C)).reshape(-1)])


class WhitenedGaussian(NamedTuple):
    r""":math:`q(v)` as natural vector :math:`\theta_1` ``(*b, M)`` and lower :math:`C` ``(*b, M, M)`` with
    :math:`S_v^{-1} = C^\top C`.

    Example::

        >>> import torch
        >>> from gpytorch_augment.core import SufficientStatistics, WhitenedGaussian
        >>> stats = SufficientStatistics(torch.eye(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64), 4)
        >>> q = WhitenedGaussian.optimal(stats)
        >>> q.mean.round(decimals=12).tolist(), float(q.kl()) > 0
        ([0.5, 0.5], True)
    """

    theta1: Tensor
    C: Tensor

    @classmethod
    def optimal(cls, stats: SufficientStatistics) -> WhitenedGaussian:
        """The optimal :math:`q(v)` for the statistics (one factorisation)."""
        return stats.natural().factorize()

    def natural(self) -> NaturalParameters:
        return NaturalParameters(self.theta1, self.C.mT @ self.C)

    def step(self, target: NaturalParameters, rho: float) -> WhitenedGaussian:
        r"""The damped step toward ``target`` (``rho = 1``: ``target`` itself), factorised."""
        if rho == 1.0:
            return target.factorize()
        return self.natural().mix(target, rho).factorize()

    def where(self, moves: Tensor, other: WhitenedGaussian) -> WhitenedGaussian:
        """``self`` for the batch entries (latents) where the boolean ``moves`` ``(*b,)`` is set, ``other``
        elsewhere."""
        return WhitenedGaussian(
            torch.where(moves.unsqueeze(-1), self.theta1, other.theta1),
            torch.where(moves.unsqueeze(-1).unsqueeze(-1), self.C, other.C),
        )

    @property
    def chol_covariance(self) -> Tensor:
        """Lower Cholesky factor of :math:`S_v`, i.e. :math:`C^{-1}`."""
        eye = torch.eye(self.C.shape[-1], dtype=self.C.dtype, device=self.C.device)
        return tri_solve(self.C, eye.expand_as(self.C))

    @property
    def mean(self) -> Tensor:
        """:math:`m_v = C^{-1} C^{-\\top} \\theta_1`."""
        return self.draw(None)

    def draw(self, eps: Tensor | None, mean_weight: float = 1.0, noise_weight: float = 1.0) -> Tensor:
        r"""The pathwise draw :math:`v = C^{-1}(w\,C^{-\top}\theta_1 + c\,\varepsilon)` (``mean_weight`` :math:`w`,
        ``noise_weight`` :math:`c`): with :math:`\varepsilon \sim \mathcal N(0, I)` and :math:`w = c = 1` a draw
        from :math:`\mathcal N(m_v, S_v)`; without ``eps`` the mean (times :math:`w`). Two triangular solves."""
        t = tri_solve(self.C.mT, self.theta1.unsqueeze(-1), upper=True).squeeze(-1)
        if eps is not None:
            t = t + eps if mean_weight == 1.0 and noise_weight == 1.0 else mean_weight * t + noise_weight * eps
        elif mean_weight != 1.0:
            t = mean_weight * t
        return tri_solve(self.C, t.unsqueeze(-1)).squeeze(-1)

    def noise_of(self, v: Tensor) -> Tensor:
        r"""The :math:`\varepsilon` whose pathwise :meth:`draw` is ``v``: :math:`C v - C^{-\top}\theta_1` (one
        triangular solve and one product)."""
        t = tri_solve(self.C.mT, self.theta1.unsqueeze(-1), upper=True).squeeze(-1)
        return (self.C @ v.unsqueeze(-1)).squeeze(-1) - t

    def log_normalizer(self) -> Tensor:
        r"""The log normaliser of the tilted standard normal whose natural parameters these are,

        .. math::
            \log \int \mathcal N(v \mid 0, I)\, e^{\theta_1^\top v - \frac12 v^\top (B - I) v}\, dv
            = \tfrac12 \theta_1^\top B^{-1} \theta_1 - \tfrac12 \log\lvert B\rvert
            = \tfrac12 \lVert C^{-\top}\theta_1\rVert^2 - \textstyle\sum_j \log C_{jj},

        :math:`B = C^\top C` (complete the square: the integrand is
        :math:`(2\pi)^{-M/2} e^{-\frac12 v^\top B v + \theta_1^\top v}`, whose integral is
        :math:`\lvert B\rvert^{-1/2} e^{\frac12 \theta_1^\top B^{-1}\theta_1}`). One triangular solve; shape
        ``(*b)``. :func:`collapsed_log_marginal` adds the data's terms to it.

        Example::

            >>> import math, torch
            >>> from gpytorch_augment.core import WhitenedGaussian
            >>> t = lambda *v: torch.tensor(v, dtype=torch.float64)
            >>> q = WhitenedGaussian(t(1.0), t([2.0]))
            >>> # B = 4: log of int N(v|0,1) exp(v - 3 v^2 / 2) dv = 1 / 8 - log 2
            >>> math.isclose(float(q.log_normalizer()), 1 / 8 - math.log(2.0))
            True
        """
        t = tri_solve(self.C.mT, self.theta1.unsqueeze(-1), upper=True).squeeze(-1)
        return 0.5 * t.square().sum(-1) - self.C.diagonal(dim1=-1, dim2=-2).abs().log().sum(-1)

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """One draw of :math:`v` per batch entry."""
        eps = torch.randn(self.theta1.shape, generator=generator, dtype=self.theta1.dtype, device=self.theta1.device)
        return self.draw(eps)

    def kl(self) -> Tensor:
        r""":math:`\mathrm{KL}(q(v)\,\Vert\,\mathcal N(0, I)) = \mathrm{KL}(q(u)\,\Vert\,p(u))`."""
        M = self.C.shape[-1]
        R = self.chol_covariance
        m = self.mean
        logdet_prec = 2 * self.C.diagonal(dim1=-1, dim2=-2).abs().log().sum(-1)
        return 0.5 * (R.pow(2).sum((-1, -2)) + m.pow(2).sum(-1) - M + logdet_prec)

    def marginals(self, terms: PriorTerms) -> tuple[Tensor, Tensor]:
        r"""Means and variances of :math:`q(f_i)`: :math:`m = \mu_X + A^\top m_v`,
        :math:`s = k_{ii} - \lVert A_i\rVert^2 + \lVert C^{-\top} A_i\rVert^2` (clamped at 0): :math:`C^{-\top}`
        is formed once and multiplies blocks of data points (:func:`~gpytorch_augment.core.linalg.block_width`): a
        matrix product, twice the floating-point work of a triangular solve but faster in practice
        (``benchmarks/README.md``, engine notes); :math:`C^\top C = B \succeq I`, so the inverse is well
        conditioned."""
        A = terms.A
        mean = terms.mu_X + (self.mean.unsqueeze(-2) @ A).squeeze(-2)  # m_v^T A: faster than A^T m_v batched
        explained = []
        R_t = self.chol_covariance.mT  # C^{-T} once (M^3), then products: faster than a triangular solve per block
        for A_b in A.split(block_width(A.shape[-1], A.numel() // max(1, A.shape[-1]), A.device), -1):
            CA = R_t @ A_b
            explained.append((CA.square() if CA.requires_grad else CA.square_()).sum(-2))  # CA is ours: in place
        var = terms.k_diag - terms.a_sq + (explained[0] if len(explained) == 1 else torch.cat(explained, -1))
        return mean, var.clamp_min(0)


def collapsed_log_marginal(
    A: Tensor, mu: Tensor, h: Tensor, lam: Tensor, d: Tensor | None = None
) -> tuple[Tensor, WhitenedGaussian]:
    r"""The Gaussian integral of a batch of tilts and the whitened posterior it leaves.

    For the Gaussian :math:`g = \mu + A^\top v`, :math:`v \sim \mathcal N(0, I)` (the exact prior with
    :math:`A = L^\top`, :math:`K = LL^\top`; linear observations :math:`g = Df` with :math:`(AD^\top, D\mu)`) and
    tilts :math:`e^{h_i g_i - \frac12 \lambda_i g_i^2}`:

    .. math::
        \log Z = \log \int \mathcal N(v \mid 0, I) \prod_i e^{h_i g_i - \frac12\lambda_i g_i^2}\, dv
        = \sum_i \big(h_i\mu_i - \tfrac12\lambda_i\mu_i^2\big)
          + \tfrac12 \lVert C^{-\top} b\rVert^2 - \textstyle\sum_j \log C_{jj},

    with :math:`b = A(h - \lambda\odot\mu)` and :math:`B = I + A\Lambda A^\top = C^\top C`: expanding
    :math:`h_i g_i - \frac12\lambda_i g_i^2` at :math:`g = \mu + A^\top v` gives the constant
    :math:`h_i\mu_i - \frac12\lambda_i\mu_i^2`, the linear term :math:`b^\top v` and the quadratic
    :math:`-\frac12 v^\top A\Lambda A^\top v`, whose integral against :math:`\mathcal N(0, I)` is
    :meth:`WhitenedGaussian.log_normalizer`. The tilted density normalised is
    :math:`q(v) = \mathcal N(B^{-1}b, B^{-1})`, returned as well (the Gibbs draw of :math:`v` given the tilts).

    Given the auxiliary variables :math:`\Omega` of an augmented likelihood, :math:`\log Z` is
    :math:`\log p(y, \Omega \mid \theta)` up to terms free of the prior's hyper-parameters :math:`\theta`: the
    collapsed marginal the hyper-parameter move of :class:`~gpytorch_augment.GibbsSampler` targets.

    With ``d`` (the inducing-point model's :math:`g_i = \mu_i + a_i^\top v + \sqrt{d_i}\,\varepsilon_i`,
    :math:`d_i` the variances of :math:`p(f_i \mid u)`) each datum's tilt is first integrated over its own noise
    (:func:`noisy_tilts`): the same formula with the tilts :math:`(\tilde h, \tilde\lambda)` plus the per-datum
    constants, and ``q`` is the conditional of :math:`v` with :math:`f` integrated out.

    :param A: ``(*b, M, N)``; :param mu: ``(*b, N)``; :param h, lam: potentials and precisions ``(*b, N)``;
        :param d: optional non-negative variances ``(*b, N)`` (``None``: :math:`d = 0`).
    :return: ``(log_z, q)``, ``log_z`` of shape ``(*b)`` and ``q`` the :class:`WhitenedGaussian` of
        :math:`(b, C)`. A non-finite ``A`` gives a non-finite ``log_z`` (never an error).

    Example::

        >>> import math, torch
        >>> from gpytorch_augment.core import collapsed_log_marginal
        >>> A, mu = torch.tensor([[2.0]], dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64)
        >>> h, lam = torch.tensor([1.0], dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64)
        >>> log_z, q = collapsed_log_marginal(A, mu, h, lam)
        >>> # g ~ N(0.5, 4): E exp(g - g^2 / 4) = exp(13 / 16) / sqrt(3) in closed form
        >>> math.isclose(float(log_z), 13 / 16 - 0.5 * math.log(3.0)), q.mean.shape
        (True, torch.Size([1]))
    """
    dtype = A.dtype
    mu, h, lam = mu.to(dtype), h.to(dtype), lam.to(dtype)
    constant = None
    if d is not None:
        h, lam, constant = noisy_tilts(h, lam, d.to(dtype))
    q = WhitenedGaussian.optimal(SufficientStatistics.from_batch(A, mu, h, lam))
    offset = (h * mu - 0.5 * lam * mu.square()).sum(-1)
    if constant is not None:
        offset = offset + constant.sum(-1)
    return offset + q.log_normalizer(), q


def noisy_tilts(h: Tensor, lam: Tensor, d: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""A Gaussian tilt :math:`e^{hf - \frac12\lambda f^2}` integrated against :math:`\mathcal N(f \mid m, d)`, as a
    tilt of :math:`m` (elementwise):

    .. math::
        \int \mathcal N(f \mid m, d)\, e^{hf - \frac12\lambda f^2}\, df
        = e^{c}\, e^{\tilde h m - \frac12\tilde\lambda m^2},\qquad
        \tilde h = \frac{h}{1 + \lambda d},\quad \tilde\lambda = \frac{\lambda}{1 + \lambda d},\quad
        c = \frac{h^2 d}{2(1 + \lambda d)} - \frac12\log(1 + \lambda d).

    *Derivation.* The exponent :math:`-\frac{(f - m)^2}{2d} + hf - \frac12\lambda f^2` has precision
    :math:`P = \frac1d + \lambda = \frac{1 + \lambda d}{d}` and linear coefficient :math:`\frac md + h`; the
    Gaussian integral is :math:`(dP)^{-1/2} \exp\big(\frac{(m/d + h)^2}{2P} - \frac{m^2}{2d}\big)`, and
    :math:`\frac{(m + hd)^2 - m^2(1 + \lambda d)}{2d(1 + \lambda d)}
    = \frac{2hm + h^2 d - \lambda m^2}{2(1 + \lambda d)}`. At :math:`d = 0` it is the tilt itself (:math:`c = 0`).
    These are Power EP's :math:`\alpha = 1` (FITC) pseudo-observations, with the constant :math:`c`, which depends on
    the prior's hyper-parameters through :math:`d`.

    :return: ``(h_tilde, lam_tilde, c)``, broadcast.

    Example::

        >>> import math, torch
        >>> from gpytorch_augment.core import noisy_tilts
        >>> h, lam, d = (torch.tensor([v], dtype=torch.float64) for v in (1.0, 2.0, 0.5))
        >>> h_t, lam_t, c = noisy_tilts(h, lam, d)
        >>> h_t.item(), lam_t.item(), math.isclose(c.item(), 0.125 - 0.5 * math.log(2.0))
        (0.5, 1.0, True)
    """
    shrink = (lam * d).add_(1.0).reciprocal_()
    constant = 0.5 * (h.square() * d * shrink + shrink.log())
    return h * shrink, lam * shrink, constant


def tilted_conditional(m: Tensor, d: Tensor, h: Tensor, lam: Tensor) -> tuple[Tensor, Tensor]:
    r"""Mean and variance of :math:`p(f) \propto \mathcal N(f \mid m, d)\, e^{hf - \frac12\lambda f^2}`
    (elementwise): :math:`\big(\frac{m + hd}{1 + \lambda d},\ \frac{d}{1 + \lambda d}\big)`; at :math:`d = 0`
    the point :math:`m`. The inducing-point model's :math:`f_i \mid u, \Omega` (:func:`noisy_tilts` derives it).

    Example::

        >>> import torch
        >>> from gpytorch_augment.core import tilted_conditional
        >>> one = torch.ones(1, dtype=torch.float64)
        >>> [t.item() for t in tilted_conditional(0 * one, one, one, one)]   # N(0, 1) e^{f - f^2/2}: N(1/2, 1/2)
        [0.5, 0.5]
    """
    shrink = (lam * d).add_(1.0).reciprocal_()
    return (m + h * d) * shrink, d * shrink


def gaussian_log_density(f: Tensor, mean: Tensor, L: Tensor) -> Tensor:
    r""":math:`\log \mathcal N(f \mid \mu, LL^\top)` over the last dimension, :math:`L` lower triangular
    (batched, broadcast): :math:`-\frac12\lVert L^{-1}(f - \mu)\rVert^2 - \sum_j \log L_{jj}
    - \frac n2\log 2\pi`.

    Example::

        >>> import math, torch
        >>> from gpytorch_augment.core import gaussian_log_density
        >>> L = torch.tensor([[2.0]], dtype=torch.float64)
        >>> math.isclose(gaussian_log_density(torch.ones(1).double(), torch.zeros(1).double(), L).item(),
        ...              -0.125 - math.log(2.0) - 0.5 * math.log(2 * math.pi))
        True
    """
    r = tri_solve(L, (f - mean).unsqueeze(-1)).squeeze(-1)
    n = f.shape[-1]
    log_det = L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    return -0.5 * r.square().sum(-1) - log_det - 0.5 * n * math.log(2.0 * math.pi)
