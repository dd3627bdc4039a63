"""AugmentedELBO: the augmented bound as a GPyTorch MLL (value, bound, envelope-theorem gradients, training)."""

from __future__ import annotations

import gpytorch
import pytest
import torch

from gpytorch_augment import (
    CAVI,
    AugmentedELBO,
    BernoulliLogitLikelihood,
    CAVIVariationalStrategy,
    UnwhitenedCAVIVariationalStrategy,
)
from tests.models import SVGP

STRATEGIES = [CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy]


def _problem(n: int = 40, m: int = 10, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    f = 0.5 + 2 * torch.sin(2 * x.squeeze(-1))
    y = torch.bernoulli(torch.sigmoid(f), generator=g)
    z = torch.linspace(-3, 3, m).unsqueeze(-1)
    return x, y, z


def _fitted(strategy_cls, steps: int = 3, learn_inducing_locations: bool = False, **kwargs):
    x, y, z = _problem(**kwargs)
    model = SVGP(z, strategy_cls=strategy_cls, mean_constant=0.4, learn_inducing_locations=learn_inducing_locations)
    likelihood = BernoulliLogitLikelihood()
    cavi = CAVI(model, likelihood, num_data=len(y))
    for _ in range(steps):
        cavi.step(x, y)
    model.train()
    return model, likelihood, cavi, x, y


def _collapsed_objective(model, likelihood, x, y):
    r"""(Σ_i ℓ*_i − KL(q(u)‖p(u))) / N with autograd through everything."""
    out = model(x)
    ell = likelihood.collapsed_bound(y, out.mean, out.variance).sum(-1)
    return (ell - model.variational_strategy.kl_divergence()) / y.shape[-1]


@pytest.mark.parametrize("strategy_cls", STRATEGIES)
@pytest.mark.parametrize("steps", [0, 3])
def test_value_is_the_collapsed_bound_of_cavi(strategy_cls, steps):
    model, likelihood, cavi, x, y = _fitted(strategy_cls, steps=steps)
    mll = AugmentedELBO(likelihood, model, num_data=len(y))
    with torch.no_grad():
        value = mll(model(x), y)
        per_datum = _collapsed_objective(model, likelihood, x, y)
    assert value.shape == torch.Size([])
    assert float(value) == pytest.approx(float(cavi.elbo(x, y)), abs=1e-10)
    assert float(value) == pytest.approx(float(per_datum), abs=1e-10)


@pytest.mark.parametrize("strategy_cls", STRATEGIES)
def test_value_is_below_gpytorch_variational_elbo(strategy_cls):
    for steps in (0, 1, 5):
        model, likelihood, _, x, y = _fitted(strategy_cls, steps=steps)
        with torch.no_grad():
            augmented = AugmentedELBO(likelihood, model, num_data=len(y))(model(x), y)
            true = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=len(y))(model(x), y)
        assert float(augmented) <= float(true) + 1e-10
        assert float(true - augmented) > 1e-3  # the mean-field gap is real, not a coincidence of equal numbers


@pytest.mark.parametrize("strategy_cls", STRATEGIES)
def test_hyperparameter_gradients_are_those_of_the_collapsed_bound(strategy_cls):
    """Envelope theorem (docs/maths/engines.md): q(Ω) detached at its optimum gives the gradient of Σ ℓ*_i."""
    model, likelihood, _, x, y = _fitted(strategy_cls, learn_inducing_locations=True)
    params = dict(model.named_hyperparameters())
    assert {
        "mean_module.raw_constant",
        "covar_module.raw_outputscale",
        "covar_module.base_kernel.raw_lengthscale",
        "variational_strategy.inducing_points",
    } <= set(params)
    mll = AugmentedELBO(likelihood, model, num_data=len(y))
    ours = torch.autograd.grad(mll(model(x), y), list(params.values()))
    reference = torch.autograd.grad(_collapsed_objective(model, likelihood, x, y), list(params.values()))
    for name, a, b in zip(params, ours, reference):
        assert b.abs().max() > 1e-6, f"{name}: vanishing reference gradient makes the check vacuous"
        torch.testing.assert_close(a, b, rtol=0, atol=1e-8, msg=f"gradient of {name}")


@pytest.mark.parametrize("strategy_cls", STRATEGIES)
def test_a_given_kl_divergence_replaces_the_strategys(strategy_cls):
    """kl_divergence= (what CAVI's fused hyper-parameter step passes) combines the terms as GPyTorch does."""
    model, likelihood, _, x, y = _fitted(strategy_cls, learn_inducing_locations=True)
    model.covar_module.register_prior("outputscale_prior", gpytorch.priors.GammaPrior(2.0, 1.0), "outputscale")
    params = list(model.hyperparameters())
    mll = AugmentedELBO(likelihood, model, num_data=len(y))
    value = mll(model(x), y)
    reference = torch.autograd.grad(value, params)
    out = model(x)
    kl = model.variational_strategy.kl_divergence()  # right after the forward (unwhitened: call order matters)
    given = mll(out, y, kl_divergence=kl)
    torch.testing.assert_close(given, value, rtol=0, atol=1e-14)
    for a, b in zip(torch.autograd.grad(given, params), reference):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-14)
    with torch.no_grad():  # the value is that of the given KL
        shifted = mll(model(x), y, kl_divergence=kl.detach() + len(y))
    assert float(shifted) == pytest.approx(float(value) - 1.0, abs=1e-12)


def test_detached_q_aux_matters_only_through_the_envelope():
    """Sanity check of the check: without the optimum (a fixed, wrong q(Ω)) the gradients differ."""
    model, likelihood, _, x, y = _fitted(CAVIVariationalStrategy)
    params = list(model.hyperparameters())
    out = model(x)
    wrong = {"c": (out.mean**2 + 2 * out.variance).sqrt().detach()}
    ell = likelihood.elbo_terms(y, wrong, out.mean, out.variance).sum()
    value = (ell - model.variational_strategy.kl_divergence()) / len(y)
    wrong_grads = torch.autograd.grad(value, params)
    reference = torch.autograd.grad(_collapsed_objective(model, likelihood, x, y), params)
    assert max(float((a - b).abs().max()) for a, b in zip(wrong_grads, reference)) > 1e-4


@pytest.mark.parametrize("strategy_cls", STRATEGIES)
def test_adam_on_hyperparameters_increases_it(strategy_cls):
    model, likelihood, _, x, y = _fitted(strategy_cls, steps=10)
    mll = AugmentedELBO(likelihood, model, num_data=len(y))
    optimizer = torch.optim.Adam(model.hyperparameters(), lr=0.02)
    with torch.no_grad():
        before = float(mll(model(x), y))
    values = []
    for _ in range(10):
        optimizer.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        optimizer.step()
        values.append(-loss.item())
    with torch.no_grad():
        after = float(mll(model(x), y))
    assert values[0] == pytest.approx(before, abs=1e-12)
    assert after > before + 1e-4


def test_rejects_a_likelihood_that_is_not_augmented():
    model, _, _, _, y = _fitted(CAVIVariationalStrategy, steps=0)
    with pytest.raises(TypeError, match="AugmentedLikelihood"):
        AugmentedELBO(gpytorch.likelihoods.BernoulliLikelihood(), model, num_data=len(y))
