r"""Quantiles and intervals of the count likelihoods' predictive :math:`p(y_*) = \sum_k w_k\,p(y_* \mid f_k)` (a
Gauss--Hermite mixture over :math:`q(f_*)`), from the components' closed-form CDFs: the work does not grow with
the count."""

from __future__ import annotations

from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor

from .._numerics import discrete_mixture_cdf, discrete_mixture_quantile
from ._predictive import PredictiveInterval, check_probability


class CountPredictive(PredictiveInterval):
    r"""``predictive_cdf``, ``predictive_quantile`` and ``predictive_interval`` of a likelihood whose
    :meth:`marginal` is a mixture of count distributions (Poisson, negative binomial, binomial), with the signature
    and meaning of the continuous likelihoods' members (:class:`~._predictive.ContinuousPredictive`). Per-datum
    keyword data (``trials=``) pass on to ``marginal``. The quantiles are integers: the smallest :math:`k` with
    :math:`P(y_* \le k) \ge q`."""

    marginal: Any

    @torch.no_grad()
    def predictive_cdf(self, function_dist: MultivariateNormal, value: Tensor | float, **kwargs: Any) -> Tensor:
        r""":math:`P(y_* \le \text{value})` under the predictive of :meth:`marginal` (float64, shape ``(..., N)``;
        ``value`` broadcasts against the data, a column ``(K, 1)`` giving ``(K, N)``; ``inf`` gives 1).

        :raises ValueError: if ``value`` or ``trials`` does not broadcast against the data.
        """
        return discrete_mixture_cdf(self.marginal(function_dist, **kwargs), value)

    @torch.no_grad()
    def predictive_quantile(self, function_dist: MultivariateNormal, q: Tensor | float, **kwargs: Any) -> Tensor:
        r"""The ``q``-quantile of the predictive of :meth:`marginal` (broadcast against the data): the smallest
        integer :math:`k` with :math:`P(y_* \le k) \ge q`; same dtype as :math:`q(f)`.

        :raises ValueError: unless ``0 < q < 1``, or if ``q`` does not broadcast against the data.
        """
        q = check_probability(q)
        return discrete_mixture_quantile(self.marginal(function_dist, **kwargs), q).to(function_dist.mean.dtype)
