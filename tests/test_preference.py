"""The BoTorch preference model: BoTorch's preference and Monte-Carlo acquisition functions run on it (values and
gradients in X), it learns a utility from comparisons, and bad input raises."""

from __future__ import annotations

import pytest
import torch

botorch = pytest.importorskip("botorch")

from botorch.acquisition.logei import qLogNoisyExpectedImprovement  # noqa: E402
from botorch.acquisition.monte_carlo import qNoisyExpectedImprovement, qSimpleRegret  # noqa: E402
from botorch.acquisition.preference import (  # noqa: E402
    AnalyticExpectedUtilityOfBestOption,
    qExpectedUtilityOfBestOption,
)
from botorch.optim import optimize_acqf  # noqa: E402
from botorch.sampling import SobolQMCNormalSampler  # noqa: E402

from gpytorch_augment.preference import PairwiseAugmentedGP  # noqa: E402


def _utility(x: torch.Tensor) -> torch.Tensor:
    return -((x - 0.6) ** 2).sum(-1) * 10


def _data(n: int, m: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=generator, dtype=torch.float64)
    pairs = torch.stack([torch.randperm(n, generator=generator)[:2] for _ in range(m)])
    u = _utility(X)
    first_wins = torch.bernoulli(torch.sigmoid(u[pairs[:, 0]] - u[pairs[:, 1]]), generator=generator).bool()
    comparisons = torch.where(first_wins.unsqueeze(-1), pairs, pairs.flip(-1))  # winner first
    return X, comparisons


@pytest.fixture(scope="module")
def fitted() -> PairwiseAugmentedGP:
    X, comparisons = _data(16, 60, seed=0)
    model = PairwiseAugmentedGP(X, comparisons)
    model.fit(max_iter=12)
    return model


def test_learns_the_utility_from_comparisons(fitted):
    generator = torch.Generator().manual_seed(1)
    X_test = torch.rand(40, 2, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        mean = fitted.posterior(X_test).mean.squeeze(-1)
    correlation = torch.corrcoef(torch.stack([mean, _utility(X_test)]))[0, 1]
    assert float(correlation) > 0.7  # 60 noisy comparisons of 16 points; an unrelated utility gives about 0


def test_posterior_is_joint_batched_and_differentiable(fitted):
    X = torch.rand(5, 3, 2, dtype=torch.float64, requires_grad=True)
    posterior = fitted.posterior(X)
    assert posterior.mean.shape == (5, 3, 1) and posterior.covariance_matrix.shape == (5, 3, 3)
    posterior.mean.sum().backward()
    assert X.grad is not None and torch.isfinite(X.grad).all()
    with pytest.raises(ValueError, match="output_indices"):
        fitted.posterior(X.detach(), output_indices=[1])


@pytest.mark.parametrize("name", ["eubo", "qeubo", "qnei", "qlognei", "qsr"])
def test_botorch_acquisition_functions_run(fitted, name):
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([64]), seed=0)
    acqf = {
        "eubo": lambda: AnalyticExpectedUtilityOfBestOption(pref_model=fitted),
        "qeubo": lambda: qExpectedUtilityOfBestOption(pref_model=fitted, sampler=sampler),
        "qnei": lambda: qNoisyExpectedImprovement(fitted, X_baseline=fitted.datapoints, sampler=sampler),
        "qlognei": lambda: qLogNoisyExpectedImprovement(fitted, X_baseline=fitted.datapoints, sampler=sampler),
        "qsr": lambda: qSimpleRegret(fitted, sampler=sampler),
    }[name]()
    X = torch.rand(4, 2, 2, dtype=torch.float64, requires_grad=True)
    value = acqf(X)
    assert value.shape == (4,) and torch.isfinite(value).all()
    value.sum().backward()
    assert torch.isfinite(X.grad).all()


def test_optimize_eubo_proposes_a_pair(fitted):
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    acqf = AnalyticExpectedUtilityOfBestOption(pref_model=fitted)
    candidates, value = optimize_acqf(acqf, bounds=bounds, q=2, num_restarts=2, raw_samples=32)
    assert candidates.shape == (2, 2) and torch.isfinite(value)


