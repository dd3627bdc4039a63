r"""Whether a fitted model is a constant predictor.

A fit *collapses* when its posterior mean of every latent function is (nearly) the same at every training input: the
outputscale has shrunk towards zero, or the lengthscales are so short that no input informs another. Maximum
likelihood in :math:`D \gtrsim 10` dimensions reaches such points from GPyTorch's initial lengthscales, where the
gradients vanish and an optimizer certifies them as stationary. A collapse is told by the spread of the latent
posterior means over the training inputs,

.. math::
    \mathrm{spread}_t = \mathrm{sd}_i\big(E_q[f_t(x_i)]\big) \le \tau \quad\text{for every latent } t,

with :math:`\tau` = :data:`SPREAD_TOL` in the latent's own units (a logit, a log-rate, standardised targets): a
spread of 0.01 moves a probability by at most 0.0025.

Example::

    >>> import torch, gpytorch_augment as ga, gpytorch_augment.testing as gt
    >>> from gpytorch_augment.inference.collapse import is_constant
    >>> x = torch.linspace(-3, 3, 30, dtype=torch.float64).unsqueeze(-1)
    >>> model = gt.SVGP(x[::5].clone()).double()
    >>> is_constant(model, x)                   # q(u) at its initial N(0, I): the mean is 0 everywhere
    True
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["SPREAD_TOL", "is_constant", "latent_spread"]

#: the largest spread of the latent posterior means that counts as a constant predictor
SPREAD_TOL = 1e-2


@torch.no_grad()
def latent_spread(model: torch.nn.Module, x: Tensor, num_latents: int = 1) -> Tensor:
    """The standard deviation over the training inputs of the posterior mean of each latent function, ``(T,)``
    (the model's current :math:`q(u)`, in its current mode)."""
    mean = model(x).mean
    if num_latents > 1 or mean.dim() > x.dim() - 1:  # (..., N, T): latents last
        mean = mean.movedim(-1, 0)
    mean = mean.reshape(max(num_latents, 1), -1) if num_latents > 1 else mean.reshape(1, -1)
    return mean.std(dim=-1) if mean.shape[-1] > 1 else torch.zeros(mean.shape[0], dtype=mean.dtype, device=mean.device)


def is_constant(model: torch.nn.Module, x: Tensor, num_latents: int = 1, tol: float = SPREAD_TOL) -> bool:
    """Whether every latent posterior mean spreads by at most ``tol`` over ``x`` (module docstring)."""
    return bool((latent_spread(model, x, num_latents) <= tol).all())
