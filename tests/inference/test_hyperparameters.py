"""``CAVI.fit(x, y, learn_hyperparameters=True)``: the one-call fits of every likelihood, their rules and bad input."""

from __future__ import annotations

import math

import gpytorch
import pytest
import torch

from gpytorch_augment import CAVI, CAVIVariationalStrategy, CollapsedAugmentedELBO
from gpytorch_augment.inference.hyperparameters import choose_protocol, hyperparameters_of
from gpytorch_augment.likelihoods.augmented_likelihood import validated_latent_blocks
from gpytorch_augment.testing import gp_data, make_cavi_model
from tests.likelihoods.registry import CASES

BERNOULLI = next(c for c in CASES if c.name == "bernoulli_logit")


def _setup(case=BERNOULLI, n: int = 40, m: int = 6, seed: int = 1, **model_kwargs):
    torch.manual_seed(seed)
    data = gp_data(case, n=n, seed=seed)
    Z = torch.linspace(-3, 3, m, dtype=torch.float64).unsqueeze(-1)
    model = make_cavi_model(data.likelihood.num_latents, Z, **model_kwargs).double()
    return model, CAVI(model, data.likelihood, num_data=n), data


def _true_elbo(model, likelihood, data) -> float:
    with torch.no_grad():
        model.train()
        return float(gpytorch.mlls.VariationalELBO(likelihood, model, data.y.shape[-1])(model(data.x), data.y))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_one_call_fit_of_every_likelihood_raises_the_elbo(case):
    model, cavi, data = _setup(case)
    cavi.fit(data.x, data.y, max_iter=3, **data.kwargs)  # q(u) near its optimum at the initial hyper-parameters
    before = float(cavi.elbo(data.x, data.y, **data.kwargs))
    initial = [p.detach().clone() for p in hyperparameters_of(cavi)]
    trace = cavi.fit(
        data.x, data.y, learn_hyperparameters=True, max_iter=4 if choose_protocol(data.likelihood, 40) == "collapsed"
        else 40, batch_size=20, hyper_options={"lr": 0.02}, generator=torch.Generator().manual_seed(0), **data.kwargs,
    )  # fmt: skip
    after = float(cavi.elbo(data.x, data.y, **data.kwargs))
    assert all(math.isfinite(v) for v in trace.elbo) and trace.num_steps >= 1
    assert after > before + 1e-3, (case.name, before, after)
    assert any(not torch.equal(a, b.detach()) for a, b in zip(initial, hyperparameters_of(cavi)))


def test_protocol_choice_follows_the_likelihood_and_the_data_size():
    for case in CASES:
        blocked = validated_latent_blocks(case.make()) is not None
        assert choose_protocol(case.make(), 1000) == ("stochastic" if blocked else "collapsed")
        assert choose_protocol(case.make(), 10**6) == "stochastic"


def test_collapsed_fit_is_monotone_converges_and_leaves_q_at_its_optimum():
    model, cavi, data = _setup(n=60)
    options = {"polish": False}
    trace = cavi.fit(data.x, data.y, learn_hyperparameters=True, tol=1e-7, max_iter=60, hyper_options=options)
    assert trace.converged
    assert all(b >= a - 1e-9 * abs(a) for a, b in zip(trace.elbo, trace.elbo[1:])), trace.elbo
    assert trace.time == sorted(trace.time)
    # q(u) is the optimum for the final q(Omega): one more closed-form write changes nothing
    mll = CollapsedAugmentedELBO(data.likelihood, model, 60, data.x, data.y)
    with torch.no_grad():
        elbo_model = float(cavi.elbo(data.x, data.y))
        mll.update_aux()
        assert float(mll()) == pytest.approx(elbo_model, abs=1e-6)
    assert elbo_model == pytest.approx(trace.elbo[-1], abs=1e-5)


def test_subsets_double_until_all_the_data():
    model, cavi, data = _setup(n=40)
    sizes = []
    trace = cavi.fit(
        data.x, data.y, learn_hyperparameters=True, max_iter=5, convergence=lambda tr: False,
        hyper_options={"subset": 10, "lbfgs_iter": 3}, generator=torch.Generator().manual_seed(0),
        callback=lambda t, value: sizes.append(t),
    )  # fmt: skip
    assert trace.num_steps == 5 and sizes == [0, 1, 2, 3, 4] and not trace.converged
    assert math.isfinite(float(cavi.elbo(data.x, data.y)))


def test_a_users_rule_overrides_the_default():
    model, cavi, data = _setup()
    seen = []

    def stop_after_two(trace):
        seen.append(trace.num_steps)
        return trace.num_steps >= 2

    trace = cavi.fit(data.x, data.y, learn_hyperparameters=True, convergence=stop_after_two)
    assert trace.num_steps == 2 and trace.converged and seen == [1, 2]


def test_inducing_locations_flag():
    model, cavi, data = _setup(learn_inducing_locations=True)
    Z0 = model.variational_strategy.inducing_points.detach().clone()
    cavi.fit(data.x, data.y, learn_hyperparameters=True, max_iter=2, hyper_options={"learn_inducing_locations": False})
    assert torch.equal(Z0, model.variational_strategy.inducing_points.detach())
    cavi.fit(data.x, data.y, learn_hyperparameters=True, max_iter=2, hyper_options={"learn_inducing_locations": True})
    assert not torch.equal(Z0, model.variational_strategy.inducing_points.detach())
    model, cavi, data = _setup()  # inducing points registered as a buffer
    with pytest.raises(ValueError, match="learn_inducing_locations=True"):
        cavi.fit(data.x, data.y, learn_hyperparameters=True, hyper_options={"learn_inducing_locations": True})


