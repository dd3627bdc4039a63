r"""Laplace likelihood (robust regression), augmented with an inverse-Gamma / inverse-Gaussian variable."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor
from torch.distributions import Laplace

from .._numerics import pg_tilt_c
from ..distributions.auxiliary import AuxiliaryDistribution
from ..distributions.inverse_gaussian import InverseGamma, InverseGaussian
from ..distributions.normal_laplace import NormalLaplace
from ._constants import PositiveConstant, register_positive_constant, set_positive_constant
from ._predictive import ContinuousPredictive
from .augmented_likelihood import AugmentedLikelihood, AuxDict

#: residuals are clamped to at least this before dividing (:doc:`/maths/robust`)
MIN_RESIDUAL = 1e-12


class LaplaceLikelihood(ContinuousPredictive, AugmentedLikelihood):
    r"""Robust regression, :math:`p(y \mid f) = \frac1{2\beta} e^{-|y - f|/\beta}` (:doc:`/maths/robust`).

    With :math:`\lambda_L = 1/(4\beta^2)` and :math:`\omega \sim \mathrm{InvGamma}(\tfrac12, \lambda_L)`
    (scale :math:`\lambda_L`), :math:`\int e^{-x^2\omega}\,\mathrm{InvGamma}(\omega\mid\tfrac12,\lambda_L)\,d\omega
    = e^{-|x|/\beta}`, so

    .. math::
        p(y, \omega \mid f) = \frac1{2\beta} e^{-(y - f)^2\omega}\,\mathrm{InvGamma}(\omega\mid\tfrac12,\lambda_L),
        \qquad h = 2\omega y,\quad \lambda = 2\omega,\quad \log C = -\log 2\beta - \omega y^2 .

    * Gibbs: :math:`\omega \mid y, f \sim \mathrm{IG}\big(\tfrac{1}{2\beta|y-f|}, 2\lambda_L\big)` (mean, shape).
    * CAVI: :math:`q(\omega_i) = \mathrm{IG}(\mu_i, 2\lambda_L)`, :math:`\mu_i = 1/(2\beta r_i)`,
      :math:`r_i = \sqrt{(y_i - m_i)^2 + s_i}`; expected log-tilt :math:`-\log2\beta - \mu_i r_i^2`,
      :math:`\mathrm{KL} = \lambda_L/\mu_i`, :math:`\ell^*_i = -\log 2\beta - r_i/\beta`.
    * :meth:`update_hyperparameters`: :math:`\beta \leftarrow \frac1N\sum_i r_i`, the exact maximiser of
      :math:`\sum_i \ell^*_i` given :math:`q(f)`.

    The variational parameter stored in ``q_aux`` is the residual ``{"r": r}`` (the optimal :math:`q(\omega)` is
    indexed by :math:`r` as the Pólya-Gamma one is by :math:`c`); :math:`\mu = 1/(2\beta r)` is formed with the
    *current* :math:`\beta`. So after a :math:`\beta` update, :math:`q(\omega)` is again optimal for the old
    :math:`q(f)` and the new :math:`\beta`, and a CAVI sweep (local step, :math:`\beta` update, global step) is
    exact coordinate ascent on the augmented ELBO. :math:`\beta` is also a GPyTorch parameter
    (``raw_scale`` with a ``Positive`` constraint), learnable through ``AugmentedELBO``.

    The drop-in members are closed form: :meth:`marginal` is the :class:`NormalLaplace` predictive and
    :meth:`expected_log_prob` uses :math:`E|y - f| = \sqrt{2s/\pi}\,e^{-d^2/2s} + d\operatorname{erf}(d/\sqrt{2s})`
    (Gauss--Hermite is poor at the kink of :math:`|y-f|`).

    Example::

        >>> import torch
        >>> from gpytorch.distributions import MultivariateNormal
        >>> from gpytorch_augment import LaplaceLikelihood
        >>> likelihood = LaplaceLikelihood(scale=0.5)
        >>> q_f = MultivariateNormal(torch.zeros(2), 0.1 * torch.eye(2))
        >>> y = torch.tensor([0.3, -1.0])
        >>> likelihood(q_f).log_prob(y).shape                  # the NormalLaplace predictive
        torch.Size([2])
        >>> likelihood.update_hyperparameters(y, None, q_f.mean, q_f.variance)   # β = mean residual
        >>> likelihood.scale
        tensor([0.7423], grad_fn=<SoftplusBackward0>)

    :param scale: the Laplace scale :math:`\beta > 0`.
    :param learn_scale: if ``False``, :math:`\beta` is neither updated by CAVI nor trained by gradients.
    :param batch_shape: batch shape of :math:`\beta` (as in GPyTorch's ``GaussianLikelihood``).
    """

    augmentation = "inverse-Gaussian scale mixture"
    maths_page = "robust"

    real_valued_targets = True

    def __init__(
        self, scale: float | Tensor = 1.0, learn_scale: bool = True, batch_shape: torch.Size = torch.Size()
    ) -> None:
        super().__init__()
        self.learn_scale = learn_scale
        register_positive_constant(self, "scale", scale, batch_shape, requires_grad=learn_scale)

    scale = PositiveConstant(r"The Laplace scale :math:`\beta`, shape ``(*batch_shape, 1)``.")

    def _mu(self, q_aux: AuxDict) -> Tensor:
        return 1.0 / (2 * self.scale * q_aux["r"])

    @staticmethod
    def _residual(y: Tensor, f_mean: Tensor, f_var: Tensor) -> Tensor:
        return pg_tilt_c(y - f_mean, f_var).clamp_min(MIN_RESIDUAL)

    # ------------------------------------------------------------------ drop-in
    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> Laplace:
        return Laplace(function_samples, self.scale)

    def marginal(self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> NormalLaplace:
        return NormalLaplace(function_dist.mean, function_dist.variance.clamp_min(0).sqrt(), self.scale)

    def expected_log_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        r""":math:`E_{q(f_i)}\log p(y_i\mid f_i) = -\log 2\beta - E|y_i - f_i|/\beta` in closed form, per datum."""
        var = function_dist.variance.clamp_min(torch.finfo(y.dtype).tiny)
        d = y - function_dist.mean
        abs_residual = (2 * var / math.pi).sqrt() * torch.exp(-(d**2) / (2 * var)) + d * torch.erf(d / (2 * var).sqrt())
        return -torch.log(2 * self.scale) - abs_residual / self.scale

    def log_marginal_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        return self.marginal(function_dist).log_prob(y)

    # ------------------------------------------------------------------ predictive quantiles
    @torch.no_grad()
    def predictive_cdf(self, function_dist: MultivariateNormal, value: Tensor | float, **kwargs: Any) -> Tensor:
        r""":math:`P(y_* \le \text{value})` under :meth:`marginal` (float64, shape ``(..., N)``): the
        normal--Laplace CDF in closed form
        (:meth:`~gpytorch_augment.distributions.normal_laplace.NormalLaplace.cdf`)."""
        return self._cdf_function(function_dist)(torch.as_tensor(value))

    def _predictive64(self, function_dist: MultivariateNormal) -> NormalLaplace:
        mean = function_dist.mean
        return NormalLaplace(
            mean.double(), function_dist.variance.double().clamp_min(0).sqrt(), self.scale.detach().double()
        )

    def _cdf_function(self, function_dist: MultivariateNormal, **kwargs: Any) -> Callable[[Tensor], Tensor]:
        predictive = self._predictive64(function_dist)
        return lambda value: predictive.cdf(torch.as_tensor(value).to(predictive.loc.device, torch.float64))

    def _quantile_bracket(self, function_dist: MultivariateNormal, **kwargs: Any) -> tuple[Tensor, Tensor]:
        spread = function_dist.variance.double().clamp_min(0) + 2 * self.scale.detach().double() ** 2
        return function_dist.mean.double(), spread.sqrt()

    # ------------------------------------------------------------------ sampling side
    def aux_prior(self, y: Tensor) -> AuxiliaryDistribution:
        lambda_l = (1 / (4 * self.scale**2)).expand_as(y)
        return AuxiliaryDistribution(omega=InverseGamma(torch.full_like(lambda_l, 0.5), lambda_l))

    def aux_conditional(self, y: Tensor, f: Tensor) -> AuxiliaryDistribution:
        beta = self.scale
        mean = 1 / (2 * beta * (y - f).abs())  # inf at y = f: the Lévy limit, handled by InverseGaussian
        return AuxiliaryDistribution(omega=InverseGaussian(mean, (1 / (2 * beta**2)).expand_as(mean)))

    def potential_and_precision(self, y: Tensor, aux: AuxDict, f: Tensor | None = None) -> tuple[Tensor, Tensor]:
        omega = aux["omega"]
        return 2 * omega * y, 2 * omega

    def log_tilt_constant(self, y: Tensor, aux: AuxDict) -> Tensor:
        return -torch.log(2 * self.scale) - aux["omega"] * y**2

    def log_tilt(self, y: Tensor, aux: AuxDict, f: Tensor) -> Tensor:
        r""":math:`-\log 2\beta - \omega (y - f)^2` (the same quadratic, without expanding :math:`y^2`)."""
        return -torch.log(2 * self.scale) - aux["omega"] * (y - f) ** 2

    # ------------------------------------------------------------------ variational side
    def aux_posterior(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> AuxDict:
        return {"r": self._residual(y, f_mean, f_var)}

    def aux_posterior_distribution(self, y: Tensor, q_aux: AuxDict) -> AuxiliaryDistribution:
        r"""The law of :math:`q(\omega) = \mathrm{IG}(1/(2\beta r), 1/(2\beta^2))` for the parameters ``q_aux``."""
        mu = self._mu(q_aux)
        return AuxiliaryDistribution(omega=InverseGaussian(mu, (1 / (2 * self.scale**2)).expand_as(mu)))

    def expected_potential_and_precision(
        self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor
    ) -> tuple[Tensor, Tensor]:
        mu = self._mu(q_aux)
        return 2 * mu * y, 2 * mu

    def expected_log_tilt_constant(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        return -torch.log(2 * self.scale) - self._mu(q_aux) * y**2

    def expected_log_tilt(self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor) -> Tensor:
        return -torch.log(2 * self.scale) - self._mu(q_aux) * ((y - f_mean) ** 2 + f_var)

    def aux_kl(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        r""":math:`\mathrm{KL}(\mathrm{IG}(\mu, 2\lambda_L)\Vert\mathrm{InvGamma}(\tfrac12,\lambda_L))
        = \lambda_L/\mu = r/(2\beta)`."""
        return q_aux["r"] / (2 * self.scale)

    def collapsed_bound(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> Tensor:
        return -torch.log(2 * self.scale) - self._residual(y, f_mean, f_var) / self.scale

    @torch.no_grad()
    def update_hyperparameters(self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor) -> None:
        r""":math:`\beta \leftarrow \operatorname{mean}_i r_i` (over the data and any batch dimensions beyond
        ``batch_shape``)."""
        if not self.learn_scale:
            return
        r = self._residual(y, f_mean, f_var)
        shape = self.raw_scale.shape
        set_positive_constant(self, "scale", r.sum_to_size(shape) / (r.numel() // shape.numel()), update=True)
