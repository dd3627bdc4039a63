r"""Numerical building blocks shared by every likelihood and engine.

Everything that needs care in floating point lives here, once:

* special functions: :func:`log_cosh`; :func:`pg_mean`, :func:`pg_variance`, :func:`pg_kl` (moments of
  :math:`\mathrm{PG}(b, c)` and :math:`\mathrm{KL}(\mathrm{PG}(b,c)\,\Vert\,\mathrm{PG}(b,0))`, stable in value and
  gradient as :math:`c \to 0`); :func:`pg_tilt_c`, the tilt :math:`c = \sqrt{m^2 + s}` of an optimal Pólya-Gamma
  :math:`q`; :func:`log_sigma_tilde_plus`, :func:`log_sigma_tilde` (the logistic bounds); :func:`log1mexp`;
  :func:`student_t_log_normaliser`;
* one-dimensional integrals: :func:`gauss_hermite` and :func:`quadrature_mixture` (expectations and predictives over
  :math:`\mathcal N(m, s)`), :func:`log_trapezoid` (the trapezoid rule on a log scale) and
  :func:`expected_log1p_square` (:math:`E\log(1 + (y-f)^2/c)` by Frullani's integral);
* integrals over independent Gaussian latents: :func:`standard_normal_rule`, :func:`latent_expectation` (product
  Gauss--Hermite for :math:`J \le 3`, scrambled-Sobol quasi-Monte Carlo beyond) and :func:`additive_product_rule`
  (the product rule for functions of a sum of per-latent terms, at the cost of its one-dimensional rules);
* optimisation: :func:`safeguarded_newton`, the bracketed Newton root finder (elementwise, vectorised), and
  :func:`bounded_maximise`, the one-dimensional bounded search (grid, then golden section; vectorised);
* linear algebra: :func:`reverse_cholesky`;
* Laplace transforms: :func:`euler_inversion`, the Abate--Whitt Euler inversion of a Laplace transform (the CDF
  and density of a positive law from its transform, vectorised over points).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor
from torch.distributions import Categorical, Distribution, MixtureSameFamily

from ._validation import checking_values

LOG2 = math.log(2.0)


def _small_threshold(x: Tensor, float64: float = 1e-4, float32: float = 1e-2) -> float:
    """Below this |c| a Taylor series replaces a closed form that would cancel (or divide 0 by 0)."""
    return float64 if x.dtype == torch.float64 else float32


def log_cosh(x: Tensor) -> Tensor:
    r""":math:`\log\cosh x = |x| + \mathrm{softplus}(-2|x|) - \log 2`, finite for every finite ``x``."""
    ax = x.abs()
    return ax + torch.nn.functional.softplus(-2.0 * ax) - LOG2


def _tanh_half_over_c(c: Tensor) -> Tensor:
    r""":math:`\tanh(c/2) / (2c)`, i.e. :math:`\mathrm{PGm}(1, c)`, with its series near 0."""
    c = c.abs()
    small = c < _small_threshold(c)
    safe = torch.where(small, torch.ones_like(c), c)
    closed = torch.tanh(safe / 2) / (2 * safe)
    c2 = c * c
    series = 0.25 - c2 / 48 + c2 * c2 / 480
    return torch.where(small, series, closed)


def pg_mean(b: Tensor | float, c: Tensor) -> Tensor:
    r"""Mean of :math:`\mathrm{PG}(b, c)`: :math:`\frac{b}{2c}\tanh\frac c2` (:math:`b/4` at :math:`c=0`)."""
    return b * _tanh_half_over_c(c)


def pg_variance(b: Tensor | float, c: Tensor) -> Tensor:
    r"""Variance of :math:`\mathrm{PG}(b, c)`: :math:`\frac{b(\sinh c - c)}{4c^3\cosh^2(c/2)}` (:math:`b/24` at 0)."""
    c = c.abs()
    small = c < _small_threshold(c, 5e-2, 2e-1)
    safe = torch.where(small, torch.ones_like(c), c)
    # (sinh c - c) / cosh^2(c/2) = 2 (sinh c - c) / (cosh c + 1); for large c use exp(-c) forms to avoid overflow.
    big = safe > 20
    mid = torch.where(big, torch.ones_like(safe), safe)
    ratio_mid = 2 * (torch.sinh(mid) - mid) / (torch.cosh(mid) + 1)
    # for c > 20: (sinh c - c)/cosh^2(c/2) -> 2 (1 - 2c e^{-c}) / (1 + 2 e^{-c}) ~ 2
    e = torch.exp(-safe)
    ratio_big = 2 * (1 - e * e - 2 * safe * e) / (1 + e) ** 2
    ratio = torch.where(big, ratio_big, ratio_mid)
    closed = ratio / (4 * safe**3)
    c2 = c * c
    series = 1.0 / 24 - c2 / 120 + 17 * c2 * c2 / 13440 - 31 * c2**3 / 181440
    return b * torch.where(small, series, closed)


def pg_kl(b: Tensor | float, c: Tensor) -> Tensor:
    r""":math:`\mathrm{KL}(\mathrm{PG}(b,c)\Vert\mathrm{PG}(b,0))
    = b[\log\cosh\frac c2 - \frac{c^2}{2}\mathrm{PGm}(1,c)]`."""
    c = c.abs()
    small = c < _small_threshold(c, 1e-1, 7e-1)
    safe = torch.where(small, torch.ones_like(c), c)
    closed = log_cosh(safe / 2) - safe / 4 * torch.tanh(safe / 2)
    c2 = c * c
    series = c2 * c2 * (1.0 / 192 - c2 / 1440 + 17 * c2 * c2 / 215040 - 31 * c2**3 / 3628800)
    return b * torch.where(small, series, closed)


def log_sigma_tilde_plus(m: Tensor, c: Tensor) -> Tensor:
    r""":math:`\log\tilde\sigma^+(m, c) = \frac m2 - \log 2 - \log\cosh\frac c2` (Jaakkola--Jordan bound on
    :math:`E\log\sigma(f)` for :math:`c = \sqrt{m^2 + s}`)."""
    return m / 2 - LOG2 - log_cosh(c / 2)


def log_sigma_tilde(m: Tensor, c: Tensor) -> Tensor:
    r""":math:`\log\tilde\sigma(m, c) = -\frac m2 - \log 2 - \log\cosh\frac c2 = \log\tilde\sigma^+(-m, c)`
    (:doc:`/maths/binary`): the factor :math:`e^{-m/2}/(2\cosh\frac c2) \in (0, 1)` an optimal Poisson or
    negative-binomial :math:`q` produces; a lower bound on :math:`E\log\sigma(-f)` for :math:`c = \sqrt{m^2+s}`."""
    return log_sigma_tilde_plus(-m, c)


def log_sigma_tilde_moments(mean: Tensor, var: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    r""":math:`\log\tilde\sigma(m, c)` and :math:`\log(1 - \tilde\sigma(m, c))` at :math:`c = \sqrt{m^2 + s}`,
    from the moments :math:`(m, s)` rather than from a rounded :math:`c`.

    :math:`\log\tilde\sigma = -\frac{m + c}2 - \log(1 + e^{-c})`; for :math:`m < 0` the sum :math:`m + c` cancels
    (at :math:`m = -10^3, s = 1` in float32, :math:`c - |m|` is below the spacing of :math:`c`, so
    :math:`\tilde\sigma` would round to 1 and :math:`1 - \tilde\sigma` to 0) and is taken as
    :math:`s / (c - m)` instead."""
    half_sum = torch.where(mean < 0, var / (c - mean).clamp_min(torch.finfo(c.dtype).tiny), mean + c) / 2
    log_st = -half_sum - torch.nn.functional.softplus(-c)
    return log_st, torch.log(-torch.expm1(log_st))


def log1mexp(d: Tensor) -> Tensor:
    r""":math:`\log(1 - e^{d})` for :math:`d \le 0` (Mächler's two-branch form, accurate for every :math:`d`;
    ``-inf`` at :math:`d = 0`). E.g. :math:`\log(1 - e^{b_{k-1} - b_k})`, the :math:`f`-free factor of an ordinal
    class probability (:doc:`/maths/ordinal`).

    Example::

        >>> import torch
        >>> from gpytorch_augment._numerics import log1mexp
        >>> d = torch.tensor([-1e-10, -1.0, -50.0], dtype=torch.float64)
        >>> torch.allclose(log1mexp(d), torch.log(-torch.expm1(d)))
        True
    """
    d = d.clamp(max=0.0)
    return torch.where(d > -LOG2, torch.log(-torch.expm1(d)), torch.log1p(-torch.exp(d)))


def pg_tilt_c(mean: Tensor, var: Tensor) -> Tensor:
    r""":math:`c = \sqrt{m^2 + s}`: the tilt of the optimal :math:`q(\omega) = \mathrm{PG}(b, c)` under
    :math:`q(f) = \mathcal N(m, s)`, since :math:`E_q f^2 = m^2 + s`. With ``mean`` a residual :math:`y - m` it is the
    root mean square residual :math:`r = \sqrt{E_q (y - f)^2}` of the scale-mixture likelihoods."""
    return (mean**2 + var).sqrt()


def student_t_log_normaliser(df: Tensor) -> Tensor:
    r""":math:`\log\frac{\Gamma(\frac{\nu+1}2)}{\Gamma(\frac\nu2)\sqrt{\pi\nu}}`, the log-normaliser of the unit-scale
    Student-t density :math:`t_\nu(0\mid 0, 1)`."""
    return torch.lgamma((df + 1) / 2) - torch.lgamma(df / 2) - 0.5 * torch.log(math.pi * df)


@lru_cache(maxsize=16)
def _hermgauss(n: int) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.hermite.hermgauss(n)
    return x * math.sqrt(2.0), w / math.sqrt(math.pi)


@lru_cache(maxsize=64)
def _hermgauss_tensors(n: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """The standard-normal Gauss--Hermite rule as tensors, cached per ``(n, dtype, device)`` (no host copy per
    call on a GPU); the cached tensors must not be modified."""
    x, w = _hermgauss(n)
    return torch.as_tensor(x, dtype=dtype, device=device), torch.as_tensor(w, dtype=dtype, device=device)


def gauss_hermite(mean: Tensor, var: Tensor, num_locs: int = 20) -> tuple[Tensor, Tensor]:
    r"""Nodes ``f`` of shape ``(num_locs, *mean.shape)`` and weights of shape ``(num_locs, 1, ..)`` such
    that :math:`E_{\mathcal N(m, s)} g(f) \approx \sum_k w_k\, g(f_k)`. The rule is cached per dtype and device.

    Example::

        >>> import torch
        >>> from gpytorch_augment._numerics import gauss_hermite
        >>> nodes, weights = gauss_hermite(torch.tensor([1.0]), torch.tensor([4.0]), num_locs=10)
        >>> (weights * nodes**2).sum(0)          # E f^2 = m^2 + s
        tensor([5.])
    """
    x, w = _hermgauss_tensors(num_locs, mean.dtype, mean.device)
    shape = (num_locs,) + (1,) * mean.dim()
    return mean + var.clamp_min(0).sqrt() * x.view(shape), w.view(shape)


def quadrature_mixture(
    nodes: Tensor, weights: Tensor, component: Callable[[Tensor], Distribution]
) -> MixtureSameFamily:
    r"""The Gauss--Hermite predictive :math:`\sum_k w_k\, p(y \mid f_k)` as a ``MixtureSameFamily``.

    ``nodes`` and ``weights`` are those of :func:`gauss_hermite` (node dimension first); ``component`` maps latent
    values with the node dimension **last**, shape ``(*mean.shape, num_locs)``, to :math:`p(y \mid f)` (per-datum
    parameters must be given a trailing singleton dimension). The mixture's ``.mean`` and ``.variance`` are the
    quadrature moments and ``.log_prob(y)`` is the log of the quadrature-mixed density or mass.
    """
    f = nodes.movedim(0, -1)
    w = weights.expand_as(nodes).movedim(0, -1)
    return QuadratureMixture(Categorical(probs=w), component(f))


class QuadratureMixture(MixtureSameFamily):
    """The ``MixtureSameFamily`` of :func:`quadrature_mixture`: ``cdf`` also works for count components (by summing
    the mass function), and ``icdf`` (which a mixture has in no closed form) says where the quantiles are."""

    def cdf(self, x: Tensor) -> Tensor:
        if self.component_distribution.support.is_discrete:
            return discrete_mixture_cdf(self, x).to(self.mixture_distribution.probs.dtype)
        try:
            return super().cdf(x)
        except NotImplementedError as err:
            raise NotImplementedError(
                f"the predictive mixture of {type(self.component_distribution).__name__} has no cdf; use the "
                "likelihood's predictive_cdf(q_f, value) where it has one"
            ) from err

    def icdf(self, value: Tensor) -> Tensor:
        raise NotImplementedError(
            "a quadrature mixture has no closed-form icdf: use likelihood.predictive_quantile(q_f, q) or "
            "likelihood.predictive_interval(q_f, level) (same keyword data as likelihood(q_f, ...))"
        )


#: grid points of the mass function evaluated at a time (per datum and quadrature node)
_CHUNK = 256


def _upper_bound(mixture: MixtureSameFamily) -> Tensor | None:
    """The largest value of the components' support (the binomial's trials), per datum; ``None`` if unbounded."""
    upper = getattr(mixture.component_distribution.support, "upper_bound", None)
    device = mixture.mixture_distribution.probs.device
    return None if upper is None else torch.as_tensor(upper, device=device)[..., 0]


def discrete_mixture_cdf(mixture: MixtureSameFamily, value: Tensor | float) -> Tensor:
    r""":math:`P(y \le \text{value})` of a mixture of distributions on :math:`\{0, 1, \dots\}`, by summing its mass
    function over :math:`0, \dots, \lfloor\text{value}\rfloor` (float64; ``value`` broadcasts against the data)."""
    shape, device = mixture.batch_shape, mixture.mixture_distribution.probs.device
    value = torch.as_tensor(value, dtype=torch.float64, device=device).floor().expand(shape)
    total = torch.zeros(shape, dtype=torch.float64, device=device)
    top = int(value.max().clamp(min=-1).item())
    upper = _upper_bound(mixture)
    for start in range(0, top + 1, _CHUNK):
        stop = min(start + _CHUNK, top + 1)
        grid = torch.arange(start, stop, dtype=torch.float64, device=device).reshape(-1, *[1] * len(shape))
        total = total + (_mass(mixture, grid, upper) * (grid <= value)).sum(0)
    return total.clamp(max=1.0)


def _mass(mixture: MixtureSameFamily, grid: Tensor, upper: Tensor | None) -> Tensor:
    """The mixture's probability mass at ``grid`` (``(G, *batch)``), 0 beyond the support's upper bound."""
    dtype = mixture.mixture_distribution.probs.dtype
    grid = grid.expand(grid.shape[0], *mixture.batch_shape)
    inside = torch.ones_like(grid, dtype=torch.bool) if upper is None else grid <= upper.to(grid)
    safe = grid if upper is None else torch.minimum(grid, upper.to(grid))
    return torch.where(inside, mixture.log_prob(safe.to(dtype)).double().exp(), 0.0)


def discrete_mixture_quantile(mixture: MixtureSameFamily, q: Tensor | float) -> Tensor:
    r"""The smallest integer :math:`k` with :math:`P(y \le k) \ge q`, per datum (``q`` broadcasts against the data),
    found by summing the mass function upwards from 0 in chunks until every quantile is reached."""
    shape, device = mixture.batch_shape, mixture.mixture_distribution.probs.device
    q = torch.as_tensor(q, dtype=torch.float64, device=device).expand(shape)
    upper = _upper_bound(mixture)
    cdf = torch.zeros(shape, dtype=torch.float64, device=device)
    out = torch.full(shape, -1.0, dtype=torch.float64, device=device)
    start = 0
    while bool((out < 0).any()):
        grid = torch.arange(start, start + _CHUNK, dtype=torch.float64, device=device).reshape(-1, *[1] * len(shape))
        running = cdf + _mass(mixture, grid, upper).cumsum(0)
        reached = running >= q * (1 - 1e-12)
        if upper is not None:  # the last support point holds the rest of the mass
            reached = reached | (grid >= upper.to(grid))
        first = torch.where(reached.any(0), reached.double().argmax(0).double() + start, torch.full_like(q, -1.0))
        out = torch.where((out < 0) & (first >= 0), first, out)
        cdf = running[-1]
        start += _CHUNK
    return out


#: nodes of :func:`log_trapezoid` (step <= 0.25 on the widest range it is used on; error ~ exp(-pi^2 / step))
LOG_GRID_NODES = 400
#: nats of exponential decay of an integrand left out at each end of a log-scale range
LOG_GRID_TAIL = 45.0


def log_trapezoid(
    log_integrand: Callable[[Tensor], Tensor], lo: Tensor, hi: Tensor, num: int = LOG_GRID_NODES
) -> Tensor:
    r""":math:`\log\int_{lo}^{hi} e^{g(u)}\,du` by the trapezoid rule on ``num`` nodes, elementwise.

    ``log_integrand`` maps nodes of shape ``(num, *lo.shape)`` to :math:`g` there. For integrands analytic in a strip
    around the real axis that decay exponentially at both ends (where the end weights do not matter) the rule
    converges geometrically in the step; the sum is taken in log space.
    """
    steps = torch.linspace(0.0, 1.0, num, dtype=lo.dtype, device=lo.device).view(num, *([1] * lo.dim()))
    u = lo + (hi - lo) * steps
    return torch.logsumexp(log_integrand(u), dim=0) + torch.log((hi - lo) / (num - 1))


def expected_log1p_square(d2: Tensor, var: Tensor, c: Tensor) -> Tensor:
    r""":math:`E_{\mathcal N(f\mid m, s)}\log(1 + (y-f)^2/c)` for ``d2`` :math:`=(y-m)^2` and ``var`` :math:`=s`.

    Frullani's integral and the Gaussian expectation of :math:`e^{-\tau(y-f)^2}` give

    .. math::
        E\log\Big(1 + \frac{(y-f)^2}{c}\Big) = \int_0^\infty\Big[1 - \Big(1 + \frac{2ts}c\Big)^{-1/2}
        e^{-t d^2/(c + 2ts)}\Big]\,\frac{e^{-t}}t\,dt ,

    integrated by :func:`log_trapezoid` in :math:`\log t`: accurate for any :math:`c/s`, where Gauss--Hermite over
    :math:`f` is off by tenths of a nat once :math:`\sqrt c \ll \sqrt s`.
    """
    hi = torch.full_like(d2 + c + var, math.log(LOG_GRID_TAIL))
    lo = torch.log(c / (c + var + d2)) - LOG_GRID_TAIL

    def log_integrand(u: Tensor) -> Tensor:  # log[(1 - E e^{-t (y-f)^2 / c}) e^{-t}], t = e^u
        t = u.exp()
        log_laplace = -0.5 * torch.log1p(2 * t * var / c) - t * d2 / (c + 2 * t * var)
        return torch.log(-torch.expm1(log_laplace)) - t

    return log_trapezoid(log_integrand, lo, hi).exp()


# ---------------------------------------------------------------------------------------------- latent integrals
#: nodes per latent of the product Gauss--Hermite rule for J <= 3 latents (quasi-Monte Carlo beyond)
PRODUCT_RULE_NODES = {1: 64, 2: 40, 3: 20}
#: default number of quasi-Monte Carlo points (scrambled Sobol, fixed seed) for J > 3 latents
NUM_QMC_POINTS = 2**14
_QMC_SEED = 20240917
#: elements of one chunk of (points x data x latents) in the latent integrals
_CHUNK_ELEMENTS = 2**22


@lru_cache(maxsize=32)
def standard_normal_rule(
    num_latents: int, dtype: torch.dtype, device: torch.device, num_points: int = NUM_QMC_POINTS
) -> tuple[Tensor, Tensor]:
    r"""Points :math:`z_p \in \mathbb R^J` and weights :math:`w_p` with :math:`E\,g(z) \approx \sum_p w_p g(z_p)`
    for :math:`z \sim \mathcal N(0, I_J)`: a product Gauss--Hermite rule for :math:`J \le 3`
    (:data:`PRODUCT_RULE_NODES`), else ``num_points`` scrambled Sobol points (fixed seed) through the inverse
    normal CDF. Cached; the tensors must not be modified."""
    if num_latents in PRODUCT_RULE_NODES:
        zero = torch.zeros((), dtype=torch.float64)
        x, w = gauss_hermite(zero, torch.ones_like(zero), PRODUCT_RULE_NODES[num_latents])
        grid = torch.cartesian_prod(*([x] * num_latents)).reshape(-1, num_latents)
        weights = torch.cartesian_prod(*([w] * num_latents)).reshape(-1, num_latents).prod(-1)
    else:
        engine = torch.quasirandom.SobolEngine(num_latents, scramble=True, seed=_QMC_SEED)
        u = engine.draw(num_points, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
        grid = math.sqrt(2.0) * torch.erfinv(2 * u - 1)
        weights = torch.full((num_points,), 1.0 / num_points, dtype=torch.float64)
    return grid.to(device=device, dtype=dtype), weights.to(device=device, dtype=dtype)


def latent_expectation(
    fn: Callable[[Tensor], Tensor], mean: Tensor, var: Tensor, num_points: int = NUM_QMC_POINTS
) -> Tensor:
    r""":math:`E_{f_{ij} \sim \mathcal N(m_{ij}, s_{ij})\ \text{indep.}}\, \mathrm{fn}(f)` for ``mean, var`` of shape
    ``(..., N, J)`` by :func:`standard_normal_rule`; ``fn`` maps latents with a leading point dimension to values
    with the same leading dimension. Chunked over the points; differentiable in ``mean`` and ``var``."""
    z, w = standard_normal_rule(mean.shape[-1], mean.dtype, mean.device, num_points)
    sd = var.clamp_min(0).sqrt()
    chunk = max(1, _CHUNK_ELEMENTS // max(1, mean.numel()))
    total: Tensor | None = None
    for start in range(0, z.shape[0], chunk):
        zc = z[start : start + chunk].reshape(-1, *([1] * (mean.dim() - 1)), mean.shape[-1])
        values = fn(mean + sd * zc)
        wc = w[start : start + chunk].reshape(-1, *([1] * (values.dim() - 1)))
        part = (wc * values).sum(0)
        total = part if total is None else total + part
    assert total is not None
    return total


def additive_product_rule(
    link: Callable[[Tensor], Tensor],
    mean: Tensor,
    var: Tensor,
    log_scales: Tensor,
    offset: Tensor | None = None,
    ratios: bool = False,
) -> Tensor:
    r"""Product Gauss--Hermite integrals of :math:`T(f) = b + \sum_{j\le J} a_j e^{\ell(f_j)}` over independent
    :math:`f_j \sim \mathcal N(m_j, s_j)`, :math:`J \le 3` (:data:`PRODUCT_RULE_NODES` nodes per latent).

    :math:`T` on the product grid is a sum of per-latent terms, so only the :math:`nJ` node values need the
    ``link`` :math:`\ell` and the grid costs one division (or logarithm) per point.

    :param link: :math:`\ell`, elementwise (e.g. ``logsigmoid``).
    :param mean: :math:`m`, shape ``(B, J)``.
    :param var: :math:`s`, shape ``(B, J)``.
    :param log_scales: :math:`\log a_j`, shape ``(B, J)``.
    :param offset: :math:`b \ge 0`, shape ``(B,)`` (default 0).
    :param ratios: return :math:`E[a_j e^{\ell(f_j)} / T]`, shape ``(B, J)`` (with :math:`E[b/T]` appended as
        column :math:`J + 1` when ``offset`` is given), instead of :math:`E\log T`, shape ``(B,)``.
    """
    J = mean.shape[-1]
    n = PRODUCT_RULE_NODES[J]
    zero = torch.zeros((), dtype=mean.dtype, device=mean.device)
    z, w = gauss_hermite(zero, torch.ones_like(zero), n)  # (n,), (n,)
    sd = var.clamp_min(0).sqrt()
    grid_axes = tuple(range(J))
    weights = w.reshape(-1, *([1] * J))
    for j in range(1, J):
        weights = weights * w.reshape(*([1] * j), n, *([1] * (J - j)))
    chunk = max(1, _CHUNK_ELEMENTS // n**J)
    parts = []
    for start in range(0, mean.shape[0], chunk):
        rows = slice(start, start + chunk)
        log_t = log_scales[rows] + link(mean[rows] + sd[rows] * z.view(n, 1, 1))  # (n, B, J)
        log_b = offset[rows].log() if offset is not None else None
        # each row shifted by its largest term: T e^{-shift} does not underflow where every term is tiny
        shift = log_t.detach().amax((0, 2))
        if log_b is not None:
            shift = torch.maximum(shift, log_b.detach())
        shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
        log_t = log_t - shift.unsqueeze(-1)

        def grid_views(values: Tensor) -> list[Tensor]:
            return [values[..., j].reshape(*([1] * j), n, *([1] * (J - 1 - j)), -1) for j in range(J)]

        views = grid_views(log_t.exp())
        total = (log_b - shift).exp() if log_b is not None else torch.zeros_like(shift)
        for view in views:
            total = total + view  # (n,)*J + (B,)
        if bool((total <= 0).any()) or not bool(torch.isfinite(total).all()):
            # a grid spread wider than the dtype's range: the log-domain sum (slower, exact in range)
            views = grid_views(log_t)
            log_total = (log_b - shift).expand_as(shift) if log_b is not None else None
            for view in views:
                log_total = view if log_total is None else torch.logaddexp(log_total, view)
            assert log_total is not None
            if ratios:
                cols = [(weights * (view - log_total).exp()).sum(grid_axes) for view in views]
                if log_b is not None:
                    cols.append((weights * (log_b - shift - log_total).exp()).sum(grid_axes))
                parts.append(torch.stack(cols, -1))
            else:
                parts.append((weights * log_total).sum(grid_axes) + shift)
            continue
        if ratios:
            inv = weights / total
            cols = [(inv * view).sum(grid_axes) for view in views]
            if offset is not None:
                cols.append(inv.sum(grid_axes) * (log_b - shift).exp())
            parts.append(torch.stack(cols, -1))
        else:
            parts.append((weights * total.log()).sum(grid_axes) + shift)
    return torch.cat(parts, 0)


def reverse_cholesky(B: Tensor, checked: bool = True) -> Tensor:
    r"""Lower-triangular :math:`C` with :math:`B = C^\top C`, so that :math:`\mathrm{chol}(B^{-1}) = C^{-1}`.

    Computed as :math:`C = \mathrm{flip}(\mathrm{chol}(\mathrm{flip}(B)))^\top` where ``flip`` reverses both axes.
    ``checked``: GPyTorch's ``psd_safe_cholesky`` (jitter retries; it reads the factorisation's status back, a host
    synchronisation on CUDA). ``checked=False`` is for precisions :math:`B \succeq I` (whitened posteriors), whose
    factorisation cannot fail in exact arithmetic and which jitter would not help: no retry, no synchronisation, and a
    failed factorisation (non-finite entries) gives NaN factors, which surface as a non-finite ELBO.

    Example::

        >>> import torch
        >>> B = torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
        >>> C = reverse_cholesky(B, checked=False)
        >>> torch.allclose(C.mT @ C, B), bool(C[0, 1] == 0)
        (True, True)
    """
    flipped = B.flip(-1, -2)
    if checked:
        from linear_operator.utils.cholesky import psd_safe_cholesky

        factor = psd_safe_cholesky(flipped)
    else:
        factor, info = torch.linalg.cholesky_ex(flipped)
        factor = torch.where((info > 0)[..., None, None], torch.nan, factor)
    return factor.flip(-1, -2).mT


def safeguarded_newton(
    fn: Callable[[Tensor], tuple[Tensor, Tensor]],
    lo: Tensor,
    hi: Tensor,
    x0: Tensor | None = None,
    *,
    increasing: bool | None = None,
    rtol: float = 1e-13,
    atol: float = 1e-13,
    max_iter: int = 100,
) -> Tensor:
    r"""Elementwise root of :math:`g(x) = 0` in :math:`[lo, hi]` by Newton steps safeguarded by a bracket.

    ``fn(x)`` returns :math:`(g(x), g'(x))`, elementwise in ``x`` (a batch of independent scalar equations, one per
    element of ``broadcast(lo, hi, x0)``). Every step shrinks the bracket to the side where :math:`g` changes
    sign, and a Newton step :math:`x - g/g'` that is not finite or leaves the open bracket is replaced by
    bisection; so the iteration always converges (at worst linearly, like bisection) and, near a simple root,
    quadratically: a handful of steps from a reasonable start. It stops when a step is below
    ``atol + rtol * |x|`` (``rtol`` at least two machine epsilons) or the bracket is that narrow, or after
    ``max_iter`` steps.

    Without ``increasing``, :math:`g` is evaluated at both ends first; where it has the same sign at both, the end
    with the smaller :math:`|g|` is returned (for a monotone :math:`g`, the root clipped to :math:`[lo, hi]`).
    With ``increasing=True``/``False`` (a monotone :math:`g` whose direction is known) those two evaluations
    are skipped, and a root beyond the bracket is approached by bisection towards the nearer end.
    :math:`g` must be finite on the bracket.

    :param fn: :math:`x \mapsto (g(x), g'(x))`.
    :param lo: lower ends of the brackets.
    :param hi: upper ends of the brackets (``hi >= lo``).
    :param x0: starting points (clamped into the bracket; default the midpoints), e.g. the previous root.
    :param increasing: the direction of a monotone :math:`g`, if known.
    :returns: the roots, shape ``broadcast(lo, hi, x0)``.

    Example::

        >>> g = lambda x: (x**3 - 2, 3 * x**2)
        >>> safeguarded_newton(g, torch.tensor(0.0), torch.tensor(2.0), increasing=True)   # 2 ** (1 / 3)
        tensor(1.2599)
    """
    lo, hi = torch.broadcast_tensors(lo, hi) if x0 is None else torch.broadcast_tensors(lo, hi, x0)[:2]
    if checking_values() and (reversed_brackets := int((hi < lo).sum())):
        raise ValueError(
            f"safeguarded_newton: every bracket needs hi >= lo, got hi < lo in {reversed_brackets} of {lo.numel()}"
        )
    x = (lo + hi) / 2 if x0 is None else torch.minimum(torch.maximum(x0, lo), hi)
    if increasing is None:
        g_lo, g_hi = fn(lo)[0], fn(hi)[0]
        sign_lo = torch.sign(g_lo)
        bracketed = sign_lo * torch.sign(g_hi) < 0
        # no sign change: the end nearer the root (a zero at either end is also caught here)
        x = torch.where(bracketed, x, torch.where(g_hi.abs() < g_lo.abs(), hi, lo))
        done = ~bracketed
    else:
        sign_lo = torch.full_like(x, -1.0 if increasing else 1.0)
        done = torch.zeros_like(x, dtype=torch.bool)
    rtol = max(rtol, 2 * torch.finfo(x.dtype).eps)  # else adjacent floats may alternate until max_iter
    # the convergence test reads a flag back from the device: on an accelerator only every 4th iteration (a finished
    # element no longer moves, so the extra iterations change nothing but their cost)
    check_every = 1 if x.device.type == "cpu" else 4
    for it in range(max_iter):
        if it % check_every == 0 and bool(done.all()):
            break
        g, slope = fn(x)
        beyond = g * sign_lo > 0  # g has its sign at lo: the root lies beyond x
        lo, hi = torch.where(beyond, x, lo), torch.where(beyond, hi, x)
        newton = x - g / slope
        inside = (newton > lo) & (newton < hi)  # False for nan and inf too
        new_x = torch.where(done | (g == 0), x, torch.where(inside, newton, (lo + hi) / 2))
        tol = atol + rtol * new_x.abs()
        done = done | ((new_x - x).abs() <= tol) | (hi - lo <= tol)
        x = new_x
    return x


def bounded_maximise(
    objective: Callable[[Tensor], Tensor],
    lo: float,
    hi: float,
    incumbent: Tensor,
    *,
    grid_points: int = 48,
    golden_steps: int = 45,
) -> Tensor:
    r"""Elementwise maximiser of a one-dimensional objective on :math:`[lo, hi]`: the best point of a uniform grid,
    refined by golden-section search between its neighbours; the ``incumbent`` where that is no better.

    ``objective`` maps points of shape ``(G, *incumbent.shape)`` to values of the same shape (a batch of independent
    scalar problems, one per element of ``incumbent``). The golden section keeps a bracket around the maximum with
    one evaluation per step, so the result is the maximiser to :math:`2\Delta\cdot 0.618^{\text{golden\_steps}}`
    (:math:`\Delta` the grid step) for an objective unimodal between the grid neighbours of its best point; the grid
    guards against other local maxima. Returning the incumbent where the search finds no higher value makes a
    coordinate step that uses it monotone.

    :param objective: :math:`x \mapsto F(x)`, vectorised.
    :param lo: lower end of the search interval.
    :param hi: upper end (``hi > lo``).
    :param incumbent: the current point of every problem.
    :returns: the maximisers, shape ``incumbent.shape``.
    """
    grid = torch.linspace(lo, hi, grid_points, dtype=incumbent.dtype, device=incumbent.device)
    grid = grid.view(-1, *([1] * incumbent.dim())).expand(-1, *incumbent.shape)
    centre = grid.gather(0, objective(grid).argmax(0, keepdim=True))
    step = (hi - lo) / (grid_points - 1)
    a, b = (centre - step).clamp_min(lo), (centre + step).clamp_max(hi)
    ratio = (math.sqrt(5.0) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = objective(c), objective(d)
    for _ in range(golden_steps):  # keep the bracket [a, b] around the maximum; one evaluation per step
        left = fc >= fd
        a, b = torch.where(left, a, c), torch.where(left, d, b)
        new = torch.where(left, b - ratio * (b - a), a + ratio * (b - a))
        f_new = objective(new)
        c, d, fc, fd = (
            torch.where(left, new, d),
            torch.where(left, c, new),
            torch.where(left, f_new, fd),
            torch.where(left, fc, f_new),
        )
    best = torch.where(fc >= fd, c, d)
    current = incumbent.unsqueeze(0)
    return torch.where(objective(best) >= objective(current), best, current)[0]


#: Abate--Whitt Euler inversion: the discretisation error is about :math:`e^{-A}` (relative to the function at
#: :math:`3t, 5t, \dots`), ``EULER_TERMS`` terms of the alternating series are summed and the last
#: ``EULER_AVERAGED`` partial sums are averaged with binomial weights (Euler summation). With :math:`A = 18.4`,
#: 15 and 11 (their choice) the error is ~1e-8 and the round-off :math:`e^{A/2}\epsilon\approx 10^{-12}`.
EULER_A = 18.4
EULER_TERMS = 15
EULER_AVERAGED = 11


@lru_cache(maxsize=8)
def _euler_weights(terms: int, averaged: int) -> tuple[np.ndarray, np.ndarray]:
    """The weight of each series term :math:`k = 0..n+m` in the binomially averaged partial sums, and the sign
    :math:`(-1)^k` folded in (term 0 halved)."""
    binomial = np.array([math.comb(averaged, j) for j in range(averaged + 1)], dtype=np.float64) / 2.0**averaged
    # term k enters the partial sums s_{n+j} for every j with n + j >= k
    weights = np.array([binomial[max(k - terms, 0):].sum() for k in range(terms + averaged + 1)])
    weights *= (-1.0) ** np.arange(terms + averaged + 1)
    weights[0] *= 0.5
    return weights, np.arange(terms + averaged + 1, dtype=np.float64)


def euler_inversion(
    transform: Callable[[Tensor], Tensor],
    t: Tensor,
    *,
    a: float = EULER_A,
    terms: int = EULER_TERMS,
    averaged: int = EULER_AVERAGED,
) -> Tensor:
    r"""The inverse Laplace transform :math:`g(t)` of :math:`\hat g(s) = \int_0^\infty e^{-st} g(t)\,dt`, at
    every point ``t > 0``, by the Euler algorithm of Abate and Whitt (1995, "Numerical inversion of Laplace
    transforms of probability distributions"):

    .. math::
        g(t) \approx \frac{e^{A/2}}{t}\sum_{j=0}^{m} \binom mj 2^{-m} s_{n+j}, \qquad
        s_n = \tfrac12\operatorname{Re}\hat g\big(\tfrac{A}{2t}\big)
        + \sum_{k=1}^{n} (-1)^k \operatorname{Re}\hat g\big(\tfrac{A + 2k\pi i}{2t}\big),

    the trapezoid rule on the Bromwich contour (discretisation error :math:`\sum_{k\ge1}e^{-kA}g((2k+1)t)`)
    followed by Euler summation of the alternating tail. For a CDF :math:`F` pass :math:`\hat g(s) = \varphi(s)/s`
    (:math:`\varphi` the transform of the law), for its density :math:`\hat g = \varphi`. The error is about
    :math:`e^{-A}` absolute for a CDF and, for a density, relative to its values at :math:`3t, 5t, \dots` (so
    small on a decreasing tail, larger deep in an increasing left tail).

    :param transform: :math:`s \mapsto \hat g(s)`, evaluated on complex ``s`` of shape ``(*t.shape, n + m + 1)``
        with :math:`\operatorname{Re} s > 0` (the analytic continuation, elementwise).
    :param t: points, float64 (any shape).
    :returns: :math:`g(t)`, shape of ``t``.

    Example::

        >>> import torch
        >>> from gpytorch_augment._numerics import euler_inversion
        >>> t = torch.tensor([0.5, 1.0, 3.0], dtype=torch.float64)
        >>> cdf = euler_inversion(lambda s: 1 / (s * (1 + s)), t)     # Exp(1): F(t) = 1 - exp(-t)
        >>> bool(torch.allclose(cdf, 1 - torch.exp(-t), atol=1e-8))
        True
    """
    weights, k = _euler_weights(int(terms), int(averaged))
    w = torch.as_tensor(weights, dtype=t.dtype, device=t.device)
    k = torch.as_tensor(k, dtype=t.dtype, device=t.device)
    tt = t.unsqueeze(-1)
    s = torch.complex(a / (2 * tt).expand(*t.shape, k.numel()), math.pi * k / tt)
    values = transform(s).real
    return math.exp(a / 2) / t * (w * values).sum(-1)
