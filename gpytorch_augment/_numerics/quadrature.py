r"""Integrals: Gauss--Hermite over :math:`\mathcal N(m, s)` and its predictive mixtures, discrete-mixture CDFs and
quantiles, the log-scale trapezoid, Frullani's :math:`E\log(1 + (y-f)^2/c)`, and expectations over independent Gaussian
latents (product rules, quasi-Monte Carlo)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.distributions import Categorical, Distribution, MixtureSameFamily

from .._validation import check_broadcasts


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


def gauss_hermite_expectation(
    value_and_grad: Callable[[Tensor], tuple[Tensor, Tensor]], mean: Tensor, var: Tensor, num_locs: int = 20
) -> Tensor:
    r""":math:`E_{\mathcal N(m, s)}\, g(f) \approx \sum_k w_k\, g(m + \sqrt{s}\,x_k)` elementwise, by
    :func:`gauss_hermite`'s rule, with its derivatives in :math:`m` and :math:`s` formed in the same pass from
    ``value_and_grad(f) = (g(f), g'(f))`` at the nodes:

    .. math::
        \frac{\partial}{\partial m} = \sum_k w_k\, g'(f_k),\qquad
        \frac{\partial}{\partial s} = \frac{1}{2\sqrt s} \sum_k w_k\, x_k\, g'(f_k)

    -- the derivatives of the rule itself, what autograd through :func:`gauss_hermite` gives, without keeping the
    ``num_locs`` copies of the data for a backward pass (the same singularity at :math:`s = 0`, and no gradient
    where :math:`s < 0`, which the rule reads as 0). Differentiable once, in ``mean`` and ``var`` only: ``g`` must
    hold no tensor that needs a gradient.

    Example::

        >>> import torch
        >>> from gpytorch_augment._numerics import gauss_hermite_expectation
        >>> m, s = torch.tensor([1.0], requires_grad=True), torch.tensor([4.0], requires_grad=True)
        >>> e = gauss_hermite_expectation(lambda f: (f**2, 2 * f), m, s, num_locs=10)   # E f^2 = m^2 + s
        >>> e.backward(); e.item(), m.grad.item(), s.grad.item()
        (5.0, 2.0, 1.0)
    """
    return _GaussHermiteExpectation.apply(mean, var, value_and_grad, num_locs)


class _GaussHermiteExpectation(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, mean: Tensor, var: Tensor, value_and_grad: Callable, num_locs: int) -> Tensor:
        x, w = _hermgauss_tensors(num_locs, mean.dtype, mean.device)
        shape = (num_locs,) + (1,) * mean.dim()
        x, w = x.view(shape), w.view(shape)
        sd = var.clamp_min(0).sqrt()
        value, grad = value_and_grad(mean + sd * x)
        d_var = (w * x * grad).sum(0).div_(2 * sd)
        ctx.save_for_backward((w * grad).sum(0), d_var.masked_fill_(var < 0, 0.0))
        return (w * value).sum(0)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        d_mean, d_var = ctx.saved_tensors
        return grad_output * d_mean, grad_output * d_var, None, None


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
#: mass left above the summed range below which a summed CDF counts as complete (the sum then stops)
_TAIL_MASS = 1e-15
#: doublings of the upper bracket of :func:`discrete_mixture_quantile` at most (2**1100 exceeds float64's range)
_MAX_DOUBLINGS = 1100


def _upper_bound(mixture: MixtureSameFamily) -> Tensor | None:
    """The largest value of the components' support (the binomial's trials), per datum; ``None`` if unbounded."""
    upper = getattr(mixture.component_distribution.support, "upper_bound", None)
    device = mixture.mixture_distribution.probs.device
    return None if upper is None else torch.as_tensor(upper, device=device)[..., 0]


def _regularized_beta(a: Tensor, b: Tensor, x: Tensor) -> Tensor:
    """The regularised incomplete beta function :math:`I_x(a, b)` (``scipy.special.betainc`` on the host, float64;
    torch has none), broadcast, on the device of ``x``."""
    from scipy.special import betainc

    a, b, x = torch.broadcast_tensors(a.double(), b.double(), x.double())
    out = betainc(a.detach().cpu().numpy(), b.detach().cpu().numpy(), x.detach().cpu().numpy())
    return torch.as_tensor(out, dtype=torch.float64, device=x.device)


def _component_cdf(component: Distribution, k: Tensor) -> Tensor | None:
    r""":math:`P(y \le k)` of each component in closed form (float64, ``k`` integral or infinite, broadcast against
    the components), for the Poisson (:math:`Q(k + 1, \lambda)`), negative binomial (:math:`I_{1-p}(r, k + 1)`) and
    binomial (:math:`I_{1-p}(n - k, k + 1)`) laws; ``None`` for any other law. The cost does not grow with ``k``."""
    from torch.distributions import Binomial, NegativeBinomial, Poisson

    if not isinstance(component, (Poisson, NegativeBinomial, Binomial)):
        return None
    k = k.double()
    below, beyond = k < 0, torch.isinf(k) & (k > 0)
    safe = torch.where(below | beyond, torch.zeros_like(k), k)
    if isinstance(component, Poisson):
        rate = component.rate.double()
        cdf = torch.special.gammaincc(safe + 1, rate.expand(torch.broadcast_shapes(rate.shape, k.shape)))
    else:
        q = torch.sigmoid(-component.logits.double())  # 1 - p, accurate for any logit
        if isinstance(component, NegativeBinomial):
            cdf = _regularized_beta(component.total_count.double().expand_as(q), safe + 1, q)
        else:
            n = component.total_count.double()
            beyond = beyond | (k >= n)
            cdf = _regularized_beta((n - safe).clamp_min(1.0), safe + 1, q)
    cdf = torch.where(beyond, torch.ones_like(cdf), cdf)
    return torch.where(below, torch.zeros_like(cdf), cdf)


def discrete_mixture_cdf(mixture: MixtureSameFamily, value: Tensor | float) -> Tensor:
    r""":math:`P(y \le \text{value})` of a mixture of distributions on :math:`\{0, 1, \dots\}` (float64; ``value``
    broadcasts against the data, e.g. a column ``(K, 1)`` gives ``(K, N)``; ``inf`` gives 1).

    Poisson, negative binomial and binomial components have closed-form CDFs (regularised incomplete gamma and beta
    functions), so the cost does not depend on ``value``. Any other law's mass function is summed from 0 up to
    ``value`` or until the mass left above is below ``1e-15``.

    :raises ValueError: if ``value`` does not broadcast against the data.
    """
    shape, device = mixture.batch_shape, mixture.mixture_distribution.probs.device
    value = torch.as_tensor(value, dtype=torch.float64, device=device).floor()
    shape = check_broadcasts("value", value, shape)
    value = value.expand(shape)
    weights = mixture.mixture_distribution.probs.double()
    closed = _component_cdf(mixture.component_distribution, value.unsqueeze(-1))
    if closed is not None:
        return (weights * closed).sum(-1).clamp(0.0, 1.0)
    batch = mixture.batch_shape
    extra = len(shape) - len(batch)  # leading dimensions of value beyond the data's, e.g. K of a column (K, 1)
    total = torch.zeros(shape, dtype=torch.float64, device=device)
    seen = torch.zeros(batch, dtype=torch.float64, device=device)
    top = float(value.max().item()) if value.numel() else -1.0
    upper = _upper_bound(mixture)
    start = 0
    while start <= top and not bool((seen >= 1 - _TAIL_MASS).all()):  # stop once no mass is left above
        grid = torch.arange(start, start + _CHUNK, dtype=torch.float64, device=device).reshape(-1, *[1] * len(batch))
        mass = _mass(mixture, grid, upper)
        seen = seen + mass.sum(0)
        mass = mass.reshape(mass.shape[0], *[1] * extra, *batch)
        total = total + (mass * (grid.reshape(-1, *[1] * len(shape)) <= value)).sum(0)
        start += _CHUNK
    return total.clamp(max=1.0)


def _mass(mixture: MixtureSameFamily, grid: Tensor, upper: Tensor | None) -> Tensor:
    """The mixture's probability mass at ``grid`` (``(G, *batch)``), 0 beyond the support's upper bound."""
    dtype = mixture.mixture_distribution.probs.dtype
    grid = grid.expand(grid.shape[0], *mixture.batch_shape)
    inside = torch.ones_like(grid, dtype=torch.bool) if upper is None else grid <= upper.to(grid)
    safe = grid if upper is None else torch.minimum(grid, upper.to(grid))
    return torch.where(inside, mixture.log_prob(safe.to(dtype)).double().exp(), 0.0)


def discrete_mixture_quantile(mixture: MixtureSameFamily, q: Tensor | float) -> Tensor:
    r"""The smallest integer :math:`k` with :math:`P(y \le k) \ge q`, per datum (``q`` broadcasts against the data,
    e.g. a column ``(K, 1)`` gives ``(K, N)``), by bisection of :func:`discrete_mixture_cdf` on the integers.

    The upper end of the bracket doubles from 1 until it holds the quantile, so the work grows with the logarithm
    of the quantile, not with the quantile; a binomial's quantile never exceeds its trials.

    :raises ValueError: if ``q`` does not broadcast against the data.
    """
    device = mixture.mixture_distribution.probs.device
    q = torch.as_tensor(q, dtype=torch.float64, device=device)
    shape = check_broadcasts("q", q, mixture.batch_shape)
    target = (q * (1 - 1e-12)).expand(shape)

    def reached(k: Tensor) -> Tensor:
        return ~(discrete_mixture_cdf(mixture, k) < target)  # a NaN cdf counts as reached: the search ends

    lo = torch.full(shape, -1.0, dtype=torch.float64, device=device)  # cdf(lo) < q
    hi = torch.zeros(shape, dtype=torch.float64, device=device)  # cdf(hi) >= q once bracketed
    upper = _upper_bound(mixture)
    if upper is not None:
        hi = torch.maximum(hi, upper.double().expand(shape))
    done = reached(hi)
    for _ in range(_MAX_DOUBLINGS):
        if bool(done.all()):
            break
        lo = torch.where(done, lo, hi)
        hi = torch.where(done, hi, (2 * hi).clamp_min(1.0))
        done = reached(hi)
    hi = torch.where(done, hi, torch.full_like(hi, math.inf))
    while True:
        mid = ((lo + hi) / 2).floor()
        open_ = (mid > lo) & (mid < hi)  # integers left between lo and hi (at float64 resolution)
        if not bool(open_.any()):
            return hi
        up = reached(mid)
        hi = torch.where(open_ & up, mid, hi)
        lo = torch.where(open_ & ~up, mid, lo)


#: nodes of :func:`log_trapezoid` (step <= 0.25 on the widest range it is used on; error ~ exp(-pi^2 / step))
LOG_GRID_NODES = 400
#: nats of exponential decay of an integrand left out at each end of a log-scale range
LOG_GRID_TAIL = 45.0
#: the trapezoid step of :func:`expected_log1p_square` (relative error ~ exp(-pi^2 / step) ~ 1e-13)
LOG1P_SQUARE_STEP = 0.35


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
    r""":math:`E_{\mathcal N(f\mid m, s)}\log(1 + (y-f)^2/c)` for ``d2`` :math:`=(y-m)^2` and ``var`` :math:`=s`
    (broadcast together), differentiable in all three.

    Frullani's integral and the Gaussian expectation :math:`L(t) = (1 + 2ts/c)^{-1/2} e^{-t d^2/(c + 2ts)}` of
    :math:`e^{-t(y-f)^2/c}` give

    .. math::
        E\log\Big(1 + \frac{(y-f)^2}{c}\Big) = \int_0^\infty\big[1 - L(t)\big]\,\frac{e^{-t}}t\,dt ,
        \qquad
        \frac{\partial E}{\partial d^2} = A = \int_0^\infty \frac{L(t)\,e^{-t}}{c + 2ts}\,dt ,
        \qquad
        \frac{\partial E}{\partial s} = A - 2B, \quad B = \int_0^\infty \frac{L(t)\,e^{-t}\,t\,d^2}{(c + 2ts)^2}\,dt ,

    and :math:`\partial E/\partial c = -(d^2 A + s(A - 2B))/c` (:math:`E` depends on :math:`d^2/c` and
    :math:`s/c` only). All three integrals are taken by :func:`log_trapezoid` in :math:`\log t` on one grid, so the
    gradient costs no autograd graph: accurate for any :math:`c/s`, where Gauss--Hermite over :math:`f` is off by
    tenths of a nat once :math:`\sqrt c \ll \sqrt s`. The integrands are analytic in the strip
    :math:`|\operatorname{Im}\log t| < \pi/2`, so the rule's relative error is about :math:`e^{-\pi^2/h}` at step
    :math:`h`; the number of nodes is set from the widest range in the batch so that :math:`h \le`
    :data:`LOG1P_SQUARE_STEP`.

    Example::

        >>> import torch
        >>> from gpytorch_augment._numerics import expected_log1p_square
        >>> d2, var, c = torch.tensor([1.0]), torch.tensor([1e-12]), torch.tensor([3.0])
        >>> expected_log1p_square(d2, var, c)     # s -> 0: log(1 + d^2 / c)
        tensor([0.2877])
    """
    d2, var, c = torch.broadcast_tensors(d2, var, c)
    if torch.is_grad_enabled() and any(v.requires_grad for v in (d2, var, c)):
        return _ExpectedLog1pSquare.apply(d2, var, c)
    return _log1p_square_integrals(d2, var, c, gradient=False)[0]


def _log1p_square_integrals(d2: Tensor, var: Tensor, c: Tensor, gradient: bool) -> list[Tensor]:
    """:math:`E` and, with ``gradient``, :math:`A` and :math:`B` of :func:`expected_log1p_square` (no graph)."""
    hi = torch.full_like(d2, math.log(LOG_GRID_TAIL))
    lo = torch.log(c / (c + var + d2)) - LOG_GRID_TAIL
    widest = float((hi - lo).max()) if lo.numel() else 0.0
    num = max(math.ceil(widest / LOG1P_SQUARE_STEP), 1) + 1 if math.isfinite(widest) else LOG_GRID_NODES

    def log_integrands(u: Tensor) -> Tensor:  # in u = log t, with the Jacobian t; stacked along dim 1
        t = u.exp()
        log_denominator = torch.log(c + 2 * t * var)
        log_laplace = -0.5 * torch.log1p(2 * t * var / c) - t * d2 / (c + 2 * t * var)
        value = torch.log(-torch.expm1(log_laplace)) - t
        if not gradient:
            return value.unsqueeze(1)
        a = log_laplace - t + u - log_denominator
        b = log_laplace - t + 2 * u + d2.log() - 2 * log_denominator
        return torch.stack([value, a, b], dim=1)

    with torch.no_grad():
        return list(log_trapezoid(log_integrands, lo, hi, num).exp().unbind(0))


class _ExpectedLog1pSquare(torch.autograd.Function):
    """:func:`expected_log1p_square` with its gradient from the same quadrature."""

    @staticmethod
    def forward(ctx: Any, d2: Tensor, var: Tensor, c: Tensor) -> Tensor:
        value, a, b = _log1p_square_integrals(d2, var, c, gradient=True)
        ctx.save_for_backward(d2, var, c, a, b)
        return value

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        d2, var, c, a, b = ctx.saved_tensors
        d_var = a - 2 * b
        return grad * a, grad * d_var, -grad * (d2 * a + var * d_var) / c


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
        if ratios:
            inv = weights / total
            cols = [(inv * view).sum(grid_axes) for view in views]
            if offset is not None:
                cols.append(inv.sum(grid_axes) * (log_b - shift).exp())
            part = torch.stack(cols, -1)
        else:
            part = (weights * total.log()).sum(grid_axes) + shift
        # every term is at most 1 after the shift, so the only failure is a total that underflows to 0 somewhere,
        # which makes the row's result infinite or NaN: checked on the B results, not on the n^J B grid points
        if bool(torch.isfinite(part).all()):
            parts.append(part)
        else:  # a grid spread wider than the dtype's range: the log-domain sum (slower, exact in range)
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
    return torch.cat(parts, 0)


# ------------------------------------------------------------------------------------- kinked integrands
#: standard deviations of N(m, s) beyond which a split rule ignores the mass (Phi(-9) < 1e-18)
SPLIT_RULE_REACH = 9.0
#: panel edges of :func:`split_gauss_legendre`, in standard deviations from the kink: graded geometrically next to
#: it, then at most 1.5 wide (a Gaussian factor needs a fixed resolution wherever the mass lies)
SPLIT_RULE_EDGES = (0.0, 4.0**-5, 4.0**-4, 4.0**-3, 4.0**-2, 0.25, 1.0, 2.0, 3.0) + tuple(
    3.0 + 1.5 * k for k in range(1, 11)
)
#: Gauss--Legendre nodes per panel in :func:`split_gauss_legendre`
SPLIT_RULE_NODES = 8


@lru_cache(maxsize=16)
def _graded_legendre(edges: tuple[float, ...], num_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standard Gauss--Legendre nodes and weights on (-1, 1) and the panel edges as arrays."""
    x, w = np.polynomial.legendre.leggauss(num_nodes)
    return x, w, np.asarray(edges)


