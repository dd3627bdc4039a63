r"""Bernoulli likelihood with the logistic link, augmented with Pólya-Gamma variables."""

from __future__ import annotations

from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor
from torch.distributions import Bernoulli

from .._numerics import LOG2, log_sigma_tilde_plus, pg_kl, pg_mean, pg_tilt_c
from .._validation import check_values_in
from ..distributions.auxiliary import AuxiliaryDistribution
from ..distributions.polya_gamma import PolyaGamma
from .augmented_likelihood import AugmentedLikelihood, AuxDict


class BernoulliLogitLikelihood(AugmentedLikelihood):
    r"""Binary classification with the logistic link, :math:`p(y \mid f) = \sigma(s_y f)`.

    Labels :math:`y \in \{0, 1\}` (:math:`s_y = 2y - 1`); labels in :math:`\{-1, 1\}` are accepted too
    (:math:`s_y = y`). The Pólya-Gamma identity
    :math:`\sigma(s f) = \tfrac12 \int \exp(\tfrac s2 f - \tfrac12 \omega f^2)\,
    \mathrm{PG}(\omega \mid 1, 0)\, d\omega`
    gives the augmentation

    .. math::
        p(y, \omega \mid f) = \tfrac12 \exp\!\big(\tfrac{s_y}{2} f - \tfrac12 \omega f^2\big)\, \mathrm{PG}(\omega\mid
        1, 0),
        \qquad h = s_y/2,\quad \lambda = \omega,\quad \log C = -\log 2,

    with full conditional :math:`\omega \mid f \sim \mathrm{PG}(1, |f|)` and, under
    :math:`q(f_i) = \mathcal N(m_i, s_i)`,
    optimal :math:`q(\omega_i) = \mathrm{PG}(1, c_i)`, :math:`c_i = \sqrt{m_i^2 + s_i}`, so
    :math:`\bar\lambda_i = \tanh(c_i/2)/(2 c_i)` and
    :math:`\ell^*_i = \tfrac{s_y m_i}{2} - \log 2 - \log\cosh\tfrac{c_i}{2}`.

    The auxiliary variables are ``{"omega": ω}``; their variational parameters ``{"c": c}``.

    Example::

        >>> import torch
        >>> from gpytorch_augment import CAVI, BernoulliLogitLikelihood
        >>> from gpytorch_augment.testing import make_cavi_model
        >>> x, y = torch.linspace(-2, 2, 8).unsqueeze(-1), torch.tensor([0.0, 0, 0, 1, 0, 1, 1, 1])
        >>> model, likelihood = make_cavi_model(1, x[::2]), BernoulliLogitLikelihood()
        >>> trace = CAVI(model, likelihood, num_data=8).fit(x, y, max_iter=20)
        >>> probs = likelihood(model(torch.tensor([[-2.0], [2.0]]))).probs    # p(y* = 1 | data)
        >>> bool(probs[0] < 0.5 < probs[1])
        True
    """

    augmentation = "Pólya-Gamma"
    maths_page = "binary"

    #: what ``posterior_sampler(method="auto")`` builds (the guide's "Which engine, when" gives the evidence)
    preferred_sampler = "hmc"

    def check_targets(self, y: Tensor, **kwargs: Any) -> Tensor:
        """Labels must be in {0, 1} or in {-1, 1} (not a mix of 0 and -1)."""
        check_values_in("labels y", y, (0.0, 1.0, -1.0))
        if (y == 0).any() and (y == -1).any():
            raise ValueError("labels y mix the {0, 1} and {-1, 1} conventions (both 0 and -1 occur)")
        return y

    @staticmethod
    def _sign(y: Tensor) -> Tensor:
        return torch.where(y > 0, 1.0, -1.0).to(y.dtype if y.is_floating_point() else torch.get_default_dtype())

    # ------------------------------------------------------------------ drop-in
    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> Bernoulli:
        """:math:`p(y=1 \\mid f) = \\sigma(f)` over labels {0, 1}."""
        return Bernoulli(logits=function_samples)

    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        return torch.nn.functional.logsigmoid(self._sign(y) * f)

    def log_prob_and_grad(self, y: Tensor, f: Tensor, **kwargs: Any) -> tuple[Tensor, Tensor]:
        r""":math:`\log\sigma(s f)`, :math:`s = 2y - 1`, and its derivative :math:`\mathbb 1[y > 0] - \sigma(f)`."""
        return torch.nn.functional.logsigmoid(self._sign(y) * f), _logit_grad(y, f)

    def log_prob_grad(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        return _logit_grad(y, f)

    def marginal(self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> Bernoulli:
        r""":math:`p(y_* = 1) = E_{q(f_*)} \sigma(f_*)` by Gauss--Hermite quadrature."""
        nodes, weights = self._quadrature(function_dist)
        return Bernoulli(probs=(weights * torch.sigmoid(nodes)).sum(0).clamp(0.0, 1.0))

    # ------------------------------------------------------------------ sampling side
    def aux_prior(self, y: Tensor) -> AuxiliaryDistribution:
        one = torch.ones_like(y, dtype=torch.get_default_dtype() if not y.is_floating_point() else y.dtype)
        return AuxiliaryDistribution(omega=PolyaGamma(one, torch.zeros_like(one)))

    def aux_conditional(self, y: Tensor, f: Tensor) -> AuxiliaryDistribution:
        return AuxiliaryDistribution(omega=PolyaGamma(torch.ones_like(f), f.abs()))

    def sample_aux(self, y: Tensor, f: Tensor, generator: torch.Generator | None = None) -> AuxDict:
        r""":math:`\omega \sim \mathrm{PG}(1, |f|)`: the law of :meth:`aux_conditional`, drawn directly from
        ``generator`` (no joint-distribution wrapper, no re-seeding of the global RNG, no argument validation)."""
        return {"omega": PolyaGamma(torch.ones_like(f), f.abs(), validate_args=False).sample(generator=generator)}

    def potential_and_precision(self, y: Tensor, aux: AuxDict, f: Tensor | None = None) -> tuple[Tensor, Tensor]:
        omega = aux["omega"]
        return torch.where(y > 0, 0.5, -0.5).to(omega.dtype).expand_as(omega), omega  # s_y / 2

    def log_tilt_constant(self, y: Tensor, aux: AuxDict) -> Tensor:
        return torch.full_like(aux["omega"], -LOG2)

    # ------------------------------------------------------------------ variational side
    def aux_posterior(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> AuxDict:
        return {"c": pg_tilt_c(f_mean, f_var)}

    def expected_potential_and_precision(
        self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor
    ) -> tuple[Tensor, Tensor]:
        c = q_aux["c"]
        return (self._sign(y) / 2).to(c.dtype).expand_as(c), pg_mean(1.0, c)

    def expected_log_tilt_constant(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        return torch.full_like(q_aux["c"], -LOG2)

    def aux_kl(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        return pg_kl(1.0, q_aux["c"])

    def collapsed_bound(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> Tensor:
        return log_sigma_tilde_plus(self._sign(y).to(f_mean.dtype) * f_mean, pg_tilt_c(f_mean, f_var))


def _logit_grad(y: Tensor, f: Tensor) -> Tensor:
    r""":math:`\partial_f \log\sigma(sf) = \mathbb 1[y > 0] - \sigma(f)` for labels in {0, 1} or {-1, 1}."""
    return y.clamp_min(0) - torch.sigmoid(f)
