r"""The named instances of the generic augmentation (docs/maths/generic.md): :class:`MaternThreeHalvesLikelihood`,
:class:`BayesianSVMLikelihood` and the exact sampler of their mixing variable, :class:`TiltedInverseGamma`
(GIG(-3/2) and GIG(-1/2)). The protocol suite runs both likelihoods through ``registry.CASES``; this module checks
what is specific to them, against SciPy, brute force and the AugmentedGaussianProcesses.jl update formulas.
"""

from __future__ import annotations

import math

import gpytorch
import numpy as np
import pytest
import torch
from scipy import integrate, stats

from gpytorch_augment import (
    CAVI,
    BayesianSVMLikelihood,
    GibbsSampler,
    LaplaceTransformLikelihood,
    MaternThreeHalvesLikelihood,
)
from gpytorch_augment.distributions import MaternThreeHalves, TiltedInverseGamma
from gpytorch_augment.testing import ExplicitPrior, make_cavi_model


@pytest.fixture(autouse=True)
def _float64():
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(dtype)


# ================================================================================================ TiltedInverseGamma
def _scipy_law(nu: float, b: float, r: float):
    r""":math:`\mathrm{GIG}(-\nu, 2r, 2b)` in SciPy's ``geninvgauss(p, \sqrt{AB}, scale=\sqrt{B/A})``; the
    inverse Gamma at :math:`r = 0`."""
    if r == 0:
        return stats.invgamma(nu, scale=b)
    return stats.geninvgauss(-nu, 2 * math.sqrt(b * r), scale=math.sqrt(b / r))


