r"""Pairwise preferences with the logistic link (Bradley--Terry on a latent GP), augmented with one Pólya-Gamma
variable per comparison (:doc:`/maths/ordinal`)."""

from __future__ import annotations

from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor
from torch.distributions import Bernoulli

from .._numerics import gauss_hermite
from ..core.design import LinearObservations, comparison_indices
from ..distributions.auxiliary import AuxiliaryDistribution
from .augmented_likelihood import NUM_QUADRATURE_LOCS, AugmentedLikelihood, AuxDict
from .bernoulli import BernoulliLogitLikelihood

__all__ = ["PairwiseLogitLikelihood"]


def _required_comparisons(comparisons: Tensor | None) -> Tensor:
    """``comparisons`` as a tensor of shape ``(n, 2)`` with ``n >= 1``; ``ValueError`` naming it otherwise."""
    if comparisons is None:
        raise ValueError(
            "PairwiseLogitLikelihood needs the compared pairs: pass comparisons=C, an (n, 2) tensor of indices of "
            "the inputs x (e.g. CAVI(...).fit(x, y, comparisons=C), likelihood(model(x), comparisons=C))"
        )
    if not isinstance(comparisons, Tensor):
        comparisons = torch.as_tensor(comparisons)
    if comparisons.dim() != 2 or comparisons.shape[-1] != 2:
        raise ValueError(f"comparisons must have shape (n, 2); got shape {tuple(comparisons.shape)}")
    if comparisons.shape[0] == 0:
        raise ValueError(
            "comparisons holds no pairs (shape (0, 2)): pass at least one comparison (without data the posterior "
            "is the prior: use the model's prior directly)"
        )
    return comparisons


def _index_dtype(dtype: torch.dtype, pairs: Tensor) -> torch.dtype:
    """``dtype`` if it represents every index in ``pairs`` exactly, else the narrowest of float32 and float64 that
    does (the canonical target holds labels and indices in one floating tensor)."""
    largest = int(pairs.max()) if pairs.numel() else 0
    for candidate in (dtype, torch.float32, torch.float64):
        if largest <= 2.0 / torch.finfo(candidate).eps:
            return candidate
    raise ValueError(f"comparisons index up to {largest}, beyond the 2**53 inputs a float64 target can index")


