r"""Special functions: the Pólya-Gamma moments and KL, the logistic bounds, :func:`log_cosh`, :func:`log1mexp`,
the Student-t normaliser (stable in value and gradient where the naive formulas are not)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

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


def log_cosh_sqrt(u: Tensor) -> Tensor:
    r""":math:`\log\cosh\sqrt u` for :math:`u \ge 0`, smooth in :math:`u` at 0 (value 0, derivative 1/2).

    The composition ``log_cosh(sqrt(u))`` has the right value at :math:`u = 0` but an undefined gradient there
    (:math:`\sqrt u` has an infinite derivative, the even ``log_cosh`` a zero one: ``0 * inf = NaN``); below a
    threshold the series :math:`u/2 - u^2/12 + u^3/45` is used instead.

    Example::

        >>> import torch
        >>> from gpytorch_augment._numerics import log_cosh_sqrt
        >>> u = torch.tensor([0.0, 2.0], dtype=torch.float64, requires_grad=True)
        >>> log_cosh_sqrt(u).sum().backward()
        >>> u.grad[0].item()
        0.5
    """
    small = u < _small_threshold(u)
    safe = torch.where(small, torch.ones_like(u), u)
    return torch.where(small, u / 2 - u * u / 12 + u**3 / 45, log_cosh(torch.sqrt(safe)))


def pg_mean_from_square(b: Tensor | float, c2: Tensor) -> Tensor:
    r"""Mean of :math:`\mathrm{PG}(b, c)` from :math:`c^2 \ge 0`, smooth in :math:`c^2` at 0 (where
    ``pg_mean(b, sqrt(c2))`` has a NaN gradient); :math:`b/4 - b c^2/48 + \dots` below a threshold."""
    small = c2 < _small_threshold(c2) ** 2
    safe = torch.where(small, torch.ones_like(c2), c2)
    series = 0.25 - c2 / 48 + c2 * c2 / 480
    return b * torch.where(small, series, _tanh_half_over_c(torch.sqrt(safe)))


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


#: below this standardised point the Mills-ratio continued fraction replaces ``1 + t R(t)`` (which cancels)
_MILLS_SWITCH = -4.0
#: terms of the backward-evaluated Laplace continued fraction of the Mills ratio (converged for |t| >= 4)
_MILLS_TERMS = 60
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _log_side(t: Tensor, d: Tensor, sd: Tensor, a: Tensor) -> Tensor:
    r""":math:`\log E[(1 + ax)e^{-ax}\,1\{x > 0\}]` for :math:`x\sim\mathcal N(d, \sigma^2)`, with
    :math:`t = (d - a\sigma^2)/\sigma`.

    With :math:`R(t) = \Phi(t)/\varphi(t)` the expectation is :math:`\varphi(d/\sigma)\,[R(t) + a\sigma(1 + tR(t))]`.
    For :math:`t \ge 0` it is written :math:`e^{-ad + a^2\sigma^2/2}\Phi(t)\,[1 + a\sigma t + a\sigma/R(t)]` (no
    overflow of :math:`R`); for :math:`t < 0`, :math:`R = \sqrt{\pi/2}\,\mathrm{erfcx}(-t/\sqrt2)` and
    :math:`1 + tR(t)` (which cancels for :math:`t \ll 0`) is taken below :math:`t = -4` from Laplace's continued
    fraction :math:`R(t) = 1/(u + 1/(u + 2/(u + \dots)))`, :math:`u = -t`: :math:`1 + tR = K/(u + K)`."""
    positive = t >= 0
    tp = torch.where(positive, t, torch.zeros_like(t))
    log_phi_tp = torch.special.log_ndtr(tp)
    inv_mills = torch.exp(-tp * tp / 2 - _HALF_LOG_2PI - log_phi_tp)  # 1 / R(t)
    a_sd = a * sd
    log_pos = -a * d + a_sd * a_sd / 2 + log_phi_tp + torch.log(1 + a_sd * tp + a_sd * inv_mills)
    tn = torch.where(positive, -torch.ones_like(t), t)
    u = -tn
    mills = math.sqrt(math.pi / 2) * torch.special.erfcx(u / math.sqrt(2))
    far = tn < _MILLS_SWITCH
    uf = torch.where(far, u, torch.full_like(u, -_MILLS_SWITCH))
    k = torch.zeros_like(uf)
    for n in range(_MILLS_TERMS, 0, -1):
        k = n / (uf + k)
    gap = torch.where(far, k / (uf + k), 1 + tn * mills)  # 1 + t R(t) > 0
    z = d / sd
    log_neg = -z * z / 2 - _HALF_LOG_2PI + torch.log(mills + a_sd * gap)
    return torch.where(positive, log_pos, log_neg)


def log_normal_matern32(d: Tensor, var: Tensor, a: Tensor) -> Tensor:
    r""":math:`\log E_x\,\tfrac a4(1 + a|x|)e^{-a|x|}` for :math:`x\sim\mathcal N(d, s)`: the log density of
    :math:`y = f + \epsilon` at residual :math:`d = y - m`, :math:`f\sim\mathcal N(m, s)`, :math:`\epsilon` Matérn-3/2
    noise of rate :math:`a` (:class:`~gpytorch_augment.distributions.MaternThreeHalves`), in closed form.

    The density is split at the kink :math:`x = 0` and each side integrated exactly (:func:`_log_side` has the
    formulas); accurate to a few units in the last place for every finite :math:`d`, :math:`s > 0`; ``var`` is
    clamped at the smallest positive number of its dtype. Differentiable in all three arguments.

    Example::

        >>> import torch
        >>> from gpytorch_augment._numerics import log_normal_matern32
        >>> one = torch.tensor(1.0, dtype=torch.float64)
        >>> round(float(log_normal_matern32(0 * one, 1e-300 * one, one).exp()), 12)   # s -> 0: the density a / 4
        0.25
    """
    sd = var.clamp_min(torch.finfo(var.dtype).tiny).sqrt()
    t_plus = (d - a * sd * sd) / sd
    t_minus = (-d - a * sd * sd) / sd
    return torch.log(a / 4) + torch.logaddexp(_log_side(t_plus, d, sd, a), _log_side(t_minus, -d, sd, a))
