"""The fully Bayesian BoTorch models (issue #40, item 4): :mod:`gpytorch_augment.fully_bayesian`.

* the batch of draws as BoTorch's fully Bayesian models expose it (``batch_shape``, ``GaussianMixturePosterior``
  with the draws at ``MCMC_DIM``), the mixture's moments against the per-draw means and against
  :meth:`PosteriorSamples.predict` (sampled and fixed θ), the success probability against ``predict``'s;
* BoTorch's acquisition functions: ``qLogExpectedImprovement`` / ``qLogNoisyExpectedImprovement`` with the classifier
  as the constraint model of a ``ModelList`` (:func:`success_constraint`), ``optimize_acqf`` on a small constrained
  problem; the preference model under ``AnalyticExpectedUtilityOfBestOption`` and ``qExpectedUtilityOfBestOption``;
* the errors, each naming its argument.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("botorch")

from botorch.acquisition import qLogExpectedImprovement, qLogNoisyExpectedImprovement  # noqa: E402
from botorch.acquisition.objective import GenericMCObjective  # noqa: E402
from botorch.acquisition.preference import (  # noqa: E402
    AnalyticExpectedUtilityOfBestOption,
    qExpectedUtilityOfBestOption,
)
from botorch.models import ModelList, SingleTaskGP  # noqa: E402
from botorch.models.transforms import Normalize  # noqa: E402
from botorch.optim import optimize_acqf  # noqa: E402
from botorch.posteriors.fully_bayesian import MCMC_DIM, GaussianMixturePosterior  # noqa: E402
from botorch.utils.transforms import is_ensemble  # noqa: E402

from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler  # noqa: E402
from gpytorch_augment.fully_bayesian import (  # noqa: E402
    FullyBayesianAugmentedClassifier,
    FullyBayesianPairwiseGP,
    fit_fully_bayesian_model_gibbs,
    success_constraint,
)

BOUNDS = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _problem(n: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs in [0, 1]^2; the experiment succeeds below the line x0 + x1 = 1.2."""
    X = torch.rand(n, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    return X, X.sum(-1) < 1.2


@pytest.fixture(scope="module")
def classifier() -> FullyBayesianAugmentedClassifier:
    with torch.random.fork_rng():
        torch.set_num_threads(1)
        X, passed = _problem()
        model = FullyBayesianAugmentedClassifier(X, passed.double().unsqueeze(-1))
        fit_fully_bayesian_model_gibbs(model, num_samples=64, warmup=64, thinning=8, num_chains=3, seed=0)
    return model


# ---------------------------------------------------------------------------------------------- the batch
def test_batch_of_draws_as_botorch_exposes_it(classifier):
    S = 3 * 64 // 8
    assert classifier.batch_shape == torch.Size([S]) and classifier.num_mcmc_samples == S
    assert classifier._is_fully_bayesian and is_ensemble(classifier) and classifier.num_outputs == 1
    samples = classifier.samples
    assert samples.hyperparameters["covar_module.base_kernel.lengthscale"].shape == (3, 8, 1, 2)
    assert sorted(samples.prior_parameter_names()) == [
        "covar_module.base_kernel.lengthscale", "covar_module.outputscale", "mean_module.constant",
    ]  # fmt: skip
    X = torch.rand(4, 3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    posterior = classifier.posterior(X)
    assert isinstance(posterior, GaussianMixturePosterior)
    assert posterior.mean.shape == (4, S, 3, 1) and posterior.mixture_mean.shape == (4, 3, 1)
    assert posterior.distribution.covariance_matrix.shape == (4, S, 3, 3)
    assert posterior.rsample(torch.Size([5])).shape == (5, 4, S, 3, 1)
    assert classifier.posterior(X[0]).mean.shape == (S, 3, 1)


def test_mixture_mean_is_the_average_of_the_draws_and_equals_predict(classifier):
    """The mixture's mean is the average of the components' means (``MCMC_DIM``), and mean and variance equal the
    sampler's ``predict`` at the same draws (per-draw conditionals at their own θ); P(success) equals its
    ``y_probs``."""
    x = torch.rand(7, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    posterior = classifier.posterior(x)
    assert torch.allclose(posterior.mixture_mean, posterior.mean.mean(MCMC_DIM), atol=1e-12)
    prediction = classifier.samples.predict(x, joint=False)
    assert torch.allclose(posterior.mixture_mean.squeeze(-1), prediction.f_mean, atol=1e-8)
    assert torch.allclose(posterior.mixture_variance.squeeze(-1), prediction.f_var, atol=1e-6)
    assert torch.allclose(classifier.success_probability(x), prediction.y_probs, atol=1e-6)
    # the draws' θ differ: the components' covariances are not all the same
    cov = posterior.distribution.covariance_matrix
    assert float((cov - cov[:1]).abs().max()) > 1e-3


def test_fixed_theta_is_a_degenerate_batch_matching_predict():
    """Draws of the fixed-θ sampler loaded as the batch: every component has the same covariance (one θ), and the
    mixture equals that sampler's ``predict``."""
    X, passed = _problem()
    model = FullyBayesianAugmentedClassifier(X, passed.double())
    fixed = GibbsSampler(model.prior, BernoulliLogitLikelihood().double(), X, passed.double())
    samples = fixed.sample(10, warmup=20, num_chains=2, seed=3, progress=False)
    model.load_mcmc_samples(samples)
    assert model.batch_shape == torch.Size([20])
    x = torch.rand(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    posterior = model.posterior(x)
    cov = posterior.distribution.covariance_matrix
    assert torch.allclose(cov, cov[:1].expand_as(cov), atol=1e-12)
    prediction = samples.predict(x, joint=False)
    assert torch.allclose(posterior.mixture_mean.squeeze(-1), prediction.f_mean, atol=1e-8)
    assert torch.allclose(posterior.mixture_variance.squeeze(-1), prediction.f_var, atol=1e-6)


def test_posterior_is_differentiable_and_transforms_inputs():
    """Gradients reach X (and no parameter); with ``Normalize`` on inputs scaled by 10 the model equals the one
    fitted on the normalised inputs (same seed, same draws)."""
    X, passed = _problem(12)
    low, high = (10 * X).min(0).values, (10 * X).max(0).values
    plain = FullyBayesianAugmentedClassifier((10 * X - low) / (high - low), passed.double())
    scaled = FullyBayesianAugmentedClassifier(10 * X, passed.double(), input_transform=Normalize(d=2))
    for model in (plain, scaled):
        fit_fully_bayesian_model_gibbs(model, num_samples=8, warmup=8, thinning=4, num_chains=2, seed=5)
    x = torch.rand(3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    expected = plain.posterior((10 * x - low) / (high - low)).mixture_mean
    assert torch.allclose(scaled.posterior(10 * x).mixture_mean, expected, atol=1e-6)
    x_req = x.clone().requires_grad_(True)
    plain.posterior(x_req).mixture_mean.sum().backward()
    assert x_req.grad is not None and bool(torch.isfinite(x_req.grad).all()) and float(x_req.grad.abs().sum()) > 0
    assert all(p.grad is None for p in plain.parameters())


# ---------------------------------------------------------------------------------------------- BoTorch
def test_constrained_log_ei_evaluates_and_optimises(classifier):
    """qLogEI on the objective x0 + x1 with the classifier as the constraint model: the unconstrained maximiser is
    the corner (1, 1), which fails; the constrained candidate stays where success is likely."""
    X, passed = _problem()
    h = X.sum(-1, keepdim=True)
    objective_model = SingleTaskGP(X[passed], h[passed])
    model = ModelList(objective_model, classifier)
    assert is_ensemble(model)
    acqf = qLogExpectedImprovement(
        model, best_f=h[passed].max(), objective=GenericMCObjective(lambda Z, X: Z[..., 0]), **success_constraint(1)
    )
    values = acqf(torch.rand(6, 1, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(7)))
    assert values.shape == (6,) and bool(torch.isfinite(values).all())
    # far inside the failure region the acquisition is much lower than on the boundary's feasible side
    corner, inside = torch.tensor([[[1.0, 1.0]]]).double(), torch.tensor([[[0.6, 0.5]]]).double()
    assert float(acqf(corner).detach()) < float(acqf(inside).detach())
    torch.manual_seed(0)
    candidate, value = optimize_acqf(acqf, bounds=BOUNDS, q=1, num_restarts=2, raw_samples=32)
    assert candidate.shape == (1, 2) and bool(((candidate >= 0) & (candidate <= 1)).all())
    assert float(classifier.success_probability(candidate)) > 0.3


def test_constraint_weight_is_the_success_probability(classifier):
    """BoTorch's smoothed indicator with :func:`success_constraint` is σ(f) per sample: its average over many
    samples of the classifier's posterior is P(success)."""
    from botorch.utils.objective import compute_smoothed_feasibility_indicator

    x = torch.rand(4, 1, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    Z = classifier.posterior(x).rsample(torch.Size([4000]))  # (samples, 4, S, 1, 1)
    kwargs = success_constraint(0)
    weight = compute_smoothed_feasibility_indicator(kwargs["constraints"], Z, kwargs["eta"], fat=kwargs["fat"])
    estimate = weight.mean(dim=(0, 2)).squeeze(-1)
    assert torch.allclose(estimate, classifier.success_probability(x).squeeze(-1), atol=0.02)


def test_noisy_ei_with_the_classifier_constraint(classifier):
    X, passed = _problem()
    objective_model = SingleTaskGP(X[passed], X[passed].sum(-1, keepdim=True))
    acqf = qLogNoisyExpectedImprovement(
        ModelList(objective_model, classifier), X_baseline=X[passed],
        objective=GenericMCObjective(lambda Z, X: Z[..., 0]), **success_constraint(1),
    )  # fmt: skip
    values = acqf(torch.rand(3, 2, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(9)))
    assert values.shape == (3,) and bool(torch.isfinite(values).all())


@pytest.fixture(scope="module")
def preference_model() -> FullyBayesianPairwiseGP:
    with torch.random.fork_rng():
        torch.set_num_threads(1)
        g = torch.Generator().manual_seed(10)
        X = torch.rand(10, 2, dtype=torch.float64, generator=g)
        utility = -((X - 0.3) ** 2).sum(-1)
        pairs = torch.randint(0, 10, (30, 2), generator=g)
        pairs = pairs[pairs[:, 0] != pairs[:, 1]]
        winner_first = torch.where((utility[pairs[:, 0]] >= utility[pairs[:, 1]]).unsqueeze(-1), pairs, pairs.flip(-1))
        model = FullyBayesianPairwiseGP(X, winner_first)
        fit_fully_bayesian_model_gibbs(model, num_samples=32, warmup=32, thinning=4, num_chains=2, seed=0)
    return model


def test_preference_model_under_eubo_and_qeubo(preference_model):
    model = preference_model
    assert model.batch_shape == torch.Size([16]) and model.n == 10 and model.dim == 2 and model.m > 20
    assert model.samples.hyperparameters["covar_module.outputscale"].shape == (2, 8)
    pairs = torch.rand(5, 2, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(11))
    eubo = AnalyticExpectedUtilityOfBestOption(pref_model=model)
    assert eubo(pairs).shape == (5,)
    qeubo = qExpectedUtilityOfBestOption(pref_model=model)
    assert qeubo(pairs).shape == (5,)
    torch.manual_seed(0)
    candidate, _ = optimize_acqf(eubo, bounds=BOUNDS, q=2, num_restarts=2, raw_samples=32)
    assert candidate.shape == (2, 2)
    # the utility is learnt: the mixture's mean at the datapoints correlates with the true utility
    mean = model.posterior(model.datapoints).mixture_mean.squeeze(-1)
    utility = -((model.datapoints - 0.3) ** 2).sum(-1)
    assert float(torch.corrcoef(torch.stack([mean, utility]))[0, 1]) > 0.6


# ---------------------------------------------------------------------------------------------- errors
def test_errors_name_their_argument():
    X, passed = _problem(6)
    Y = passed.double()
    with pytest.raises(ValueError, match="train_X"):
        FullyBayesianAugmentedClassifier(X[:, 0], Y)
    with pytest.raises(ValueError, match="train_X"):
        FullyBayesianAugmentedClassifier(X.masked_fill(torch.eye(6, 2, dtype=torch.bool), math.nan), Y)
    with pytest.raises(ValueError, match="train_Y"):
        FullyBayesianAugmentedClassifier(X, 2 * Y)
    with pytest.raises(ValueError, match="train_Y"):
        FullyBayesianAugmentedClassifier(X, Y[:4])
    with pytest.raises(ValueError, match="covar_module"):
        FullyBayesianAugmentedClassifier(X, Y, covar_module="rbf")
    model = FullyBayesianAugmentedClassifier(X, Y)
    with pytest.raises(RuntimeError, match="fit_fully_bayesian_model_gibbs"):
        model.posterior(X)
    for kwargs, name in (({"num_samples": 0}, "num_samples"), ({"thinning": 0}, "thinning"),
                         ({"num_samples": 4, "thinning": 8}, "num_samples"), ({"num_chains": 1.5}, "num_chains"),
                         ({"warmup": -1}, "warmup")):  # fmt: skip
        with pytest.raises(ValueError, match=name):
            fit_fully_bayesian_model_gibbs(model, **kwargs)
    with pytest.raises(ValueError, match="model must be"):
        fit_fully_bayesian_model_gibbs(SingleTaskGP(X, Y.unsqueeze(-1)))
    with pytest.raises(ValueError, match="output_index"):
        success_constraint("1")
    with pytest.raises(ValueError, match="comparisons"):
        FullyBayesianPairwiseGP(X, torch.tensor([[0, 0]]))
    with pytest.raises(ValueError, match="comparisons"):
        FullyBayesianPairwiseGP(X, torch.tensor([[0, 9]]))
    with pytest.raises(ValueError, match="datapoints"):
        FullyBayesianPairwiseGP(X[0], torch.tensor([[0, 1]]))


def test_fitted_model_errors(classifier):
    with pytest.raises(ValueError, match="output_indices"):
        classifier.posterior(torch.rand(2, 2, dtype=torch.float64), output_indices=[1])
    with pytest.raises(ValueError, match="X"):
        classifier.posterior(torch.rand(2, 3, dtype=torch.float64))
    other = GibbsSampler(classifier.prior, BernoulliLogitLikelihood().double(), torch.rand(5, 2).double(),
                         torch.ones(5).double()).sample(2, warmup=1, seed=0, progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="samples"):
        classifier.load_mcmc_samples(other)
