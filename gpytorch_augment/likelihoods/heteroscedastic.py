r"""Heteroscedastic regression: a mean latent :math:`f` and a noise latent :math:`g`, with the noise precision
:math:`\xi\sigma(g)` bounded by :math:`\xi` (``augmentations.md`` §10, §11).

Both likelihoods share the augmentation of the noise link. Writing :math:`\rho = \frac12(y - f)^2`,

.. math::
    e^{-\xi\sigma(g)\rho} = e^{-\xi\rho}\,e^{\xi\rho\,\sigma(-g)} = \sum_n \mathrm{Po}(n\mid\xi\rho)\,\sigma(-g)^n,
    \qquad
    \sigma(g)^{1/2}\sigma(-g)^n = 2^{-(\frac12+n)}\int e^{\frac12((\frac12-n)g - \omega g^2)}\,
    \mathrm{PG}(\omega\mid\tfrac12+n, 0)\,d\omega ,

so :math:`g` is conditionally conjugate given :math:`(n, \omega)` (:math:`h_g = (\frac12-n)/2`, :math:`\lambda_g=\omega`),
while :math:`f` enters through the Poisson rate and is updated by **collapsed** steps (:math:`p(y\mid f, g)` is
Gaussian in :math:`f`).

Protocol conventions for the two latents (layout ``(..., N, 2)``: ``[..., 0]`` is :math:`f`, ``[..., 1]`` is
:math:`g`):

* ``aux_prior(y)`` is the :math:`f`-independent reference law :math:`n\sim\mathrm{Po}(\xi)`,
  :math:`\omega\mid n\sim\mathrm{PG}(\frac12+n, 0)` (and :math:`\gamma\sim\mathrm{Ga}(\frac\nu2,\frac\nu2)` for the
  Student-t); the :math:`f`-dependent Poisson factor :math:`\mathrm{Po}(n\mid\xi\gamma\rho)/\mathrm{Po}(n\mid\xi)
  = (\gamma\rho)^n e^{\xi(1-\gamma\rho)}` is part of :meth:`log_tilt`, so ``log_tilt + aux_prior.log_prob`` is the
  exact augmented log-likelihood (§12 (a)).
* ``potential_and_precision`` returns, latent-major, the **collapsed** conditional of :math:`f` given :math:`g`
  (:math:`h_f=\xi\gamma\sigma(g)y`, :math:`\lambda_f=\xi\gamma\sigma(g)`) and the tilt of :math:`g`.
* ``latent_blocks = ((0,), (1,))``: the Gibbs engine draws :math:`f\mid g` (collapsed), then a fresh
  :math:`\Omega`, then :math:`g\mid\Omega` -- the valid partially collapsed order of §10.2; CAVI updates
  :math:`q(f)` and :math:`q(g)` one after the other with :math:`q(\Omega)` refreshed in between (§10.3).
* The variational side is the **double bound** of §10.3: :math:`E_{q(f)}` is taken exactly first, so :math:`f`
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
from typing import Any, NamedTuple

import gpytorch
import torch
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from torch import Tensor
from torch.distributions import Gamma, MixtureSameFamily, Normal, Poisson, StudentT, kl_divergence
from torch.nn.functional import logsigmoid

from .._numerics import (
    LOG2,
    gauss_hermite,
    log_sigma_tilde,
    log_sigma_tilde_plus,
    pg_kl,
    pg_mean,
    quadrature_mixture,
)
from .._random import seeded_by
from ..distributions.auxiliary import AuxiliaryDistribution
from ..distributions.polya_gamma import PolyaGamma
from .augmented_likelihood import NUM_QUADRATURE_LOCS, AugmentedLikelihood, AuxDict
from .student_t import _TAIL, StudentTPredictive, _log_trapezoid

__all__ = ["HeteroscedasticGaussianLikelihood", "HeteroscedasticStudentTLikelihood", "NoiseVariance"]

_LOG_2PI = math.log(2.0 * math.pi)
#: grid and golden-section settings of the numerical :math:`\nu` update (log-spaced in ``df_bounds``)
_DF_GRID = 48
_GOLDEN_STEPS = 45


class NoiseVariance(NamedTuple):
    r"""The noise variance :math:`v(g) = \mathrm{Var}(y\mid f, g)` under :math:`q(g)`, per input.

    :ivar mean: :math:`E_{q(g)} v(g)` (closed form).
    :ivar median: :math:`v(m_g)`.
    :ivar lower, upper: the central ``level`` band of :math:`v(g)` (exact: :math:`v` is monotone in :math:`g`).
    """

    mean: Tensor
    median: Tensor
    lower: Tensor
    upper: Tensor


def _split(t: Tensor) -> tuple[Tensor, Tensor]:
    """(..., N, 2) -> the f part and the g part, each (..., N)."""
    if t.shape[-1] != 2:
        raise ValueError(f"heteroscedastic latents must have a trailing dimension of size 2 (f, g); got {tuple(t.shape)}")
    return t[..., 0], t[..., 1]


def _latent_major(f_part: Tensor, g_part: Tensor) -> Tensor:
    """Two per-datum tensors -> (..., 2, N)."""
    return torch.stack(torch.broadcast_tensors(f_part, g_part), dim=-2)


def _expected_log1p_square(d2: Tensor, var: Tensor, c: Tensor) -> Tensor:
    r""":math:`E_{\mathcal N(f\mid m, s)}\log(1 + (y-f)^2/c)` for ``d2`` :math:`=(y-m)^2`, ``var`` :math:`=s`, by
    Frullani's integral in :math:`\log t` -- the representation ``StudentTLikelihood.expected_log_prob`` uses
    (accurate for any :math:`c/s`, where Gauss--Hermite over :math:`f` is off by tenths of a nat)."""
    hi = torch.full_like(d2 + c + var, math.log(_TAIL))
    lo = torch.log(c / (c + var + d2)) - _TAIL

    def log_integrand(u: Tensor) -> Tensor:  # log[(1 - E e^{-t (y-f)^2 / c}) e^{-t}], t = e^u
        t = u.exp()
        log_laplace = -0.5 * torch.log1p(2 * t * var / c) - t * d2 / (c + 2 * t * var)
        return torch.log(-torch.expm1(log_laplace)) - t

    return _log_trapezoid(log_integrand, lo, hi).exp()


class _HeteroscedasticLikelihood(AugmentedLikelihood):
    r"""What the Gaussian and Student-t heteroscedastic likelihoods share: :math:`\xi`, the :math:`(n,\omega)`
    augmentation of the noise link, the block order, the double-bound statistics and the noise-level helpers.

    Subclasses describe the per-datum precision multiplier :math:`\gamma` (1 for the Gaussian, a Gamma variable
    for the Student-t) through ``_gamma*`` hooks and provide the likelihood itself.
    """

    num_latents = 2
    #: update order of both engines: f (collapsed over Ω), then a fresh Ω, then g (§10.2, §10.3)
    latent_blocks = ((0,), (1,))

    def __init__(
        self,
        max_precision: float | Tensor = 1.0,
        max_precision_prior: tuple[float, float] | None = None,
        learn_max_precision: bool = True,
        batch_shape: torch.Size = torch.Size(),
    ) -> None:
        super().__init__()
        if max_precision_prior is not None:
            a, b = (float(v) for v in max_precision_prior)
            if not (a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b)):
                raise ValueError(f"max_precision_prior (a, b) must have finite a > 0 and b > 0; got {max_precision_prior}")
            max_precision_prior = (a, b)
        self.max_precision_prior = max_precision_prior
        self.register_parameter(
            "raw_max_precision", torch.nn.Parameter(torch.zeros(*batch_shape, 1), requires_grad=learn_max_precision)
        )
        self.register_constraint("raw_max_precision", gpytorch.constraints.Positive())
        self.max_precision = max_precision

    # ------------------------------------------------------------------ xi
    @property
    def max_precision(self) -> Tensor:
        r"""The largest noise precision :math:`\xi`, shape ``(*batch_shape, 1)`` (``(chains, 1)`` after Gibbs
        sampling with a prior)."""
        return self.raw_max_precision_constraint.transform(self.raw_max_precision)

    @max_precision.setter
    def max_precision(self, value: float | Tensor) -> None:
        value = torch.as_tensor(value).to(self.raw_max_precision)
        if not (torch.isfinite(value).all() and (value > 0).all()):
            raise ValueError(f"max_precision must be positive and finite; got {value}")
        raw = self.raw_max_precision_constraint.inverse_transform(value)
        if raw.shape == self.raw_max_precision.shape:
            self.initialize(raw_max_precision=raw)
        else:  # e.g. one xi per Gibbs chain
            self.raw_max_precision.data = raw

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
        :math:`n\mid\gamma,f,g\sim\mathrm{Po}(\xi\gamma\sigma(-g)\rho)`, :math:`\omega\mid n,g\sim\mathrm{PG}(\frac12+n,|g|)`."""
        f_, g = _split(f)
        rho = 0.5 * (y - f_) ** 2
        rate = self._xi * torch.sigmoid(-g) * rho
        return AuxiliaryDistribution(
            **self._gamma_factors(y, f_, g),
            n=lambda aux: Poisson(self._gamma(aux) * rate),
            omega=lambda aux: PolyaGamma(0.5 + aux["n"], g.abs().expand_as(aux["n"])),
        )

    def potential_and_precision(self, y: Tensor, aux: AuxDict, f: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r"""Latent-major ``(..., 2, N)``: the collapsed conditional of :math:`f` given :math:`(g, \gamma)`,
        :math:`(\xi\gamma\sigma(g)y,\ \xi\gamma\sigma(g))`, and the tilt of :math:`g`, :math:`((\frac12-n)/2,\ \omega)`."""
        if f is None:
            raise ValueError("heteroscedastic likelihoods need the current latents f (the f-step is collapsed over Ω)")
        _, g = _split(f)
        precision_f = self._gamma(aux) * self._xi * torch.sigmoid(g)
        n, omega = aux["n"], aux["omega"]
        return _latent_major(precision_f * y, (0.5 - n) / 2), _latent_major(precision_f, omega)

    def log_tilt_constant(self, y: Tensor, aux: AuxDict) -> Tensor:
        r""":math:`\frac12\log\frac{\xi\gamma}{2\pi} - (\frac12+n)\log 2`, the part of :meth:`log_tilt` free of
        :math:`(f, g)`."""
        n = aux["n"]
        gamma = torch.as_tensor(self._gamma(aux), dtype=n.dtype)
        return 0.5 * (self._xi.log() + gamma.log() - _LOG_2PI) - (0.5 + n) * LOG2

    def log_tilt(self, y: Tensor, aux: AuxDict, f: Tensor) -> Tensor:
        r""":math:`\log p(y, \Omega\mid f, g) - \log p_{\rm ref}(\Omega)`:
        :math:`\frac12\log\frac{\xi\gamma}{2\pi} - (\frac12+n)\log2 + n\log(\gamma\rho) + \xi(1-\gamma\rho)
        + \frac12(\frac12-n)g - \frac12\omega g^2`. Quadratic in :math:`g`; in :math:`f` it is the Poisson factor
        (the :math:`f`-step uses the collapsed conditional instead, see :meth:`potential_and_precision`)."""
        f_, g = _split(f)
        n, omega = aux["n"], aux["omega"]
        gamma_rho = self._gamma(aux) * 0.5 * (y - f_) ** 2
        poisson = torch.xlogy(n, gamma_rho) + self._xi * (1 - gamma_rho)
        return self.log_tilt_constant(y, aux) + poisson + 0.5 * (0.5 - n) * g - 0.5 * omega * g**2

    def sample_hyperparameters(
        self, y: Tensor, aux: AuxDict, f: Tensor, generator: torch.Generator | None = None
    ) -> AuxDict | None:
        r"""Under ``max_precision_prior=(a, b)``, the collapsed Gibbs step (§10.2 step 2, §11.3 step 2)
        :math:`\xi\mid f, g, [\gamma] \sim \mathrm{Ga}\big(a + \frac N2,\ b + \sum_i\gamma_i\sigma(g_i)\rho_i\big)`,
        marginal over :math:`(n, \omega)`; it returns a fresh :math:`\Omega \sim p(\Omega\mid y, f, g, \xi)`, so nothing
        conditions on the stale :math:`(n, \omega)` (a no-op returning ``None`` without a prior). One :math:`\xi` per
        chain: leading dimensions of ``f`` are chains."""
        if self.max_precision_prior is None:
            return None
        a, b = self.max_precision_prior
        f_, g = _split(f)
        with torch.no_grad():
            weighted = self._gamma(aux) * torch.sigmoid(g) * 0.5 * (y - f_) ** 2
            rate = b + weighted.sum(-1, keepdim=True)
            with seeded_by(generator):
                self.max_precision = Gamma(torch.full_like(rate, a + weighted.shape[-1] / 2), rate).sample()
        return self.sample_aux(y, f, generator=generator)

    # ------------------------------------------------------------------ variational side
    def _sigma_tildes(self, f_mean: Tensor, q_aux: AuxDict) -> tuple[Tensor, Tensor]:
        r""":math:`(\tilde\sigma, 1 - \tilde\sigma)` at :math:`(m_g, c)`."""
        log_st = log_sigma_tilde(f_mean[..., 1], q_aux["c"])
        return log_st.exp(), -torch.expm1(log_st)

    def _optimal_q(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        r""":math:`(c_g, \phi, \tilde\sigma, 1 - \tilde\sigma)` of the current marginals."""
        m_f, m_g = _split(f_mean)
        s_f, s_g = _split(f_var)
        c = (m_g**2 + s_g).sqrt()
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
        return _latent_major(precision_f * y, (0.5 - n_mean) / 2), _latent_major(
            precision_f, pg_mean(0.5 + n_mean, q_aux["c"])
        )

    def expected_log_tilt_constant(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        _, e_log_gamma, _ = self._q_gamma(q_aux)
        return 0.5 * (self._xi.log() + e_log_gamma - _LOG_2PI) - (0.5 + self._n_mean(q_aux)) * LOG2

    def expected_log_tilt(self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor) -> Tensor:
        r"""The double-bound expectation of :meth:`log_tilt`: :math:`\rho\to\phi` (:math:`E_{q(f)}` taken first),
        :math:`E_q[n\log(\gamma\phi)] = \xi r\,E[\gamma\log\gamma] + \bar n\log\phi`, the :math:`g`-part as usual."""
        m_f, m_g = _split(f_mean)
        s_f, s_g = _split(f_var)
        phi = self._phi(y, m_f, s_f)
        e_gamma, _, e_gamma_log_gamma = self._q_gamma(q_aux)
        xi, n_mean, c = self._xi, self._n_mean(q_aux), q_aux["c"]
        poisson = xi * q_aux["log_n_rate"].exp() * e_gamma_log_gamma + torch.xlogy(n_mean, phi) + xi * (1 - e_gamma * phi)
        g_part = 0.5 * (0.5 - n_mean) * m_g - 0.5 * pg_mean(0.5 + n_mean, c) * (m_g**2 + s_g)
        return self.expected_log_tilt_constant(y, q_aux) + poisson + g_part

    def aux_kl(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        r""":math:`\mathrm{KL}(q(\Omega)\Vert p_{\rm ref})`: :math:`[\mathrm{KL}(q(\gamma)\Vert\mathrm{Ga}(\frac\nu2,\frac\nu2))]
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
        z = math.sqrt(2.0) * torch.special.erfinv(torch.tensor(float(level), dtype=m_g.dtype))
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

    # ------------------------------------------------------------------ hyper-parameters
    def _map_xi(self, y: Tensor, weighted_phi: Tensor) -> Tensor:
        r""":math:`\xi = (\frac N2 [+ a - 1]) / ([b +] \sum_i w_i)` for ``weighted_phi`` :math:`w_i`."""
        num = 0.5 * weighted_phi.shape[-1]
        total = weighted_phi.sum(-1, keepdim=True)
        if self.max_precision_prior is not None:
            a, b = self.max_precision_prior
            return (num + a - 1) / (b + total)
        return num / total


class HeteroscedasticGaussianLikelihood(_HeteroscedasticLikelihood):
    r"""Gaussian regression with input-dependent noise (``augmentations.md`` §10), two latents :math:`(f, g)`:

    .. math::
        p(y\mid f, g) = \mathcal N\big(y\mid f, (\xi\sigma(g))^{-1}\big),\qquad
        p(y, n, \omega\mid f, g) = \sqrt{\tfrac{\xi}{2\pi}}\,2^{-(\frac12+n)}
        e^{\frac12((\frac12-n)g-\omega g^2)}\,\mathrm{PG}(\omega\mid\tfrac12+n, 0)\,\mathrm{Po}\big(n\mid\tfrac\xi2(y-f)^2\big).

    :math:`\xi` is the largest noise precision; :math:`g` sets the noise through the inverse scaled-logistic link.

    * **Gibbs** (valid partially collapsed order, §10.2): :math:`f\mid g,\xi` collapsed
      (:math:`h_f=\xi\sigma(g)y`, :math:`\lambda_f=\xi\sigma(g)`); optionally :math:`\xi\mid f,g` (Gamma prior);
      :math:`n\mid f,g\sim\mathrm{Po}(\frac\xi2\sigma(-g)(y-f)^2)`, :math:`\omega\mid n,g\sim\mathrm{PG}(\frac12+n,|g|)`;
      :math:`g\mid n,\omega`. (Drawing :math:`f` and :math:`g` "in parallel" from one :math:`\Omega` is **not** valid.)
    * **CAVI** (double bound, §10.3): :math:`q(n,\omega)=\mathrm{Po}(\bar n)\,\mathrm{PG}(\frac12+n, c_g)`,
      :math:`\bar n=\xi\phi\tilde\sigma`; :math:`\bar h_g=(\frac12-\bar n)/2`, :math:`\bar\lambda_g=\mathrm{PGm}(\frac12+\bar n,c_g)`;
      :math:`\bar h_f=\xi(1-\tilde\sigma)y`, :math:`\bar\lambda_f=\xi(1-\tilde\sigma)` (no :math:`/2`); :math:`q(g)` and
      :math:`q(f)` are updated one after the other (``latent_blocks``) and the bound
      :math:`\ell_i^*=\frac12\log\frac\xi{2\pi}+\frac12\log\tilde\sigma^+_i-\xi\phi_i(1-\tilde\sigma_i)` never decreases.
      It is a lower bound on the true :math:`E_q\log p(y\mid f,g)`.
    * :meth:`update_hyperparameters`: :math:`\xi\leftarrow N/(2\sum_i\phi_i(1-\tilde\sigma_i))`, the exact maximiser
      of :math:`\sum_i\ell_i^*` (MAP :math:`(\frac N2+a-1)/(b+\sum_i\phi_i(1-\tilde\sigma_i))` under
      ``max_precision_prior=(a, b)``); skipped when ``learn_max_precision=False``.
    * **Predictive**: :meth:`marginal` is :math:`E_{q(g)}\mathcal N(y\mid m_f, s_f + 1/(\xi\sigma(g)))` (exact in
      :math:`f`, Gauss--Hermite in :math:`g`), with mean :math:`m_f` and variance
      :math:`s_f+(1+e^{-m_g+s_g/2})/\xi`; :meth:`noise_variance` gives the noise level with its band.

    Example::

        >>> # an ApproximateGP whose strategy is IndependentMultitaskVariationalStrategy(CAVIVariationalStrategy(
        >>> #     model, Z, CholeskyVariationalDistribution(M, batch_shape=[2])), num_tasks=2): task 0 is f, 1 is g
        >>> likelihood = HeteroscedasticGaussianLikelihood(max_precision=10.0)
        >>> CAVI(model, likelihood, num_data=len(y)).fit(x, y)   # also fits xi
        >>> model.eval(); q = model(x_test)
        >>> mean, var = likelihood.predictive_moments(q); noise = likelihood.noise_variance(q)
        >>> samples = GibbsSampler(exact_model, likelihood, x, y).sample(1000)   # exact-GP Gibbs

    :param max_precision: initial :math:`\xi > 0`.
    :param max_precision_prior: optional :math:`(a, b)` of a :math:`\mathrm{Ga}(a, b)` prior on :math:`\xi`: the Gibbs
        step of :meth:`sample_hyperparameters` and the MAP update of CAVI.
    :param learn_max_precision: if ``False``, :math:`\xi` is fixed (no CAVI update, no gradient).
    :param batch_shape: batch shape of :math:`\xi`.
    """

    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> Normal:
        f, g = _split(function_samples)
        return Normal(f, torch.exp(-0.5 * self._noise_log_precision(g)))

    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        f_, g = _split(f)
        log_prec = self._noise_log_precision(g)
        return 0.5 * (log_prec - _LOG_2PI) - 0.5 * log_prec.exp() * (y - f_) ** 2

    def expected_log_prob(self, observations: Tensor, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> Tensor:
        r""":math:`\frac12\log\frac{\xi}{2\pi} + \frac12E\log\sigma(g) - \xi E\sigma(g)\,\phi`, closed form in :math:`f`,
        Gauss--Hermite in :math:`g` (a 1-D rule over both latents would integrate along a diagonal)."""
        y = self.check_observations(observations, function_dist, **kwargs)
        mean, var = self._moments(function_dist)
        nodes, weights = gauss_hermite(mean[..., 1], var[..., 1], NUM_QUADRATURE_LOCS)
        e_log_sigma = (weights * logsigmoid(nodes)).sum(0)
        e_sigma = (weights * torch.sigmoid(nodes)).sum(0)
        phi = self._phi(y, mean[..., 0], var[..., 0])
        return 0.5 * (self._xi.log() + e_log_sigma - _LOG_2PI) - self._xi * e_sigma * phi

    def marginal(self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> MixtureSameFamily:
        r""":math:`\sum_k w_k\,\mathcal N\big(y\mid m_f, s_f + 1/(\xi\sigma(g_k))\big)` over Gauss--Hermite nodes of
        :math:`q(g)`."""
        mean, var = self._moments(function_dist)
        nodes, weights = gauss_hermite(mean[..., 1], var[..., 1], NUM_QUADRATURE_LOCS)
        m_f, s_f = mean[..., 0:1], var[..., 0:1]
        xi = self._xi.unsqueeze(-1)
        return quadrature_mixture(
            nodes, weights, lambda g: Normal(m_f, (s_f + 1 / (xi * torch.sigmoid(g))).sqrt())
        )

    def log_marginal(self, observations: Tensor, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> Tensor:
        y = self.check_observations(observations, function_dist, **kwargs)
        return self.marginal(function_dist).log_prob(y)

    def collapsed_bound(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> Tensor:
        r""":math:`\ell^*=\frac12\log\frac\xi{2\pi}+\frac12\log\tilde\sigma^+(m_g,c_g)-\xi\phi(1-\tilde\sigma)`."""
        c, phi, _, one_minus = self._optimal_q(y, f_mean, f_var)
        log_stp = log_sigma_tilde_plus(f_mean[..., 1], c)
        return 0.5 * (self._xi.log() - _LOG_2PI + log_stp) - self._xi * phi * one_minus

    @torch.no_grad()
    def update_hyperparameters(self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor) -> None:
        r""":math:`\xi\leftarrow N/(2\sum_i\phi_i(1-\tilde\sigma_i))`, the exact maximiser of :math:`\sum_i\ell_i^*`
        (the MAP step under ``max_precision_prior``)."""
        if not self.raw_max_precision.requires_grad:
            return
        _, phi, _, one_minus = self._optimal_q(y, f_mean, f_var)
        self.max_precision = self._map_xi(y, phi * one_minus)


class HeteroscedasticStudentTLikelihood(_HeteroscedasticLikelihood):
    r"""Student-t regression with input-dependent scale (``augmentations.md`` §11), two latents :math:`(f, g)`:

    .. math::
        p(y\mid f,g)=t_\nu\big(y\mid f,(\xi\sigma(g))^{-1/2}\big)
        =\frac{\Gamma(\alpha)\sqrt{\xi\sigma(g)}}{\Gamma(\frac\nu2)\sqrt{\pi\nu}}
        \Big(1+\frac{\xi\sigma(g)(y-f)^2}{\nu}\Big)^{-\alpha},\qquad\alpha=\frac{\nu+1}2,

    (:math:`\xi\sigma(g)` multiplies the **precision**). Route A of §11.2: :math:`\gamma\sim\mathrm{Ga}(\frac\nu2,\frac\nu2)`,
    :math:`y\mid f,g,\gamma\sim\mathcal N(f,(\xi\gamma\sigma(g))^{-1})`, then the augmentation of §10 with
    :math:`\xi\to\xi\gamma`; ``aux = {"gamma", "n", "omega"}``.

    * **Gibbs** (§11.3): :math:`f\mid g,\gamma,\xi` collapsed (:math:`h_f=\xi\gamma\sigma(g)y`,
      :math:`\lambda_f=\xi\gamma\sigma(g)`); optionally :math:`\xi\mid f,g,\gamma`; then
      :math:`\gamma\mid f,g\sim\mathrm{Ga}(\alpha,\frac\nu2+\frac\xi2\sigma(g)(y-f)^2)`,
      :math:`n\mid\gamma\sim\mathrm{Po}(\frac{\xi\gamma}2\sigma(-g)(y-f)^2)`, :math:`\omega\sim\mathrm{PG}(\frac12+n,|g|)`; :math:`g\mid n,\omega`.
    * **CAVI** (§11.4): :math:`q(\gamma)=\mathrm{Ga}(\alpha,\delta)`, :math:`\delta=\frac\nu2+\xi\phi(1-\tilde\sigma)`,
      :math:`q(n\mid\gamma)=\mathrm{Po}(\xi\gamma\phi\tilde\sigma)`, :math:`q(\omega\mid n)=\mathrm{PG}(\frac12+n,c_g)`;
      :math:`\bar h_f=\xi\bar\gamma(1-\tilde\sigma)y`, :math:`\bar\lambda_f=\xi\bar\gamma(1-\tilde\sigma)`, the :math:`g`-terms
      as in §10 with :math:`\bar n=\xi\bar\gamma\phi\tilde\sigma`, and
      :math:`\ell^*=\log\frac{\Gamma(\alpha)}{\Gamma(\frac\nu2)\sqrt{\pi\nu}}+\frac12\log\xi+\frac12\log\tilde\sigma^+
      -\alpha\log\big(1+\frac{2\xi\phi(1-\tilde\sigma)}{\nu}\big)`.
    * :meth:`update_hyperparameters`: :math:`\xi\leftarrow N/(2\sum_i\bar\gamma_i\phi_i(1-\tilde\sigma_i))` with
      :math:`q(\gamma)` fixed (MAP under ``max_precision_prior``), then, with ``learn_df=True``, :math:`\nu\leftarrow
      \arg\max_\nu\sum_i\ell_i^*` (a log-spaced grid over ``df_bounds`` refined by golden-section search; the step
      is only taken if it increases :math:`\sum_i\ell_i^*`). Both keep CAVI monotone.
    * **Predictive**: :math:`E_{q(f)q(g)}t_\nu` as a Gauss--Hermite mixture over :math:`g` of the exact
      :math:`f`-integrated :class:`~gpytorch_augment.likelihoods.StudentTPredictive`; mean :math:`m_f`, variance
      :math:`s_f+\frac\nu{\nu-2}(1+e^{-m_g+s_g/2})/\xi` (:math:`\nu>2`).

    Example::

        >>> likelihood = HeteroscedasticStudentTLikelihood(df=4.0, max_precision=10.0, learn_df=True)
        >>> CAVI(model, likelihood, num_data=len(y)).fit(x, y)      # fits xi and nu too
        >>> likelihood(model(x_test)).log_prob(y_test)

    :param df: degrees of freedom :math:`\nu > 0`.
    :param max_precision: initial :math:`\xi > 0`.
    :param max_precision_prior: optional Gamma prior :math:`(a, b)` on :math:`\xi` (Gibbs step, CAVI MAP step).
    :param learn_max_precision: if ``False``, :math:`\xi` is fixed.
    :param learn_df: if ``True``, CAVI updates :math:`\nu` (and it receives gradients); fixed otherwise.
    :param df_bounds: search interval of the :math:`\nu` update.
    :param batch_shape: batch shape of the constants.
    """

    def __init__(
        self,
        df: float | Tensor = 4.0,
        max_precision: float | Tensor = 1.0,
        max_precision_prior: tuple[float, float] | None = None,
        learn_max_precision: bool = True,
        learn_df: bool = False,
        df_bounds: tuple[float, float] = (0.2, 200.0),
        batch_shape: torch.Size = torch.Size(),
    ) -> None:
        super().__init__(max_precision, max_precision_prior, learn_max_precision, batch_shape)
        lo, hi = (float(v) for v in df_bounds)
        if not (0 < lo < hi and math.isfinite(hi)):
            raise ValueError(f"df_bounds must be 0 < low < high < inf; got {df_bounds}")
        self.df_bounds = (lo, hi)
        self.register_parameter("raw_df", torch.nn.Parameter(torch.zeros(*batch_shape, 1), requires_grad=learn_df))
        self.register_constraint("raw_df", gpytorch.constraints.Positive())
        self.df = df

    @property
    def df(self) -> Tensor:
        r"""The degrees of freedom :math:`\nu`, shape ``(*batch_shape, 1)``."""
        return self.raw_df_constraint.transform(self.raw_df)

    @df.setter
    def df(self, value: float | Tensor) -> None:
        value = torch.as_tensor(value).to(self.raw_df)
        if not (torch.isfinite(value).all() and (value > 0).all()):
            raise ValueError(f"df must be positive and finite; got {value}")
        self.initialize(raw_df=self.raw_df_constraint.inverse_transform(value))

    @property
    def _alpha(self) -> Tensor:
        return (self.df + 1) / 2

    def _log_normaliser(self, df: Tensor) -> Tensor:
        return torch.lgamma((df + 1) / 2) - torch.lgamma(df / 2) - 0.5 * torch.log(math.pi * df)

    # ------------------------------------------------------------------ gamma hooks
    def _gamma(self, aux: AuxDict) -> Tensor:
        return aux["gamma"]

    def _gamma_factors(self, y: Tensor, f: Tensor | None, g: Tensor | None) -> dict[str, Any]:
        half_df = (self.df / 2) * torch.ones_like(y)
        if f is None:
            return {"gamma": Gamma(half_df, half_df)}
        rate = half_df + self._xi * torch.sigmoid(g) * 0.5 * (y - f) ** 2
        return {"gamma": Gamma(self._alpha.expand_as(rate), rate)}

    def _delta(self, q_aux: AuxDict) -> Tensor:
        return self.df / 2 + self._xi * q_aux["kappa"]

    def _q_gamma(self, q_aux: AuxDict) -> tuple[Tensor, Tensor, Tensor]:
        alpha, delta = self._alpha, self._delta(q_aux)
        e_gamma = alpha / delta
        log_delta = delta.log()
        return e_gamma, torch.digamma(alpha) - log_delta, e_gamma * (torch.digamma(alpha + 1) - log_delta)

    def _q_gamma_kl(self, q_aux: AuxDict) -> Tensor:
        delta = self._delta(q_aux)
        half_df = (self.df / 2).expand_as(delta)
        return kl_divergence(Gamma(self._alpha.expand_as(delta), delta), Gamma(half_df, half_df))

    def _noise_variance_factor(self) -> Tensor:
        df = self.df
        return torch.where(df > 2, df / (df - 2).clamp_min(1e-300), torch.inf)

    # ------------------------------------------------------------------ drop-in
    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> StudentT:
        f, g = _split(function_samples)
        return StudentT(self.df, f, torch.exp(-0.5 * self._noise_log_precision(g)))

    def _log_t(self, df: Tensor, log_precision: Tensor, r2: Tensor) -> Tensor:
        r""":math:`\log t_\nu` with precision :math:`e^{\text{log\_precision}}` at squared residual ``r2``."""
        return self._log_normaliser(df) + 0.5 * log_precision - (df + 1) / 2 * torch.log1p(log_precision.exp() * r2 / df)

    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        f_, g = _split(f)
        return self._log_t(self.df, self._noise_log_precision(g), (y - f_) ** 2)

    def expected_log_prob(self, observations: Tensor, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> Tensor:
        r""":math:`E_{q(f)q(g)}\log t_\nu`: Gauss--Hermite in :math:`g` and, per node, the exact :math:`f`-expectation
        :math:`E\log(1+\xi\sigma(g)(y-f)^2/\nu)` (Frullani's integral)."""
        y = self.check_observations(observations, function_dist, **kwargs)
        mean, var = self._moments(function_dist)
        nodes, weights = gauss_hermite(mean[..., 1], var[..., 1], NUM_QUADRATURE_LOCS)
        log_prec = self._noise_log_precision(nodes)
        df = self.df
        e_log1p = _expected_log1p_square((y - mean[..., 0]) ** 2, var[..., 0], df / log_prec.exp())
        values = self._log_normaliser(df) + 0.5 * log_prec - (df + 1) / 2 * e_log1p
        return (weights * values).sum(0)

    def marginal(self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> MixtureSameFamily:
        r""":math:`\sum_k w_k\,\int t_\nu(y\mid f,(\xi\sigma(g_k))^{-1/2})\,q(f)\,df` over Gauss--Hermite nodes
        :math:`g_k` of :math:`q(g)`; each component is a :class:`StudentTPredictive`."""
        mean, var = self._moments(function_dist)
        nodes, weights = gauss_hermite(mean[..., 1], var[..., 1], NUM_QUADRATURE_LOCS)
        m_f, s_f = mean[..., 0:1], var[..., 0:1]
        xi, df = self._xi.unsqueeze(-1), self.df.unsqueeze(-1)
        return quadrature_mixture(
            nodes,
            weights,
            lambda g: StudentTPredictive(df, m_f, s_f, torch.exp(-0.5 * (xi.log() + logsigmoid(g)))),
        )

    def log_marginal(self, observations: Tensor, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> Tensor:
        y = self.check_observations(observations, function_dist, **kwargs)
        return self.marginal(function_dist).log_prob(y)

    # ------------------------------------------------------------------ variational side
    def aux_posterior(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> AuxDict:
        c, phi, _, one_minus = self._optimal_q(y, f_mean, f_var)
        return {"c": c, "log_n_rate": phi.log() + log_sigma_tilde(f_mean[..., 1], c), "kappa": phi * one_minus}

    def _collapsed(self, df: Tensor, xi: Tensor, u: Tensor, log_stp: Tensor) -> Tensor:
        r""":math:`\ell^*` as a function of :math:`\nu`, :math:`\xi`, :math:`u=\phi(1-\tilde\sigma)` and
        :math:`\log\tilde\sigma^+`."""
        return self._log_normaliser(df) + 0.5 * (xi.log() + log_stp) - (df + 1) / 2 * torch.log1p(2 * xi * u / df)

    def collapsed_bound(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> Tensor:
        r""":math:`\ell^*`: the t log-density with :math:`(y-f)^2\to2\phi`, :math:`\log\sigma(g)\to\log\tilde\sigma^+` in
        the normaliser and :math:`\sigma(g)\to1-\tilde\sigma` in the kernel."""
        c, phi, _, one_minus = self._optimal_q(y, f_mean, f_var)
        return self._collapsed(self.df, self._xi, phi * one_minus, log_sigma_tilde_plus(f_mean[..., 1], c))

    @torch.no_grad()
    def update_hyperparameters(self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor) -> None:
        r""":math:`\xi\leftarrow N/(2\sum_i\bar\gamma_i\phi_i(1-\tilde\sigma_i))` with :math:`q(\gamma)` fixed (MAP
        under ``max_precision_prior``), then (``learn_df=True``) :math:`\nu\leftarrow\arg\max_\nu\sum_i\ell_i^*`."""
        c, phi, _, one_minus = self._optimal_q(y, f_mean, f_var)
        u = phi * one_minus
        if self.raw_max_precision.requires_grad:
            e_gamma = self._alpha / (self.df / 2 + self._xi * u)
            self.max_precision = self._map_xi(y, e_gamma * u)
        if self.raw_df.requires_grad:
            self.df = self.maximise_df(u)

    @torch.no_grad()
    def maximise_df(self, u: Tensor) -> Tensor:
        r"""The :math:`\nu` in ``df_bounds`` maximising :math:`\sum_i\ell_i^*(\nu)` for :math:`u_i=\phi_i(1-\tilde\sigma_i)`
        at the current :math:`\xi` (the current :math:`\nu` if no better value is found): the best point of a
        log-spaced grid, refined by golden-section search between its neighbours (to ~1e-9 in :math:`\log\nu`)."""
        current = self.df
        v = 2 * self._xi * u

        def objective(log_df: Tensor) -> Tensor:  # (G, *param_shape) -> (G, *param_shape); the nu-dependent part
            df = log_df.exp()
            return (self._log_normaliser(df) - (df + 1) / 2 * torch.log1p(v / df)).sum_to_size(df.shape)

        lo, hi = (math.log(b) for b in self.df_bounds)
        grid = torch.linspace(lo, hi, _DF_GRID, dtype=u.dtype, device=u.device).view(-1, *([1] * current.dim()))
        grid = grid.expand(-1, *current.shape)
        centre = grid.gather(0, objective(grid).argmax(0, keepdim=True))
        step = (hi - lo) / (_DF_GRID - 1)
        a, b = (centre - step).clamp_min(lo), (centre + step).clamp_max(hi)
        ratio = (math.sqrt(5.0) - 1) / 2
        c, d = b - ratio * (b - a), a + ratio * (b - a)
        fc, fd = objective(c), objective(d)
        for _ in range(_GOLDEN_STEPS):  # keep the bracket [a, b] around the maximum; one evaluation per step
            left = fc >= fd
            a, b = torch.where(left, a, c), torch.where(left, d, b)
            new = torch.where(left, b - ratio * (b - a), a + ratio * (b - a))
            f_new = objective(new)
            c, d, fc, fd = (
                torch.where(left, new, d),
                torch.where(left, c, new),
                torch.where(left, f_new, fd),
                torch.where(left, fc, f_new),
            )
        best = torch.where(fc >= fd, c, d)
        improves = objective(best) >= objective(current.log().unsqueeze(0))
        return torch.where(improves, best.exp(), current.unsqueeze(0))[0]
