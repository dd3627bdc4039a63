"""The model the one-call fit ends with: the data-aware start, the default hyper-priors (MAP), the collapse to a
constant predictor detected and restarted, and the result that says what happened."""

from __future__ import annotations

import math
import warnings

import gpytorch
import pytest
import torch

from gpytorch_augment import CAVI, BernoulliLogitLikelihood, CAVIVariationalStrategy
from gpytorch_augment.inference.collapse import is_constant
from gpytorch_augment.inference.default_priors import default_priors, initial_point
from gpytorch_augment.inference.fit_options import FitOptions
from gpytorch_augment.inference.fit_result import FitStatus
from gpytorch_augment.inference.hyperparameters import fit_hyperparameters


class ARDModel(gpytorch.models.ApproximateGP):
    """The README's SVGP as a GPyTorch user writes it: ARD RBF kernel, GPyTorch's initial values, no priors."""

    def __init__(self, inducing_points: torch.Tensor) -> None:
        q_u = gpytorch.variational.CholeskyVariationalDistribution(inducing_points.size(0))
        super().__init__(CAVIVariationalStrategy(self, inducing_points, q_u))
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.RBFKernel(ard_num_dims=inducing_points.size(-1))
        )

    def forward(self, x: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _ten_inputs(n: int = 200, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The collapse case: ten standard-normal inputs, the label a noiseless function of three of them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g, dtype=torch.float64)
    return x, (x[:, :3].sum(-1) > 0).double()


def _fit(x, y, **options):
    model, likelihood = ARDModel(x[:40].clone()).double(), BernoulliLogitLikelihood()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fit_hyperparameters(CAVI(model, likelihood, num_data=len(y)), x, y, options or None)
    model.eval()
    with torch.no_grad():
        accuracy = float(((likelihood(model(x)).probs > 0.5).double() == y).double().mean())
    return result, model, accuracy, [str(w.message) for w in caught]


def test_ten_inputs_fit_a_non_constant_model_with_the_defaults():
    x, y = _ten_inputs()
    result, model, accuracy, caught = _fit(x, y)
    assert result.status is FitStatus.CONVERGED and result.converged and not caught
    assert accuracy > 0.9 and not is_constant(model, x)
    assert result.objective == "MAP" and result.attempts == ["converged"]
    assert set(result.default_priors) == {"covar_module.base_kernel.lengthscale", "covar_module.outputscale"}
    assert "covar_module.base_kernel.lengthscale_prior" in result.priors
    assert not list(model.named_priors())  # the default priors applied during the fit only


def test_maximum_likelihood_from_gpytorchs_start_collapses_and_says_so():
    """The reported failure, reproduced with the data-aware start and the restarts turned off: the test can fail."""
    x, y = _ten_inputs()
    result, model, accuracy, caught = _fit(x, y, priors=False, initialise=False, collapse_restarts=0)
    assert result.status is FitStatus.COLLAPSED and not result.converged
    assert is_constant(model, x) and accuracy < 0.65
    assert result.objective == "ML-II" and any("constant predictor" in m for m in caught)


def test_a_collapse_restarts_from_the_data_aware_point():
    x, y = _ten_inputs()
    result, model, accuracy, caught = _fit(x, y, priors=False, initialise=False)
    assert result.restarted_after_collapse and result.attempts[0] == "collapsed"
    assert result.converged and accuracy > 0.9 and not is_constant(model, x) and not caught
    assert result.message.startswith("restarted from a data-aware point after a collapse")


def test_the_users_priors_and_initial_values_win():
    x, y = _ten_inputs(n=60)
    model = ARDModel(x[:10].clone()).double()
    user_prior = gpytorch.priors.GammaPrior(3.0, 6.0)
    model.covar_module.base_kernel.register_prior(
        "lengthscale_prior", user_prior, lambda m: m.lengthscale, lambda m, v: m._set_lengthscale(v)
    )
    model.covar_module.base_kernel.lengthscale = 2.0  # an explicit initial value: kept
    assert [p.name for p in default_priors(model, x)] == ["covar_module.outputscale"]
    assert initial_point(model, x) == []
    assert torch.allclose(model.covar_module.base_kernel.lengthscale, torch.tensor(2.0, dtype=torch.float64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = fit_hyperparameters(CAVI(model, BernoulliLogitLikelihood(), num_data=60), x, y, {"max_iter": 3})
    assert result.default_priors == ("covar_module.outputscale",)
    assert result.priors["covar_module.base_kernel.lengthscale_prior"] == repr(user_prior)
    assert [name for name, *_ in model.named_priors()] == ["covar_module.base_kernel.lengthscale_prior"]


def test_the_lengthscale_prior_is_botorchs_on_unit_cube_inputs_and_scales_with_the_inputs():
    """On uniform inputs in [0, 1] (sd 1/sqrt 12) the prior's location is BoTorch's sqrt 2 + ln(D) / 2; inputs ten
    times wider move it by ln 10; its mode is the data-aware start."""
    D = 12
    x = torch.rand(20000, D, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    kernel = gpytorch.kernels.RBFKernel(ard_num_dims=D).double()
    prior = default_priors(kernel, x)[0]
    sampling = 4 / math.sqrt(20000)  # a few standard errors of a sample sd, relative
    assert torch.allclose(prior.prior.loc, torch.full((1, D), math.sqrt(2) + 0.5 * math.log(D), dtype=torch.float64),
                          atol=sampling)  # fmt: skip
    wide = default_priors(kernel, 10 * x)[0]
    assert torch.allclose(wide.prior.loc - prior.prior.loc, torch.full((1, D), math.log(10), dtype=torch.float64))
    initial_point(kernel, x)
    assert torch.allclose(kernel.lengthscale, (prior.prior.loc - 3).exp())


def test_scipy_and_torch_lbfgs_reach_the_same_model():
    x, y = _ten_inputs(n=120, seed=1)
    torch_result, torch_model, _, _ = _fit(x, y)
    scipy_result, scipy_model, _, _ = _fit(x, y, optimizer="scipy")
    assert torch_result.converged and scipy_result.converged and scipy_result.optimizer == "scipy"
    # both stop where every gradient entry per datum is at most gtol = 1e-2: they agree to that resolution
    assert scipy_result.final_objective == pytest.approx(torch_result.final_objective, abs=1e-2)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"lr": 0.1}, "lr applies to the stochastic protocol only"),
        ({"num_epochs": 2}, "num_epochs applies to the stochastic protocol only"),
        ({"restarts": float("inf")}, "restarts must be an integer"),
        ({"max_iter": 2.5}, "max_iter must be an integer"),
        ({"collapse_restarts": -1}, "collapse_restarts must be an integer >= 0"),
        ({"gtol": float("nan")}, "gtol must be a finite number"),
        ({"optimizer": ["torch"]}, "optimizer must be 'torch' or 'scipy'"),
        ({"protocol": None}, "protocol must be one of"),
        ({"initialise": 1}, "initialise must be True or False"),
        ({"learning_rate": 0.1}, "unknown hyper_options"),
    ],
)
def test_options_that_do_not_apply_or_are_out_of_range_are_errors(options, match):
    x, y = _ten_inputs(n=20)
    cavi = CAVI(ARDModel(x[:5].clone()).double(), BernoulliLogitLikelihood(), num_data=20)
    with pytest.raises(ValueError, match=match):
        cavi.fit(x, y, learn_hyperparameters=True, hyper_options=options)


