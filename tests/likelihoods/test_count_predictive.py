"""Quantiles, intervals and cdf of the count likelihoods' predictive (a Gauss--Hermite mixture of count laws)."""

from __future__ import annotations

import pytest
import torch
from gpytorch.distributions import MultivariateNormal

import gpytorch_augment as ga

N = 4000


def _cases():
    return [
        ("poisson", lambda: ga.PoissonLogitLikelihood(rate_scale=20.0), lambda n: {}),
        ("negbin", lambda: ga.NegativeBinomialLogitLikelihood(total_count=3.0), lambda n: {}),
        ("binomial", ga.BinomialLogitLikelihood, lambda n: {"trials": torch.full((n,), 12.0)}),
    ]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_predictive_interval_covers_simulated_data(case):
    """Draw f from a known q(f), y from the likelihood: the 90 % interval holds about 90 % of the y."""
    _, make, kwargs = case
    likelihood, kw = make(), kwargs(N)
    g = torch.Generator().manual_seed(0)
    mean = torch.linspace(-1.5, 1.5, N)
    var = torch.full((N,), 0.5)
    q_f = MultivariateNormal(mean, torch.diag(var))
    f = mean + var.sqrt() * torch.randn(N, generator=g)
    torch.manual_seed(1)
    y = likelihood(f, **kw).sample()
    lo, hi = likelihood.predictive_interval(q_f, 0.9, **kw)
    inside = ((y >= lo) & (y <= hi)).double().mean().item()
    # a discrete interval holds at least 90 % of the mass (often more); 3 binomial sd of the rate is 0.014
    assert 0.88 <= inside <= 0.97
    assert torch.equal(lo, lo.round()) and bool((lo <= hi).all())


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_predictive_cdf_is_monotone_and_matches_brute_force(case):
    _, make, kwargs = case
    likelihood, kw = make(), kwargs(3)
    q_f = MultivariateNormal(torch.tensor([-1.0, 0.0, 2.0]), torch.diag(torch.tensor([0.3, 1.0, 0.1])))
    mixture = likelihood(q_f, **kw)
    grid = torch.arange(0.0, 13.0).unsqueeze(-1).expand(13, 3)
    cdf = torch.stack([likelihood.predictive_cdf(q_f, k, **kw) for k in grid])
    assert bool((cdf.diff(dim=0) >= -1e-15).all())
    brute = mixture.log_prob(grid).exp().cumsum(0)
    assert torch.allclose(cdf, brute.double(), atol=1e-12)
    assert torch.allclose(mixture.cdf(grid[5]).double(), cdf[5], atol=1e-12)
    q = likelihood.predictive_quantile(q_f, 0.5, **kw)  # the smallest k with cdf(k) >= 0.5
    below = likelihood.predictive_cdf(q_f, q - 1, **kw)
    # the quantile and the CDF accumulate the same probabilities in different orders: in q_f's float32 a sum of at
    # most 20 terms <= 1 differs by up to 20 * 2**-24 ~ 1.2e-6, so a CDF within that of 0.5 (negbin's middle point
    # has cdf(2) = 0.5 - 4.7e-8) may fall on either side
    eps = 20 * torch.finfo(q_f.mean.dtype).eps
    assert bool((likelihood.predictive_cdf(q_f, q, **kw) >= 0.5 - eps).all()) and bool((below < 0.5 + eps).all())
    with pytest.raises(NotImplementedError, match="predictive_quantile"):
        mixture.icdf(torch.tensor(0.5))
    with pytest.raises(ValueError, match="q must lie"):
        likelihood.predictive_quantile(q_f, 1.5, **kw)
