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
    PoissonLogitLikelihood,
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


@pytest.mark.parametrize("var_scale", [1e-6, 1.0, 1e4])
def test_expected_log1p_square_gradient_from_its_own_quadrature(var_scale: float) -> None:
    g = torch.Generator().manual_seed(3)
    d2 = 3 * torch.rand(6, generator=g, dtype=torch.float64)
    d2[0] = 0.0
    var = var_scale * torch.rand(6, generator=g, dtype=torch.float64) + 1e-3
    c = torch.rand(6, generator=g, dtype=torch.float64) + 0.1
    inputs = tuple(v.requires_grad_() for v in (d2, var, c))
    assert torch.autograd.gradcheck(nx.expected_log1p_square, inputs, eps=1e-6, atol=1e-8, rtol=1e-6)


def test_expected_log1p_square_step_is_fine_enough_on_extreme_ranges() -> None:
    g = torch.Generator().manual_seed(4)
    d2 = 10 ** (30 * torch.rand(400, generator=g, dtype=torch.float64) - 10)
    var = 10 ** (16 * torch.rand(400, generator=g, dtype=torch.float64) - 8)
    c = 10 ** (12 * torch.rand(400, generator=g, dtype=torch.float64) - 6)
    lo, hi = torch.log(c / (c + var + d2)) - nx.LOG_GRID_TAIL, torch.full_like(d2, math.log(nx.LOG_GRID_TAIL))

    def log_integrand(u: torch.Tensor) -> torch.Tensor:
        t = u.exp()
        return torch.log(-torch.expm1(-0.5 * torch.log1p(2 * t * var / c) - t * d2 / (c + 2 * t * var))) - t

    reference = nx.log_trapezoid(log_integrand, lo, hi, 4000).exp()
    torch.testing.assert_close(nx.expected_log1p_square(d2, var, c), reference, rtol=1e-12, atol=0)


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


def test_additive_product_rule_sums_in_logs_where_the_grid_underflows() -> None:
    """Latent variances of 1e6 put grid points where every term is below e^-745: the direct sum underflows to 0
    there, and the rule must take its log-domain branch (checked against logsumexp on the same product grid)."""
    mean = torch.tensor([[0.0, 1.0], [0.5, -0.5]], dtype=torch.float64)
    var = torch.tensor([[1e6, 1e6], [0.3, 0.2]], dtype=torch.float64)
    log_scales = torch.tensor([[0.0, -1.0], [0.2, 0.1]], dtype=torch.float64)
    n = nx.PRODUCT_RULE_NODES[2]
    z, w = nx.gauss_hermite(torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64), n)
    log_t = log_scales.unsqueeze(0) + logsigmoid(mean + var.sqrt() * z.view(n, 1, 1))  # (n, B, 2)
    grid = torch.logaddexp(log_t[:, None, :, 0], log_t[None, :, :, 1])  # (n, n, B)
    weights = (w[:, None] * w[None, :]).unsqueeze(-1)
    assert bool((log_t[:, None, 0, 0] + 0 * log_t[None, :, 0, 1] < -800).any())  # the first row does underflow
    expected_log = (weights * grid).sum((0, 1))
    expected_ratios = torch.stack([(weights * (log_t[:, None, :, 0] - grid).exp()).sum((0, 1)),
                                   (weights * (log_t[None, :, :, 1] - grid).exp()).sum((0, 1))], -1)  # fmt: skip
    torch.testing.assert_close(nx.additive_product_rule(logsigmoid, mean, var, log_scales), expected_log)
    torch.testing.assert_close(nx.additive_product_rule(logsigmoid, mean, var, log_scales, ratios=True),
                               expected_ratios)  # fmt: skip


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


# ---------------------------------------------------------------------------------------------- per-chain constants
def test_constants_evaluate_at_the_values_and_restore_the_parameters() -> None:
    likelihood = PoissonLogitLikelihood(rate_scale=3.0).double()
    raw = likelihood.raw_rate_scale
    before, pointer = raw.detach().clone(), raw.data_ptr()
    per_chain = torch.tensor([[1.5], [4.0]], dtype=torch.float64)
    f = torch.zeros(2, 5, dtype=torch.float64)
    with likelihood.constants({"rate_scale": per_chain}):
        assert raw is likelihood.raw_rate_scale and raw.shape == (2, 1)
        torch.testing.assert_close(likelihood.forward(f).mean, per_chain.expand(2, 5) / 2, rtol=1e-14, atol=0)
    assert raw.data_ptr() == pointer and raw.shape == before.shape and torch.equal(raw.detach(), before)
    with pytest.raises(RuntimeError, match="inside"), likelihood.constants({"rate_scale": per_chain}):
        raise RuntimeError("inside")
    assert raw.data_ptr() == pointer and torch.equal(raw.detach(), before)
    with pytest.raises(ValueError, match=r"no constants \['noise'\]"), likelihood.constants({"noise": per_chain}):
        pass