def test_the_stochastic_protocol_takes_its_options_and_refuses_the_nested_ones():
    x, y = _ten_inputs(n=40)
    options = FitOptions(protocol="stochastic", lr=0.05, batch_size=20, num_epochs=2, collapse_restarts=0)
    assert options.resolved("stochastic").tol == 1e-4
    with pytest.raises(ValueError, match="inner_steps applies to the nested and subsample protocols only"):
        FitOptions(protocol="stochastic", inner_steps=2).resolved("stochastic")
    cavi = CAVI(ARDModel(x[:5].clone()).double(), BernoulliLogitLikelihood(), num_data=40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = cavi.fit(x, y, learn_hyperparameters=True, hyper_options=options,
                          generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert result.protocol == "stochastic" and result.optimizer == "adam" and result.num_steps == 4
    assert result.status in (FitStatus.CAP, FitStatus.COLLAPSED) and result.gradient is None


def test_elbo_bound_is_a_nested_option_of_booleans():
    assert FitOptions(elbo_bound=True).resolved("nested").elbo_bound is True
    assert FitOptions().resolved("nested").elbo_bound is False
    with pytest.raises(ValueError, match="elbo_bound must be True or False"):
        FitOptions(elbo_bound=1)
    with pytest.raises(ValueError, match="elbo_bound applies to the nested and subsample protocols only"):
        FitOptions(elbo_bound=True).resolved("stochastic")


@pytest.mark.parametrize("bound", [True, False], ids=["staged", "exact"])
def test_the_staged_fit_optimises_the_bound_first_and_is_judged_on_the_exact_objective(bound):
    """With ``elbo_bound`` a logistic-softmax fit evaluates the Jensen bound first and only the exact
    objective at its end (the stationarity test, the final objective); without it never the bound."""
    from gpytorch_augment import LogisticSoftmaxLikelihood
    from gpytorch_augment.testing import make_cavi_model

    g = torch.Generator().manual_seed(3)
    x = torch.rand(60, 1, generator=g, dtype=torch.float64) * 6 - 3
    y = torch.bucketize(x.squeeze(-1), torch.tensor([-1.0, 1.0], dtype=torch.float64)).double()  # 3 classes
    likelihood = LogisticSoftmaxLikelihood(3).double()
    model = make_cavi_model(3, torch.linspace(-3, 3, 6, dtype=torch.float64).unsqueeze(-1)).double()
    kinds = []
    exact_call = type(likelihood).expected_log_lik  # what the nested objective evaluates (canonical targets)

    def recording(self, *args, **kwargs):
        kinds.append("bound" if self._bounded else "exact")
        return exact_call(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(likelihood), "expected_log_lik", recording)
        result = fit_hyperparameters(CAVI(model, likelihood, num_data=60), x, y, {"elbo_bound": bound})
    assert result.status.value in ("converged", "certified", "not_stationary"), result.message
    assert ("bound" in kinds) is bound and kinds[-1] == "exact"
    if bound:  # one switch: the bound stage, then the exact one
        first_exact = kinds.index("exact", kinds.index("bound"))
        assert "bound" not in kinds[first_exact:]
