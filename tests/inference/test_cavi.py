"""The CAVI driver: convergence, invariance to how q(u) is stored, hyper-parameter learning, step sizes,
and numerical robustness (huge latent means, float32)."""

from __future__ import annotations

import copy
import math

import gpytorch
import pytest
import torch

from gpytorch_augment import CAVI, BernoulliLogitLikelihood, CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy
from tests.models import SVGP

DISTRIBUTIONS = [
    gpytorch.variational.CholeskyVariationalDistribution,
    gpytorch.variational.NaturalVariationalDistribution,
    gpytorch.variational.TrilNaturalVariationalDistribution,
]
STRATEGIES = [CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy]


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: intra-op threads only add contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _problem(n: int = 40, m: int = 10, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    y = torch.bernoulli(torch.sigmoid(0.5 + 2 * torch.sin(2 * x.squeeze(-1))), generator=g)
    z = torch.linspace(-3, 3, m).unsqueeze(-1)
    return x.to(dtype), y.to(dtype), z.to(dtype)


def _natural(model, x):
    """The whitened q(v) of the model as (θ1, S_v^{-1})."""
    strategy = model.variational_strategy
    q = strategy.whitened_q(strategy.cavi_terms(x))
    return q.theta1, q.C.mT @ q.C


def test_fit_converges_monotonically(device):
    x, y, z = (t.to(device) for t in _problem())
    model = SVGP(z, mean_constant=0.4).to(device)
    seen = []
    trace = CAVI(model, BernoulliLogitLikelihood().to(device), num_data=len(y)).fit(
        x, y, max_iter=200, tol=1e-10, callback=lambda t, v: seen.append((t, v))
    )
    elbo = torch.tensor(trace.elbo)
    assert trace.converged and 2 < trace.num_steps < 200
    assert bool((elbo[1:] >= elbo[:-1] - 1e-9 * elbo[:-1].abs()).all())
    assert elbo[-1] > elbo[0] + 0.05
    assert seen == list(enumerate(trace.elbo))
    assert len(trace.time) == trace.num_steps and all(b >= a for a, b in zip(trace.time, trace.time[1:]))


def test_fit_reports_no_convergence_when_stopped_early():
    x, y, z = _problem()
    trace = CAVI(SVGP(z), BernoulliLogitLikelihood(), num_data=len(y)).fit(x, y, max_iter=3, tol=1e-12)
    assert not trace.converged and trace.num_steps == 3


def _optimum(strategy_cls, distribution_cls):
    x, y, z = _problem()
    model = SVGP(z, distribution_cls, strategy_cls, mean_constant=0.4)
    cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=len(y))
    trace = cavi.fit(x, y, max_iter=300, tol=1e-12)
    assert trace.converged
    x_test = torch.linspace(-3.5, 3.5, 15).unsqueeze(-1)
    model.eval()
    with torch.no_grad():
        pred = model(x_test)
    return float(cavi.elbo(x, y)), pred.mean, pred.variance


REFERENCE: dict = {}


@pytest.mark.parametrize("distribution_cls", DISTRIBUTIONS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("strategy_cls", STRATEGIES, ids=lambda c: c.__name__)
def test_storage_does_not_change_the_optimum(strategy_cls, distribution_cls):
    """Cholesky/Natural/TrilNatural reach the same q(u); whitened and unwhitened storage agree up to the
    ``jitter_val`` (1e-6) that GPyTorch's whitened strategy adds to the data variances."""
    for key in (strategy_cls, CAVIVariationalStrategy):
        if key not in REFERENCE:
            REFERENCE[key] = _optimum(key, gpytorch.variational.CholeskyVariationalDistribution)
    elbo, mean, var = _optimum(strategy_cls, distribution_cls)
    elbo_ref, mean_ref, var_ref = REFERENCE[strategy_cls]
    assert elbo == pytest.approx(elbo_ref, abs=1e-9)
    torch.testing.assert_close(mean, mean_ref, rtol=0, atol=1e-7)
    torch.testing.assert_close(var, var_ref, rtol=0, atol=1e-7)
    elbo_w, mean_w, var_w = REFERENCE[CAVIVariationalStrategy]
    assert elbo == pytest.approx(elbo_w, abs=1e-6)
    torch.testing.assert_close(mean, mean_w, rtol=0, atol=1e-5)
    torch.testing.assert_close(var, var_w, rtol=0, atol=1e-5)


def test_hyper_optimizer_improves_the_final_elbo():
    x, y, z = _problem()
    fixed = SVGP(z, mean_constant=0.0)
    cavi_fixed = CAVI(fixed, BernoulliLogitLikelihood(), num_data=len(y))
    cavi_fixed.fit(x, y, max_iter=200, tol=1e-10)

    learned = SVGP(z, mean_constant=0.0)
    variational = {id(p) for p in learned.variational_parameters()}
    hyper = list(learned.hyperparameters())
    assert hyper and not any(id(p) in variational for p in hyper)
    before = [p.detach().clone() for p in hyper]
    cavi = CAVI(learned, BernoulliLogitLikelihood(), num_data=len(y))
    trace = cavi.fit(x, y, max_iter=25, tol=0.0, hyper_optimizer=torch.optim.Adam(hyper, lr=0.05))
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, hyper))
    cavi.step(x, y)  # re-optimise q(u) for the final hyper-parameters
    assert float(cavi.elbo(x, y)) > float(cavi_fixed.elbo(x, y)) + 1e-3
    assert all(math.isfinite(v) for v in trace.elbo)


