r"""Matérn-3/2 robust regression: an instance of the generic augmentation
:class:`~gpytorch_augment.likelihoods.LaplaceTransformLikelihood` with the mixing law
:math:`\mathrm{InvGamma}(\tfrac32, \tfrac14)` (:doc:`/maths/generic`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor
from torch.distributions import Categorical

from .._numerics import QuadratureMixture, log_normal_matern32, split_gauss_legendre
from ..distributions.matern import MaternThreeHalves
from ._constants import PositiveConstant, register_positive_constant
from .laplace_transform import LaplaceTransformLikelihood
from .mixing_laws import InverseGammaMixing

__all__ = ["MaternThreeHalvesLikelihood"]

_SQRT3 = math.sqrt(3.0)


class MaternThreeHalvesLikelihood(LaplaceTransformLikelihood):
    r"""Robust regression with Matérn-3/2 noise (:doc:`/maths/generic`):

    .. math::
        p(y\mid f) = \frac a4\,\big(1 + a|y - f|\big)\,e^{-a|y - f|}, \qquad a = \frac{\sqrt3}{\rho},

    a density in :math:`y` (:class:`~gpytorch_augment.distributions.MaternThreeHalves`) with variance
    :math:`\tfrac43\rho^2`, log-concave, smooth at :math:`y = f` and with exponential tails. With
    :math:`r = a^2(y - f)^2` and :math:`z = 2\sqrt{r/4} = a|y - f|`, :math:`(1 + z)e^{-z} = \varphi(r)` is the
    Laplace transform of :math:`\omega\sim\mathrm{InvGamma}(\tfrac32, \tfrac14)`
    (:class:`~gpytorch_augment.likelihoods.InverseGammaMixing`), so

    .. math::
        p(y, \omega\mid f) = \frac a4\, e^{-a^2(y - f)^2\omega}\,\mathrm{InvGamma}(\omega\mid\tfrac32,\tfrac14),
        \qquad h = 2a^2\omega y,\quad \lambda = 2a^2\omega,

    i.e. :math:`\log C = \log\frac a4`, :math:`g = 0`, :math:`\alpha = a^2y^2`, :math:`\beta = 2a^2y`,
    :math:`\gamma = a^2` in the generic form.

    * Gibbs: :math:`\omega\mid y, f\sim\mathrm{GIG}(-\tfrac32, 2a^2(y - f)^2, \tfrac12)`, drawn exactly
      (:class:`~gpytorch_augment.distributions.TiltedInverseGamma`).
    * CAVI: :math:`q(\omega_i) = \mathrm{GIG}(-\tfrac32, 2\tilde r_i, \tfrac12)`, :math:`\tilde r_i =
      a^2 d_i^2`, :math:`d_i = \sqrt{(y_i - m_i)^2 + s_i}`; :math:`\bar\lambda_i = 2a^2 E\omega_i =
      a^2/(1 + a d_i)` and :math:`\ell^*_i = \log\frac a4 + \log(1 + a d_i) - a d_i`.
    * :math:`\rho` is a GPyTorch parameter (``raw_scale``), learnt by gradients of the augmented ELBO
      (``CAVI.fit(..., learn_hyperparameters=True)``, :class:`~gpytorch_augment.AugmentedELBO`).
    * Predictive: :meth:`marginal` is the Gauss--Hermite mixture of the noise law over :math:`q(f_*)`, mean
      :math:`m_*` and variance :math:`s_* + \tfrac43\rho^2`, except that its ``log_prob`` is the exact density of
      :math:`y_* = f_* + \epsilon` (the integral split at the kink :math:`y = f` and each side done in closed form,
      :func:`~gpytorch_augment._numerics.log_normal_matern32`); :meth:`log_marginal` is the same closed form and
      :meth:`expected_log_prob` integrates each side of the kink by Gauss--Legendre panels
      (:func:`~gpytorch_augment._numerics.split_gauss_legendre`): Gauss--Hermite on the kinked integrand would be
      off by tenths of a nat once :math:`s` is a few times :math:`\rho^2`.

    AugmentedGaussianProcesses.jl's ``Matern3_2Likelihood(ρ)`` is the same model (its local update
    :math:`\theta = 3/(2\sqrt3\,c\rho + 2\rho^2)` is :math:`\bar\lambda/2` here, its predictive variance
    :math:`\sigma^2 + 4\rho^2/3` is the same), but its ``pdf`` multiplies by :math:`4\rho/\sqrt3 = 4/a`, the
    reciprocal of the normalising constant :math:`a/4` used here.

    Example::

        >>> import torch
        >>> from gpytorch_augment import CAVI, MaternThreeHalvesLikelihood
        >>> from gpytorch_augment.testing import make_cavi_model
        >>> x = torch.linspace(-3, 3, 40, dtype=torch.float64).unsqueeze(-1)
        >>> y = torch.sin(2 * x.squeeze(-1)) + 4.0 * (torch.arange(40) % 10 == 5)     # four outliers
        >>> likelihood = MaternThreeHalvesLikelihood(scale=0.3).double()
        >>> model = make_cavi_model(1, x[::3].clone()).double()
        >>> trace = CAVI(model, likelihood, num_data=40).fit(x, y, max_iter=30)
        >>> trace.elbo[-1] > trace.elbo[0]
        True
        >>> q_f = model(x[:3])
        >>> predictive = likelihood(q_f)                                # variance s + 4 rho^2 / 3
        >>> torch.allclose(predictive.variance, q_f.variance + 4 * 0.3**2 / 3)
        True

    :param scale: the lengthscale :math:`\rho > 0` of the Matérn-3/2 shape.
    :param learn_scale: whether :math:`\rho` is trained by gradients.
    :param batch_shape: batch shape of :math:`\rho` (as in GPyTorch's ``GaussianLikelihood``).
    :raises ValueError: naming ``scale`` if it is not a positive finite number.
    """

    augmentation = "GIG(−3/2) scale mixture (generic augmentation)"
    maths_page = "generic"

    def __init__(
        self, scale: float | Tensor = 1.0, learn_scale: bool = True, batch_shape: torch.Size = torch.Size()
    ) -> None:
        super().__init__(InverseGammaMixing(1.5, rate=0.25), real_valued_targets=True)
        self.learn_scale = learn_scale
        register_positive_constant(self, "scale", scale, batch_shape, requires_grad=learn_scale)

    scale = PositiveConstant(r"The Matérn lengthscale :math:`\rho`, shape ``(*batch_shape, 1)``.")

    def _a(self) -> Tensor:
        return _SQRT3 / self.scale

    def coefficients(self, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        r""":math:`(\log\frac a4, 0, a^2y^2, 2a^2y, a^2)`."""
        a = self._a().to(y.dtype)
        a2 = a * a
        return torch.log(a / 4), torch.zeros_like(a), a2 * y * y, 2 * a2 * y, a2

    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        r""":math:`\log\frac a4 + \log(1 + a|y - f|) - a|y - f|`."""
        a = self._a().to(f.dtype)
        distance = a * (y - f).abs()
        return torch.log(a / 4) + torch.log1p(distance) - distance

    def _target_distribution(self) -> Callable[[Tensor], MaternThreeHalves]:
        return lambda f: MaternThreeHalves(f, self.scale.to(f.dtype))

    def marginal(self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> Any:
        r"""The predictive :math:`\sum_k w_k\,p(y\mid f_k)` over Gauss--Hermite nodes of :math:`q(f)` (moments, CDF,
        draws), whose ``log_prob`` is the exact :math:`\log\int p(y\mid f)\,q(f)\,df`."""
        nodes, weights = self._quadrature(function_dist)
        scale = self.scale.unsqueeze(-1)  # (*batch, 1, 1): one per datum and node
        f = nodes.movedim(0, -1)
        mixing = Categorical(probs=weights.expand_as(nodes).movedim(0, -1))
        return _MaternPredictive(
            mixing, MaternThreeHalves(f, scale.to(f.dtype)), function_dist.mean, function_dist.variance, self._a()
        )

    def log_marginal_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        r""":math:`\log\int p(y_i\mid f_i)\,q(f_i)\,df_i` in closed form, per datum."""
        a = self._a().to(y.dtype)
        return log_normal_matern32(y - function_dist.mean, function_dist.variance, a)

    def expected_log_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        r""":math:`E_{q(f_i)}\log p(y_i\mid f_i)`, per datum: :math:`E|y - f|` in closed form and
        :math:`E\log(1 + a|y - f|)` by Gauss--Legendre panels on each side of the kink."""
        a = self._a().to(y.dtype)
        d, var = y - function_dist.mean, function_dist.variance.clamp_min(torch.finfo(y.dtype).tiny)
        abs_residual = (2 * var / math.pi).sqrt() * torch.exp(-(d**2) / (2 * var)) + d * torch.erf(d / (2 * var).sqrt())
        nodes, weights = split_gauss_legendre(d, var)
        log1p = (weights * torch.log1p(a * nodes.abs())).sum(0)
        return torch.log(a / 4) + log1p - a * abs_residual


class _MaternPredictive(QuadratureMixture):
    r"""The Gauss--Hermite predictive mixture with the exact log-density of :math:`y = f + \epsilon`."""

    def __init__(
        self, mixing: Categorical, component: MaternThreeHalves, mean: Tensor, variance: Tensor, a: Tensor
    ) -> None:
        super().__init__(mixing, component, validate_args=False)
        self._latent_mean, self._latent_variance, self._rate = mean, variance, a

    def log_prob(self, x: Tensor) -> Tensor:
        x = torch.as_tensor(x, dtype=self._latent_mean.dtype, device=self._latent_mean.device)
        return log_normal_matern32(x - self._latent_mean, self._latent_variance, self._rate.to(x.dtype))