def test_fit_at_fixed_hyperparameters_with_more_datapoints_than_comparisons():
    # a BO loop's data: every comparison between two fresh points (2m datapoints, m comparisons)
    X, _ = _data(12, 1, seed=3)
    comparisons = torch.tensor([[1, 0], [2, 3], [5, 4], [6, 7], [9, 8], [10, 11]])
    model = PairwiseAugmentedGP(X, comparisons)
    trace = model.fit(learn_hyperparameters=False, max_iter=30)
    assert trace.elbo
    with torch.no_grad():
        mean = model.posterior(X).mean.squeeze(-1)
    assert torch.isfinite(mean).all() and float((mean[comparisons[:, 0]] - mean[comparisons[:, 1]]).mean()) > 0


def test_bad_input_raises_naming_it():
    X = torch.rand(4, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="comparisons"):
        PairwiseAugmentedGP(X, torch.tensor([[0, 4]]))
    with pytest.raises(ValueError, match="comparisons"):
        PairwiseAugmentedGP(X, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="datapoints"):
        PairwiseAugmentedGP(X[0], torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="datapoints"):
        PairwiseAugmentedGP(torch.full((4, 2), float("nan"), dtype=torch.float64), torch.tensor([[0, 1]]))


@pytest.mark.parametrize(
    "make_X, message",
    [
        (lambda: torch.rand(3, 5, dtype=torch.float64), r"^X must have shape \(\.\.\., q, 2\).*got shape \(3, 5\)"),
        (lambda: torch.rand(3, dtype=torch.float64), r"^X must have shape \(\.\.\., q, 2\).*got shape \(3,\)"),
        (lambda: torch.full((3, 2), float("nan"), dtype=torch.float64), r"^X contains non-finite values"),
        (lambda: torch.rand(3, 2, dtype=torch.float32), r"^X has dtype torch.float32 but the model's parameters"),
    ],
    ids=["wrong-dimension", "1-D", "nan", "float32"],
)
def test_posterior_checks_its_inputs(fitted, make_X, message):
    """They raised raw errors, and a 1-D X was accepted silently."""
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=message):
        fitted.posterior(make_X())


def test_posterior_accepts_numpy_inputs(fitted):
    X = torch.linspace(0.0, 1.0, 6, dtype=torch.float64).reshape(3, 2)
    expected = fitted.posterior(X).mean
    torch.testing.assert_close(fitted.posterior(X.numpy()).mean, expected)


# ---------------------------------------------------------------------------------------------- PairwiseGP drop-in
from botorch.fit import fit_gpytorch_mll  # noqa: E402
from botorch.models.pairwise_gp import PairwiseLaplaceMarginalLogLikelihood  # noqa: E402
from botorch.models.transforms import Normalize  # noqa: E402


