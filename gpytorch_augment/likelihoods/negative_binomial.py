r"""Negative-binomial likelihood with the logistic link, augmented with Pólya-Gamma variables."""

from __future__ import annotations

import math
from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor
from torch.distributions import MixtureSameFamily, NegativeBinomial

from .._numerics import (
    LOG2,
    log_sigma_tilde,
    log_sigma_tilde_plus,
    pg_kl,
    pg_mean,
    pg_tilt_c,
    quadrature_mixture,
    safeguarded_newton,
)
from .._validation import check_counts
from ..distributions.auxiliary import AuxiliaryDistribution
from ..distributions.polya_gamma import PolyaGamma
from ._constants import PositiveConstant, register_positive_constant, set_positive_constant
from ._count_predictive import CountPredictive
from .augmented_likelihood import AugmentedLikelihood, AuxDict

#: the closed-form update keeps :math:`\log r` in this interval (a root beyond it is clipped to the bound)
LOG_TOTAL_COUNT_BOUNDS = (math.log(1e-8), math.log(1e8))


def _log_normaliser(y: Tensor, r: Tensor) -> Tensor:
    r""":math:`\log\frac{\Gamma(y + r)}{y!\,\Gamma(r)}`."""
    return torch.lgamma(y + r) - torch.lgamma(y + 1) - torch.lgamma(r)


def solve_total_count(y: Tensor, sum_log_sigma_tilde: Tensor, iterations: int = 100, rtol: float = 1e-13) -> Tensor:
    r"""The root :math:`r^*` of :math:`g(r) = \sum_i [\psi(y_i + r) - \psi(r)] + S`, :math:`S < 0`, over the last dim.

    :math:`g` decreases from :math:`+\infty` (if :math:`\sum_i y_i > 0`) to :math:`S`, so the root is unique. It is
    found in :math:`u = \log r` by :func:`~gpytorch_augment._numerics.safeguarded_newton` on the bracket
    ``LOG_TOTAL_COUNT_BOUNDS``.
    Vectorised over leading dimensions; ``sum_log_sigma_tilde`` has shape ``(*batch, 1)``. Roots outside the
    bounds are returned as the nearest bound.

    Example::

        >>> import torch
        >>> from gpytorch_augment.likelihoods.negative_binomial import solve_total_count
        >>> y = torch.tensor([[0.0, 3.0, 5.0, 2.0]], dtype=torch.float64)
        >>> S = torch.tensor([[-2.0]], dtype=torch.float64)                  # S < 0, shape (*batch, 1)
        >>> r = solve_total_count(y, S)
        >>> g = (torch.digamma(y + r) - torch.digamma(r)).sum(-1, keepdim=True) + S   # g(r*) = 0
        >>> r.shape, bool(g.abs().max() < 1e-8)
        (torch.Size([1, 1]), True)
    """
    y = y.unsqueeze(-2)  # (*batch, 1, N) against r of shape (*batch, 1, 1)

    def g_and_slope(u: Tensor) -> tuple[Tensor, Tensor]:
        r = u.exp().unsqueeze(-1)
        g = (torch.digamma(y + r) - torch.digamma(r)).sum(-1) + sum_log_sigma_tilde
        dg_dr = (torch.polygamma(1, y + r) - torch.polygamma(1, r)).sum(-1)
        return g, dg_dr * r.squeeze(-1)

    lo = torch.full_like(sum_log_sigma_tilde, LOG_TOTAL_COUNT_BOUNDS[0])
    hi = torch.full_like(sum_log_sigma_tilde, LOG_TOTAL_COUNT_BOUNDS[1])
    return safeguarded_newton(g_and_slope, lo, hi, rtol=rtol, atol=rtol, max_iter=iterations).exp()


