"""The closed-form q(u) update against Titsias' collapsed optimum, for every storage and distribution."""

from __future__ import annotations

import math

import gpytorch
import pytest
import torch

from gpytorch_augment import CAVI, CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy
from tests.models import SVGP, make_gaussian_tilt_likelihood

DISTRIBUTIONS = [
    gpytorch.variational.CholeskyVariationalDistribution,
    gpytorch.variational.NaturalVariationalDistribution,
    gpytorch.variational.TrilNaturalVariationalDistribution,
]
STRATEGIES = [CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy]
NOISE = 0.3


def _data(n: int = 60, m: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    y = torch.sin(2 * x.squeeze(-1)) + 0.5 + 0.3 * torch.randn(n, generator=g)
    z = torch.linspace(-3, 3, m).unsqueeze(-1)
    return x, y, z


def titsias_bound(model: SVGP, x, y, z, jitter: float, data_jitter: bool) -> float:
    """log N(y | mu_X, Q_XX + noise I) - tr(K_XX - Q_XX) / (2 noise), computed densely."""
    with torch.no_grad():
        mu = model.mean_module(x)
        kzz = model.covar_module(z).to_dense() + jitter * torch.eye(len(z))
        kzx = model.covar_module(z, x).to_dense()
        kxx = model.covar_module(x, diag=True) + (jitter if data_jitter else 0.0)
        q = kzx.mT @ torch.linalg.solve(kzz, kzx)
        mvn = torch.distributions.MultivariateNormal(mu, q + NOISE * torch.eye(len(x)))
        return float(mvn.log_prob(y) - (kxx - q.diagonal()).sum() / (2 * NOISE))


@pytest.mark.parametrize("distribution_cls", DISTRIBUTIONS)
@pytest.mark.parametrize("strategy_cls", STRATEGIES)
def test_one_update_reaches_titsias_optimum(strategy_cls, distribution_cls):
    x, y, z = _data()
    model = SVGP(z, distribution_cls, strategy_cls, mean_constant=0.7)
    likelihood = make_gaussian_tilt_likelihood(NOISE)
    cavi = CAVI(model, likelihood, num_data=len(y))
    cavi.step(x, y)
    elbo = float(cavi.elbo(x, y)) * len(y)
    strategy = model.variational_strategy
    bound = titsias_bound(model, x, y, z, strategy.jitter_val, strategy._data_jitter)
    assert elbo == pytest.approx(bound, abs=1e-8 * abs(bound))
    # a second update changes nothing
    cavi.step(x, y)
    assert float(cavi.elbo(x, y)) * len(y) == pytest.approx(bound, abs=1e-8 * abs(bound))


@pytest.mark.parametrize("distribution_cls", DISTRIBUTIONS)
@pytest.mark.parametrize("strategy_cls", STRATEGIES)
def test_gpytorch_sees_the_update(strategy_cls, distribution_cls):
    """After cavi_update, GPyTorch's own forward/KL/VariationalELBO agree with our numbers."""
    x, y, z = _data()
    model = SVGP(z, distribution_cls, strategy_cls, mean_constant=0.7)
    likelihood = make_gaussian_tilt_likelihood(NOISE)
    cavi = CAVI(model, likelihood, num_data=len(y))
    cavi.step(x, y)
    ours = float(cavi.elbo(x, y))
    gl = gpytorch.likelihoods.GaussianLikelihood()
    gl.noise = NOISE
    model.train()
    with torch.no_grad():
        theirs = float(gpytorch.mlls.VariationalELBO(gl, model, num_data=len(y))(model(x), y))
    assert ours == pytest.approx(theirs, abs=1e-7)
    # eval-mode prediction is refreshed (no stale cache)
    model.eval()
    with torch.no_grad():
        pred = model(x)
        terms = model.variational_strategy.cavi_terms(x)
        mean, var = model.variational_strategy.marginals(terms, model.variational_strategy.whitened_q(terms))
    assert torch.allclose(pred.mean, mean, atol=1e-8)
    if strategy_cls is CAVIVariationalStrategy:
        assert torch.allclose(pred.variance, var, atol=1e-8)


@pytest.mark.parametrize("distribution_cls", DISTRIBUTIONS)
@pytest.mark.parametrize("strategy_cls", STRATEGIES)
def test_damped_steps_converge_to_the_same_optimum(strategy_cls, distribution_cls):
    x, y, z = _data()
    model = SVGP(z, distribution_cls, strategy_cls, mean_constant=-0.4)
    likelihood = make_gaussian_tilt_likelihood(NOISE)
    cavi = CAVI(model, likelihood, num_data=len(y), step_size=0.5)
    values = [float(cavi.step(x, y)) for _ in range(40)]
    assert all(b >= a - 1e-10 for a, b in zip(values, values[1:]))
    strategy = model.variational_strategy
    bound = titsias_bound(model, x, y, z, strategy.jitter_val, strategy._data_jitter)
    assert float(cavi.elbo(x, y)) * len(y) == pytest.approx(bound, abs=1e-6 * abs(bound))


def test_minibatch_natural_gradient_matches_full_batch_at_fixed_point():
    """At the full-batch optimum, a scaled mini-batch target averages back to it (unbiasedness)."""
    x, y, z = _data(n=40)
    model = SVGP(z, mean_constant=0.2)
    likelihood = make_gaussian_tilt_likelihood(NOISE)
    cavi = CAVI(model, likelihood, num_data=len(y))
    cavi.step(x, y)
    strategy = model.variational_strategy
    full = strategy.whitened_q(strategy.cavi_terms(x))
    # averaging the natural parameters of the targets from two halves gives the full-batch target
    thetas, precs = [], []
    for idx in (torch.arange(0, 20), torch.arange(20, 40)):
        h, lam = likelihood.potential_and_precision(y[idx], {})
        q = strategy.cavi_update(x[idx], 2 * h, 2 * lam, step=1.0)
        thetas.append(q.theta1)
        precs.append(q.C.mT @ q.C)
    assert torch.allclose((thetas[0] + thetas[1]) / 2, full.theta1, atol=1e-9)
    assert torch.allclose((precs[0] + precs[1]) / 2, full.C.mT @ full.C, atol=1e-9)


@pytest.mark.parametrize("distribution_cls", DISTRIBUTIONS)
def test_float32_update_is_finite_and_close(distribution_cls):
    x, y, z = _data()
    model = SVGP(z, distribution_cls, mean_constant=0.7).float()
    likelihood = make_gaussian_tilt_likelihood(NOISE)
    cavi = CAVI(model, likelihood, num_data=len(y))
    cavi.step(x.float(), y.float())
    value = float(cavi.elbo(x.float(), y.float())) * len(y)
    strategy = model.variational_strategy
    bound = titsias_bound(model.double(), x, y, z, strategy.jitter_val, strategy._data_jitter)
    assert math.isfinite(value)
    assert value == pytest.approx(bound, rel=1e-3)  # float32 kernel evaluation dominates the error


def test_rejects_mean_field_distribution():
    x, y, z = _data()
    model = SVGP(z, gpytorch.variational.MeanFieldVariationalDistribution)
    with pytest.raises(TypeError, match="cannot take CAVI updates"):
        CAVI(model, make_gaussian_tilt_likelihood(NOISE), num_data=len(y))


def test_batched_strategy_equals_independent_updates():
    """A [T]-batched strategy updated with (T, N) statistics equals T single-output updates."""
    x, y, z = _data()
    T = 3
    ys = torch.stack([y, -y, 2 * y])
    batched = SVGP(z, batch_shape=torch.Size([T]), mean_constant=0.3)
    lik = make_gaussian_tilt_likelihood(NOISE)
    h, lam = lik.potential_and_precision(ys, {})
    qb = batched.variational_strategy.cavi_update(x, h, lam)
    for t in range(T):
        single = SVGP(z, mean_constant=0.3)
        qs = single.variational_strategy.cavi_update(x, h[t], lam[t])
        assert torch.allclose(qb.mean[t], qs.mean, atol=1e-10)
        assert torch.allclose(qb.C[t], qs.C, atol=1e-10)
