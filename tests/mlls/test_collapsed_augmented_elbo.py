"""CollapsedAugmentedELBO: value = augmented ELBO at the optimal q(u), gradients, SGPR, chunks, monotone, BoTorch."""

from __future__ import annotations

import math

import gpytorch
import pytest
import torch

from gpytorch_augment import CAVIVariationalStrategy, CollapsedAugmentedELBO, UnwhitenedCAVIVariationalStrategy
from gpytorch_augment.likelihoods.augmented_likelihood import validated_latent_blocks
from gpytorch_augment.testing import gp_data, make_cavi_model
from tests.likelihoods.registry import CASES
from tests.models import make_gaussian_tilt_likelihood

STRATEGIES = [CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy]
COLLAPSIBLE = [c for c in CASES if validated_latent_blocks(c.make()) is None]
BLOCKED = [c for c in CASES if validated_latent_blocks(c.make()) is not None]


def _setup(case, strategy_cls=CAVIVariationalStrategy, n: int = 40, m: int = 8, chunk_size=None, seed: int = 1):
    torch.manual_seed(seed)
    data = gp_data(case, n=n, seed=seed)
    Z = torch.linspace(-3, 3, m, dtype=torch.float64).unsqueeze(-1)
    model = make_cavi_model(data.likelihood.num_latents, Z, strategy_cls=strategy_cls).double()
    mll = CollapsedAugmentedELBO(data.likelihood, model, n, data.x, data.y, chunk_size=chunk_size, **data.kwargs)
    mll.update_aux()  # q(Omega) from the initial q(u) ...
    mll.update_aux()  # ... and once more from q*(u), so that q(Omega) is not the prior-driven one
    return mll, model, data


def _augmented_elbo_at_optimum(mll, model, data) -> float:
    """Write the optimal q(u) through the strategy's own CAVI update and evaluate the augmented ELBO (fixed q(Omega))
    through GPyTorch's forward pass and KL, independently of the MLL's algebra."""
    lik, strategy = data.likelihood, mll.strategy
    with torch.no_grad():
        terms = strategy.cavi_terms(data.x, cache=False)
        zeros = torch.zeros_like(terms.mu_X)
        zeros = zeros.mT if lik.num_latents > 1 else zeros
        h, lam = lik.expected_potential_and_precision(mll.y, mll.q_aux[0], zeros, zeros)
        strategy.cavi_update(data.x, h, lam, terms=terms)
        model.train()
        out = model(data.x)
        mean, var = out.mean, out.variance
        ell = lik.elbo_terms(mll.y, mll.q_aux[0], mean, var).sum()
        kl = model.variational_strategy.kl_divergence().sum()
    return float(ell - kl) / data.y.shape[-1]


@pytest.mark.parametrize("strategy_cls", STRATEGIES)
@pytest.mark.parametrize("case", COLLAPSIBLE, ids=lambda c: c.name)
def test_value_is_the_augmented_elbo_at_the_optimal_q(case, strategy_cls):
    mll, model, data = _setup(case, strategy_cls)
    with torch.no_grad():
        value = float(mll())
    assert math.isfinite(value)
    assert value == pytest.approx(_augmented_elbo_at_optimum(mll, model, data), abs=1e-8)


@pytest.mark.parametrize("case", BLOCKED, ids=lambda c: c.name)
def test_block_updated_likelihoods_are_refused(case):
    Z = torch.linspace(-3, 3, 5, dtype=torch.float64).unsqueeze(-1)
    likelihood = case.make()
    model = make_cavi_model(likelihood.num_latents, Z).double()
    with pytest.raises(ValueError, match="latent_blocks"):
        CollapsedAugmentedELBO(likelihood, model, 10)


def _reoptimised(mll, model, data, param, index, delta) -> float:
    with torch.no_grad():
        param.view(-1)[index] += delta
    try:
        return _augmented_elbo_at_optimum(mll, model, data)
    finally:
        with torch.no_grad():
            param.view(-1)[index] -= delta


@pytest.mark.parametrize("strategy_cls", STRATEGIES)
@pytest.mark.parametrize("case", COLLAPSIBLE, ids=lambda c: c.name)
def test_gradient_matches_finite_differences_of_the_reoptimised_elbo(case, strategy_cls):
    mll, model, data = _setup(case, strategy_cls, n=25, m=5)
    params = mll._hyperparameters()
    value = mll()
    grads = torch.autograd.grad(value, params, allow_unused=True)
    eps = 1e-5
    checked = 0
    for p, g in zip(params, grads):
        for k in range(p.numel()):
            fd = (_reoptimised(mll, model, data, p, k, eps) - _reoptimised(mll, model, data, p, k, -eps)) / (2 * eps)
            ours = 0.0 if g is None else float(g.reshape(-1)[k])
            assert ours == pytest.approx(fd, rel=1e-5, abs=1e-7), (case.name, p.shape, k)
            checked += abs(fd) > 1e-6
    assert checked >= 3  # kernel, mean and at least one more direction carry a gradient


