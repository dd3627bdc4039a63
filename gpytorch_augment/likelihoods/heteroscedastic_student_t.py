r"""Student-t regression with input-dependent scale, augmented through a Gamma precision and its bounded noise
precision."""

from __future__ import annotations

import math
from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor
from torch.distributions import Gamma, MixtureSameFamily, StudentT, kl_divergence
from torch.nn.functional import logsigmoid

from .._numerics import (
    bounded_maximise,
    expected_log1p_square,
    gauss_hermite,
    log_sigma_tilde,
    log_sigma_tilde_plus,
    quadrature_mixture,
    student_t_log_normaliser,
)
from ..distributions.student_t_predictive import StudentTPredictive
from ._constants import PositiveConstant, register_positive_constant, set_positive_constant
from ._heteroscedastic import HeteroscedasticLikelihoodBase, split_latents
from .augmented_likelihood import NUM_QUADRATURE_LOCS, AuxDict

__all__ = ["HeteroscedasticStudentTLikelihood"]


class HeteroscedasticStudentTLikelihood(HeteroscedasticLikelihoodBase):
    r"""Student-t regression with input-dependent scale (:doc:`/maths/heteroscedastic`), two latents :math:`(f, g)`:

    .. math::
        p(y\mid f,g)=t_\nu\big(y\mid f,(\xi\sigma(g))^{-1/2}\big)
        =\frac{\Gamma(\alpha)\sqrt{\xi\sigma(g)}}{\Gamma(\frac\nu2)\sqrt{\pi\nu}}
        \Big(1+\frac{\xi\sigma(g)(y-f)^2}{\nu}\Big)^{-\alpha},\qquad\alpha=\frac{\nu+1}2,

    (:math:`\xi\sigma(g)` multiplies the **precision**). Route A:
    :math:`\gamma\sim\mathrm{Ga}(\frac\nu2,\frac\nu2)`,
    :math:`y\mid f,g,\gamma\sim\mathcal N(f,(\xi\gamma\sigma(g))^{-1})`, then the augmentation of
    :class:`~gpytorch_augment.likelihoods.HeteroscedasticGaussianLikelihood` with
    :math:`\xi\to\xi\gamma`; ``aux = {"gamma", "n", "omega"}``.

    * **Gibbs**: :math:`f\mid g,\gamma,\xi` collapsed (:math:`h_f=\xi\gamma\sigma(g)y`,
      :math:`\lambda_f=\xi\gamma\sigma(g)`); optionally :math:`\xi\mid f,g,\gamma`; then
      :math:`\gamma\mid f,g\sim\mathrm{Ga}(\alpha,\frac\nu2+\frac\xi2\sigma(g)(y-f)^2)`,
      :math:`n\mid\gamma\sim\mathrm{Po}(\frac{\xi\gamma}2\sigma(-g)(y-f)^2)`,
      :math:`\omega\sim\mathrm{PG}(\frac12+n,|g|)`; :math:`g\mid n,\omega`.
    * **CAVI**: :math:`q(\gamma)=\mathrm{Ga}(\alpha,\delta)`, :math:`\delta=\frac\nu2+\xi\phi(1-\tilde\sigma)`,
      :math:`q(n\mid\gamma)=\mathrm{Po}(\xi\gamma\phi\tilde\sigma)`, :math:`q(\omega\mid n)=\mathrm{PG}(\frac12+n,c_g)`;
      :math:`\bar h_f=\xi\bar\gamma(1-\tilde\sigma)y`, :math:`\bar\lambda_f=\xi\bar\gamma(1-\tilde\sigma)`, the
      :math:`g`-terms
      as for the Gaussian with :math:`\bar n=\xi\bar\gamma\phi\tilde\sigma`, and
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

        >>> import torch
        >>> from gpytorch.distributions import MultitaskMultivariateNormal
        >>> from gpytorch_augment import HeteroscedasticStudentTLikelihood
        >>> likelihood = HeteroscedasticStudentTLikelihood(df=4.0, max_precision=10.0, learn_df=True)
        >>> q = MultitaskMultivariateNormal(torch.zeros(3, 2), torch.eye(6))     # latents (f, g) at 3 inputs
        >>> likelihood(q).log_prob(torch.tensor([0.1, -0.2, 2.0])).shape
        torch.Size([3])
        >>> median = likelihood.predictive_quantile(q, 0.5)                       # m_f by symmetry
        >>> bool(median.abs().max() < 1e-6)
        True

    :param df: degrees of freedom :math:`\nu > 0`.
    :param max_precision: initial :math:`\xi > 0`.
    :param max_precision_prior: optional Gamma prior :math:`(a, b)` on :math:`\xi` (Gibbs step, CAVI MAP step).
    :param learn_max_precision: if ``False``, :math:`\xi` is fixed.
    :param learn_df: if ``True``, CAVI updates :math:`\nu` (and it receives gradients); fixed otherwise.
    :param df_bounds: search interval of the :math:`\nu` update.
    :param batch_shape: batch shape of the constants.
    """

    augmentation = "Poisson + Pólya-Gamma + Gamma, partially collapsed"
    maths_page = "heteroscedastic"

    #: what ``posterior_sampler(method="auto")`` builds (the guide's "Which engine, when" gives the evidence)
    preferred_sampler = "hmc"

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
        register_positive_constant(self, "df", df, batch_shape, requires_grad=learn_df)

    df = PositiveConstant(r"The degrees of freedom :math:`\nu`, shape ``(*batch_shape, 1)``.")

    @property
    def _alpha(self) -> Tensor:
        return (self.df + 1) / 2

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
        q = Gamma(self._alpha.expand_as(delta), delta, validate_args=False)  # checked values: no device read-back
        return kl_divergence(q, Gamma(half_df, half_df, validate_args=False))

    def _noise_variance_factor(self) -> Tensor:
        df = self.df
        return torch.where(df > 2, df / (df - 2).clamp_min(1e-300), torch.inf)

    def _predictive_df(self) -> Tensor:
        return self.df.detach()

    def _component_cdf(self, z: Tensor, df: Tensor | None) -> Tensor:
        """The Student-t CDF, ``scipy.special.stdtr`` on the host (float64; torch has no regularised beta)."""
        from scipy.special import stdtr

        df = torch.as_tensor(df).expand_as(z)
        value = stdtr(df.detach().cpu().numpy(), z.detach().cpu().numpy())
        return torch.as_tensor(value, dtype=torch.float64, device=z.device)

    # ------------------------------------------------------------------ drop-in
    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> StudentT:
        f, g = split_latents(function_samples)
        return StudentT(self.df, f, torch.exp(-0.5 * self._noise_log_precision(g)))

    def _log_t(self, df: Tensor, log_precision: Tensor, r2: Tensor) -> Tensor:
        r""":math:`\log t_\nu` with precision :math:`e^{\text{log\_precision}}` at squared residual ``r2``."""
        kernel = torch.log1p(log_precision.exp() * r2 / df)
        return student_t_log_normaliser(df) + 0.5 * log_precision - (df + 1) / 2 * kernel

    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        f_, g = split_latents(f)
        return self._log_t(self.df, self._noise_log_precision(g), (y - f_) ** 2)

    def expected_log_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        r""":math:`E_{q(f)q(g)}\log t_\nu`: Gauss--Hermite in :math:`g` and, per node, the exact :math:`f`-expectation
        :math:`E\log(1+\xi\sigma(g)(y-f)^2/\nu)` (Frullani's integral)."""
        mean, var = self._moments(function_dist)
        nodes, weights = gauss_hermite(mean[..., 1], var[..., 1], NUM_QUADRATURE_LOCS)
        log_prec = self._noise_log_precision(nodes)
        df = self.df
        e_log1p = expected_log1p_square((y - mean[..., 0]) ** 2, var[..., 0], df / log_prec.exp())
        values = student_t_log_normaliser(df) + 0.5 * log_prec - (df + 1) / 2 * e_log1p
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

    def log_marginal_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        return self.marginal(function_dist).log_prob(y)

    # ------------------------------------------------------------------ variational side
    def aux_posterior(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> AuxDict:
        c, phi, _, one_minus = self._optimal_q(y, f_mean, f_var)
        return {"c": c, "log_n_rate": phi.log() + log_sigma_tilde(f_mean[..., 1], c), "kappa": phi * one_minus}

    def _collapsed(self, df: Tensor, xi: Tensor, u: Tensor, log_stp: Tensor) -> Tensor:
        r""":math:`\ell^*` as a function of :math:`\nu`, :math:`\xi`, :math:`u=\phi(1-\tilde\sigma)` and
        :math:`\log\tilde\sigma^+`."""
        return student_t_log_normaliser(df) + 0.5 * (xi.log() + log_stp) - (df + 1) / 2 * torch.log1p(2 * xi * u / df)

    def collapsed_bound(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> Tensor:
        r""":math:`\ell^*`: the t log-density with :math:`(y-f)^2\to2\phi`, :math:`\log\sigma(g)\to\log\tilde\sigma^+`
        in
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
            set_positive_constant(self, "max_precision", self._map_xi(y, e_gamma * u), update=True)
        if self.raw_df.requires_grad:
            set_positive_constant(self, "df", self.maximise_df(u), update=True)

    @torch.no_grad()
    def maximise_df(self, u: Tensor) -> Tensor:
        r"""The :math:`\nu` in ``df_bounds`` maximising :math:`\sum_i\ell_i^*(\nu)` for
        :math:`u_i=\phi_i(1-\tilde\sigma_i)`
        at the current :math:`\xi` (the current :math:`\nu` if no better value is found), by
        :func:`~gpytorch_augment._numerics.bounded_maximise` in :math:`\log\nu` (to ~1e-9)."""
        v = 2 * self._xi * u

        def objective(log_df: Tensor) -> Tensor:  # (G, *param_shape) -> (G, *param_shape); the nu-dependent part
            df = log_df.exp()
            return (student_t_log_normaliser(df) - (df + 1) / 2 * torch.log1p(v / df)).sum_to_size(df.shape)

        lo, hi = (math.log(b) for b in self.df_bounds)
        return bounded_maximise(objective, lo, hi, self.df.log()).exp()