def split_gauss_legendre(
    mean: Tensor,
    var: Tensor,
    edges: tuple[float, ...] = SPLIT_RULE_EDGES,
    num_nodes: int = SPLIT_RULE_NODES,
) -> tuple[Tensor, Tensor]:
    r"""Nodes ``x`` and weights, shape ``(2 P n, *mean.shape)`` (``P`` panels of ``n`` nodes per side), with
    :math:`E_{x\sim\mathcal N(m, s)} h(x) \approx \sum_k w_k h(x_k)` for an ``h`` that is smooth on each side of 0 but
    not across it (a kink such as :math:`|x|`).

    Each side of 0 is integrated separately in the standardised variable :math:`z = (x - m)/\sqrt s`, from the kink
    :math:`z_0 = -m/\sqrt s` outwards, by Gauss--Legendre panels whose edges are ``edges`` (standard deviations from
    the kink): graded geometrically next to the kink, so that a singularity of ``h``'s continuation just beyond it
    (e.g. of :math:`\log(1 + a|x|)` at :math:`x = \mp 1/a`) costs accuracy only in the narrow panels there, then of
    a fixed width for the Gaussian factor. Panels are clipped to :math:`|z| \le 9` (:data:`SPLIT_RULE_REACH`; the
    mass beyond is below :math:`10^{-18}`), and the kink to that range. No node lies on the kink. Differentiable in
    ``mean`` and ``var`` (the integrand's value at the moving kink does not enter). ``var`` is clamped at the
    smallest positive number of its dtype.

    Example::

        >>> import torch
        >>> from gpytorch_augment._numerics import split_gauss_legendre
        >>> m, s = torch.tensor([0.5], dtype=torch.float64), torch.tensor([2.0], dtype=torch.float64)
        >>> x, w = split_gauss_legendre(m, s)
        >>> round(float((w * x.abs()).sum(0)), 12)   # E|x| = sqrt(2 s / pi) e^{-m^2/2s} + m erf(m / sqrt(2 s))
        1.19817732446
    """
    x, w, e = (torch.as_tensor(a, dtype=mean.dtype, device=mean.device) for a in _graded_legendre(edges, num_nodes))
    sd = var.clamp_min(torch.finfo(mean.dtype).tiny).sqrt()
    kink = (-mean / sd).clamp(-SPLIT_RULE_REACH, SPLIT_RULE_REACH)
    shape = (-1,) + (1,) * mean.dim()
    e = e.view(shape)
    sides = []
    for sign in (1.0, -1.0):  # x > 0: z above the kink; x < 0: below
        room = SPLIT_RULE_REACH - sign * kink  # distance from the kink to the reach on this side
        edge = torch.minimum(e, room)
        lo, hi = edge[:-1], edge[1:]  # (P, *batch)
        half = (hi - lo) / 2
        offset = (lo + half).unsqueeze(1) + half.unsqueeze(1) * x.view((1, -1) + (1,) * mean.dim())
        z = kink + sign * offset.flatten(0, 1)
        weight = (half.unsqueeze(1) * w.view((1, -1) + (1,) * mean.dim())).flatten(0, 1)
        sides.append((z, weight))
    z = torch.cat([sides[0][0], sides[1][0]])
    weight = torch.cat([sides[0][1], sides[1][1]])
    return mean + sd * z, weight * torch.exp(-z * z / 2) / math.sqrt(2 * math.pi)
