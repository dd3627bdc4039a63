"""Stochastic (mini-batch) CAVI: the mini-batch fixed point, step-size schedules, positive definiteness under
float32, per-step cost independent of N, DataLoader batches, hyper-parameter learning and convergence rules."""

from __future__ import annotations

import copy
import math

import gpytorch
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.data import DataLoader, Dataset, TensorDataset

from gpytorch_augment import (
    CAVI,
    BernoulliLogitLikelihood,
    BinomialLogitLikelihood,
    CAVIVariationalStrategy,
    UnwhitenedCAVIVariationalStrategy,
)
from gpytorch_augment.inference.convergence import HeldOut
from gpytorch_augment.inference.schedules import AdaptiveStep, RobbinsMonro
from tests.models import SVGP

DISTRIBUTIONS = [
    gpytorch.variational.CholeskyVariationalDistribution,
    gpytorch.variational.NaturalVariationalDistribution,
    gpytorch.variational.TrilNaturalVariationalDistribution,
]


def _problem(n: int = 400, m: int = 10, seed: int = 0, dtype=torch.float64):
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


def _full_batch_optimum(x, y, z, **model_kwargs) -> float:
    model = SVGP(z, mean_constant=0.4, **model_kwargs)
    cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=len(y))
    assert cavi.fit(x, y, max_iter=300, tol=1e-13).converged
    return float(cavi.elbo(x, y))


# ------------------------------------------------------------------------------------------------ the fixed point
@pytest.mark.parametrize("schedule", [RobbinsMonro(tau=1.0, kappa=0.75), "adaptive"], ids=["robbins-monro", "adaptive"])
def test_minibatch_cavi_reaches_the_full_batch_optimum(schedule):
    """Mini-batch steps with N/|B| scaling and decreasing steps converge to the full-batch CAVI optimum
    (T = 20 epochs of 10 batches, tuned once and frozen)."""
    x, y, z = _problem()
    optimum = _full_batch_optimum(x, y, z)
    model = SVGP(z, mean_constant=0.4)
    cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=len(y), step_size=schedule)
    trace = cavi.fit(x, y, batch_size=40, num_epochs=20, tol=0.0, generator=torch.Generator().manual_seed(1))
    assert trace.num_steps == 200 and trace.num_epochs == 20 and not trace.converged
    assert trace.epoch[:10] == [0] * 10 and trace.epoch[-1] == 19
    value = float(cavi.elbo(x, y))
    assert value <= optimum + 1e-9
    assert (optimum - value) / abs(optimum) < 1e-3
    # from the prior (ELBO 0 - ...) the first epoch already gets most of the way
    assert trace.elbo[0] < optimum - 0.05


def test_constant_step_one_on_minibatches_does_not_converge():
    """The control: jumping to each batch's target (rho = 1) keeps a batch-sized error."""
    x, y, z = _problem()
    optimum = _full_batch_optimum(x, y, z)
    model = SVGP(z, mean_constant=0.4)
    cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=len(y), step_size=1.0)
    cavi.fit(x, y, batch_size=40, num_epochs=5, tol=0.0, generator=torch.Generator().manual_seed(1))
    assert (optimum - float(cavi.elbo(x, y))) / abs(optimum) > 3e-3


def test_full_batch_behaviour_is_unchanged():
    """Default step size on the full data is exact CAVI (rho = 1); a mini-batch defaults to Robbins-Monro."""
    x, y, z = _problem(n=60)
    a = SVGP(z, mean_constant=0.4)
    b = copy.deepcopy(a)
    cavi = CAVI(a, BernoulliLogitLikelihood(), num_data=len(y))
    cavi.step(x, y)
    assert cavi.last_step_size == 1.0
    reference = CAVI(b, BernoulliLogitLikelihood(), num_data=len(y), step_size=1.0)
    reference.strategy.cavi_update  # noqa: B018 -- the public single-update API still exists
    reference.step(x, y)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    cavi.step(x[:20], y[:20])
    assert cavi.last_step_size == pytest.approx(RobbinsMonro()(1))


