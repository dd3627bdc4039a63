r"""The predictive distribution of the Student-t likelihood under a Gaussian latent."""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.distributions import Distribution, Normal, StudentT, constraints
from torch.distributions.utils import broadcast_all

from .._numerics import LOG_GRID_TAIL, log_trapezoid

__all__ = ["StudentTPredictive"]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class StudentTPredictive(Distribution):
    r"""The predictive :math:`p(y) = \int t_\nu(y\mid f, \sigma)\,\mathcal N(f\mid m, s)\,df` of the Student-t
    likelihood.

    :meth:`log_prob` integrates the scale mixture
    :math:`p(y) = \int \mathcal N(y\mid m, s + \omega^{-1})\,
    \mathrm{Ga}(\omega\mid\tfrac\nu2, \tfrac{\nu\sigma^2}2)\,d\omega` by the trapezoid rule in
    :math:`\log\omega`, in log space (relative error ~1e-13 for any :math:`\sigma/\sqrt s` and residual,
    measured against adaptive quadrature). A Gauss--Hermite mixture of t densities over :math:`f` is not used:
    with 32 nodes it is off by 0.04 nats at :math:`\sigma = 0.3\sqrt s` and by 1--5 nats at
    :math:`\sigma = 0.03\sqrt s`, where the t density is narrower than the node spacing. :attr:`mean` and
    :attr:`variance` are exact, :math:`m` and :math:`s + \nu\sigma^2/(\nu - 2)` (``nan``/``inf`` where the t moments
    do not exist); :meth:`sample` draws :math:`f\sim\mathcal N(m, s)`, then :math:`y\sim t_\nu(f, \sigma)`.

    :param df: degrees of freedom :math:`\nu`.
    :param loc: latent mean :math:`m`.
    :param variance: latent variance :math:`s`.
    :param scale: t scale :math:`\sigma`.

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions import StudentTPredictive
        >>> f64 = {"dtype": torch.float64}
        >>> d = StudentTPredictive(torch.tensor(4.0, **f64), torch.tensor(0.0, **f64), torch.tensor(1.0, **f64),
        ...                        torch.tensor(0.5, **f64))
        >>> round(float(d.variance), 6)                     # s + nu sigma^2 / (nu - 2)
        1.5
        >>> bool(torch.isfinite(d.log_prob(torch.tensor([0.0, 3.0], **f64))).all()), d.sample((5,)).shape
        (True, torch.Size([5]))
    """

    arg_constraints = {
        "df": constraints.positive,
        "loc": constraints.real,
        "variance_f": constraints.nonnegative,
        "scale": constraints.positive,
    }
    support = constraints.real

    def __init__(
        self, df: Tensor, loc: Tensor, variance: Tensor, scale: Tensor, validate_args: bool | None = None
    ) -> None:
        self.df, self.loc, self.variance_f, self.scale = broadcast_all(df, loc, variance, scale)
        super().__init__(self.loc.shape, validate_args=validate_args)

    @property
    def mean(self) -> Tensor:
        return torch.where(self.df > 1, self.loc, torch.nan)

    @property
    def variance(self) -> Tensor:
        return self.variance_f + StudentT(self.df, torch.zeros_like(self.loc), self.scale).variance

    def sample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:
        with torch.no_grad():
            f = Normal(self.loc, self.variance_f.clamp_min(0).sqrt()).sample(sample_shape)
            return StudentT(self.df, f, self.scale).sample()

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        a0 = self.df / 2
        alpha, b0, s = a0 + 0.5, self.df * self.scale**2 / 2, self.variance_f.clamp_min(0)
        d2 = (value - self.loc) ** 2
        hi = torch.log((alpha + 2 * LOG_GRID_TAIL) / b0)
        lo = torch.minimum(torch.log(alpha / (b0 + d2 / 2)), hi - 1.0) - LOG_GRID_TAIL / alpha - 5.0

        def log_integrand(u: Tensor) -> Tensor:  # log[Ga(e^u | a0, b0) e^u N(y | m, s + e^-u)]
            v = s + torch.exp(-u)
            log_gamma = a0 * (b0.log() + u) - b0 * u.exp() - torch.lgamma(a0)
            return log_gamma - _HALF_LOG_2PI - 0.5 * v.log() - d2 / (2 * v)

        return log_trapezoid(log_integrand, lo, hi)

    def cdf(self, value: Tensor) -> Tensor:
        r""":math:`P(y \le v) = \int \mathrm{Ga}(\tau\mid\frac\nu2, \frac{\nu\sigma^2}2)\,
        \Phi\big((v - m)/\sqrt{s + 1/\tau}\big)\,d\tau` (the Student-t as a scale mixture of normals, the latent
        integrated exactly), by the trapezoid rule in :math:`\log\tau` as :meth:`log_prob`."""
        if self._validate_args:
            self._validate_sample(value)
        a0, b0, s = self.df / 2, self.df * self.scale**2 / 2, self.variance_f.clamp_min(0)
        d = value - self.loc
        hi = torch.log((a0 + 2 * LOG_GRID_TAIL) / b0)
        lo = torch.minimum(torch.log(a0 / b0), hi - 1.0) - LOG_GRID_TAIL / a0 - 5.0
        lo, hi, d = torch.broadcast_tensors(lo, hi, d)

        below = -d.abs()  # the smaller tail, P(y <= v) or P(y > v), where it is resolved in float

        def log_integrand(u: Tensor) -> Tensor:  # log[Ga(e^u | a0, b0) e^u Phi(-|d| / sqrt(s + e^-u))]
            log_gamma = a0 * (b0.log() + u) - b0 * u.exp() - torch.lgamma(a0)
            return log_gamma + torch.special.log_ndtr(below / (s + torch.exp(-u)).sqrt())

        tail = log_trapezoid(log_integrand, lo, hi).exp()
        return torch.where(d <= 0, tail, 1 - tail).clamp(0.0, 1.0)
