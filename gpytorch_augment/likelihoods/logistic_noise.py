r"""Regression with logistic noise: an instance of the generic augmentation
:class:`~gpytorch_augment.likelihoods.LaplaceTransformLikelihood` with the Pólya-Gamma mixing law
:math:`\mathrm{PG}(2, 0)`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.distributions import AffineTransform, SigmoidTransform, TransformedDistribution, Uniform, constraints

from ._constants import PositiveConstant, register_positive_constant
from .laplace_transform import LaplaceTransformLikelihood
from .mixing_laws import PolyaGammaMixing

__all__ = ["LogisticDistribution", "LogisticNoiseLikelihood"]


class LogisticDistribution(TransformedDistribution):
    r"""The logistic distribution of location :math:`\mu` and scale :math:`s`: :math:`y = \mu + s\,\mathrm{logit}
    (u)`, :math:`u\sim\mathcal U(0, 1)`; mean :math:`\mu`, variance :math:`\pi^2 s^2/3` (torch has no such class).

    Example::

        >>> import torch
        >>> from gpytorch_augment.likelihoods.logistic_noise import LogisticDistribution
        >>> law = LogisticDistribution(torch.tensor(0.0), torch.tensor(1.0))
        >>> round(float(law.log_prob(torch.tensor(0.0)).exp()), 6), float(law.cdf(torch.tensor(0.0)))   # 1/4, 1/2
        (0.25, 0.5)
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc: Tensor, scale: Tensor, validate_args: bool | None = None) -> None:
        self.loc, self.scale = torch.broadcast_tensors(loc, scale.to(loc))
        base = Uniform(torch.zeros_like(self.loc), torch.ones_like(self.loc), validate_args=validate_args)
        transforms = [SigmoidTransform().inv, AffineTransform(self.loc, self.scale)]
        super().__init__(base, transforms, validate_args=validate_args)

    @property
    def mean(self) -> Tensor:
        return self.loc

    @property
    def variance(self) -> Tensor:
        return (math.pi * self.scale) ** 2 / 3

    def log_prob(self, value: Tensor) -> Tensor:
        r""":math:`-|z| - \log s - 2\log(1 + e^{-|z|})`, :math:`z = (y - \mu)/s`: finite in both tails."""
        z = ((value - self.loc) / self.scale).abs()
        return -z - self.scale.log() - 2 * torch.log1p(torch.exp(-z))


class LogisticNoiseLikelihood(LaplaceTransformLikelihood):
    r"""Regression with logistic noise of scale :math:`s`:

    .. math::
        p(y\mid f) = \frac{1}{4s}\cosh^{-2}\Big(\frac{y - f}{2s}\Big),

    a smooth, log-concave density with variance :math:`\pi^2 s^2/3` whose tails decay as :math:`e^{-|y - f|/s}`:
    more robust to outliers than Gaussian noise, less than Student-t noise. Since :math:`\cosh^{-b}\sqrt{r/2}` is the
    Laplace transform of the Pólya-Gamma law :math:`\mathrm{PG}(b, 0)`, the density with :math:`b = 2` and
    :math:`r = (y - f)^2/2s^2` is a Gaussian scale mixture (Polson, Scott and Windle, 2013):

    .. math::
        p(y, \omega\mid f) = \frac{1}{4s}\,e^{-\omega (y - f)^2/2s^2}\,\mathrm{PG}(\omega\mid 2, 0),
        \qquad h = \omega y/s^2,\quad \lambda = \omega/s^2,

    i.e. :math:`\log C = -\log 4s`, :math:`g = 0`, :math:`\alpha = y^2/2s^2`, :math:`\beta = y/s^2`,
    :math:`\gamma = 1/2s^2` in the generic form.

    * Gibbs: :math:`\omega\mid y, f\sim\mathrm{PG}(2, |y - f|/s)`, drawn exactly.
    * CAVI: :math:`q(\omega_i) = \mathrm{PG}(2, c_i)`, :math:`c_i = \sqrt{(y_i - m_i)^2 + s_i^f}/s`;
      :math:`\bar\lambda_i = \tanh(c_i/2)/(c_i s^2)` and :math:`\ell^*_i = -\log 4s - 2\log\cosh(c_i/2)`.
    * :math:`s` is a GPyTorch parameter (``raw_scale``), learnt by gradients of the augmented ELBO
      (``CAVI.fit(..., learn_hyperparameters=True)``).
    * Predictive: the Gauss--Hermite mixture of :class:`LogisticDistribution` over :math:`q(f_*)` (mean
      :math:`m_*`, variance :math:`s_* + \pi^2 s^2/3`), with ``predictive_cdf``, ``predictive_quantile`` and
      ``predictive_interval``.

    Example::

        >>> import torch
        >>> from gpytorch_augment import CAVI, LogisticNoiseLikelihood
        >>> from gpytorch_augment.testing import make_cavi_model
        >>> x = torch.linspace(-3, 3, 40, dtype=torch.float64).unsqueeze(-1)
        >>> y = torch.sin(2 * x.squeeze(-1)) + 4.0 * (torch.arange(40) % 10 == 5)     # four outliers
        >>> likelihood = LogisticNoiseLikelihood(scale=0.2).double()
        >>> model = make_cavi_model(1, x[::3].clone()).double()
        >>> trace = CAVI(model, likelihood, num_data=40).fit(x, y, max_iter=30)
        >>> trace.elbo[-1] > trace.elbo[0]
        True
        >>> q_f = model(x[:3])
        >>> torch.allclose(likelihood(q_f).variance, q_f.variance + (torch.pi * 0.2) ** 2 / 3)
        True

    :param scale: the scale :math:`s > 0` of the noise.
    :param learn_scale: whether :math:`s` is trained by gradients.
    :param batch_shape: batch shape of :math:`s` (as in GPyTorch's ``GaussianLikelihood``).
    :raises ValueError: naming ``scale`` if it is not a positive finite number.
    """

    augmentation = "Pólya-Gamma scale mixture, PG(2, 0)"

    def __init__(
        self, scale: float | Tensor = 1.0, learn_scale: bool = True, batch_shape: torch.Size = torch.Size()
    ) -> None:
        super().__init__(PolyaGammaMixing(2.0), real_valued_targets=True)
        self.learn_scale = learn_scale
        register_positive_constant(self, "scale", scale, batch_shape, requires_grad=learn_scale)

    scale = PositiveConstant(r"The noise scale :math:`s`, shape ``(*batch_shape, 1)``.")

    def coefficients(self, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        r""":math:`(-\log 4s, 0, y^2/2s^2, y/s^2, 1/2s^2)`."""
        s = self.scale.to(y.dtype)
        gamma = 1 / (2 * s * s)
        return -torch.log(4 * s), torch.zeros_like(s), gamma * y * y, 2 * gamma * y, gamma

    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        r"""The logistic log-density (:meth:`LogisticDistribution.log_prob`, not the transform)."""
        return LogisticDistribution(f, self.scale.to(f.dtype)).log_prob(y)

    def _target_distribution(self) -> Callable[[Tensor], LogisticDistribution]:
        return lambda f: LogisticDistribution(f, self.scale.to(f.dtype))