def test_step_mixes_natural_parameters_with_the_batch_target():
    """theta_new = (1 - rho) theta + rho * theta_hat, with theta_hat the optimum for N/|B|-scaled statistics."""
    x, y, z = _problem(n=100)
    model = SVGP(z, mean_constant=0.4)
    CAVI(model, BernoulliLogitLikelihood(), num_data=100).step(x, y)
    xb, yb = x[:25], y[:25]
    theta_old, prec_old = _natural(model, xb)
    target = copy.deepcopy(model)
    CAVI(target, BernoulliLogitLikelihood(), num_data=100, step_size=1.0).step(xb, yb)
    theta_hat, prec_hat = _natural(target, xb)
    CAVI(model, BernoulliLogitLikelihood(), num_data=100, step_size=0.3).step(xb, yb)
    theta_new, prec_new = _natural(model, xb)
    torch.testing.assert_close(theta_new, 0.7 * theta_old + 0.3 * theta_hat, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(prec_new, 0.7 * prec_old + 0.3 * prec_hat, rtol=1e-9, atol=1e-10)


# ------------------------------------------------------------------------------------------------ schedules


def test_adaptive_step_inside_cavi_uses_the_natural_gradient():
    x, y, z = _problem(n=200)
    model = SVGP(z, mean_constant=0.4)
    schedule = AdaptiveStep(num_init=5)
    cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=200, step_size=schedule)
    cavi.step(x[:40], y[:40])
    assert schedule.initialized and len(schedule.history) == 1
    for start in (40, 80, 120):
        xb, yb = x[start : start + 40], y[start : start + 40]
        theta_old, prec_old = _natural(model, xb)
        target = copy.deepcopy(model)
        CAVI(target, BernoulliLogitLikelihood(), num_data=200, step_size=1.0).step(xb, yb)
        theta_hat, prec_hat = _natural(target, xb)
        g_bar_before, tau = schedule.g_bar.clone(), schedule.tau
        cavi.step(xb, yb)
        gradient = torch.cat([theta_hat - theta_old, -0.5 * (prec_hat - prec_old).reshape(-1)])
        torch.testing.assert_close(schedule.g_bar, (1 - 1 / tau) * g_bar_before + gradient / tau, rtol=1e-8, atol=1e-8)
        rho = cavi.last_step_size
        assert rho == schedule.history[-1][0] and 0 < rho <= 1
        theta_new, prec_new = _natural(model, xb)
        torch.testing.assert_close(theta_new, (1 - rho) * theta_old + rho * theta_hat, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(prec_new, (1 - rho) * prec_old + rho * prec_hat, rtol=1e-9, atol=1e-9)


# ------------------------------------------------------------------------------------------------ robustness
@pytest.mark.parametrize(
    "strategy_cls", [CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy], ids=["whitened", "unwhitened"]
)
@pytest.mark.parametrize("distribution_cls", DISTRIBUTIONS, ids=lambda c: c.__name__)
def test_float32_covariance_stays_positive_definite(distribution_cls, strategy_cls):
    """300 noisy mini-batch steps (batches of 8 scaled by N/|B| = 250) in float32: the stored S is always
    positive definite (its Cholesky succeeds), nothing becomes NaN, and GPyTorch's own forward works."""
    x, y, z = _problem(n=2000, m=12, seed=3, dtype=torch.float32)
    model = SVGP(z, distribution_cls, strategy_cls, mean_constant=0.4).float()
    cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=2000, step_size=RobbinsMonro(tau=1.0, kappa=0.55))
    g = torch.Generator().manual_seed(0)
    dist = model.variational_strategy._variational_distribution
    for t in range(300):
        idx = torch.randint(2000, (8,), generator=g)
        value = cavi.step(x[idx], y[idx])
        assert math.isfinite(float(value))
        if t % 10 == 0 or t == 299:
            for p in model.variational_parameters():
                assert p.dtype == torch.float32 and torch.isfinite(p).all()
            with torch.no_grad():
                S = dist().covariance_matrix
            assert S.dtype == torch.float32
            _, info = torch.linalg.cholesky_ex(S)
            assert int(info) == 0, f"stored covariance not positive definite at step {t}"
    with torch.no_grad():
        out = model(x[:50])
    assert torch.isfinite(out.mean).all() and (out.variance > 0).all()


def test_variational_distribution_without_full_covariance_is_rejected():
    _, _, z = _problem()
    for cls in (
        gpytorch.variational.MeanFieldVariationalDistribution,
        gpytorch.variational.DeltaVariationalDistribution,
    ):
        with pytest.raises(TypeError, match="cannot take CAVI updates"):
            CAVI(SVGP(z, cls), BernoulliLogitLikelihood(), num_data=10)
    plain = SVGP(z, strategy_cls=gpytorch.variational.VariationalStrategy)
    with pytest.raises(TypeError, match="CAVIVariationalStrategy"):
        CAVI(plain, BernoulliLogitLikelihood(), num_data=10)


