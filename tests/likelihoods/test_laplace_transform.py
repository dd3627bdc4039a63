r"""The generic augmentation :class:`~gpytorch_augment.likelihoods.LaplaceTransformLikelihood` (docs/guide/
writing_a_likelihood.md): its checks, the numerical sampler of a law given by its Laplace transform, and its
equivalence with the hand-written Bernoulli-logit, Laplace and Student-t likelihoods.

Every instance is built twice: from a known family of ``mixing_laws`` (closed forms, exact draws) and from
:math:`\log\varphi` alone (autograd and numerical inversion), both in float64.
"""

from __future__ import annotations

import math

import pytest
import torch
from gpytorch.distributions import MultivariateNormal
from scipy import stats

from gpytorch_augment import (
    CAVI,
    AugmentedELBO,
    BernoulliLogitLikelihood,
    GibbsSampler,
    HMCSampler,
    LaplaceLikelihood,
    LaplaceTransformLikelihood,
    StudentTLikelihood,
)
from gpytorch_augment._numerics.solvers import EULER_A
from gpytorch_augment.distributions import InverseGaussian, PolyaGamma, TiltedLaplaceTransform
from gpytorch_augment.likelihoods import GammaMixing, InverseGammaMixing, PolyaGammaMixing
from gpytorch_augment.testing import ExplicitPrior, geweke_z, make_cavi_model
from gpytorch_augment.testing.geweke import Z_TOL
from tests.distributions.pg_cdf import polya_gamma_cdf

BETA = 0.7  # Laplace scale
NU, SIGMA = 3.5, 1.7  # Student-t


@pytest.fixture(autouse=True)
def _float64():
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(dtype)


# ------------------------------------------------------------------ log φ of the families, written for inversion
def log_phi_pg(r):
    """-log cosh sqrt(r/2), analytic for Re r > 0 (log cosh z = z + log(1 + e^{-2z}) - log 2)."""
    z = torch.sqrt(r / 2)
    return -(z + torch.log1p(torch.exp(-2 * z)) - math.log(2))


def log_phi_gamma(a, b):
    return lambda r: -a * torch.log1p(r / b)


def log_phi_levy(b):
    return lambda r: -2 * torch.sqrt(b * r)


def log_phi_matern(b):
    def log_phi(r):
        z = 2 * torch.sqrt(b * r)
        return torch.log1p(z) - z

    return log_phi


# ------------------------------------------------------------------ the three likelihoods as instances
def bernoulli_instance(numerical: bool) -> LaplaceTransformLikelihood:
    return LaplaceTransformLikelihood(
        log_phi_pg if numerical else PolyaGammaMixing(),
        log_c=-math.log(2),
        g=lambda y: y - 0.5,
        gamma=0.5,
        target_distribution=lambda f: torch.distributions.Bernoulli(logits=f),
    )


def laplace_instance(numerical: bool) -> LaplaceTransformLikelihood:
    rate = 1 / (4 * BETA**2)  # e^{-|x|/β} = φ(x²) for InvGamma(1/2, 1/(4β²))
    return LaplaceTransformLikelihood(
        log_phi_levy(rate) if numerical else InverseGammaMixing(0.5, rate),
        log_c=-math.log(2 * BETA),
        alpha=lambda y: y**2,
        beta=lambda y: 2 * y,
        gamma=1.0,
        real_valued_targets=True,
    )


def student_t_instance(numerical: bool) -> LaplaceTransformLikelihood:
    a, b = (NU + 1) / 2, NU * SIGMA**2 / 2  # (1 + x²/(νσ²))^{-a} = φ(x²/2) for Ga(a, νσ²/2)
    log_c = math.lgamma(a) - math.lgamma(NU / 2) - 0.5 * math.log(math.pi * NU) - math.log(SIGMA)
    return LaplaceTransformLikelihood(
        log_phi_gamma(a, b) if numerical else GammaMixing(a, b),
        log_c=log_c,
        alpha=lambda y: y**2 / 2,
        beta=lambda y: y,
        gamma=0.5,
        real_valued_targets=True,
    )


def _bernoulli_data(g):
    x = torch.rand(30, 1, generator=g) * 6 - 3
    return x, torch.bernoulli(torch.sigmoid(2 * torch.sin(2 * x[:, 0])), generator=g)


