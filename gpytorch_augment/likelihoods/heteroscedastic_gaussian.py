r"""Gaussian regression with input-dependent noise, augmented through its bounded noise precision."""

from __future__ import annotations

from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor
from torch.distributions import MixtureSameFamily, Normal
from torch.nn.functional import logsigmoid

from .._numerics import gauss_hermite, log_sigma_tilde_plus, quadrature_mixture
from ._constants import set_positive_constant
from ._heteroscedastic import LOG_2PI, HeteroscedasticLikelihoodBase, split_latents
from .augmented_likelihood import NUM_QUADRATURE_LOCS, AuxDict

__all__ = ["HeteroscedasticGaussianLikelihood"]


class HeteroscedasticGaussianLikelihood(HeteroscedasticLikelihoodBase):
    r"""Gaussian regression with input-dependent noise (:doc:`/maths/heteroscedastic`), two latents :math:`(f, g)`:

    .. math::
        p(y\mid f, g) = \mathcal N\big(y\mid f, (\xi\sigma(g))^{-1}\big),\qquad
        p(y, n, \omega\mid f, g) = \sqrt{\tfrac{\xi}{2\pi}}\,2^{-(\frac12+n)}
        e^{\frac12((\frac12-n)g-\omega g^2)}\,\mathrm{PG}(\omega\mid\tfrac12+n,
        0)\,\mathrm{Po}\big(n\mid\tfrac\xi2(y-f)^2\big).

    :math:`\xi` is the largest noise precision; :math:`g` sets the noise through the inverse scaled-logistic link.

    * **Gibbs** (valid partially collapsed order): :math:`f\mid g,\xi` collapsed
      (:math:`h_f=\xi\sigma(g)y`, :math:`\lambda_f=\xi\sigma(g)`); optionally :math:`\xi\mid f,g` (Gamma prior);
      :math:`n\mid f,g\sim\mathrm{Po}(\frac\xi2\sigma(-g)(y-f)^2)`,
      :math:`\omega\mid n,g\sim\mathrm{PG}(\frac12+n,|g|)`;
      :math:`g\mid n,\omega`. (Drawing :math:`f` and :math:`g` "in parallel" from one :math:`\Omega` is **not** valid.)
    * **CAVI** (double bound): :math:`q(n,\omega)=\mathrm{Po}(\bar n)\,\mathrm{PG}(\frac12+n, c_g)`,
      :math:`\bar n=\xi\phi\tilde\sigma`; :math:`\bar h_g=(\frac12-\bar n)/2`,
      :math:`\bar\lambda_g=\mathrm{PGm}(\frac12+\bar n,c_g)`;
      :math:`\bar h_f=\xi(1-\tilde\sigma)y`, :math:`\bar\lambda_f=\xi(1-\tilde\sigma)` (no :math:`/2`); :math:`q(g)` and
      :math:`q(f)` are updated one after the other (``latent_blocks``) and the bound
      :math:`\ell_i^*=\frac12\log\frac\xi{2\pi}+\frac12\log\tilde\sigma^+_i-\xi\phi_i(1-\tilde\sigma_i)` never
      decreases.
      It is a lower bound on the true :math:`E_q\log p(y\mid f,g)`.
    * :meth:`update_hyperparameters`: :math:`\xi\leftarrow N/(2\sum_i\phi_i(1-\tilde\sigma_i))`, the exact maximiser
      of :math:`\sum_i\ell_i^*` (MAP :math:`(\frac N2+a-1)/(b+\sum_i\phi_i(1-\tilde\sigma_i))` under
      ``max_precision_prior=(a, b)``); skipped when ``learn_max_precision=False``.
    * **Predictive**: :meth:`marginal` is :math:`E_{q(g)}\mathcal N(y\mid m_f, s_f + 1/(\xi\sigma(g)))` (exact in
      :math:`f`, Gauss--Hermite in :math:`g`), with mean :math:`m_f` and variance
      :math:`s_f+(1+e^{-m_g+s_g/2})/\xi`; :meth:`noise_variance` gives the noise level with its band.

    Example::

        >>> import torch
        >>> from gpytorch.distributions import MultitaskMultivariateNormal
        >>> from gpytorch_augment import HeteroscedasticGaussianLikelihood
        >>> likelihood = HeteroscedasticGaussianLikelihood(max_precision=10.0)
        >>> q = MultitaskMultivariateNormal(torch.zeros(3, 2), torch.eye(6))     # latents (f, g) at 3 inputs
        >>> mean, var = likelihood.predictive_moments(q)
        >>> lower, upper = likelihood.predictive_interval(q, level=0.9)
        >>> bool((lower < mean).all() and (mean < upper).all())
        True

    :param max_precision: initial :math:`\xi > 0`.
    :param max_precision_prior: optional :math:`(a, b)` of a :math:`\mathrm{Ga}(a, b)` prior on :math:`\xi`: the Gibbs
        step of :meth:`sample_hyperparameters` and the MAP update of CAVI.
    :param learn_max_precision: if ``False``, :math:`\xi` is fixed (no CAVI update, no gradient).
    :param batch_shape: batch shape of :math:`\xi`.
    """

    augmentation = "Poisson + Pólya-Gamma, partially collapsed"
    maths_page = "heteroscedastic"

    #: what ``posterior_sampler(method="auto")`` builds (the guide's "Which engine, when" gives the evidence)
    preferred_sampler = "hmc"

    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> Normal:
        f, g = split_latents(function_samples)
        return Normal(f, torch.exp(-0.5 * self._noise_log_precision(g)))

    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        f_, g = split_latents(f)
        log_prec = self._noise_log_precision(g)
        return 0.5 * (log_prec - LOG_2PI) - 0.5 * log_prec.exp() * (y - f_) ** 2

    def log_prob_and_grad(self, y: Tensor, f: Tensor, **kwargs: Any) -> tuple[Tensor, Tensor]:
        r"""The log-density and its gradient: with :math:`\tau = \xi\sigma(g)` and :math:`r = y - f`,
        :math:`\partial_f = \tau r` and :math:`\partial_g = \tfrac12(1 - \sigma(g))(1 - \tau r^2)`."""
        f_, g = split_latents(f)
        log_prec = self._noise_log_precision(g).detach()
        tau, r = log_prec.exp(), y - f_
        value = 0.5 * (log_prec - LOG_2PI) - 0.5 * tau * r * r
        grad_g = 0.5 * torch.sigmoid(-g) * (1 - tau * r * r)
        return value, torch.stack([tau * r, grad_g], dim=-1)

    def expected_log_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        r""":math:`\frac12\log\frac{\xi}{2\pi} + \frac12E\log\sigma(g) - \xi E\sigma(g)\,\phi`, closed form in
        :math:`f`,
        Gauss--Hermite in :math:`g` (a 1-D rule over both latents would integrate along a diagonal)."""
        mean, var = self._moments(function_dist)
        nodes, weights = gauss_hermite(mean[..., 1], var[..., 1], NUM_QUADRATURE_LOCS)
        e_log_sigma = (weights * logsigmoid(nodes)).sum(0)
        e_sigma = (weights * torch.sigmoid(nodes)).sum(0)
        phi = self._phi(y, mean[..., 0], var[..., 0])
        return 0.5 * (self._xi.log() + e_log_sigma - LOG_2PI) - self._xi * e_sigma * phi

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

    def log_marginal_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        return self.marginal(function_dist).log_prob(y)

    def collapsed_bound(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> Tensor:
        r""":math:`\ell^*=\frac12\log\frac\xi{2\pi}+\frac12\log\tilde\sigma^+(m_g,c_g)-\xi\phi(1-\tilde\sigma)`."""
        c, phi, _, one_minus = self._optimal_q(y, f_mean, f_var)
        log_stp = log_sigma_tilde_plus(f_mean[..., 1], c)
        return 0.5 * (self._xi.log() - LOG_2PI + log_stp) - self._xi * phi * one_minus

    @torch.no_grad()
    def update_hyperparameters(self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor) -> None:
        r""":math:`\xi\leftarrow N/(2\sum_i\phi_i(1-\tilde\sigma_i))`, the exact maximiser of :math:`\sum_i\ell_i^*`
        (the MAP step under ``max_precision_prior``)."""
        if not self.raw_max_precision.requires_grad:
            return
        _, phi, _, one_minus = self._optimal_q(y, f_mean, f_var)
        set_positive_constant(self, "max_precision", self._map_xi(y, phi * one_minus), update=True)
