r"""Models that hold a GP prior for the engines.

Give :class:`~gpytorch_augment.GibbsSampler`, :class:`~gpytorch_augment.HMCSampler` or
:func:`~gpytorch_augment.posterior_sampler` an exact GP prior as a :class:`GPPrior`, not as a GPyTorch ``ExactGP``:
``ExactGP`` accepts only Gaussian likelihoods, and its ``model(x)`` is a Gaussian-regression posterior, unrelated to a
sampler's draws. The page "Coming from GPyTorch" of the user guide translates an ``ExactGP`` into a :class:`GPPrior`.
"""

from __future__ import annotations

from typing import Any

import gpytorch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor

__all__ = ["GPPrior"]


class GPPrior(gpytorch.Module):
    r"""The GP prior :math:`f \sim \mathcal{GP}(\mu, k)` as a model: a mean and a kernel module, nothing else.

    :meth:`forward` returns the prior :math:`\mathcal N(\mu(x), k(x, x))` (the one member the Gibbs sampler calls).
    Calling the model, ``model(x)``, returns the same prior in training mode; in eval mode it raises
    ``RuntimeError``, because an evaluated model is usually asked for a posterior, and this one holds none:
    posterior predictions come from :meth:`PosteriorSamples.predict <gpytorch_augment.PosteriorSamples.predict>`.

    :param mean_module: a ``gpytorch.means.Mean`` (batched, ``batch_shape=[T]``, for ``T`` independent latents).
    :param covar_module: a ``gpytorch.kernels.Kernel`` (same batch shape).

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler, GPPrior
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
        >>> x = torch.linspace(-2, 2, 6, dtype=torch.float64).unsqueeze(-1)
        >>> y = torch.tensor([0.0, 0, 1, 0, 1, 1], dtype=torch.float64)
        >>> samples = GibbsSampler(prior, BernoulliLogitLikelihood(), x, y).sample(5, warmup=5, seed=0, progress=False)
        >>> samples.predict(torch.zeros(2, 1, dtype=torch.float64)).y_probs.shape
        torch.Size([2])
        >>> prior.forward(x).mean.shape
        torch.Size([6])
    """

    def __init__(self, mean_module: gpytorch.means.Mean, covar_module: gpytorch.kernels.Kernel) -> None:
        super().__init__()
        if not isinstance(mean_module, gpytorch.means.Mean):
            raise TypeError(f"mean_module must be a gpytorch.means.Mean, got {type(mean_module).__name__}")
        if not isinstance(covar_module, gpytorch.kernels.Kernel):
            raise TypeError(f"covar_module must be a gpytorch.kernels.Kernel, got {type(covar_module).__name__}")
        self.mean_module = mean_module
        self.covar_module = covar_module

    def forward(self, x: Tensor) -> MultivariateNormal:
        """The prior at ``x`` (``(N, D)``): :math:`\\mathcal N(\\mu(x), k(x, x))`."""
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))

    def __call__(self, x: Tensor, *args: Any, **kwargs: Any) -> MultivariateNormal:
        if not self.training:
            raise RuntimeError(
                "GPPrior holds the prior only: model(x) in eval mode has no posterior to return. Predict with the "
                "Gibbs draws, samples.predict(x_new), or call model.forward(x) (or train mode) for the prior."
            )
        return super().__call__(x, *args, **kwargs)