def _with_prior(name: str, g: torch.Generator):
    """A likelihood with a prior on its constant, targets and three chains of latents."""
    if name == "poisson":
        y = torch.randint(0, 4, (6,), generator=g).double()
        return PoissonLogitLikelihood(2.0, rate_scale_prior=(2.0, 1.0)), y, torch.randn(3, 6, generator=g)
    if name == "heteroscedastic":
        likelihood = HeteroscedasticGaussianLikelihood(2.0, max_precision_prior=(3.0, 1.0))
        return likelihood, torch.randn(6, generator=g), torch.randn(3, 6, 2, generator=g)
    likelihood = LogisticSoftmaxLikelihood(3, learn_class_scales=True, class_scale_prior=(2.0, 1.0))
    return likelihood, torch.randint(0, 3, (6,), generator=g).double(), torch.randn(3, 6, 3, generator=g)


@pytest.mark.parametrize(
    ("name", "key", "width"),
    [("poisson", "rate_scale", 1), ("heteroscedastic", "max_precision", 1), ("logistic_softmax", "class_scales", 3)],
)
def test_sample_hyperparameters_is_pure_and_per_chain(name: str, key: str, width: int) -> None:
    g = torch.Generator().manual_seed(5)
    likelihood, y, f = _with_prior(name, g)
    likelihood = likelihood.double()
    state = {k: v.clone() for k, v in likelihood.state_dict().items()}
    aux = likelihood.sample_aux(y, f, generator=g)
    constants, fresh = likelihood.sample_hyperparameters(y, aux, f, generator=g)
    assert list(constants) == [key] and constants[key].shape == (3, width) and (constants[key] > 0).all()
    for k, v in likelihood.state_dict().items():
        assert v.shape == state[k].shape and torch.equal(v, state[k]), k
    if name == "poisson":
        assert fresh is None
    else:
        assert fresh.keys() == aux.keys() and all(fresh[k].shape == aux[k].shape for k in aux)
    with likelihood.constants(constants):  # the draws are usable as constants
        likelihood.potential_and_precision(y, fresh or aux, f)
    assert AugmentedLikelihood.sample_hyperparameters(likelihood, y, aux, f) == ({}, None)
    without = type(likelihood)(3) if name == "logistic_softmax" else type(likelihood)()
    assert without.sample_hyperparameters(y, aux, f) == ({}, None)


def test_log_normal_matern32_is_the_closed_form_everywhere() -> None:
    # the same two one-sided integrals in 60-digit arithmetic, over residuals and variances far into the tails
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 60

    def exact(d: float, s: float, a: float) -> float:
        d_, s_, a_ = mp.mpf(d), mp.mpf(s), mp.mpf(a)
        sd = mp.sqrt(s_)

        def side(r):
            t = (r - a_ * s_) / sd
            return mp.e ** (-a_ * r + a_ * a_ * s_ / 2) * ((1 + a_ * (r - a_ * s_)) * mp.ncdf(t) + a_ * sd * mp.npdf(t))

        return float(mp.log(a_ / 4 * (side(d_) + side(-d_))))

    for d in (0.0, 0.3, -1.0, 10.0, -40.0, 200.0, 1e4):
        for s in (1e-30, 1e-3, 1.0, 10.0, 1e4, 1e8):
            for a in (0.5, 5.0):
                got = nx.log_normal_matern32(*(torch.tensor(v, dtype=torch.float64) for v in (d, s, a)))
                reference = exact(d, s, a)
                # a handful of roundings of terms of the size of the result
                assert abs(float(got) - reference) <= 1e-14 * max(1.0, abs(reference)), (d, s, a)


def test_split_gauss_legendre_integrates_a_kinked_function() -> None:
    # E|x| in closed form; the rule has no node on the kink and integrates each side's polynomial-times-Gaussian
    mean = torch.tensor([0.0, 0.5, -3.0, 40.0, 1e-3], dtype=torch.float64)
    var = torch.tensor([1.0, 2.0, 0.1, 1.0, 1e-8], dtype=torch.float64)
    x, w = nx.split_gauss_legendre(mean, var)
    exact = (2 * var / math.pi).sqrt() * torch.exp(-(mean**2) / (2 * var)) + mean * torch.erf(mean / (2 * var).sqrt())
    torch.testing.assert_close((w * x.abs()).sum(0), exact, rtol=1e-12, atol=0.0)
    torch.testing.assert_close(w.sum(0), torch.ones_like(mean), rtol=1e-12, atol=0.0)
