r"""Likelihood-specific tests of the heteroscedastic likelihoods (docs/maths/heteroscedastic.md).

The shared protocol suite (``test_protocol.py``, via ``cases_heteroscedastic.py``) runs (a), (c), (e), (f), (h)
and the shapes/dtypes checks; the Gibbs Geweke test runs with :math:`\xi` fixed. Here:

* identity (b) per latent (:math:`g` with its tilt, :math:`f` with the collapsed :math:`p(y\mid f,g)`), exact and
  sparse;
* identity (d) against the double-bound model (:math:`f` entering through :math:`\phi`);
* the corrected :math:`f`-potential (the reference's :math:`/2` breaks monotone CAVI and loses nats);
* the hyper-parameter updates: :math:`\xi` exact maximiser (and MAP), the Student-t :math:`\xi` step with
  :math:`q(\gamma)` fixed, the :math:`\nu` update (exact maximiser of :math:`\sum_i\ell_i^*` and recovery of
  :math:`\nu` from data -- an update that needs this check);
* the predictive (moments and density of :meth:`marginal`, :meth:`noise_variance`) against Monte Carlo, including
  the predictive variance formula of docs/maths/heteroscedastic.md;
* CAVI, full and sparse, with a ``[2]``-batched ``CAVIVariationalStrategy`` inside
  ``IndependentMultitaskVariationalStrategy``; Gibbs against brute-force quadrature of the true posterior;
* the Geweke test **with** the collapsed :math:`\xi` Gibbs step, and the invalid "parallel" order failing it.
"""

from __future__ import annotations

import dataclasses
import math

import gpytorch
import pytest
import torch
from torch import Tensor
from torch.distributions import Gamma, Normal
from torch.nn.functional import logsigmoid

from gpytorch_augment import (
    CAVI,
    GibbsSampler,
    HeteroscedasticGaussianLikelihood,
    HeteroscedasticStudentTLikelihood,
)
from gpytorch_augment.likelihoods import AugmentedLikelihood
from gpytorch_augment.testing import (
    gp_data,
    protocol_data,
    violation_cavi_monotone,
    violation_f_conditional_exact,
    violation_f_conditional_sparse,
)
from gpytorch_augment.testing.models import make_cavi_model as _make_model
from tests.inference.test_gibbs import (
    FixedPrior,
    PlainGP,
    brute_force_posterior_moments,
    chain_z,
    make_two_latent_gaussian_likelihood,
    regression_data,
)
from tests.likelihoods.cases_heteroscedastic import CASES as HETEROSCEDASTIC_CASES
from tests.likelihoods.cases_heteroscedastic import HETEROSCEDASTIC_GAUSSIAN

Z_TOL = 4.5


def _gaussian(**kwargs) -> HeteroscedasticGaussianLikelihood:
    return HeteroscedasticGaussianLikelihood(**kwargs).double()


def _student_t(**kwargs) -> HeteroscedasticStudentTLikelihood:
    return HeteroscedasticStudentTLikelihood(**kwargs).double()


def _draw_targets(likelihood, f: Tensor, generator: torch.Generator) -> Tensor:
    """y ~ p(y | f, g) for latents (..., N, 2) and xi of shape (1,) or (chains, 1)."""
    scale = torch.exp(-0.5 * (likelihood.max_precision.detach().log() + logsigmoid(f[..., 1])))
    eps = torch.randn(f[..., 0].shape, generator=generator, dtype=f.dtype)
    if isinstance(likelihood, HeteroscedasticStudentTLikelihood):
        half_df = float(likelihood.df) / 2
        eps = eps / (torch._standard_gamma(torch.full_like(eps, half_df), generator=generator) / half_df).sqrt()
    return f[..., 0] + scale * eps


