"""Tests of the inverse Gaussian distribution, the finite-log_prob inverse Gamma and the KL between them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats
from torch.distributions import kl_divergence

from gpytorch_augment.distributions.auxiliary import AuxiliaryDistribution
from gpytorch_augment.distributions.inverse_gaussian import InverseGamma, InverseGaussian

_LOG_TINY, _LOG_HUGE = math.log(torch.finfo(torch.float64).tiny), math.log(torch.finfo(torch.float64).max)
PARAMS = [(0.5, 2.0), (3.0, 0.1), (1.0, 50.0), (1e6, 1.0), (1e-6, 1.0)]


def _scipy(mu: float, kappa: float):
    return stats.invgauss(mu / kappa, scale=kappa) if math.isfinite(mu) else stats.levy(scale=kappa)


def _log_x_moment(dist, power: int) -> float:
    r""":math:`\int x^k p(x)\,dx` by adaptive quadrature in :math:`t = \log x`, split at the mode."""
    mode = math.log(float(dist.mode))

    def integrand(t: float) -> float:
        if not _LOG_TINY < t < _LOG_HUGE:
            return 0.0
        return math.exp(float(dist.log_prob(torch.tensor(math.exp(t)))) + (power + 1) * t)

    halves = ((-np.inf, mode), (mode, np.inf))
    return sum(integrate.quad(integrand, a, b, epsabs=0, epsrel=1e-12, limit=400)[0] for a, b in halves)


@pytest.mark.parametrize("mu, kappa", PARAMS)
def test_log_prob_normalised_with_the_stated_moments(mu, kappa):
    dist = InverseGaussian(torch.tensor(mu), torch.tensor(kappa))
    assert _log_x_moment(dist, 0) == pytest.approx(1.0, abs=1e-9)
    assert _log_x_moment(dist, 1) == pytest.approx(mu, rel=1e-8)
    second = _log_x_moment(dist, 2)
    assert second - mu**2 == pytest.approx(float(dist.variance), rel=1e-6)
    x = torch.tensor([0.1, 1.0, 3.0]) * mu
    np.testing.assert_allclose(dist.log_prob(x).numpy(), _scipy(mu, kappa).logpdf(x.numpy()), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dist.cdf(x).numpy(), _scipy(mu, kappa).cdf(x.numpy()), rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("mu, kappa", [(0.5, 2.0), (3.0, 0.5), (1e-6, 1.0), (0.2, 1e4)])
def test_sample_moments_within_five_standard_errors(mu, kappa, dtype):
    dist = InverseGaussian(torch.tensor(mu, dtype=dtype), torch.tensor(kappa, dtype=dtype))
    draws = dist.sample((100_000,), generator=torch.Generator().manual_seed(0))
    assert draws.dtype == dtype and (draws > 0).all()
    x = draws.double()
    n = x.numel()
    assert abs(float(x.mean()) - mu) <= 5 * math.sqrt(mu**3 / kappa / n)
    centred2 = (x - x.mean()) ** 2
    assert abs(float(centred2.mean()) - mu**3 / kappa) <= 5 * float(centred2.std()) / math.sqrt(n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("mu, kappa", [(1e12, 0.3), (1e-12, 1e-10), (1e-9, 2.0), (math.inf, 0.7), (2.0, 1e-8)])
def test_sampler_is_stable_for_extreme_means(mu, kappa, dtype):
    """Kolmogorov--Smirnov against the exact cdf (Lévy for mu = inf); no cancellation, no overflow."""
    dist = InverseGaussian(torch.tensor(mu, dtype=dtype), torch.tensor(kappa, dtype=dtype))
    draws = dist.sample((20_000,), generator=torch.Generator().manual_seed(1))
    assert torch.isfinite(draws).all() and (draws > 0).all()
    assert torch.isfinite(dist.log_prob(draws)).all()
    ref = _scipy(float(dist.loc), float(dist.concentration))  # the parameters as rounded to dtype
    assert stats.kstest(draws.double().numpy(), ref.cdf).pvalue > 1e-3


def test_broadcasting_generator_and_aux_distribution():
    dist = InverseGaussian(torch.tensor([[0.5], [2.0], [math.inf]]), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert dist.batch_shape == (3, 4)
    draws = dist.sample((2,), generator=torch.Generator().manual_seed(5))
    assert draws.shape == (2, 3, 4)
    assert dist.log_prob(draws).shape == (2, 3, 4) and dist.log_prob(torch.tensor(1.0)).shape == (3, 4)
    torch.testing.assert_close(draws, dist.sample((2,), generator=torch.Generator().manual_seed(5)))
    assert dist.expand((5, 3, 4)).sample().shape == (5, 3, 4)
    joint = AuxiliaryDistribution(omega=dist)
    a, b = (joint.sample(generator=torch.Generator().manual_seed(2))["omega"] for _ in range(2))
    torch.testing.assert_close(a, b)
    assert not torch.equal(a, joint.sample(generator=torch.Generator().manual_seed(3))["omega"])


def test_mode_and_validation():
    dist = InverseGaussian(torch.tensor(1.5), torch.tensor(0.4))
    mode = dist.mode
    for x in (mode * 0.99, mode * 1.01):
        assert dist.log_prob(x) < dist.log_prob(mode)
    with pytest.raises(ValueError):
        InverseGaussian(torch.tensor(-1.0), torch.tensor(1.0), validate_args=True)
    with pytest.raises(ValueError):
        InverseGaussian(torch.tensor(1.0), torch.tensor(1.0), validate_args=True).log_prob(torch.tensor(-2.0))


def test_inverse_gamma_log_prob_is_finite_for_tiny_values():
    """torch's transformed-Gamma log_prob overflows to +inf below x ~ 1e-154; ours is the closed form."""
    dist = InverseGamma(torch.tensor(0.5), torch.tensor(0.3))
    x = torch.tensor([1e-300, 1e-200, 1e-3, 1.0, 1e200])
    np.testing.assert_allclose(dist.log_prob(x).numpy(), stats.invgamma(0.5, scale=0.3).logpdf(x.numpy()), rtol=1e-12)
    assert torch.isinf(torch.distributions.InverseGamma(0.5, 0.3).log_prob(torch.tensor(1e-200)))  # the torch issue
    assert isinstance(dist.expand((3,)), InverseGamma)
    f32 = InverseGamma(torch.tensor(0.5, dtype=torch.float32), torch.tensor(0.3, dtype=torch.float32))
    assert torch.isfinite(f32.log_prob(torch.tensor(1e-30, dtype=torch.float32)))


