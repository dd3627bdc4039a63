r"""Poisson likelihood with the scaled-logistic link, augmented with a Poisson count and Pólya-Gamma variables."""

from __future__ import annotations

import math
from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor
from torch.distributions import Gamma, MixtureSameFamily, Poisson

from .._numerics import (
    LOG2,
    log_sigma_tilde,
    log_sigma_tilde_plus,
    pg_kl,
    pg_mean,
    pg_tilt_c,
    quadrature_mixture,
)
from .._random import seeded_by
from .._validation import check_counts
from ..distributions.auxiliary import AuxiliaryDistribution
from ..distributions.polya_gamma import PolyaGamma
from ._constants import PositiveConstant, check_gamma_prior, register_positive_constant, set_positive_constant
from ._count_predictive import CountPredictive
from .augmented_likelihood import AugmentedLikelihood, AuxDict


class PoissonLogitLikelihood(CountPredictive, AugmentedLikelihood):
    r"""Counts with a bounded intensity, :math:`p(y \mid f) = \mathrm{Po}(y \mid \xi\,\sigma(f))`.

    The rate scale :math:`\xi > 0` is the maximal intensity: :math:`E[y \mid f] = \xi\sigma(f) < \xi` for every
    :math:`f`, so counts whose mean is near or above :math:`\xi` cannot be fit (the latent is pushed towards
    :math:`+\infty` and the predictive mean stays below :math:`\xi`). CAVI learns :math:`\xi` (closed form, below);
    the samplers hold it at its current value unless ``rate_scale_prior`` is set, and refuse counts whose mean lies
    beyond what rate :math:`\xi` can give (:meth:`check_fixed_constants`; fit CAVI first, set ``rate_scale`` above
    the counts, or give ``rate_scale_prior``). The
    default :math:`\xi = 1` suits counts averaging well below 1. Expanding
    :math:`e^{-\xi\sigma(f)} = \sum_n \mathrm{Po}(n\mid\xi)\,\sigma(-f)^n` and applying the Pólya-Gamma identity to
    :math:`\sigma(f)^y \sigma(-f)^n` gives the augmentation with :math:`n \sim \mathrm{Po}(\xi)`,
    :math:`\omega \mid n \sim \mathrm{PG}(y + n, 0)`:

    .. math::
        p(y, n, \omega \mid f) = \frac{\xi^y}{y!\,2^{y+n}}
        \exp\!\Big(\frac{(y - n) f - \omega f^2}{2}\Big)\,\mathrm{PG}(\omega\mid y+n, 0)\,\mathrm{Po}(n\mid\xi),
        \qquad h = \frac{y-n}{2},\quad \lambda = \omega .

    * Gibbs: :math:`n \mid f \sim \mathrm{Po}(\xi\sigma(-f))`, then :math:`\omega \mid n, f \sim \mathrm{PG}(y+n, |f|)`.
    * CAVI: :math:`q(n, \omega) = \mathrm{Po}(n \mid \xi\tilde\sigma_i)\,\mathrm{PG}(\omega \mid y+n, c_i)` with
      :math:`c_i = \sqrt{m_i^2 + s_i}` and
      :math:`\tilde\sigma_i = \tilde\sigma(m_i, c_i) = e^{-m_i/2}/(2\cosh\frac{c_i}2)`,
      so :math:`\bar n_i = \xi\tilde\sigma_i`, :math:`\bar h_i = (y_i - \bar n_i)/2`,
      :math:`\bar\lambda_i = \mathrm{PGm}(y_i + \bar n_i, c_i)` and
      :math:`\ell^*_i = y_i\log\xi - \log y_i! + y_i\log\tilde\sigma^+(m_i, c_i) - \xi(1 - \tilde\sigma_i)`.
    * :meth:`update_hyperparameters` sets :math:`\xi \leftarrow \sum_i y_i / \sum_i (1 - \tilde\sigma_i)`, the exact
      maximiser of :math:`\sum_i \ell^*_i` given :math:`q(f)` (skipped when :math:`\sum_i y_i = 0` or when
      ``raw_rate_scale.requires_grad`` is ``False``, i.e. :math:`\xi` is fixed).
    * With ``rate_scale_prior=(a, b)``, :meth:`sample_hyperparameters` is the Gibbs step
      :math:`\xi \mid n, y \sim \mathrm{Ga}(a + \sum_i (y_i + n_i),\, b + N)` (the prior is used by the sampler only;
      the draws are returned per chain, never written into the parameter).

    The auxiliary variables are ``{"n": n, "omega": ω}``; their variational parameters ``{"c": c, "sigma_tilde": σ̃}``.
    :math:`q(n)` is stored relative to :math:`\xi` (:math:`\bar n = \xi\tilde\sigma`), so it stays optimal when
    :math:`\xi` changes. :math:`\xi` is a GPyTorch parameter (``raw_rate_scale`` with a ``Positive`` constraint),
    also learnable by gradient through :class:`~gpytorch_augment.AugmentedELBO`.

    Example::

        >>> import torch
        >>> from gpytorch.distributions import MultivariateNormal
        >>> from gpytorch_augment import PoissonLogitLikelihood
        >>> likelihood = PoissonLogitLikelihood(rate_scale=10.0)
        >>> q_f = MultivariateNormal(torch.zeros(3), torch.eye(3))
        >>> likelihood(q_f).mean.detach()                             # E[y* | data] = ξ E σ(f*), = ξ/2 here
        tensor([5., 5., 5.])
        >>> y = torch.tensor([2.0, 7.0, 4.0])
        >>> likelihood.update_hyperparameters(y, None, q_f.mean, q_f.variance)   # closed-form ξ
        >>> likelihood.rate_scale.shape
        torch.Size([1])

    :param rate_scale: initial :math:`\xi`.
    :param rate_scale_prior: optional :math:`(a, b)` of a :math:`\mathrm{Ga}(a, b)` prior (shape, rate) on :math:`\xi`
        for Gibbs sampling.
    :param batch_shape: batch shape of :math:`\xi`.
    """

    augmentation = "Poisson + Pólya-Gamma (rate ξσ(f))"
    maths_page = "counts"

    #: what ``posterior_sampler(method="auto")`` builds (the guide's "Which engine, when" gives the evidence)
    preferred_sampler = "hmc"

    def __init__(
        self,
        rate_scale: float = 1.0,
        rate_scale_prior: tuple[float, float] | None = None,
        batch_shape: torch.Size = torch.Size(),
    ) -> None:
        super().__init__()
        self.rate_scale_prior = check_gamma_prior("rate_scale_prior", rate_scale_prior)
        register_positive_constant(self, "rate_scale", rate_scale, batch_shape)

    rate_scale = PositiveConstant(r"The rate scale :math:`\xi` (maximal intensity), shape ``(*batch_shape, 1)``.")

    def check_targets(self, y: Tensor, **kwargs: Any) -> Tensor:
        """Counts must be finite non-negative integers."""
        return check_counts("counts y", y)

    # ------------------------------------------------------------------ drop-in
    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> Poisson:
        r""":math:`\mathrm{Po}(y \mid \xi\sigma(f))`."""
        return Poisson(rate=self.rate_scale * torch.sigmoid(function_samples))

    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        xi = self.rate_scale
        return y * (xi.log() + torch.nn.functional.logsigmoid(f)) - xi * torch.sigmoid(f) - torch.lgamma(y + 1)

    def marginal(self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> MixtureSameFamily:
        r""":math:`\sum_k w_k\,\mathrm{Po}(y_* \mid \xi\sigma(f_k))` (Gauss--Hermite); mean :math:`\xi E\sigma(f_*)`."""
        nodes, weights = self._quadrature(function_dist)
        return quadrature_mixture(nodes, weights, lambda f: Poisson(rate=self.rate_scale * torch.sigmoid(f)))

    # ------------------------------------------------------------------ sampling side
    def aux_prior(self, y: Tensor) -> AuxiliaryDistribution:
        return AuxiliaryDistribution(
            n=Poisson(self.rate_scale * torch.ones_like(y)),
            omega=lambda aux: PolyaGamma(y + aux["n"], torch.zeros_like(aux["n"])),
        )

    def aux_conditional(self, y: Tensor, f: Tensor) -> AuxiliaryDistribution:
        return AuxiliaryDistribution(
            n=Poisson(self.rate_scale * torch.sigmoid(-f)),
            omega=lambda aux: PolyaGamma(y + aux["n"], f.abs()),
        )

    def potential_and_precision(self, y: Tensor, aux: AuxDict, f: Tensor | None = None) -> tuple[Tensor, Tensor]:
        omega = aux["omega"]
        return ((y - aux["n"]) / 2).expand_as(omega), omega

    def log_tilt_constant(self, y: Tensor, aux: AuxDict) -> Tensor:
        return y * self.rate_scale.log() - torch.lgamma(y + 1) - (y + aux["n"]) * LOG2

    def check_fixed_constants(self, y: Tensor) -> None:
        r"""``ValueError`` naming ``rate_scale`` where the fixed :math:`\xi` cannot produce the counts: their mean
        :math:`\bar y` of :math:`N` counts exceeds :math:`\xi + 4\sqrt{\xi/N}`, four standard deviations above
        what even the highest rate :math:`\xi` gives (counts drawn from the model itself are refused with
        probability below :math:`10^{-4}`). Nothing with ``rate_scale_prior`` (the sampler draws :math:`\xi`)."""
        if self.rate_scale_prior is not None or y.numel() == 0:
            return
        mean, cap = float(y.double().mean()), float(self.rate_scale.max())
        if mean > cap + 4 * math.sqrt(cap / y.numel()):
            raise ValueError(
                f"the counts average {mean:.4g} but PoissonLogitLikelihood's rate xi*sigmoid(f) stays below "
                f"rate_scale = {cap:.4g}, which the sampler holds fixed: set rate_scale above the counts (e.g. "
                f"PoissonLogitLikelihood(rate_scale={max(2 * mean, 1.0):.3g}), twice their mean), fit it by CAVI "
                "first, or pass rate_scale_prior=(a, b) so that GibbsSampler draws it"
            )

    @property
    def samples_constants(self) -> bool:
        """Whether a prior on the constants is set (``rate_scale_prior``): then the Gibbs sampler draws them."""
        return self.rate_scale_prior is not None

    def sample_hyperparameters(
        self, y: Tensor, aux: AuxDict, f: Tensor, generator: torch.Generator | None = None
    ) -> tuple[dict[str, Tensor], AuxDict | None]:
        r""":math:`\xi \mid n, y \sim \mathrm{Ga}(a + \sum_i (y_i + n_i),\ b + N)` under ``rate_scale_prior=(a, b)``.

        Pure: returns ``({"rate_scale": xi}, None)`` with one :math:`\xi` per chain (leading dimensions of
        ``aux["n"]``, shape ``(*chains, 1)``), or ``({}, None)`` without a prior; the likelihood's parameter is not
        changed (evaluate under the draw with :meth:`constants`). :math:`\Omega` needs no redraw: its update comes
        before :math:`\xi` in the scan and :math:`f` does not depend on :math:`\xi` given :math:`\Omega`."""
        if self.rate_scale_prior is None:
            return {}, None
        a, b = self.rate_scale_prior
        n = aux["n"]
        shape = a + (y + n).sum(-1, keepdim=True)
        with torch.no_grad(), seeded_by(generator, y.device):
            draw = Gamma(shape, torch.full_like(shape, b + n.shape[-1])).sample()
        return {"rate_scale": draw}, None

    # ------------------------------------------------------------------ variational side
    def aux_posterior(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> AuxDict:
        c = pg_tilt_c(f_mean, f_var)
        return {"c": c, "sigma_tilde": log_sigma_tilde(f_mean, c).exp()}

    def _n_mean(self, q_aux: AuxDict) -> Tensor:
        return self.rate_scale * q_aux["sigma_tilde"]

    def expected_potential_and_precision(
        self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor
    ) -> tuple[Tensor, Tensor]:
        n_mean = self._n_mean(q_aux)
        return (y - n_mean) / 2, pg_mean(y + n_mean, q_aux["c"])

    def expected_log_tilt_constant(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        return y * self.rate_scale.log() - torch.lgamma(y + 1) - (y + self._n_mean(q_aux)) * LOG2

    def aux_kl(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        r""":math:`\mathrm{KL}_{PG}(y + \bar n, c) + \mathrm{KL}(\mathrm{Po}(\xi\tilde\sigma)\Vert\mathrm{Po}(\xi))`,
        the latter :math:`\xi(\tilde\sigma\log\tilde\sigma - \tilde\sigma + 1)`."""
        rho = q_aux["sigma_tilde"]
        poisson_kl = self.rate_scale * (torch.xlogy(rho, rho) - rho + 1)
        return pg_kl(y + self._n_mean(q_aux), q_aux["c"]) + poisson_kl

    def collapsed_bound(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> Tensor:
        c = pg_tilt_c(f_mean, f_var)
        xi = self.rate_scale
        one_minus_sigma_tilde = -torch.expm1(log_sigma_tilde(f_mean, c))
        return y * (xi.log() + log_sigma_tilde_plus(f_mean, c)) - torch.lgamma(y + 1) - xi * one_minus_sigma_tilde

    def update_hyperparameters(self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor) -> None:
        r""":math:`\xi \leftarrow \sum_i y_i / \sum_i (1 - \tilde\sigma(m_i, c_i))`, the maximiser of
        :math:`\sum_i\ell^*_i` given :math:`q(f)`."""
        if not self.raw_rate_scale.requires_grad:
            return
        total = y.sum(-1, keepdim=True)
        if not bool((total > 0).all()):
            return
        with torch.no_grad():
            c = pg_tilt_c(f_mean, f_var)
            xi = total / (-torch.expm1(log_sigma_tilde(f_mean, c))).sum(-1, keepdim=True)
            set_positive_constant(self, "rate_scale", xi, update=True)