# ============================================================================================== identity (b) per latent
class _OneLatent(AugmentedLikelihood):
    r"""One latent of a heteroscedastic likelihood, the other held at ``fixed``: for :math:`g` (``latent=1``) the
    tilt at fixed :math:`(f, \Omega)`; for :math:`f` (``latent=0``) the collapsed :math:`\log p(y\mid f, g, [\gamma])`
    (marginal over :math:`(n, \omega)`; :math:`=\log p(y\mid f,g)` for the Gaussian) in place of the log-tilt
    (identity (b)
    for the heteroscedastic models). Only the members identity (b) uses are implemented."""

    def __init__(self, base: AugmentedLikelihood, fixed: Tensor, latent: int) -> None:
        super().__init__()
        self.base, self.fixed, self.latent = base, fixed, latent

    def _full(self, x: Tensor) -> Tensor:
        other = self.fixed[..., 1 - self.latent].expand_as(x)
        return torch.stack([x, other] if self.latent == 0 else [other, x], -1)

    def sample_aux(self, y, f, generator=None):
        return self.base.sample_aux(y, self._full(f), generator=generator)

    def potential_and_precision(self, y, aux, f=None):
        h, lam = self.base.potential_and_precision(y, aux, self._full(f))
        return h[..., self.latent, :], lam[..., self.latent, :]

    def log_tilt(self, y, aux, f):
        full = self._full(f)
        if self.latent == 1:
            return self.base.log_tilt(y, aux, full)
        # the collapsed conditional given (g, [gamma]): N(y | f, (xi gamma sigma(g))^-1), written independently
        precision = self.base.max_precision * aux.get("gamma", 1.0) * torch.sigmoid(full[..., 1])
        return Normal(full[..., 0], precision.rsqrt()).log_prob(y)

    def log_tilt_constant(self, y, aux):
        return self.log_tilt(y, aux, torch.zeros_like(self.fixed[..., 0]))

    def _unused(self, *args, **kwargs):
        raise NotImplementedError

    forward = marginal = aux_prior = aux_conditional = aux_posterior = _unused
    expected_potential_and_precision = expected_log_tilt_constant = aux_kl = _unused


@pytest.mark.parametrize("latent", [0, 1], ids=["f_collapsed", "g_tilt"])
@pytest.mark.parametrize("case", HETEROSCEDASTIC_CASES, ids=lambda c: c.name)
def test_b_full_conditional_per_latent(case, latent):
    """identity (b), exact and sparse, for each latent with the other fixed."""
    d = protocol_data(case, n=12)
    one = _OneLatent(d.likelihood, d.f, latent)
    torch.manual_seed(0)
    ratios = violation_f_conditional_exact(one, d.y, d.f[..., latent], d.generator)
    assert max(ratios.values()) <= 1, ratios
    d = protocol_data(case, n=20)
    one = _OneLatent(d.likelihood, d.f, latent)
    x = torch.linspace(-3, 3, 20).unsqueeze(-1)
    Z = torch.linspace(-2.7, 2.7, 6).unsqueeze(-1)
    ratios = violation_f_conditional_sparse(one, x, d.y, d.f[..., latent], Z, d.generator)
    assert max(ratios.values()) <= 1, ratios


def test_b_detects_the_thesis_f_potential():
    """The Gibbs f-mean of the box in Galy-Fajou's thesis (2023) uses xi sigma(g) y / 2: the per-latent (b) check
    rejects it."""

    class _HalfY(HeteroscedasticGaussianLikelihood):
        def potential_and_precision(self, y, aux, f=None):
            h, lam = super().potential_and_precision(y, aux, f)
            return torch.cat([h[..., :1, :] / 2, h[..., 1:, :]], -2), lam

    d = protocol_data(HETEROSCEDASTIC_GAUSSIAN, n=12, likelihood=_HalfY(max_precision=2.5))
    torch.manual_seed(0)
    ratios = violation_f_conditional_exact(_OneLatent(d.likelihood, d.f, 0), d.y, d.f[..., 0], d.generator)
    assert ratios["constant across draws"] > 1e3, ratios


# =========================================================================================== identity (d), double bound
@pytest.mark.parametrize("case", HETEROSCEDASTIC_CASES, ids=lambda c: c.name)
def test_d_double_bound_expectations_match_monte_carlo(case):
    r"""identity (d) for the double bound: draws :math:`(g,\Omega)\sim q(g)\,q^*(\Omega)` with :math:`f` at
    :math:`y - \sqrt{2\phi}` (so :math:`\rho = \phi`): the expected log-tilt (including
    :math:`E\log\mathrm{Po}(n\mid\xi\gamma\phi)`), :math:`\bar h_g`, :math:`\bar\lambda_g`, the corrected
    :math:`\bar\lambda_f = E[\xi\gamma - n/\phi]` and the auxiliary KL (:math:`\log q - \log p_{\rm ref}`)."""
    S, S_kl = 20_000, 4_000
    d = protocol_data(case, n=10)
    lik, y, m, s = d.likelihood, d.y, d.m, d.s
    q_aux = lik.aux_posterior(y, m, s)
    y_S = y.expand(S, *y.shape)
    q_S = {k: v.expand(S, *v.shape) for k, v in q_aux.items()}
    torch.manual_seed(0)
    aux = case.q_aux_distribution(lik, y_S, q_S).sample(generator=d.generator)
    g = m[..., 1] + s[..., 1].sqrt() * torch.randn((S, *y.shape), generator=d.generator)
    phi = 0.5 * ((y - m[..., 0]) ** 2 + s[..., 0])
    latents = torch.stack([(y - (2 * phi).sqrt()).expand_as(g), g], -1)

    h_bar, lam_bar = lik.expected_potential_and_precision(y, q_aux, m, s)
    h_S, lam_S = lik.potential_and_precision(y_S, aux, latents)
    gamma = aux.get("gamma", torch.ones_like(aux["n"]))
    xi = lik.max_precision.detach()
    q_kl = {k: v[:S_kl] for k, v in aux.items()}
    log_ratio = case.q_aux_distribution(lik, y_S[:S_kl], {k: v[:S_kl] for k, v in q_S.items()}).log_prob(
        q_kl
    ) - lik.aux_prior(y_S[:S_kl]).log_prob(q_kl)
    pairs = {
        "expected log-tilt": (lik.expected_log_tilt(y, q_aux, m, s), lik.log_tilt(y_S, aux, latents)),
        "h_bar g": (h_bar[..., 1, :], h_S[..., 1, :]),
        "lambda_bar g": (lam_bar[..., 1, :], lam_S[..., 1, :]),
        "lambda_bar f": (lam_bar[..., 0, :], xi * gamma - aux["n"] / phi),
        "aux KL": (lik.aux_kl(y, q_aux), log_ratio),
    }
    for name, (closed, samples) in pairs.items():
        se = samples.std(0) / math.sqrt(samples.shape[0])
        ratio = ((closed - samples.mean(0)).abs() / (5 * se + 1e-8)).max()
        assert ratio <= 1, (name, float(ratio))
    assert torch.allclose(h_bar[..., 0, :], lam_bar[..., 0, :] * y, rtol=1e-14)  # h_f = lambda_f y: no /2


