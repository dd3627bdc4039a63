"""Bad input fails early, at every public entry point, with an error that names the problem.

The CAVI driver receives the inputs ``x``; ``AugmentedELBO`` and the likelihood's ``expected_log_prob`` /
``log_marginal`` receive :math:`q(f)` instead, so for them a non-finite ``x`` shows up as a non-finite
:math:`q(f)` and the rank of ``x`` is GPyTorch's business (a 1-D ``x`` is a valid GPyTorch input).
"""

from __future__ import annotations

import math

import gpytorch
import pytest
import torch

from gpytorch_augment import CAVI, AugmentedELBO, BernoulliLogitLikelihood
from tests.models import SVGP

N = 12


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(N, 1, generator=g) * 6 - 3
    y = (torch.arange(N) % 2).to(torch.get_default_dtype())
    return x, y, torch.linspace(-3, 3, 4).unsqueeze(-1)


def _with(t: torch.Tensor, index, value) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


def _bad_targets(y):
    return {
        "label 2": (torch.where(y > 0, 2.0, 0.0), "must take values in .*found 2"),
        "label 0.5": (torch.where(y > 0, 0.5, 1.0), "must take values in .*found 0.5"),
        "labels mixing 0 and -1": (torch.where(y > 0, -1.0, 0.0), "mix the \\{0, 1\\} and \\{-1, 1\\}"),
        "nan in y": (_with(y, 3, math.nan), "non-finite values .*nan"),
        "inf in y": (_with(y, 3, math.inf), "non-finite values .*inf"),
    }


BAD_TARGETS = list(_bad_targets(torch.zeros(N)))
X_ENTRY_POINTS = ["CAVI.step", "CAVI.fit", "CAVI.elbo"]
Q_F_ENTRY_POINTS = ["AugmentedELBO", "expected_log_prob", "log_marginal"]


def _call(entry_point: str, x, y):
    """The entry point's result on ``(x, y)``; it must leave q(u) untouched when it raises."""
    torch.manual_seed(0)  # GPyTorch initialises q(u) at random
    x0, _, z = _data()
    model = SVGP(z)
    likelihood = BernoulliLogitLikelihood()
    before = [p.detach().clone() for p in model.variational_parameters()]
    try:
        if entry_point.startswith("CAVI"):
            cavi = CAVI(model, likelihood, num_data=N)
            if entry_point == "CAVI.step":
                return cavi.step(x, y)
            elif entry_point == "CAVI.fit":
                return cavi.fit(x, y, max_iter=2).elbo[-1]
            else:
                return cavi.elbo(x, y)
        else:
            model.train()
            q_f = model(x)
            before = [p.detach().clone() for p in model.variational_parameters()]  # after GPyTorch's initialisation
            if entry_point == "AugmentedELBO":
                return AugmentedELBO(likelihood, model, num_data=N)(q_f, y)
            elif entry_point == "expected_log_prob":
                return likelihood.expected_log_prob(y, q_f)
            else:
                return likelihood.log_marginal(y, q_f)
    except Exception:
        # nothing was written before the error
        assert all(torch.equal(a, b.detach()) for a, b in zip(before, model.variational_parameters()))
        raise


@pytest.mark.parametrize("entry_point", X_ENTRY_POINTS + Q_F_ENTRY_POINTS)
@pytest.mark.parametrize("bad", BAD_TARGETS)
def test_bad_targets(entry_point, bad):
    x, y, _ = _data()
    targets, message = _bad_targets(y)[bad]
    with pytest.raises(ValueError, match=message):
        _call(entry_point, x, targets)


