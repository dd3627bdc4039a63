r"""The inverse Gaussian distribution :math:`\mathrm{IG}(\mu, \kappa)` (mean, shape), used by the Laplace
augmentation (:doc:`/maths/robust`), the inverse Gamma prior of that augmentation, and the KL divergence
between them.

torch ships :class:`torch.distributions.InverseGamma` (concentration, rate), but as a transformed Gamma its
``log_prob`` adds :math:`\log|{-y/x}| = -2\log x` computed as the log of :math:`x^{-2}`, which overflows to
``+inf`` below :math:`x\approx10^{-154}` (float64; :math:`10^{-19}` in float32). :class:`InverseGamma` here
reuses torch's class and only replaces ``log_prob`` by the closed form.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.distributions import Distribution, constraints
from torch.distributions import InverseGamma as _TorchInverseGamma
from torch.distributions.kl import register_kl
from torch.distributions.utils import broadcast_all

from .._random import draw_device
from .auxiliary import NotReparameterized

__all__ = ["InverseGamma", "InverseGaussian"]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class InverseGamma(_TorchInverseGamma):
    r"""torch's inverse Gamma, :math:`\frac{b^a}{\Gamma(a)} x^{-a-1} e^{-b/x}` (concentration :math:`a`, rate
    :math:`b`), with a ``log_prob`` that stays finite for tiny :math:`x` (see the module docstring).

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions import InverseGamma
        >>> d = InverseGamma(torch.tensor(3.0, dtype=torch.float64), torch.tensor(4.0, dtype=torch.float64))
        >>> float(d.mean)                                   # rate / (concentration - 1)
        2.0
        >>> bool(torch.isfinite(d.log_prob(torch.tensor(1e-300, dtype=torch.float64))))
        True
    """

    def expand(self, batch_shape: torch.Size, _instance: InverseGamma | None = None) -> InverseGamma:
        return super().expand(batch_shape, _instance=self._get_checked_instance(InverseGamma, _instance))

    def log_prob(self, value: Tensor | float) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        a, b = self.concentration, self.rate
        value = torch.as_tensor(value, dtype=b.dtype, device=b.device)
        return torch.xlogy(a, b) - torch.lgamma(a) - (a + 1) * value.log() - b / value


class InverseGaussian(NotReparameterized, Distribution):
    r"""Inverse Gaussian (Wald) distribution with mean :math:`\mu > 0` and shape :math:`\kappa > 0`:

    .. math::
        \mathrm{IG}(x \mid \mu, \kappa) = \sqrt{\frac{\kappa}{2\pi x^3}}\,
        \exp\!\Big(-\frac{\kappa (x - \mu)^2}{2 \mu^2 x}\Big), \qquad x > 0,

    the parametrisation of NumPy's ``Generator.wald(mean, scale)`` and of :math:`\mathrm{GIG}(-\tfrac12,
    \kappa/\mu^2, \kappa)`. Mean :math:`\mu`, variance :math:`\mu^3/\kappa`. :math:`\mu = \infty` is allowed and
    gives the Lévy limit :math:`\mathrm{InvGamma}(\tfrac12, \kappa/2)` (the full conditional of the Laplace
    augmentation when :math:`y = f`).

    Everything is written in terms of :math:`1/\mu`, so nothing cancels or overflows for huge or tiny means:

    * :meth:`log_prob` uses :math:`\kappa(x-\mu)^2/(2\mu^2x) = \kappa(x/\mu - 1)^2/(2x)`;
    * :meth:`sample` is the Michael--Schucany--Haas transformation (one normal and one uniform per draw):
      with :math:`\nu \sim \mathcal N(0,1)`, :math:`a = \nu^2/(2\kappa)`, the smaller root of the quadratic is
      :math:`x_1 = 1/\big(\mu^{-1} + a + \sqrt{a}\sqrt{a + 2\mu^{-1}}\big)` (no cancellation), and the draw is
      :math:`x_1` with probability :math:`\mu/(\mu + x_1)`, otherwise :math:`\mu^2/x_1`;
    * :meth:`cdf` is :math:`\Phi(\sqrt{\kappa/x}(x/\mu - 1)) + e^{2\kappa/\mu}\Phi(-\sqrt{\kappa/x}(x/\mu + 1))`,
      the second term in log space.

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions import InverseGaussian
        >>> q = InverseGaussian(torch.tensor([0.5, 2.0]), torch.tensor(2.0))
        >>> x = q.sample((20000,), generator=torch.Generator().manual_seed(0))
        >>> q.mean, bool(((x.mean(0) - q.mean).abs() < 0.05).all())
        (tensor([0.5000, 2.0000]), True)

    :param mean: :math:`\mu \in (0, \infty]` (tensor or number).
    :param shape: :math:`\kappa > 0`; broadcast against ``mean``. Stored as ``loc`` (:math:`\mu`) and
        ``concentration`` (:math:`\kappa`).
    """

    arg_constraints = {"loc": constraints.positive, "concentration": constraints.positive}
    support = constraints.positive
    has_rsample = False

    def __init__(self, mean: Tensor | float, shape: Tensor | float, validate_args: bool | None = None) -> None:
        self.loc, self.concentration = broadcast_all(mean, shape)
        super().__init__(self.loc.shape, validate_args=validate_args)

    def expand(self, batch_shape: torch.Size, _instance: InverseGaussian | None = None) -> InverseGaussian:
        new = self._get_checked_instance(InverseGaussian, _instance)
        batch_shape = torch.Size(batch_shape)
        new.loc = self.loc.expand(batch_shape)
        new.concentration = self.concentration.expand(batch_shape)
        super(InverseGaussian, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def _inv_mean(self) -> Tensor:
        return self.loc.reciprocal()  # 0 for mu = inf

    @property
    def mean(self) -> Tensor:
        return self.loc

    @property
    def mode(self) -> Tensor:
        c = 1.5 / self.concentration  # mode = mu (sqrt(1 + (c mu)^2) - c mu), without cancellation or inf / inf
        return 1 / (torch.sqrt(self._inv_mean**2 + c**2) + c)

    @property
    def variance(self) -> Tensor:
        return self.loc**3 / self.concentration

    def log_prob(self, value: Tensor | float) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        value = torch.as_tensor(value, dtype=self.loc.dtype, device=self.loc.device)
        kappa = self.concentration
        return (
            0.5 * kappa.log() - _HALF_LOG_2PI - 1.5 * value.log()
            - kappa * (value * self._inv_mean - 1) ** 2 / (2 * value)
        )

    def cdf(self, value: Tensor | float) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        value = torch.as_tensor(value, dtype=self.loc.dtype, device=self.loc.device)
        kappa, inv_mu = self.concentration, self._inv_mean
        root = (kappa / value).sqrt()
        first = torch.special.ndtr(root * (value * inv_mu - 1))
        second = torch.exp(2 * kappa * inv_mu + torch.special.log_ndtr(-root * (value * inv_mu + 1)))
        return (first + second).clamp(0.0, 1.0)

    @torch.no_grad()
    def sample(self, sample_shape: torch.Size = torch.Size(), generator: torch.Generator | None = None) -> Tensor:
        """Michael--Schucany--Haas draws; reproducible with ``generator`` (or the global torch seed)."""
        shape = self._extended_shape(torch.Size(sample_shape))
        mu, kappa = self.loc.expand(shape), self.concentration.expand(shape)
        inv_mu = self._inv_mean.expand(shape)
        device = draw_device(generator, mu.device)  # the generator's device; the draws then move to mu's
        normal = torch.randn(shape, dtype=mu.dtype, device=device, generator=generator).to(mu.device)
        uniform = torch.rand(shape, dtype=mu.dtype, device=device, generator=generator).to(mu.device)
        a = normal**2 / (2 * kappa)
        small_root = 1.0 / (inv_mu + a + a.sqrt() * (a + 2 * inv_mu).sqrt())
        phi = a * mu  # large root mu^2 / x_1 = mu (1 + phi + sqrt(phi (phi + 2)))
        large_root = mu * (1 + phi + phi.sqrt() * (phi + 2).sqrt())
        # accept x_1 with probability mu / (mu + x_1) = 1 / (1 + x_1 / mu)
        keep_small = uniform * (1 + small_root * inv_mu) <= 1
        return torch.where(keep_small, small_root, large_root)


@register_kl(InverseGaussian, _TorchInverseGamma)
def _kl_inverse_gaussian_inverse_gamma(p: InverseGaussian, q: _TorchInverseGamma) -> Tensor:
    r""":math:`\mathrm{KL}(\mathrm{IG}(\mu,\kappa)\Vert\mathrm{InvGamma}(\tfrac12, b))
    = \tfrac12\log\frac{\kappa}{2b} - \tfrac12 + \frac b\mu + \frac b\kappa`.

    Only concentration :math:`\tfrac12` is closed-form (the :math:`\log x` terms of both densities cancel); at
    :math:`\kappa = 2b` it is :math:`b/\mu`, the Laplace auxiliary KL of :doc:`/maths/robust`.
    """
    if not bool((q.concentration == 0.5).all()):
        raise NotImplementedError("KL(InverseGaussian || InverseGamma) is closed-form only for concentration 1/2")
    kappa, b = p.concentration, q.rate
    return 0.5 * torch.log(kappa / (2 * b)) - 0.5 + b * p._inv_mean + b / kappa