# ================================================================================================ CAVI and the /2 bug
class _HalfFPotential(HeteroscedasticGaussianLikelihood):
    """The reference's expected f-potential xi (1 - sigma~) y / 2 (docs/maths/heteroscedastic.md)."""

    def expected_potential_and_precision(self, y, q_aux, f_mean, f_var):
        h, lam = super().expected_potential_and_precision(y, q_aux, f_mean, f_var)
        return torch.cat([h[..., :1, :] / 2, h[..., 1:, :]], -2), lam


def _cavi_trace(likelihood, data, sweeps: int) -> Tensor:
    model = _make_model(2, data.x)
    cavi = CAVI(model, likelihood, num_data=data.y.shape[-1])
    values = []
    for t in range(sweeps + 1):
        values.append(float(cavi.elbo(data.x, data.y)))
        if t < sweeps:
            cavi.step(data.x, data.y)
    return torch.tensor(values) * data.y.shape[-1]  # nats


def test_cavi_monotone_with_corrected_potential_and_the_halved_one_is_caught():
    r"""With :math:`\xi` fixed, the corrected :math:`\bar h_f = \xi(1-\tilde\sigma)y` gives a monotone bound; the
    reference's :math:`/2` makes steps *decrease* it (a identity (h) failure) and converges nats lower."""
    data = gp_data(HETEROSCEDASTIC_GAUSSIAN, n=30)
    good = _cavi_trace(_gaussian(max_precision=2.5, learn_max_precision=False), data, sweeps=30)
    bad = _cavi_trace(_HalfFPotential(max_precision=2.5, learn_max_precision=False).double(), data, sweeps=30)
    assert (good[1:] - good[:-1]).min() >= -1e-9 * good.abs().max()
    assert (bad[1:] - bad[:-1]).min() < -1e-3  # a decrease of more than a milli-nat: caught by identity (h)
    assert bad[-1] < good[-1] - 1.0  # and the fixed point is worse by more than a nat
    data.likelihood = _HalfFPotential(max_precision=2.5, learn_max_precision=False).double()
    ratios = violation_cavi_monotone(data.likelihood, data, data.x, sweeps=15)
    assert ratios["monotone"] > 1e3, ratios


@pytest.mark.parametrize("step_size", [1.0, 0.5])
def test_cavi_latent_blocks_match_the_joint_update_for_independent_latents(step_size):
    """Engine check of ``latent_blocks``: for latents that do not interact (a two-latent Gaussian tilt), updating
    block by block gives the same q(u) as the joint update, also for a damped (natural-gradient) step."""
    x, y = regression_data(15)
    results = []
    for blocks in (None, [[1], [0]]):
        likelihood = make_two_latent_gaussian_likelihood((0.1, 0.5))
        likelihood.latent_blocks = blocks
        cavi = CAVI(_make_model(2, x[::2]), likelihood, num_data=15, step_size=step_size)
        for _ in range(2):
            cavi.step(x, y)
        q = cavi.strategy.whitened_q(cavi.strategy.cavi_terms(x))
        results.append((q.mean, q.chol_covariance))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-10)
    assert torch.allclose(results[0][1], results[1][1], atol=1e-10)


