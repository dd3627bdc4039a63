r"""The Pólya-Gamma distribution :math:`\mathrm{PG}(b, c)` (:doc:`/maths/binary`)."""

from __future__ import annotations

import importlib.util
import math
from functools import cache

import numpy as np
import torch
from torch import Tensor
from torch.distributions import Distribution, constraints
from torch.distributions.kl import register_kl
from torch.distributions.utils import broadcast_all

from .._numerics import log1mexp as _log1mexp
from .._numerics import log_cosh, pg_kl, pg_mean, pg_variance, safeguarded_newton
from .._random import draw_device, numpy_generator
from .auxiliary import NotReparameterized
from .polya_gamma_torch import gamma_series_terms, polya_gamma_icdf, sample_polya_gamma

__all__ = ["PolyaGamma", "uses_torch_sampler"]

_LOG2 = math.log(2.0)
_LOG_2PI = math.log(2.0 * math.pi)
#: A series term this many nats below the largest term so far (and past the peak) ends the summation.
_SERIES_MARGIN = 45.0
_SERIES_MAX_TERMS = 5000
_SERIES_CHUNK = 16
#: above this ``b`` or ``|c|`` draws use the normal approximation with exact moments (see :func:`_sample_numpy`)
_NORMAL_ABOVE = 1e8
#: ``polyagamma``'s ``"alternate"`` method refuses ``b <= 1e-4`` (``ValueError: Values of `h` must be positive``)
_ALTERNATE_MIN_B = 1e-4


def _log_pg0_series(x: Tensor, b: Tensor) -> Tensor:
    r""":math:`\log \mathrm{PG}(x \mid b, 0)` by the alternating series of :doc:`/maths/binary`, for float64 ``x >
    0``, ``b > 0``.

    The terms :math:`a_n = \frac{\Gamma(n+b)}{n!}(2n+b)e^{-(2n+b)^2/(8x)}` are unimodal in :math:`n`; even and odd
    terms are log-sum-exp'ed separately (in chunks of ``_SERIES_CHUNK`` terms) and combined as
    :math:`E + \log(1 - e^{O - E})`. Summation stops once every element is past its peak and the current term is
    ``_SERIES_MARGIN`` nats below the largest one, so the truncation error (bounded by the next term of an
    alternating series with decreasing terms) is below float64 rounding of the leading term. Where the true value
    is ~30 nats or more below the leading term (far right tail, large ``b``) the cancellation is catastrophic.
    """
    inv8x = (0.125 / x).unsqueeze(-1)
    bb = b.unsqueeze(-1)
    lgb = torch.lgamma(b)
    log_even = torch.full_like(x, -math.inf)
    log_odd = torch.full_like(x, -math.inf)
    for start in range(0, _SERIES_MAX_TERMS, _SERIES_CHUNK):
        n = torch.arange(start, start + _SERIES_CHUNK, dtype=x.dtype, device=x.device)
        m = 2 * n + bb
        terms = torch.lgamma(n + bb) - torch.lgamma(n + 1) + torch.log(m) - m * m * inv8x
        even_first = start % 2 == 0
        ev, od = (terms[..., 0::2], terms[..., 1::2]) if even_first else (terms[..., 1::2], terms[..., 0::2])
        log_even = torch.logaddexp(log_even, torch.logsumexp(ev, -1))
        log_odd = torch.logaddexp(log_odd, torch.logsumexp(od, -1))
        with torch.no_grad():
            last, before = terms[..., -1], terms[..., -2]
            if bool(((last < before) & (last < torch.maximum(log_even, log_odd) - _SERIES_MARGIN)).all()):
                break
    log_sum = log_even + _log1mexp(log_odd - log_even)
    value = (b - 1) * _LOG2 - lgb - 0.5 * (_LOG_2PI + 3 * torch.log(x)) + log_sum
    # nats lost to cancellation: the series' relative rounding error is about eps * exp(lost)
    lost = (log_even - log_sum).detach()
    return value, lost