class PairwiseLogitLikelihood(AugmentedLikelihood):
    r"""Pairwise comparisons of a latent utility :math:`f` (Bradley--Terry / logit preference model):
    comparison :math:`j` of the inputs :math:`(a_j, b_j)` has outcome :math:`y_j = 1` if :math:`a_j` was preferred,

    .. math::
        p(y_j = 1 \mid f) = \sigma(g_j), \qquad g_j = f_{a_j} - f_{b_j},

    a Bernoulli-logit likelihood of the *linear observation* :math:`g = Df` (:class:`~gpytorch_augment.core.
    LinearObservations`: row :math:`j` of :math:`D` holds :math:`+1` at :math:`a_j` and :math:`-1` at :math:`b_j`).
    With one Pólya-Gamma variable per comparison, as for :class:`~gpytorch_augment.BernoulliLogitLikelihood`,

    .. math::
        p(y_j, \omega_j \mid f) = \tfrac12\exp\!\big(\tfrac{s_j}2 g_j - \tfrac12\omega_j g_j^2\big)\,
        \mathrm{PG}(\omega_j\mid 1, 0), \qquad s_j = 2y_j - 1,

    so the posterior of :math:`f` given :math:`\omega` is Gaussian with precision :math:`K^{-1} + D^\top\Omega D`
    (no longer diagonal plus :math:`K^{-1}`: each comparison couples two points). Gibbs:
    :math:`\omega_j \mid f \sim \mathrm{PG}(1, |g_j|)`; CAVI: :math:`q(\omega_j) = \mathrm{PG}(1, c_j)`,
    :math:`c_j^2 = E_q g_j^2 = (m_{a_j} - m_{b_j})^2 + s_{a_j} + s_{b_j} - 2\,\mathrm{Cov}_q(f_{a_j}, f_{b_j})`.

    **Comparisons.** The compared pairs travel as the keyword ``comparisons=`` (an ``(n, 2)`` tensor of indices
    of the inputs ``x``; BoTorch's ``PairwiseGP`` convention, winner first, goes with ``y = 1``) through every public
    entry point: ``CAVI.fit(x, y, comparisons=C)``, ``GibbsSampler(prior, likelihood, x, y, comparisons=C)``,
    ``likelihood(model(x), comparisons=C)`` (the predictive :math:`p(y_j = 1) = E_q\sigma(g_j)` from the *joint*
    :math:`q(f)`), ``expected_log_prob(y, q_f, comparisons=C)``. :meth:`check_targets` returns the canonical target
    ``torch.stack([y, a, b], dim=-2)`` (shape ``(3, n)``); the protocol members take it and the observation
    functionals :math:`g` (or their marginals), i.e. they are the Bernoulli members at :math:`g`.

    The auxiliary variables are ``{"omega": ω}``; their variational parameters ``{"c": c}``.

    Example::

        >>> import torch
        >>> from gpytorch_augment import CAVI, PairwiseLogitLikelihood
        >>> from gpytorch_augment.testing import make_cavi_model
        >>> x = torch.linspace(-2, 2, 5, dtype=torch.float64).unsqueeze(-1)     # utility rises with x
        >>> comparisons = torch.tensor([[1, 0], [2, 1], [3, 2], [4, 3], [4, 0], [3, 1]])
        >>> y = torch.ones(6, dtype=torch.float64)                             # the first of each pair won
        >>> model, likelihood = make_cavi_model(1, x).double(), PairwiseLogitLikelihood()
        >>> trace = CAVI(model, likelihood, num_data=6).fit(x, y, comparisons=comparisons, max_iter=50)
        >>> utility = model(x).mean
        >>> bool((utility[1:] > utility[:-1]).all())
        True
        >>> p = likelihood(model(x), comparisons=torch.tensor([[4, 0]])).probs   # p(x_4 preferred to x_0)
        >>> bool(p > 0.5)
        True
    """

    linear_observations = True
    target_keywords = ("comparisons",)
    preferred_sampler = "gibbs"

    def __init__(self) -> None:
        super().__init__()
        self.pointwise = BernoulliLogitLikelihood()

    # ------------------------------------------------------------------ targets and the design
    @staticmethod
    def split_targets(target: Tensor) -> tuple[Tensor, Tensor]:
        """The labels ``(..., n)`` and the compared pairs ``(n, 2)`` (long) of a canonical target."""
        return target[..., 0, :], target.reshape(-1, *target.shape[-2:])[0, 1:].mT.long()

    def check_targets(self, y: Tensor, comparisons: Tensor | None = None, **kwargs: Any) -> Tensor:
        """Labels in {0, 1} (or {-1, 1}), one per comparison; ``comparisons`` an ``(n, 2)`` tensor of integer
        indices (the rules of :func:`~gpytorch_augment.core.design.comparison_indices`: no bool, no fractions).

        :returns: the canonical target ``torch.stack([y, a, b], dim=-2)``, shape ``(3, n)``, in the labels' floating
            dtype, or in float32/float64 where that dtype cannot hold every index exactly.
        """
        pairs = comparison_indices(_required_comparisons(comparisons))
        y = self.pointwise.check_targets(y)
        if y.dim() != 1 or y.shape[-1] != pairs.shape[0]:
            raise ValueError(
                f"labels y must have shape (n,) with one label per comparison; got y of shape {tuple(y.shape)} and "
                f"comparisons of shape {tuple(pairs.shape)}"
            )
        dtype = _index_dtype(y.dtype if y.is_floating_point() else torch.get_default_dtype(), pairs)
        return torch.cat([y.to(dtype).unsqueeze(0), pairs.mT.to(device=y.device, dtype=dtype)], 0)

    def observation_design(self, y: Tensor, num_points: int) -> LinearObservations:
        r""":math:`g_j = f_{a_j} - f_{b_j}`; ``ValueError`` if a pair indexes beyond the ``num_points`` inputs."""
        return LinearObservations.comparisons(self.split_targets(y)[1], num_points, dtype=y.dtype)

    # ------------------------------------------------------------------ drop-in (item-level f and q(f))
    def _design(self, comparisons: Tensor | None, num_points: int, dtype: torch.dtype) -> LinearObservations:
        return LinearObservations.comparisons(_required_comparisons(comparisons), num_points, dtype=dtype)

    def forward(
        self, function_samples: Tensor, *args: Any, comparisons: Tensor | None = None, **kwargs: Any
    ) -> Bernoulli:
        r""":math:`p(y_j = 1 \mid f) = \sigma(f_{a_j} - f_{b_j})` (``comparisons=`` required)."""
        design = self._design(comparisons, function_samples.shape[-1], function_samples.dtype)
        return Bernoulli(logits=design.apply(function_samples))

    def observation_marginals(
        self, function_dist: MultivariateNormal, comparisons: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        r"""Means and variances of :math:`g_j = f_{a_j} - f_{b_j}` under the joint :math:`q(f)`:
        :math:`m_a - m_b` and :math:`s_a + s_b - 2\,\mathrm{Cov}(f_a, f_b)`."""
        mean = function_dist.mean
        design = self._design(comparisons, mean.shape[-1], mean.dtype)
        covariance = function_dist.lazy_covariance_matrix.to_dense()
        return design.apply(mean), design.quadratic_diagonal(covariance).clamp_min(0.0)

    def marginal(
        self, function_dist: MultivariateNormal, *args: Any, comparisons: Tensor | None = None, **kwargs: Any
    ) -> Bernoulli:
        r""":math:`p(y_j = 1) = E_{q(f)}\sigma(f_{a_j} - f_{b_j})` by Gauss--Hermite quadrature of the marginal of
        :math:`g_j` (its variance includes the covariance of the two points)."""
        mean, var = self.observation_marginals(function_dist, comparisons)
        nodes, weights = gauss_hermite(mean, var, NUM_QUADRATURE_LOCS)
        return Bernoulli(probs=(weights * torch.sigmoid(nodes)).sum(0).clamp(0.0, 1.0))

    def _nodes(self, y: Tensor, function_dist: MultivariateNormal) -> tuple[Tensor, Tensor]:
        comparisons = self.split_targets(y)[1]
        mean, var = self.observation_marginals(function_dist, comparisons)
        nodes, weights = gauss_hermite(mean, var, NUM_QUADRATURE_LOCS)
        return self.log_prob_at(y, nodes), weights

    def expected_log_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        r""":math:`E_{q(f)}\log\sigma(s_j g_j)` per comparison (quadrature of the marginal of :math:`g_j`), for
        the canonical target (labels and pairs)."""
        log_p, weights = self._nodes(y, function_dist)
        return (weights * log_p).sum(0)

    def log_marginal_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        r""":math:`\log E_{q(f)}\sigma(s_j g_j)` per comparison, for the canonical target."""
        log_p, weights = self._nodes(y, function_dist)
        return torch.logsumexp(weights.log() + log_p, dim=0)

    # ------------------------------------------------------------------ protocol members (at g = Df)
    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        return self.pointwise.log_prob_at(self.split_targets(y)[0], f)

    def log_prob_and_grad(self, y: Tensor, f: Tensor, **kwargs: Any) -> tuple[Tensor, Tensor]:
        return self.pointwise.log_prob_and_grad(self.split_targets(y)[0], f)

    def log_prob_grad(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        return self.pointwise.log_prob_grad(self.split_targets(y)[0], f)

    def aux_prior(self, y: Tensor) -> AuxiliaryDistribution:
        return self.pointwise.aux_prior(self.split_targets(y)[0])

    def aux_conditional(self, y: Tensor, f: Tensor) -> AuxiliaryDistribution:
        return self.pointwise.aux_conditional(self.split_targets(y)[0], f)

    def sample_aux(self, y: Tensor, f: Tensor, generator: torch.Generator | None = None) -> AuxDict:
        return self.pointwise.sample_aux(self.split_targets(y)[0], f, generator=generator)

    def potential_and_precision(self, y: Tensor, aux: AuxDict, f: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.pointwise.potential_and_precision(self.split_targets(y)[0], aux, f)

    def log_tilt_constant(self, y: Tensor, aux: AuxDict) -> Tensor:
        return self.pointwise.log_tilt_constant(self.split_targets(y)[0], aux)

    def aux_posterior(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> AuxDict:
        return self.pointwise.aux_posterior(self.split_targets(y)[0], f_mean, f_var)

    def expected_potential_and_precision(
        self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor
    ) -> tuple[Tensor, Tensor]:
        return self.pointwise.expected_potential_and_precision(self.split_targets(y)[0], q_aux, f_mean, f_var)

    def expected_log_tilt_constant(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        return self.pointwise.expected_log_tilt_constant(self.split_targets(y)[0], q_aux)

    def aux_kl(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        return self.pointwise.aux_kl(self.split_targets(y)[0], q_aux)

    def collapsed_bound(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> Tensor:
        return self.pointwise.collapsed_bound(self.split_targets(y)[0], f_mean, f_var)
