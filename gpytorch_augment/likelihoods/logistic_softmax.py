r"""Categorical likelihood with the (scaled) logistic-softmax link, augmented with negative-multinomial counts and
Pólya-Gamma variables (:doc:`/maths/multiclass`)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from gpytorch.priors import GammaPrior
from torch import Tensor
from torch.distributions import Categorical, Gamma, Independent
from torch.nn.functional import logsigmoid, one_hot

from .._numerics import (
    LOG2,
    NUM_QMC_POINTS,
    PRODUCT_RULE_NODES,
    additive_product_rule,
    gauss_hermite,
    latent_expectation,
    log_sigma_tilde_moments,
    log_sigma_tilde_plus,
    pg_kl,
    pg_mean,
    pg_tilt_c,
)
from .._random import seeded_by
from .._validation import check_class_labels, check_integer
from ..distributions.auxiliary import AuxiliaryDistribution
from ..distributions.negative_multinomial import NegativeMultinomial
from ..distributions.polya_gamma import PolyaGamma
from ._constants import PositiveConstant, check_gamma_prior, register_positive_constant, set_positive_constant
from .augmented_likelihood import AugmentedLikelihood, AuxDict
from .class_scales import maximise_class_scales

__all__ = ["LogisticSoftmaxLikelihood", "NegativeMultinomial"]

#: :math:`\log D = \log\sigma(0)`, the fixed factor of the bijective link's reference class
LOG_D = -LOG2
#: Gauss--Hermite nodes of the one-dimensional :math:`E\log\sigma(f_k)` in ``expected_log_prob``
_LOG_SIGMOID_NODES = 64
#: quasi-Monte Carlo points of ``expected_log_prob`` for J > 3 latents (a training objective: cheap, deterministic)
NUM_ELBO_QMC_POINTS = 2**9


class LogisticSoftmaxLikelihood(AugmentedLikelihood):
    r"""Multi-class classification with the scaled logistic-softmax link, labels :math:`y \in \{0, \dots, K-1\}`:

    .. math::
        p(y = k \mid f) = \frac{\theta_k\, s_k(f)}{\sum_{l} \theta_l\, s_l(f)}, \qquad s_l(f) = \sigma(f_l),

    with class scales :math:`\theta_k > 0` (:math:`\theta \equiv 1`: the plain logistic-softmax). The
    **over-parametrised** link has :math:`J = K` latent GPs; the **bijective** one (``bijective=True``) has
    :math:`J = K - 1` and fixes :math:`f_K \equiv 0`, i.e. :math:`s_K = D = \sigma(0) = \frac12` (then classes
    :math:`k < K` are capped at :math:`\theta_k / (\theta_k + \theta_K D)`).

    **Augmentation** (the Gamma variable marginalised: negative-multinomial form, :doc:`/maths/multiclass`). With
    :math:`S = \sum_{j\le J}\theta_j + [\text{bij}]\,\theta_K D`, :math:`p_j = \theta_j / S`, one-hot labels
    :math:`Y_j = [y = j]` and :math:`\bar s_k = D` for the bijective reference class (1 otherwise),

    .. math::
        p(y = k, n, \omega \mid f) = \frac{\theta_k \bar s_k}{S}\, \mu_p(n) \prod_{j\le J} 2^{-(Y_j + n_j)}
        \exp\!\Big(\frac{(Y_j - n_j) f_j - \omega_j f_j^2}{2}\Big)\, \mathrm{PG}(\omega_j \mid Y_j + n_j, 0),
        \qquad \mu_p(n) = \Gamma\Big(1 + \sum_j n_j\Big)\prod_j \frac{p_j^{n_j}}{n_j!},

    so :math:`h_j = (Y_j - n_j)/2` and :math:`\lambda_j = \omega_j` (no cross terms between latents). The measure
    :math:`\mu_p` is improper for the over-parametrised link; every conditional and every :math:`q` is proper.

    * **Gibbs**: :math:`n \mid f \sim \mathrm{NM}(1, p')` with :math:`p'_j = p_j \sigma(-f_j)` (note
      :math:`\sigma(-f)`, not the reference implementation's :math:`\sigma(f)`), then
      :math:`\omega_j \mid n, f \sim \mathrm{PG}(Y_j + n_j, |f_j|)`.
    * **CAVI**: :math:`q(n) = \mathrm{NM}(1, p^q)`, :math:`p^q_j = p_j\tilde\sigma_j`,
      :math:`q(\omega_j\mid n) = \mathrm{PG}(Y_j + n_j, c_j)` with :math:`c_j = \sqrt{m_j^2 + s_j}` and
      :math:`\tilde\sigma_j = \tilde\sigma(m_j, c_j)`; :math:`\bar n_j = \theta_j\tilde\sigma_j / Q` with
      :math:`Q = \sum_{j \le J}\theta_j(1 - \tilde\sigma_j) + [\text{bij}]\theta_K D`, and
      :math:`\ell^* = \log\theta_k\bar s_k + [k \le J]\log\tilde\sigma^+(m_k, c_k) - \log Q`.
    * **Class scales** (``learn_class_scales=True``): :meth:`update_hyperparameters` sets :math:`\theta` to the exact
      maximiser of :math:`\sum_i \ell^*_i` given :math:`q(f)`
      (:func:`~gpytorch_augment.likelihoods.class_scales.maximise_class_scales`; normalised to mean 1; data in which a
      class is absent, e.g. a mini-batch, leave every scale as it is), or to the MAP under ``class_scale_prior``
      :math:`= (\alpha, \beta)`, a :math:`\mathrm{Ga}(\alpha, \beta)` prior on every :math:`\theta_k`. With a prior,
      :meth:`sample_hyperparameters` is the Gibbs step of the class-scale update with the Gamma variable :math:`\zeta`
      reinstated: :math:`\zeta_i \mid f, \theta \sim \mathrm{Ga}(1, \sum_l \theta_l s_l(f_i))`, :math:`\theta_k \mid
      f, \zeta \sim \mathrm{Ga}(\alpha + N_k, \beta + \sum_i \zeta_i s_k(f_i))` (both collapsed over :math:`(n,
      \omega)`), then a fresh :math:`(n, \omega) \mid f, \theta` for the :math:`f`-step.
    * **Predictive**: :meth:`marginal` / :meth:`predict_proba` integrate the latent variance,
      :math:`p(y_* = k) = E_{q(f_*)}[\theta_k s_k / \sum_l \theta_l s_l]` over independent
      :math:`q(f_{*j})`: a product Gauss--Hermite rule for :math:`J \le 3`, ``num_predictive_points``
      scrambled-Sobol quasi-Monte Carlo points (fixed seed) otherwise. :meth:`expected_log_prob` is the true
      :math:`E_q \log p(y \mid f) = \log\theta_k\bar s_k + E\log\sigma(f_k) - E\log\sum_l\theta_l s_l`: the middle
      term by 1-D Gauss--Hermite, the last by the same product rule for :math:`J \le 3` and by ``num_elbo_points``
      scrambled-Sobol points otherwise -- fewer than the predictive's, because it is a training objective
      (``gpytorch.mlls.VariationalELBO``, or ``CAVI(..., hyper_objective=...)``) evaluated at every step; the rule
      is fixed, so the objective stays deterministic and smooth.

    Latents come as ``(*batch, N, J)`` (GPyTorch's multitask layout); potentials and precisions are
    ``(*batch, J, N)``. The auxiliary variables are ``{"n": n, "omega": ω}``, both ``(*batch, N, J)``; their
    variational parameters ``{"c": c, "sigma_tilde": σ̃, "log_one_minus_sigma_tilde": log(1 - σ̃)}`` (the last
    because :math:`1 - \tilde\sigma` rounds to 0 for :math:`f \ll 0`). :math:`q(n)` is stored through
    :math:`\tilde\sigma`, i.e. relative to :math:`\theta`, so it stays optimal when :math:`\theta` changes.
    :math:`\theta` is a GPyTorch parameter (``raw_class_scales``, ``Positive`` constraint) of shape ``(K,)``; a Gibbs
    sampler keeps its draws per chain in its own state (:meth:`sample_hyperparameters`). With one latent
    (``num_classes=2, bijective=True``) latents, potentials and precisions take the one-latent layout ``(*batch, N)``.

    Example::

        >>> import torch
        >>> from gpytorch_augment import CAVI, LogisticSoftmaxLikelihood
        >>> from gpytorch_augment.testing import make_cavi_model
        >>> x, y = torch.linspace(-2, 2, 9).unsqueeze(-1), torch.tensor([0.0, 0, 0, 1, 1, 1, 2, 2, 2])
        >>> likelihood = LogisticSoftmaxLikelihood(num_classes=3)
        >>> model = make_cavi_model(likelihood.num_latents, x[::2])   # 3 latent GPs, batched CAVI strategy
        >>> trace = CAVI(model, likelihood, num_data=9).fit(x, y, max_iter=20)
        >>> likelihood.predict_labels(model(torch.tensor([[-2.0], [0.0], [2.0]])))
        tensor([0, 1, 2])

    :param num_classes: :math:`K \ge 2`.
    :param bijective: use :math:`K - 1` latents and fix :math:`f_K \equiv 0` (for :math:`K = 2` one latent, in the
        one-latent layout ``(..., N)`` of the other likelihoods).
    :param learn_class_scales: update :math:`\theta` (closed form in CAVI, Gibbs step under a prior, gradients
        through :class:`~gpytorch_augment.AugmentedELBO`); otherwise :math:`\theta` is fixed.
    :param class_scale_prior: optional ``(alpha, beta)`` or a ``gpytorch.priors.GammaPrior``; needs
        ``learn_class_scales=True``.
    :param class_scales: initial :math:`\theta` (a number or ``K`` values; default 1).
    :param num_predictive_points: quasi-Monte Carlo points of the predictive integrals for :math:`J > 3` latents
        (default :math:`2^{14}`; a power of two keeps the Sobol points balanced).
    :param num_elbo_points: quasi-Monte Carlo points of :meth:`expected_log_prob` for :math:`J > 3` latents
        (default :math:`2^9`: on satimage-like posteriors its mean error is ~5e-4 nats per datum, far below the
        noise of GPyTorch's 10-sample Monte-Carlo estimate, at 1/32 of the points of the predictive's rule).
    """

    augmentation = "negative multinomial + Pólya-Gamma (over-parametrised or bijective, class scales)"
    maths_page = "multiclass"
    latents_label = "K or K−1"

    #: what ``posterior_sampler(method="auto")`` builds (the guide's "Which engine, when" gives the evidence)
    preferred_sampler = "hmc"
    #: and with ``sample_hyperparameters=True``: HMC on the hyper-parameters and the whitened latents jointly (the
    #: auxiliary variables pin the latents, and the hyper-parameters with them, in the blocked sampler)
    preferred_hyper_sampler = "hmc"

    def __init__(
        self,
        num_classes: int,
        bijective: bool = False,
        learn_class_scales: bool = False,
        class_scale_prior: tuple[float, float] | GammaPrior | None = None,
        class_scales: float | Sequence[float] | Tensor = 1.0,
        num_predictive_points: int = NUM_QMC_POINTS,
        num_elbo_points: int = NUM_ELBO_QMC_POINTS,
    ) -> None:
        super().__init__()
        num_classes = check_integer("num_classes", num_classes, 2)
        for name, value in (("num_predictive_points", num_predictive_points), ("num_elbo_points", num_elbo_points)):
            if isinstance(value, bool) or int(value) != value or int(value) < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.num_predictive_points = int(num_predictive_points)
        self.num_elbo_points = int(num_elbo_points)
        self._bounded = False  # inside elbo_bound()
        self.num_classes = int(num_classes)
        self.bijective = bool(bijective)
        self.num_latents = self.num_classes - 1 if self.bijective else self.num_classes
        self.learn_class_scales = bool(learn_class_scales)
        register_positive_constant(
            self, "class_scales", class_scales, event_shape=(self.num_classes,), requires_grad=self.learn_class_scales
        )
        if class_scale_prior is not None:
            if not self.learn_class_scales:
                raise ValueError("class_scale_prior needs learn_class_scales=True (a prior on fixed class scales)")
            labels = ("alpha", "beta")
            if isinstance(class_scale_prior, GammaPrior):
                pair = (class_scale_prior.concentration, class_scale_prior.rate)
                check_gamma_prior("class_scale_prior", pair, labels)
            else:
                class_scale_prior = GammaPrior(*check_gamma_prior("class_scale_prior", class_scale_prior, labels))
            self.register_prior(
                "class_scale_prior", class_scale_prior, lambda m: m.class_scales, lambda m, v: m._set_class_scales(v)
            )
        else:
            self.class_scale_prior = None

    # ------------------------------------------------------------------ class scales
    class_scales = PositiveConstant(r"The class scales :math:`\theta`, shape ``(K,)`` (a number sets all of them).")

    def _set_class_scales(self, value: float | Sequence[float] | Tensor) -> None:
        set_positive_constant(self, "class_scales", value)

    @property
    def _prior_parameters(self) -> tuple[float, float] | None:
        prior = self.class_scale_prior
        return None if prior is None else (float(prior.concentration), float(prior.rate))

    def _log_weights(self) -> tuple[Tensor, Tensor]:
        r"""``log_w`` = :math:`\log\theta_k\bar s_k`, shape ``(..., 1, K)``, and :math:`\log S`, shape ``(..., 1)``."""
        log_w = self.class_scales.log().unsqueeze(-2)
        if self.bijective:
            log_w = torch.cat([log_w[..., :-1], log_w[..., -1:] + LOG_D], -1)
        return log_w, torch.logsumexp(log_w, -1)

    def _labels(self, y: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """One-hot labels over all classes ``(..., N, K)`` and over the latent classes ``(..., N, J)``."""
        full = one_hot(y.long(), self.num_classes).to(dtype)
        return full, full[..., : self.num_latents]

    def _latent(self, f: Tensor) -> Tensor:
        r"""Latents in this class's layout ``(..., N, J)``: with one latent (``num_classes=2, bijective=True``) the
        engines pass ``(..., N)``, the single-latent layout of every other likelihood."""
        return f.unsqueeze(-1) if self.num_latents == 1 else f

    def _engine(self, t: Tensor, latent_dim: int = -2) -> Tensor:
        """A per-latent output back in the engines' layout (``latent_dim`` dropped for one latent)."""
        return t.squeeze(latent_dim) if self.num_latents == 1 else t

    def _logits(self, f: Tensor) -> Tensor:
        r""":math:`\log\theta_l s_l(f)` for every class, ``(..., N, K)``; ``f`` in the engines' layout."""
        f = self._latent(f)
        log_w, _ = self._log_weights()
        latent = log_w[..., : self.num_latents] + logsigmoid(f)
        if not self.bijective:
            return latent
        return torch.cat([latent, log_w[..., -1:].expand(*latent.shape[:-1], 1)], -1)

    def check_targets(self, y: Tensor, **kwargs: Any) -> Tensor:
        """Labels must be integer class indices in ``0..K-1``; returned as floats."""
        return check_class_labels(y, self.num_classes)

    # ------------------------------------------------------------------ drop-in
    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> Categorical:
        r""":math:`p(y = k \mid f) \propto \theta_k s_k(f)` over the :math:`K` classes."""
        return Categorical(logits=self._logits(function_samples))

    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        logits = self._logits(f)
        full, _ = self._labels(y, f.dtype)
        return (full * logits).sum(-1) - torch.logsumexp(logits, -1)

    def log_prob_and_grad(self, y: Tensor, f: Tensor, **kwargs: Any) -> tuple[Tensor, Tensor]:
        r""":meth:`log_prob_at` and its gradient in closed form: with the logits :math:`\ell_l = \log\theta_l
        s_l(f)` and :math:`p = \mathrm{softmax}(\ell)`, :math:`\partial_{f_j}\log p(y \mid f) = (Y_j - p_j)\,
        \sigma(-f_j)`."""
        logits = self._logits(f)
        full, labels = self._labels(y, f.dtype)
        log_norm = torch.logsumexp(logits, -1, keepdim=True)
        probs = (logits[..., : self.num_latents] - log_norm).exp()
        grad = (labels - probs) * torch.sigmoid(-self._latent(f))
        return (full * logits).sum(-1) - log_norm.squeeze(-1), self._engine(grad, -1)

    def _moments(self, function_dist: MultivariateNormal) -> tuple[Tensor, Tensor]:
        mean, var = function_dist.mean, function_dist.variance
        if self.num_latents == 1 and not isinstance(function_dist, MultitaskMultivariateNormal):
            mean, var = mean.unsqueeze(-1), var.unsqueeze(-1)
        if mean.dim() < 2 or mean.shape[-1] != self.num_latents:
            raise ValueError(
                f"{type(self).__name__} needs q(f) over {self.num_latents} latents (a MultitaskMultivariateNormal with "
                f"event shape (N, {self.num_latents})); got mean shape {tuple(mean.shape)}"
            )
        theta_batch = self.class_scales.shape[:-1]
        try:
            torch.broadcast_shapes(theta_batch, mean.shape[:-2])
        except RuntimeError as err:
            raise ValueError(
                f"the class scales hold one row per Gibbs chain (shape {tuple(self.class_scales.shape)}); set "
                "likelihood.class_scales to one value per class (e.g. "
                "samples.hyperparameters['class_scales'].mean((0, 1))) "
                "before predicting"
            ) from err
        return mean, var

    def _integrate(self, mean: Tensor, var: Tensor, probs: bool, num_points: int) -> Tensor:
        r"""Integrals over independent :math:`f_j \sim \mathcal N(m_j, v_j)`: the class probabilities
        :math:`E[\theta_k s_k / T]` (``probs=True``, shape ``(..., N, K)``) or :math:`E\log T` (shape ``(..., N)``),
        :math:`T = \sum_l \theta_l s_l(f)`.

        For :math:`J \le 3` the product Gauss--Hermite rule of
        :func:`~gpytorch_augment._numerics.additive_product_rule` (:math:`T` is a sum of per-latent terms, the
        bijective reference class a constant offset); for :math:`J > 3`, ``num_points`` scrambled-Sobol
        quasi-Monte Carlo points (:func:`~gpytorch_augment._numerics.latent_expectation`).
        """
        J, K = self.num_latents, self.num_classes
        log_w, _ = self._log_weights()
        if J not in PRODUCT_RULE_NODES:  # theta_l s_l(f) directly (sigmoid, no logarithms): the cost is per point
            weights_k = log_w.exp()  # theta_k * s_bar_k, (..., 1, K)
            latent, reference = weights_k[..., :J], weights_k[..., J:]

            def class_terms(f: Tensor) -> Tensor:
                t = latent * torch.sigmoid(f)
                return torch.cat([t, reference.expand(*t.shape[:-1], 1)], -1) if self.bijective else t

            def ratios(f: Tensor) -> Tensor:
                t = class_terms(f)
                total = t.sum(-1, keepdim=True)
                if bool((total > 0).all()):
                    return t / total
                return torch.softmax(self._logits(f), -1)  # every term underflows somewhere: in logs

            def log_total(f: Tensor) -> Tensor:
                total = class_terms(f).sum(-1)
                return total.log() if bool((total > 0).all()) else torch.logsumexp(self._logits(f), -1)

            return latent_expectation(ratios if probs else log_total, mean, var, num_points)
        batch = mean.shape[:-1]
        log_w = log_w.squeeze(-2).unsqueeze(-2).expand(*batch, K).reshape(-1, K)
        out = additive_product_rule(
            logsigmoid,
            mean.reshape(-1, J),
            var.reshape(-1, J),
            log_w[:, :J],
            offset=log_w[:, -1].exp() if self.bijective else None,
            ratios=probs,
        )
        return out.reshape(*batch, K) if probs else out.reshape(batch)

    def predict_proba(self, function_dist: MultivariateNormal) -> Tensor:
        r"""Class probabilities :math:`E_{q(f_*)}[\theta_k s_k / \sum_l \theta_l s_l]`, ``(..., N, K)``: the tensor
        ``likelihood(q_f).probs`` returns (the documented way to get them, as for every likelihood)."""
        mean, var = self._moments(function_dist)
        return self._integrate(mean, var, probs=True, num_points=self.num_predictive_points)

    def predict_labels(self, function_dist: MultivariateNormal) -> Tensor:
        """The most probable class under :meth:`predict_proba`, ``(..., N)`` (``torch.long``)."""
        return self.predict_proba(function_dist).argmax(-1)

    def marginal(self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> Categorical:
        """The predictive ``Categorical(probs=predict_proba(q_f))`` (the latent variance integrated, not plugged in)."""
        return Categorical(probs=self.predict_proba(function_dist))

    has_elbo_bound = True

    @contextmanager
    def elbo_bound(self) -> Iterator[None]:
        r"""Inside this context :meth:`expected_log_prob` replaces :math:`E\log T` by :math:`\log E T =
        \log\sum_l \theta_l\bar s_l E\sigma(f_l)` (Jensen), a lower bound of the expected log-likelihood from
        one-dimensional Gauss--Hermite terms only; the gap grows with the latent variances."""
        previous, self._bounded = self._bounded, True
        try:
            yield
        finally:
            self._bounded = previous

    def expected_log_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        r"""The true :math:`E_{q(f_i)} \log p(y_i \mid f_i)` per datum (product Gauss--Hermite, or ``num_elbo_points``
        quasi-Monte Carlo points for :math:`J > 3`; inside :meth:`elbo_bound`, its Jensen lower bound)."""
        mean, var = self._moments(function_dist)
        log_w, _ = self._log_weights()
        full, Y = self._labels(y, mean.dtype)
        nodes, weights = gauss_hermite(mean, var, _LOG_SIGMOID_NODES)
        log_sigmoid = logsigmoid(nodes)
        expected_log_sigmoid = (weights * log_sigmoid).sum(0)  # (..., N, J)
        if self._bounded:  # log E T: the log of a sum of 1-D expectations
            log_expected = torch.logsumexp(weights.log() + log_sigmoid, 0)  # log E sigma(f_j), (..., N, J)
            terms = log_w[..., : self.num_latents] + log_expected
            if self.bijective:
                terms = torch.cat([terms, log_w[..., self.num_latents :].expand(*terms.shape[:-1], 1)], -1)
            log_total = torch.logsumexp(terms, -1)
        else:
            log_total = self._integrate(mean, var, probs=False, num_points=self.num_elbo_points)
        return (full * log_w).sum(-1) + (Y * expected_log_sigmoid).sum(-1) - log_total

    def log_marginal_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        r""":math:`\log p(y_i \mid \text{data})` per datum under :meth:`predict_proba`."""
        probs = self.predict_proba(function_dist)
        full, _ = self._labels(y, probs.dtype)
        return (full * probs).sum(-1).log()

    # ------------------------------------------------------------------ sampling side
    def aux_prior(self, y: Tensor) -> AuxiliaryDistribution:
        log_w, log_s = self._log_weights()
        _, Y = self._labels(y, log_w.dtype)
        log_p = (log_w[..., : self.num_latents] - log_s.unsqueeze(-1)).expand(Y.shape)
        return AuxiliaryDistribution(
            n=NegativeMultinomial(log_p),  # the measure mu_p (improper for the over-parametrised link)
            omega=lambda aux: Independent(PolyaGamma(Y + aux["n"], torch.zeros_like(aux["n"])), 1),
        )

    def aux_conditional(self, y: Tensor, f: Tensor) -> AuxiliaryDistribution:
        r""":math:`n \mid f \sim \mathrm{NM}(1, p')`, :math:`p'_j = p_j\sigma(-f_j)`,
        :math:`p'_0 = \sum_l \theta_l s_l(f) / S`; :math:`\omega_j \mid n, f \sim \mathrm{PG}(Y_j + n_j, |f_j|)`."""
        log_w, log_s = self._log_weights()
        _, Y = self._labels(y, f.dtype)
        log_p0 = torch.logsumexp(self._logits(f), -1) - log_s
        f = self._latent(f)
        log_p = log_w[..., : self.num_latents] - log_s.unsqueeze(-1) + logsigmoid(-f)
        log_p, log_p0 = torch.broadcast_tensors(log_p, log_p0.unsqueeze(-1))
        return AuxiliaryDistribution(
            n=NegativeMultinomial(log_p, log_p0[..., 0]),
            omega=lambda aux: Independent(PolyaGamma(Y + aux["n"], f.abs()), 1),
        )

    def potential_and_precision(self, y: Tensor, aux: AuxDict, f: Tensor | None = None) -> tuple[Tensor, Tensor]:
        n, omega = aux["n"], aux["omega"]
        _, Y = self._labels(y, n.dtype)
        return self._engine(((Y - n) / 2).expand_as(omega).mT), self._engine(omega.mT)

    def _log_label_weight(self, y: Tensor, dtype: torch.dtype) -> Tensor:
        r""":math:`\log(\theta_k \bar s_k / S)` of each datum's class, ``(..., N)``."""
        log_w, log_s = self._log_weights()
        full, _ = self._labels(y, dtype)
        return (full * log_w).sum(-1) - log_s

    def log_tilt_constant(self, y: Tensor, aux: AuxDict) -> Tensor:
        n = aux["n"]
        _, Y = self._labels(y, n.dtype)
        return self._log_label_weight(y, n.dtype) - (Y + n).sum(-1) * LOG2

    @property
    def samples_constants(self) -> bool:
        """Whether a prior on the constants is set (``class_scale_prior``): then the Gibbs sampler draws them."""
        return self.class_scale_prior is not None

    def sample_hyperparameters(
        self, y: Tensor, aux: AuxDict, f: Tensor, generator: torch.Generator | None = None
    ) -> tuple[dict[str, Tensor], AuxDict | None]:
        r"""Gibbs step for :math:`\theta` under ``class_scale_prior``.

        With the Gamma variable :math:`\zeta` of
        :math:`1/\sum_l\theta_l s_l = \int_0^\infty e^{-\zeta\sum_l\theta_l s_l} d\zeta` reinstated:
        :math:`\zeta_i \mid f, \theta \sim \mathrm{Ga}(1, \sum_l \theta_l s_l(f_i))`, then
        :math:`\theta_k \mid f, \zeta \sim \mathrm{Ga}(\alpha + N_k, \beta + \sum_i \zeta_i s_k(f_i))`, both collapsed
        over :math:`(n, \omega)`; then a fresh :math:`(n, \omega) \sim p(n, \omega \mid y, f, \theta)` under the new
        :math:`\theta` for the :math:`f`-step (the incoming ``aux`` was drawn under the old one). Each is an exact
        block draw of the joint :math:`p(f, \theta, \zeta, n, \omega \mid y)`, so the sweep leaves the posterior
        invariant.

        Pure: returns ``({"class_scales": theta}, fresh_aux)`` with one :math:`\theta` per chain (leading dimensions
        of ``f``, shape ``(*chains, K)``), or ``({}, None)`` without a prior; the likelihood's parameter is not
        changed (evaluate under the draw with :meth:`constants`).
        """
        prior = self._prior_parameters
        if prior is None:
            return {}, None
        alpha, beta = prior
        with torch.no_grad(), seeded_by(generator, f.device):
            theta = self.class_scales.unsqueeze(-2)  # (..., 1, K)
            s = (self._logits(f) - theta.log()).exp()  # s_l(f): sigma(f_l), and D for the reference class
            rate = (theta * s).sum(-1)  # (..., N)
            zeta = torch.empty_like(rate).exponential_() / rate
            full, _ = self._labels(y, f.dtype)
            shape = alpha + full.sum(-2)
            rate_theta = beta + (zeta.unsqueeze(-1) * s).sum(-2)
            shape, rate_theta = torch.broadcast_tensors(shape, rate_theta)
            draw = Gamma(shape, rate_theta).sample().clamp_min(torch.finfo(f.dtype).tiny)
        with self.constants({"class_scales": draw}):
            fresh = self.sample_aux(y, f, generator=generator)
        return {"class_scales": draw}, fresh

    # ------------------------------------------------------------------ variational side
    def aux_posterior(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> AuxDict:
        f_mean, f_var = self._latent(f_mean), self._latent(f_var)
        c = pg_tilt_c(f_mean, f_var)
        log_st, log_one_minus = log_sigma_tilde_moments(f_mean, f_var, c)
        return {"c": c, "sigma_tilde": log_st.exp(), "log_one_minus_sigma_tilde": log_one_minus}

    @staticmethod
    def _log_one_minus(q_aux: AuxDict) -> Tensor:
        r""":math:`\log(1 - \tilde\sigma)` from ``sigma_tilde``; where that rounds to 1 (:math:`f \ll 0`), the value
        :meth:`aux_posterior` kept (``log_one_minus_sigma_tilde``), else the smallest the dtype resolves."""
        sigma_tilde = q_aux["sigma_tilde"]
        below_one = 1 - torch.finfo(sigma_tilde.dtype).eps / 2
        log_one_minus = torch.log1p(-sigma_tilde.clamp_max(below_one))
        kept = q_aux.get("log_one_minus_sigma_tilde")
        if kept is None:
            return log_one_minus
        return torch.where(sigma_tilde < 1, log_one_minus, torch.minimum(kept, log_one_minus))

    def _log_q(self, log_one_minus_sigma_tilde: Tensor) -> Tensor:
        r""":math:`\log Q = \log\big(\sum_{j\le J}\theta_j(1 - \tilde\sigma_j) + [\text{bij}]\theta_K D\big)`,
        ``(..., N)``."""
        log_w, _ = self._log_weights()
        terms = log_w[..., : self.num_latents] + log_one_minus_sigma_tilde
        if self.bijective:
            terms = torch.cat([terms, log_w[..., -1:].expand(*terms.shape[:-1], 1)], -1)
        return torch.logsumexp(terms, -1)

    def _count_mean(self, q_aux: AuxDict) -> tuple[Tensor, Tensor]:
        r""":math:`\bar n_j = \theta_j\tilde\sigma_j / Q` and :math:`\log Q` (:math:`q(n) = \mathrm{NM}(1, p^q)`)."""
        sigma_tilde = q_aux["sigma_tilde"]
        log_q = self._log_q(self._log_one_minus(q_aux))
        log_w, _ = self._log_weights()
        return (log_w[..., : self.num_latents] + sigma_tilde.log() - log_q.unsqueeze(-1)).exp(), log_q

    def aux_posterior_distribution(self, y: Tensor, q_aux: AuxDict) -> AuxiliaryDistribution:
        r"""The law of :math:`q^*(n, \omega) = \mathrm{NM}(n\mid 1, p^q)\prod_j\mathrm{PG}(\omega_j\mid Y_j + n_j,
        c_j)`."""
        c, sigma_tilde = q_aux["c"], q_aux["sigma_tilde"]
        log_w, log_s = self._log_weights()
        _, Y = self._labels(y, c.dtype)
        log_q = self._log_q(self._log_one_minus(q_aux))
        return AuxiliaryDistribution(
            n=NegativeMultinomial(
                log_w[..., : self.num_latents] - log_s.unsqueeze(-1) + sigma_tilde.log(), log_q - log_s
            ),
            omega=lambda aux: Independent(PolyaGamma(Y + aux["n"], c), 1),
        )

    def expected_potential_and_precision(
        self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor
    ) -> tuple[Tensor, Tensor]:
        c = q_aux["c"]
        n_mean, _ = self._count_mean(q_aux)
        _, Y = self._labels(y, c.dtype)
        return self._engine(((Y - n_mean) / 2).mT), self._engine(pg_mean(Y + n_mean, c).mT)

    def expected_log_tilt_constant(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        n_mean, _ = self._count_mean(q_aux)
        _, Y = self._labels(y, n_mean.dtype)
        return self._log_label_weight(y, n_mean.dtype) - (Y + n_mean).sum(-1) * LOG2

    def aux_kl(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        r""":math:`\sum_j \mathrm{KL}_{PG}(Y_j + \bar n_j, c_j) + \log p^q_0 + \sum_j \bar n_j \log\tilde\sigma_j`
        (the KL of :math:`q(n)` to the measure :math:`\mu_p`, finite for both links), with
        :math:`\log p^q_0 = \log Q - \log S`."""
        c, sigma_tilde = q_aux["c"], q_aux["sigma_tilde"]
        n_mean, log_q = self._count_mean(q_aux)
        _, log_s = self._log_weights()
        _, Y = self._labels(y, c.dtype)
        return pg_kl(Y + n_mean, c).sum(-1) + log_q - log_s + torch.xlogy(n_mean, sigma_tilde).sum(-1)

    def collapsed_bound(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> Tensor:
        f_mean, f_var = self._latent(f_mean), self._latent(f_var)
        c = pg_tilt_c(f_mean, f_var)
        log_w, _ = self._log_weights()
        full, Y = self._labels(y, f_mean.dtype)
        log_q = self._log_q(log_sigma_tilde_moments(f_mean, f_var, c)[1])
        return (full * log_w).sum(-1) + (Y * log_sigma_tilde_plus(f_mean, c)).sum(-1) - log_q

    def _class_scale_terms(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> tuple[Tensor, Tensor]:
        r""":math:`a_{ik}` (``(M, K)``, every datum of every batch) and the class counts :math:`N_k`."""
        f_mean, f_var = self._latent(f_mean), self._latent(f_var)
        c = pg_tilt_c(f_mean, f_var)
        a = log_sigma_tilde_moments(f_mean, f_var, c)[1].double().exp()  # 1 - σ̃, (..., N, J)
        if self.bijective:
            a = torch.cat([a, torch.full_like(a[..., :1], math.exp(LOG_D))], -1)
        full, _ = self._labels(y, f_mean.dtype)
        full = full.expand(*a.shape)
        return a.reshape(-1, self.num_classes), full.reshape(-1, self.num_classes).sum(0)

    def update_hyperparameters(self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor) -> None:
        r"""With ``learn_class_scales``: :math:`\theta \leftarrow \arg\max_\theta \sum_i \ell^*_i` (normalised to mean
        1), or the MAP under ``class_scale_prior``
        (:func:`~gpytorch_augment.likelihoods.class_scales.maximise_class_scales`), given :math:`q(f)`.

        Without a prior, data in which some class is absent (a mini-batch of a label-sorted loader, a batch of one)
        leave :math:`\theta` unchanged: the absent classes' scales have no finite maximiser, and the ratios of the
        classes present, fitted on such a batch alone, are fitted on a region of the inputs, not on the data (a
        label-sorted loader would carry them to extremes batch by batch)."""
        if not self.learn_class_scales:
            return
        with torch.no_grad():
            a, counts = self._class_scale_terms(y, f_mean.detach(), f_var.detach())
            if self._prior_parameters is None and bool((counts == 0).any()):
                return
            theta = self.class_scales.detach()
            if theta.dim() > 1:
                theta = theta.mean(tuple(range(theta.dim() - 1)))
            theta = maximise_class_scales(a, counts, theta, self._prior_parameters).to(theta)
            set_positive_constant(self, "class_scales", theta, update=True)
