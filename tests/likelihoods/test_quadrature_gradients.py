"""The default expected log-likelihood (Gauss--Hermite of ``log_prob_at``) takes its derivatives in the marginal means
and variances from ``log_prob_and_grad`` at the nodes (``_numerics.gauss_hermite_expectation``): value and gradients
equal autograd through the rule, for every registered likelihood that uses the default; with a likelihood parameter
that needs a gradient it differentiates through the rule (that parameter gets its gradient)."""

from __future__ import annotations

import pytest
import torch

from gpytorch_augment._numerics import gauss_hermite, gauss_hermite_expectation
from gpytorch_augment.inference.engine import diagonal_gaussian
from gpytorch_augment.likelihoods import AugmentedLikelihood
from gpytorch_augment.likelihoods.augmented_likelihood import NUM_QUADRATURE_LOCS
from tests.likelihoods.registry import CASES, PRIMARY

DEFAULT_RULE = [
    case for case in CASES
    if case.make().num_latents == 1 and type(case.make()).expected_log_lik is AugmentedLikelihood.expected_log_lik
]  # fmt: skip


def _marginals(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mean = 1.5 * torch.randn(n, generator=g, dtype=torch.float64)
    var = torch.rand(n, generator=g, dtype=torch.float64) * 2 + 1e-3
    return mean, var


def test_some_likelihoods_use_the_default_rule():
    assert {"bernoulli_logit", "poisson_logit"} <= {case.name for case in DEFAULT_RULE}


@pytest.mark.parametrize("case", DEFAULT_RULE, ids=lambda c: c.name)
def test_expected_log_lik_gradients_equal_autograd_through_the_rule(case):
    likelihood = case.make()
    for p in likelihood.parameters():
        p.requires_grad_(False)
    mean, var = _marginals(11, 0)
    g = torch.Generator().manual_seed(1)
    kwargs = case.make_kwargs(torch.Size([11]), g)
    y = likelihood.check_targets(case.sample_targets(mean, g, **kwargs), **kwargs)
    m, s = mean.clone().requires_grad_(True), var.clone().requires_grad_(True)
    value = likelihood.expected_log_lik(y, diagonal_gaussian(likelihood, m, s), **kwargs)
    d_m, d_s = torch.autograd.grad(value.sum(), (m, s))
    m0, s0 = mean.clone().requires_grad_(True), var.clone().requires_grad_(True)
    nodes, weights = gauss_hermite(m0, s0, NUM_QUADRATURE_LOCS)
    reference = (weights * likelihood.log_prob_at(y, nodes, **kwargs)).sum(0)
    ref_m, ref_s = torch.autograd.grad(reference.sum(), (m0, s0))
    scale = 1.0 + float(reference.detach().abs().max())
    for a, b in ((value, reference), (d_m, ref_m), (d_s, ref_s)):
        assert float((a - b).abs().max()) <= 1e-10 * scale


def test_a_likelihood_parameter_that_needs_a_gradient_gets_it():
    case = next(c for c in PRIMARY if c.name == "poisson_logit")
    likelihood = case.make()
    assert any(p.requires_grad for p in likelihood.parameters())
    mean, var = _marginals(7, 2)
    y = torch.tensor([0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 5.0], dtype=torch.float64)
    value = likelihood.expected_log_lik(y, diagonal_gaussian(likelihood, mean, var))
    grads = torch.autograd.grad(value.sum(), [p for p in likelihood.parameters() if p.requires_grad])
    assert all(float(gr.abs().sum()) > 0 for gr in grads)


def test_gauss_hermite_expectation_by_hand():
    # E f^3 = m^3 + 3 m s: d/dm = 3 m^2 + 3 s, d/ds = 3 m; a negative variance reads as 0 and gets no gradient
    m = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    s = torch.tensor([2.0, 0.25, -1.0], dtype=torch.float64, requires_grad=True)
    e = gauss_hermite_expectation(lambda f: (f**3, 3 * f**2), m, s, num_locs=8)
    e.sum().backward()
    sv = s.detach().clamp_min(0)
    torch.testing.assert_close(e.detach(), m.detach() ** 3 + 3 * m.detach() * sv, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(m.grad, 3 * m.detach() ** 2 + 3 * sv, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s.grad, torch.tensor([1.5, -3.0, 0.0], dtype=torch.float64), rtol=1e-12, atol=1e-12)