def test_exact_path_is_the_cavi_fixed_point_of_the_full_variational_gp():
    # the exact path (no inducing points) and CAVI on the full variational GP (inducing points = datapoints) solve the
    # same problem: same q(f) at fixed hyper-parameters
    X, comparisons = _data(14, 40, seed=5)
    exact = PairwiseAugmentedGP(X, comparisons)
    sparse = PairwiseAugmentedGP(X, comparisons, inducing_points=X)
    sparse.covar_module.load_state_dict(exact.covar_module.state_dict())
    exact.fit(learn_hyperparameters=False)
    sparse.fit(learn_hyperparameters=False, max_iter=500, tol=1e-12)
    X_test = torch.rand(6, 2, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    with torch.no_grad():
        a, b = exact.posterior(X_test), sparse.posterior(X_test)
    torch.testing.assert_close(a.mean, b.mean, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(a.covariance_matrix, b.covariance_matrix, atol=1e-5, rtol=1e-4)


def test_fit_gpytorch_mll_with_pairwise_gps_mll_and_an_input_transform():
    X, comparisons = _data(20, 80, seed=7)
    model = PairwiseAugmentedGP(10 * X + 3, comparisons, input_transform=Normalize(d=2))
    before = model.covar_module.base_kernel.lengthscale.detach().clone()
    mll = fit_gpytorch_mll(PairwiseLaplaceMarginalLogLikelihood(model.likelihood, model))
    assert not mll.training and not torch.equal(before, model.covar_module.base_kernel.lengthscale.detach())
    # the transform maps the raw inputs to the unit square: the same utility as the model on X
    plain = PairwiseAugmentedGP(X, comparisons)
    plain.fit()
    X_test = torch.rand(30, 2, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    with torch.no_grad():
        mean_t = model.posterior(10 * X_test + 3).mean.squeeze(-1)
        mean_p = plain.posterior(X_test).mean.squeeze(-1)
    assert float(torch.corrcoef(torch.stack([mean_t, mean_p]))[0, 1]) > 0.95
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([32]), seed=0)
    candidates = 10 * torch.rand(3, 2, 2, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    value = qExpectedUtilityOfBestOption(pref_model=model, sampler=sampler)(candidates)
    assert value.shape == (3,) and torch.isfinite(value).all()


def test_set_train_data_and_condition_on_observations_warm_start():
    X, comparisons = _data(20, 60, seed=9)
    old = (comparisons < 16).all(-1)
    comparisons = torch.cat([comparisons[old], comparisons[~old]])  # a BO loop appends comparisons
    model = PairwiseAugmentedGP(X[:16], comparisons[: int(old.sum())])
    model.fit()
    assert model.train_inputs[0] is model.datapoints and model.train_targets is model.comparisons
    hyper = {k: v.clone() for k, v in model.covar_module.state_dict().items()}
    # condition_on_observations: a copy with two new points and one comparison between them, kernel unchanged
    new = model.condition_on_observations(X[16:18], torch.tensor([[1, 0]]))
    assert (new.n, new.m) == (model.n + 2, model.m + 1) and torch.equal(new.comparisons[-1], torch.tensor([17, 16]))
    assert model.n == 16  # the original is untouched
    for k, v in new.covar_module.state_dict().items():
        torch.testing.assert_close(v, hyper[k])
    reference = PairwiseAugmentedGP(new.datapoints, new.comparisons)
    reference.covar_module.load_state_dict(new.covar_module.state_dict())
    reference.fit(learn_hyperparameters=False)
    X_test = torch.rand(5, 2, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(new.posterior(X_test).mean, reference.posterior(X_test).mean, atol=1e-6, rtol=1e-5)
    # set_train_data keeps the tilts of the leading comparisons and the kernel; the refit starts from them
    model.set_train_data(X, comparisons, update_model=False)
    assert model.m == 60 and torch.count_nonzero(model._tilts[: int(old.sum())]) == int(old.sum())
    warm = model.fit()
    cold = PairwiseAugmentedGP(X, comparisons).fit()
    assert len(warm.elbo) <= len(cold.elbo) and abs(warm.elbo[-1] - cold.elbo[-1]) < 1e-4
    with pytest.raises(ValueError, match="Y must be"):
        model.condition_on_observations(X[:2], torch.tensor([[[1, 0]]]))
    with pytest.raises(ValueError, match="unknown option"):
        model.fit(maxiter=3)


def test_takes_pairwise_gps_likelihood_keyword_for_the_logistic_link():
    from botorch.models.likelihoods.pairwise import PairwiseLogitLikelihood, PairwiseProbitLikelihood

    X, comparisons = _data(6, 5, seed=13)
    PairwiseAugmentedGP(X, comparisons, likelihood=PairwiseLogitLikelihood())
    with pytest.raises(ValueError, match="likelihood"):
        PairwiseAugmentedGP(X, comparisons, likelihood=PairwiseProbitLikelihood())


def test_posterior_refuses_bad_x_naming_it(fitted):
    torch.manual_seed(12)
    for bad in (torch.rand(3, dtype=torch.float64), torch.rand(2, 3, dtype=torch.float64),
                torch.full((2, 2), float("nan"), dtype=torch.float64)):  # fmt: skip
        with pytest.raises(ValueError, match="X"):
            fitted.posterior(bad)
    with pytest.raises(ValueError, match="X has dtype torch.float32"):  # the model's dtype, said rather than cast
        fitted.posterior(torch.rand(2, 2, dtype=torch.float32))
