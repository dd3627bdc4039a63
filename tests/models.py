"""Small GPyTorch models shared by the tests."""

from __future__ import annotations

import gpytorch
import torch

from gpytorch_augment import CAVIVariationalStrategy


class SVGP(gpytorch.models.ApproximateGP):
    """A small sparse GP with a CAVI strategy (constant mean, scaled RBF kernel)."""

    def __init__(
        self,
        inducing_points: torch.Tensor,
        distribution_cls=gpytorch.variational.CholeskyVariationalDistribution,
        strategy_cls=CAVIVariationalStrategy,
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


def make_gaussian_tilt_likelihood(noise: float):
    """An AugmentedLikelihood whose tilt is exactly the Gaussian likelihood N(y | f, noise)."""
    import math

    from torch.distributions import Normal

    from gpytorch_augment.distributions.auxiliary import AuxiliaryDistribution
    from gpytorch_augment.likelihoods import AugmentedLikelihood

    class _Gaussian(AugmentedLikelihood):
        def forward(self, f, *args, **kwargs):
            return Normal(f, math.sqrt(noise))

        def marginal(self, function_dist, *args, **kwargs):
            return Normal(function_dist.mean, (function_dist.variance + noise).sqrt())

        def aux_prior(self, y):
            return AuxiliaryDistribution(dummy=Normal(torch.zeros_like(y), 1.0))

        aux_conditional = lambda self, y, f: self.aux_prior(y)  # noqa: E731

        def potential_and_precision(self, y, aux, f=None):
            return y / noise, torch.full_like(y, 1 / noise)

        def log_tilt_constant(self, y, aux):
            return -0.5 * math.log(2 * math.pi * noise) - y**2 / (2 * noise)

        def aux_posterior(self, y, f_mean, f_var):
            return {}

        def expected_potential_and_precision(self, y, q_aux, f_mean, f_var):
            return self.potential_and_precision(y, q_aux)

        def expected_log_tilt_constant(self, y, q_aux):
            return self.log_tilt_constant(y, q_aux)

        def aux_kl(self, y, q_aux):
            return torch.zeros_like(y)

    return _Gaussian()
