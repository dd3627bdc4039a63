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
  :math:`\mathrm{PG}(b - \lfloor b\rfloor, c)` by inversion of its exact CDF (:func:`polya_gamma_icdf`) at a
  uniform — **exact** (to a few ulps, the root finder's tolerance);
* :math:`b >` :data:`SUM_MAX`: the gamma series below for the whole :math:`b`;
* :math:`b = 0`: the point mass at 0.

The *inversion* evaluates the alternating series of the CDF in logs, with the tilt's large exponents cancelled
analytically, and solves :math:`F(x) = u` for :math:`\log x` by safeguarded Newton steps
(:func:`polya_gamma_icdf`). It replaced the gamma series for fractional parts, which has the right mean and
variance but the wrong law for small :math:`b`: its moment-matched tail puts mass
:math:`\propto x^{\approx 30b}` near 0, where the law has :math:`F(x) \approx e^{-b^2/(8x)}` (Kolmogorov-Smirnov
distance to the exact CDF 0.45 at :math:`b = 0.003`, 0.18 at 0.01, 0.04 at 0.03, 0.019 at 0.05, 0.008 at 0.07 and
about 0.003 at 0.1, for any tilt up to 20).

The *gamma series* is
:math:`\mathrm{PG}(b, c) \overset{d}{=} \sum_k w_k g_k`, :math:`g_k \sim \mathrm{Ga}(b, 1)`,
:math:`w_k = [2\pi^2((k-\frac12)^2 + c^2/(4\pi^2))]^{-1}`: its first :data:`GAMMA_TERMS` terms are drawn exactly
and the tail by one gamma variable with the tail's exact mean and variance, so the **mean and variance are exact**
and only the tail's higher cumulants are approximated (for 10 terms the tail carries ~:math:`2\times10^{-5}` of the
variance at :math:`c = 0`). It is used only for :math:`b >` :data:`SUM_MAX`, where the law is close to normal and
the approximation error is far below Monte Carlo resolution.

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

__all__ = ["GAMMA_TERMS", "SUM_MAX", "gamma_series_terms", "polya_gamma_icdf", "sample_pg1", "sample_polya_gamma"]

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


