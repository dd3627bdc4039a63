"""The prior-term cache of ``cavi_terms``: identical results, and a miss after every change it depends on."""

from __future__ import annotations

import copy

import gpytorch
import pytest
import torch

from gpytorch_augment import CAVI, BernoulliLogitLikelihood, CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy
from tests.models import SVGP

STRATEGIES = [CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy]
DISTRIBUTIONS = [
    gpytorch.variational.CholeskyVariationalDistribution,
    gpytorch.variational.NaturalVariationalDistribution,
]


def _problem(n: int = 60, m: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    y = torch.bernoulli(torch.sigmoid(0.5 + 2 * torch.sin(2 * x.squeeze(-1))), generator=g)
    z = torch.linspace(-3, 3, m).unsqueeze(-1)
    return x, y, z


def _assert_terms_equal(a, b) -> None:
    for name, s, t in zip(a._fields, a, b):
        assert torch.equal(s, t), name


def _is_hit(strategy, x) -> bool:
    """Whether ``cavi_terms(x)`` (no graph) returns the cached tensors; checks that they equal a fresh evaluation."""
    before = strategy.cached_cavi_terms
    with torch.no_grad():
        terms = strategy.cavi_terms(x)
        _assert_terms_equal(terms, strategy.cavi_terms(x, cache=False))
    return before is not None and terms.A is before.A


@pytest.mark.parametrize("distribution_cls", DISTRIBUTIONS)
@pytest.mark.parametrize("strategy_cls", STRATEGIES)
def test_cached_fit_is_bitwise_the_uncached_fit(strategy_cls, distribution_cls):
    x, y, z = _problem()
    a = SVGP(z, distribution_cls, strategy_cls, mean_constant=0.4)
    b = copy.deepcopy(a)
    ca = CAVI(a, BernoulliLogitLikelihood(), num_data=len(y))
    cb = CAVI(b, BernoulliLogitLikelihood(), num_data=len(y))
    trace_a = ca.fit(x, y, max_iter=8, tol=0.0)
    # b recomputes its prior terms at every step
    trace_b = cb.fit(x, y, max_iter=8, tol=0.0, callback=lambda t, v: b.variational_strategy.clear_cavi_cache())
    assert trace_a.elbo == trace_b.elbo
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    assert torch.equal(ca.elbo(x, y), cb.elbo(x, y))
    assert _is_hit(a.variational_strategy, x)


def test_hit_needs_equal_values_not_the_same_tensor():
    x, y, z = _problem()
    strategy = SVGP(z).variational_strategy
    assert not _is_hit(strategy, x)
    assert _is_hit(strategy, x)
    assert _is_hit(strategy, x.clone())
    assert not _is_hit(strategy, x[:-1])
    assert not _is_hit(strategy, x.float())


def test_optimizer_step_on_a_hyperparameter_invalidates():
    x, y, z = _problem()
    model = SVGP(z)
    strategy = model.variational_strategy
    cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=len(y))
    cavi.fit(x, y, max_iter=3)
    assert _is_hit(strategy, x)
    old = strategy.cached_cavi_terms
    # one in-place optimizer step (Adam on the hyper-parameters)
    cavi.hyper_step(x, y, torch.optim.Adam(model.hyperparameters(), lr=0.1))
    assert not _is_hit(strategy, x)
    assert not torch.equal(strategy.cavi_terms(x).A, old.A)
    assert _is_hit(strategy, x)


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.covar_module.raw_outputscale.data.add_(0.1),  # bypasses the version counter
        lambda m: m.mean_module.constant.data.fill_(0.3),
        lambda m: m.load_state_dict({**m.state_dict(), "covar_module.base_kernel.raw_lengthscale": torch.ones(1, 1)}),
        lambda m: m.eval(),
        lambda m: setattr(m.variational_strategy, "jitter_val", 1e-4),
    ],
    ids=["data-write", "mean-constant", "load_state_dict", "eval", "jitter"],
)
def test_any_change_of_what_the_prior_depends_on_invalidates(change):
    x, _, z = _problem()
    model = SVGP(z)
    strategy = model.variational_strategy
    _is_hit(strategy, x)
    assert _is_hit(strategy, x)
    with torch.no_grad():
        change(model)
    assert not _is_hit(strategy, x)
    assert _is_hit(strategy, x)