# ------------------------------------------------------------------------------------------------ cost in N
class _Allocations(TorchDispatchMode):
    """Counts the bytes of every tensor produced by a (non-view) aten operation while active."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    size = t.numel() * t.element_size()
                    self.total += size
                    self.largest = max(self.largest, size)
        return out


def _allocated_bytes(fn) -> tuple[int, int]:
    """(total, largest) bytes of the tensors created while ``fn()`` runs."""
    with _Allocations() as counter:
        fn()
    return counter.total, counter.largest


def test_step_cost_does_not_grow_with_n():
    """Same batch size, N = 1e3 vs 1e5: the memory a mini-batch fit allocates per step (fit with 6 steps minus fit
    with 3, all in the first epoch) is the same, byte for byte; the only allocations that scale with N are the
    once-per-fit input validation and the once-per-epoch permutation, O(N D), never N x M."""
    batch, m = 50, 20
    per_step, largest = {}, {}
    for n in (1_000, 100_000):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(n, 3, generator=g)
        y = torch.bernoulli(torch.sigmoid(x[:, 0]), generator=g)
        model = SVGP(torch.randn(m, 3, generator=g))
        cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=n, step_size=0.5)
        hyper = torch.optim.Adam(model.hyperparameters(), lr=0.01)
        cavi.fit(x, y, batch_size=batch, max_iter=2, hyper_optimizer=hyper)  # warm-up (optimizer state, caches)
        short = _allocated_bytes(lambda: cavi.fit(x, y, batch_size=batch, max_iter=3, hyper_optimizer=hyper))
        long = _allocated_bytes(lambda: cavi.fit(x, y, batch_size=batch, max_iter=6, hyper_optimizer=hyper))
        per_step[n] = (long[0] - short[0]) / 3
        largest[n] = long[1]
    assert per_step[100_000] == pytest.approx(per_step[1_000], rel=1e-3)
    assert per_step[1_000] < 8 * batch * (batch + m) * 40  # O(|B| (|B| + M)) per step
    assert largest[100_000] < 8 * 100_000 * m / 4  # nothing near N x M


# ------------------------------------------------------------------------------------------------ data loaders
def _manual_steps(model, x, y, batches, step_size, **kwargs):
    cavi = CAVI(model, kwargs.pop("likelihood", BernoulliLogitLikelihood()), num_data=len(y), step_size=step_size)
    for idx in batches:
        cavi.step(x[idx], y[idx], **{k: v[idx] for k, v in kwargs.items()})
    return model


def test_data_loader_path_equals_manual_steps():
    x, y, z = _problem(n=90)
    a = SVGP(z, mean_constant=0.4)
    b = copy.deepcopy(a)
    loader = DataLoader(TensorDataset(x, y), batch_size=20, shuffle=False)
    trace = CAVI(a, BernoulliLogitLikelihood(), num_data=90, step_size=RobbinsMonro()).fit(
        data_loader=loader, num_epochs=2, tol=0.0
    )
    assert trace.num_steps == 10 and trace.epoch == [0] * 5 + [1] * 5
    assert trace.step_size == pytest.approx([RobbinsMonro()(t) for t in range(10)])
    order = [torch.arange(s, min(s + 20, 90)) for s in range(0, 90, 20)] * 2
    _manual_steps(b, x, y, order, RobbinsMonro())
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


class _DictDataset(Dataset):
    def __init__(self, x, y, trials):
        self.x, self.y, self.trials = x, y, trials

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i], "trials": self.trials[i]}


def _binomial_problem(n=60):
    g = torch.Generator().manual_seed(4)
    x, _, z = _problem(n=n)
    trials = torch.randint(1, 6, (n,), generator=g).double()
    y = torch.binomial(trials, torch.sigmoid(x.squeeze(-1)), generator=g)
    return x, y, z, trials


def test_per_datum_keyword_arguments_travel_with_the_batches():
    x, y, z, trials = _binomial_problem()
    a, b, c = SVGP(z), SVGP(z), SVGP(z)
    loader = DataLoader(_DictDataset(x, y, trials), batch_size=16, shuffle=False)
    CAVI(a, BinomialLogitLikelihood(), num_data=60, step_size=0.5).fit(data_loader=loader, num_epochs=1)
    loader3 = DataLoader(
        TensorDataset(x, y, trials),
        batch_size=16,
        shuffle=False,
        collate_fn=lambda items: (
            torch.stack([i[0] for i in items]),
            torch.stack([i[1] for i in items]),
            {"trials": torch.stack([i[2] for i in items])},
        ),
    )
    CAVI(c, BinomialLogitLikelihood(), num_data=60, step_size=0.5).fit(data_loader=loader3, num_epochs=1)
    order = [torch.arange(s, min(s + 16, 60)) for s in range(0, 60, 16)]
    _manual_steps(b, x, y, order, 0.5, likelihood=BinomialLogitLikelihood(), trials=trials)
    for p, q, r in zip(a.parameters(), b.parameters(), c.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)
        torch.testing.assert_close(r, q, rtol=0, atol=1e-12)
    # batch_size path: per-datum trials are sliced with y, scalars are passed through
    d = SVGP(z)
    trace = CAVI(d, BinomialLogitLikelihood(), num_data=60).fit(
        x, y, batch_size=16, num_epochs=3, trials=trials, generator=torch.Generator().manual_seed(0)
    )
    assert trace.num_steps == 12 and all(math.isfinite(v) for v in trace.elbo)
    e = SVGP(z)
    CAVI(e, BinomialLogitLikelihood(), num_data=60).fit(
        x, torch.clamp(y, max=1), batch_size=16, num_epochs=1, trials=1.0
    )


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda c, x, y, loader: c.fit(x, y, data_loader=loader), "not both"),
        (lambda c, x, y, loader: c.fit(data_loader=loader, batch_size=10), "not both"),
        (lambda c, x, y, loader: c.fit(), "needs the data"),
        (lambda c, x, y, loader: c.fit(x, y, batch_size=0), "batch_size"),
        (lambda c, x, y, loader: c.fit(x, y, batch_size=2.5), "batch_size"),
        (lambda c, x, y, loader: c.fit(x[:50], y[:50], batch_size=10), "num_data"),
        (
            lambda c, x, y, loader: c.fit(data_loader=DataLoader(TensorDataset(x[:50], y[:50]), batch_size=10)),
            "num_data",
        ),
        (lambda c, x, y, loader: c.fit(data_loader=DataLoader(list(zip(x, y, y, y)), batch_size=10)), "must yield"),
        (lambda c, x, y, loader: c.fit(data_loader=loader, trials=y), "per-datum keyword"),
        (lambda c, x, y, loader: c.fit(x, y, num_epochs=0), "num_epochs"),
        (lambda c, x, y, loader: c.fit(x, y, convergence=3), "convergence"),
    ],
)
def test_fit_rejects_bad_arguments(call, match):
    x, y, z = _problem(n=90)
    cavi = CAVI(SVGP(z), BernoulliLogitLikelihood(), num_data=90)
    loader = DataLoader(TensorDataset(x, y), batch_size=10)
    with pytest.raises(ValueError, match=match):
        call(cavi, x, y, loader)


# ------------------------------------------------------------------------------------------------ hyper-parameters
def test_minibatch_hyperparameter_learning_improves_the_elbo():
    x, y, z = _problem(n=400)
    fixed = SVGP(z, mean_constant=0.0)
    cavi_fixed = CAVI(fixed, BernoulliLogitLikelihood(), num_data=400)
    cavi_fixed.fit(x, y, max_iter=200, tol=1e-10)

    model = SVGP(z, mean_constant=0.0)
    cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=400, step_size=RobbinsMonro(tau=1.0, kappa=0.6))
    hyper = torch.optim.Adam(model.hyperparameters(), lr=0.05)
    trace = cavi.fit(
        x, y, batch_size=50, num_epochs=15, hyper_optimizer=hyper, generator=torch.Generator().manual_seed(0)
    )
    assert all(math.isfinite(v) for v in trace.elbo)
    CAVI(model, BernoulliLogitLikelihood(), num_data=400).fit(x, y, max_iter=200, tol=1e-10)  # q(u) at its optimum
    assert float(cavi.elbo(x, y)) > float(cavi_fixed.elbo(x, y)) + 1e-3


@pytest.mark.parametrize("learn_inducing", [False, True])
@pytest.mark.parametrize(
    "strategy_cls", [CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy], ids=["whitened", "unwhitened"]
)
def test_hyper_step_inside_fit_equals_a_separate_augmented_elbo_step(strategy_cls, learn_inducing):
    """fit re-uses the CAVI step's prior terms for the hyper-parameter gradient: same result as a CAVI step
    followed by an optimizer step on -AugmentedELBO(model(x), y)."""
    x, y, z = _problem(n=120)
    a = SVGP(z, strategy_cls=strategy_cls, mean_constant=0.3, learn_inducing_locations=learn_inducing)
    b = copy.deepcopy(a)
    ca = CAVI(a, BernoulliLogitLikelihood(), num_data=1200, step_size=0.5)
    cb = CAVI(b, BernoulliLogitLikelihood(), num_data=1200, step_size=0.5)
    oa = torch.optim.SGD(a.hyperparameters(), lr=0.5)
    ob = torch.optim.SGD(b.hyperparameters(), lr=0.5)
    for xb, yb in zip(x.split(40), y.split(40)):
        ca.step(xb, yb, hyper_optimizer=oa)
        cb.step(xb, yb)
        cb.hyper_step(xb, yb, ob)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-10)


def test_hyper_steps_per_cavi_step():
    x, y, z = _problem(n=80)
    model = SVGP(z)
    hyper = torch.optim.Adam(model.hyperparameters(), lr=0.01)
    trace = CAVI(model, BernoulliLogitLikelihood(), num_data=80).fit(
        x, y, batch_size=20, num_epochs=1, hyper_optimizer=hyper, hyper_steps=3
    )
    assert trace.num_steps == 4
    assert all(int(state["step"]) == 12 for state in hyper.state.values())
    # the CAVI step never leaves gradients on q(u)'s parameters
    assert all(p.grad is None for p in model.variational_parameters())


def test_hyper_optimizer_must_not_hold_variational_parameters():
    x, y, z = _problem(n=50)
    model = SVGP(z)
    cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=50)
    with pytest.raises(ValueError, match="variational parameters"):
        cavi.fit(x, y, hyper_optimizer=torch.optim.Adam(model.parameters(), lr=0.01))
    with pytest.raises(ValueError, match="variational parameters"):
        cavi.step(x, y, hyper_optimizer=torch.optim.SGD(model.parameters(), lr=0.01))
    with pytest.raises(ValueError, match="hyper_steps"):
        cavi.fit(x, y, hyper_optimizer=torch.optim.Adam(model.hyperparameters()), hyper_steps=0)


def test_multi_latent_model_takes_the_fused_hyper_step():
    from tests.likelihoods.toy_multilatent import TwoBitLogitLikelihood

    g = torch.Generator().manual_seed(0)
    x, _, z = _problem(n=80)
    y = torch.randint(0, 4, (80,), generator=g).double()

    class TwoLatent(gpytorch.models.ApproximateGP):
        def __init__(self):
            q_u = gpytorch.variational.CholeskyVariationalDistribution(10, batch_shape=torch.Size([2]))
            base = CAVIVariationalStrategy(self, z, q_u, learn_inducing_locations=False)
            super().__init__(gpytorch.variational.IndependentMultitaskVariationalStrategy(base, num_tasks=2))
            self.mean_module = gpytorch.means.ConstantMean(batch_shape=torch.Size([2]))
            self.covar_module = gpytorch.kernels.RBFKernel(batch_shape=torch.Size([2]))

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    a = TwoLatent()
    b = copy.deepcopy(a)
    ca = CAVI(a, TwoBitLogitLikelihood(), num_data=80, step_size=0.7)
    cb = CAVI(b, TwoBitLogitLikelihood(), num_data=80, step_size=0.7)
    oa, ob = torch.optim.SGD(a.hyperparameters(), lr=0.1), torch.optim.SGD(b.hyperparameters(), lr=0.1)
    for _ in range(2):
        ca.step(x, y, hyper_optimizer=oa)
        cb.step(x, y)
        cb.hyper_step(x, y, ob)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-10)


# ------------------------------------------------------------------------------------------------ convergence


def test_held_out_early_stopping_records_and_restores_training_mode():
    x, y, z = _problem(n=200)
    model = SVGP(z, mean_constant=0.4)
    likelihood = BernoulliLogitLikelihood()
    x_test, y_test, _ = _problem(n=100, seed=9)
    calls = []

    def test_nll() -> float:
        model.eval()
        likelihood.eval()
        with torch.no_grad():
            value = -float(likelihood.log_marginal(y_test, model(x_test)).mean())
        calls.append(value)
        return value

    rule = HeldOut(test_nll, window=2, patience=3)
    cavi = CAVI(model, likelihood, num_data=200, step_size=RobbinsMonro(tau=1.0, kappa=0.9))
    trace = cavi.fit(x, y, batch_size=50, num_epochs=200, convergence=rule, generator=torch.Generator().manual_seed(0))
    assert trace.converged and trace.num_epochs < 200
    assert trace.held_out == calls and len(calls) == trace.num_epochs  # once per epoch
    assert trace.held_out_step == [4 * (k + 1) for k in range(len(calls))]
    assert model.training and likelihood.training
    assert rule.best_step is not None and rule.since_best == 3
    assert trace.held_out_time == [trace.time[s - 1] for s in trace.held_out_step]
    # every k steps instead of per epoch, and "max" mode
    rule = HeldOut(lambda: 1.0, patience=2, every=3, mode="max")
    trace = CAVI(SVGP(z), BernoulliLogitLikelihood(), num_data=200).fit(
        x, y, batch_size=50, num_epochs=50, convergence=rule
    )
    assert trace.converged and trace.held_out_step == [3, 6, 9] and trace.num_steps == 9


def test_callable_convergence_callback_and_progress_bar(capsys):
    x, y, z = _problem(n=100)
    seen = []
    trace = CAVI(SVGP(z), BernoulliLogitLikelihood(), num_data=100).fit(
        x,
        y,
        batch_size=25,
        num_epochs=10,
        convergence=lambda tr: tr.num_steps >= 6,
        callback=lambda t, v: seen.append(t),
        progress=True,
    )
    assert trace.converged and trace.num_steps == 6 and seen == list(range(6))
    assert "CAVI" in capsys.readouterr().err
    trace = CAVI(SVGP(z), BernoulliLogitLikelihood(), num_data=100).fit(x, y, batch_size=25, max_iter=7, num_epochs=10)
    assert trace.num_steps == 7 and not trace.converged


def test_chunked_elbo_equals_the_one_piece_elbo():
    x, y, z = _problem(n=333)
    for strategy_cls in (CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy):
        model = SVGP(z, strategy_cls=strategy_cls, mean_constant=0.4)
        cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=333)
        cavi.fit(x, y, max_iter=5)
        whole = cavi.elbo(x, y, chunk_size=10**6)
        assert float(cavi.elbo(x, y, chunk_size=50)) == pytest.approx(float(whole), rel=1e-13)
        assert float(cavi.elbo(x, y)) == pytest.approx(float(whole), rel=1e-13)
    with pytest.raises(ValueError, match="chunk_size"):
        cavi.elbo(x, y, chunk_size=0)


def test_true_elbo_hyper_objective_takes_plain_variational_elbo_steps():
    """CAVI(hyper_objective=VariationalELBO): a step with a hyper optimizer equals a CAVI step followed by an
    optimizer step on -VariationalELBO(model(x), y) with q(u) fixed (the true ELBO, not the augmented bound)."""
    x, y, z = _problem(n=120)
    a = SVGP(z, mean_constant=0.3)
    b = copy.deepcopy(a)
    la, lb = BernoulliLogitLikelihood(), BernoulliLogitLikelihood()
    ca = CAVI(a, la, num_data=120, hyper_objective=gpytorch.mlls.VariationalELBO(la, a, num_data=120))
    cb = CAVI(b, lb, num_data=120)
    oa = torch.optim.SGD(a.hyperparameters(), lr=0.5)
    ob = torch.optim.SGD(b.hyperparameters(), lr=0.5)
    true_elbo = gpytorch.mlls.VariationalELBO(lb, b, num_data=120)
    augmented_step = copy.deepcopy(b)
    for _ in range(3):
        ca.step(x, y, hyper_optimizer=oa)
        cb.step(x, y)
        ob.zero_grad()
        for p in b.variational_parameters():
            p.requires_grad_(False)
        (-true_elbo(b(x), y)).backward()
        for p in b.variational_parameters():
            p.requires_grad_(True)
        ob.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-10)
    # and it is not the augmented step
    cc = CAVI(augmented_step, BernoulliLogitLikelihood(), num_data=120)
    cc.step(x, y, hyper_optimizer=torch.optim.SGD(augmented_step.hyperparameters(), lr=0.5))
    assert not torch.allclose(augmented_step.covar_module.outputscale, a.covar_module.outputscale)


def test_hyper_objective_is_validated():
    x, y, z = _problem(n=50)
    model, likelihood = SVGP(z), BernoulliLogitLikelihood()
    with pytest.raises(TypeError, match="MarginalLogLikelihood"):
        CAVI(model, likelihood, num_data=50, hyper_objective=lambda f, y: f.mean.sum())
    other = SVGP(z)
    with pytest.raises(ValueError, match="same model"):
        CAVI(model, likelihood, num_data=50, hyper_objective=gpytorch.mlls.VariationalELBO(likelihood, other, 50))