def test_progress_bar(capsys):
    model, cavi, data = _setup()
    trace = cavi.fit(data.x, data.y, learn_hyperparameters=True, max_iter=2, progress=True)
    assert trace.num_steps == 2
    assert "CAVI + L-BFGS" in capsys.readouterr().err


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"hyper_optimizer": "adam"}, "not both"),
        ({"hyper_options": {"lrr": 0.1}}, "unknown hyper_options"),
        ({"hyper_options": {"protocol": "newton"}}, "protocol"),
        ({"hyper_options": {"lr": -1.0}}, "lr"),
        ({"hyper_options": {"lbfgs_iter": 0}}, "lbfgs_iter"),
        ({"hyper_options": [1]}, "must be a dict"),
        ({"max_iter": 0}, "max_iter"),
        ({"learn_hyperparameters": False, "hyper_options": {"lr": 0.1}}, "only used with"),
    ],
)
def test_bad_input_raises_value_error(kwargs, match):
    model, cavi, data = _setup()
    kwargs = dict(kwargs)
    if kwargs.get("hyper_optimizer") == "adam":
        kwargs["hyper_optimizer"] = torch.optim.Adam(model.hyperparameters(), lr=0.1)
    kwargs.setdefault("learn_hyperparameters", True)
    with pytest.raises(ValueError, match=match):
        cavi.fit(data.x, data.y, **kwargs)


def test_missing_data_and_loader_are_refused():
    model, cavi, data = _setup()
    with pytest.raises(ValueError, match="x and y"):
        cavi.fit(learn_hyperparameters=True)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data.x, data.y), batch_size=10)
    with pytest.raises(ValueError, match="data_loader"):
        cavi.fit(data_loader=loader, learn_hyperparameters=True)
    with pytest.raises(ValueError):
        cavi.fit(data.x[:5], data.y, learn_hyperparameters=True)


def test_stochastic_protocol_on_request():
    model, cavi, data = _setup()
    trace = cavi.fit(
        data.x, data.y, learn_hyperparameters=True, batch_size=10, num_epochs=3,
        hyper_options={"protocol": "stochastic", "lr": 0.05}, generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    assert trace.num_steps == 12  # 3 epochs of 4 batches
    assert isinstance(model.variational_strategy, CAVIVariationalStrategy)


def test_polish_phase_raises_the_true_elbo_over_the_collapsed_solution():
    model, cavi, data = _setup(n=60)
    cavi.fit(data.x, data.y, learn_hyperparameters=True, max_iter=60, hyper_options={"polish": False})
    collapsed = _true_elbo(model, data.likelihood, data)
    model, cavi, data = _setup(n=60)
    trace = cavi.fit(data.x, data.y, learn_hyperparameters=True, tol=1e-7, max_iter=60)
    assert trace.converged
    assert _true_elbo(model, data.likelihood, data) > collapsed + 1e-4


def test_natural_distributions_skip_the_polish_phase():
    model, cavi, data = _setup(distribution_cls=gpytorch.variational.NaturalVariationalDistribution)
    natural = [p.detach().clone() for p in model.variational_parameters()]
    with pytest.warns(UserWarning, match="polish phase needs a CholeskyVariationalDistribution"):
        trace = cavi.fit(data.x, data.y, learn_hyperparameters=True, max_iter=30)
    assert trace.converged and all(b >= a - 1e-9 * abs(a) for a, b in zip(trace.elbo, trace.elbo[1:]))
    assert any(not torch.equal(a, b) for a, b in zip(natural, model.variational_parameters()))  # CAVI wrote q*(u)


def test_sharded_data_refuse_the_collapsed_protocol_and_auto_chooses_the_stochastic_one(monkeypatch):
    """The collapsed bound sees one process's data only: with torch.distributed, 'auto' means 'stochastic'."""
    import gpytorch_augment.inference.hyperparameters as hyper

    monkeypatch.setattr(CAVI, "distributed", property(lambda self: True))
    _, cavi, data = _setup()
    with pytest.raises(ValueError, match="protocol='stochastic'"):
        cavi.fit(data.x, data.y, learn_hyperparameters=True, hyper_options={"protocol": "collapsed"})
    chosen = {}
    monkeypatch.setattr(hyper, "_fit_collapsed", lambda *a, **k: chosen.setdefault("protocol", "collapsed"))
    monkeypatch.setattr(CAVI, "fit", lambda self, *a, **k: chosen.setdefault("protocol", "stochastic"))
    hyper.fit_hyperparameters(cavi, data.x, data.y)
    assert chosen["protocol"] == "stochastic"


def test_the_one_call_fit_keeps_its_own_default_tolerance(monkeypatch):
    """CAVI.fit's tol default (1e-8, for q(u) alone) is not forced on the hyper-parameter protocols."""
    import gpytorch_augment.inference.hyperparameters as hyper

    seen = {}
    monkeypatch.setattr(hyper, "fit_hyperparameters", lambda cavi, x, y, **kw: seen.update(kw))
    _, cavi, data = _setup()
    cavi.fit(data.x, data.y, learn_hyperparameters=True)
    assert "tol" not in seen
    cavi.fit(data.x, data.y, learn_hyperparameters=True, tol=1e-3)
    assert seen["tol"] == 1e-3