@pytest.mark.parametrize("nu", [0.5, 1.5])
@pytest.mark.parametrize("r", [0.0, 1e-4, 0.3, 5.0, 200.0])
def test_tilted_inverse_gamma_draws_pass_a_ks_test_and_log_prob_is_scipys(nu, r):
    b = 0.7
    law = TiltedInverseGamma(nu, torch.tensor(b), torch.full((4000,), r))
    law_draws = law.sample(generator=torch.Generator().manual_seed(1))  # r = 0: the inverse Gamma law itself
    reference = _scipy_law(nu, b, r)
    assert stats.kstest(law_draws.numpy(), reference.cdf).pvalue > 1e-3
    x = torch.tensor([0.01, 0.3, 2.0])
    expected = torch.as_tensor(reference.logpdf(x.numpy()))
    torch.testing.assert_close(law.log_prob(x.unsqueeze(-1))[:, 0], expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("nu", [0.5, 1.5])
def test_tilted_inverse_gamma_moments_are_the_derivatives_of_log_phi(nu):
    r"""mean :math:`-(\log\varphi)'(r)`, variance :math:`(\log\varphi)''(r)` by autograd, and sample moments."""
    b, r = torch.tensor(0.7), torch.tensor([0.05, 0.5, 2.0, 8.0], requires_grad=True)
    law = TiltedInverseGamma(nu, b, r)
    (d1,) = torch.autograd.grad(law.log_laplace().sum(), r, create_graph=True)
    (d2,) = torch.autograd.grad(d1.sum(), r)
    torch.testing.assert_close(law.mean, -d1, rtol=1e-12, atol=0)
    torch.testing.assert_close(law.variance, d2, rtol=1e-12, atol=0)
    draws = TiltedInverseGamma(nu, b, r.detach()).sample((20000,), generator=torch.Generator().manual_seed(2))
    assert ((draws.mean(0) - law.mean).abs() <= 5 * (law.variance / 20000).sqrt()).all()


def test_tilted_inverse_gamma_ks_check_can_fail():
    """Draws at the tilt r = 0.3 fail the KS test against the law at r = 0.6."""
    draws = TiltedInverseGamma(1.5, torch.tensor(0.7), torch.full((4000,), 0.3)).sample(
        generator=torch.Generator().manual_seed(1)
    )
    assert stats.kstest(draws.numpy(), _scipy_law(1.5, 0.7, 0.6).cdf).pvalue < 1e-3


def test_tilted_inverse_gamma_rejects_other_shapes():
    with pytest.raises(ValueError, match="concentration"):
        TiltedInverseGamma(2.5, 1.0, 1.0)


# ================================================================================================ Matérn-3/2
RHO = 0.6


def test_matern_noise_is_a_normalised_density_with_its_cdf_and_draws():
    noise = MaternThreeHalves(torch.tensor(0.4), torch.tensor(RHO))
    total = integrate.quad(lambda v: math.exp(float(noise.log_prob(torch.tensor(v)))), -np.inf, np.inf)[0]
    assert total == pytest.approx(1.0, abs=1e-10)
    variance = integrate.quad(
        lambda v: (v - 0.4) ** 2 * math.exp(float(noise.log_prob(torch.tensor(v)))), -np.inf, np.inf
    )[0]
    assert variance == pytest.approx(float(noise.variance), rel=1e-9)
    for v in (-1.0, 0.4, 1.3):
        density = lambda t: math.exp(float(noise.log_prob(torch.tensor(t))))  # noqa: E731
        mass = integrate.quad(density, -np.inf, min(v, 0.4))[0] + integrate.quad(density, min(v, 0.4), v)[0]
        assert float(noise.cdf(torch.tensor(v))) == pytest.approx(mass, abs=1e-10)
    draws = noise.sample((4000,), generator=torch.Generator().manual_seed(3))
    assert stats.kstest(draws.numpy(), lambda v: noise.cdf(torch.as_tensor(v)).numpy()).pvalue > 1e-3


def _matern_from_log_phi(rho: float) -> LaplaceTransformLikelihood:
    a = math.sqrt(3) / rho

    def log_phi(r):  # (1 + z) e^{-z}, z = 2 sqrt(r / 4)
        z = torch.sqrt(r)
        return torch.log1p(z) - z

    return LaplaceTransformLikelihood(
        log_phi, log_c=math.log(a / 4), alpha=lambda y: a**2 * y**2, beta=lambda y: 2 * a**2 * y, gamma=a**2,
        real_valued_targets=True,
    )


def test_matern_class_equals_the_instance_from_log_phi_and_the_julia_updates():
    r"""The class against the generic instance built from :math:`\log\varphi` alone (autograd) to 1e-10, and its
    local update against AugmentedGaussianProcesses.jl's ``Matern3_2Likelihood``:
    :math:`\theta = 3/(2\sqrt3 c\rho + 2\rho^2)`, :math:`c = \sqrt{s + (m - y)^2}`, precision :math:`2\theta`,
    potential :math:`2\theta y`."""
    g = torch.Generator().manual_seed(0)
    y, m, s = torch.randn(20, generator=g), torch.randn(20, generator=g), 0.1 + torch.rand(20, generator=g)
    cls, generic = MaternThreeHalvesLikelihood(scale=RHO).double(), _matern_from_log_phi(RHO).double()
    torch.testing.assert_close(cls.log_prob_at(y, m), generic.log_prob_at(y, m), rtol=1e-10, atol=1e-10)
    q_cls, q_gen = cls.aux_posterior(y, m, s), generic.aux_posterior(y, m, s)
    torch.testing.assert_close(cls.elbo_terms(y, q_cls, m, s), generic.elbo_terms(y, q_gen, m, s), rtol=1e-10,
                               atol=1e-10)
    h, lam = cls.expected_potential_and_precision(y, q_cls, m, s)
    c = torch.sqrt(s + (m - y) ** 2)
    theta = 3 / (2 * math.sqrt(3) * c * RHO + 2 * RHO**2)
    torch.testing.assert_close(lam, 2 * theta, rtol=1e-10, atol=0)
    torch.testing.assert_close(h, 2 * theta * y, rtol=1e-10, atol=0)
    torch.testing.assert_close(cls.collapsed_bound(y, m, s), cls.elbo_terms(y, q_cls, m, s), rtol=1e-10, atol=1e-10)


def test_matern_scale_is_learnt_towards_the_truth():
    """CAVI with gradient steps on ρ, from ρ = 2 on data with ρ = 0.4: ρ moves most of the way, the ELBO rises."""
    g = torch.Generator().manual_seed(5)
    x = torch.rand(80, 1, generator=g) * 6 - 3
    f = torch.sin(2 * x[:, 0])
    y = MaternThreeHalves(f, torch.tensor(0.4)).sample(generator=g)
    likelihood = MaternThreeHalvesLikelihood(scale=2.0).double()
    model = make_cavi_model(1, x[::4].clone()).double()
    trace = CAVI(model, likelihood, num_data=80).fit(x, y, learn_hyperparameters=True)
    assert trace.elbo[-1] > trace.elbo[0]
    assert abs(float(likelihood.scale) - 0.4) < 0.3 * (2.0 - 0.4), float(likelihood.scale)


def test_matern_rejects_a_bad_scale():
    with pytest.raises(ValueError, match="scale"):
        MaternThreeHalvesLikelihood(scale=-1.0)


# ================================================================================================ Bayesian SVM
def test_svm_pseudo_likelihood_julia_updates_and_predictive_link():
    r""":math:`\log L = -2\max(1 - s f, 0)`; CAVI's local update is AugmentedGaussianProcesses.jl's
    (:math:`c^2 = (1 - s\mu)^2 + \Sigma`, :math:`\theta = 1/c`, potential :math:`s(1 + \theta)`, precision
    :math:`\theta`); the predictive link is :math:`L(1|f)/(L(1|f) + L(-1|f))`; the {-1, 1} labels give the same."""
    lik = BayesianSVMLikelihood().double()
    g = torch.Generator().manual_seed(0)
    y = torch.bernoulli(torch.full((30,), 0.5), generator=g)
    m, s = 2 * torch.randn(30, generator=g), 0.1 + torch.rand(30, generator=g)
    sign = 2 * y - 1
    torch.testing.assert_close(lik.log_prob_at(y, m), -2 * torch.clamp(1 - sign * m, min=0), rtol=0, atol=1e-14)
    generic = LaplaceTransformLikelihood.log_prob_at(lik, y, m)  # log C + g f + log φ(r) of the generic form
    torch.testing.assert_close(generic, lik.log_prob_at(y, m), rtol=1e-12, atol=1e-12)
    q = lik.aux_posterior(y, m, s)
    h, lam = lik.expected_potential_and_precision(y, q, m, s)
    theta = 1 / torch.sqrt((1 - sign * m) ** 2 + s)
    torch.testing.assert_close(lam, theta, rtol=1e-12, atol=0)
    torch.testing.assert_close(h, sign * (1 + theta), rtol=1e-12, atol=0)
    pseudo = lambda yy, f: torch.exp(lik.log_prob_at(yy, f))  # noqa: E731
    f = torch.linspace(-3, 3, 13)
    expected = pseudo(torch.ones(13), f) / (pseudo(torch.ones(13), f) + pseudo(torch.zeros(13), f))
    torch.testing.assert_close(lik(f).probs, expected, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(lik.log_prob_at(sign, m), lik.log_prob_at(y, m))
    with pytest.raises(ValueError, match="labels y"):
        lik.check_targets(torch.tensor([0.0, 2.0]))


def test_svm_expected_log_prob_and_log_marginal():
    """``expected_log_prob`` (pseudo-likelihood, closed form) against adaptive quadrature split at the hinge;
    ``log_marginal`` is the log of the normalised predictive probability of the label."""
    from gpytorch.distributions import MultivariateNormal

    lik = BayesianSVMLikelihood().double()
    y = torch.tensor([1.0, 0.0, 1.0])
    q = MultivariateNormal(torch.tensor([0.2, 0.8, 2.0]), torch.diag(torch.tensor([0.5, 0.1, 1.0])))
    brute = []
    for yi, mi, si in zip(y.tolist(), q.mean.tolist(), q.variance.tolist()):
        density = stats.norm(mi, math.sqrt(si)).pdf
        integrand = lambda f: -2 * max(1 - (2 * yi - 1) * f, 0.0) * density(f)  # noqa: E731
        hinge = 2 * yi - 1  # the kink is at f = s
        brute.append(sum(integrate.quad(integrand, a, b, epsabs=1e-13)[0] for a, b in ((-np.inf, hinge),
                                                                                          (hinge, np.inf))))
    torch.testing.assert_close(lik.expected_log_prob(y, q), torch.tensor(brute), rtol=1e-9, atol=1e-10)
    probs = lik(q).probs
    torch.testing.assert_close(lik.log_marginal(y, q), torch.where(y > 0, probs, 1 - probs).log())


def test_svm_gibbs_posterior_of_a_tiny_problem_matches_brute_force():
    """Two points (the Geweke test does not apply to a pseudo-likelihood): the Gibbs posterior mean and variance
    of f against p(f) L(y|f) on a 2-D grid."""
    mu, K = torch.tensor([0.2, -0.1]), torch.tensor([[1.5, 0.9], [0.9, 1.5]])
    x, y = torch.tensor([[0.0], [1.0]]), torch.tensor([1.0, 0.0])
    likelihood = BayesianSVMLikelihood()
    samples = GibbsSampler(ExplicitPrior(mu, K), likelihood, x, y).sample(
        100, warmup=20, num_chains=40, seed=8, progress=False
    )
    f = samples.f.reshape(-1, 2)
    grid = torch.linspace(-5, 6, 301)
    f1, f2 = torch.meshgrid(grid, grid, indexing="ij")
    points = torch.stack([f1, f2], -1)
    log_post = torch.distributions.MultivariateNormal(mu, K).log_prob(points) + likelihood.log_prob_at(
        y, points
    ).sum(-1)
    weights = torch.softmax(log_post.flatten(), 0).reshape(log_post.shape)
    mean = (weights.unsqueeze(-1) * points).sum((0, 1))
    var = (weights.unsqueeze(-1) * (points - mean) ** 2).sum((0, 1))
    se = samples.f.mean(1).std(0) / math.sqrt(40)
    assert ((f.mean(0) - mean).abs() <= 5 * se).all(), (f.mean(0), mean, se)
    assert ((f.var(0) - var).abs() <= 0.15 * var).all(), (f.var(0), var)
    # the check can fail: the posterior of the flipped labels is far from these draws
    flipped = likelihood.log_prob_at(1 - y, points).sum(-1) + torch.distributions.MultivariateNormal(
        mu, K
    ).log_prob(points)
    w_flip = torch.softmax(flipped.flatten(), 0).reshape(flipped.shape)
    mean_flip = (w_flip.unsqueeze(-1) * points).sum((0, 1))
    assert ((f.mean(0) - mean_flip).abs() > 5 * se).any()


def test_svm_classifies_by_cavi():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(60, 1, generator=g) * 4 - 2
    y = (torch.sin(2 * x[:, 0]) > 0).double()
    likelihood = BayesianSVMLikelihood().double()
    model = make_cavi_model(1, x[::3].clone()).double()
    CAVI(model, likelihood, num_data=60).fit(x, y, max_iter=50)
    with torch.no_grad():
        probs = likelihood(model(x)).probs
    assert float(((probs > 0.5).double() == y).double().mean()) > 0.9


def _matern_convolution(y: float, mean: float, var: float, rho: float, log: bool) -> tuple[float, float]:
    """log int p(y | f) N(f; mean, var) df (log=False) or E log p(y | f) (log=True) by adaptive quadrature split at
    the kink f = y and at the mean, and its error estimate."""
    a, sd = math.sqrt(3.0) / rho, math.sqrt(var)

    def integrand(f):
        z = a * abs(y - f)
        value = math.log(a / 4) + math.log1p(z) - z
        return (value if log else math.exp(value)) * stats.norm.pdf(f, mean, sd)

    edges = sorted({y, mean, mean - 12 * sd, mean + 12 * sd})
    parts = [integrate.quad(integrand, lo, hi, epsabs=0.0, epsrel=1e-13, limit=200) for lo, hi in zip(edges, edges[1:])]
    value, error = sum(p[0] for p in parts), sum(p[1] for p in parts)
    return (value, error) if log else (math.log(value), error / value)


@pytest.mark.parametrize("var", [0.01, 1.0, 4.0, 10.0, 100.0])
def test_matern_log_marginal_and_expected_log_prob_match_adaptive_quadrature(var):
    # the integrand has a kink at f = y: Gauss-Hermite on it was off by -0.017, -0.156, -0.54 nats at var 1, 4, 10
    rho = 0.8
    likelihood = MaternThreeHalvesLikelihood(scale=rho)
    mean = torch.tensor([0.0, 0.3, -1.2, 2.0, 0.0])
    y = torch.tensor([0.0, 0.0, 1.5, -3.0, 6.0])
    q_f = gpytorch.distributions.MultivariateNormal(mean, var * torch.eye(5))
    log_marginal = likelihood.log_marginal(y, q_f)
    predictive = likelihood(q_f).log_prob(y)
    expected = likelihood.expected_log_prob(y, q_f)
    for i in range(5):
        reference, error = _matern_convolution(float(y[i]), float(mean[i]), var, rho, log=False)
        assert error < 1e-11
        # the closed form is accurate to rounding: a few ulps of the terms it sums
        assert abs(float(log_marginal[i]) - reference) <= 1e-11 * max(1.0, abs(reference))
        assert abs(float(predictive[i]) - reference) <= 1e-11 * max(1.0, abs(reference))
        reference, error = _matern_convolution(float(y[i]), float(mean[i]), var, rho, log=True)
        assert error < 1e-10
        # 8-node Gauss-Legendre panels graded towards the kink: ~1e-11 relative on the worst integrand tried
        assert abs(float(expected[i]) - reference) <= 1e-9 * max(1.0, abs(reference))


def test_matern_exact_integrals_have_finite_gradients_that_match_finite_differences():
    likelihood = MaternThreeHalvesLikelihood(scale=0.8)
    y = torch.tensor([0.0, 1.0, -4.0])
    mean = torch.tensor([0.0, 0.2, 0.5], requires_grad=True)
    log_var = torch.tensor([0.0, 2.0, -3.0], requires_grad=True)

    def total(m, lv):
        q_f = gpytorch.distributions.MultivariateNormal(m, torch.diag(lv.exp()))
        return (likelihood.log_marginal(y, q_f) + likelihood.expected_log_prob(y, q_f)).sum()

    assert torch.autograd.gradcheck(total, (mean, log_var), eps=1e-6, atol=1e-6, rtol=1e-5)
    total(mean, log_var).backward()
    assert torch.isfinite(likelihood.raw_scale.grad).all()
