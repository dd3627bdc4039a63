r"""Numerical building blocks shared by every likelihood and engine.

Everything that needs care in floating point lives here, once:

* :func:`log_cosh` -- :math:`\log\cosh x` without overflow;
* :func:`pg_mean`, :func:`pg_variance`, :func:`pg_kl` -- moments of the Pólya-Gamma
  distribution :math:`\mathrm{PG}(b, c)` and :math:`\mathrm{KL}(\mathrm{PG}(b,c)\,\Vert\,\mathrm{PG}(b,0))`,
  stable (value *and* gradient) as :math:`c \to 0`;
* :func:`log_sigma_tilde_plus` -- :math:`\log\tilde\sigma^+(m, c) = m/2 - \log 2 - \log\cosh(c/2)`;
* :func:`log_sigma_tilde` -- :math:`\log\tilde\sigma(m, c) = \log\tilde\sigma^+(-m, c)`;
* :func:`gauss_hermite` -- Gauss--Hermite nodes for :math:`E_{\mathcal N(m, s)} g(f)`, and
  :func:`quadrature_mixture`, the predictive :math:`\sum_k w_k p(y\mid f_k)` as a distribution;
* :func:`reverse_cholesky` -- the lower factor :math:`C` with :math:`B = C^\top C`;
* :func:`safeguarded_newton` -- elementwise roots of a scalar equation in a bracket (Newton, falling back to
  bisection), for the 1-D closed-form hyper-parameter updates.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor
from torch.distributions import Categorical, Distribution, MixtureSameFamily

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
    r""":math:`\mathrm{KL}(\mathrm{PG}(b,c)\Vert\mathrm{PG}(b,0)) = b[\log\cosh\frac c2 - \frac{c^2}{2}\mathrm{PGm}(1,c)]`."""
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
    (``augmentations.md`` §2.9): the factor :math:`e^{-m/2}/(2\cosh\frac c2) \in (0, 1)` an optimal Poisson or
    negative-binomial :math:`q` produces; a lower bound on :math:`E\log\sigma(-f)` for :math:`c = \sqrt{m^2+s}`."""
    return log_sigma_tilde_plus(-m, c)


@lru_cache(maxsize=16)
def _hermgauss(n: int) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.hermite.hermgauss(n)
    return x * math.sqrt(2.0), w / math.sqrt(math.pi)


def gauss_hermite(mean: Tensor, var: Tensor, num_locs: int = 20) -> tuple[Tensor, Tensor]:
    r"""Nodes ``f`` of shape ``(num_locs, *mean.shape)`` and weights of shape ``(num_locs, 1, ..)`` such
    that :math:`E_{\mathcal N(m, s)} g(f) \approx \sum_k w_k\, g(f_k)`."""
    x, w = _hermgauss(num_locs)
    shape = (num_locs,) + (1,) * mean.dim()
    x = torch.as_tensor(x, dtype=mean.dtype, device=mean.device).view(shape)
    w = torch.as_tensor(w, dtype=mean.dtype, device=mean.device).view(shape)
    return mean + var.clamp_min(0).sqrt() * x, w


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
    return MixtureSameFamily(Categorical(probs=w), component(f))


def reverse_cholesky(B: Tensor) -> Tensor:
    r"""Lower-triangular :math:`C` with :math:`B = C^\top C`, so that :math:`\mathrm{chol}(B^{-1}) = C^{-1}`.

    Computed as :math:`C = \mathrm{flip}(\mathrm{chol}(\mathrm{flip}(B)))^\top` where ``flip`` reverses both axes.
    """
    from linear_operator.utils.cholesky import psd_safe_cholesky

    flipped = B.flip(-1, -2)
    return psd_safe_cholesky(flipped).flip(-1, -2).mT


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
    reversed_brackets = int((hi < lo).sum())
    if reversed_brackets:
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
    for _ in range(max_iter):
        if bool(done.all()):
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
