"""Quantiles, intervals and cdf of the Student-t and Laplace likelihoods' predictive (a Gaussian latent convolved with
the noise), with the signature and meaning of the heteroscedastic and count likelihoods' members."""

from __future__ import annotations

import math

import pytest
import torch
from gpytorch.distributions import MultivariateNormal
from scipy import integrate

import gpytorch_augment as ga

N = 1500


def _cases():
    return [
        ("student_t df=3", lambda: ga.StudentTLikelihood(df=3.0, scale=0.5)),
        ("student_t df=1", lambda: ga.StudentTLikelihood(df=1.0, scale=0.2)),
        ("laplace", lambda: ga.LaplaceLikelihood(scale=0.7)),
        ("laplace narrow", lambda: ga.LaplaceLikelihood(scale=0.05)),
    ]


@pytest.mark.slow  # coverage by simulation
@pytest.mark.parametrize(
    "case, level",
    [pytest.param(c, 0.9, id=f"{c[0]}-0.9") for c in _cases()]
    + [pytest.param(c, 0.5, id=f"{c[0]}-0.5") for c in _cases()[::2]],
)
def test_predictive_interval_covers_simulated_data(case, level):
    """Draw f from a known q(f), y from the likelihood: the ``level`` interval holds about ``level`` of the y."""
    _, make = case
    likelihood = make().double()
    g = torch.Generator().manual_seed(0)
    mean = torch.linspace(-1.5, 1.5, N, dtype=torch.float64)
    var = torch.linspace(0.01, 1.0, N, dtype=torch.float64)
    q_f = MultivariateNormal(mean, torch.diag(var))
    f = mean + var.sqrt() * torch.randn(N, generator=g, dtype=torch.float64)
    torch.manual_seed(1)
    y = likelihood(f).sample()
    lo, hi = likelihood.predictive_interval(q_f, level)
    inside = ((y >= lo) & (y <= hi)).double().mean().item()
    sd = math.sqrt(level * (1 - level) / N)
    assert abs(inside - level) < 4 * sd, (inside, level)
    assert lo.shape == hi.shape == (N,) and bool((lo < hi).all())


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_predictive_cdf_matches_the_integrated_density_and_inverts(case):
    _, make = case
    likelihood = make().double()
    q_f = MultivariateNormal(
        torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float64), torch.diag(torch.tensor([0.3, 1e-6, 2.0]).double())
    )
    predictive = likelihood.marginal(q_f)
    for value in (-3.0, 0.0, 2.5):
        cdf = likelihood.predictive_cdf(q_f, value)
        for i in range(3):
            density = lambda t: math.exp(predictive.log_prob(torch.tensor(t).double())[i].item())  # noqa: E731
            loc = q_f.mean[i].item()
            pieces = (-math.inf, loc, value) if value > loc else (-math.inf, value)
            brute = sum(integrate.quad(density, a, b, limit=400)[0] for a, b in zip(pieces[:-1], pieces[1:]))
            assert cdf[i].item() == pytest.approx(brute, abs=1e-6), (value, i)
    q = torch.tensor([[0.01], [0.3], [0.5], [0.99]], dtype=torch.float64)
    quantiles = likelihood.predictive_quantile(q_f, q)
    assert quantiles.shape == (4, 3)
    torch.testing.assert_close(likelihood.predictive_cdf(q_f, quantiles), q.expand(4, 3), rtol=0, atol=1e-9)
    torch.testing.assert_close(quantiles[2], q_f.mean)  # a symmetric predictive: the median is the mean
    with pytest.raises(ValueError, match="q must lie"):
        likelihood.predictive_quantile(q_f, 1.5)
    with pytest.raises(ValueError, match="level must be"):
        likelihood.predictive_interval(q_f, 1.0)
