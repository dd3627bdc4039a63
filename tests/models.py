"""Small GPyTorch models shared by the tests (``SVGP`` ships with the protocol suite in
:mod:`gpytorch_augment.testing.models`)."""

from __future__ import annotations

import torch

from gpytorch_augment.testing.models import SVGP

__all__ = ["SVGP", "make_gaussian_tilt_likelihood"]


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
