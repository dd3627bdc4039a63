"""The predictive distributions of the likelihoods (``gpytorch_augment.distributions``):
normalisation and moments against direct integration."""

from __future__ import annotations

import itertools
import math

import torch

from gpytorch_augment.distributions import (
    NegativeMultinomial,
    NoiseVariance,
    NormalLaplace,
    StudentTPredictive,
)


def _integral(log_density, lo: float, hi: float, n: int = 200_001) -> tuple[float, float, float]:
    y = torch.linspace(lo, hi, n)
    p = log_density(y).exp()
    return tuple(float(torch.trapezoid(p * y**k, y)) for k in range(3))


def test_student_t_predictive_normalised_with_its_moments() -> None:
    dist = StudentTPredictive(torch.tensor(5.0), torch.tensor(0.4), torch.tensor(0.3), torch.tensor(0.7))
    mass, first, second = _integral(dist.log_prob, -200.0, 200.0, n=40_001)
    assert abs(mass - 1) < 1e-6 and abs(first - 0.4) < 1e-5
    assert abs(second - first**2 - float(dist.variance)) < 2e-3  # heavy tails beyond the grid


def test_normal_laplace_normalised_with_its_moments() -> None:
    dist = NormalLaplace(torch.tensor(-0.2), torch.tensor(0.5), torch.tensor(0.8))
    mass, first, second = _integral(dist.log_prob, -60.0, 60.0)
    assert abs(mass - 1) < 1e-8 and abs(first + 0.2) < 1e-8
    assert abs(second - first**2 - float(dist.variance)) < 1e-6


def test_negative_multinomial_sums_to_one_and_has_its_mean() -> None:
    log_probs = torch.tensor([0.1, 0.25]).log()
    dist = NegativeMultinomial(log_probs, torch.tensor(0.65).log())
    counts = torch.tensor(list(itertools.product(range(80), repeat=2)), dtype=torch.float64)
    p = dist.log_prob(counts).exp()
    assert abs(float(p.sum()) - 1) < 1e-12
    torch.testing.assert_close((p.unsqueeze(-1) * counts).sum(0), dist.mean, rtol=1e-10, atol=0)
    assert math.isfinite(float(NegativeMultinomial(log_probs).log_prob(counts[5])))


def test_noise_variance_is_a_named_tuple() -> None:
    value = NoiseVariance(*(torch.ones(2) * k for k in range(4)))
    assert value.upper.tolist() == [3.0, 3.0] and value._fields == ("mean", "median", "lower", "upper")
