"""The small GPyTorch model the GP-level identities run CAVI on."""

from __future__ import annotations

import gpytorch
import torch

from gpytorch_augment.variational import CAVIVariationalStrategy


class SVGP(gpytorch.models.ApproximateGP):
    """A small sparse GP with a CAVI strategy: constant mean, scaled RBF kernel (lengthscale 0.7, outputscale 1.5).

    :param inducing_points: ``(M, D)`` inducing inputs.
    :param distribution_cls: the variational distribution of :math:`q(u)` (any GPyTorch one the strategy supports).
    :param strategy_cls: a CAVI strategy class.
    :param mean_constant: the value of the constant prior mean.
    :param learn_inducing_locations: passed to the strategy.
    :param batch_shape: ``torch.Size([T])`` for ``T`` independent latent GPs.

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing.models import SVGP
        >>> model = SVGP(torch.linspace(-1, 1, 4).unsqueeze(-1))
        >>> model(torch.zeros(3, 1)).mean.shape, round(model.covar_module.outputscale.item(), 4)
        (torch.Size([3]), 1.5)
    """

    def __init__(
        self,
        inducing_points: torch.Tensor,
        distribution_cls: type = gpytorch.variational.CholeskyVariationalDistribution,
        strategy_cls: type = CAVIVariationalStrategy,
        mean_constant: float = 0.0,
        learn_inducing_locations: bool = False,
        batch_shape: torch.Size = torch.Size(),
    ) -> None:
        q_u = distribution_cls(inducing_points.size(-2), batch_shape=batch_shape)
        strategy = strategy_cls(self, inducing_points, q_u, learn_inducing_locations=learn_inducing_locations)
        super().__init__(strategy)
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch_shape)
        self.mean_module.constant.data.fill_(mean_constant)
        self.covar_module = gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.RBFKernel(batch_shape=batch_shape), batch_shape=batch_shape
        )
        self.covar_module.base_kernel.lengthscale = 0.7
        self.covar_module.outputscale = 1.5

    def forward(self, x: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def make_cavi_model(num_latents: int, Z: torch.Tensor, mean_constant: float = 0.5, **kwargs) -> SVGP:
    """An :class:`SVGP` with a CAVI strategy at inducing inputs ``Z`` (``Z = x`` gives the full GP).

    ``T = num_latents > 1`` latents share the inputs through a batched strategy inside GPyTorch's
    ``IndependentMultitaskVariationalStrategy`` (outputs ``(N, T)``). ``kwargs`` go to :class:`SVGP`.

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing import make_cavi_model
        >>> model = make_cavi_model(2, torch.linspace(-1, 1, 4).unsqueeze(-1))   # T = 2 latent GPs
        >>> model(torch.zeros(3, 1)).mean.shape                                   # (N, T)
        torch.Size([3, 2])
    """
    if num_latents == 1:
        return SVGP(Z, mean_constant=mean_constant, **kwargs)
    model = SVGP(Z, mean_constant=mean_constant, batch_shape=torch.Size([num_latents]), **kwargs)
    model.variational_strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(
        model.variational_strategy, num_tasks=num_latents
    )
    return model
