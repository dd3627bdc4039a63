"""Quantiles, intervals and cdf of the count likelihoods' predictive (a Gauss--Hermite mixture of count laws)."""

from __future__ import annotations

import math

import pytest
import torch
from gpytorch.distributions import MultivariateNormal

import gpytorch_augment as ga
from tests.fuzz_runner import _alarm

N = 4000


def _cases():
    return [
        ("poisson", lambda: ga.PoissonLogitLikelihood(rate_scale=20.0), lambda n: {}),
        ("negbin", lambda: ga.NegativeBinomialLogitLikelihood(total_count=3.0), lambda n: {}),
        ("binomial", ga.BinomialLogitLikelihood, lambda n: {"trials": torch.full((n,), 12.0)}),
    ]


@pytest.mark.slow  # coverage by simulation
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


def _small_q_f() -> MultivariateNormal:
    return MultivariateNormal(torch.tensor([-1.0, 0.0, 2.0]), torch.diag(torch.tensor([0.3, 1.0, 0.1])))


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_cdf_at_huge_and_infinite_values_is_one_in_bounded_time(case):
    """The CDF's cost does not grow with the value (it hung at 1e12 and raised OverflowError at inf)."""
    _, make, kwargs = case
    likelihood, kw = make(), kwargs(3)
    ones = torch.ones(3, dtype=torch.float64)
    with _alarm(5):
        for value in (1e12, math.inf, torch.tensor([1e12, math.inf, 5e15])):
            assert torch.equal(likelihood.predictive_cdf(_small_q_f(), value, **kw), ones)
        assert torch.equal(likelihood.predictive_cdf(_small_q_f(), -math.inf, **kw), 0 * ones)


@pytest.mark.parametrize(
    "likelihood, mean",
    [
        (ga.NegativeBinomialLogitLikelihood(total_count=3.0), 50.0),  # counts ~ 1e22
        (ga.PoissonLogitLikelihood(rate_scale=1e9), 0.0),  # counts ~ 5e8
    ],
    ids=["negbin-f-50", "poisson-rate-1e9"],
)
def test_quantiles_of_huge_counts_return_and_invert_the_cdf(likelihood, mean):
    q_f = MultivariateNormal(torch.full((3,), mean), torch.eye(3))
    with _alarm(5):
        quantile = likelihood.predictive_quantile(q_f, 0.5)
        cdf, below = likelihood.predictive_cdf(q_f, quantile), likelihood.predictive_cdf(q_f, quantile - 1)
    assert bool(torch.isfinite(quantile).all()) and bool((quantile > 1e8).all())
    if mean == 0.0:  # below 2**53 every integer is exact: the quantile is the smallest k with cdf(k) >= q
        assert bool((cdf >= 0.5 * (1 - 1e-12)).all()) and bool((below < 0.5 * (1 - 1e-12)).all())
    else:
        torch.testing.assert_close(cdf, torch.full((3,), 0.5, dtype=torch.float64), rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_a_column_of_q_or_values_broadcasts_against_the_data(case):
    _, make, kwargs = case
    likelihood, kw = make(), kwargs(3)
    q = torch.tensor([[0.1], [0.5], [0.9]], dtype=torch.float64)
    quantiles = likelihood.predictive_quantile(_small_q_f(), q, **kw)
    assert quantiles.shape == (3, 3)
    for row, level in zip(quantiles, q[:, 0]):
        assert torch.equal(row, likelihood.predictive_quantile(_small_q_f(), float(level), **kw))
    values = torch.tensor([[0.0], [4.0]])
    cdf = likelihood.predictive_cdf(_small_q_f(), values, **kw)
    assert torch.equal(cdf[1], likelihood.predictive_cdf(_small_q_f(), 4.0, **kw))


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_wrong_length_q_value_or_trials_names_the_argument(case):
    _, make, kwargs = case
    likelihood, kw = make(), kwargs(3)
    with pytest.raises(ValueError, match="^q has shape \\(2,\\)"):
        likelihood.predictive_quantile(_small_q_f(), torch.tensor([0.1, 0.9]), **kw)
    with pytest.raises(ValueError, match="^value has shape \\(2,\\)"):
        likelihood.predictive_cdf(_small_q_f(), torch.tensor([1.0, 2.0]), **kw)
    if kw:
        with pytest.raises(ValueError, match="^trials has shape \\(2,\\)"):
            likelihood.predictive_cdf(_small_q_f(), 1.0, trials=torch.full((2,), 12.0))
        with pytest.raises(ValueError, match="^trials has shape \\(2, 3\\)"):
            likelihood.predictive_quantile(_small_q_f(), 0.5, trials=torch.full((2, 3), 12.0))
