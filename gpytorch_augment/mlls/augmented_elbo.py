r"""The augmented evidence lower bound as a GPyTorch marginal log-likelihood."""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.mlls._approximate_mll import _ApproximateMarginalLogLikelihood
from torch import Tensor

from .._validation import as_tensors, check_latents, check_target_keywords
from ..core.data import ObservedData
from ..core.design import LinearObservations
from ..likelihoods.augmented_likelihood import AugmentedLikelihood
from ..variational.cavi_variational_strategy import cavi_strategy_of


class AugmentedELBO(_ApproximateMarginalLogLikelihood):
    r"""The augmented ELBO, per datum, with :math:`q(\Omega)` held at its optimum:

    .. math::
        \mathcal L = \frac1N\Big(\sum_i E_{q(f_i)q(\Omega_i)}\big[\log C + h f_i - \tfrac12\lambda f_i^2\big]
        - \sum_i \mathrm{KL}\big(q(\Omega_i)\Vert p(\Omega_i\mid y_i)\big)
        - \beta\,\mathrm{KL}\big(q(u)\Vert p(u)\big)\Big).

    :math:`q(\Omega)` is recomputed from the (detached) marginals of :math:`q(f)`, so by the envelope theorem
    the gradient with respect to kernel, mean, likelihood constants and inducing inputs is that of the
    collapsed bound :math:`\sum_i \ell_i^*`. Use it with any torch optimizer, interleaved with CAVI steps.
    It is a lower bound on GPyTorch's ``VariationalELBO`` (the true expected log-likelihood).

    Example::

        >>> import torch
        >>> from gpytorch_augment import AugmentedELBO, BernoulliLogitLikelihood
        >>> from gpytorch_augment.testing import SVGP
        >>> x, y = torch.linspace(-1, 1, 6).unsqueeze(-1), torch.tensor([0.0, 0, 1, 0, 1, 1])
        >>> model, likelihood = SVGP(x[::2]), BernoulliLogitLikelihood()
        >>> mll = AugmentedELBO(likelihood, model, num_data=6)
        >>> loss = -mll(model(x), y)
        >>> loss.backward()
        >>> bool(torch.isfinite(loss)), model.covar_module.raw_outputscale.grad is not None
        (True, True)

    :param num_data: the total number of training points :math:`N` (a positive integer).
    :param beta: weight of :math:`\mathrm{KL}(q(u)\Vert p(u))` (finite, :math:`\ge 0`).
    :raises ValueError: naming ``num_data`` or ``beta`` if they break these rules.
    """

    likelihood: AugmentedLikelihood

    def __init__(self, likelihood: AugmentedLikelihood, model: Any, num_data: int, beta: float = 1.0) -> None:
        if not isinstance(likelihood, AugmentedLikelihood):
            raise TypeError(f"AugmentedELBO needs an AugmentedLikelihood, got {type(likelihood).__name__}")
        if isinstance(num_data, bool) or not isinstance(num_data, numbers.Integral) or int(num_data) <= 0:
            raise ValueError(f"num_data must be a positive integer (the number of training points); got {num_data!r}")
        if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not (0 <= float(beta) < math.inf):
            raise ValueError(f"beta must be a finite number >= 0; got {beta!r}")
        super().__init__(likelihood, model, int(num_data), beta=float(beta), combine_terms=True)
        strategy = cavi_strategy_of(model)
        if strategy is not None:  # a CAVI model: one latent GP per latent of the likelihood
            check_latents(model, strategy, likelihood)

    def forward(
        self,
        approximate_dist_f: MultivariateNormal,
        target: Tensor | ObservedData,
        *,
        kl_divergence: Tensor | None = None,
        **kwargs: Any,
    ) -> Tensor:
        r"""The bound per datum for :math:`q(f)` = ``approximate_dist_f`` at the batch ``target``. For a likelihood
        of :attr:`linear_observations` (pairwise comparisons) a datum is an observation: the bound is taken at the
        observations' marginals under :math:`q(f)` and averaged over them.

        :param target: the targets, checked here once (with the per-datum ``kwargs``, e.g. ``trials=``), or data
            checked already (an :class:`~gpytorch_augment.core.ObservedData`, what CAVI hands over: not checked
            again).
        :param kl_divergence: :math:`\mathrm{KL}(q(u)\Vert p(u))` when the caller already has it (e.g. CAVI's
            whitened KL of the :math:`q(u)` it just wrote); by default ``model.variational_strategy.kl_divergence()``.
            The terms are combined exactly as GPyTorch's ``_ApproximateMarginalLogLikelihood`` does.
        """
        if kl_divergence is None and not self.likelihood.linear_observations:
            return super().forward(approximate_dist_f, target, **kwargs)
        if kl_divergence is None:
            kl_divergence = self.model.variational_strategy.kl_divergence()
        y, design = self._targets(approximate_dist_f, target, kwargs)
        # per observation (e.g. comparison) for linear observations, not per point of q(f)
        num_batch = approximate_dist_f.event_shape[0] if design is None else y.shape[-1]
        log_likelihood = self._bound(approximate_dist_f, y, design).div(num_batch)
        kl_divergence = kl_divergence.div(self.num_data / self.beta)
        added_loss = torch.zeros_like(log_likelihood)
        for added_loss_term in self.model.added_loss_terms():
            added_loss.add_(added_loss_term.loss())
        log_prior = torch.zeros_like(log_likelihood)
        for _, module, prior, closure, _ in self.named_priors():
            log_prior.add_(prior.log_prob(closure(module)).sum().div(self.num_data))
        return log_likelihood - kl_divergence + log_prior - added_loss

    def _log_likelihood_term(
        self, variational_dist_f: MultivariateNormal, target: Tensor | ObservedData, **kwargs: Any
    ) -> Tensor:
        return self._bound(variational_dist_f, *self._targets(variational_dist_f, target, kwargs))

    def _targets(
        self, variational_dist_f: MultivariateNormal, target: Tensor | ObservedData, kwargs: dict[str, Any]
    ) -> tuple[Tensor, LinearObservations | None]:
        """The canonical targets and the design they read: ``target`` checked against :math:`q(f)` once (checked
        data only matched against its shape)."""
        if isinstance(target, ObservedData):
            if kwargs:
                raise TypeError("pass the keyword data inside the checked data, not beside it")
            return self.likelihood.check_observations(target, variational_dist_f), target.design
        check_target_keywords(self.likelihood, kwargs, "AugmentedELBO")
        (target,) = as_tensors(target, kwargs=kwargs)
        if target.dim() == 2 and target.shape[-1] == 1 and self.likelihood.num_latents == 1:
            target = target.squeeze(-1)  # a column of targets, as from a data frame
        y = self.likelihood.check_observations(target, variational_dist_f, **kwargs)
        return y, self.likelihood.observation_design(y, variational_dist_f.mean.shape[-1])

    def _bound(self, variational_dist_f: MultivariateNormal, y: Tensor, design: LinearObservations | None) -> Tensor:
        """The summed per-datum bound at the canonical targets ``y`` (at the observations ``g = Df`` where a design
        is given: their marginals under :math:`q(f)`)."""
        mean, var = variational_dist_f.mean, variational_dist_f.variance
        if design is not None:
            covariance = variational_dist_f.lazy_covariance_matrix.to_dense()
            mean, var = design.apply(mean), design.quadratic_diagonal(covariance).clamp_min(0.0)
        q_aux = self.likelihood.aux_posterior(y, mean.detach(), var.detach())
        return self.likelihood.elbo_terms(y, q_aux, mean, var).sum(-1)
