r"""The normal--Laplace convolution: the predictive distribution of the Laplace likelihood."""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.distributions import Distribution, Laplace, constraints
from torch.distributions.utils import broadcast_all

__all__ = ["NormalLaplace"]

_SQRT2 = math.sqrt(2.0)


class NormalLaplace(Distribution):
    r"""The predictive of the Laplace likelihood: :math:`y = f + \epsilon`, :math:`f \sim \mathcal N(m, s)`,
    :math:`\epsilon \sim \mathrm{Laplace}(0, \beta)` (the normal--Laplace convolution). With :math:`d = y - m`,

    .. math::
        p(y) = \frac{e^{s/(2\beta^2)}}{4\beta}\Big[e^{-d/\beta}\operatorname{erfc}\frac{s/\beta - d}{\sqrt{2s}}
        + e^{d/\beta}\operatorname{erfc}\frac{s/\beta + d}{\sqrt{2s}}\Big],

    evaluated in log space: a term with a positive erfc argument :math:`a` is written
    :math:`\log\operatorname{erfcx}(a) - d^2/(2s)`, so nothing overflows for large :math:`|d|`.
    Mean :math:`m`, variance :math:`s + 2\beta^2`.

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions import NormalLaplace
        >>> f64 = {"dtype": torch.float64}
        >>> d = NormalLaplace(torch.zeros(3, **f64), torch.full((3,), 0.5, **f64), torch.ones(3, **f64))
        >>> bool(torch.isfinite(d.log_prob(torch.tensor([0.0, 1.0, 200.0], **f64))).all())  # no overflow far out
        True
        >>> d.sample((2,)).shape
        torch.Size([2, 3])
    """

    arg_constraints = {
        "loc": constraints.real,
        "normal_scale": constraints.nonnegative,
        "laplace_scale": constraints.positive,
    }
    support = constraints.real
    has_rsample = True

    def __init__(
        self, loc: Tensor, normal_scale: Tensor, laplace_scale: Tensor, validate_args: bool | None = None
    ) -> None:
        self.loc, self.normal_scale, self.laplace_scale = broadcast_all(loc, normal_scale, laplace_scale)
        super().__init__(self.loc.shape, validate_args=validate_args)

    @property
    def mean(self) -> Tensor:
        return self.loc

    @property
    def variance(self) -> Tensor:
        return self.normal_scale**2 + 2 * self.laplace_scale**2

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:
        shape = self._extended_shape(torch.Size(sample_shape))
        normal = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + self.normal_scale * normal + Laplace(0.0, self.laplace_scale).rsample(sample_shape)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        beta = self.laplace_scale
        var = (self.normal_scale**2).clamp_min(torch.finfo(self.loc.dtype).tiny)
        sd = var.sqrt()
        d = value - self.loc

        def log_term(sign: float) -> Tensor:  # log[e^{s/2b^2 + sign d/b} erfc((s/b + sign d)/sqrt(2s))]
            a = (var / beta + sign * d) / (sd * _SQRT2)
            positive = torch.special.erfcx(a.clamp_min(0)).log() - d**2 / (2 * var)
            negative = var / (2 * beta**2) + sign * d / beta + torch.special.erfc(a.clamp_max(0)).log()
            return torch.where(a > 0, positive, negative)

        return torch.logaddexp(log_term(-1.0), log_term(1.0)) - torch.log(4 * beta)

    def cdf(self, value: Tensor) -> Tensor:
        r""":math:`P(y \le v) = \Phi(z) - \tfrac12\phi(z)\,[R(a - z) - R(a + z)]` (Reed and Jorgensen, 2004, *The
        double Pareto-lognormal distribution*), :math:`z = d/\sqrt s`, :math:`a = \sqrt s/\beta`, with Mills' ratio
        :math:`R(x) = (1 - \Phi(x))/\phi(x)`; each :math:`\phi(z)R(\cdot)` is taken through ``erfcx`` where its
        argument is positive and as :math:`\tfrac12\mathrm{erfc}(\cdot)\,e^{a(a \mp 2z)/2}` otherwise, so neither
        overflows (:math:`s \to 0` gives the Laplace CDF)."""
        if self._validate_args:
            self._validate_sample(value)
        sd = self.normal_scale.clamp_min(torch.finfo(self.loc.dtype).tiny)
        z = (value - self.loc) / sd
        a = sd / self.laplace_scale

        def phi_mills(sign: float) -> Tensor:  # phi(z) R(a + sign z)
            u = (a + sign * z) / _SQRT2
            positive = 0.5 * torch.special.erfcx(u.clamp_min(0)) * torch.exp(-(z**2) / 2)
            negative = 0.5 * torch.special.erfc(u.clamp_max(0)) * torch.exp(a * (a + 2 * sign * z) / 2)
            return torch.where(u > 0, positive, negative)

        return (torch.special.ndtr(z) - 0.5 * (phi_mills(-1.0) - phi_mills(1.0))).clamp(0.0, 1.0)