@pytest.mark.parametrize("entry_point", X_ENTRY_POINTS + Q_F_ENTRY_POINTS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_inputs(entry_point, value):
    x, y, _ = _data()
    message = "x contains non-finite values" if entry_point in X_ENTRY_POINTS else "q\\(f\\) has a non-finite mean"
    with pytest.raises(ValueError, match=message):
        _call(entry_point, _with(x, (2, 0), value), y)


@pytest.mark.parametrize("entry_point", X_ENTRY_POINTS + Q_F_ENTRY_POINTS)
@pytest.mark.parametrize("which", ["y shorter", "y longer"])
def test_mismatched_lengths(entry_point, which):
    x, y, _ = _data()
    y = y[:-1] if which == "y shorter" else torch.cat([y, y[:1]])
    message = "disagree on the number of data points" if entry_point in X_ENTRY_POINTS else "data points"
    with pytest.raises(ValueError, match=message):
        _call(entry_point, x, y)


WRONG_RANK = {
    "1-D x": (lambda x: x.squeeze(-1), "x must have shape \\(N, D\\)"),
    "batched x for a non-batched model": (
        lambda x: x.expand(2, *x.shape),
        "batch dimensions \\(2,\\) do not fit the model's batch shape",
    ),
}


@pytest.mark.parametrize("entry_point", X_ENTRY_POINTS)
@pytest.mark.parametrize("wrong", list(WRONG_RANK))
def test_x_of_wrong_rank(entry_point, wrong):
    x, y, _ = _data()
    reshape, message = WRONG_RANK[wrong]
    with pytest.raises(ValueError, match=message):
        _call(entry_point, reshape(x), y)


# ------------------------------------------------------------------------------------------------ valid types
@pytest.mark.parametrize("entry_point", X_ENTRY_POINTS + Q_F_ENTRY_POINTS)
@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.uint8, torch.int64, torch.bool])
def test_integer_targets_of_any_width_are_accepted(entry_point, dtype):
    """Labels in a narrow integer dtype were refused ("cannot represent exactly (e.g. 1)"): the 2**53 check
    overflowed in that dtype."""
    x, y, _ = _data()
    torch.testing.assert_close(_call(entry_point, x, y.to(dtype)), _call(entry_point, x, y))


def test_exact_float_accepts_narrow_integers_and_still_refuses_inexact_wide_ones():
    from gpytorch_augment._validation import exact_float

    for dtype in (torch.int8, torch.int16, torch.int32, torch.uint8):
        t = torch.tensor([0, 1, 100], dtype=dtype)
        assert torch.equal(exact_float("y", t, torch.float16), t.to(torch.float16))
    assert exact_float("y", torch.tensor([-(2**31)], dtype=torch.int32), torch.float64).item() == -(2**31)
    with pytest.raises(ValueError, match="^y holds integers that torch.float32 cannot represent exactly"):
        exact_float("y", torch.tensor([2**24 + 1], dtype=torch.int32), torch.float32)
    with pytest.raises(ValueError, match="e.g. -9223372036854775808"):  # abs() would overflow here
        exact_float("y", torch.tensor([-(2**63)]), torch.float64)


@pytest.mark.parametrize("entry_point", X_ENTRY_POINTS + Q_F_ENTRY_POINTS)
def test_numpy_data_are_accepted_as_torch_converts_them(entry_point):
    """numpy arrays (what scikit-learn returns) failed deep inside with AttributeError."""
    x, y, _ = _data()
    x_np = x.numpy() if entry_point in X_ENTRY_POINTS else x
    torch.testing.assert_close(_call(entry_point, x_np, y.numpy()), _call(entry_point, x, y))
    torch.testing.assert_close(_call(entry_point, x_np, y.long().numpy()), _call(entry_point, x, y))


def test_narrow_integer_and_numpy_trials_and_comparisons_are_accepted():
    from gpytorch_augment import BinomialLogitLikelihood, PairwiseLogitLikelihood
    from gpytorch_augment.testing import make_cavi_model

    q_f = gpytorch.distributions.MultivariateNormal(torch.zeros(3), torch.eye(3))
    likelihood, successes = BinomialLogitLikelihood(), torch.tensor([0, 2, 3])
    expected = likelihood.expected_log_prob(successes, q_f, trials=torch.tensor([3, 4, 5]))
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32):
        trials = torch.tensor([3, 4, 5], dtype=dtype)
        torch.testing.assert_close(likelihood.expected_log_prob(successes.to(dtype), q_f, trials=trials), expected)
    numpy_trials = torch.tensor([3, 4, 5]).numpy()
    torch.testing.assert_close(likelihood.expected_log_prob(successes.numpy(), q_f, trials=numpy_trials), expected)

    x = torch.linspace(-1.0, 1.0, 4).unsqueeze(-1)
    pairs, labels = torch.tensor([[1, 0], [2, 1], [3, 2], [0, 3]]), torch.tensor([1.0, 0.0, 1.0, 0.0])
    elbos = []
    for comparisons in (pairs, pairs.int(), pairs.to(torch.uint8), pairs.numpy()):
        cavi = CAVI(make_cavi_model(1, x), PairwiseLogitLikelihood(), num_data=len(pairs))
        elbos.append(cavi.fit(x, labels, comparisons=comparisons, max_iter=3).elbo[-1])
    assert elbos[1:] == elbos[:1] * 3


