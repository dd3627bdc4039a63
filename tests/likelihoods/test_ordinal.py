"""The ordinal (cumulative-logit) likelihood beyond the protocol suite: the factorisation of a class probability,
the ordered parametrisation of the cut-points, the predictive, learning the cut-points and input checks."""

from __future__ import annotations

import math

import gpytorch
import pytest
import torch

from gpytorch_augment import CAVI, OrdinalLogitLikelihood
from gpytorch_augment.testing import make_cavi_model


def _direct(b: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Class probabilities sigma(b_{k+1} - f) - sigma(b_k - f), written out."""
    cuts = torch.cat([b.new_tensor([-math.inf]), b, b.new_tensor([math.inf])])
    cdf = torch.sigmoid(cuts - f.unsqueeze(-1))
    return cdf[..., 1:] - cdf[..., :-1]


def test_factorised_class_probabilities_match_the_difference_of_logistics():
    b = torch.tensor([-1.3, -0.2, 0.4, 2.5], dtype=torch.float64)
    likelihood = OrdinalLogitLikelihood(5, cutpoints=b).double()
    f = torch.linspace(-6, 6, 41, dtype=torch.float64)
    direct = _direct(b, f)
    factorised = likelihood.forward(f).probs
    assert torch.allclose(factorised, direct, rtol=1e-12, atol=1e-15)
    # sigma(b_u - f) sigma(f - b_l) (1 - exp(b_l - b_u)) for a middle class, by hand
    k = 2
    by_hand = torch.sigmoid(b[k] - f) * torch.sigmoid(f - b[k - 1]) * (1 - torch.exp(b[k - 1] - b[k]))
    assert torch.allclose(factorised[:, k], by_hand, rtol=1e-12)
    # far in the tails the log-probabilities stay finite and accurate
    far = torch.tensor([-60.0, 60.0], dtype=torch.float64)
    log_p = likelihood.log_prob_at(torch.tensor([4.0, 0.0], dtype=torch.float64), far)
    expected = torch.stack([-(60 + b[-1]), -(60 - b[0])])  # log sigma(-62.5), log sigma(-61.3)
    assert torch.isfinite(log_p).all() and torch.allclose(log_p, expected, rtol=1e-10)


def test_cutpoints_stay_ordered_for_any_raw_value_and_round_trip():
    likelihood = OrdinalLogitLikelihood(4, cutpoints=[-2.0, 0.5, 0.51]).double()
    assert torch.allclose(likelihood.cutpoints, torch.tensor([-2.0, 0.5, 0.51], dtype=torch.float64))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        likelihood.raw_cutpoints.copy_(10 * torch.randn(3, generator=generator, dtype=torch.float64))
    b = likelihood.cutpoints
    assert bool((b[1:] > b[:-1]).all())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_classes": 1}, "num_classes"),
        ({"num_classes": 3, "cutpoints": [0.0, 0.0]}, "cutpoints"),
        ({"num_classes": 3, "cutpoints": [0.0]}, "cutpoints"),
        ({"num_classes": 3, "cutpoints": [0.0, math.nan]}, "cutpoints"),
    ],
)
def test_bad_construction_raises_naming_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OrdinalLogitLikelihood(**kwargs)


def test_bad_labels_raise():
    likelihood = OrdinalLogitLikelihood(3)
    for bad in ([0.0, 3.0], [0.5, 1.0], [-1.0, 0.0]):
        with pytest.raises(ValueError, match="labels y"):
            likelihood.check_targets(torch.tensor(bad))


def test_predictive_integrates_the_latent_variance():
    b = torch.tensor([-1.0, 0.2, 1.1], dtype=torch.float64)
    likelihood = OrdinalLogitLikelihood(4, cutpoints=b).double()
    mean = torch.tensor([-2.0, 0.0, 1.5], dtype=torch.float64)
    var = torch.tensor([0.3, 2.0, 4.0], dtype=torch.float64)
    q_f = gpytorch.distributions.MultivariateNormal(mean, torch.diag(var))
    probs = likelihood.marginal(q_f).probs
    generator = torch.Generator().manual_seed(3)
    draws = mean + var.sqrt() * torch.randn(400_000, 3, generator=generator, dtype=torch.float64)
    monte_carlo = _direct(b, draws)
    se = monte_carlo.std(0) / math.sqrt(draws.shape[0])
    assert ((probs - monte_carlo.mean(0)).abs() < 5 * se + 1e-12).all()
    assert torch.allclose(probs.sum(-1), torch.ones(3, dtype=torch.float64))


def test_one_call_fit_learns_the_cutpoints():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    n, true_b = 200, torch.tensor([-2.0, 0.0, 2.0], dtype=torch.float64)
    x = torch.rand(n, 1, generator=generator, dtype=torch.float64) * 6 - 3
    f = 2.5 * torch.sin(1.3 * x.squeeze(-1))
    y = torch.multinomial(_direct(true_b, f), 1, generator=generator).squeeze(-1).double()
    likelihood = OrdinalLogitLikelihood(4, cutpoints=[-0.3, 0.0, 0.3]).double()
    model = make_cavi_model(1, torch.linspace(-3, 3, 15, dtype=torch.float64).unsqueeze(-1)).double()
    model.mean_module.raw_constant.requires_grad_(False)  # a constant mean would be confounded with b_1
    cavi = CAVI(model, likelihood, num_data=n)
    before = float(-likelihood.marginal(model(x)).log_prob(y).mean())
    cavi.fit(x, y, learn_hyperparameters=True, max_iter=60)
    b = likelihood.cutpoints.detach()
    after = float(-likelihood.marginal(model(x)).log_prob(y).mean())
    assert after < before - 0.1
    assert bool((b[1:] > b[:-1]).all()) and float(b[-1] - b[0]) > 2.0  # spread out from 0.6 towards 4
    # the level of f and the cut-points trade off against each other (a shift of both leaves p(y | x) unchanged):
    # compare the gaps between cut-points, which are identified, and the class probabilities
    gaps, true_gaps = b[1:] - b[:-1], true_b[1:] - true_b[:-1]
    assert float((gaps - true_gaps).abs().max()) < 0.5, gaps
    with torch.no_grad():
        fitted = likelihood.marginal(model(x)).probs
    assert float((fitted - _direct(true_b, f)).abs().mean()) < 0.06


@pytest.mark.parametrize("cutpoints", [None, [0.0, 1.0], [-1.0, 0.0], [0.0, 1.0, 2.0]])
def test_cutpoint_gradient_is_finite_when_an_end_cutpoint_is_zero(cutpoints):
    # the default OrdinalLogitLikelihood(2) has its only cut-point at 0; every bound's gradient must match the
    # gradient of the written-out log-probability
    num_classes = 2 if cutpoints is None else len(cutpoints) + 1
    likelihood = OrdinalLogitLikelihood(num_classes, cutpoints=cutpoints).double()
    y = torch.arange(num_classes, dtype=torch.float64).repeat(2)
    f = torch.linspace(-1.5, 1.5, y.numel(), dtype=torch.float64)
    for value in (
        lambda: likelihood.log_prob_at(y, f),
        lambda: likelihood.collapsed_bound(y, f, torch.ones_like(f)),
        lambda: likelihood.expected_log_prob(y, gpytorch.distributions.MultivariateNormal(f, torch.eye(y.numel()))),
    ):
        likelihood.zero_grad()
        value().sum().backward()
        assert torch.isfinite(likelihood.raw_cutpoints.grad).all()
    likelihood.zero_grad()
    likelihood.log_prob_at(y, f).sum().backward()
    raw = likelihood.raw_cutpoints.detach().clone().requires_grad_(True)
    b = torch.cat([raw[:1], raw[:1] + torch.nn.functional.softplus(raw[1:]).cumsum(-1)])
    _direct(b, f).gather(-1, y.long().unsqueeze(-1)).log().sum().backward()
    assert torch.allclose(likelihood.raw_cutpoints.grad, raw.grad, rtol=1e-10, atol=1e-12)