@pytest.mark.parametrize("mu, kappa, b", [(0.7, 2.0, 1.0), (3.0, 0.4, 0.2), (0.05, 8.0, 4.0), (math.inf, 1.0, 0.5)])
def test_kl_to_inverse_gamma_half_matches_quadrature(mu, kappa, b):
    p, q = InverseGaussian(torch.tensor(mu), torch.tensor(kappa)), InverseGamma(torch.tensor(0.5), torch.tensor(b))
    mode = math.log(float(p.mode))

    def integrand(t: float) -> float:
        if not _LOG_TINY < t < _LOG_HUGE:
            return 0.0
        x = torch.tensor(math.exp(t))
        log_p = float(p.log_prob(x))
        weight = math.exp(log_p + t)
        return weight * (log_p - float(q.log_prob(x))) if weight > 0 else 0.0

    halves = ((-np.inf, mode), (mode, np.inf))
    reference = sum(integrate.quad(integrand, a, c, epsabs=1e-13, epsrel=1e-11, limit=400)[0] for a, c in halves)
    assert float(kl_divergence(p, q)) == pytest.approx(reference, rel=1e-8, abs=1e-10)
    if kappa == 2 * b:  # the Laplace auxiliary KL of docs/maths/robust.md
        assert float(kl_divergence(p, q)) == pytest.approx(b / mu, rel=1e-12)


def test_kl_other_concentrations_not_implemented():
    with pytest.raises(NotImplementedError):
        kl_divergence(InverseGaussian(1.0, 1.0), InverseGamma(torch.tensor(2.0), torch.tensor(1.0)))
