r"""A torch-native Pólya-Gamma sampler: draws :math:`\mathrm{PG}(b, c)` on the device of its generator (or of the
parameters), without a host round trip, reproducibly from a ``torch.Generator``.

**PG(1, c): Devroye's exact method** (Polson, Scott & Windle 2013, §4 and Algorithm 1). With :math:`z = |c|/2`,
:math:`\mathrm{PG}(1, c) \overset{d}{=} J^*(1, z)/4`, whose density is the alternating series

.. math::
    f(x \mid z) = \cosh(z)\, e^{-z^2 x/2} \sum_{n\ge0} (-1)^n a_n(x),\qquad
    a_n(x) = \begin{cases} \pi(n+\frac12)\,(\frac{2}{\pi x})^{3/2} e^{-2(n+\frac12)^2/x}, & x \le t,\\
    \pi(n+\frac12)\, e^{-(n+\frac12)^2\pi^2 x/2}, & x > t,\end{cases}

with :math:`t = 0.64`. The proposal :math:`g(x) \propto \cosh(z) e^{-z^2x/2} a_0(x)` is a mixture of an inverse
Gaussian :math:`\mathrm{IG}(1/z, 1)` truncated to :math:`(0, t]` and an exponential
:math:`t + \mathrm{Exp}(\pi^2/8 + z^2/2)` on :math:`(t, \infty)`, with the exponential's probability
:math:`p/(p+q)`, :math:`p = \frac{\pi}{2K} e^{-Kt}`, :math:`K = \frac{\pi^2}{8} + \frac{z^2}{2}`,
:math:`q = 2e^{-z}\,\Pr[\mathrm{IG}(1/z, 1) \le t]` (computed in logs, stable for all :math:`z`). A proposal
:math:`x` with :math:`V \sim U(0,1)` is accepted at the first odd :math:`n` with
:math:`V \le S_n = \sum_{k \le n} (-1)^k a_k(x)/a_0(x)` and rejected at the first even :math:`n` with
:math:`V > S_n`: the partial sums bracket the density ratio, so the method is exact. At most about 1.0008
proposals are needed per draw, and the decision almost always falls at :math:`n = 1`.

*Vectorisation*: every entry draws a proposal from both components (whichever it picks is used), the series is
evaluated for a block of terms at once (ratios :math:`a_n/a_0`, so nothing underflows), and only rejected entries
are drawn again; the loops run over rounds of rejection (a few), not over entries.

**PG(b, c)**, by :func:`sample_polya_gamma`:

* integer :math:`b \le` :data:`SUM_MAX` (16): the sum of :math:`b` independent :math:`\mathrm{PG}(1, c)` draws —
  **exact**;
* non-integer :math:`b \le` :data:`SUM_MAX`: the sum of :math:`\lfloor b\rfloor` exact draws and one
  :math:`\mathrm{PG}(b - \lfloor b\rfloor, c)` by the gamma series below;
* :math:`b >` :data:`SUM_MAX`: the gamma series for the whole :math:`b`;
* :math:`b = 0`: the point mass at 0.

The *gamma series* is
:math:`\mathrm{PG}(b, c) \overset{d}{=} \sum_k w_k g_k`, :math:`g_k \sim \mathrm{Ga}(b, 1)`,
:math:`w_k = [2\pi^2((k-\frac12)^2 + c^2/(4\pi^2))]^{-1}`: its first :data:`GAMMA_TERMS` terms are drawn exactly
and the tail by one gamma variable with the tail's exact mean and variance, so the **mean and variance are exact**
and only the tail's higher cumulants are approximated (for 10 terms the tail carries ~:math:`2\times10^{-5}` of the
variance at :math:`c = 0`). The fractional part's share of the whole is :math:`(b - \lfloor b\rfloor)/b`; for
large :math:`b` the law is close to normal and the approximation error is far below Monte Carlo resolution.

All arithmetic is float64 (on CUDA too), whatever the parameters' dtype; the draws are cast back.

Example::

    >>> import torch
    >>> from gpytorch_augment.distributions.polya_gamma_torch import sample_polya_gamma
    >>> g = torch.Generator().manual_seed(0)
    >>> b, c = torch.full((20000,), 1.0), torch.full((20000,), 2.0)
    >>> omega = sample_polya_gamma(b, c, generator=g)
    >>> round(float(omega.mean()), 2), round(float(torch.tanh(torch.tensor(1.0)) / 4), 2)   # mean tanh(c/2)/(2c)
    (0.19, 0.19)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._numerics import pg_mean, pg_variance
from .._random import draw_device

__all__ = ["GAMMA_TERMS", "SUM_MAX", "gamma_series_terms", "sample_pg1", "sample_polya_gamma"]

#: integer ``b`` up to this are drawn exactly, as sums of ``b`` PG(1, c) draws; larger ``b`` by the gamma series
SUM_MAX = 16
#: exact gamma terms of the gamma series (the rest by one moment-matched gamma)
GAMMA_TERMS = 10
#: tilts |c| above this (2^107) draw PG(1, c) as its mean 1/(2|c|): the law's relative standard deviation
#: sqrt(2/|c|) is then below float64's half-ulp 2^-53
POINT_MASS_TILT = 2.0**107

_T = 0.64  # Devroye's switch point between the two representations of a_n
_PI2 = math.pi**2
_LOG_4_OVER_PI = math.log(4.0 / math.pi)
#: series terms evaluated per block (the decision almost always falls at the first)
_TERMS_PER_BLOCK = 4
#: after this many blocks an undecided entry (its partial sums equal to rounding) is accepted iff V <= S_n
_MAX_BLOCKS = 16
#: candidates per pending entry and round of the truncated inverse Gaussian
_CANDIDATES = 4
#: rounds of rejection before giving up (the acceptance rate is > 0.99: 64 rounds never run out)
_MAX_ROUNDS = 64


def _check(b: Tensor, c: Tensor) -> None:
    if not bool((torch.isfinite(b) & (b >= 0)).all()):
        raise ValueError("sample_polya_gamma: b must be finite and >= 0")
    if not bool(torch.isfinite(c).all()):
        raise ValueError("sample_polya_gamma: c must be finite")


def _uniform(shape: int | tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
    """Uniforms on (0, 1] (never 0, so that logs are finite)."""
    u = torch.rand(shape, generator=generator, dtype=torch.float64, device=device)
    return 1.0 - u


def _exponential(shape: int | tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
    return -torch.log(_uniform(shape, generator, device))


def _truncated_inverse_gaussian(z: Tensor, generator: torch.Generator | None) -> Tensor:
    r"""Draws of :math:`\mathrm{IG}(\mu = 1/z, \lambda = 1)` truncated to :math:`(0, t]`, one per entry of ``z``.

    For :math:`\mu > t` (:math:`z < 1/t`): :math:`X = t/(1 + tE)^2` with :math:`E` from the exponential rejection
    :math:`E^2 \le 2E'/t` (a draw of the Lévy law :math:`1/\chi^2_1` truncated to :math:`(0, t]`), accepted with
    probability :math:`e^{-z^2X/2}`. For :math:`\mu \le t`: untruncated draws (Michael, Schucany & Haas 1976, in
    the cancellation-free form :math:`\mu/(1 + w + \sqrt{w^2 + 2w})`, :math:`w = \mu\chi^2_1/2`) until one is
    :math:`\le t`. Each round draws :data:`_CANDIDATES` candidates per pending entry and keeps the first accepted
    one (each is accepted with probability above about 0.6), so few rounds are needed.
    """
    device = z.device
    out = torch.empty_like(z)
    idx = torch.arange(z.numel(), device=device)
    for _ in range(_MAX_ROUNDS):
        n = idx.numel()
        if n == 0:
            return out
        zz = z[idx].unsqueeze(-1)
        levy = zz < 1.0 / _T
        shape = (n, _CANDIDATES)
        # branch mu > t: Lévy proposal, then the tilt
        e1, e2 = _exponential(shape, generator, device), _exponential(shape, generator, device)
        x_levy = _T / (1.0 + _T * e1) ** 2
        tilt = torch.exp(-0.5 * zz * zz * x_levy)
        ok_levy = (e1 * e1 <= 2.0 * e2 / _T) & (_uniform(shape, generator, device) <= tilt)
        # branch mu <= t: inverse Gaussian, kept when <= t
        mu = 1.0 / torch.where(levy, torch.ones_like(zz), zz)
        w = 0.5 * mu * torch.randn(shape, generator=generator, dtype=torch.float64, device=device) ** 2
        x1 = mu / (1.0 + w + torch.sqrt(w * w + 2.0 * w))
        x_ig = torch.where(_uniform(shape, generator, device) * (mu + x1) <= mu, x1, mu * mu / x1)
        x = torch.where(levy, x_levy, x_ig)
        ok = torch.where(levy, ok_levy, x_ig <= _T)
        first = torch.argmax(ok.to(torch.uint8), -1, keepdim=True)
        done = ok.any(-1)
        out[idx[done]] = x.gather(-1, first).squeeze(-1)[done]
        idx = idx[~done]
    raise RuntimeError("truncated inverse Gaussian: no acceptance in many rounds (cannot happen for finite z)")


def _log_q_over_p(z: Tensor) -> Tensor:
    r""":math:`\log(q/p)` of the mixture weights, :math:`q/p = \frac{4K}{\pi} e^{Kt}[e^{-z}\Phi(\frac{tz-1}{\sqrt t})
    + e^{z}\Phi(-\frac{tz+1}{\sqrt t})]`."""
    k = _PI2 / 8 + 0.5 * z * z
    root = math.sqrt(_T)
    bracket = torch.logaddexp(
        -z + torch.special.log_ndtr((_T * z - 1.0) / root), z + torch.special.log_ndtr(-(_T * z + 1.0) / root)
    )
    return _LOG_4_OVER_PI + torch.log(k) + k * _T + bracket


def _series_accepts(x: Tensor, v: Tensor) -> Tensor:
    r"""Whether :math:`V \le \sum_n (-1)^n a_n(x)/a_0(x)`, decided by the alternating partial sums (exactly, but for
    ties to rounding after :data:`_MAX_BLOCKS` blocks)."""
    left = x <= _T
    # log(a_n / a_0) = log(2n+1) - 2n(n+1)/x (x <= t)  or  - pi^2 x n(n+1)/2 (x > t)
    rate = torch.where(left, 2.0 / x, 0.5 * _PI2 * x)
    s = torch.ones_like(x)
    accept = torch.zeros_like(x, dtype=torch.bool)
    undecided = torch.ones_like(x, dtype=torch.bool)
    for block in range(_MAX_BLOCKS):
        first = 1 + block * _TERMS_PER_BLOCK
        n = torch.arange(first, first + _TERMS_PER_BLOCK, dtype=torch.float64, device=x.device)
        terms = torch.log(2 * n + 1) - rate.unsqueeze(-1) * (n * (n + 1))
        signed = torch.where(n.remainder(2) == 1, -1.0, 1.0) * torch.exp(terms)
        partial = s.unsqueeze(-1) + signed.cumsum(-1)
        odd = n.remainder(2) == 1
        hits = torch.where(odd, v.unsqueeze(-1) <= partial, v.unsqueeze(-1) > partial)
        decided = hits.any(-1)
        first_hit = torch.argmax(hits.to(torch.uint8), -1)
        newly = undecided & decided
        accept = accept | (newly & odd[first_hit])
        undecided = undecided & ~decided
        s = partial[..., -1]
        if not bool(undecided.any()):
            return accept
    return accept | (undecided & (v <= s))


def sample_pg1(c: Tensor, generator: torch.Generator | None = None) -> Tensor:
    r"""Exact draws of :math:`\mathrm{PG}(1, c_i)` by Devroye's method (see the module's docstring), one per entry.

    :param c: tilts (any shape and dtype; the law depends on :math:`|c|`); for :math:`|c| >`
        :data:`POINT_MASS_TILT` the draw is the mean :math:`1/(2|c|)` (the spread is below float64 resolution).
    :param generator: ``torch.Generator`` for the draws; the work runs on its device (``c``'s if ``None``, then
        from torch's global RNG of that device) and the draws are returned on ``c``'s device, in ``c``'s dtype if
        it is floating and torch's default dtype otherwise.
    :returns: a tensor shaped like ``c``.

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions.polya_gamma_torch import sample_pg1
        >>> draws = sample_pg1(torch.zeros(50000), generator=torch.Generator().manual_seed(1))
        >>> abs(float(draws.mean()) - 0.25) < 0.005                               # PG(1, 0) has mean 1/4
        True
    """
    if not bool(torch.isfinite(c).all()):
        raise ValueError("sample_pg1: c must be finite")
    dtype = c.dtype if c.is_floating_point() else torch.get_default_dtype()
    device = draw_device(generator, c.device)
    z = 0.5 * c.detach().to(device=device, dtype=torch.float64).abs().reshape(-1)
    out = torch.empty_like(z)
    # beyond POINT_MASS_TILT the law's relative spread sqrt(2/c) is below float64 resolution: the draw is its mean
    # 1/(2c), i.e. 4 * mean = 1/z here (the rejection sampler's z^2 would overflow from c ~ 1e154)
    point = z > POINT_MASS_TILT / 2
    out[point] = 1.0 / z[point]
    idx = (~point).nonzero().squeeze(-1)
    z = torch.where(point, torch.zeros_like(z), z)
    prob_exp = torch.sigmoid(-_log_q_over_p(z))
    k = _PI2 / 8 + 0.5 * z * z
    for _ in range(_MAX_ROUNDS):
        n = idx.numel()
        if n == 0:
            return (0.25 * out).reshape(c.shape).to(device=c.device, dtype=dtype)
        use_exp = _uniform(n, generator, device) <= prob_exp[idx]
        x = _T + _exponential(n, generator, device) / k[idx]
        left = (~use_exp).nonzero().squeeze(-1)
        x[left] = _truncated_inverse_gaussian(z[idx[left]], generator)
        ok = _series_accepts(x, _uniform(n, generator, device))
        out[idx[ok]] = x[ok]
        idx = idx[~ok]
    raise RuntimeError("sample_pg1: no acceptance in many rounds (cannot happen for finite c)")


def _gamma(shape: Tensor, generator: torch.Generator | None) -> Tensor:
    """Standard gamma draws with the given shapes (> 0) from ``generator``."""
    return torch._standard_gamma(shape, generator=generator)


def gamma_series_terms(c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""The gamma series' weights :math:`w_k`, :math:`k \le` :data:`GAMMA_TERMS`, and its tail's moments per unit
    :math:`b`, :math:`S_1 = \sum_{k>K} w_k` and :math:`S_2 = \sum_{k>K} w_k^2` (from the exact totals
    :math:`E\,\mathrm{PG}(1, c)` and :math:`\mathrm{Var}\,\mathrm{PG}(1, c)`), for flat float64 ``c``.

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions.polya_gamma_torch import gamma_series_terms
        >>> w, s1, s2 = gamma_series_terms(torch.zeros(1, dtype=torch.float64))
        >>> round(float(w.sum() + s1), 6)                                     # E PG(1, 0) = 1/4
        0.25
    """
    k = torch.arange(1, GAMMA_TERMS + 1, dtype=torch.float64, device=c.device) - 0.5
    w = 1.0 / (2 * _PI2 * (k * k + (c.unsqueeze(-1) / (2 * math.pi)) ** 2))
    one = torch.ones_like(c)
    s1 = (pg_mean(one, c) - w.sum(-1)).clamp(min=torch.finfo(torch.float64).tiny)
    s2 = (pg_variance(one, c) - (w * w).sum(-1)).clamp(min=1e-300)
    return w, s1, s2


def _gamma_series(b: Tensor, c: Tensor, generator: torch.Generator | None) -> Tensor:
    r"""The gamma series of :math:`\mathrm{PG}(b_i, c_i)` (flat float64, ``b > 0``): :data:`GAMMA_TERMS` exact terms and
    a moment-matched gamma tail (mean and variance exact)."""
    w, s1, s2 = gamma_series_terms(c)
    head = (_gamma(b.unsqueeze(-1).expand(w.shape).contiguous(), generator) * w).sum(-1)
    return head + _gamma(b * s1 * s1 / s2, generator) * (s2 / s1)


def sample_polya_gamma(b: Tensor, c: Tensor, generator: torch.Generator | None = None) -> Tensor:
    r"""Draws of :math:`\mathrm{PG}(b_i, c_i)` in torch, on the generator's device (exact for integer
    :math:`b \le` :data:`SUM_MAX`; see the module's docstring for the routing and the approximation elsewhere).

    :param b: shapes :math:`b \ge 0` (finite); broadcast against ``c``.
    :param c: tilts (finite).
    :param generator: ``torch.Generator``; the work runs on its device (``c``'s device and torch's global RNG there
        if ``None``). A CPU generator thus works with CUDA parameters (the draws are moved).
    :returns: the draws, with the broadcast shape, on ``c``'s device, in the parameters' floating dtype.
    :raises ValueError: if ``b`` is negative or not finite, or ``c`` is not finite.

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions.polya_gamma_torch import sample_polya_gamma
        >>> b = torch.tensor([0.0, 1.0, 3.0, 2.5]).repeat(5000, 1)
        >>> omega = sample_polya_gamma(b, torch.zeros(4), generator=torch.Generator().manual_seed(0))
        >>> [round(v, 2) for v in omega.mean(0).tolist()]                           # b / 4 at c = 0
        [0.0, 0.25, 0.75, 0.62]
    """
    floats = [t.dtype for t in (c, b) if t.is_floating_point()]
    dtype = floats[0] if floats else torch.get_default_dtype()
    b, c = torch.broadcast_tensors(b.detach(), c.detach())
    _check(b, c)
    out_device = c.device
    device = draw_device(generator, out_device)
    shape = b.shape
    b = b.to(device=device, dtype=torch.float64).reshape(-1)
    c = c.to(device=device, dtype=torch.float64).abs().reshape(-1)
    out = torch.zeros_like(b)
    whole = torch.floor(b)
    summed = (whole >= 1) & (b <= SUM_MAX)
    counts = torch.where(summed, whole, torch.zeros_like(whole)).to(torch.long)
    total = int(counts.sum())
    if total:
        owner = torch.repeat_interleave(torch.arange(b.numel(), device=device), counts, output_size=total)
        out.index_add_(0, owner, sample_pg1(c[owner], generator))
    fraction = torch.where(b > SUM_MAX, b, b - torch.where(summed, whole, torch.zeros_like(whole)))
    # the gamma series' squared weights overflow for huge tilts; PG(b, c) is there a point mass at its mean
    # b / (2c) to float64 resolution (relative standard deviation sqrt(2 / (b c)))
    point = (fraction > 0) & (fraction * c > POINT_MASS_TILT)
    out[point] += fraction[point] / (2 * c[point])
    series = (fraction > 0) & ~point
    if bool(series.any()):
        where = series.nonzero().squeeze(-1)
        out[where] += _gamma_series(fraction[where], c[where], generator)
    return out.reshape(shape).to(device=out_device, dtype=dtype)