def _open_uniform(shape: int | tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
    """Uniforms on (0, 1), at least 2^-54 from either end (for the inversion, whose brackets leave out e^-38)."""
    u = torch.rand(shape, generator=generator, dtype=torch.float64, device=device) + 2.0**-54
    return u.clamp(2.0**-54, 1.0 - 2.0**-54)


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


#: the inversion's log-space brackets leave this many nats of probability outside: :math:`F(x_{lo})` and
#: :math:`1 - F(x_{hi})` are below :math:`e^{-38} < 2^{-54}`, under the smallest uniform drawn (:math:`2^{-53}`)
_TAIL_NATS = 38.0
#: series terms are dropped once their bound is below :math:`e^{-40}` (relative to a CDF of order 1)
_TERM_NATS = 40.0
#: the term counts the inversion evaluates a batch with (each entry with the smallest that covers it)
_TERM_BUCKETS = (2, 4, 8, 16, 32, 64)
_ICDF_MAX_ITER = 100
#: the inversion stops when a step in y = log x is below _ICDF_ATOL + _ICDF_RTOL |y| (a few ulps of x)
_ICDF_ATOL = 1e-14
_ICDF_RTOL = 8 * torch.finfo(torch.float64).eps
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
_SQRT_HALF = math.sqrt(0.5)


def _cdf_and_slope(y: Tensor, a: Tensor, alpha: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r""":math:`F(e^y)`, :math:`1 - F(e^y)` and :math:`dF/dy` of :math:`\mathrm{PG}(b, c)` by the series of
    :func:`polya_gamma_icdf` over the columns of ``a`` (:math:`A_n`) and ``alpha`` (:math:`\alpha_n`)."""
    yy = y.unsqueeze(-1)
    root, inv_root = torch.exp(0.5 * yy), torch.exp(-0.5 * yy)
    cc = c.unsqueeze(-1)
    s = cc * root - alpha * inv_root
    t = cc * root + alpha * inv_root
    gauss = a - 0.5 * s * s
    sign = 1.0 - 2.0 * (torch.arange(a.shape[-1], device=a.device) % 2)
    terms = torch.exp(a + torch.special.log_ndtr(s)) + 0.5 * torch.exp(gauss) * torch.special.erfcx(_SQRT_HALF * t)
    cdf = (sign * terms).sum(-1)
    slope = (sign * torch.exp(gauss + torch.log(alpha) - 0.5 * yy - _HALF_LOG_2PI)).sum(-1)
    return cdf, 1.0 - cdf, slope


def polya_gamma_icdf(u: Tensor, b: Tensor, c: Tensor) -> Tensor:
    r"""The quantile function of :math:`\mathrm{PG}(b, c)` for :math:`0 < b \le 1`: the :math:`x` with
    :math:`F(x) = u`, elementwise, by the exact series of the CDF (the sampler's law for small :math:`b`).

    With :math:`s_n = c\sqrt x - \alpha_n/\sqrt x`, :math:`t_n = c\sqrt x + \alpha_n/\sqrt x`,
    :math:`\alpha_n = n + b/2` and :math:`A_n = \log\frac{\Gamma(n+b)}{\Gamma(b)\,n!} + b\log(1+e^{-c}) - nc`,

    .. math::
        F(x) = \sum_{n\ge0}(-1)^n e^{A_n}\Big[\Phi(s_n) + \tfrac12 e^{-s_n^2/2}\operatorname{erfcx}(t_n/\sqrt2)\Big],
        \qquad x F'(x) = \sum_{n\ge0}(-1)^n e^{A_n}\,\frac{\alpha_n}{\sqrt{2\pi x}}\,e^{-s_n^2/2},

    the series :math:`\cosh^b(c/2)\frac{2^b}{\Gamma(b)}\sum_n(-1)^n\frac{\Gamma(n+b)}{n!}[e^{-\alpha_nc}
    \Phi(\frac{cx-\alpha_n}{\sqrt x}) + e^{\alpha_nc}\Phi(-\frac{cx+\alpha_n}{\sqrt x})]` with the large exponents
    cancelled analytically, so it holds for any tilt (no term exceeds :math:`e^{-nc}`). For :math:`b \le 1` its
    coefficients decrease, and every term is computed in logs: the left tail (:math:`F \approx e^{-b^2/(8x)}`) is
    exact to relative precision, the rest to about :math:`10^{-15}` absolute. Terms are kept while their bound
    :math:`\min(e^{-nc}, e^{-n^2/(2x) + bc/2})` exceeds :math:`e^{-40}`.

    The root is found in :math:`y = \log x` (the law spans many decades for small :math:`b`) by Newton steps on
    :math:`\log F - \log u` (:math:`u \le \frac12`) or :math:`\log(1-u) - \log(1 - F)` (:math:`u > \frac12`),
    safeguarded by a bracket that always contains it: Chernoff bounds put :math:`F < e^{-38}` at
    :math:`x_{lo} = r^2`, :math:`r = b/(k + \sqrt{k^2 + 2bc})`, :math:`k = \sqrt{2(38 + b\log(1+e^{-c}))}`, and
    :math:`1 - F < e^{-38}` at :math:`x_{hi} = (38 + b(c/2 + \log(1+e^{-c})))/(c^2/2 + 2\pi^2/9)`. The start is the
    quantile of the series' leading term at :math:`c = 0`, a Lévy law (a log-normal with the exact mean and
    variance where :math:`bc > 1`). It stops when a step in :math:`y` is below
    :math:`10^{-14} + 8\epsilon|y|` (a few ulps of :math:`x`).

    :param u: probabilities in :math:`(0, 1]` (float64; ``u = 1`` gives :math:`x_{hi}`).
    :param b: shapes, :math:`0 < b \le 1`, broadcast with ``u`` and ``c``.
    :param c: tilts (the law depends on :math:`|c|`), finite.
    :returns: the quantiles, float64, shape ``broadcast(u, b, c)`` (below about :math:`10^{-308}`, i.e. for
        :math:`b \lesssim 10^{-153}`, they underflow to 0).
    :raises ValueError: if ``b`` is outside :math:`(0, 1]`, ``c`` not finite or ``u`` outside :math:`(0, 1]`.

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions.polya_gamma_torch import polya_gamma_icdf
        >>> x = polya_gamma_icdf(torch.tensor([0.5]), torch.tensor([1.0]), torch.tensor([0.0]))
        >>> [round(v, 6) for v in x.tolist()]           # the median of PG(1, 0)
        [0.189374]
    """
    u, b, c = (t.to(torch.float64) for t in torch.broadcast_tensors(u, b, c))
    if not bool(((b > 0) & (b <= 1)).all()):
        raise ValueError("polya_gamma_icdf: b must be in (0, 1]")
    if not bool(torch.isfinite(c).all()):
        raise ValueError("polya_gamma_icdf: c must be finite")
    if not bool(((u > 0) & (u <= 1)).all()):
        raise ValueError("polya_gamma_icdf: u must be in (0, 1]")
    shape = u.shape
    u, b, c = u.reshape(-1), b.reshape(-1), c.abs().reshape(-1)
    log1p_exp = torch.log1p(torch.exp(-c))
    lo, hi, y = _icdf_bracket_and_start(u, b, c, log1p_exp)
    n = torch.arange(_TERM_BUCKETS[-1], dtype=torch.float64, device=u.device)
    bb = b.unsqueeze(-1)
    # log(Gamma(n + b) / (Gamma(b) n!)) once per distinct b (a sampler's b are mostly one value, e.g. 1/2)
    distinct, inverse = torch.unique(b, return_inverse=True)
    db = distinct.unsqueeze(-1)
    a = (torch.lgamma(n + db) - torch.lgamma(db) - torch.lgamma(n + 1))[inverse] + bb * log1p_exp.unsqueeze(-1)
    a = a - n * c.unsqueeze(-1)
    alpha = n + bb / 2
    lower = u <= 0.5
    log_target = torch.where(lower, torch.log(u), torch.log1p(-u))
    idx = torch.arange(u.numel(), device=u.device)
    for _ in range(_ICDF_MAX_ITER):
        if idx.numel() == 0:
            break
        yi, ci, bi = y[idx], c[idx], b[idx]
        # terms needed at x = e^y: n c > 40 or n^2 / (2x) - b c / 2 > 40
        need = torch.minimum(_TERM_NATS / ci, torch.sqrt(2 * torch.exp(yi) * (_TERM_NATS + 0.5 * bi * ci))) + 2
        cdf, surv, slope = (torch.empty_like(yi) for _ in range(3))
        done_before = torch.zeros_like(yi, dtype=torch.bool)
        for terms in _TERM_BUCKETS:
            part = ~done_before & ((need <= terms) | (terms == _TERM_BUCKETS[-1]))
            done_before |= part
            if not bool(part.any()):
                continue
            at = idx[part]
            evaluated = _cdf_and_slope(yi[part], a[at, :terms], alpha[at, :terms], ci[part])
            cdf[part], surv[part], slope[part] = evaluated
        low = lower[idx]
        value = torch.where(low, cdf, surv).clamp_min(0.0)
        # g increasing in y: log F - log u, or log(1 - u) - log(1 - F)
        g = torch.where(low, torch.log(value) - log_target[idx], log_target[idx] - torch.log(value))
        dg = slope / value
        root_left = g > 0
        lo_i = torch.where(root_left, lo[idx], yi)
        hi_i = torch.where(root_left, yi, hi[idx])
        step = yi - g / dg
        inside = (step > lo_i) & (step < hi_i)  # False for nan and inf
        # a Newton step below the tolerance that lands on (or rounds past) the bracket's end at yi: yi is the root
        # to within the tolerance (bisecting from the bracket's midpoint instead took ~40 more iterations)
        negligible = (step - yi).abs() <= _ICDF_ATOL + _ICDF_RTOL * yi.abs()
        new = torch.where(g == 0, yi, torch.where(inside, step, torch.where(negligible, yi, 0.5 * (lo_i + hi_i))))
        tol = _ICDF_ATOL + _ICDF_RTOL * new.abs()
        converged = ((new - yi).abs() <= tol) | (hi_i - lo_i <= tol)
        lo[idx], hi[idx], y[idx] = lo_i, hi_i, new
        idx = idx[~converged]
    return torch.exp(y).reshape(shape)


def _icdf_bracket_and_start(u: Tensor, b: Tensor, c: Tensor, log1p_exp: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`polya_gamma_icdf`'s bracket ``(lo, hi)`` of ``log x`` (its Chernoff bounds) and its start inside it."""
    k = torch.sqrt(2 * (_TAIL_NATS + b * log1p_exp))
    lo = 2 * (torch.log(b) - torch.log(k + torch.sqrt(k * k + 2 * b * c)))
    hi = torch.log((_TAIL_NATS + b * (0.5 * c + log1p_exp)) / (0.5 * c * c + 2 * _PI2 / 9))
    # start: the quantile of the leading term at c = 0, 2^(b+1) Phi(-b / (2 sqrt x)); where b c > 1 (the law
    # concentrates about its mean) a log-normal with the exact mean and variance; clamped into the bracket
    z = torch.special.ndtri((u * torch.exp(-(b + 1) * math.log(2.0))).clamp(max=0.5 - 1e-9))
    levy = 2 * (torch.log(b) - math.log(2.0) - torch.log(-z))
    mean = pg_mean(b, c)
    lognormal = torch.log(mean) + torch.sqrt(pg_variance(b, c)) / mean * torch.special.ndtri(u)
    return lo, hi, torch.minimum(torch.maximum(torch.where(b * c > 1, lognormal, levy), lo), hi)


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
    r"""Draws of :math:`\mathrm{PG}(b_i, c_i)` in torch, on the generator's device: exact for every
    :math:`b \le` :data:`SUM_MAX` (sums of exact :math:`\mathrm{PG}(1, c)` draws and, for a fractional part, an
    inversion of the exact CDF), the gamma series above (see the module's docstring); no host round trip.

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
    # fractional parts (b <= SUM_MAX): exact, by inverting the CDF; b > SUM_MAX: the gamma series
    small = (fraction > 0) & (fraction < 1) & ~point
    if bool(small.any()):
        where = small.nonzero().squeeze(-1)
        out[where] += polya_gamma_icdf(_open_uniform(where.numel(), generator, device), fraction[where], c[where])
    series = (fraction >= 1) & ~point
    if bool(series.any()):
        where = series.nonzero().squeeze(-1)
        out[where] += _gamma_series(fraction[where], c[where], generator)
    return out.reshape(shape).to(device=out_device, dtype=dtype)
