r"""The Pólya-Gamma distribution :math:`\mathrm{PG}(b, c)` (``augmentations.md`` §2)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor
from torch.distributions import Distribution, constraints
from torch.distributions.kl import register_kl
from torch.distributions.utils import broadcast_all

from .._numerics import log_cosh, pg_kl, pg_mean, pg_variance
from .._random import numpy_generator

__all__ = ["PolyaGamma"]

_LOG2 = math.log(2.0)
_LOG_2PI = math.log(2.0 * math.pi)
#: A series term this many nats below the largest term so far (and past the peak) ends the summation.
_SERIES_MARGIN = 45.0
_SERIES_MAX_TERMS = 5000


def _log1mexp(d: Tensor) -> Tensor:
    r""":math:`\log(1 - e^{d})` for :math:`d \le 0` (Mächler's two-branch form; ``-inf`` at ``d = 0``)."""
    d = d.clamp(max=0.0)
    return torch.where(d > -_LOG2, torch.log(-torch.expm1(d)), torch.log1p(-torch.exp(d)))


def _log_pg0_series(x: Tensor, b: Tensor) -> Tensor:
    r""":math:`\log \mathrm{PG}(x \mid b, 0)` by the alternating series of §2.7, for float64 ``x > 0``, ``b > 0``.

    The terms :math:`a_n = \frac{\Gamma(n+b)}{n!}(2n+b)e^{-(2n+b)^2/(8x)}` are unimodal in :math:`n`; even and odd
    terms are accumulated separately in log space and combined as :math:`E + \log(1 - e^{O - E})`. Summation stops
    once every element is past its peak and the current term is ``_SERIES_MARGIN`` nats below the largest one, so
    the truncation error (bounded by the next term of an alternating series with decreasing terms) is below
    float64 rounding of the leading term. Where the true value is ~37 nats or more below the leading term
    (large ``x``, far right tail) the cancellation is catastrophic and the result is ``-inf`` or inaccurate.
    """
    inv8x = 0.125 / x
    lgb = torch.lgamma(b)
    log_even = lgb + torch.log(b) - b * b * inv8x  # n = 0
    log_odd = torch.full_like(log_even, -math.inf)
    prev = log_even
    for n in range(1, _SERIES_MAX_TERMS):
        m = 2 * n + b
        term = torch.lgamma(n + b) - math.lgamma(n + 1) + torch.log(m) - m * m * inv8x
        if n % 2:
            log_odd = torch.logaddexp(log_odd, term)
        else:
            log_even = torch.logaddexp(log_even, term)
        with torch.no_grad():
            done = (term < prev) & (term < torch.maximum(log_even, log_odd) - _SERIES_MARGIN)
            if bool(done.all()):
                break
        prev = term
    log_sum = log_even + _log1mexp(log_odd - log_even)
    return (b - 1) * _LOG2 - lgb - 0.5 * (_LOG_2PI + 3 * torch.log(x)) + log_sum


class PolyaGamma(Distribution):
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
    * :meth:`log_prob` uses the alternating series of ``augmentations.md`` §2.7 in float64 (cast back) and the
      tilting identity. It is accurate for :math:`b \lesssim 20` and :math:`x` up to a few times the mean;
      far in the right tail or for :math:`b \gtrsim 30` the series cancels catastrophically (``-inf``/inexact).
    * :meth:`sample` is exact: ``polyagamma.random_polyagamma`` (hybrid method) on CPU/NumPy, seeded from the
      torch generator (or the global torch RNG) via :func:`gpytorch_augment._random.numpy_generator`, so
      ``torch.manual_seed`` makes draws reproducible. Not reparameterisable (no :meth:`rsample`).

    Example::

        >>> torch.manual_seed(0)
        >>> q = PolyaGamma(torch.tensor([1.0, 3.0]), torch.tensor([0.5, 2.0]))
        >>> omega = q.sample((1000,))  # shape (1000, 2)
        >>> q.mean, q.variance, q.log_prob(omega).shape
        >>> torch.distributions.kl_divergence(q, PolyaGamma(q.b, torch.zeros(2)))  # KL(PG(b,c) || PG(b,0))

    :param b: shape :math:`b \ge 0` (tensor or number).
    :param c: tilt :math:`c \in \mathbb R` (tensor or number); broadcast against ``b``.
    """

    arg_constraints = {"b": constraints.nonnegative, "c": constraints.real}
    has_rsample = False

    def __init__(self, b: Tensor | float, c: Tensor | float, validate_args: bool | None = None) -> None:
        b, c = broadcast_all(b, c)
        dtype = next((t.dtype for t in (c, b) if t.is_floating_point()), torch.get_default_dtype())
        self.b: Tensor = b.to(dtype)
        self.c: Tensor = c.to(dtype)
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
        pos_x = x > 0
        safe_b = torch.where(zero_b, torch.ones_like(b), b)
        safe_x = torch.where(pos_x, x, torch.ones_like(x))
        lp = _log_pg0_series(safe_x, safe_b) + safe_b * log_cosh(c / 2) - c * c * safe_x / 2
        neg_inf = torch.full_like(lp, -math.inf)
        lp = torch.where(pos_x, lp, neg_inf)
        lp = torch.where(zero_b, torch.where(x == 0, torch.zeros_like(lp), neg_inf), lp)
        return lp.to(out_dtype)

    def sample(self, sample_shape: torch.Size = torch.Size(), generator: torch.Generator | None = None) -> Tensor:
        """Exact draws via ``polyagamma.random_polyagamma`` (default hybrid method), seeded from torch's RNG."""
        from polyagamma import random_polyagamma

        shape = self._extended_shape(torch.Size(sample_shape))
        with torch.no_grad():
            b = np.ascontiguousarray(self.b.detach().expand(shape).to("cpu", torch.float64).numpy()).ravel()
            c = np.ascontiguousarray(self.c.detach().expand(shape).to("cpu", torch.float64).numpy()).ravel()
            rng = numpy_generator(generator)
            out = np.zeros(b.shape, dtype=np.float64)
            pos = b > 0
            if pos.any():
                out[pos] = random_polyagamma(h=b[pos], z=np.abs(c[pos]), random_state=rng)
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
