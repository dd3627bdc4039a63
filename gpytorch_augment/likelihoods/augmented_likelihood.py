r"""The augmentation protocol shared by every likelihood and both inference engines.

An augmented likelihood introduces auxiliary variables :math:`\Omega_i` with a prior :math:`p(\Omega_i\mid y_i)`
such that, given :math:`\Omega_i`, the datum contributes a Gaussian *tilt* to the latent GP:

.. math::
    p(y_i, \Omega_i \mid f_i) = C(\Omega_i, y_i)\,
    \exp\!\big(h(\Omega_i, y_i)\, f_i - \tfrac12 \lambda(\Omega_i, y_i)\, f_i^2\big)\, p(\Omega_i \mid y_i),
    \qquad \int p(y_i, \Omega_i \mid f_i)\, d\Omega_i = p(y_i \mid f_i).

:math:`h` is the *potential* and :math:`\lambda \ge 0` the *precision*. The engines (``CAVI``,
``GibbsSampler``) only ever talk to a likelihood through the members of :class:`AugmentedLikelihood`;
the mathematics of each likelihood is in :doc:`/maths/index`.

Shapes: a single-latent likelihood takes ``f`` of shape ``(*batch, N)``; a multi-latent one ``(*batch, N, T)``.
Potentials and precisions come back as ``(*batch, N)`` or, for ``T`` latents, ``(*batch, T, N)``
(latent-major). Auxiliary variables and their variational parameters are ``dict[str, Tensor]``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.likelihoods import Likelihood
from torch import Tensor
from torch.distributions import Distribution

from .._numerics import gauss_hermite, gauss_hermite_expectation
from .._validation import as_tensors, check_finite, float_targets, one_hot_hint
from ..core.data import ObservedData
from ..core.design import LinearObservations
from ..distributions.auxiliary import AuxiliaryDistribution

__all__ = ["NUM_QUADRATURE_LOCS", "AugmentedLikelihood", "AuxDict", "validated_latent_blocks"]

AuxDict = dict[str, Tensor]

#: Gauss--Hermite nodes used for the true expected log-likelihood and the predictive of 1-D likelihoods.
NUM_QUADRATURE_LOCS = 32


class AugmentedLikelihood(Likelihood, ABC):
    r"""Base class of conditionally conjugate (augmented) GP likelihoods.

    Use one with an ``ApproximateGP`` (fitted by :class:`~gpytorch_augment.CAVI` or any GPyTorch loop) or with a
    :class:`~gpytorch_augment.GPPrior` and a sampler (:func:`~gpytorch_augment.posterior_sampler`); GPyTorch's
    ``ExactGP`` accepts only Gaussian likelihoods and raises ``RuntimeError`` for this one. The user guide's page
    :doc:`/guide/from_gpytorch` translates an ``ExactGP`` or SVGP setup.

    Subclasses implement the mathematics of one likelihood:

    * drop-in GPyTorch behaviour: :meth:`forward` (the conditional :math:`p(y\mid f)`), :meth:`marginal`
      (the predictive of :math:`y`) and, through the defaults here, :meth:`expected_log_prob` and
      :meth:`log_marginal` of the *true* likelihood (Gauss--Hermite for one latent);
    * the sampling side: :meth:`aux_prior`, :meth:`aux_conditional`, :meth:`potential_and_precision`,
      :meth:`log_tilt_constant`;
    * the variational side: :meth:`aux_posterior`, :meth:`expected_potential_and_precision`,
      :meth:`expected_log_tilt_constant`, :meth:`aux_kl` and optionally :meth:`update_hyperparameters`
      and a closed-form :meth:`collapsed_bound`.

    Targets are validated by :meth:`check_targets` at the public entry points (engines, MLLs,
    :meth:`expected_log_prob`), once: the engines take the :class:`~gpytorch_augment.core.ObservedData` it gives;
    every other member is pure and assumes canonical targets.

    The likelihood holds no state of a fit: CAVI keeps its :math:`q(\Omega)` (``CAVI.q_aux``), the samplers their
    draws of :math:`\Omega` in their chain state (``samples.last.aux``).

    Example::

        >>> import torch
        >>> from gpytorch_augment import AugmentedLikelihood, BernoulliLogitLikelihood
        >>> lik = BernoulliLogitLikelihood().double()
        >>> isinstance(lik, AugmentedLikelihood), lik.num_latents
        (True, 1)
        >>> y = lik.check_targets(torch.tensor([1.0, 0.0], dtype=torch.float64))
        >>> f = torch.tensor([0.5, -1.0], dtype=torch.float64)
        >>> aux = lik.sample_aux(y, f, generator=torch.Generator().manual_seed(0))
        >>> log_c = lik.augmented_log_prob(y, aux, f) - lik.aux_conditional(y, f).log_prob(aux)
        >>> torch.allclose(log_c, lik.log_prob_at(y, f))   # tilt / conditional recovers p(y | f)
        True
    """

    #: number of latent GPs :math:`T`
    num_latents: int = 1
    #: optional update order of the latents, read by both engines: a partition of ``0..T-1`` into blocks, e.g.
    #: ``((0,), (1,))``. Gibbs draws a fresh :math:`\Omega` before each block and then that block's latents given it
    #: (a partially collapsed sampler); CAVI refreshes :math:`q(\Omega)` before updating each block's
    #: :math:`q(u)`. ``None`` (or a single block) updates all latents together. Validated by
    #: :func:`validated_latent_blocks`.
    latent_blocks: Sequence[Sequence[int]] | None = None

    #: Names of per-datum keyword data (e.g. binomial ``trials``) a likelihood reads from ``**kwargs`` rather than
    #: from named parameters of :meth:`check_targets`. The engines accept exactly the named parameters of
    #: :meth:`check_targets` plus these, and reject any other keyword with a ``TypeError`` naming it (a mistyped
    #: option would otherwise be passed on and silently ignored).
    target_keywords: tuple[str, ...] = ()

    #: The exact-model sampler :func:`~gpytorch_augment.posterior_sampler` builds with ``method="auto"``: ``"hmc"``
    #: (:class:`~gpytorch_augment.HMCSampler`) where it gives the larger worst-case effective sample size per second
    #: on this likelihood's posteriors, else ``"gibbs"`` (:class:`~gpytorch_augment.GibbsSampler`; also the default
    #: for a new likelihood). The figures behind each choice: the user guide's "Which engine, when".
    preferred_sampler: str = "gibbs"

    #: The sampler :func:`~gpytorch_augment.posterior_sampler` builds with ``method="auto"`` and
    #: ``sample_hyperparameters=True``: ``"gibbs"`` (default: the blocked sampler, the prior's hyper-parameters moved
    #: given the auxiliary variables with the latents integrated out) or ``"hmc"`` (HMC on the hyper-parameters and the
    #: whitened latents jointly) where that gives the larger worst-case effective sample size per second on this
    #: likelihood's posteriors. The figures: ``benchmarks/README.md`` ("Fully Bayesian GPs").
    preferred_hyper_sampler: str = "gibbs"

    #: Whether an observation reads a linear combination of latent values (e.g. a comparison :math:`f_a - f_b`)
    #: rather than the latent value at its own input: then :meth:`observation_design` gives the combinations, the
    #: targets need not be aligned with the inputs ``x``, and every protocol member below takes the observation
    #: functionals :math:`g = Df` (and their marginals) where a pointwise likelihood takes :math:`f`.
    linear_observations: bool = False

    #: Whether the targets are real values whose location and spread the latent GP must match (regression
    #: likelihoods): the one-call fit then warns when they are far from standardised, since every scale of the model
    #: starts at 1.
    real_valued_targets: bool = False

    #: The augmentation in a few words: the likelihood's row of the likelihood tables, which the documentation
    #: build generates from every exported class that sets it (``""``: no row, as for this abstract class).
    augmentation: str = ""
    #: The ``docs/maths`` page that derives the augmentation, linked from the tables (``""``: the class docstring).
    maths_page: str = ""
    #: The latents column of the tables where it is not :attr:`num_latents` (e.g. ``"K or K−1"``).
    latents_label: str = ""

    #: Whether :meth:`elbo_bound` makes :meth:`expected_log_prob` a cheaper deterministic lower bound of itself,
    #: which the one-call fit's nested protocol can optimise first (``hyper_options={"elbo_bound": True}``).
    has_elbo_bound: bool = False

    @contextmanager
    def elbo_bound(self) -> Iterator[None]:
        r"""Inside this context :meth:`expected_log_prob` returns a lower bound :math:`\ell_i \le E_{q(f_i)}\log
        p(y_i \mid f_i)` that is cheaper to evaluate, where the likelihood has one (:attr:`has_elbo_bound`; the
        default has none and changes nothing)."""
        yield

    @property
    def samples_constants(self) -> bool:
        """Whether :meth:`sample_hyperparameters` draws the likelihood's constants (a prior on them is set). Only
        :class:`~gpytorch_augment.GibbsSampler` samples them; :class:`~gpytorch_augment.HMCSampler` refuses such a
        likelihood."""
        return False

    def check_fixed_constants(self, y: Tensor) -> None:
        """Called by the samplers with the canonical targets ``y``, where the likelihood's constants stay fixed at
        their current values (no prior on them, :attr:`samples_constants` ``False``): raise ``ValueError`` naming
        the constant where no latent values can fit ``y`` at those values. The default checks nothing."""

    # ------------------------------------------------------------------ validation
    def check_targets(self, y: Tensor, **kwargs: Any) -> Tensor:
        """Validate targets and return them in the canonical form the other members expect.

        The default checks finiteness only; likelihoods with a restricted domain override it and raise a
        ``ValueError`` naming the offending value.
        """
        return check_finite("targets y", y)

    def observation_design(self, y: Tensor, num_points: int) -> LinearObservations | None:
        r"""The design :math:`g = Df` the canonical targets ``y`` read from ``num_points`` latent values
        (:class:`~gpytorch_augment.core.LinearObservations`); ``None`` (the default) for a pointwise likelihood,
        whose datum :math:`i` reads :math:`f_i`. Overridden by likelihoods with :attr:`linear_observations`."""
        return None

    def check_observations(
        self, observations: Tensor | ObservedData, function_dist: MultivariateNormal, **kwargs: Any
    ) -> Tensor:
        """:meth:`check_targets`, plus agreement with :math:`q(f)`: a floating-point mean, as many targets as data
        points (for :attr:`linear_observations`, targets whose design reads only the points of :math:`q(f)`), finite
        moments.

        For the entry points that receive :math:`q(f)` rather than the inputs (``expected_log_prob``,
        ``log_marginal``, ``AugmentedELBO``); returns the canonical targets. Data checked already (an
        :class:`~gpytorch_augment.core.ObservedData`, what the engines hand to a hyper-parameter objective) are only
        matched against the shape of :math:`q(f)`: their targets are not checked again, nor the moments of the
        engine's :math:`q(f)` (a non-finite one makes the objective non-finite, which the engines report).
        """
        mean = function_dist.mean
        num_data = mean.shape[-1] if self.num_latents == 1 else mean.shape[-2]
        if isinstance(observations, ObservedData):
            return self._matched(observations, num_data, function_dist)
        (observations,) = as_tensors(observations, kwargs=kwargs)
        if not mean.is_floating_point():
            raise ValueError(
                f"function_dist (q(f)) must have a floating-point mean, got {mean.dtype}: build the "
                "MultivariateNormal from float tensors (an integer mean makes every quadrature node an integer)"
            )
        observations = (
            float_targets(observations, kwargs, mean.dtype) if isinstance(observations, Tensor) else observations
        )
        y = self.check_targets(observations, **kwargs)
        if self.linear_observations:  # the targets index the points: the design checks them against q(f)
            self.observation_design(y, num_data)
        elif y.dim() < 1 or y.shape[-1] != num_data:
            raise ValueError(
                f"targets y have shape {tuple(y.shape)} but q(f) has {num_data} data points "
                f"(event shape {tuple(function_dist.event_shape)}){one_hot_hint(y, num_data)}"
            )
        if not (torch.isfinite(mean).all() and torch.isfinite(function_dist.variance).all()):
            raise ValueError("q(f) has a non-finite mean or variance: check the inputs x for NaN or inf values")
        return y

    @staticmethod
    def _matched(data: ObservedData, num_data: int, function_dist: MultivariateNormal) -> Tensor:
        """The canonical targets of checked ``data``, if they are data of the ``num_data`` points of :math:`q(f)`
        (a shape check: nothing is read back from the device)."""
        points = data.num_data if data.design is None else data.design.num_points
        if points != num_data:
            raise ValueError(
                f"the checked data hold {points} data points but q(f) has {num_data} "
                f"(event shape {tuple(function_dist.event_shape)})"
            )
        return data.y

    # ------------------------------------------------------------------ drop-in GPyTorch behaviour
    @abstractmethod
    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> Distribution:
        r"""The conditional :math:`p(y \mid f)` as a ``torch.distributions.Distribution``."""

    def _quadrature(self, function_dist: MultivariateNormal, num_locs: int = NUM_QUADRATURE_LOCS):
        self._quadrature_rule_applies()
        return gauss_hermite(function_dist.mean, function_dist.variance, num_locs)

    def _quadrature_rule_applies(self) -> None:
        if self.num_latents != 1:
            raise NotImplementedError(
                f"{type(self).__name__} has {self.num_latents} latents: 1-D quadrature would integrate along a "
                "diagonal; implement expected_log_prob/marginal with a product rule or Monte Carlo"
            )

    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        r""":math:`\log p(y \mid f)` of the original likelihood for canonical targets, broadcasting over ``f``."""
        return self.forward(f, **kwargs).log_prob(y)

    def log_prob_and_grad(self, y: Tensor, f: Tensor, **kwargs: Any) -> tuple[Tensor, Tensor]:
        r"""``(log_prob_at(y, f), ∂/∂f Σ log_prob_at(y, f))``: the per-datum log-likelihood and the gradient of its
        sum, the same shape as ``f`` (the hot path of :class:`~gpytorch_augment.HMCSampler`). The default
        differentiates :meth:`log_prob_at` by autograd; a likelihood may override it with a closed form (the shared
        suite checks the two agree)."""
        with torch.enable_grad():
            f_ = f.detach().requires_grad_(True)
            value = self.log_prob_at(y, f_, **kwargs)
            (grad,) = torch.autograd.grad(value.sum(), f_)
        return value.detach(), grad

    def log_prob_grad(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        r""":math:`\partial/\partial f \sum \log p(y \mid f)` alone, the shape of ``f``: the leapfrog step of
        :class:`~gpytorch_augment.HMCSampler` needs no value. The default takes the gradient of
        :meth:`log_prob_and_grad`; a likelihood whose value costs extra operations may override it, and must then
        return that gradient to the bit (HMC mixes the two, and a resumed run must continue exactly; the shared suite
        checks it)."""
        return self.log_prob_and_grad(y, f, **kwargs)[1]

    def expected_log_prob(
        self, observations: Tensor | ObservedData, function_dist: MultivariateNormal, *args: Any, **kwargs: Any
    ) -> Tensor:
        r""":math:`E_{q(f_i)} \log p(y_i \mid f_i)` of the **true** likelihood, one value per datum: GPyTorch's entry
        point, which checks the observations against :math:`q(f)` (:meth:`check_observations`) and returns
        :meth:`expected_log_lik` of the canonical targets."""
        y = self.check_observations(observations, function_dist, **kwargs)
        return self.expected_log_lik(y, function_dist, **_keywords(observations, kwargs))

    def log_marginal(
        self, observations: Tensor | ObservedData, function_dist: MultivariateNormal, *args: Any, **kwargs: Any
    ) -> Tensor:
        r""":math:`\log \int p(y_i \mid f_i)\, q(f_i)\, df_i`, one value per datum: GPyTorch's entry point, which checks
        the observations and returns :meth:`log_marginal_lik` of the canonical targets."""
        y = self.check_observations(observations, function_dist, **kwargs)
        return self.log_marginal_lik(y, function_dist, **_keywords(observations, kwargs))

    def expected_log_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        r""":math:`E_{q(f_i)} \log p(y_i \mid f_i)` per datum for **canonical** targets (checked once, by the caller):
        the engines' entry. The default is Gauss--Hermite quadrature of :meth:`log_prob_at`; a likelihood
        overrides it with a closed form or a better rule. Where only the marginal means and variances need a
        gradient (no parameter of the likelihood), the rule's derivatives come from :meth:`log_prob_and_grad` at
        the nodes in the same pass (:func:`~gpytorch_augment._numerics.gauss_hermite_expectation`: no backward
        through the nodes, whose copies of the data dominate the cost at many points)."""
        mean, var = function_dist.mean, function_dist.variance
        if (
            not torch.is_grad_enabled()
            or not (mean.requires_grad or var.requires_grad)
            or any(p.requires_grad for p in self.parameters())
        ):
            nodes, weights = self._quadrature(function_dist)
            return (weights * self.log_prob_at(y, nodes, **kwargs)).sum(0)
        self._quadrature_rule_applies()
        return gauss_hermite_expectation(lambda f: self.log_prob_and_grad(y, f, **kwargs), mean, var,
                                         NUM_QUADRATURE_LOCS)  # fmt: skip

    def log_marginal_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        r""":math:`\log \int p(y_i \mid f_i)\, q(f_i)\, df_i` per datum for **canonical** targets (by quadrature unless
        overridden)."""
        nodes, weights = self._quadrature(function_dist)
        return torch.logsumexp(weights.log() + self.log_prob_at(y, nodes, **kwargs), dim=0)

    @abstractmethod
    def marginal(self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> Distribution:
        r"""The predictive distribution of :math:`y`, :math:`\int p(y\mid f)\, q(f)\, df`."""

    # ------------------------------------------------------------------ sampling side (Gibbs)
    @abstractmethod
    def aux_prior(self, y: Tensor) -> AuxiliaryDistribution:
        r"""The prior :math:`p(\Omega \mid y)` of the auxiliary variables."""

    @abstractmethod
    def aux_conditional(self, y: Tensor, f: Tensor) -> AuxiliaryDistribution:
        r"""The full conditional :math:`p(\Omega \mid y, f) \propto \text{tilt}\cdot p(\Omega\mid y)`."""

    def sample_aux(self, y: Tensor, f: Tensor, generator: torch.Generator | None = None) -> AuxDict:
        r"""One draw of :math:`\Omega \sim p(\Omega \mid y, f)`."""
        return self.aux_conditional(y, f).sample(generator=generator)

    @abstractmethod
    def potential_and_precision(self, y: Tensor, aux: AuxDict, f: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r"""The potential :math:`h(\Omega, y)` and precision :math:`\lambda(\Omega, y)` of the tilt."""

    @abstractmethod
    def log_tilt_constant(self, y: Tensor, aux: AuxDict) -> Tensor:
        r""":math:`\log C(\Omega, y)`, the :math:`f`-independent part of the log-tilt, per datum."""

    def log_tilt(self, y: Tensor, aux: AuxDict, f: Tensor) -> Tensor:
        r""":math:`\log C(\Omega, y) + h f - \tfrac12 \lambda f^2`, per datum."""
        h, lam = self.potential_and_precision(y, aux, f)
        if self.num_latents > 1:
            f = f.mT
            return self.log_tilt_constant(y, aux) + (h * f - 0.5 * lam * f**2).sum(-2)
        return self.log_tilt_constant(y, aux) + h * f - 0.5 * lam * f**2

    def augmented_log_prob(self, y: Tensor, aux: AuxDict, f: Tensor) -> Tensor:
        r""":math:`\log p(y, \Omega \mid f)` = log-tilt :math:`+ \log p(\Omega \mid y)`, per datum."""
        return self.log_tilt(y, aux, f) + self.aux_prior(y).log_prob(aux)

    # ------------------------------------------------------------------ variational side (CAVI)
    @abstractmethod
    def aux_posterior(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> AuxDict:
        r"""Parameters of the optimal :math:`q^*(\Omega_i) \propto \exp E_{q(f_i)} \log p(y_i, \Omega_i \mid f_i)`."""

    @abstractmethod
    def expected_potential_and_precision(
        self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor
    ) -> tuple[Tensor, Tensor]:
        r""":math:`(\bar h, \bar \lambda) = (E_q h, E_q \lambda)` under :math:`q(\Omega)`."""

    @abstractmethod
    def expected_log_tilt_constant(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        r""":math:`E_{q(\Omega)} \log C(\Omega, y)`, per datum."""

    def expected_log_tilt(self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor) -> Tensor:
        r""":math:`E_{q(f)q(\Omega)}[\log C + h f - \tfrac12\lambda f^2]
        = E\log C + \bar h m - \tfrac12 \bar\lambda (m^2 + s)`, per datum."""
        h, lam = self.expected_potential_and_precision(y, q_aux, f_mean, f_var)
        if self.num_latents > 1:
            f_mean, f_var = f_mean.mT, f_var.mT
            quad = (h * f_mean - 0.5 * lam * (f_mean**2 + f_var)).sum(-2)
        else:
            quad = h * f_mean - 0.5 * lam * (f_mean**2 + f_var)
        return self.expected_log_tilt_constant(y, q_aux) + quad

    @abstractmethod
    def aux_kl(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        r""":math:`\mathrm{KL}(q(\Omega_i) \,\Vert\, p(\Omega_i \mid y_i))`, per datum."""

    def elbo_terms(self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor) -> Tensor:
        r""":math:`\ell_i = E[\text{log-tilt}] - \mathrm{KL}(q(\Omega_i)\Vert p(\Omega_i\mid y_i))`, per datum."""
        return self.expected_log_tilt(y, q_aux, f_mean, f_var) - self.aux_kl(y, q_aux)

    def collapsed_bound(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> Tensor:
        r""":math:`\ell_i^* = \max_{q(\Omega_i)} \ell_i`, per datum (a smooth function of :math:`(m_i, s_i)`).

        The default evaluates :meth:`elbo_terms` at :meth:`aux_posterior`; likelihoods override it with the
        closed form of :doc:`/maths/index`.
        """
        return self.elbo_terms(y, self.aux_posterior(y, f_mean, f_var), f_mean, f_var)

    def update_hyperparameters(self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor) -> None:
        """Closed-form coordinate update of the likelihood's own constants (a no-op unless overridden)."""

    def sample_hyperparameters(
        self, y: Tensor, aux: AuxDict, f: Tensor, generator: torch.Generator | None = None
    ) -> tuple[dict[str, Tensor], AuxDict | None]:
        r"""Gibbs step for the likelihood's own constants given :math:`(\Omega, f)`, for likelihoods with a conjugate
        prior on them; the Gibbs engine calls it after the :math:`\Omega` step of every sweep.

        Pure: returns ``(constants, fresh_aux)``. ``constants`` maps the public name of each sampled constant (the
        parameter name without ``raw_``) to its draw, constrained, one entry per chain (the leading dimensions of
        ``f``); the engine keeps them in its own state and evaluates the likelihood under them with
        :meth:`constants`. ``fresh_aux`` is a fresh :math:`\Omega` drawn under the new constants where the valid scan
        order redraws :math:`\Omega` after them (its conditional depends on them), else ``None``; the engine then
        uses that draw for the :math:`f`-step. The default samples nothing: ``({}, None)``."""
        return {}, None

    @contextmanager
    def constants(self, values: Mapping[str, Tensor]) -> Iterator[AugmentedLikelihood]:
        r"""Evaluate every member at the given values of the likelihood's constants, e.g. one per Gibbs chain.

        ``values`` maps public names (``"rate_scale"`` for the parameter ``raw_rate_scale`` and its constraint, or
        the name of an unconstrained parameter) to constrained values of any shape broadcastable against the
        per-chain data, e.g. ``(chains, 1)``. Inside the block each parameter holds
        ``constraint.inverse_transform(value)``; on exit its former data (tensor and shape) is restored, also on
        error. Parameters are not validated, so any value the constraint maps is accepted.

        Example::

            >>> import torch
            >>> from gpytorch_augment import PoissonLogitLikelihood
            >>> likelihood = PoissonLogitLikelihood(rate_scale=2.0)
            >>> f = torch.zeros(3, 4)                                            # 3 chains, 4 data points
            >>> with likelihood.constants({"rate_scale": torch.tensor([[1.0], [2.0], [3.0]])}):
            ...     likelihood.forward(f).mean[:, 0].detach()                           # ξ σ(0) per chain
            tensor([0.5000, 1.0000, 1.5000])
            >>> likelihood.rate_scale                                            # restored on exit
            tensor([2.], grad_fn=<SoftplusBackward0>)

        :raises ValueError: naming the keys that are not constants of the likelihood.
        """
        table = {name: (param, constraint) for name, param, constraint in self.named_parameters_and_constraints()}
        unknown = sorted(name for name in values if f"raw_{name}" not in table and name not in table)
        if unknown:
            known = sorted(name[4:] if name.startswith("raw_") else name for name in table)
            raise ValueError(f"{type(self).__name__} has no constants {unknown}; its constants are {known}")
        saved: list[tuple[torch.nn.Parameter, Tensor]] = []
        try:
            for name, value in values.items():
                param, constraint = table.get(f"raw_{name}", table.get(name))
                value = torch.as_tensor(value).to(param)
                saved.append((param, param.data))
                param.data = value if constraint is None else constraint.inverse_transform(value)
            yield self
        finally:
            for param, data in reversed(saved):
                param.data = data