def _regression_data(g):
    x = torch.rand(30, 1, generator=g) * 6 - 3
    return x, torch.sin(2 * x[:, 0]) + 0.5 * torch.randn(30, generator=g)


PAIRS = {
    "bernoulli": (BernoulliLogitLikelihood, bernoulli_instance, _bernoulli_data),
    "laplace": (lambda: LaplaceLikelihood(scale=BETA, learn_scale=False), laplace_instance, _regression_data),
    "student_t": (
        lambda: StudentTLikelihood(df=NU, scale=SIGMA, learn_scale=False),
        student_t_instance,
        _regression_data,
    ),
}


# ================================================================================================ equivalence
@pytest.mark.parametrize("numerical", [False, True], ids=["family", "log_phi"])
@pytest.mark.parametrize("name", list(PAIRS))
def test_members_reproduce_the_hand_written_likelihood(name, numerical):
    """log p(y|f), q*(ω)'s expected tilt, the augmented ELBO terms at q* and away from it, the collapsed bound and
    its gradient agree with the hand-written likelihood to 1e-10 (float64)."""
    make_hand, make_generic, data = PAIRS[name]
    hand, generic = make_hand().double(), make_generic(numerical).double()
    g = torch.Generator().manual_seed(0)
    _, y = data(g)
    m, s = torch.randn(30, generator=g), 0.1 + torch.rand(30, generator=g)
    y = hand.check_targets(y)
    torch.testing.assert_close(generic.log_prob_at(y, m), hand.log_prob_at(y, m), rtol=1e-10, atol=1e-10)
    q_hand, q_generic = hand.aux_posterior(y, m, s), generic.aux_posterior(y, m, s)
    for a, b in zip(
        generic.expected_potential_and_precision(y, q_generic, m, s),
        hand.expected_potential_and_precision(y, q_hand, m, s),
    ):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    # the augmented ELBO terms at q*(ω) of other marginals (q(ω) not optimal for (m, s))
    m2, s2 = m + 0.3, s * 1.5
    for mean, var in ((m, s), (m2, s2)):
        torch.testing.assert_close(
            generic.elbo_terms(y, q_generic, mean, var), hand.elbo_terms(y, q_hand, mean, var), rtol=1e-10, atol=1e-10
        )
    m_, s_ = m.clone().requires_grad_(True), s.clone().requires_grad_(True)
    grads = [torch.autograd.grad(lik.collapsed_bound(y, m_, s_).sum(), (m_, s_)) for lik in (generic, hand)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", list(PAIRS))
def test_cavi_fit_reproduces_the_hand_written_fit(name):
    """The same CAVI run (full batch, 15 steps, fixed constants) gives the same q(u) and ELBO trace to 1e-10;
    the numerical log φ instance too. Then a mini-batch step (10 points) agrees as well."""
    make_hand, make_generic, data = PAIRS[name]
    x, y = data(torch.Generator().manual_seed(1))
    Z = torch.linspace(-3, 3, 8).unsqueeze(-1)
    fits = []
    for likelihood in (make_hand(), make_generic(False), make_generic(True)):
        torch.manual_seed(0)  # the model's initial state
        model = make_cavi_model(1, Z).double()
        cavi = CAVI(model, likelihood.double(), num_data=30)
        trace = torch.stack([cavi.step(x, y) for _ in range(15)] + [cavi.step(x[:10], y[:10])])
        q = model.variational_strategy.variational_distribution
        fits.append((q.mean.detach(), q.covariance_matrix.detach(), trace, cavi.elbo(x, y)))
    for other in fits[1:]:
        for a, b in zip(other, fits[0]):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", list(PAIRS))
def test_augmented_elbo_matches_with_its_gradients(name):
    """``AugmentedELBO`` and its gradients with respect to the model's hyper-parameters agree."""
    make_hand, make_generic, data = PAIRS[name]
    x, y = data(torch.Generator().manual_seed(2))
    values = []
    for likelihood in (make_hand().double(), make_generic(True).double()):
        torch.manual_seed(0)  # the model's initial state
        model = make_cavi_model(1, x[::3].clone()).double()
        loss = AugmentedELBO(likelihood, model, num_data=30)(model(x), y)
        grads = torch.autograd.grad(loss, list(model.hyperparameters()))
        values.append((loss.detach(), *grads))
    for a, b in zip(*values):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", list(PAIRS))
def test_gibbs_draws_agree_with_the_hand_written_sampler(name):
    """Gibbs chains of the family instance and of the log φ instance against the hand-written likelihood's: the
    posterior means of f agree within 5 standard errors (from the spread of 40 independent chains) at every point.
    The Pólya-Gamma and Gamma families read the generator as the hand-written likelihoods do: identical chains."""
    make_hand, make_generic, data = PAIRS[name]
    x, y = data(torch.Generator().manual_seed(3))
    x, y = x[:12], y[:12]
    runs = []
    for likelihood in (make_hand(), make_generic(False), make_generic(True)):
        torch.manual_seed(0)
        model = make_cavi_model(1, x[:2].clone()).double()
        sampler = GibbsSampler(model, likelihood.double(), x, y)
        runs.append(sampler.sample(30, warmup=10, num_chains=40, seed=0, progress=False).f)
    if name != "laplace":
        torch.testing.assert_close(runs[1], runs[0], rtol=1e-8, atol=1e-8)
    chain_means = [run.mean(1) for run in runs]  # (chains, N)
    for other in chain_means[1:]:
        se = ((other.var(0) + chain_means[0].var(0)) / 40).sqrt()
        assert ((other.mean(0) - chain_means[0].mean(0)).abs() <= 5 * se).all()


# ================================================================================================ the numerical sampler
GRID = torch.tensor([0.05, 0.5, 2.0, 8.0])
LAWS = {
    "polya_gamma": log_phi_pg,
    "gamma": log_phi_gamma(2.25, 4.9),
    "levy": log_phi_levy(0.5),
    "matern32": log_phi_matern(0.75),
}


@pytest.mark.parametrize("law", list(LAWS))
def test_inversion_draws_have_the_moments_of_the_transform(law):
    r"""Sample mean and variance of 4000 draws per :math:`r` against :math:`-(\log\varphi)'(r)` and
    :math:`(\log\varphi)''(r)` (5 standard errors; the fourth moment for the variance's error is estimated)."""
    tilted = TiltedLaplaceTransform(LAWS[law], GRID)
    draws = tilted.sample((4000,), generator=torch.Generator().manual_seed(4))
    mean, var = tilted.mean, tilted.variance
    se_mean = (var / 4000).sqrt()
    assert ((draws.mean(0) - mean).abs() <= 5 * se_mean).all(), (draws.mean(0), mean)
    centred = draws - mean
    se_var = ((centred**2).var(0) / 4000).sqrt()
    assert ((centred.pow(2).mean(0) - var).abs() <= 5 * se_var).all(), (centred.pow(2).mean(0), var)


@pytest.mark.parametrize(
    "law, exact_cdf",
    [
        ("gamma", lambda r, x: stats.gamma.cdf(x, 2.25, scale=1 / (4.9 + r))),
        ("levy", lambda r, x: InverseGaussian(torch.tensor(math.sqrt(0.5 / r)), torch.tensor(1.0)).cdf(x).numpy()),
    ],
)
def test_inversion_draws_pass_a_ks_test_against_the_exact_family(law, exact_cdf):
    for r in (0.1, 3.0):
        draws = TiltedLaplaceTransform(LAWS[law], torch.full((3000,), r)).sample(
            generator=torch.Generator().manual_seed(5)
        )
        assert stats.kstest(draws.numpy(), lambda x: exact_cdf(r, torch.as_tensor(x))).pvalue > 1e-3


def test_inversion_draws_of_polya_gamma_match_the_exact_sampler():
    """Two-sample KS test against the exact Pólya-Gamma draws, at two tilts."""
    for r in (0.1, 4.0):
        numerical = TiltedLaplaceTransform(log_phi_pg, torch.full((3000,), r)).sample(
            generator=torch.Generator().manual_seed(6)
        )
        exact = PolyaGamma(torch.ones(3000), torch.full((3000,), math.sqrt(2 * r))).sample(
            generator=torch.Generator().manual_seed(7)
        )
        assert stats.ks_2samp(numerical.numpy(), exact.numpy()).pvalue > 1e-3


def test_inverted_density_and_cdf_match_the_exact_family():
    """Euler inversion of the tilted Gamma transform against the Gamma density and CDF."""
    r = torch.tensor([0.3, 3.0])
    x = torch.tensor([[0.05], [0.4], [1.5]])
    tilted = TiltedLaplaceTransform(LAWS["gamma"], r)
    exact = torch.distributions.Gamma(torch.tensor(2.25), 4.9 + r)
    # the inverted density's error is ~1e-8 absolute: relative 3e-5 where the density is ~1e-4 (x = 1.5, r = 3)
    torch.testing.assert_close(tilted.log_prob(x), exact.log_prob(x), rtol=0, atol=1e-4)
    torch.testing.assert_close(
        tilted.cdf(x), torch.as_tensor(stats.gamma.cdf(x, 2.25, scale=1 / (4.9 + r))), rtol=0, atol=1e-7
    )


def test_the_moment_check_can_fail():
    """Draws of a wrong law (the transform of Ga(2.25, 4.9) tilted by r + 1) fail the moment check."""
    generator = torch.Generator().manual_seed(4)
    wrong = TiltedLaplaceTransform(LAWS["gamma"], GRID + 1.0).sample((4000,), generator=generator)
    right = TiltedLaplaceTransform(LAWS["gamma"], GRID)
    assert ((wrong.mean(0) - right.mean).abs() > 5 * (right.variance / 4000).sqrt()).any()


# ================================================================================================ Gibbs with any φ
def matern_instance(rate: float = 0.75) -> LaplaceTransformLikelihood:
    """Matérn-3/2 regression: p(y|f) = (a/4)(1 + a|y-f|)e^{-a|y-f|}, a = 2 sqrt(rate), from log φ alone."""
    a = 2 * math.sqrt(rate)
    return LaplaceTransformLikelihood(
        log_phi_matern(rate), log_c=math.log(a / 4), alpha=lambda y: y**2, beta=lambda y: 2 * y, gamma=1.0
    )


def _matern_targets(rate: float):
    a = 2 * math.sqrt(rate)

    def sample(f, generator, **kwargs):  # |y - f| ~ Gamma(2, a) with a random sign: density (a²/4)... (a/4)(1+a|x|)
        # (a/4)(1 + a|x|)e^{-a|x|} = ½ Exp(a) + ½ Ga(2, a) for |x|, with a random sign
        e1 = -torch.log(torch.rand(f.shape, generator=generator, dtype=f.dtype)) / a
        e2 = -torch.log(torch.rand(f.shape, generator=generator, dtype=f.dtype)) / a
        coin = torch.rand(f.shape, generator=generator, dtype=f.dtype) < 0.5
        sign = torch.where(torch.rand(f.shape, generator=generator, dtype=f.dtype) < 0.5, -1.0, 1.0)
        return f + sign * torch.where(coin, e1, e1 + e2)

    return sample


def test_geweke_with_a_numerically_inverted_mixing_law():
    """Identity (g) for Matérn-3/2 regression, whose ω | f is GIG(-3/2) drawn by numerical inversion."""
    z = geweke_z(
        matern_instance(), _matern_targets(0.75), num_chains=300, num_sweeps=50, burn_in=10, num_reference=50_000
    )
    assert z.abs().max() <= Z_TOL, z


def test_gibbs_posterior_of_a_tiny_problem_matches_brute_force():
    """Two points, Student-t from log φ alone: the Gibbs posterior mean and variance of f against a 2-D grid."""
    mu, K = torch.tensor([0.2, -0.1]), torch.tensor([[1.0, 0.6], [0.6, 1.0]])
    x, y = torch.tensor([[0.0], [1.0]]), torch.tensor([2.5, -1.0])
    likelihood = student_t_instance(True)
    samples = GibbsSampler(ExplicitPrior(mu, K), likelihood, x, y).sample(
        100, warmup=20, num_chains=40, seed=8, progress=False
    )
    f = samples.f.reshape(-1, 2)
    grid = torch.linspace(-5, 6, 301)
    f1, f2 = torch.meshgrid(grid, grid, indexing="ij")
    points = torch.stack([f1, f2], -1)
    log_post = torch.distributions.MultivariateNormal(mu, K).log_prob(points) + (
        likelihood.log_prob_at(y, points).sum(-1)
    )
    weights = torch.softmax(log_post.flatten(), 0).reshape(log_post.shape)
    mean = (weights.unsqueeze(-1) * points).sum((0, 1))
    var = (weights.unsqueeze(-1) * (points - mean) ** 2).sum((0, 1))
    # chains of 100 draws, 40 chains: standard error from the spread of the chain means
    se = samples.f.mean(1).std(0) / math.sqrt(40)
    assert ((f.mean(0) - mean).abs() <= 5 * se).all(), (f.mean(0), mean, se)
    assert ((f.var(0) - var).abs() <= 0.15 * var).all(), (f.var(0), var)


# ================================================================================================ checks and fitting
@pytest.mark.parametrize(
    "log_phi, message",
    [
        (lambda r: r, "not non-increasing"),
        (lambda r: -(r**2), "not convex"),
        (lambda r: -torch.log(r), r"phi\(0\)"),
        (lambda r: torch.ones(3), "one real value per r"),
        ("not callable", "callable"),
    ],
)
def test_construction_rejects_what_cannot_be_a_laplace_transform(log_phi, message):
    with pytest.raises(ValueError, match=message) as error:
        LaplaceTransformLikelihood(log_phi)
    assert "log_phi" in str(error.value) or "mixing" in str(error.value)


def test_bad_coefficients_and_targets_raise_naming_them():
    with pytest.raises(ValueError, match="gamma must be >= 0"):
        LaplaceTransformLikelihood(PolyaGammaMixing(), gamma=-1.0)
    with pytest.raises(ValueError, match="alpha must be a number"):
        LaplaceTransformLikelihood(PolyaGammaMixing(), alpha="y")
    likelihood = LaplaceTransformLikelihood(GammaMixing(), alpha=0.0, beta=lambda y: y, gamma=1.0)
    with pytest.raises(ValueError, match=r"beta\(y\)\^2 <= 4 alpha\(y\) gamma\(y\)"):
        likelihood.check_targets(torch.tensor([1.0, 2.0]))
    with pytest.raises(NotImplementedError, match="target_distribution"):
        likelihood(torch.zeros(2)).sample()  # p(y | f) from phi has log_prob but no sampler
    with pytest.raises(ValueError, match="concentration must be 0.5 or 1.5"):
        InverseGammaMixing(2.5)


def _logistic(**coefficients) -> LaplaceTransformLikelihood:
    terms = {"log_c": -math.log(2), "g": lambda y: y - 0.5, "gamma": 0.5} | coefficients
    return LaplaceTransformLikelihood(PolyaGammaMixing(), **terms).double()


@pytest.mark.parametrize(
    "coefficients, message",
    [
        ({"g": torch.zeros(2)}, r"^g has shape \(2,\), which does not broadcast against the data's shape \(3,\)"),
        ({"alpha": lambda y: torch.zeros(5)}, r"^alpha has shape \(5,\), which does not broadcast"),
        ({"beta": lambda y: torch.zeros(2, 3)}, r"^beta has shape \(2, 3\), more dimensions than the targets'"),
        ({"g": lambda y: y * math.nan}, r"^g gives non-finite values at these targets \(e.g. nan\)"),
        ({"log_c": lambda y: y - math.inf}, r"^log_c gives non-finite values at these targets \(e.g. -inf\)"),
    ],
    ids=["tensor-g", "callable-alpha", "beta-adds-a-dimension", "nan-g", "inf-log_c"],
)
def test_coefficients_of_the_wrong_shape_or_not_finite_raise_naming_them(coefficients, message):
    """They gave raw broadcast errors, or NaN results silently."""
    y = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    q_f = MultivariateNormal(torch.zeros(3, dtype=torch.float64), torch.eye(3, dtype=torch.float64))
    likelihood = _logistic(**coefficients)
    for call in (lambda: likelihood.expected_log_prob(y, q_f), lambda: likelihood.check_targets(y)):
        with pytest.raises(ValueError, match=message):
            call()


def test_a_constant_log_phi_is_a_point_mass_at_zero():
    """log phi = 0 without a graph to r (torch.zeros_like) raised a raw autograd error in CAVI and HMC: phi = 1 is
    the transform of a point mass at omega = 0, E omega = 0, and the likelihood C e^{g f} is log-linear in f."""
    torch.manual_seed(0)
    x = torch.linspace(-1.0, 1.0, 3, dtype=torch.float64).unsqueeze(-1)
    y = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    constant = LaplaceTransformLikelihood(lambda r: torch.zeros_like(r), g=lambda y: y - 0.5).double()
    graphed = LaplaceTransformLikelihood(lambda r: 0.0 * r, g=lambda y: y - 0.5).double()
    elbos = [CAVI(make_cavi_model(1, x).double(), lik, num_data=3).fit(x, y, max_iter=3).elbo for lik in (constant,
             graphed)]  # fmt: skip
    assert elbos[0] == elbos[1]
    samples = HMCSampler(make_cavi_model(1, x).double(), constant, x, y).sample(num_samples=3, warmup=2)
    assert bool(torch.isfinite(samples.f).all())


def test_unnormalised_transform_is_folded_into_the_constant():
    """log φ + 3 (mass e^3) gives the same likelihood as log φ with log C + 3."""
    y, f = torch.tensor([0.3, -1.0]), torch.tensor([0.1, 0.5])
    shifted = LaplaceTransformLikelihood(
        lambda r: log_phi_gamma(2.0, 1.0)(r) + 3.0, alpha=lambda y: y**2, beta=lambda y: 2 * y, gamma=1.0
    )
    plain = LaplaceTransformLikelihood(
        GammaMixing(2.0, 1.0), log_c=3.0, alpha=lambda y: y**2, beta=lambda y: 2 * y, gamma=1.0
    )
    torch.testing.assert_close(shifted.log_prob_at(y, f), plain.log_prob_at(y, f))
    q = shifted.aux_posterior(y, f, torch.ones(2))
    torch.testing.assert_close(shifted.elbo_terms(y, q, f, torch.ones(2)), plain.elbo_terms(y, q, f, torch.ones(2)))


def test_one_call_fit_learns_a_constant_of_the_mixing_law():
    """``fit(x, y, learn_hyperparameters=True)`` with a learnable Gamma rate (Student-t with ν = 3.5 and learnt σ):
    the rate moves from its start towards the hand-written fit's νσ²/2, and the ELBO rises."""
    x, y = _regression_data(torch.Generator().manual_seed(9))
    y = 3.0 * y  # a larger spread than the starting scale
    a = (NU + 1) / 2
    mixing = GammaMixing(a, 1.0, learn_rate=True)

    class StudentT(LaplaceTransformLikelihood):  # log C ties σ to the learnt rate b = νσ²/2
        def coefficients(self, y):
            log_c, g, alpha, beta, gamma = super().coefficients(y)
            sigma = torch.sqrt(2 * self.mixing.rate / NU)
            return log_c - sigma.log(), g, alpha, beta, gamma

    const = math.lgamma(a) - math.lgamma(NU / 2) - 0.5 * math.log(math.pi * NU)
    likelihood = StudentT(mixing, log_c=const, alpha=lambda y: y**2 / 2, beta=lambda y: y, gamma=0.5).double()
    model = make_cavi_model(1, x[::3].clone()).double()
    trace = CAVI(model, likelihood, num_data=30).fit(x, y, learn_hyperparameters=True)
    hand = StudentTLikelihood(df=NU, scale=1.0).double()
    model_hand = make_cavi_model(1, x[::3].clone()).double()
    CAVI(model_hand, hand, num_data=30).fit(x, y, learn_hyperparameters=True)
    learnt = float(torch.sqrt(2 * mixing.rate.detach() / NU))
    assert math.isfinite(trace.elbo[-1]) and trace.elbo[-1] > trace.elbo[0]
    assert abs(learnt - float(hand.scale)) < 0.05 * float(hand.scale), (learnt, float(hand.scale))


# ---------------------------------------------------------------------------------------------- the predictive from φ
def _gaussian_from_phi(sigma: float) -> LaplaceTransformLikelihood:
    """N(y | f, σ²) written as φ(r) = e^{-r} at r = (y - f)² / (2σ²) (the point-mass mixing law)."""
    c = 1 / (2 * sigma**2)
    return LaplaceTransformLikelihood(lambda r: -r, log_c=-0.5 * math.log(2 * math.pi * sigma**2),
                                      alpha=lambda y: c * y**2, beta=lambda y: 2 * c * y, gamma=c,
                                      real_valued_targets=True)  # fmt: skip


def _q_f() -> MultivariateNormal:
    return MultivariateNormal(torch.tensor([0.3, -2.0, 1.5], dtype=torch.float64),
                              torch.diag(torch.tensor([0.5, 2.0, 0.1], dtype=torch.float64)))  # fmt: skip


def test_class_probabilities_from_phi_match_the_built_in():
    logit = LaplaceTransformLikelihood(PolyaGammaMixing(), log_c=-math.log(2), g=lambda y: y - 0.5, gamma=0.5,
                                       num_classes=2).double()  # fmt: skip
    q = _q_f()
    predictive = logit(q)  # no target_distribution needed
    torch.testing.assert_close(predictive.probs, BernoulliLogitLikelihood()(q).probs, rtol=1e-10, atol=1e-12)
    f = torch.tensor([0.3, -2.0], dtype=torch.float64)
    torch.testing.assert_close(logit(f).probs, torch.sigmoid(f))
    assert logit(f).sample().shape == (2,)
    with pytest.raises(ValueError, match="num_classes"):
        LaplaceTransformLikelihood(PolyaGammaMixing(), num_classes=1)
    with pytest.raises(ValueError, match="real_valued_targets"):
        logit.predictive_quantile(q, 0.5)


def test_real_valued_predictive_from_phi_has_quantiles_and_intervals():
    q = _q_f()
    gaussian = _gaussian_from_phi(0.5)
    exact = torch.distributions.Normal(q.mean, (q.variance + 0.25).sqrt())  # the Gaussian predictive, exactly
    lower, upper = gaussian.predictive_interval(q, level=0.9)
    # 32-node Gauss-Hermite mixture against the exact convolution
    torch.testing.assert_close(lower, exact.icdf(torch.tensor(0.05, dtype=torch.float64)), atol=1e-3, rtol=0)
    torch.testing.assert_close(upper, exact.icdf(torch.tensor(0.95, dtype=torch.float64)), atol=1e-3, rtol=0)
    value = torch.tensor([0.7, -1.0, 1.4], dtype=torch.float64)
    torch.testing.assert_close(gaussian.predictive_cdf(q, value), exact.cdf(value), atol=1e-4, rtol=0)
    torch.testing.assert_close(gaussian(q).log_prob(value), exact.log_prob(value), atol=1e-3, rtol=0)
    # heavy tails (tutorial 10's double Lomax): the CDF against adaptive quadrature of the same mixture
    a = 4.0
    lomax = LaplaceTransformLikelihood(lambda r: -2 * torch.log1p(torch.sqrt(r)), log_c=math.log(a / 2),
                                       alpha=lambda y: a**2 * y**2, beta=lambda y: 2 * a**2 * y, gamma=a**2,
                                       real_valued_targets=True)  # fmt: skip
    from scipy import integrate

    nodes, weights = lomax._quadrature(q)
    for v in (-0.4, 0.31, 2.0):
        reference = sum(
            float(w) * integrate.quad(lambda y, f=float(f): a / 2 * (1 + a * abs(y - f)) ** -2, -math.inf, v)[0]
            for w, f in zip(weights.reshape(-1), nodes[:, 0])
        )
        assert abs(float(lomax.predictive_cdf(q, v)[0]) - reference) < 1e-5
    median = lomax.predictive_quantile(q, 0.5)
    torch.testing.assert_close(lomax.predictive_cdf(q, median), torch.full((3,), 0.5, dtype=torch.float64))


def _logistic_from_polya_gamma() -> LaplaceTransformLikelihood:
    """The class docstring's Bernoulli-logit example (r(y, f) = f^2 / 2 is 0 at f = 0)."""
    return LaplaceTransformLikelihood(
        PolyaGammaMixing(), log_c=-math.log(2), g=lambda y: y - 0.5, gamma=0.5,
        target_distribution=lambda f: torch.distributions.Bernoulli(logits=f),
    )


def test_polya_gamma_transform_has_the_logistic_gradient_where_r_is_zero():
    # f = 0 gives r = 0, where sqrt(r) has an infinite derivative; the gradient of log phi(r(f)) and of the tilted
    # mean in r must be the hand-written likelihood's there and everywhere near
    logit = _logistic_from_polya_gamma()
    y = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0])
    f = torch.tensor([0.0, 0.0, 1e-9, -1e-3, 0.7], requires_grad=True)
    grad = torch.autograd.grad(logit.log_prob_at(y, f).sum(), f)[0]
    f_ref = f.detach().clone().requires_grad_(True)
    expected = torch.autograd.grad(BernoulliLogitLikelihood().log_prob_at(y, f_ref).sum(), f_ref)[0]
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)
    r = torch.tensor([0.0, 1e-12, 0.3], requires_grad=True)
    mixing = PolyaGammaMixing()
    (d_log_phi,) = torch.autograd.grad(mixing.log_laplace(r).sum(), r)
    (d_mean,) = torch.autograd.grad(mixing.tilted_mean(r).sum(), r)
    # log phi(r) = -log cosh sqrt(r/2) = -r/4 + r^2/48 - ..., E omega = tanh(c/2)/(2c) = 1/4 - r/24 + ... (c^2 = 2r)
    assert torch.isfinite(d_log_phi).all() and torch.isfinite(d_mean).all()
    torch.testing.assert_close(d_log_phi[:2], torch.full((2,), -0.25), rtol=1e-10, atol=0.0)
    torch.testing.assert_close(d_mean[:2], torch.full((2,), -1.0 / 24), rtol=1e-10, atol=0.0)


