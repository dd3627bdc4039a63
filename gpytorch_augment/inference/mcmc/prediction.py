r"""The posterior predictive of a run's draws at new inputs: :class:`PosteriorPrediction` (what
:meth:`PosteriorSamples.predict <gpytorch_augment.inference.mcmc.PosteriorSamples.predict>` returns)."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

__all__ = ["PosteriorPrediction"]


class PosteriorPrediction(NamedTuple):
    r"""Posterior predictive at new inputs, from :meth:`PosteriorSamples.predict`.

    The latent predictive is the mixture :math:`\frac1S\sum_s p(f_* \mid f^{(s)})` of GP conditionals.

    :ivar f_mean: mixture mean of :math:`f_*`, ``(N*,)`` / ``(T, N*)`` (latent-major, as :attr:`PosteriorSamples.f`;
        :meth:`to_multitask` gives GPyTorch's multitask layout ``(N*, T)``).
    :ivar f_var: mixture variance (conditional variance plus the spread of the conditional means).
    :ivar f_draws: one draw of :math:`f_*` per stored draw, ``(chains, draws, N*)`` / ``(chains, draws, T, N*)``.
    :ivar y_mean: predictive mean of :math:`y_*`, the average over draws of ``likelihood.marginal(...).mean``
        (``None`` if the marginal distribution has no mean).
    :ivar y_probs: the average over draws of ``likelihood.marginal(...).probs`` where the distribution has
        ``probs`` (e.g. :math:`p(y_*=1)` for Bernoulli), else ``None``.

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler, GPPrior
        >>> x = torch.linspace(-2, 2, 8, dtype=torch.float64).unsqueeze(-1)
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
        >>> sampler = GibbsSampler(prior, BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double())
        >>> samples = sampler.sample(20, warmup=10, num_chains=2, seed=0, progress=False)
        >>> pred = samples.predict(torch.zeros(3, 1, dtype=torch.float64))
        >>> pred.f_mean.shape, pred.f_draws.shape, pred.y_probs.shape
        (torch.Size([3]), torch.Size([2, 20, 3]), torch.Size([3]))
    """

    f_mean: Tensor
    f_var: Tensor
    f_draws: Tensor
    y_mean: Tensor | None
    y_probs: Tensor | None

    def to_multitask(self) -> PosteriorPrediction:
        r"""The latent fields in GPyTorch's multitask layout: ``f_mean``, ``f_var`` of shape ``(N*, T)`` and
        ``f_draws`` of shape ``(chains, draws, N*, T)`` (as a ``MultitaskMultivariateNormal``'s mean); ``y_mean`` and
        ``y_probs`` are unchanged. The fields of :meth:`PosteriorSamples.predict` itself stay latent-major, ``(T, N*)``,
        the layout of :attr:`PosteriorSamples.f`. A single-latent prediction is returned as it is.

        Example::

            >>> import torch
            >>> from gpytorch_augment.inference.mcmc.samples import PosteriorPrediction
            >>> p = PosteriorPrediction(torch.zeros(2, 5), torch.ones(2, 5), torch.zeros(1, 3, 2, 5), None, None)
            >>> p.to_multitask().f_mean.shape, p.to_multitask().f_draws.shape
            (torch.Size([5, 2]), torch.Size([1, 3, 5, 2]))
        """
        if self.f_draws.dim() < 4:
            return self
        return self._replace(f_mean=self.f_mean.mT, f_var=self.f_var.mT, f_draws=self.f_draws.mT)