def test_gaussian_pseudo_likelihood_recovers_the_sgpr_bound():
    g = torch.Generator().manual_seed(3)
    x = torch.rand(30, 1, generator=g, dtype=torch.float64) * 6 - 3
    y = torch.sin(2 * x.squeeze(-1)) + 0.3 * torch.randn(30, generator=g, dtype=torch.float64)
    Z = torch.linspace(-3, 3, 6, dtype=torch.float64).unsqueeze(-1)
    likelihood = make_gaussian_tilt_likelihood(0.2)  # h = y / s2, lam = 1 / s2, no auxiliary variables
    model = make_cavi_model(1, Z, strategy_cls=UnwhitenedCAVIVariationalStrategy).double()
    mll = CollapsedAugmentedELBO(likelihood, model, 30, x, y)
    value = mll()
    # Titsias (2009): log N(y | mu, Q + s2 I) - tr(K - Q) / (2 s2), Q = K_XZ (K_ZZ + jitter I)^{-1} K_ZX
    jitter = model.variational_strategy.jitter_val
    K = model.covar_module(torch.cat([Z, x])).to_dense()
    K_ZZ, K_ZX, K_XX = K[:6, :6] + jitter * torch.eye(6, dtype=torch.float64), K[:6, 6:], K[6:, 6:]
    Q = K_ZX.mT @ torch.linalg.solve(K_ZZ, K_ZX)
    mu = model.mean_module(x)
    s2 = 0.2
    normal = torch.distributions.MultivariateNormal(mu, Q + s2 * torch.eye(30, dtype=torch.float64))
    sgpr = (normal.log_prob(y) - (K_XX - Q).diagonal().sum() / (2 * s2)) / 30
    assert float(value.detach()) == pytest.approx(float(sgpr.detach()), abs=1e-10)
    params = [model.covar_module.raw_outputscale, model.covar_module.base_kernel.raw_lengthscale]
    ours = torch.autograd.grad(value, params)
    theirs = torch.autograd.grad(sgpr, params)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("case", COLLAPSIBLE, ids=lambda c: c.name)
def test_chunked_equals_unchunked(case):
    strategy_cls = STRATEGIES[hash(case.name) % 2]  # both strategies over the cases, deterministically per run
    results = []
    for chunk_size in (None, 7):
        mll, model, data = _setup(case, strategy_cls, chunk_size=chunk_size)
        assert len(mll._chunks()) == (1 if chunk_size is None else 6)
        value = mll()
        params = mll._hyperparameters()
        grads = torch.autograd.grad(value, params, allow_unused=True)
        results.append((float(value), [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]))
    (v1, g1), (v2, g2) = results
    assert v1 == pytest.approx(v2, abs=1e-12)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("case", COLLAPSIBLE, ids=lambda c: c.name)
def test_alternating_aux_updates_and_lbfgs_never_decrease_the_bound(case):
    mll, model, data = _setup(case, chunk_size=15)
    params = mll._hyperparameters()
    values = []
    for _ in range(3):
        with torch.no_grad():
            values.append(float(mll()))
        optimizer = torch.optim.LBFGS(params, max_iter=5, line_search_fn="strong_wolfe")

        def closure():
            optimizer.zero_grad()
            loss = -mll()
            loss.backward()
            return loss

        optimizer.step(closure)
        with torch.no_grad():
            values.append(float(mll()))
        mll.update_aux()
    with torch.no_grad():
        values.append(float(mll()))
    diffs = torch.tensor(values).diff()
    assert (diffs >= -1e-10 * abs(values[0])).all(), values
    assert values[-1] > values[0] + 1e-4  # it moved


def test_bad_input():
    case = COLLAPSIBLE[0]
    mll, model, data = _setup(case)
    with pytest.raises(TypeError, match="training inputs"):
        mll(model(data.x), data.y)
    with pytest.raises(ValueError, match="num_data"):
        mll.set_train_data(data.x[:10], data.y[:10])
    empty = CollapsedAugmentedELBO(data.likelihood, model, 40)
    with pytest.raises(ValueError, match="no training data"):
        empty()
    with pytest.raises(ValueError, match="both"):
        CollapsedAugmentedELBO(data.likelihood, model, 40, train_inputs=data.x)
    with pytest.raises(TypeError, match="AugmentedLikelihood"):
        CollapsedAugmentedELBO(gpytorch.likelihoods.BernoulliLikelihood(), model, 40)


def test_botorch_fit_gpytorch_mll_raises_the_bound():
    botorch = pytest.importorskip("botorch")
    mll, model, data = _setup(COLLAPSIBLE[0])
    with torch.no_grad():
        before = float(mll())
    botorch.fit_gpytorch_mll(mll)
    with torch.no_grad():
        after = float(mll())
    assert after > before + 1e-3
    q_before = [p.detach().clone() for p in model.variational_parameters()]
    mll.update_aux()  # writes q*(u) for the fitted hyper-parameters
    assert any(not torch.equal(a, b) for a, b in zip(q_before, model.variational_parameters()))
