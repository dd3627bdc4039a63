r"""The exponentially tilted inverse Gamma law :math:`p_r(\omega)\propto e^{-r\omega}\,\mathrm{InvGamma}(\omega\mid
\nu, b)`, i.e. the generalised inverse Gaussian :math:`\mathrm{GIG}(-\nu, 2r, 2b)`, for :math:`\nu\in\{\tfrac12,
\tfrac32\}`, with exact draws.

It is the full conditional (and the optimal variational factor) of the mixing variable of the Laplace,
hinge-loss and Matérn-3/2 augmentations (:class:`~gpytorch_augment.likelihoods.InverseGammaMixing`).

Exact draws for :math:`\nu = \tfrac32`
-------------------------------------
Write :math:`\mathrm{GIG}(p, A, B)` for the density :math:`\propto x^{p-1}e^{-(Ax + B/x)/2}` on :math:`x > 0`. Two
facts give a sampler from inverse-Gaussian and Gamma draws only:

1. :math:`\mathrm{GIG}(p, A, B) = \mathrm{GIG}(-p, A, B) * \mathrm{Ga}(p, A/2)` (a convolution, :math:`p > 0`): the
   Laplace transform of :math:`\mathrm{GIG}(p, A, B)` is :math:`(A/(A+2s))^{p/2}K_p(\sqrt{B(A+2s)})/K_p(\sqrt{AB})`,
   :math:`K_{-p} = K_p`, and the Gamma factor supplies :math:`(A/(A+2s))^{p}`.
2. :math:`\mathrm{GIG}(p + 1, A, B)` is :math:`\mathrm{GIG}(p, A, B)` size-biased (density times :math:`x`), and
   the size-biased law of a sum :math:`X + Y` of independent terms is, with probability
   :math:`E X/(E X + E Y)`, (:math:`X` size-biased) :math:`+\,Y`, otherwise :math:`X +{}` (:math:`Y` size-biased).

With :math:`X\sim\mathrm{GIG}(-\tfrac12, A, B) = \mathrm{IG}(\sqrt{B/A}, B)` and :math:`Y\sim\mathrm{Ga}(\tfrac12,
A/2)`, fact 1 gives :math:`\mathrm{GIG}(\tfrac12) = X + Y` and fact 2 then :math:`\mathrm{GIG}(\tfrac32) = X' +
\mathrm{Ga}(1, A/2)` with probability :math:`w = \sqrt{AB}/(1 + \sqrt{AB})`, else :math:`X + \mathrm{Ga}(\tfrac32,
A/2)` (the size-biased IG is :math:`\mathrm{GIG}(\tfrac12) = X' + Y'`, two half-Gamma terms make
:math:`\mathrm{Ga}(1)`; the size-biased :math:`\mathrm{Ga}(\tfrac12)` is :math:`\mathrm{Ga}(\tfrac32)`). Finally
:math:`1/\omega\sim\mathrm{GIG}(\tfrac32, 2b, 2r)` when :math:`\omega\sim\mathrm{GIG}(-\tfrac32, 2r, 2b)`, so with
:math:`z = 2\sqrt{br}`:

.. math::
    \frac1\omega = X + \frac{G}{b}, \qquad X\sim\mathrm{IG}\Big(\sqrt{r/b},\ 2r\Big),\qquad
    G\sim\mathrm{Ga}(1, 1)\ \text{w.p.}\ \frac{z}{1 + z},\ \text{else}\ \mathrm{Ga}(\tfrac32, 1),

one normal, two uniforms and one standard-Gamma variate per draw (:math:`X = 0` at :math:`r = 0`, where the law is
the inverse Gamma itself). For :math:`\nu = \tfrac12` the law is the inverse Gaussian
:math:`\mathrm{IG}(\sqrt{b/r}, 2b)`.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributions import Distribution, constraints
from torch.distributions.utils import broadcast_all

from .._random import draw_device
from .auxiliary import NotReparameterized
from .inverse_gaussian import InverseGamma, InverseGaussian

__all__ = ["TiltedInverseGamma"]


class TiltedInverseGamma(NotReparameterized, Distribution):
    r"""The law :math:`p_r(\omega) = e^{-r\omega}\,\mathrm{InvGamma}(\omega\mid\nu, b)/\varphi_\nu(r)` =
    :math:`\mathrm{GIG}(-\nu, 2r, 2b)` for :math:`\nu\in\{\tfrac12,\tfrac32\}` (shape :math:`\nu`, rate :math:`b`,
    tilt :math:`r\ge0`), with

    .. math::
        \varphi_{1/2}(r) = e^{-z},\qquad \varphi_{3/2}(r) = (1 + z)e^{-z},\qquad z = 2\sqrt{br},

    :math:`E\omega = -(\log\varphi_\nu)'(r)` (:math:`\sqrt{b/r}` and :math:`2b/(1 + z)`) and
    :math:`\operatorname{Var}\omega = (\log\varphi_\nu)''(r)` (:math:`4b^2/z^3` and :math:`4b^2/(z(1+z)^2)`).
    :meth:`log_prob` is :math:`\log\mathrm{InvGamma}(\omega\mid\nu,b) - r\omega - \log\varphi_\nu(r)` (exact);
    :meth:`sample` is exact (the module docstring derives the :math:`\nu = \tfrac32` sampler).

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions import TiltedInverseGamma
        >>> law = TiltedInverseGamma(1.5, torch.tensor(0.75, dtype=torch.float64),
        ...                          torch.tensor([0.5, 4.0], dtype=torch.float64))
        >>> law.mean                                             # 2b / (1 + 2 sqrt(b r))
        tensor([0.6742, 0.3360], dtype=torch.float64)
        >>> draws = law.sample((20000,), generator=torch.Generator().manual_seed(0))
        >>> bool(((draws.mean(0) - law.mean).abs() < 5 * (law.variance / 20000).sqrt()).all())
        True

    :param concentration: :math:`\nu`, 0.5 or 1.5.
    :param rate: :math:`b > 0`.
    :param tilt: :math:`r \ge 0`.
    :raises ValueError: naming ``concentration`` if it is neither 0.5 nor 1.5.
    """

    arg_constraints = {"rate": constraints.positive, "tilt": constraints.nonnegative}
    support = constraints.positive
    has_rsample = False

    def __init__(
        self, concentration: float, rate: Tensor | float, tilt: Tensor | float, validate_args: bool | None = None
    ) -> None:
        if concentration not in (0.5, 1.5):
            raise ValueError(f"concentration must be 0.5 or 1.5 (closed-form Bessel K); got {concentration!r}")
        self.concentration = float(concentration)
        self.rate, self.tilt = broadcast_all(rate, tilt)
        super().__init__(self.rate.shape, validate_args=validate_args)

    def expand(self, batch_shape: torch.Size, _instance: TiltedInverseGamma | None = None) -> TiltedInverseGamma:
        shape = torch.Size(batch_shape)
        return TiltedInverseGamma(
            self.concentration, self.rate.expand(shape), self.tilt.expand(shape), validate_args=False
        )

    def _z(self) -> Tensor:
        return 2 * torch.sqrt(self.rate * self.tilt)

    def log_laplace(self) -> Tensor:
        r""":math:`\log\varphi_\nu(r)`, the log-normaliser of the tilt."""
        z = self._z()
        return -z if self.concentration == 0.5 else torch.log1p(z) - z

    @property
    def mean(self) -> Tensor:
        if self.concentration == 0.5:
            return torch.sqrt(self.rate / self.tilt)
        return 2 * self.rate / (1 + self._z())

    @property
    def variance(self) -> Tensor:
        z, b = self._z(), self.rate
        if self.concentration == 0.5:
            return 4 * b**2 / z**3
        return 4 * b**2 / (z * (1 + z) ** 2)

    def log_prob(self, value: Tensor | float) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        value = torch.as_tensor(value, dtype=self.rate.dtype, device=self.rate.device)
        prior = InverseGamma(torch.full_like(self.rate, self.concentration), self.rate, validate_args=False)
        return prior.log_prob(value) - self.tilt * value - self.log_laplace()

    @torch.no_grad()
    def sample(self, sample_shape: torch.Size = torch.Size(), generator: torch.Generator | None = None) -> Tensor:
        """Exact draws, reproducible with ``generator`` (or the global torch seed)."""
        shape = self._extended_shape(torch.Size(sample_shape))
        b, r = self.rate.expand(shape), self.tilt.expand(shape)
        if self.concentration == 0.5:
            return InverseGaussian(torch.sqrt(b / r), 2 * b, validate_args=False).sample(generator=generator)
        tiny = torch.finfo(r.dtype).tiny
        positive = r > 0
        r_safe = torch.where(positive, r, torch.ones_like(r))
        x = InverseGaussian(torch.sqrt(r_safe / b), 2 * r_safe, validate_args=False).sample(generator=generator)
        x = torch.where(positive, x, torch.zeros_like(x))
        device = draw_device(generator, r.device)
        u = torch.rand(shape, dtype=r.dtype, device=device, generator=generator).to(r.device)
        z = 2 * torch.sqrt(b * r)
        shape_g = torch.where(u * (1 + z) < z, 1.0, 1.5).to(r.dtype)  # Ga(1) w.p. z / (1 + z), else Ga(3/2)
        g = torch._standard_gamma(shape_g.to(device), generator=generator).to(r.device)
        return (1 / (x + g / b)).clamp_min(tiny)