#: the saddle-point approximation's error of the log-density is about this over b^2 (measured against a
#: high-precision evaluation of the series: 2.3e-3 at b = 1, 1.3e-2 at b = 0.5, 2e-7 at b = 100)
_SADDLE_ERROR = 2.5e-3
_SADDLE_TERMS = 256
_HALF_PI_SQ = math.pi**2 / 2


def _kappa_derivatives(s: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    r""":math:`\kappa(s) = -\log\cos\sqrt{s/2}` (the cumulant generating function of :math:`\mathrm{PG}(1, 0)`,
    :math:`s < \pi^2/2`) and its first four derivatives, elementwise for float64 ``s``.

    From :math:`\cos\sqrt{s/2} = \prod_k (1 - s/a_k)`, :math:`a_k = 2\pi^2(k - \frac12)^2`:
    :math:`\kappa^{(j)}(s) = (j-1)!\sum_k (a_k - s)^{-j}`, summed over ``_SADDLE_TERMS`` terms plus the integral of
    the tail for :math:`j \ge 2`; :math:`\kappa` and :math:`\kappa'` in closed form
    (:math:`\kappa' = \tan u/(4u)`, :math:`u = \sqrt{s/2}`; :math:`\tanh v/(4v)`, :math:`v = \sqrt{-s/2}` for
    :math:`s < 0`).
    """
    pos = s > 0
    u = torch.sqrt(torch.where(pos, s, torch.ones_like(s)) / 2)
    v = torch.sqrt(torch.where(pos, torch.ones_like(s), -s) / 2)
    small = s.abs() < 1e-6
    k0 = torch.where(pos, -torch.log(torch.cos(u)), -log_cosh(v))
    k1 = torch.where(pos, torch.tan(u) / (4 * u), torch.tanh(v) / (4 * v))
    k0 = torch.where(small, s / 4 + s * s / 48, k0)
    k1 = torch.where(small, 0.25 + s / 24, k1)
    k = torch.arange(1, _SADDLE_TERMS + 1, dtype=s.dtype, device=s.device) - 0.5
    inv = 1.0 / (2 * math.pi**2 * k * k - s.unsqueeze(-1))
    out = []
    for j, factorial in ((2, 1.0), (3, 2.0), (4, 6.0)):
        tail = (2 * math.pi**2) ** (-j) * _SADDLE_TERMS ** (1 - 2 * j) / (2 * j - 1)
        out.append(factorial * ((inv**j).sum(-1) + tail))
    return k0, k1, out[0], out[1], out[2]


def _log_pg0_saddle(x: Tensor, b: Tensor) -> Tensor:
    r""":math:`\log\mathrm{PG}(x\mid b, 0)` by the saddle-point approximation with its second-order correction
    (Daniels 1954), :math:`K(\hat s) - \hat s x - \frac12\log(2\pi K_2) + \frac{K_4}{8K_2^2} - \frac{5K_3^2}{24K_2^3}`,
    :math:`K = b\kappa`, :math:`K_j` its derivatives at :math:`\hat s`, :math:`K'(\hat s) = x`; relative error
    :math:`O(b^{-2})` of the density, uniformly in ``x`` (float64 ``x > 0``, ``b > 0``). The saddle point solves
    :math:`\kappa'(s) = r = x/b` by a safeguarded Newton iteration in the bracket
    :math:`-1/(8r^2) \le \hat s \le \pi^2/2 - 1/r`."""
    with torch.no_grad():
        r = (x / b).detach()

        def g(s: Tensor) -> tuple[Tensor, Tensor]:
            _, k1, k2, _, _ = _kappa_derivatives(s)
            return k1 - r, k2

        # kappa'(s) > 1 / (pi^2/2 - s) (the first term of its series) and kappa'(s) < 1 / (2 sqrt(-2 s)) for s < 0:
        # the root lies in [lo, hi]; kappa' is increasing and convex, so Newton from hi converges monotonically
        lo = -1.0 / (8 * r * r)
        hi = torch.maximum(_HALF_PI_SQ - 1.0 / r, lo)
        s_hat = safeguarded_newton(g, lo, hi, hi, increasing=True)
    k0, _, k2, k3, k4 = _kappa_derivatives(s_hat)
    b2, b3, b4 = b * k2, b * k3, b * k4
    correction = b4 / (8 * b2 * b2) - 5 * b3 * b3 / (24 * b2**3)
    return b * k0 - s_hat * x - 0.5 * (_LOG_2PI + torch.log(b2)) + correction


def _log_pg0(x: Tensor, b: Tensor) -> Tensor:
    r""":math:`\log\mathrm{PG}(x \mid b, 0)` for float64 ``x > 0``, ``b > 0``: the alternating series where it is
    accurate, else the saddle-point approximation, whichever has the smaller estimated error (the series': the
    rounding of its terms amplified by the nats lost to cancellation; the saddle point's:
    :math:`2.5\times10^{-3}/b^2`)."""
    series, lost = _log_pg0_series(x, b)
    with torch.no_grad():
        # each log-term is exact to about eps times its size; the cancellation amplifies that by exp(lost)
        scale = 1.0 + torch.lgamma(b + 1).abs() + b * b / (8 * x)
        series_error = torch.finfo(torch.float64).eps * scale * lost.clamp(max=700).exp()
        bad = (series_error > _SADDLE_ERROR / (b * b)) | ~torch.isfinite(series)
    if not bool(bad.any()):
        return series
    saddle = torch.zeros_like(series)
    saddle[bad] = _log_pg0_saddle(x[bad], b[bad])
    return torch.where(bad, saddle, series)


def _gamma_series_sample(b: np.ndarray, z: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    r"""The gamma series (:doc:`/maths/binary`): the first ``GAMMA_TERMS`` (10) terms drawn exactly, the tail by one
    moment-matched gamma.

    With weights :math:`w_k = [2\pi^2((k-\frac12)^2 + z^2/4\pi^2)]^{-1}`, the tail :math:`\sum_{k>K} w_k g_k` has
    mean :math:`b S_1` and variance :math:`b S_2`, :math:`S_j = \sum_{k>K} w_k^j` (taken from the exact totals
    :math:`\mathrm{PGm}(1,z)` and :math:`\mathrm{Var}\,\mathrm{PG}(1,z)`). It is replaced by
    :math:`\mathrm{Ga}(bS_1^2/S_2,\ \text{scale } S_2/S_1)`, so mean and variance are exact; only the tail's higher
    cumulants are approximated (for :math:`K = 10` the tail is ~:math:`2\times10^{-5}` of the variance and
    ~:math:`10^{-8}` of the third cumulant). Used only where the package's exact samplers are biased
    (non-integer ``1 < b < 8`` with ``z < 8``); not for ``b < 1``, where the moment-matched tail puts mass
    :math:`\propto x^{\approx 30b}` near 0 and the law has :math:`F(x) \approx e^{-b^2/(8x)}` (the exact
    inversion is used there).
    """
    w, s1, s2 = (t.numpy() for t in gamma_series_terms(torch.from_numpy(z)))  # w: (n, K)
    head = (rng.standard_gamma(np.broadcast_to(b[:, None], w.shape)) * w).sum(-1)
    return head + rng.gamma(b * s1 * s1 / s2, s2 / s1)


def _inversion_sample(b: np.ndarray, z: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    r"""Exact draws of :math:`\mathrm{PG}(b, z)`, :math:`0 < b < 1`, by inverting the CDF
    (:func:`~gpytorch_augment.distributions.polya_gamma_torch.polya_gamma_icdf`) at uniforms from ``rng`` in
    :math:`[2^{-54}, 1 - 2^{-54}]`."""
    u = np.clip(rng.random(b.shape) + 2.0**-54, 2.0**-54, 1.0 - 2.0**-54)
    return polya_gamma_icdf(torch.from_numpy(u), torch.from_numpy(b), torch.from_numpy(z)).numpy()


def _normal_sample(b: np.ndarray, z: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Normal approximation with the exact (stable) mean and variance; used only for ``b > 200``, ``z > 10``."""
    bt, zt = torch.from_numpy(b), torch.from_numpy(z)
    mean, sd = pg_mean(bt, zt).numpy(), pg_variance(bt, zt).sqrt().numpy()
    return np.maximum(mean + sd * rng.standard_normal(b.shape), np.finfo(np.float64).tiny)


def _sample_numpy(b: np.ndarray, z: np.ndarray, rng: np.random.Generator, out: np.ndarray | None = None) -> np.ndarray:
    r"""Draw :math:`\mathrm{PG}(b_i, z_i)` for flat float64 arrays, ``b > 0``, ``z >= 0`` (into ``out`` if given).

    ``polyagamma`` 2.0.2's default hybrid rule is not used as is, because some of its branches are wrong (measured
    with :math:`4\times10^5`--:math:`4\times10^6` draws against the exact mean and variance):

    * ``"alternate"`` is biased for non-integer ``b`` at small ``z`` (``b = 3.7, z = 0``: mean +0.9 %, variance +5 %;
      ``b = 0.5``: mean -0.7 %; zoj613/polyagamma#133), and the hybrid rule uses it there;
    * ``"devroye"`` returns garbage (a constant 0.16 for ``b = 1``) for ``z >= 200``; ``"saddle"`` breaks for
      ``z >~ 30``--``100``; the ``b > 50`` normal approximation has zero/NaN variance for ``z >~ 38``.

    Routing used instead (first matching row; each branch checked unbiased at that resolution):

    ======================================  =====================================================
    ``1e-4 < b <= 200``, ``8 <= z <= 1e8``  ``"alternate"`` (exact)
    ``b < 1``                               inversion of the exact CDF (:func:`_inversion_sample`); the
                                            gamma series is wrong there (Kolmogorov-Smirnov distance to the
                                            exact CDF 0.18 at ``b = 0.01``, 0.02 at ``b = 0.05``, 0.94 at
                                            ``b = 1e-4``) and the package refuses ``b <= 1e-4``
    ``b > 1e8`` or ``z > 1e8``              normal approximation with exact moments (``polyagamma`` never
                                            returns for ``z >~ 1e60`` and is wrong for ``b = 1e300``; here
                                            the law is a sum of :math:`\gtrsim 10^8` independent terms,
                                            relative sd :math:`< 10^{-4}`)
    ``b > 200``,  ``z > 10``                normal approximation with exact moments (skewness < 0.1)
    integer ``b <= 12``                     ``"devroye"`` (exact)
    ``b >= 8``                              ``"saddle"`` (exact)
    otherwise (``1 <= b < 8``)              gamma series, 10 terms + moment-matched tail
    ======================================  =====================================================

    For integer ``b <= 12`` (e.g. ``b = 1``, Bernoulli) only the two exact samplers ``"devroye"`` and
    ``"alternate"`` are used; ``"devroye"`` is also the fastest for ``b = 1`` (``benchmarks/README.md``). When
    one branch covers every element (the usual case in a Gibbs sweep) it is a single vectorised call writing into
    ``out``, without masked copies.
    """
    from polyagamma import random_polyagamma

    out = np.empty_like(b) if out is None else out
    if b.size and z.max() < 8 and b.max() <= 12 and (b == np.round(b)).all():  # every element: "devroye"
        return random_polyagamma(h=b, z=z, method="devroye", random_state=rng, out=out)
    normal = (((b > 200) & (z > 10)) | (z > _NORMAL_ABOVE) | (b > _NORMAL_ABOVE)) & (b >= 1)
    alternate = (b <= 200) & (b > _ALTERNATE_MIN_B) & (z >= 8) & (z <= _NORMAL_ABOVE)
    invert = (b < 1) & ~alternate
    rest = ~(alternate | normal | invert)
    devroye = rest & (b <= 12) & (b == np.round(b))
    saddle = rest & ~devroye & (b >= 8)
    series = rest & ~devroye & ~saddle
    exact = ((alternate, "alternate"), (devroye, "devroye"), (saddle, "saddle"))
    for mask, method in exact:
        if mask.all():
            return random_polyagamma(h=b, z=z, method=method, random_state=rng, out=out)
    for mask, method in exact:
        if mask.any():
            out[mask] = random_polyagamma(h=b[mask], z=z[mask], method=method, random_state=rng)
    if normal.any():
        out[normal] = _normal_sample(b[normal], z[normal], rng)
    if series.any():
        out[series] = _gamma_series_sample(b[series], z[series], rng)
    if invert.any():
        out[invert] = _inversion_sample(b[invert], z[invert], rng)
    return out


@cache
def _has_polyagamma() -> bool:
    """Whether the ``polyagamma`` package (the host sampler) is installed."""
    return importlib.util.find_spec("polyagamma") is not None


def uses_torch_sampler(device: torch.device) -> bool:
    """Whether :meth:`PolyaGamma.sample` draws with the torch-native sampler
    (:func:`~gpytorch_augment.distributions.polya_gamma_torch.sample_polya_gamma`) on ``device`` (the generator's,
    else the parameters'): on every device but the CPU, and on the CPU when ``polyagamma`` is not installed.

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions.polya_gamma import uses_torch_sampler
        >>> uses_torch_sampler(torch.device("meta"))
        True
    """
    return device.type != "cpu" or not _has_polyagamma()


class PolyaGamma(NotReparameterized, Distribution):
    r"""Pólya-Gamma distribution :math:`\omega \sim \mathrm{PG}(b, c)`, :math:`b \ge 0`, :math:`c \in \mathbb R`.

    .. math::
        \omega \overset{d}{=} \frac{1}{2\pi^2}\sum_{k=1}^\infty \frac{g_k}{(k-\frac12)^2 + c^2/(4\pi^2)},
        \qquad g_k \overset{iid}{\sim} \mathrm{Ga}(b, 1),

    with exponential tilting
    :math:`\mathrm{PG}(\omega\mid b,c) = \cosh^b(c/2)\,e^{-c^2\omega/2}\,\mathrm{PG}(\omega\mid b,0)`, mean
    :math:`\frac{b}{2c}\tanh\frac c2` and the Laplace transform
    :math:`E_{\mathrm{PG}(b,0)} e^{-t\omega} = \cosh^{-b}\sqrt{t/2}`. The law depends on :math:`|c|` only.
    :math:`b = 0` is the point mass at 0 (mean, variance, KL and samples are 0; ``log_prob(0) = 0``).

    * :attr:`mean`, :attr:`variance` and the KL to :math:`\mathrm{PG}(b, 0)` are closed forms, stable (value and
      gradient) as :math:`c \to 0`.
    * :meth:`log_prob` uses the alternating series of the density (Polson, Scott & Windle 2013, eq. 2 with the
      :math:`\mathrm{J}^*(b)` series) in float64 (cast back) and the tilting identity. The series cancels
      catastrophically in the bulk and right tail for large ``b`` (``b = 100``: from about the mean on); where its
      estimated rounding error exceeds that of the saddle-point approximation of the density with its
      second-order correction, the latter is used instead (Daniels 1954; cumulant generating function
      :math:`-b\log\cos\sqrt{s/2}`), whose relative error is :math:`O(b^{-2})` uniformly in ``x``. Measured
      against a high-precision ``mpmath`` evaluation of the series, the absolute error of
      :math:`\log\mathrm{PG}(x\mid b,0)` is below :math:`5\times10^{-6}` for ``b >= 10`` everywhere, and in the
      far right tail (where the saddle point takes over) about :math:`2\times10^{-3}` for ``b = 1`` and
      :math:`1.3\times10^{-2}` for ``b = 0.5``. The gradient of the saddle-point branch holds the saddle point
      fixed (exact for its leading term).
    * :meth:`sample` draws on CPU with ``polyagamma.random_polyagamma`` (exact methods, routed around the
      package's biased/broken branches, see :func:`_sample_numpy`), seeded from the torch generator (or the global
      torch RNG) via :func:`gpytorch_augment._random.numpy_generator`, so ``torch.manual_seed`` makes draws
      reproducible. Not reparameterisable (no :meth:`rsample`); no gradient flows through samples.
    * **Devices**: the draws are made on the generator's device (the parameters' if ``generator`` is ``None``).
      On a GPU they use the torch-native sampler of :mod:`~gpytorch_augment.distributions.polya_gamma_torch`
      (Devroye's exact method, sums for integer ``b``, the inversion of the exact CDF for a fractional part; exact
      for ``b <= 16``; no host round trip), from the generator or from torch's
      global RNG of that device; on the CPU the ``polyagamma`` path above (the faster one there), or
      the torch-native sampler where ``polyagamma`` is not installed (:func:`uses_torch_sampler`). A CPU generator
      with GPU parameters draws on the host and copies the draws over. The draws are returned on the parameters'
      device and dtype.
    * ``b`` must be finite and :math:`\ge 0`, ``c`` finite (``ValueError`` otherwise, at construction).

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions import PolyaGamma
        >>> q = PolyaGamma(torch.tensor([1.0, 3.0]), torch.tensor([0.0, 2.0]))
        >>> q.mean                                                   # b/4 at c = 0
        tensor([0.2500, 0.5712])
        >>> omega = q.sample((4000,), generator=torch.Generator().manual_seed(0))
        >>> omega.shape, bool(((omega.mean(0) - q.mean).abs() < 0.02).all())
        (torch.Size([4000, 2]), True)
        >>> torch.distributions.kl_divergence(q, PolyaGamma(q.b, torch.zeros(2)))  # KL(PG(b,c) || PG(b,0))
        tensor([0.0000, 0.1590])

    :param b: shape :math:`b \ge 0` (tensor or number).
    :param c: tilt :math:`c \in \mathbb R` (tensor or number); broadcast against ``b``.
    """

    arg_constraints = {"b": constraints.nonnegative, "c": constraints.real}
    has_rsample = False

    def __init__(self, b: Tensor | float, c: Tensor | float, validate_args: bool | None = None) -> None:
        floats = [t.dtype for t in (c, b) if isinstance(t, Tensor) and t.is_floating_point()]
        dtype = floats[0] if floats else torch.get_default_dtype()
        # integer tensors (e.g. counts) are cast first: broadcast_all would give a float number their integer dtype
        b, c = (t.to(dtype) if isinstance(t, Tensor) else t for t in (b, c))
        b, c = broadcast_all(b, c)
        if not bool((torch.isfinite(b) & (b >= 0)).all()):
            bad = b[~(torch.isfinite(b) & (b >= 0))].flatten()[0].item()
            raise ValueError(f"PolyaGamma: b must be finite and >= 0; got {bad}")
        if not bool(torch.isfinite(c).all()):
            raise ValueError(f"PolyaGamma: c must be finite; got {c[~torch.isfinite(c)].flatten()[0].item()}")
        self.b: Tensor = b
        self.c: Tensor = c
        super().__init__(self.b.shape, validate_args=validate_args)

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self) -> constraints.Constraint:
        """Positive reals; non-negative reals if some ``b == 0`` (point mass at 0)."""
        return constraints.nonnegative if bool((self.b == 0).any()) else constraints.positive

    def expand(self, batch_shape: torch.Size, _instance: PolyaGamma | None = None) -> PolyaGamma:
        new = self._get_checked_instance(PolyaGamma, _instance)
        batch_shape = torch.Size(batch_shape)
        new.b = self.b.expand(batch_shape)
        new.c = self.c.expand(batch_shape)
        super(PolyaGamma, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self) -> Tensor:
        return pg_mean(self.b, self.c)

    @property
    def variance(self) -> Tensor:
        return pg_variance(self.b, self.c)

    def log_prob(self, value: Tensor | float) -> Tensor:
        r""":math:`\log\mathrm{PG}(x\mid b,0) + b\log\cosh\frac c2 - \frac{c^2x}2`; ``-inf`` for ``x <= 0``.

        For ``b == 0`` returns 0 at ``x == 0`` and ``-inf`` elsewhere (log-mass of the point mass).
        """
        if self._validate_args:
            self._validate_sample(value)
        value = torch.as_tensor(value, device=self.c.device)
        out_dtype = torch.promote_types(value.dtype, self.c.dtype) if value.is_floating_point() else self.c.dtype
        x, b, c = (t.to(torch.float64) for t in torch.broadcast_tensors(value, self.b, self.c))
        zero_b = b == 0
        pos_x = (x > 0) & torch.isfinite(x)
        safe_b = torch.where(zero_b, torch.ones_like(b), b)
        safe_x = torch.where(pos_x, x, torch.ones_like(x))
        lp = _log_pg0(safe_x, safe_b) + safe_b * log_cosh(c / 2) - c * c * safe_x / 2
        neg_inf = torch.full_like(lp, -math.inf)
        lp = torch.where(pos_x, lp, neg_inf)
        lp = torch.where(zero_b, torch.where(x == 0, torch.zeros_like(lp), neg_inf), lp)
        lp = torch.where(torch.isnan(x), x, lp)
        return lp.to(out_dtype)

    def sample(self, sample_shape: torch.Size = torch.Size(), generator: torch.Generator | None = None) -> Tensor:
        """Draws via ``polyagamma.random_polyagamma`` (see :func:`_sample_numpy`) seeded from torch's RNG, or on a
        GPU (or without ``polyagamma``) by the torch-native sampler (see the class docstring, *Devices*)."""
        shape = self._extended_shape(torch.Size(sample_shape))
        if uses_torch_sampler(draw_device(generator, self.c.device)):
            return sample_polya_gamma(self.b.expand(shape), self.c.expand(shape), generator)
        with torch.no_grad():
            b = self.b.detach().to("cpu", torch.float64).expand(shape).reshape(-1).numpy()
            z = self.c.detach().to("cpu", torch.float64).abs().expand(shape).reshape(-1).numpy()
            rng = numpy_generator(generator)
            if b.size and b.min() > 0:
                out = _sample_numpy(b, z, rng)
            else:
                out = np.zeros(b.shape, dtype=np.float64)
                pos = b > 0
                if pos.any():
                    out[pos] = _sample_numpy(b[pos], z[pos], rng)
            return torch.from_numpy(out.reshape(shape)).to(device=self.c.device, dtype=self.c.dtype)


@register_kl(PolyaGamma, PolyaGamma)
def _kl_polyagamma_polyagamma(p: PolyaGamma, q: PolyaGamma) -> Tensor:
    r""":math:`\mathrm{KL}(\mathrm{PG}(b,c)\Vert\mathrm{PG}(b,0))`; other pairs raise ``NotImplementedError``."""
    b, c, qb, qc = torch.broadcast_tensors(p.b, p.c, q.b, q.c)
    if not bool((qc == 0).all()):
        raise NotImplementedError("KL(PG(b, c) || PG(b', c')) is only implemented for c' == 0")
    if not bool((qb == b).all()):
        raise NotImplementedError("KL(PG(b, c) || PG(b', 0)) is only implemented for b' == b")
    return pg_kl(b, c)
