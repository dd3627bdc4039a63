"""The shared numerics (``gpytorch_augment._numerics``) against closed forms and independent references."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.functional import logsigmoid

from gpytorch_augment import _numerics as nx
from gpytorch_augment.likelihoods import (
    AugmentedLikelihood,
    BernoulliLogitLikelihood,
    HeteroscedasticGaussianLikelihood,
    LogisticSoftmaxLikelihood,
)
from gpytorch_augment.likelihoods.augmented_likelihood import validated_latent_blocks


def test_pg_tilt_c_and_student_t_normaliser() -> None:
    m, s = torch.tensor([-2.0, 0.0, 3.0]), torch.tensor([0.5, 2.0, 0.0])
    torch.testing.assert_close(nx.pg_tilt_c(m, s), (m**2 + s).sqrt(), rtol=0, atol=0)
    df = torch.tensor([0.7, 4.0, 50.0])
    reference = torch.distributions.StudentT(df).log_prob(torch.zeros(3))
    torch.testing.assert_close(nx.student_t_log_normaliser(df), reference, rtol=1e-13, atol=0)


def test_log_trapezoid_integrates_a_gaussian() -> None:
    lo, hi = torch.tensor([-40.0, -30.0]), torch.tensor([40.0, 30.0])
    value = nx.log_trapezoid(lambda u: -0.5 * u**2, lo, hi)
    torch.testing.assert_close(value, torch.full((2,), 0.5 * math.log(2 * math.pi)), rtol=1e-13, atol=0)


def test_expected_log1p_square_matches_fine_gauss_hermite_where_that_is_accurate() -> None:
    d2, var, c = torch.tensor([0.0, 1.0, 9.0]), torch.tensor([0.3, 1.0, 0.1]), torch.tensor([4.0, 10.0, 2.0])
    nodes, weights = nx.gauss_hermite(torch.zeros(3), var, 200)
    reference = (weights * torch.log1p((d2.sqrt() - nodes) ** 2 / c)).sum(0)
    torch.testing.assert_close(nx.expected_log1p_square(d2, var, c), reference, rtol=1e-10, atol=0)


@pytest.mark.parametrize("J", [2, 4])
def test_latent_expectation_moments(J: int) -> None:
    mean = torch.randn(5, J, generator=torch.Generator().manual_seed(0))
    var = torch.rand(5, J, generator=torch.Generator().manual_seed(1))
    tol = 1e-12 if J in nx.PRODUCT_RULE_NODES else 2e-2
    torch.testing.assert_close(nx.latent_expectation(lambda f: f, mean, var), mean, rtol=0, atol=tol)
    torch.testing.assert_close(nx.latent_expectation(lambda f: f**2, mean, var), mean**2 + var, rtol=0, atol=tol)


@pytest.mark.parametrize("offset", [None, 0.7], ids=["no-offset", "offset"])
def test_additive_product_rule_is_the_product_rule(offset) -> None:
    g = torch.Generator().manual_seed(2)
    mean, var = torch.randn(6, 2, generator=g), torch.rand(6, 2, generator=g)
    log_scales = torch.randn(6, 2, generator=g)
    b = None if offset is None else torch.full((6,), offset)

    def terms(f: torch.Tensor) -> torch.Tensor:
        t = (log_scales + logsigmoid(f)).exp()
        return t if b is None else torch.cat([t, b.expand(*t.shape[:-1]).unsqueeze(-1)], -1)

    log_total = nx.latent_expectation(lambda f: terms(f).sum(-1).log(), mean, var)
    ratios = nx.latent_expectation(lambda f: (lambda t: t / t.sum(-1, keepdim=True))(terms(f)), mean, var)
    torch.testing.assert_close(nx.additive_product_rule(logsigmoid, mean, var, log_scales, b), log_total)
    torch.testing.assert_close(nx.additive_product_rule(logsigmoid, mean, var, log_scales, b, ratios=True), ratios)


def test_bounded_maximise_finds_the_maximum_and_keeps_a_better_incumbent() -> None:
    targets = torch.tensor([0.3, -0.95, 0.999])
    best = nx.bounded_maximise(lambda x: -((x - targets) ** 2), -1.0, 1.0, torch.zeros(3))
    torch.testing.assert_close(best, targets, rtol=0, atol=1e-9)
    incumbent = targets.clone()
    kept = nx.bounded_maximise(lambda x: -((x - targets) ** 2), -1.0, 1.0, incumbent)
    assert torch.equal(kept, incumbent)


def test_safeguarded_newton_cube_root() -> None:
    root = nx.safeguarded_newton(lambda x: (x**3 - 2, 3 * x**2), torch.tensor(0.0), torch.tensor(2.0), increasing=True)
    assert float(root) == pytest.approx(2 ** (1 / 3), rel=1e-12)


def test_validated_latent_blocks() -> None:
    assert AugmentedLikelihood.latent_blocks is None
    assert validated_latent_blocks(BernoulliLogitLikelihood()) is None
    likelihood = HeteroscedasticGaussianLikelihood()
    assert validated_latent_blocks(likelihood) == [[0], [1]]
    likelihood.latent_blocks = [[1, 0]]
    assert validated_latent_blocks(likelihood) is None
    likelihood.latent_blocks = [[0]]
    with pytest.raises(ValueError, match=r"must partition the latents 0..1; got \[\[0\]\]"):
        validated_latent_blocks(likelihood)
    multiclass = LogisticSoftmaxLikelihood(3)
    multiclass.latent_blocks = [[0, 2], [1, 1]]
    with pytest.raises(ValueError, match="latent_blocks"):
        validated_latent_blocks(multiclass)