def test_callable_step_size_is_honoured():
    x, y, z = _problem()
    model = SVGP(z, mean_constant=0.4)
    CAVI(model, BernoulliLogitLikelihood(), num_data=len(y)).step(x, y)  # move away from the prior
    full = copy.deepcopy(model)

    calls = []

    def schedule(t: int) -> float:
        calls.append(t)
        return 1.0 / (t + 2)

    cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=len(y), step_size=schedule)
    for t in range(3):
        theta_old, prec_old = _natural(model, x)
        CAVI(full, BernoulliLogitLikelihood(), num_data=len(y)).step(x, y)  # the undamped target from the same state
        theta_hat, prec_hat = _natural(full, x)
        cavi.step(x, y)
        rho = 1.0 / (t + 2)
        theta_new, prec_new = _natural(model, x)
        torch.testing.assert_close(theta_new, (1 - rho) * theta_old + rho * theta_hat, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(prec_new, (1 - rho) * prec_old + rho * prec_hat, rtol=1e-9, atol=1e-10)
        full = copy.deepcopy(model)
    assert calls == [0, 1, 2]


@pytest.mark.parametrize("bad", [0.0, 1.5, lambda t: -0.1])
def test_step_size_outside_unit_interval_is_rejected(bad):
    x, y, z = _problem()
    cavi = CAVI(SVGP(z), BernoulliLogitLikelihood(), num_data=len(y), step_size=bad)
    with pytest.raises(ValueError, match="step size"):
        cavi.step(x, y)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_huge_latent_means_stay_finite(sign, dtype):
    """Prior mean ±1e3 with every label on the other side: log p(y|f) ≈ −1e3 per datum."""
    x, _, z = _problem(dtype=dtype)
    y = torch.full((x.shape[0],), 0.0 if sign > 0 else 1.0, dtype=dtype)
    model = SVGP(z, mean_constant=sign * 1e3).to(dtype)
    cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=len(y))
    values = []
    for _ in range(6):
        values.append(float(cavi.step(x, y)))
        for p in model.variational_parameters():
            assert torch.isfinite(p).all() and p.dtype == dtype
    values.append(float(cavi.elbo(x, y)))
    assert all(math.isfinite(v) for v in values)
    assert -1.1e3 < values[0] < -0.9e3
    rtol = 1e-9 if dtype == torch.float64 else 1e-5
    assert all(b >= a - rtol * abs(a) for a, b in zip(values, values[1:]))


def test_float32_model_keeps_its_dtype(device):
    x, y, z = (t.to(device) for t in _problem(dtype=torch.float32))
    model = SVGP(z, gpytorch.variational.NaturalVariationalDistribution, mean_constant=0.4).float().to(device)
    cavi = CAVI(model, BernoulliLogitLikelihood().to(device), num_data=len(y))
    value = cavi.step(x, y)
    trace = cavi.fit(x, y, max_iter=40, tol=1e-6)
    elbo = cavi.elbo(x, y)
    assert value.dtype == torch.float32 and elbo.dtype == torch.float32 and elbo.device == x.device
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters())
    x, y, z = x.cpu(), y.cpu(), z.cpu()
    assert all(math.isfinite(v) for v in trace.elbo)
    reference = CAVI(SVGP(z.double(), mean_constant=0.4), BernoulliLogitLikelihood(), num_data=len(y))
    reference.fit(x.double(), y.double(), max_iter=100, tol=1e-12)
    assert float(elbo) == pytest.approx(float(reference.elbo(x.double(), y.double())), abs=1e-4)