class NegativeBinomialLogitLikelihood(CountPredictive, AugmentedLikelihood):
    r"""Over-dispersed counts, failure parametrisation with :math:`r > 0` (real) and success probability
    :math:`\sigma(f)`:

    .. math::
        p(y \mid f) = \frac{\Gamma(y + r)}{y!\,\Gamma(r)}\,\sigma(f)^y\sigma(-f)^r, \qquad E[y\mid f] = r e^f,

    i.e. ``torch.distributions.NegativeBinomial(total_count=r, logits=f)``. With
    :math:`\omega \sim \mathrm{PG}(y + r, 0)`
    (a prior that depends on :math:`y`) the Pólya-Gamma identity gives

    .. math::
        p(y, \omega \mid f) = \frac{\Gamma(y + r)}{y!\,\Gamma(r)}\, 2^{-(y+r)}
        \exp\!\Big(\frac{(y - r) f - \omega f^2}{2}\Big)\,\mathrm{PG}(\omega\mid y + r, 0),
        \qquad h = \frac{y - r}{2},\quad \lambda = \omega,

    with full conditional :math:`\omega \mid f \sim \mathrm{PG}(y + r, |f|)` and optimal
    :math:`q(\omega_i) = \mathrm{PG}(y_i + r, c_i)`, :math:`c_i = \sqrt{m_i^2 + s_i}`, so
    :math:`\bar\lambda_i = \mathrm{PGm}(y_i + r, c_i)` and
    :math:`\ell^*_i = \log\frac{\Gamma(y_i + r)}{y_i!\Gamma(r)} + y_i\log\tilde\sigma^+(m_i, c_i)
    + r\log\tilde\sigma(m_i, c_i)`.

    :meth:`update_hyperparameters` sets :math:`r` to the root of
    :math:`\partial_r\sum_i\ell^*_i = \sum_i[\psi(y_i + r) - \psi(r)] + \sum_i\log\tilde\sigma_i = 0`, the exact
    maximiser given :math:`q(f)` (see :func:`solve_total_count`; skipped when :math:`\sum_i y_i = 0` or when
    ``raw_total_count.requires_grad`` is ``False``). :math:`r` is a GPyTorch parameter (``raw_total_count`` with a
    ``Positive`` constraint), also learnable by gradient through :class:`~gpytorch_augment.AugmentedELBO`.

    The auxiliary variables are ``{"omega": ω}``; their variational parameters ``{"c": c}``.

    Example::

        >>> import torch
        >>> from gpytorch.distributions import MultivariateNormal
        >>> from gpytorch_augment import NegativeBinomialLogitLikelihood
        >>> likelihood = NegativeBinomialLogitLikelihood(total_count=2.5)
        >>> q_f = MultivariateNormal(torch.zeros(2), 0.01 * torch.eye(2))
        >>> likelihood(q_f).mean.detach()                             # r E e^{f*} ≈ r e^{s/2}
        tensor([2.5125, 2.5125])
        >>> likelihood.update_hyperparameters(torch.tensor([1.0, 6.0]), None, q_f.mean, q_f.variance)  # fits r
        >>> bool(likelihood.total_count > 0)
        True

    :param total_count: initial :math:`r`.
    :param batch_shape: batch shape of :math:`r`.
    """

    augmentation = "Pólya-Gamma, PG(y + r, 0)"
    maths_page = "counts"

    def __init__(self, total_count: float = 1.0, batch_shape: torch.Size = torch.Size()) -> None:
        super().__init__()
        register_positive_constant(self, "total_count", total_count, batch_shape)

    total_count = PositiveConstant(r"The number of failures :math:`r`, shape ``(*batch_shape, 1)``.")

    def check_targets(self, y: Tensor, **kwargs: Any) -> Tensor:
        """Counts must be finite non-negative integers."""
        return check_counts("counts y", y)

    # ------------------------------------------------------------------ drop-in
    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> NegativeBinomial:
        r""":math:`\mathrm{NB}(y \mid r, \sigma(f))` (failure parametrisation, mean :math:`r e^f`)."""
        return NegativeBinomial(total_count=self.total_count, logits=function_samples)

    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        r = self.total_count
        logsigmoid = torch.nn.functional.logsigmoid
        return _log_normaliser(y, r) + y * logsigmoid(f) + r * logsigmoid(-f)

    def marginal(self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> MixtureSameFamily:
        r""":math:`\sum_k w_k\,\mathrm{NB}(y_* \mid r, \sigma(f_k))` (Gauss--Hermite); mean :math:`r E e^{f_*}`."""
        nodes, weights = self._quadrature(function_dist)
        return quadrature_mixture(nodes, weights, lambda f: NegativeBinomial(total_count=self.total_count, logits=f))

    # ------------------------------------------------------------------ sampling side
    def aux_prior(self, y: Tensor) -> AuxiliaryDistribution:
        b = y + self.total_count
        return AuxiliaryDistribution(omega=PolyaGamma(b, torch.zeros_like(b)))

    def aux_conditional(self, y: Tensor, f: Tensor) -> AuxiliaryDistribution:
        return AuxiliaryDistribution(omega=PolyaGamma(y + self.total_count, f.abs()))

    def potential_and_precision(self, y: Tensor, aux: AuxDict, f: Tensor | None = None) -> tuple[Tensor, Tensor]:
        omega = aux["omega"]
        return ((y - self.total_count) / 2).expand_as(omega), omega

    def log_tilt_constant(self, y: Tensor, aux: AuxDict) -> Tensor:
        r = self.total_count
        return (_log_normaliser(y, r) - (y + r) * LOG2).expand_as(aux["omega"])

    # ------------------------------------------------------------------ variational side
    def aux_posterior(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> AuxDict:
        return {"c": pg_tilt_c(f_mean, f_var)}

    def expected_potential_and_precision(
        self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor
    ) -> tuple[Tensor, Tensor]:
        r, c = self.total_count, q_aux["c"]
        return ((y - r) / 2).expand_as(c), pg_mean(y + r, c)

    def expected_log_tilt_constant(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        r = self.total_count
        return (_log_normaliser(y, r) - (y + r) * LOG2).expand_as(q_aux["c"])

    def aux_kl(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        return pg_kl(y + self.total_count, q_aux["c"])

    def collapsed_bound(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> Tensor:
        r = self.total_count
        c = pg_tilt_c(f_mean, f_var)
        return _log_normaliser(y, r) + y * log_sigma_tilde_plus(f_mean, c) + r * log_sigma_tilde(f_mean, c)

    def update_hyperparameters(self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor) -> None:
        r""":math:`r \leftarrow` the root of
        :math:`\sum_i[\psi(y_i + r) - \psi(r) + \log\tilde\sigma(m_i, c_i)] = 0`."""
        if not self.raw_total_count.requires_grad or not bool((y.sum(-1) > 0).all()):
            return
        with torch.no_grad():
            c = pg_tilt_c(f_mean, f_var)
            sum_log_sigma_tilde = log_sigma_tilde(f_mean, c).sum(-1, keepdim=True)
            r = solve_total_count(y.expand_as(f_mean), sum_log_sigma_tilde)
            set_positive_constant(self, "total_count", r, update=True)