def test_hmc_on_the_polya_gamma_transform_draws_what_the_logistic_likelihood_draws():
    # a zero prior mean: the Laplace mode search starts at f = 0, where r(y, f) = 0
    g = torch.Generator().manual_seed(0)
    n = 12
    t = torch.linspace(-2, 2, n)
    K = torch.exp(-0.5 * (t[:, None] - t[None, :]) ** 2) + 1e-6 * torch.eye(n)
    x = torch.arange(n, dtype=torch.float64).unsqueeze(-1)
    y = torch.bernoulli(torch.sigmoid(2 * t), generator=g)
    draws = []
    for likelihood in (_logistic_from_polya_gamma(), BernoulliLogitLikelihood()):
        sampler = HMCSampler(ExplicitPrior(torch.zeros(n), K), likelihood, x, y)
        draws.append(sampler.sample(10, warmup=10, num_chains=2, seed=1, progress=False).f)
    assert not torch.isnan(draws[0]).any()
    # same seed and the same log-density up to rounding (the chains differ by ~1e-12): agreement to 1e-6 rules out
    # any difference in the law while leaving room for rounding amplified along 20 transitions
    assert float((draws[0] - draws[1]).abs().max()) < 1e-6


@pytest.mark.parametrize("b", [1.0, 2.5])
@pytest.mark.parametrize("r", [0.0, 1.0])
def test_tilted_cdf_is_finite_and_exact_to_the_inversion_error_in_the_left_tail(b, r):
    """The Pólya-Gamma law's CDF by Euler inversion, from x = 1e-6 (where the contour's |s| reaches 1e7 and torch's
    complex log1p of a subnormal was NaN, x ~ 3e-5 to 2e-4) to 10, against the exact series: within the method's
    absolute error, e^-A for the discretisation plus as much again for the Euler summation of the series."""
    x = torch.logspace(-6, 1, 71, dtype=torch.float64)
    law = TiltedLaplaceTransform(PolyaGammaMixing(b).double().log_laplace, torch.tensor(r, dtype=torch.float64))
    cdf = law.cdf(x)
    assert bool(torch.isfinite(cdf).all())
    exact = polya_gamma_cdf(x, b, math.sqrt(2 * r))
    assert (cdf - exact).abs().max() <= 2 * math.exp(-EULER_A)