# ------------------------------------------------------------------------------------------------ wrong types
def test_mean_field_distribution_is_rejected():
    _, _, z = _data()
    model = SVGP(z, gpytorch.variational.MeanFieldVariationalDistribution)
    with pytest.raises(TypeError, match="MeanFieldVariationalDistribution cannot take CAVI updates"):
        CAVI(model, BernoulliLogitLikelihood(), num_data=N)


@pytest.mark.parametrize(
    "strategy_cls", [gpytorch.variational.VariationalStrategy, gpytorch.variational.UnwhitenedVariationalStrategy]
)
def test_non_cavi_strategy_is_rejected(strategy_cls):
    _, _, z = _data()
    model = SVGP(z, strategy_cls=strategy_cls)
    with pytest.raises(TypeError, match=f"CAVIVariationalStrategy.*got {strategy_cls.__name__}"):
        CAVI(model, BernoulliLogitLikelihood(), num_data=N)


def test_model_without_variational_strategy_is_rejected():
    with pytest.raises(TypeError, match="got NoneType"):
        CAVI(torch.nn.Linear(1, 1), BernoulliLogitLikelihood(), num_data=N)


@pytest.mark.parametrize(
    "likelihood", [gpytorch.likelihoods.BernoulliLikelihood(), gpytorch.likelihoods.GaussianLikelihood()]
)
def test_non_augmented_likelihood_is_rejected(likelihood):
    _, _, z = _data()
    with pytest.raises(TypeError, match="AugmentedLikelihood"):
        CAVI(SVGP(z), likelihood, num_data=N)
    with pytest.raises(TypeError, match="AugmentedLikelihood"):
        AugmentedELBO(likelihood, SVGP(z), num_data=N)


@pytest.mark.parametrize("num_data", [0, -3])
def test_non_positive_num_data_is_rejected(num_data):
    _, _, z = _data()
    with pytest.raises(ValueError, match="num_data"):
        CAVI(SVGP(z), BernoulliLogitLikelihood(), num_data=num_data)


# ------------------------------------------------------------------------------------------------ options
@pytest.mark.parametrize("value", [math.inf, math.nan, None, 2.5, "3", True])
@pytest.mark.parametrize("likelihood", ["OrdinalLogitLikelihood", "LogisticSoftmaxLikelihood"])
def test_num_classes_that_is_not_a_whole_number_is_named(likelihood, value):
    """inf, None and nan raised OverflowError/TypeError/ValueError from int() without naming num_classes."""
    import gpytorch_augment

    with pytest.raises(ValueError, match="^num_classes must be an integer >= 2, got "):
        getattr(gpytorch_augment, likelihood)(value)


@pytest.mark.parametrize("method", [["gibbs"], ("hmc",), None, 1])
def test_sampler_method_that_is_not_a_name_is_named(method):
    from gpytorch_augment import posterior_sampler

    x, y, z = _data()
    with pytest.raises(ValueError, match="^method must be 'auto' or one of"):
        posterior_sampler(SVGP(z), BernoulliLogitLikelihood(), x, y, method=method)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"hyper_options": {"restarts": math.inf}}, "^restarts must be an integer >= 0 or None, got inf"),
        ({"hyper_options": {"restarts": math.nan}}, "^restarts must be an integer >= 0 or None, got nan"),
        ({"hyper_options": {"restarts": -1}}, "^restarts must be an integer >= 0 or None, got -1"),
        ({"hyper_options": {"lr": "a"}}, "^lr must be a finite number > 0, got 'a'"),
        ({"max_iter": 2.5}, r"^max_iter must be an integer >= 1 or None, got 2.5"),
        ({"max_iter": math.inf}, r"^max_iter must be an integer >= 1 or None, got inf"),
    ],
    ids=["restarts-inf", "restarts-nan", "restarts-negative", "lr-string", "max_iter-2.5", "max_iter-inf"],
)
@pytest.mark.parametrize("learn", [True, False], ids=["one-call", "plain"])
def test_fit_options_out_of_range_are_named_not_truncated(options, message, learn):
    if not learn and "hyper_options" in options:
        pytest.skip("hyper_options belong to the one-call fit")
    x, y, z = _data()
    cavi = CAVI(SVGP(z), BernoulliLogitLikelihood(), num_data=N)
    with pytest.raises(ValueError, match=message):
        cavi.fit(x, y, learn_hyperparameters=learn, **options)