def test_latent_blocks_are_validated_by_both_engines():
    likelihood = _gaussian(max_precision=2.0)
    likelihood.latent_blocks = [[0]]
    data = gp_data(HETEROSCEDASTIC_GAUSSIAN, n=8)
    with pytest.raises(ValueError, match="latent_blocks"):
        CAVI(_make_model(2, data.x), likelihood, num_data=8).step(data.x, data.y)
    with pytest.raises(ValueError, match="latent_blocks"):
        GibbsSampler(PlainGP(batch_shape=torch.Size([2])), likelihood, data.x, data.y)


# ================================================================================================ hyper-parameters
def _marginals(n: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(n, 2, generator=g)
    s = 0.1 + 0.9 * torch.rand(n, 2, generator=g)
    y = m[:, 0] + 1.5 * torch.randn(n, generator=g)
    return y, m, s


def test_xi_update_is_the_exact_maximiser_and_map():
    r""":math:`\xi\leftarrow N/(2\sum\phi(1-\tilde\sigma))` maximises :math:`\sum_i\ell_i^*`; with a
    :math:`\mathrm{Ga}(a,b)` prior it maximises :math:`\sum_i\ell_i^* + \log\mathrm{Ga}(\xi\mid a,b)`."""
    y, m, s = _marginals(25, 0)
    for prior in (None, (3.0, 0.5)):
        likelihood = _gaussian(max_precision=0.7, max_precision_prior=prior)
        likelihood.update_hyperparameters(y, likelihood.aux_posterior(y, m, s), m, s)
        xi = float(likelihood.max_precision.detach())

        def objective(value: float) -> float:
            likelihood.max_precision = value
            total = likelihood.collapsed_bound(y, m, s).sum()
            if prior is not None:
                total = total + Gamma(prior[0], prior[1]).log_prob(torch.tensor(value))
            return float(total)

        best = objective(xi)
        for factor in (1 - 1e-3, 1 + 1e-3, 0.5, 2.0):
            assert objective(xi * factor) <= best + 1e-12
        slope = (objective(xi * (1 + 1e-5)) - objective(xi * (1 - 1e-5))) / (2e-5 * xi)
        assert abs(slope) <= 1e-6 * len(y)


def test_fixed_xi_is_not_updated():
    y, m, s = _marginals(10, 1)
    likelihood = _gaussian(max_precision=0.7, learn_max_precision=False)
    likelihood.update_hyperparameters(y, likelihood.aux_posterior(y, m, s), m, s)
    assert float(likelihood.max_precision) == pytest.approx(0.7)


def test_student_t_xi_step_maximises_the_bound_with_q_gamma_fixed():
    r"""The CAVI rate-scale update :math:`\xi\leftarrow N/(2\sum\bar\gamma\phi(1-\tilde\sigma))` is the exact
    maximiser of
    :math:`\mathcal L` with :math:`q(\gamma)=\mathrm{Ga}(\alpha,\delta)`
    (and :math:`q(n,\omega\mid\gamma)` at its optimum)
    held fixed, and it increases the collapsed bound."""
    y, m, s = _marginals(25, 2)
    likelihood = _student_t(df=3.5, max_precision=0.7)
    q_aux = likelihood.aux_posterior(y, m, s)
    before = float(likelihood.collapsed_bound(y, m, s).sum())
    delta = likelihood.df / 2 + likelihood.max_precision * q_aux["kappa"]  # q(gamma) held at this rate
    likelihood.update_hyperparameters(y, q_aux, m, s)
    xi = float(likelihood.max_precision)

    def bound(value: float) -> float:
        likelihood.max_precision = value
        return float(likelihood.elbo_terms(y, {**q_aux, "kappa": (delta - likelihood.df / 2) / value}, m, s).sum())

    best = bound(xi)
    for factor in (1 - 1e-3, 1 + 1e-3, 0.5, 2.0):
        assert bound(xi * factor) <= best + 1e-12
    likelihood.max_precision = xi
    assert float(likelihood.collapsed_bound(y, m, s).sum()) >= before


def test_nu_update_is_the_exact_maximiser():
    r"""The :math:`\nu` update returns the maximiser of :math:`\sum_i\ell_i^*(\nu)` over ``df_bounds`` (checked against
    a fine grid and by a vanishing finite-difference slope); it never lowers the bound."""
    y, m, s = _marginals(40, 3)
    y = y + 4.0 * (torch.rand(40, generator=torch.Generator().manual_seed(5)) < 0.15)  # some outliers
    likelihood = _student_t(df=30.0, max_precision=1.5, learn_max_precision=False, learn_df=True)
    before = float(likelihood.collapsed_bound(y, m, s).sum())
    likelihood.update_hyperparameters(y, likelihood.aux_posterior(y, m, s), m, s)
    nu = float(likelihood.df)
    assert 0.2 < nu < 200

    def bound(value: float) -> float:
        likelihood.df = value
        return float(likelihood.collapsed_bound(y, m, s).sum())

    best = bound(nu)
    assert best >= before
    grid = torch.logspace(math.log10(0.2), math.log10(200.0), 300).tolist()
    assert max(bound(v) for v in grid) <= best + 1e-9
    slope = (bound(nu * (1 + 1e-6)) - bound(nu * (1 - 1e-6))) / (2e-6 * nu)
    assert abs(slope) <= 1e-5


def _simulate(n: int, df: float | None, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    eps = torch.randn(n, generator=g)
    if df is not None:
        eps = eps / (torch._standard_gamma(torch.full((n,), df / 2), generator=g) / (df / 2)).sqrt()
    scale = (10 * torch.sigmoid(1.0 + torch.cos(x[:, 0]))) ** -0.5
    return x, torch.sin(2 * x[:, 0]) + scale * eps


def test_nu_update_recovers_the_tails_of_the_data():
    r"""Verification of the :math:`\nu` update (docs/maths/heteroscedastic.md marks it unverified): CAVI with the update
    on finds heavy tails in :math:`t_{2.5}` data and (almost) Gaussian tails in Gaussian data, monotonically."""
    estimates = {}
    for df in (2.5, None):
        x, y = _simulate(120, df, seed=0)
        likelihood = _student_t(df=8.0, max_precision=5.0, learn_df=True)
        model = _make_model(2, torch.linspace(-3, 3, 12).unsqueeze(-1), mean_constant=0.0)
        trace = CAVI(model, likelihood, num_data=120).fit(x, y, max_iter=50, tol=1e-9)
        elbo = torch.tensor(trace.elbo)
        assert (elbo[1:] - elbo[:-1]).min() >= -1e-9 * elbo.abs().max()
        estimates[df] = float(likelihood.df)
    assert estimates[2.5] < 5.0, estimates
    assert estimates[None] > 30.0, estimates


# ================================================================================================ predictive
def _q_multitask(m: Tensor, s: Tensor) -> gpytorch.distributions.MultitaskMultivariateNormal:
    return gpytorch.distributions.MultitaskMultivariateNormal.from_batch_mvn(
        gpytorch.distributions.MultivariateNormal(m.mT, torch.diag_embed(s.mT)), task_dim=-1
    )


@pytest.mark.parametrize(
    "make",
    [lambda: _gaussian(max_precision=3.0), lambda: _student_t(df=6.0, max_precision=3.0)],
    ids=["gaussian", "student_t"],
)
def test_predictive_moments_density_and_noise_level_match_monte_carlo(make):
    r"""``marginal`` (mean, variance, log-density), ``predictive_moments`` (:math:`s_f +
    [\frac\nu{\nu-2}](1+e^{-m_g+s_g/2})/\xi`) and ``noise_variance`` (mean, median, band) against :math:`4\cdot10^5`
    draws of :math:`(f, g, y)`."""
    likelihood = make()
    g = torch.Generator().manual_seed(0)
    n, S = 6, 400_000
    m = torch.stack([torch.randn(n, generator=g), torch.linspace(-2.5, 2.0, n)], -1)
    s = torch.stack([0.05 + torch.rand(n, generator=g), torch.linspace(0.05, 1.5, n)], -1)
    q = _q_multitask(m, s)
    f = m + s.sqrt() * torch.randn(S, n, 2, generator=g)
    y = _draw_targets(likelihood, f, g)
    predictive = likelihood.marginal(q)
    mean, var = likelihood.predictive_moments(q)
    assert torch.allclose(predictive.mean, mean, atol=1e-12)
    assert torch.allclose(predictive.variance, var, rtol=1e-8)
    assert ((y.mean(0) - mean).abs() / (y.std(0) / math.sqrt(S))).max() <= Z_TOL
    centred = (y - y.mean(0)) ** 2
    assert ((centred.mean(0) - var).abs() / (centred.std(0) / math.sqrt(S))).max() <= Z_TOL
    # density: log E_{f,g} p(y0 | f, g) by Monte Carlo at a few target values
    y0 = m[:, 0] + torch.tensor([0.0, 0.5, -1.0, 2.0, -0.3, 1.2])
    dens = likelihood.log_prob_at(y0, f).exp()
    mc, se = dens.mean(0), dens.std(0) / math.sqrt(S)
    assert (((predictive.log_prob(y0).exp() - mc).abs() / se).max()) <= Z_TOL
    assert torch.allclose(likelihood.log_marginal(y0, q), predictive.log_prob(y0))
    # noise level: v(g) = Var(y | f, g)
    v = likelihood.noise_variance_at(f[..., 1])
    noise = likelihood.noise_variance(q, level=0.9)
    assert ((v.mean(0) - noise.mean).abs() / (v.std(0) / math.sqrt(S))).max() <= Z_TOL
    inside = ((v >= noise.lower) & (v <= noise.upper)).double().mean(0)
    assert ((inside - 0.9).abs() / math.sqrt(0.9 * 0.1 / S)).max() <= Z_TOL
    below = (v <= noise.median).double().mean(0)
    assert ((below - 0.5).abs() / math.sqrt(0.25 / S)).max() <= Z_TOL
    # the g-only MVN gives the same band
    q_g = gpytorch.distributions.MultivariateNormal(m[:, 1], torch.diag(s[:, 1]))
    assert torch.allclose(likelihood.noise_variance(q_g, level=0.9).upper, noise.upper)


@pytest.mark.parametrize("case", HETEROSCEDASTIC_CASES, ids=lambda c: c.name)
def test_expected_log_prob_is_the_true_expectation(case):
    """``expected_log_prob`` (closed form in f; Gauss--Hermite in g; Frullani's integral in f for the Student-t)
    equals the case's independent 100-node (product) rule."""
    d = protocol_data(case, n=15)
    value = d.likelihood.expected_log_prob(d.y, _q_multitask(d.m, d.s))
    assert torch.allclose(value, case.expected_log_lik(d.likelihood, d.y, d.m, d.s), atol=1e-8)


# ================================================================================================ CAVI, full and sparse
def _toy(n: int, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """f = sin(2x), noise sd growing from 0.05 to 0.6 across [-3, 3]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.sort(torch.rand(n, generator=g) * 6 - 3).values.unsqueeze(-1)
    sd = 0.05 + 0.55 * (x[:, 0] + 3) / 6
    return x, torch.sin(2 * x[:, 0]) + sd * torch.randn(n, generator=g), sd


@pytest.mark.parametrize(
    "sparse, distribution",
    [
        (False, gpytorch.variational.CholeskyVariationalDistribution),
        (True, gpytorch.variational.NaturalVariationalDistribution),
    ],
    ids=["full", "sparse_natural"],
)
def test_cavi_fits_the_noise_level(sparse, distribution):
    """CAVI with a [2]-batched CAVIVariationalStrategy inside IndependentMultitaskVariationalStrategy: monotone,
    converged, the mean recovered and the learnt noise level increasing like the truth (then a few
    AugmentedELBO steps on the kernel hyper-parameters of both latents)."""
    x, y, sd = _toy(60)
    Z = torch.linspace(-3, 3, 15).unsqueeze(-1) if sparse else x
    model = _make_model(2, Z, mean_constant=0.0, distribution_cls=distribution)
    assert isinstance(model.variational_strategy, gpytorch.variational.IndependentMultitaskVariationalStrategy)
    likelihood = _gaussian(max_precision=10.0)
    trace = CAVI(model, likelihood, num_data=60).fit(x, y, max_iter=150, tol=1e-9)
    elbo = torch.tensor(trace.elbo)
    assert trace.converged and (elbo[1:] - elbo[:-1]).min() >= -1e-9 * elbo.abs().max()
    model.eval()
    with torch.no_grad():
        q = model(x)
        mean, _ = likelihood.predictive_moments(q)
        noise = likelihood.noise_variance(q)
    assert (mean - torch.sin(2 * x[:, 0])).pow(2).mean().sqrt() < 0.15
    ratio = noise.mean.sqrt() / sd
    assert 0.5 < float(ratio.median()) < 2.0
    # the noise grows across the range (the fixed prior of g, outputscale 1.5, limits the dynamic range to ~4x here)
    assert float(noise.mean[x[:, 0] > 1.5].mean()) > 3 * float(noise.mean[x[:, 0] < -1.5].mean())
    # the augmented ELBO (AugmentedELBO) trains the kernel hyper-parameters of both latents
    model.train()
    optimizer = torch.optim.Adam(model.hyperparameters(), lr=0.01)
    trace = CAVI(model, likelihood, num_data=60).fit(x, y, max_iter=3, hyper_optimizer=optimizer)
    assert all(math.isfinite(v) for v in trace.elbo)


# ================================================================================================ Gibbs
def _tiny_two_latent_prior(n: int, seed: int, scale: float) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(2, n, n, generator=g)
    K = scale * (A @ A.mT / n + 0.3 * torch.eye(n))
    return 0.5 * torch.randn(2, n, generator=g), K


@pytest.mark.slow  # long chains against the true posterior
@pytest.mark.parametrize(
    "make",
    [lambda: _gaussian(max_precision=2.0), lambda: _student_t(df=3.0, max_precision=2.0)],
    ids=["gaussian", "student_t"],
)
def test_gibbs_matches_the_true_posterior(make):
    r"""The exact-GP sampler (valid partially collapsed order) reproduces the posterior means and second moments
    of :math:`(f, g)` of the TRUE likelihood, computed by brute-force 4-D quadrature (N = 2)."""
    likelihood = make()
    mu, K = _tiny_two_latent_prior(2, seed=1, scale=2.0)
    x = torch.arange(2, dtype=torch.float64).unsqueeze(-1)
    y = torch.tensor([1.3, -0.8])
    sampler = GibbsSampler(FixedPrior(mu, K), likelihood, x, y)
    samples = sampler.sample(120, warmup=30, num_chains=300, seed=0, progress=False)
    assert samples.f.shape == (300, 120, 2, 2) and set(samples.aux) == set(likelihood.aux_prior(y).factors)
    K_joint = torch.block_diag(*(K + sampler.target.jitter * torch.eye(2)))  # order (f1, f2, g1, g2)

    def log_lik(F: Tensor) -> Tensor:
        return likelihood.log_prob_at(y, torch.stack([F[:, :2], F[:, 2:]], -1)).sum(-1)

    mean, second = brute_force_posterior_moments(mu.reshape(-1), K_joint, log_lik, num_nodes=24)
    draws = samples.f.reshape(300, 120, 4)
    assert chain_z(draws, mean).abs().max() <= Z_TOL
    assert chain_z(draws.unsqueeze(-1) * draws.unsqueeze(-2), second).abs().max() <= Z_TOL
    assert (mean - mu.reshape(-1)).abs().max() > 0.1  # the data moved the posterior
    # predict runs on these draws: on four chains' (with the likelihood's constants recorded, predict calls the
    # likelihood's marginal once per draw: ~20 s for all 36,000)
    few = dataclasses.replace(samples, f=samples.f[:4], aux={k: v[:4] for k, v in samples.aux.items()},
                              hyperparameters={k: v[:4] for k, v in samples.hyperparameters.items()})  # fmt: skip
    prediction = few.predict(torch.tensor([[0.0], [1.0]]))
    assert prediction.y_mean.shape == (2,) and torch.isfinite(prediction.y_mean).all()


def test_gibbs_sparse_runs_and_agrees_with_cavi():
    """The inducing-point sampler (projected-process model) runs with the block order; its posterior mean of f
    is close to the sparse CAVI fit with the same inducing points."""
    x, y, _ = _toy(40, seed=1)
    Z = torch.linspace(-3, 3, 8).unsqueeze(-1)
    likelihood = _gaussian(max_precision=10.0, learn_max_precision=False)
    model = _make_model(2, Z, mean_constant=0.0)
    CAVI(model, likelihood, num_data=40).fit(x, y, max_iter=80, tol=1e-9)
    model.eval()
    with torch.no_grad():
        q = model(x)
    prior = PlainGP(batch_shape=torch.Size([2]))
    prior.load_state_dict(
        {k: v for k, v in model.state_dict().items() if k.startswith(("mean_module", "covar_module"))}
    )
    samples = GibbsSampler(prior, likelihood, x, y, inducing_points=Z).sample(
        150, warmup=50, num_chains=4, seed=0, progress=False
    )
    assert samples.u.shape == (4, 150, 2, 8)
    f_mean = samples.f[:, :, 0].mean((0, 1))
    assert (f_mean - q.mean[:, 0]).abs().max() < 0.15


# ================================================================================================ Geweke (identity (g))
def _geweke_z(
    likelihood, prior_xi, num_points: int, scale: float, chains: int, sweeps: int, burn_in: int, seed: int = 0
):
    r"""Successive-conditional vs marginal-conditional simulation of :math:`p(\xi, f, g, y)` for an explicit
    two-latent prior over ``num_points`` points; test functions :math:`f, g, f^2, g^2, fg, y, y^2, fy` per point
    and, with a prior on :math:`\xi`, :math:`\xi` and :math:`\log\xi`."""
    g = torch.Generator().manual_seed(seed)
    mu, K = _tiny_two_latent_prior(num_points, seed, scale)
    L = torch.linalg.cholesky(K)
    x = torch.arange(num_points, dtype=torch.float64).unsqueeze(-1)
    fixed_xi = likelihood.max_precision.detach().clone()

    def prior_draws(n: int) -> tuple[Tensor, Tensor]:
        f = (mu + (L @ torch.randn(n, 2, num_points, 1, generator=g)).squeeze(-1)).mT  # (n, N, 2)
        if prior_xi is None:
            return f, fixed_xi.expand(n, 1)
        return f, torch._standard_gamma(torch.full((n, 1), prior_xi[0]), generator=g) / prior_xi[1]

    def targets(f: Tensor, xi: Tensor) -> Tensor:
        likelihood.max_precision = xi
        return _draw_targets(likelihood, f, g)

    def functions(f: Tensor, y: Tensor, xi: Tensor) -> Tensor:
        parts = [f[..., 0], f[..., 1], f[..., 0] ** 2, f[..., 1] ** 2, f[..., 0] * f[..., 1], y, y**2, f[..., 0] * y]
        if prior_xi is not None:
            parts += [xi, xi.log()]
        return torch.cat(parts, -1)

    f_ref, xi_ref = prior_draws(200_000)
    ref = functions(f_ref, targets(f_ref, xi_ref), xi_ref)
    ref_mean, ref_se = ref.mean(0), ref.std(0) / math.sqrt(ref.shape[0])
    f, xi = prior_draws(chains)
    y = targets(f, xi)
    sampler = GibbsSampler(FixedPrior(mu, K), likelihood, x, y[0])
    total = torch.zeros(chains, ref_mean.shape[0])
    for sweep in range(sweeps):
        state = sampler.sweep(f.mT, y=y, generator=g, hyper={"max_precision": xi})
        f = state.f.mT  # storage layout (C, T, N)
        xi = state.hyper["max_precision"].expand(chains, 1)
        y = targets(f, xi)
        if sweep >= burn_in:
            total += functions(f, y, xi)
    chain_means = total / (sweeps - burn_in)
    se = (chain_means.var(0) / chains + ref_se**2).sqrt()
    return (chain_means.mean(0) - ref_mean) / se


@pytest.mark.parametrize(
    "make",
    [
        lambda: _gaussian(max_precision=3.0, max_precision_prior=(6.0, 2.0)),
        lambda: _student_t(df=4.5, max_precision=3.0, max_precision_prior=(6.0, 2.0)),
    ],
    ids=["gaussian", "student_t"],
)
def test_geweke_with_the_xi_gibbs_step(make):
    r"""identity (g) including the collapsed :math:`\xi\mid f,g,[\gamma]` step (drawn from its prior in both
    simulators):
    the valid order f (collapsed) -> fresh Ω -> g, with Ω redrawn after every ξ draw, passes."""
    z = _geweke_z(make(), (6.0, 2.0), num_points=2, scale=1.5, chains=600, sweeps=90, burn_in=15)
    assert z.abs().max() <= Z_TOL, z


def test_geweke_detects_the_invalid_parallel_order():
    r"""The reference example's order -- one Ω | f, g, then f | g (collapsed, old g) and g | Ω "in parallel" --
    is not a valid sampler: with ``latent_blocks = None`` the Geweke test fails (|z| > 4.5 on :math:`E f^2`;
    measured 7.7--8.1 over three seeds at this size, valid order <= 2.6)."""
    likelihood = _gaussian(max_precision=1.0)
    likelihood.latent_blocks = None
    z = _geweke_z(likelihood, None, num_points=1, scale=25.0, chains=2000, sweeps=150, burn_in=20)
    assert z.abs().max() > Z_TOL, z


# ================================================================================================ bad input
def test_bad_input_raises_value_errors():
    for kwargs, match in [
        (dict(max_precision=0.0), "max_precision"),
        (dict(max_precision=float("nan")), "max_precision"),
        (dict(max_precision_prior=(0.0, 1.0)), "max_precision_prior"),
    ]:
        with pytest.raises(ValueError, match=match):
            HeteroscedasticGaussianLikelihood(**kwargs)
    for kwargs, match in [(dict(df=-1.0), "df"), (dict(df_bounds=(5.0, 1.0)), "df_bounds")]:
        with pytest.raises(ValueError, match=match):
            HeteroscedasticStudentTLikelihood(**kwargs)
    likelihood = _gaussian()
    y = torch.zeros(4)
    with pytest.raises(ValueError, match="trailing dimension of size 2"):
        likelihood.log_prob_at(y, torch.zeros(4, 3))
    with pytest.raises(ValueError, match="current latents"):
        likelihood.potential_and_precision(y, {"n": y, "omega": y})
    with pytest.raises(ValueError, match="MultitaskMultivariateNormal"):
        likelihood.marginal(gpytorch.distributions.MultivariateNormal(y, torch.eye(4)))
    with pytest.raises(ValueError, match="targets y"):
        likelihood.expected_log_prob(torch.full((4,), float("nan")), _q_multitask(torch.zeros(4, 2), torch.ones(4, 2)))
    with pytest.raises(ValueError, match="level"):
        likelihood.noise_variance(_q_multitask(torch.zeros(4, 2), torch.ones(4, 2)), level=1.5)
