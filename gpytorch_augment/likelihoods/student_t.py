r"""Student-t likelihood (robust regression), augmented with a Gamma-distributed precision."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor
from torch.distributions import Gamma, StudentT

from .._numerics import expected_log1p_square, pg_tilt_c, safeguarded_newton, student_t_log_normaliser
from .._random import draw_device
from ..distributions.auxiliary import AuxiliaryDistribution
from ..distributions.student_t_predictive import StudentTPredictive
from ._constants import PositiveConstant, register_positive_constant, set_positive_constant
from ._predictive import ContinuousPredictive
from .augmented_likelihood import AugmentedLikelihood, AuxDict

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class StudentTLikelihood(ContinuousPredictive, AugmentedLikelihood):
    r"""Robust regression with :math:`p(y\mid f) = t_\nu(y \mid f, \sigma)` (:doc:`/maths/robust`):

    .. math::
        p(y\mid f) = \frac{\Gamma(\alpha)}{\Gamma(\frac\nu2)\sqrt{\pi\nu}\,\sigma}
        \Big(1 + \frac{(y-f)^2}{\nu\sigma^2}\Big)^{-\alpha}, \qquad \alpha = \frac{\nu + 1}{2}.

    A Gamma precision with the **scale-correct** rate, :math:`\omega\sim\mathrm{Ga}(\frac\nu2, \frac{\nu\sigma^2}2)`
    (mean :math:`1/\sigma^2`), and :math:`y\mid f,\omega\sim\mathcal N(f, \omega^{-1})` give

    .. math::
        p(y, \omega\mid f) = \mathcal N(y\mid f, \omega^{-1})\,\mathrm{Ga}(\omega\mid\tfrac\nu2,\tfrac{\nu\sigma^2}2),
        \qquad h = \omega y,\quad \lambda = \omega,\quad
        \log C = \tfrac12\log\omega - \tfrac12\log 2\pi - \tfrac12\omega y^2 .

    * Gibbs: :math:`\omega\mid y, f\sim\mathrm{Ga}(\alpha, \frac12(\nu\sigma^2 + (y-f)^2))`.
    * CAVI: :math:`q(\omega_i) = \mathrm{Ga}(\alpha, \delta_i)`, :math:`\delta_i = \frac12(\nu\sigma^2 + r_i^2)`,
      :math:`r_i^2 = (y_i - m_i)^2 + s_i`; the expected log-tilt uses :math:`E\log\omega = \psi(\alpha) - \log\delta`
      (not :math:`\log E\omega`, which would not be a bound), the KL is Gamma to Gamma, and
      :math:`\ell_i^* = \log t_\nu(r_i\mid 0, \sigma)`.
    * :meth:`update_hyperparameters`: :math:`\sigma \leftarrow \arg\max_\sigma \sum_i \log t_\nu(r_i\mid0,\sigma)`,
      the exact maximiser of :math:`\sum_i\ell_i^*` given :math:`q(f)` (unique root of
      :math:`\sum_i r_i^2/(\nu\sigma^2 + r_i^2) = N/(\nu+1)`, found by safeguarded Newton in
      :math:`\log\sigma^2`). It dominates the EM step :math:`\sigma^2\leftarrow N/\sum_i E\omega_i`, which is also
      monotone.

    ``q_aux`` stores the residual ``{"r": r}``; :math:`\delta` is formed with the *current* :math:`\sigma, \nu`, so
    after a :math:`\sigma` update :math:`q(\omega)` is again optimal and a CAVI sweep (local step, :math:`\sigma`
    update, global step) is exact coordinate ascent. :math:`\sigma` and :math:`\nu` are GPyTorch parameters with
    ``Positive`` constraints; :math:`\nu` is fixed unless ``learn_df=True`` (then train it through ``AugmentedELBO``).

    Example::

        >>> import torch
        >>> from gpytorch.distributions import MultivariateNormal
        >>> from gpytorch_augment import StudentTLikelihood
        >>> likelihood = StudentTLikelihood(df=4.0, scale=0.3)
        >>> q_f = MultivariateNormal(torch.zeros(2), 0.1 * torch.eye(2))
        >>> y = torch.tensor([0.3, -1.0])
        >>> likelihood(q_f).log_prob(y).shape                  # StudentTPredictive
        torch.Size([2])
        >>> likelihood.expected_log_prob(y, q_f) <= likelihood.log_marginal(y, q_f)   # Jensen
        tensor([True, True])

    :param df: degrees of freedom :math:`\nu > 0`.
    :param scale: scale :math:`\sigma > 0`.
    :param learn_scale: if ``False``, :math:`\sigma` is neither updated by CAVI nor trained by gradients.
    :param learn_df: if ``True``, :math:`\nu` receives gradients (no closed-form update exists).
    :param batch_shape: batch shape of the constants.
    """

    augmentation = "Gamma scale mixture"
    maths_page = "robust"

    #: what ``posterior_sampler(method="auto")`` builds (the guide's "Which engine, when" gives the evidence)
    preferred_sampler = "hmc"
    real_valued_targets = True

    def __init__(
        self,
        df: float | Tensor = 4.0,
        scale: float | Tensor = 1.0,
        learn_scale: bool = True,
        learn_df: bool = False,
        batch_shape: torch.Size = torch.Size(),
    ) -> None:
        super().__init__()
        self.learn_scale = learn_scale
        register_positive_constant(self, "scale", scale, batch_shape, requires_grad=learn_scale)
        register_positive_constant(self, "df", df, batch_shape, requires_grad=learn_df)

    scale = PositiveConstant(r"The scale :math:`\sigma`, shape ``(*batch_shape, 1)``.")
    df = PositiveConstant(r"The degrees of freedom :math:`\nu`, shape ``(*batch_shape, 1)``.")

    @property
    def _alpha(self) -> Tensor:
        return (self.df + 1) / 2

    def _prior_rate(self) -> Tensor:
        r""":math:`b_0 = \nu\sigma^2/2` (the reference's :math:`\nu/(2\sigma^2)` is wrong for :math:`\sigma\ne1`)."""
        return self.df * self.scale**2 / 2

    def _log_t(self, r2: Tensor) -> Tensor:
        r""":math:`\log t_\nu(r\mid 0,\sigma)` as a function of :math:`r^2` (smooth at :math:`r = 0`)."""
        df, scale = self.df, self.scale
        return student_t_log_normaliser(df) - scale.log() - self._alpha * torch.log1p(r2 / (df * scale**2))

    def _delta(self, q_aux: AuxDict) -> Tensor:
        return self._prior_rate() + q_aux["r"] ** 2 / 2

    # ------------------------------------------------------------------ drop-in
    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> StudentT:
        return StudentT(self.df, function_samples, self.scale)

    def log_prob_and_grad(self, y: Tensor, f: Tensor, **kwargs: Any) -> tuple[Tensor, Tensor]:
        r""":math:`\log t_\nu(y \mid f, \sigma)` and its derivative :math:`(\nu + 1) r / (\nu\sigma^2 + r^2)`,
        :math:`r = y - f`."""
        df, scale = self.df.detach(), self.scale.detach()
        r = y - f
        const = torch.lgamma((df + 1) / 2) - torch.lgamma(df / 2) - 0.5 * torch.log(math.pi * df) - scale.log()
        c = df * scale**2
        return const - (df + 1) / 2 * torch.log1p(r * r / c), (df + 1) * r / (c + r * r)

    def log_prob_grad(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        df, r = self.df.detach(), y - f
        return (df + 1) * r / (df * self.scale.detach() ** 2 + r * r)

    def marginal(self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> StudentTPredictive:
        return StudentTPredictive(self.df, function_dist.mean, function_dist.variance, self.scale)

    def log_marginal_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        return self.marginal(function_dist).log_prob(y)

    # ------------------------------------------------------------------ predictive quantiles
    @torch.no_grad()
    def predictive_cdf(self, function_dist: MultivariateNormal, value: Tensor | float, **kwargs: Any) -> Tensor:
        r""":math:`P(y_* \le \text{value})` under :meth:`marginal` (float64, shape ``(..., N)``):
        :meth:`~gpytorch_augment.distributions.student_t_predictive.StudentTPredictive.cdf`, the Student-t as a
        scale mixture of normals with the latent integrated exactly."""
        return self._cdf_function(function_dist)(torch.as_tensor(value))

    def _predictive64(self, function_dist: MultivariateNormal) -> StudentTPredictive:
        mean = function_dist.mean
        return StudentTPredictive(
            self.df.detach().double(), mean.double(), function_dist.variance.double(), self.scale.detach().double()
        )

    def _cdf_function(self, function_dist: MultivariateNormal, **kwargs: Any) -> Callable[[Tensor], Tensor]:
        predictive = self._predictive64(function_dist)
        return lambda value: predictive.cdf(torch.as_tensor(value).to(predictive.loc.device, torch.float64))

    def _quantile_bracket(self, function_dist: MultivariateNormal, **kwargs: Any) -> tuple[Tensor, Tensor]:
        spread = function_dist.variance.double().clamp_min(0) + self.scale.detach().double() ** 2
        return function_dist.mean.double(), spread.sqrt()

    def expected_log_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        r""":math:`E_{q(f_i)}\log t_\nu(y_i\mid f_i,\sigma)`, per datum, accurate for any :math:`\sigma/\sqrt{s_i}`.

        With :math:`c = \nu\sigma^2`, Frullani's integral and the Gaussian expectation of :math:`e^{-\tau(y-f)^2}`
        give
        :math:`E\log(1 + \tfrac{(y-f)^2}{c}) = \int_0^\infty\big[1 - (1 + \tfrac{2ts}{c})^{-1/2}
        e^{-t d^2/(c + 2ts)}\big]\,\frac{e^{-t}}{t}\,dt` (:math:`d = y - m`), integrated by the trapezoid rule in
        :math:`\log t` (:func:`~gpytorch_augment._numerics.expected_log1p_square`). (32-node Gauss--Hermite over
        :math:`f` is off by 0.1--0.4 nats at
        :math:`\sigma \le 0.1\sqrt s`.)
        """
        mean, var = function_dist.mean, function_dist.variance.clamp_min(0)
        expected_log1p = expected_log1p_square((y - mean) ** 2, var, self.df * self.scale**2)
        return self._log_t(torch.zeros_like(expected_log1p)) - self._alpha * expected_log1p

    # ------------------------------------------------------------------ sampling side
    def aux_prior(self, y: Tensor) -> AuxiliaryDistribution:
        return AuxiliaryDistribution(omega=Gamma((self.df / 2).expand_as(y), self._prior_rate().expand_as(y)))

    def aux_conditional(self, y: Tensor, f: Tensor) -> AuxiliaryDistribution:
        rate = self._prior_rate() + (y - f) ** 2 / 2
        return AuxiliaryDistribution(omega=Gamma(self._alpha.expand_as(rate), rate))

    @torch.no_grad()
    def sample_aux(self, y: Tensor, f: Tensor, generator: torch.Generator | None = None) -> AuxDict:
        r""":math:`\omega \sim \mathrm{Ga}(\alpha, \frac12(\nu\sigma^2 + (y-f)^2))`: the law of :meth:`aux_conditional`,
        drawn directly from ``generator`` (a standard-gamma draw divided by the rate, clamped to the smallest
        normal float as ``torch.distributions.Gamma`` does), without the distribution objects and re-seeding."""
        rate = self._prior_rate() + (y - f) ** 2 / 2
        alpha = self._alpha.expand_as(rate).contiguous().to(draw_device(generator, rate.device))
        omega = torch._standard_gamma(alpha, generator=generator).to(rate.device) / rate
        return {"omega": omega.clamp_(min=torch.finfo(omega.dtype).tiny)}

    def potential_and_precision(self, y: Tensor, aux: AuxDict, f: Tensor | None = None) -> tuple[Tensor, Tensor]:
        omega = aux["omega"]
        return omega * y, omega

    def log_tilt_constant(self, y: Tensor, aux: AuxDict) -> Tensor:
        omega = aux["omega"]
        return 0.5 * omega.log() - _HALF_LOG_2PI - omega * y**2 / 2

    def log_tilt(self, y: Tensor, aux: AuxDict, f: Tensor) -> Tensor:
        r""":math:`\log\mathcal N(y\mid f, \omega^{-1})` (the same quadratic, without expanding :math:`y^2`)."""
        omega = aux["omega"]
        return 0.5 * omega.log() - _HALF_LOG_2PI - omega * (y - f) ** 2 / 2

    # ------------------------------------------------------------------ variational side
    def aux_posterior(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> AuxDict:
        return {"r": pg_tilt_c(y - f_mean, f_var)}

    def aux_posterior_distribution(self, y: Tensor, q_aux: AuxDict) -> AuxiliaryDistribution:
        r"""The law of :math:`q(\omega) = \mathrm{Ga}(\alpha, \delta)` for the parameters ``q_aux``."""
        delta = self._delta(q_aux)
        return AuxiliaryDistribution(omega=Gamma(self._alpha.expand_as(delta), delta))

    def expected_log_omega(self, q_aux: AuxDict) -> Tensor:
        r""":math:`E_q\log\omega = \psi(\alpha) - \log\delta`."""
        return torch.digamma(self._alpha) - self._delta(q_aux).log()

    def expected_potential_and_precision(
        self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor
    ) -> tuple[Tensor, Tensor]:
        e_omega = self._alpha / self._delta(q_aux)
        return e_omega * y, e_omega

    def expected_log_tilt_constant(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        e_omega = self._alpha / self._delta(q_aux)
        return 0.5 * self.expected_log_omega(q_aux) - _HALF_LOG_2PI - e_omega * y**2 / 2

    def expected_log_tilt(self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor) -> Tensor:
        e_omega = self._alpha / self._delta(q_aux)
        return 0.5 * self.expected_log_omega(q_aux) - _HALF_LOG_2PI - e_omega * ((y - f_mean) ** 2 + f_var) / 2

    def aux_kl(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        r""":math:`\mathrm{KL}(\mathrm{Ga}(\alpha,\delta)\Vert\mathrm{Ga}(a_0,b_0))`, :math:`a_0 = \nu/2`,
        :math:`b_0 = \nu\sigma^2/2`."""
        alpha, a0, b0, delta = self._alpha, self.df / 2, self._prior_rate(), self._delta(q_aux)
        return (
            (alpha - a0) * torch.digamma(alpha) - torch.lgamma(alpha) + torch.lgamma(a0)
            + a0 * (delta.log() - b0.log()) + alpha * (b0 - delta) / delta
        )

    def collapsed_bound(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> Tensor:
        r""":math:`\ell^* = \log t_\nu(r\mid0,\sigma)`."""
        return self._log_t((y - f_mean) ** 2 + f_var)

    @torch.no_grad()
    def update_hyperparameters(self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor) -> None:
        r""":math:`\sigma^2\leftarrow` the root of :math:`\sum_i r_i^2/(\nu\sigma^2 + r_i^2) = N/(\nu+1)`.

        The left side decreases in :math:`u = \log\sigma^2` (a sum of logistic functions of :math:`u`) and each
        term crosses :math:`1/(\nu+1)` at :math:`\sigma^2 = r_i^2`, so the root is unique and lies in
        :math:`[\min_i r_i^2, \max_i r_i^2]`: :func:`~gpytorch_augment._numerics.safeguarded_newton` in :math:`u`,
        started at the current :math:`\sigma^2`, finds it to ~1e-13 relative in a few steps, per batch element.
        """
        if not (self.learn_scale and self.raw_scale.requires_grad):  # frozen as the error advice says
            return
        shape = self.raw_scale.shape
        r2 = ((y - f_mean) ** 2 + f_var).to(torch.float64).clamp_min(1e-300)
        df = self.df.to(torch.float64)
        target = (r2.numel() // shape.numel()) / (df + 1)

        def excess_and_slope(u: Tensor) -> tuple[Tensor, Tensor]:
            t = r2 / (df * u.exp() + r2)  # t_i = r_i^2 / (nu sigma^2 + r_i^2), d t_i / du = -t_i (1 - t_i)
            return t.sum_to_size(shape) - target, -(t * (1 - t)).sum_to_size(shape)

        lo, hi = r2.min().log().expand(shape), r2.max().log().expand(shape)  # tensors: no device read-back
        start = 2 * self.scale.to(torch.float64).log()
        log_scale2 = safeguarded_newton(excess_and_slope, lo, hi, start, increasing=False)
        set_positive_constant(self, "scale", (log_scale2 / 2).exp().to(self.raw_scale), update=True)