def test_in_place_change_of_x_invalidates():
    x, _, z = _problem()
    strategy = SVGP(z).variational_strategy
    _is_hit(strategy, x)
    x[3, 0] += 0.5
    assert not _is_hit(strategy, x)
    x.data[5, 0] -= 0.25  # not seen by the version counter: the values are compared
    assert not _is_hit(strategy, x)
    assert _is_hit(strategy, x)


@pytest.mark.parametrize("learn", [False, True], ids=["buffer", "parameter"])
def test_moving_inducing_points_invalidates(learn):
    x, y, z = _problem()
    model = SVGP(z, learn_inducing_locations=learn)
    strategy = model.variational_strategy
    _is_hit(strategy, x)
    with torch.no_grad():
        strategy.inducing_points[2, 0] += 0.1
    assert not _is_hit(strategy, x)
    if learn:  # and by an optimizer holding them
        assert _is_hit(strategy, x)
        cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=len(y))
        cavi.hyper_step(x, y, torch.optim.SGD([strategy.inducing_points], lr=0.5))
        assert not _is_hit(strategy, x)


def test_writing_into_the_returned_terms_invalidates():
    x, _, z = _problem()
    strategy = SVGP(z).variational_strategy
    with torch.no_grad():
        strategy.cavi_terms(x).A.mul_(2.0)
    assert not _is_hit(strategy, x)


def test_no_cache_when_a_graph_is_needed():
    x, _, z = _problem()
    model = SVGP(z)
    strategy = model.variational_strategy
    terms = strategy.cavi_terms(x)  # grad mode on, hyper-parameters require grad: graph, nothing cached
    assert terms.A.requires_grad and strategy.cached_cavi_terms is None
    assert strategy.cavi_terms(x).A is not terms.A
    model.covar_module.requires_grad_(False)
    model.mean_module.requires_grad_(False)
    terms = strategy.cavi_terms(x)  # nothing requires grad: cached even in grad mode
    assert not terms.A.requires_grad and strategy.cavi_terms(x).A is terms.A
    with torch.inference_mode():
        assert strategy.cavi_terms(x).A is not terms.A


def test_full_batch_cavi_evaluates_the_prior_once():
    x, y, z = _problem()
    model = SVGP(z, gpytorch.variational.NaturalVariationalDistribution)
    calls = []
    forward = model.forward
    model.forward = lambda inputs: calls.append(inputs.shape) or forward(inputs)
    cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=len(y))
    cavi.fit(x, y, max_iter=6, tol=0.0)
    assert calls == [torch.Size([len(z) + len(x), 1])]
    cavi.fit(x, y, max_iter=6, tol=0.0)
    cavi.elbo(x, y)
    assert len(calls) == 1


def test_minibatch_steps_do_not_fill_the_cache():
    x, y, z = _problem()
    model = SVGP(z)
    CAVI(model, BernoulliLogitLikelihood(), num_data=len(y)).fit(x, y, batch_size=20, num_epochs=2)
    assert model.variational_strategy.cached_cavi_terms is None


def test_dense_and_blockwise_prior_evaluations_agree():
    """Small batches evaluate K at cat[Z, x] as one dense block, large ones as rows of Z plus a diagonal."""
    from gpytorch_augment.core import prior as module

    x, _, z = _problem(n=30)
    strategy = SVGP(z).variational_strategy
    with torch.no_grad():
        dense = strategy.cavi_terms(x, cache=False)
        limit = module.DENSE_PRIOR_ELEMENTS
        try:
            module.DENSE_PRIOR_ELEMENTS = 0
            blocks = strategy.cavi_terms(x, cache=False)
        finally:
            module.DENSE_PRIOR_ELEMENTS = limit
    for name, a, b in zip(dense._fields, dense, blocks):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)


def test_copies_and_pickles_start_without_cache():
    import pickle

    x, _, z = _problem()
    model = SVGP(z)
    _is_hit(model.variational_strategy, x)
    assert model.variational_strategy.cached_cavi_terms is not None
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert twin.variational_strategy.cached_cavi_terms is None
        assert not _is_hit(twin.variational_strategy, x)
        assert _is_hit(twin.variational_strategy, x)