def _keywords(observations: Tensor | ObservedData, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword data of the observations: those of checked data, else the caller's."""
    return {**observations.kwargs, **kwargs} if isinstance(observations, ObservedData) else kwargs


def validated_latent_blocks(likelihood: AugmentedLikelihood) -> list[list[int]] | None:
    """The likelihood's :attr:`~AugmentedLikelihood.latent_blocks` as lists of ints, or ``None`` where they do not
    split the update: the attribute is ``None``, there is one latent (the attribute is then not inspected), or the
    blocks are a single block.

    :raises ValueError: if the blocks are not a partition of the latents ``0..T-1``.

    Example::

        >>> from gpytorch_augment import BernoulliLogitLikelihood
        >>> from gpytorch_augment.likelihoods.augmented_likelihood import validated_latent_blocks
        >>> print(validated_latent_blocks(BernoulliLogitLikelihood()))   # one latent: nothing to split
        None
    """
    blocks, T = likelihood.latent_blocks, int(likelihood.num_latents)
    if blocks is None or T == 1:
        return None
    blocks = [[int(i) for i in block] for block in blocks]
    if sorted(i for block in blocks for i in block) != list(range(T)):
        raise ValueError(f"likelihood.latent_blocks must partition the latents 0..{T - 1}; got {blocks}")
    return None if T == 1 or len(blocks) == 1 else blocks
