r"""Quantiles and central intervals of a likelihood's one-dimensional predictive :math:`p(y_*\mid\text{data})`,
shared by the likelihoods that offer ``predictive_cdf``: continuous predictives by bisection of the CDF, count
predictives from the components' closed-form CDFs (:mod:`._count_predictive`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor

#: bisection steps of :meth:`ContinuousPredictive.predictive_quantile` (the bracket shrinks by 2^-100)
_BISECTION_STEPS = 100
#: the bisection stops once every bracket is this narrow relative to its ends and the predictive's width
_RELATIVE_TOL = 1e-11
#: doublings of the bracket at most before the bisection
_BRACKET_DOUBLINGS = 200


def check_probability(q: Tensor | float) -> Tensor:
    """``q`` as a float64 tensor; ``ValueError`` unless every value lies in (0, 1)."""
    q = torch.as_tensor(q, dtype=torch.float64)
    if not bool(((q > 0) & (q < 1)).all()):
        raise ValueError(f"q must lie in (0, 1); got {q}")
    return q


def central_tails(level: float) -> tuple[float, float]:
    r"""The probabilities :math:`(1 \mp \text{level})/2` of a central interval; ``ValueError`` unless
    ``0 < level < 1``."""
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    tail = (1 - float(level)) / 2
    return tail, 1 - tail


class PredictiveInterval:
    r"""``predictive_interval`` from a ``predictive_quantile``."""

    predictive_quantile: Any

    def predictive_interval(
        self, function_dist: MultivariateNormal, level: float = 0.95, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        r"""The central ``level`` interval of the predictive :math:`p(y_*\mid\text{data})`: the
        :meth:`predictive_quantile` at :math:`(1 \mp \text{level})/2`, each of shape ``(..., N)``.

        :raises ValueError: unless ``0 < level < 1``.
        """
        lower, upper = central_tails(level)
        return (
            self.predictive_quantile(function_dist, lower, **kwargs),
            self.predictive_quantile(function_dist, upper, **kwargs),
        )


class ContinuousPredictive(PredictiveInterval):
    r"""``predictive_quantile`` (and ``predictive_interval``) of a likelihood with a continuous one-dimensional
    predictive, by bisection of its ``predictive_cdf(function_dist, value, **kwargs)`` (float64, shape ``(..., N)``)
    from the bracket :meth:`_quantile_bracket` gives (widened until it holds every quantile)."""

    predictive_cdf: Any

    def _quantile_bracket(self, function_dist: MultivariateNormal, **kwargs: Any) -> tuple[Tensor, Tensor]:
        """A centre and a positive width of the predictive (float64, shape ``(..., N)``): the bisection starts from
        centre ± width."""
        raise NotImplementedError

    def _cdf_function(self, function_dist: MultivariateNormal, **kwargs: Any) -> Callable[[Tensor], Tensor]:
        """``value -> predictive_cdf(function_dist, value)``; likelihoods override it to build the predictive once."""
        return lambda value: self.predictive_cdf(function_dist, value, **kwargs)

    @torch.no_grad()
    def predictive_quantile(self, function_dist: MultivariateNormal, q: Tensor | float, **kwargs: Any) -> Tensor:
        r"""Quantiles of the predictive :math:`p(y_*\mid\text{data})` of :meth:`marginal` at probability ``q``
        (broadcast against the data), by bisection of :meth:`predictive_cdf` to ~1e-10 relative; same dtype as
        :math:`q(f)`. (The predictive is a quadrature mixture or a convolution without ``icdf``; hence this member.)

        :raises ValueError: unless ``0 < q < 1``.
        """
        q = check_probability(q)
        center, width = self._quantile_bracket(function_dist, **kwargs)
        q = q.to(center.device).expand(torch.broadcast_shapes(q.shape, center.shape))

        cdf = self._cdf_function(function_dist, **kwargs)

        lo, hi = center - width, center + width
        for _ in range(_BRACKET_DOUBLINGS):  # widen until the bracket holds every quantile
            below, above = cdf(lo) > q, cdf(hi) < q
            if not bool((below | above).any()):
                break
            lo = torch.where(below, 2 * lo - center, lo)
            hi = torch.where(above, 2 * hi - center, hi)
        for _ in range(_BISECTION_STEPS):
            if not bool(((hi - lo) > _RELATIVE_TOL * (lo.abs() + hi.abs() + width)).any()):
                break
            mid = (lo + hi) / 2
            low_side = cdf(mid) < q
            lo, hi = torch.where(low_side, mid, lo), torch.where(low_side, hi, mid)
        return ((lo + hi) / 2).to(function_dist.mean.dtype)
