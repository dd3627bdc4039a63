r"""The shared base of the heteroscedastic regression likelihoods: a mean latent :math:`f` and a noise latent
:math:`g`, with the noise precision :math:`\xi\sigma(g)` bounded by :math:`\xi` (:doc:`/maths/heteroscedastic`).

Both likelihoods share the augmentation of the noise link. Writing :math:`\rho = \frac12(y - f)^2`,

.. math::
    e^{-\xi\sigma(g)\rho} = e^{-\xi\rho}\,e^{\xi\rho\,\sigma(-g)} = \sum_n \mathrm{Po}(n\mid\xi\rho)\,\sigma(-g)^n,
    \qquad
    \sigma(g)^{1/2}\sigma(-g)^n = 2^{-(\frac12+n)}\int e^{\frac12((\frac12-n)g - \omega g^2)}\,
    \mathrm{PG}(\omega\mid\tfrac12+n, 0)\,d\omega ,

so :math:`g` is conditionally conjugate given :math:`(n, \omega)` (:math:`h_g = (\frac12-n)/2`,
:math:`\lambda_g=\omega`),
while :math:`f` enters through the Poisson rate and is updated by **collapsed** steps (:math:`p(y\mid f, g)` is
Gaussian in :math:`f`).

Protocol conventions for the two latents (layout ``(..., N, 2)``: ``[..., 0]`` is :math:`f`, ``[..., 1]`` is
:math:`g`):

* ``aux_prior(y)`` is the :math:`f`-independent reference law :math:`n\sim\mathrm{Po}(\xi)`,
  :math:`\omega\mid n\sim\mathrm{PG}(\frac12+n, 0)` (and :math:`\gamma\sim\mathrm{Ga}(\frac\nu2,\frac\nu2)` for the
  Student-t); the :math:`f`-dependent Poisson factor :math:`\mathrm{Po}(n\mid\xi\gamma\rho)/\mathrm{Po}(n\mid\xi)
  = (\gamma\rho)^n e^{\xi(1-\gamma\rho)}` is part of :meth:`log_tilt`, so ``log_tilt + aux_prior.log_prob`` is the
  exact augmented log-likelihood (identity (a)).
* ``potential_and_precision`` returns, latent-major, the **collapsed** conditional of :math:`f` given :math:`g`
  (:math:`h_f=\xi\gamma\sigma(g)y`, :math:`\lambda_f=\xi\gamma\sigma(g)`) and the tilt of :math:`g`.
* ``latent_blocks = ((0,), (1,))``: the Gibbs engine draws :math:`f\mid g` (collapsed), then a fresh
  :math:`\Omega`, then :math:`g\mid\Omega` -- the valid partially collapsed order; CAVI updates
  :math:`q(f)` and :math:`q(g)` one after the other with :math:`q(\Omega)` refreshed in between.
* The variational side is the **double bound**: :math:`E_{q(f)}` is taken exactly first, so :math:`f`
  enters only through :math:`\phi = \frac12((y-m_f)^2 + s_f)`, the Poisson rate becomes :math:`\xi\gamma\phi`, and
  ``q_aux = {"c": c_g, "log_n_rate": log r}`` with :math:`q(n, \omega) = \mathrm{Po}(n\mid\xi r)\,
  \mathrm{PG}(\omega\mid\frac12+n, c_g)` (optimum :math:`r = \phi\tilde\sigma`, :math:`\tilde\sigma=\tilde\sigma(m_g,
  c_g)`; the log is the natural scale of a Poisson rate); the Student-t adds
  ``"kappa"``: :math:`q(\gamma) = \mathrm{Ga}(\frac{\nu+1}2, \frac\nu2 + \xi\kappa)` (optimum
  :math:`\kappa = \phi(1-\tilde\sigma)`). Both are stored relative to :math:`\xi` and :math:`\nu`, so
  :math:`q(\Omega)` stays optimal through the closed-form hyper-parameter updates.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from torch import Tensor
from torch.distributions import Gamma, Poisson
from torch.nn.functional import logsigmoid

from .._numerics import LOG2, gauss_hermite, log_sigma_tilde, pg_kl, pg_mean, pg_tilt_c
from .._random import seeded_by
from ..distributions.auxiliary import AuxiliaryDistribution
from ..distributions.noise_variance import NoiseVariance
from ..distributions.polya_gamma import PolyaGamma
from ._constants import PositiveConstant, check_gamma_prior, register_positive_constant
from ._predictive import ContinuousPredictive
from .augmented_likelihood import NUM_QUADRATURE_LOCS, AugmentedLikelihood, AuxDict

LOG_2PI = math.log(2.0 * math.pi)


def split_latents(t: Tensor) -> tuple[Tensor, Tensor]:
    """(..., N, 2) -> the f part and the g part, each (..., N)."""
    if t.shape[-1] != 2:
        raise ValueError(
            f"heteroscedastic latents must have a trailing dimension of size 2 (f, g); got {tuple(t.shape)}"
        )
    return t[..., 0], t[..., 1]


def latent_major(f_part: Tensor, g_part: Tensor) -> Tensor:
    """Two per-datum tensors -> (..., 2, N)."""
    return torch.stack(torch.broadcast_tensors(f_part, g_part), dim=-2)



class HeteroscedasticLikelihoodBase(ContinuousPredictive, AugmentedLikelihood):
    r"""What the Gaussian and Student-t heteroscedastic likelihoods share: :math:`\xi`, the :math:`(n,\omega)`
    augmentation of the noise link, the block order, the double-bound statistics and the noise-level helpers.

    Subclasses describe the per-datum precision multiplier :math:`\gamma` (1 for the Gaussian, a Gamma variable
    for the Student-t) through ``_gamma*`` hooks and provide the likelihood itself.
    """

    num_latents = 2
    #: update order of both engines: f (collapsed over Ω), then a fresh Ω, then g
    latent_blocks = ((0,), (1,))
    real_valued_targets = True

    def __init__(
        self,
        max_precision: float | Tensor = 1.0,
        max_precision_prior: tuple[float, float] | None = None,
        learn_max_precision: bool = True,
        batch_shape: torch.Size = torch.Size(),
    ) -> None:
        super().__init__()
        self.max_precision_prior = check_gamma_prior("max_precision_prior", max_precision_prior)
        register_positive_constant(
            self, "max_precision", max_precision, batch_shape, requires_grad=learn_max_precision
        )

    # ------------------------------------------------------------------ xi
    max_precision = PositiveConstant(r"The largest noise precision :math:`\xi`, shape ``(*batch_shape, 1)``.")

    @property
    def _xi(self) -> Tensor:
        return self.max_precision

    # ------------------------------------------------------------------ gamma hooks (Gaussian: gamma = 1)
    def _gamma(self, aux: AuxDict) -> Tensor | float:
        return 1.0

    def _gamma_factors(self, y: Tensor, f: Tensor | None, g: Tensor | None) -> dict[str, Any]:
        """The factors of gamma in ``aux_prior`` (``f is None``) / ``aux_conditional``."""
        return {}

    def _q_gamma(self, q_aux: AuxDict) -> tuple[Tensor | float, Tensor | float, Tensor | float]:
        r""":math:`(E\gamma, E\log\gamma, E\gamma\log\gamma)` under :math:`q(\gamma)`."""
        return 1.0, 0.0, 0.0

    def _q_gamma_kl(self, q_aux: AuxDict) -> Tensor | float:
        return 0.0

    # ------------------------------------------------------------------ shared pieces
    @staticmethod
    def _moments(function_dist: MultivariateNormal) -> tuple[Tensor, Tensor]:
        if not isinstance(function_dist, MultitaskMultivariateNormal) or function_dist.event_shape[-1] != 2:
            raise ValueError(
                "heteroscedastic likelihoods take a MultitaskMultivariateNormal over the two latents (f, g) "
                f"(event shape (N, 2)); got {type(function_dist).__name__} with event shape "
                f"{tuple(function_dist.event_shape)}"
            )
        return function_dist.mean, function_dist.variance.clamp_min(0)

    @staticmethod
    def _phi(y: Tensor, f_mean: Tensor, f_var: Tensor) -> Tensor:
        r""":math:`\phi = \frac12 E_{q(f)}(y - f)^2 = \frac12((y - m_f)^2 + s_f)`."""
        return 0.5 * ((y - f_mean) ** 2 + f_var)

    def _noise_log_precision(self, g: Tensor) -> Tensor:
        r""":math:`\log(\xi\sigma(g))`."""
        return self._xi.log() + logsigmoid(g)

    # ------------------------------------------------------------------ sampling side
    def aux_prior(self, y: Tensor) -> AuxiliaryDistribution:
        r"""The :math:`f`-independent reference :math:`[\gamma\sim\mathrm{Ga}(\frac\nu2,\frac\nu2)]`,
        :math:`n\sim\mathrm{Po}(\xi)`, :math:`\omega\mid n\sim\mathrm{PG}(\frac12+n, 0)`; the :math:`f`-dependent
        Poisson factor lives in :meth:`log_tilt`."""
        return AuxiliaryDistribution(
            **self._gamma_factors(y, None, None),
            n=Poisson(self._xi * torch.ones_like(y)),
            omega=lambda aux: PolyaGamma(0.5 + aux["n"], torch.zeros_like(aux["n"])),
        )

    def aux_conditional(self, y: Tensor, f: Tensor) -> AuxiliaryDistribution:
        r""":math:`[\gamma\mid f,g\sim\mathrm{Ga}(\alpha,\frac\nu2+\xi\sigma(g)\rho)]`,
        :math:`n\mid\gamma,f,g\sim\mathrm{Po}(\xi\gamma\sigma(-g)\rho)`,
        :math:`\omega\mid n,g\sim\mathrm{PG}(\frac12+n,|g|)`."""
        f_, g = split_latents(f)
        rho = 0.5 * (y - f_) ** 2
        rate = self._xi * torch.sigmoid(-g) * rho
        return AuxiliaryDistribution(
            **self._gamma_factors(y, f_, g),
            n=lambda aux: Poisson(self._gamma(aux) * rate),
            omega=lambda aux: PolyaGamma(0.5 + aux["n"], g.abs().expand_as(aux["n"])),
        )

    def potential_and_precision(self, y: Tensor, aux: AuxDict, f: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r"""Latent-major ``(..., 2, N)``: the collapsed conditional of :math:`f` given :math:`(g, \gamma)`,
        :math:`(\xi\gamma\sigma(g)y,\ \xi\gamma\sigma(g))`, and the tilt of :math:`g`,
        :math:`((\frac12-n)/2,\ \omega)`."""
        if f is None:
            raise ValueError("heteroscedastic likelihoods need the current latents f (the f-step is collapsed over Ω)")
        _, g = split_latents(f)
        precision_f = self._gamma(aux) * self._xi * torch.sigmoid(g)
        n, omega = aux["n"], aux["omega"]
        return latent_major(precision_f * y, (0.5 - n) / 2), latent_major(precision_f, omega)

    def log_tilt_constant(self, y: Tensor, aux: AuxDict) -> Tensor:
        r""":math:`\frac12\log\frac{\xi\gamma}{2\pi} - (\frac12+n)\log 2`, the part of :meth:`log_tilt` free of
        :math:`(f, g)`."""
        n = aux["n"]
        gamma = torch.as_tensor(self._gamma(aux), dtype=n.dtype, device=n.device)
        return 0.5 * (self._xi.log() + gamma.log() - LOG_2PI) - (0.5 + n) * LOG2

    def log_tilt(self, y: Tensor, aux: AuxDict, f: Tensor) -> Tensor:
        r""":math:`\log p(y, \Omega\mid f, g) - \log p_{\rm ref}(\Omega)`:
        :math:`\frac12\log\frac{\xi\gamma}{2\pi} - (\frac12+n)\log2 + n\log(\gamma\rho) + \xi(1-\gamma\rho)
        + \frac12(\frac12-n)g - \frac12\omega g^2`. Quadratic in :math:`g`; in :math:`f` it is the Poisson factor
        (the :math:`f`-step uses the collapsed conditional instead, see :meth:`potential_and_precision`)."""
        f_, g = split_latents(f)
        n, omega = aux["n"], aux["omega"]
        gamma_rho = self._gamma(aux) * 0.5 * (y - f_) ** 2
        poisson = torch.xlogy(n, gamma_rho) + self._xi * (1 - gamma_rho)
        return self.log_tilt_constant(y, aux) + poisson + 0.5 * (0.5 - n) * g - 0.5 * omega * g**2

    @property
    def samples_constants(self) -> bool:
        """Whether a prior on the constants is set (``max_precision_prior``): then the Gibbs sampler draws them."""
        return self.max_precision_prior is not None

    def sample_hyperparameters(
        self, y: Tensor, aux: AuxDict, f: Tensor, generator: torch.Generator | None = None
    ) -> tuple[dict[str, Tensor], AuxDict | None]:
        r"""Under ``max_precision_prior=(a, b)``, the collapsed Gibbs step of the rate scale
        :math:`\xi\mid f, g, [\gamma] \sim \mathrm{Ga}\big(a + \frac N2,\ b + \sum_i\gamma_i\sigma(g_i)\rho_i\big)`,
        marginal over :math:`(n, \omega)`, then a fresh :math:`\Omega \sim p(\Omega\mid y, f, g, \xi)` under the new
        :math:`\xi`, so nothing conditions on the stale :math:`(n, \omega)`.

        Pure: returns ``({"max_precision": xi}, fresh_aux)`` with one :math:`\xi` per chain (leading dimensions of
        ``f``, shape ``(*chains, 1)``), or ``({}, None)`` without a prior; the likelihood's parameter is not changed
        (evaluate under the draw with :meth:`constants`)."""
        if self.max_precision_prior is None:
            return {}, None
        a, b = self.max_precision_prior
        f_, g = split_latents(f)
        with torch.no_grad():
            weighted = self._gamma(aux) * torch.sigmoid(g) * 0.5 * (y - f_) ** 2
            rate = b + weighted.sum(-1, keepdim=True)
            with seeded_by(generator, f.device):
                draw = Gamma(torch.full_like(rate, a + weighted.shape[-1] / 2), rate).sample()
        with self.constants({"max_precision": draw}):
            fresh = self.sample_aux(y, f, generator=generator)
        return {"max_precision": draw}, fresh

    # ------------------------------------------------------------------ variational side
    def _sigma_tildes(self, f_mean: Tensor, q_aux: AuxDict) -> tuple[Tensor, Tensor]:
        r""":math:`(\tilde\sigma, 1 - \tilde\sigma)` at :math:`(m_g, c)`."""
        log_st = log_sigma_tilde(f_mean[..., 1], q_aux["c"])
        return log_st.exp(), -torch.expm1(log_st)

    def _optimal_q(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        r""":math:`(c_g, \phi, \tilde\sigma, 1 - \tilde\sigma)` of the current marginals."""
        m_f, m_g = split_latents(f_mean)
        s_f, s_g = split_latents(f_var)
        c = pg_tilt_c(m_g, s_g)
        log_st = log_sigma_tilde(m_g, c)
        return c, self._phi(y, m_f, s_f), log_st.exp(), -torch.expm1(log_st)

    def aux_posterior(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> AuxDict:
        c, phi, _, _ = self._optimal_q(y, f_mean, f_var)
        return {"c": c, "log_n_rate": phi.log() + log_sigma_tilde(f_mean[..., 1], c)}

    def _n_mean(self, q_aux: AuxDict) -> Tensor:
        r""":math:`\bar n = \xi\,E\gamma\, r`."""
        return self._xi * self._q_gamma(q_aux)[0] * q_aux["log_n_rate"].exp()

    def expected_potential_and_precision(
        self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor
    ) -> tuple[Tensor, Tensor]:
        r"""Latent-major: :math:`\bar\lambda_f = \xi\,E\gamma\,(1-\tilde\sigma)`, :math:`\bar h_f = \bar\lambda_f y`
        (the corrected potential, :math:`-\partial\ell^*/\partial\phi`; **no** :math:`/2`), and
        :math:`\bar h_g = (\frac12 - \bar n)/2`, :math:`\bar\lambda_g = \mathrm{PGm}(\frac12 + \bar n, c)`."""
        _, one_minus = self._sigma_tildes(f_mean, q_aux)
        precision_f = self._xi * self._q_gamma(q_aux)[0] * one_minus
        n_mean = self._n_mean(q_aux)
        return latent_major(precision_f * y, (0.5 - n_mean) / 2), latent_major(
            precision_f, pg_mean(0.5 + n_mean, q_aux["c"])
        )

    def expected_log_tilt_constant(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        _, e_log_gamma, _ = self._q_gamma(q_aux)
        return 0.5 * (self._xi.log() + e_log_gamma - LOG_2PI) - (0.5 + self._n_mean(q_aux)) * LOG2

    def expected_log_tilt(self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor) -> Tensor:
        r"""The double-bound expectation of :meth:`log_tilt`: :math:`\rho\to\phi` (:math:`E_{q(f)}` taken first),
        :math:`E_q[n\log(\gamma\phi)] = \xi r\,E[\gamma\log\gamma] + \bar n\log\phi`, the :math:`g`-part as usual."""
        m_f, m_g = split_latents(f_mean)
        s_f, s_g = split_latents(f_var)
        phi = self._phi(y, m_f, s_f)
        e_gamma, _, e_gamma_log_gamma = self._q_gamma(q_aux)
        xi, n_mean, c = self._xi, self._n_mean(q_aux), q_aux["c"]
        poisson = (
            xi * q_aux["log_n_rate"].exp() * e_gamma_log_gamma + torch.xlogy(n_mean, phi) + xi * (1 - e_gamma * phi)
        )
        g_part = 0.5 * (0.5 - n_mean) * m_g - 0.5 * pg_mean(0.5 + n_mean, c) * (m_g**2 + s_g)
        return self.expected_log_tilt_constant(y, q_aux) + poisson + g_part

    def aux_kl(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        r""":math:`\mathrm{KL}(q(\Omega)\Vert p_{\rm ref})`:
        :math:`[\mathrm{KL}(q(\gamma)\Vert\mathrm{Ga}(\frac\nu2,\frac\nu2))]
        + E_\gamma\mathrm{KL}(\mathrm{Po}(\xi\gamma r)\Vert\mathrm{Po}(\xi)) + \mathrm{KL}_{PG}(\frac12+\bar n, c)`."""
        _, _, e_gamma_log_gamma = self._q_gamma(q_aux)
        xi, log_r, n_mean = self._xi, q_aux["log_n_rate"], self._n_mean(q_aux)
        n_log_r = torch.where(n_mean > 0, n_mean * log_r, torch.zeros_like(n_mean))
        poisson_kl = xi * log_r.exp() * e_gamma_log_gamma + n_log_r - n_mean + xi
        return self._q_gamma_kl(q_aux) + poisson_kl + pg_kl(0.5 + n_mean, q_aux["c"])

    # ------------------------------------------------------------------ noise level and predictive moments
    def _g_moments(self, function_dist: MultivariateNormal) -> tuple[Tensor, Tensor]:
        if isinstance(function_dist, MultitaskMultivariateNormal):
            mean, var = self._moments(function_dist)
            return mean[..., 1], var[..., 1]
        return function_dist.mean, function_dist.variance.clamp_min(0)

    def _noise_variance_factor(self) -> Tensor | float:
        """:math:`\\mathrm{Var}(y\\mid f,g)\\,\\xi\\sigma(g)` (1 for the Gaussian)."""
        return 1.0

    def noise_variance_at(self, g: Tensor) -> Tensor:
        r"""The noise variance :math:`\mathrm{Var}(y\mid f, g)` at given values of :math:`g` (e.g. Gibbs draws)."""
        return self._noise_variance_factor() * (1 + torch.exp(-g)) / self._xi

    def noise_variance(self, function_dist: MultivariateNormal, level: float = 0.95) -> NoiseVariance:
        r"""The noise variance :math:`v(g)=\mathrm{Var}(y\mid f,g)` (for the Gaussian :math:`1/(\xi\sigma(g))
        = (1+e^{-g})/\xi`) under :math:`q(g)`: mean :math:`(1 + e^{-m_g + s_g/2})/\xi` (times
        :math:`\frac{\nu}{\nu-2}` for the Student-t), median and the central ``level`` band.

        :param function_dist: ``model(x)``, a ``MultitaskMultivariateNormal`` over :math:`(f, g)`, or the
            ``MultivariateNormal`` of :math:`g` alone.
        """
        if not 0.0 < float(level) < 1.0:
            raise ValueError(f"level must be in (0, 1), got {level}")
        m_g, s_g = self._g_moments(function_dist)
        z = math.sqrt(2.0) * torch.special.erfinv(torch.tensor(float(level), dtype=m_g.dtype, device=m_g.device))
        sd = s_g.sqrt()
        factor = self._noise_variance_factor()
        return NoiseVariance(
            mean=factor * (1 + torch.exp(-m_g + s_g / 2)) / self._xi,
            median=self.noise_variance_at(m_g),
            lower=self.noise_variance_at(m_g + z * sd),
            upper=self.noise_variance_at(m_g - z * sd),
        )

    def predictive_moments(self, function_dist: MultivariateNormal) -> tuple[Tensor, Tensor]:
        r"""Mean and variance of the predictive of :math:`y`, closed form: :math:`m_f` and
        :math:`s_f + E_{q(g)}v(g)`."""
        mean, var = self._moments(function_dist)
        return mean[..., 0], var[..., 0] + self.noise_variance(function_dist).mean

    # ------------------------------------------------------------------ predictive quantiles
    def _component_cdf(self, z: Tensor, df: Tensor | None) -> Tensor:
        """Standardised CDF of a mixture component (normal; the Student-t overrides through ``df``)."""
        return torch.special.ndtr(z)

    def predictive_cdf(self, function_dist: MultivariateNormal, value: Tensor | float, **kwargs: Any) -> Tensor:
        r""":math:`P(y_* \le \text{value})` under the predictive of :meth:`marginal`: Gauss--Hermite over :math:`g`
        and, for the Student-t, over :math:`f` (the Gaussian integrates :math:`f` exactly), in float64."""
        mean, var = self._moments(function_dist)
        mean, var, value = mean.double(), var.double(), torch.as_tensor(value).to(mean.device, torch.float64)
        g, w_g = gauss_hermite(mean[..., 1], var[..., 1], NUM_QUADRATURE_LOCS)
        noise_var = (1 + torch.exp(-g)) / self._xi.double()  # Var (Gaussian) or squared scale (Student-t) of y | f, g
        df = self._predictive_df()
        if df is None:
            z = (value - mean[..., 0]) / (var[..., 0] + noise_var).sqrt()
            return (w_g * self._component_cdf(z, None)).sum(0)
        f, w_f = gauss_hermite(mean[..., 0], var[..., 0], NUM_QUADRATURE_LOCS)
        z = (value - f.unsqueeze(1)) / noise_var.sqrt().unsqueeze(0)  # (F, G, ...)
        return (w_f.unsqueeze(1) * w_g.unsqueeze(0) * self._component_cdf(z, df.double())).sum((0, 1))

    def _predictive_df(self) -> Tensor | None:
        r"""Degrees of freedom of :math:`y\mid f, g` (``None``: Gaussian)."""
        return None

    def _quantile_bracket(self, function_dist: MultivariateNormal, **kwargs: Any) -> tuple[Tensor, Tensor]:
        mean, var = self._moments(function_dist)
        center = mean[..., 0].double()
        width = (var[..., 0].double() + (1 + torch.exp(-mean[..., 1].double())) / self._xi.double()).sqrt()
        return center, width

    # ------------------------------------------------------------------ hyper-parameters
    def _map_xi(self, y: Tensor, weighted_phi: Tensor) -> Tensor:
        r""":math:`\xi = (\frac N2 [+ a - 1]) / ([b +] \sum_i w_i)` for ``weighted_phi`` :math:`w_i`."""
        num = 0.5 * weighted_phi.shape[-1]
        total = weighted_phi.sum(-1, keepdim=True)
        if self.max_precision_prior is not None:
            a, b = self.max_precision_prior
            return (num + a - 1) / (b + total)
        return num / total
