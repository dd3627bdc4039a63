r"""Sampled hyper-parameters (issue #40, exact model, Gibbs): ``GibbsSampler(..., sample_hyperparameters=True)``.

* (a) the collapsed marginal :func:`~gpytorch_augment.core.collapsed_log_marginal` against brute-force Gauss-Hermite
  integration, and the batched prior of :class:`PriorParameters` against per-chain evaluation;
* (b) Geweke's joint test of the transition with :math:`\theta` drawn from its prior (Bernoulli, Student-t), and the
  variant that keeps the :math:`f` drawn at the old :math:`\theta` (no redraw after the :math:`\theta` move), which
  must fail it (slow tier);
* (c) the posterior of the lengthscale on a three-point problem by brute force -- a grid over
  :math:`\log\ell` times Laplace-centred Gauss-Hermite quadrature over :math:`f` -- against the sampler's posterior
  mean of :math:`\log\ell` and a tail probability, within :math:`4.5` Monte Carlo standard errors (from the chains'
  effective sample sizes), for the binary, a count (Poisson) and the Student-t likelihoods; each data set moves the
  posterior away from the prior by many such errors, so a sampler that ignored the data would fail;
* (a') the inducing-point model: the collapsed marginal with per-datum noise (``collapsed_log_marginal(..., d)``)
  and its :math:`q(v)` against the dense Gaussian identities of :math:`g \sim \mathcal N(\mu, A^\top A + D)`;
  Geweke with inducing points (and the variant that drops the noise's constants from the :math:`\theta` density,
  which must fail), and the lengthscale posterior and :math:`E[f \mid y]` by brute force with the FITC covariance
  :math:`A^\top A + D` (which catches an :math:`f`-step that ignores the tilt, invisible to Geweke's test);
* (b') latent blocks (heteroscedastic Gaussian): Geweke (and the variant that drops the other blocks' prior
  density from the :math:`\theta` density, which must fail), and the posterior of both latents' outputscales by
  brute force on repeated inputs;
* (d) the refusals (a parameter without a prior, inducing points with latent blocks or with an ``alpha`` other than
  0 or 1, over-relaxation, HMC with inducing points);
* (e) draws, ``summary``, ``resume`` (bit for bit), ArviZ, ``state_dict``, and ``predict``, which at a constant
  :math:`\theta` equals the fixed-:math:`\theta` prediction;
* (f) the parts of the HMC move of :math:`\theta`: the adjoints of the collapsed marginal against autograd, the
  logarithmic coordinates of bounded parameters, and the move's invariance for a Gaussian (with an exact and a wrong
  gradient). (b) and (c) run with θ by HMC (the default) and, in the fast tier, by the slice move too;
* (g) the latent moves (HMC on the whitened latents given θ, Ω integrated out): Geweke's test of the moves alone
  (one latent and two) and of the whole transition with them, the variant without the whitened prior's term, which
  must fail, their adaptation and bit-for-bit resume, and the refusals;
* (h) spread starts (``init_spread``): fresh runs move each chain's coordinates within the spread, reproducibly, a
  start that cannot be factorised keeps the model's values, and resumed runs are not moved;
* (j) HMC on θ and the whitened latents jointly (``HMCSampler(..., sample_hyperparameters=True)``): Geweke's test
  (one latent and two) and the variant without the whitened prior's term, which must fail; the lengthscale's
  posterior by brute force (binary, count, Student-t); draws, ``resume`` bit for bit, ``predict``; the routes from
  ``posterior_sampler`` and the refusals.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import gpytorch
import numpy as np
import pytest
import torch

from gpytorch_augment import (
    BernoulliLogitLikelihood,
    GibbsSampler,
    GPPrior,
    HMCSampler,
    PoissonLogitLikelihood,
    StudentTLikelihood,
    posterior_sampler,
)
from gpytorch_augment.core import WhitenedGaussian, collapsed_log_marginal
from gpytorch_augment.core.collapsed import collapsed_marginal_adjoints
from gpytorch_augment.inference.diagnostics import bulk_ess
from gpytorch_augment.inference.gibbs import HyperparameterGibbsKernel
from gpytorch_augment.inference.hmc import HyperparameterHMCKernel
from gpytorch_augment.inference.mcmc import MCMC, PosteriorSamples, PosteriorTarget
from gpytorch_augment.inference.mcmc.hmc_move import hmc_move
from gpytorch_augment.inference.mcmc.prior_parameters import PriorParameter, PriorParameters
from gpytorch_augment.likelihoods import (
    HeteroscedasticGaussianLikelihood,
    LogisticSoftmaxLikelihood,
    PairwiseLogitLikelihood,
)
from gpytorch_augment.testing.examples import BERNOULLI_CASE
from gpytorch_augment.testing.geweke import Z_TOL, geweke_z_hyperparameters
from tests.likelihoods.cases_heteroscedastic import HETEROSCEDASTIC_GAUSSIAN
from tests.likelihoods.cases_robust import STUDENT_T
from tests.likelihoods.toy_multilatent import TWO_BIT_LOGIT

LENGTHSCALE = "covar_module.base_kernel.lengthscale"
OUTPUTSCALE = "covar_module.outputscale"


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _data(n: int = 20, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.linspace(-3, 3, n, dtype=torch.float64).unsqueeze(-1)
    y = torch.bernoulli(torch.sigmoid(3 * torch.sin(2 * x.squeeze(-1))), generator=g)
    return x, y


def _scaled_rbf_prior() -> GPPrior:
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
    return GPPrior(gpytorch.means.ZeroMean(), kernel).double()


# ---------------------------------------------------------------------------------------------- (a) the maths
def _gauss_hermite_2d(num: int) -> tuple[torch.Tensor, torch.Tensor]:
    t, w = np.polynomial.hermite.hermgauss(num)
    nodes = torch.cartesian_prod(torch.tensor(t), torch.tensor(t)) * math.sqrt(2.0)  # v ~ N(0, I)
    weights = torch.cartesian_prod(torch.tensor(w), torch.tensor(w)).prod(-1) / math.pi
    return nodes, weights


@pytest.mark.parametrize("num_data", [2, 3])
def test_collapsed_log_marginal_against_brute_force(num_data):
    """log Z = log ∫ N(v | 0, I) Π exp(h_i g_i - λ_i g_i² / 2) dv with g = μ + Aᵀ v, by 2-D Gauss-Hermite
    quadrature (120² nodes), for a square and a non-square A, a zero precision and a batch of two; q(v)'s mean and
    covariance against the tilted density's moments."""
    g = torch.Generator().manual_seed(num_data)
    A = 0.8 * torch.randn(2, 2, num_data, generator=g, dtype=torch.float64)
    mu = torch.randn(2, num_data, generator=g, dtype=torch.float64)
    h = torch.randn(2, num_data, generator=g, dtype=torch.float64)
    lam = torch.rand(2, num_data, generator=g, dtype=torch.float64)
    lam[0, 0] = 0.0
    log_z, q = collapsed_log_marginal(A, mu, h, lam)
    nodes, weights = _gauss_hermite_2d(120)
    for b in range(2):
        g_nodes = mu[b] + nodes @ A[b]  # (Q², N)
        log_tilt = (h[b] * g_nodes - 0.5 * lam[b] * g_nodes.square()).sum(-1)
        tilted = weights * log_tilt.exp()
        Z = tilted.sum()
        assert math.isclose(float(log_z[b]), float(Z.log()), rel_tol=0, abs_tol=1e-10)
        mean = (tilted.unsqueeze(-1) * nodes).sum(0) / Z
        cov = (tilted.unsqueeze(-1).unsqueeze(-1) * torch.einsum("ki,kj->kij", nodes, nodes)).sum(0) / Z
        cov = cov - torch.outer(mean, mean)
        assert torch.allclose(q.mean[b], mean, atol=1e-10)
        R = q.chol_covariance[b]
        assert torch.allclose(R @ R.mT, cov, atol=1e-10)
    # the normaliser alone: B = I, theta1 = 0 gives log 1
    assert float(WhitenedGaussian(torch.zeros(2).double(), torch.eye(2).double()).log_normalizer()) == 0.0


def _prior_model(batch_shape: torch.Size = torch.Size()) -> GPPrior:
    mean = gpytorch.means.ConstantMean(constant_prior=gpytorch.priors.NormalPrior(0.0, 1.0), batch_shape=batch_shape)
    base = gpytorch.kernels.RBFKernel(
        ard_num_dims=2, batch_shape=batch_shape, lengthscale_prior=gpytorch.priors.LogNormalPrior(0.0, 0.5)
    )
    kernel = gpytorch.kernels.ScaleKernel(
        base, batch_shape=batch_shape, outputscale_prior=gpytorch.priors.GammaPrior(2.0, 1.0)
    )
    return GPPrior(mean, kernel).double()


@pytest.mark.parametrize("num_latents", [1, 2])
def test_batched_prior_equals_per_chain_evaluation(num_latents):
    """PriorParameters.evaluate at three chains' θ (ARD lengthscales, outputscale, constant mean; a batch of two
    latent priors) equals model.forward(x) with each chain's parameters set, and log p(θ) equals the priors' log
    densities at the constrained values plus log c of the positive ones (log coordinates)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 2, generator=g, dtype=torch.float64)
    batch = torch.Size([num_latents]) if num_latents > 1 else torch.Size()
    model = _prior_model(batch)
    likelihood = BernoulliLogitLikelihood() if num_latents == 1 else LogisticSoftmaxLikelihood(num_classes=2)
    y = torch.zeros(7, dtype=torch.float64)
    params = PriorParameters(PosteriorTarget(model, likelihood, x, y))
    theta = params.initial(3) + 0.3 * torch.randn(3, params.size, generator=g, dtype=torch.float64)
    mean, covar, log_prior = params.evaluate(theta)
    assert mean.shape == (3, num_latents, 7) and covar.shape == (3, num_latents, 7, 7)
    for c in range(3):
        copied = copy.deepcopy(model)
        with torch.no_grad():
            for path, value in params.unflatten(theta[c : c + 1]).items():
                copied.get_parameter(path).copy_(value[0])
        prior = copied.forward(x)
        expected_mean = prior.mean.reshape(num_latents, 7)
        expected_covar = prior.covariance_matrix.reshape(num_latents, 7, 7)
        assert torch.allclose(mean[c], expected_mean, atol=1e-12)
        assert torch.allclose(covar[c], expected_covar, atol=1e-12)
        expected = sum(float(p.log_prob(closure(m)).sum()) for _, m, p, closure, _ in copied.named_priors())
        for value in (copied.covar_module.outputscale, copied.covar_module.base_kernel.lengthscale):
            expected += float(value.log().sum())  # the coordinates are log c: dc / ds = c
        assert math.isclose(float(log_prior[c]), expected, rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize("num_latents", [1, 2])
def test_evaluate_blocks_equals_the_dense_blocks(num_latents):
    """PriorParameters.evaluate_blocks (what the inducing-point model evaluates: K_ZZ, K_ZX, diag K_XX from a lazily
    evaluated kernel) equals the blocks of the dense evaluate at cat[Z, X], with the same mean and log p(θ)."""
    g = torch.Generator().manual_seed(2)
    x, Z = (torch.randn(n, 2, generator=g, dtype=torch.float64) for n in (7, 3))
    batch = torch.Size([num_latents]) if num_latents > 1 else torch.Size()
    likelihood = BernoulliLogitLikelihood() if num_latents == 1 else LogisticSoftmaxLikelihood(num_classes=2)
    target = PosteriorTarget(_prior_model(batch), likelihood, x, torch.zeros(7, dtype=torch.float64), inducing_points=Z)
    params = PriorParameters(target)
    theta = params.initial(4) + 0.3 * torch.randn(4, params.size, generator=g, dtype=torch.float64)
    x_all = torch.cat([Z, x])
    mean, covar, log_prior = params.evaluate(theta, x_all)
    mean_b, K_ZZ, K_ZX, k_diag, log_prior_b = params.evaluate_blocks(theta, x_all, 3)
    assert K_ZZ.shape == (4, num_latents, 3, 3) and K_ZX.shape == (4, num_latents, 3, 7)
    assert torch.equal(mean_b, mean) and torch.equal(log_prior_b, log_prior)
    assert torch.allclose(K_ZZ, covar[..., :3, :3], atol=1e-14) and torch.allclose(K_ZX, covar[..., :3, 3:], atol=1e-14)
    assert torch.allclose(k_diag, covar[..., 3:, 3:].diagonal(dim1=-2, dim2=-1), atol=1e-14)


def test_default_priors_are_used_and_not_registered():
    """Without priors of the user's, the lengthscale and the outputscale get the one-call fit's default priors,
    held by the sampler, not registered on the model."""
    x, y = _data()
    model = _scaled_rbf_prior()
    sampler = GibbsSampler(model, BernoulliLogitLikelihood(), x, y, sample_hyperparameters=True)
    priors = sampler.kernel.hyperparameters.priors
    assert sorted(priors) == [
        "covar_module.base_kernel.lengthscale_prior (default)",
        "covar_module.outputscale_prior (default)",
    ]
    assert list(model.named_priors()) == []
    assert isinstance(sampler.kernel, HyperparameterGibbsKernel) and sampler.kernel.name == "hyper"


# ---------------------------------------------------------------------------------------------- (b) Geweke
class FRedrawSkipped(HyperparameterGibbsKernel):
    """A deliberately wrong transition: f drawn given the *old* θ, then the θ move, and that f kept."""

    def step(self, chains, generator, adapt):
        aux, constants, h, lam = self.gibbs.conditional_tilts(chains.f, chains.y, generator, chains.constants)
        _, q_old = self._collapsed(chains.mean, chains.A, chains.log_prior, None, h, lam)
        f = self.latent_draw(chains.mean, chains.A, q_old, generator)
        move = self.theta_move(chains, h, lam, generator)
        mean, A, log_prior, *_ = move.payload
        return chains._replace(f=f, aux=aux, constants=constants, theta=move.x, mean=mean, A=A, log_prior=log_prior)


#: the size of the slow tier's Geweke runs with sampled θ (2000 chains x 150 transitions, the first 25 dropped; the
#: reference's 2.5e5 draws): the broken kernels fail at this size or below
#: (test_geweke_detects_the_missing_f_redraw, test_geweke_quick_latent_blocks, test_geweke_quick_inducing_points)
SLOW_GEWEKE = {"num_chains": 2_000, "num_sweeps": 150, "burn_in": 25}


@pytest.mark.slow
@pytest.mark.parametrize("case", [BERNOULLI_CASE, STUDENT_T], ids=lambda case: case.name)
def test_geweke_sampled_hyperparameters(case):
    """Joint test of (θ, f, y) with θ from its prior (constant mean, outputscale, lengthscale), 2000 chains x 150
    transitions: every |z| <= 4.5."""
    z = geweke_z_hyperparameters(case.make(), case.sample_targets, **SLOW_GEWEKE)
    assert z.abs().max() <= Z_TOL, z


@pytest.mark.slow
@pytest.mark.parametrize(
    "inducing, num_chains", [(None, 2_000), ((0.3, 1.0), 1_000)], ids=["exact", "inducing"]
)  # fmt: skip
def test_geweke_detects_the_missing_f_redraw(inducing, num_chains):
    """The variant without the f redraw after the θ move (with inducing points: f drawn at the old θ, and without
    the noise d) fails far beyond the threshold, exact and with the slow test's two inducing inputs, with at most the
    chains and two thirds of the transitions of the slow tier's runs (SLOW_GEWEKE)."""
    z = geweke_z_hyperparameters(
        BERNOULLI_CASE.make(), BERNOULLI_CASE.sample_targets, kernel_cls=FRedrawSkipped, num_chains=num_chains,
        num_sweeps=100, burn_in=20, inducing_points=inducing,
    )  # fmt: skip
    assert z.abs().max() > 3 * Z_TOL, z


@pytest.mark.parametrize("theta_sampler, surrogate", [("hmc", True), ("slice", True), ("hmc", False)])
def test_geweke_quick(theta_sampler, surrogate):
    """A small Geweke run in the fast tier (400 chains x 60 transitions), θ by HMC and by the slice move, with and
    without the surrogate-data move: the exact kernel passes, the broken one already fails."""
    case = BERNOULLI_CASE
    kw = {"theta_sampler": theta_sampler, "surrogate": surrogate}
    z = geweke_z_hyperparameters(case.make(), case.sample_targets, num_chains=400, num_sweeps=60, burn_in=10,
                                 num_reference=20_000, kernel_cls=lambda t: HyperparameterGibbsKernel(t, **kw))
    assert z.abs().max() <= Z_TOL, z
    z_broken = geweke_z_hyperparameters(case.make(), case.sample_targets, num_chains=400, num_sweeps=60, burn_in=10,
                                        num_reference=20_000, kernel_cls=lambda t: FRedrawSkipped(t, **kw))
    assert z_broken.abs().max() > Z_TOL, z_broken


class SurrogateMoveOnly(HyperparameterGibbsKernel):
    """The surrogate-data move of (θ, f) as the whole transition (Ω never read): on its own it must leave the
    posterior invariant."""

    def __init__(self, target, **kwargs):
        super().__init__(target, surrogate=True, **kwargs)

    def step(self, chains, generator, adapt):
        return self.surrogate_step(chains, generator, adapt)


class SurrogateMarginalDropped(SurrogateMoveOnly):
    """A deliberately wrong surrogate-data move: θ moved on p(θ) p(y | f_θ), without the surrogate data's marginal
    N(g | μ_θ, K_θ + S). (Dropping p(y | f_θ) instead would leave the *prior* invariant, which Geweke's test cannot
    tell from the posterior: the brute-force tests catch that one.)"""

    def _collapsed(self, mean, A, log_prior, ok, h, lam, d=None, others=None):
        log_p, q = super()._collapsed(mean, A, log_prior, ok, h, lam, d, others)
        log_z = log_p - log_prior
        return torch.where(torch.isfinite(log_z), log_p - log_z, log_p), q


@pytest.mark.parametrize(
    "case, theta_sampler", [(BERNOULLI_CASE, "hmc"), (STUDENT_T, "hmc"), (BERNOULLI_CASE, "slice")],
    ids=lambda v: getattr(v, "name", v),
)  # fmt: skip
def test_geweke_quick_surrogate_move(case, theta_sampler):
    """The surrogate-data move alone as the transition (Bernoulli, Student-t; 400 chains x 60 transitions; its slice
    scaled by the HMC move's scale, or not with the slice θ-sampler) passes; without the surrogate data's marginal it
    fails."""
    kw = {"num_chains": 400, "num_sweeps": 60, "burn_in": 10, "num_reference": 20_000}
    z = geweke_z_hyperparameters(case.make(), case.sample_targets,
                                 lambda t: SurrogateMoveOnly(t, theta_sampler=theta_sampler), **kw)
    assert z.abs().max() <= Z_TOL, z
    z_broken = geweke_z_hyperparameters(case.make(), case.sample_targets,
                                        lambda t: SurrogateMarginalDropped(t, theta_sampler=theta_sampler), **kw)
    assert z_broken.abs().max() > Z_TOL, z_broken


# ---------------------------------------------------------------------------------------------- (c) brute force
BF_X = torch.tensor([[0.0], [0.6], [1.2]], dtype=torch.float64)
BF_LOC, BF_SCALE = 0.0, 0.7  # log lengthscale ~ N(loc, scale²)
BF_CASES = {
    "bernoulli": (lambda: BernoulliLogitLikelihood().double(), (1.0, 0.0, 1.0), 16.0),
    "poisson": (lambda: PoissonLogitLikelihood(rate_scale=20.0).double(), (17.0, 2.0, 18.0), 4.0),
    "student_t": (lambda: StudentTLikelihood(df=4.0, scale=0.5).double(), (1.5, -1.5, 1.5), 2.0),
}


def _lengthscale_only_prior(outputscale: float) -> GPPrior:
    prior = gpytorch.priors.LogNormalPrior(BF_LOC, BF_SCALE)
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(lengthscale_prior=prior))
    kernel.outputscale = outputscale
    kernel.raw_outputscale.requires_grad_(False)
    return GPPrior(gpytorch.means.ZeroMean(), kernel).double()


def _fitc_covariance(u: torch.Tensor, outputscale: float, jitter: float, Z: torch.Tensor) -> torch.Tensor:
    r"""The covariance of :math:`f` in the inducing-point model at log lengthscales ``u``: :math:`A^\top A + D`,
    :math:`A = L_Z^{-1}K_{ZX}`, :math:`L_Z = \mathrm{chol}(K_{ZZ} + \epsilon I)`,
    :math:`d_i = \max(k_{ii} - \lVert a_i\rVert^2 - \epsilon, 0)` (the target's conventions), written out here."""
    ell = u.exp().view(-1, 1, 1)

    def rbf(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return outputscale * torch.exp(-0.5 * (a - b.T).square() / ell.square())

    L = torch.linalg.cholesky(rbf(Z, Z) + jitter * torch.eye(Z.shape[0]).double())
    A = torch.linalg.solve_triangular(L, rbf(Z, BF_X), upper=False)
    d = (outputscale - A.square().sum(-2) - jitter).clamp_min(0.0)
    return A.mT @ A + torch.diag_embed(d)


def _brute_force_log_lengthscale(likelihood, y, outputscale, jitter, grid=241, nodes=30, inducing=None):
    r"""The posterior density of :math:`u = \log\ell` on a grid: :math:`p(u \mid y) \propto \mathcal N(u \mid
    \text{loc}, \text{scale}^2) \int \mathcal N(f \mid 0, K_\ell + \epsilon I) \prod_i p(y_i \mid f_i)\, df`, the
    integral by Gauss-Hermite quadrature (``nodes``³) centred and scaled at the Laplace approximation of each
    integrand (Newton's method on :math:`f`); with ``inducing`` points :math:`Z` the inducing-point model's
    covariance (:func:`_fitc_covariance`) in place of :math:`K_\ell + \epsilon I`. Returns the grid, the normalised
    density and the posterior mean :math:`E[f \mid y]` (3,)."""
    u = torch.linspace(BF_LOC - 6 * BF_SCALE, BF_LOC + 6 * BF_SCALE, grid, dtype=torch.float64)
    d2 = (BF_X - BF_X.T).square()
    if inducing is None:
        K = outputscale * torch.exp(-0.5 * d2 / u.exp().view(-1, 1, 1).square()) + jitter * torch.eye(3).double()
    else:
        K = _fitc_covariance(u, outputscale, jitter, inducing)
    K_inv = torch.linalg.inv(K)
    f = torch.zeros(grid, 3, dtype=torch.float64)
    for _ in range(50):
        with torch.enable_grad():
            f_ = f.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(likelihood.log_prob_at(y, f_).sum(), f_, create_graph=True)
            (curv,) = torch.autograd.grad(grad.sum(), f_)
        H = K_inv + torch.diag_embed((-curv).clamp_min(1e-3))
        step = grad.detach() - (K_inv @ f.unsqueeze(-1)).squeeze(-1)
        f = f + torch.linalg.solve(H, step.unsqueeze(-1)).squeeze(-1)
    R = torch.linalg.cholesky(torch.linalg.inv(H))
    t, w = (torch.tensor(a) for a in np.polynomial.hermite.hermgauss(nodes))
    T = torch.cartesian_prod(t, t, t)
    log_w = torch.cartesian_prod(w, w, w).log().sum(-1)
    f_nodes = f.unsqueeze(1) + math.sqrt(2.0) * (T @ R.mT)  # (grid, nodes³, 3)
    prior = torch.distributions.MultivariateNormal(torch.zeros(3, dtype=torch.float64), K.unsqueeze(1))
    log_integrand = prior.log_prob(f_nodes) + likelihood.log_prob_at(y, f_nodes).sum(-1)
    log_I = torch.logsumexp(log_integrand + log_w + T.square().sum(-1), dim=1)
    log_I = log_I + 1.5 * math.log(2.0) + R.diagonal(dim1=-1, dim2=-2).log().sum(-1)
    log_post = -0.5 * ((u - BF_LOC) / BF_SCALE).square() + log_I
    density = (log_post - log_post.max()).exp()
    # E[f | y]: the nodes weighted by the integrand and the grid's posterior (a uniform grid whose ends carry ~0)
    log_node = log_integrand + log_w + T.square().sum(-1)
    log_node = log_node - torch.logsumexp(log_node, dim=1, keepdim=True) + log_post.unsqueeze(-1)
    weights = (log_node - log_node.max()).exp()
    f_mean = (weights.unsqueeze(-1) * f_nodes).sum((0, 1)) / weights.sum()
    return u, density / torch.trapezoid(density, u), f_mean


@pytest.mark.parametrize(
    "name, theta_sampler, surrogate",
    [*((name, "hmc", False) for name in BF_CASES), ("bernoulli", "slice", False),
     *((name, "hmc", True) for name in ("poisson", "student_t"))],
    ids=lambda v: str(v),
)  # fmt: skip
def test_lengthscale_posterior_against_brute_force(name, theta_sampler, surrogate):
    make, y, outputscale = BF_CASES[name]
    likelihood, y = make(), torch.tensor(y, dtype=torch.float64)
    sampler = GibbsSampler(_lengthscale_only_prior(outputscale), likelihood, BF_X, y, sample_hyperparameters=True)
    sampler.kernel.theta_sampler, sampler.kernel.surrogate = theta_sampler, surrogate
    assert [p.name for p in sampler.kernel.hyperparameters.parameters] == [LENGTHSCALE]
    u, density, _ = _brute_force_log_lengthscale(likelihood, y, outputscale, sampler.target.jitter)
    true_mean = float(torch.trapezoid(density * u, u))
    cut = BF_LOC - 0.5 * BF_SCALE  # a grid point: the tail integral has no half cell
    above = u >= cut - 1e-12
    true_tail = float(torch.trapezoid(density[above], u[above]))

    C, S = 64, 300
    samples = sampler.sample(S, warmup=100, num_chains=C, seed=0, progress=False)
    log_ell = samples.hyperparameters[LENGTHSCALE].reshape(C, S).log()
    mean, sd = float(log_ell.mean()), float(log_ell.std())
    ess = float(bulk_ess(log_ell.numpy()[..., None])[0])
    tolerance = 4.5 * sd / math.sqrt(ess)
    assert abs(mean - true_mean) <= tolerance, (mean, true_mean, tolerance)
    assert abs(true_mean - BF_LOC) > 3 * tolerance  # the data move the posterior: the test could fail
    indicator = (log_ell >= cut).double()
    ess_tail = float(bulk_ess(indicator.numpy()[..., None])[0])  # ESS is affine-invariant: the indicator's own
    tail_tolerance = 4.5 * math.sqrt(true_tail * (1 - true_tail) / ess_tail)
    assert abs(float(indicator.mean()) - true_tail) <= tail_tolerance, (float(indicator.mean()), true_tail)


# ---------------------------------------------------------------------------------------------- (d) refusals
def test_parameter_without_prior_is_refused():
    x, y = _data()
    model = GPPrior(gpytorch.means.ConstantMean(), gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()))
    with pytest.raises(ValueError, match=r"'mean_module.constant'.*requires_grad_\(False\)"):
        GibbsSampler(model.double(), BernoulliLogitLikelihood(), x, y, sample_hyperparameters=True)
    model.mean_module.raw_constant.requires_grad_(False)  # fixed: accepted, and not sampled
    sampler = GibbsSampler(model.double(), BernoulliLogitLikelihood(), x, y, sample_hyperparameters=True)
    assert [p.name for p in sampler.kernel.hyperparameters.parameters] == [OUTPUTSCALE, LENGTHSCALE]


class _PriorWithUnusedParameter(GPPrior):
    def __init__(self) -> None:
        super().__init__(gpytorch.means.ZeroMean(), gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()))
        self.unused = torch.nn.Parameter(torch.zeros(3))


def test_parameter_read_by_nothing_is_left_fixed():
    """A parameter that requires grad but that neither forward(x) nor a prior reads (e.g. an ApproximateGP's
    variational parameters) is not a hyper-parameter: left as it is."""
    x, y = _data()
    sampler = GibbsSampler(_PriorWithUnusedParameter().double(), BernoulliLogitLikelihood(), x, y,
                           sample_hyperparameters=True)  # fmt: skip
    assert "unused" not in [p.name for p in sampler.kernel.hyperparameters.parameters]


def test_no_free_parameter_is_refused():
    x, y = _data()
    model = _scaled_rbf_prior().requires_grad_(False)
    with pytest.raises(ValueError, match="nothing to sample"):
        GibbsSampler(model, BernoulliLogitLikelihood(), x, y, sample_hyperparameters=True)


def test_unsupported_options_are_refused():
    x, y = _data()
    model = _scaled_rbf_prior()
    with pytest.raises(ValueError, match="alpha = 0.5 does not apply"):
        GibbsSampler(model, BernoulliLogitLikelihood(), x, y, inducing_points=x[::4], alpha=0.5,
                     sample_hyperparameters=True)  # fmt: skip
    with pytest.raises(ValueError, match="overrelaxation"):
        GibbsSampler(model, BernoulliLogitLikelihood(), x, y, overrelaxation=-0.5, sample_hyperparameters=True)
    batched = GPPrior(
        gpytorch.means.ZeroMean(batch_shape=torch.Size([2])),
        gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.RBFKernel(batch_shape=torch.Size([2])), batch_shape=torch.Size([2])
        ),
    ).double()
    with pytest.raises(ValueError, match="inducing_points does not support.*latent_blocks"):
        GibbsSampler(batched, HeteroscedasticGaussianLikelihood(), x, torch.sin(x.squeeze(-1)), inducing_points=x[::4],
                     sample_hyperparameters=True)  # fmt: skip
    # supported: inducing points (alpha 0 or 1), and latent blocks on the exact model
    for alpha in (0.0, 1.0):
        sparse = GibbsSampler(model, BernoulliLogitLikelihood(), x, y, inducing_points=x[::4], alpha=alpha,
                              sample_hyperparameters=True)  # fmt: skip
        assert isinstance(sparse.kernel, HyperparameterGibbsKernel) and sparse.target.is_sparse
    blocked = GibbsSampler(batched, HeteroscedasticGaussianLikelihood(), x, torch.sin(x.squeeze(-1)),
                           sample_hyperparameters=True)  # fmt: skip
    assert blocked.target.blocks is not None and isinstance(blocked.kernel, HyperparameterGibbsKernel)
    with pytest.raises(ValueError, match="HMCSampler samples the exact posterior only"):  # method="hmc": section (j)
        posterior_sampler(model, BernoulliLogitLikelihood(), x, y, method="hmc", sample_hyperparameters=True,
                          inducing_points=x[::4])  # fmt: skip
    with pytest.raises(ValueError, match="sample_hyperparameters must be True or False"):
        GibbsSampler(model, BernoulliLogitLikelihood(), x, y, sample_hyperparameters=1)
    target = PosteriorTarget(model, BernoulliLogitLikelihood(), x, y)
    with pytest.raises(ValueError, match="theta_sampler must be one of"):
        HyperparameterGibbsKernel(target, theta_sampler="nuts")
    with pytest.raises(ValueError, match="max_steps must be a positive integer"):
        HyperparameterGibbsKernel(target, max_steps=0)
    with pytest.raises(ValueError, match="surrogate must be True, False or .warmup."):
        HyperparameterGibbsKernel(target, surrogate=None)
    sparse_target = PosteriorTarget(model, BernoulliLogitLikelihood(), x, y, inducing_points=x[::4])
    with pytest.raises(ValueError, match="surrogate=True needs the exact model"):
        HyperparameterGibbsKernel(sparse_target, surrogate=True)
    with pytest.raises(ValueError, match="surrogate='warmup' needs the exact model"):
        HyperparameterGibbsKernel(sparse_target, surrogate="warmup")
    sparse = GibbsSampler(model, BernoulliLogitLikelihood(), x, y, inducing_points=x[::4], sample_hyperparameters=True)
    sparse.kernel.surrogate = True  # set after construction: refused when a run starts
    with pytest.raises(ValueError, match="surrogate=True needs the exact model"):
        sparse.sample(2, warmup=0, num_chains=2, seed=0, progress=False)
    sampler = posterior_sampler(model, BernoulliLogitLikelihood(), x, y, sample_hyperparameters=True)
    assert isinstance(sampler, GibbsSampler) and isinstance(sampler.kernel, HyperparameterGibbsKernel)


# ---------------------------------------------------------------------------------------------- (e) the draws
@pytest.fixture(scope="module")
def run():
    with torch.random.fork_rng():
        torch.set_num_threads(1)
        x, y = _data()
        sampler = GibbsSampler(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y, sample_hyperparameters=True)
        samples = sampler.sample(30, warmup=20, num_chains=3, seed=0, progress=False)
    return sampler, samples


def test_draws_shapes_and_summary(run):
    sampler, samples = run
    assert samples.f.shape == (3, 30, 20) and samples.f_update == "hyper"
    draws = samples.hyperparameters
    assert draws[LENGTHSCALE].shape == (3, 30, 1, 1) and draws[OUTPUTSCALE].shape == (3, 30)
    assert samples.prior_parameter_names() == [OUTPUTSCALE, LENGTHSCALE]
    assert bool((samples.hyperparameters[LENGTHSCALE] > 0).all())
    summary = samples.summary(LENGTHSCALE)
    assert summary.rhat.shape == (1, 1) and bool(torch.isfinite(summary.ess_bulk).all())
    assert "covar_module.base_kernel.lengthscale[0, 0]" in repr(summary)
    assert sampler.kernel.last_run["evaluations_per_step"] >= 2
    last = samples.last_state()
    assert last.coordinates.shape == (1, 3, 2) and last.step_size.shape == (3,)
    assert last.scale.shape == (2,) and last.trajectory_length > 0  # HMC's adapted scale and length
    assert 0 < sampler.kernel.last_run["acceptance"] <= 1
    # the chains move θ: not all draws equal
    assert float(samples.hyperparameters[OUTPUTSCALE].std()) > 0


def test_resume_continues_bit_for_bit(run):
    sampler, samples = run
    more = sampler.resume(samples, 10, progress=False)
    whole = sampler.sample(40, warmup=20, num_chains=3, seed=0, progress=False)
    assert torch.equal(more.f, whole.f)
    assert all(torch.equal(more.hyperparameters[k], whole.hyperparameters[k]) for k in whole.hyperparameters)
    restored = PosteriorSamples.from_state_dict(samples.state_dict(), sampler=sampler)
    assert torch.equal(sampler.resume(restored, 10, progress=False).f, whole.f)
    joined = PosteriorSamples.cat([samples, samples], dim="chain")
    assert joined.last_state().hyper[LENGTHSCALE].shape == (6, 1, 1)


def test_surrogate_move_runs_adapts_and_resumes_bit_for_bit():
    """With the surrogate-data move: its noise S and width are adapted in warm-up, kept in the last state
    (``ChainState.tuning``, through ``state_dict``), and a resumed run continues bit for bit."""
    with torch.random.fork_rng():
        torch.set_num_threads(1)
        x, y = _data()
        sampler = GibbsSampler(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y, sample_hyperparameters=True)
        sampler.kernel.surrogate = True
        samples = sampler.sample(20, warmup=20, num_chains=3, seed=0, progress=False)
        tuning = samples.last_state().tuning
        assert tuning["surrogate_noise"].shape == (1, 20) and bool((tuning["surrogate_noise"] > 0).all())
        assert tuning["surrogate_width"].shape == () and float(tuning["surrogate_width"]) > 0
        assert sampler.kernel.last_run["surrogate_width"] == pytest.approx(float(tuning["surrogate_width"]))
        whole = sampler.sample(30, warmup=20, num_chains=3, seed=0, progress=False)
        restored = PosteriorSamples.from_state_dict(samples.state_dict(), sampler=sampler)
        more = sampler.resume(restored, 10, progress=False)
    assert torch.equal(more.f, whole.f)
    assert all(torch.equal(more.hyperparameters[k], whole.hyperparameters[k]) for k in whole.hyperparameters)
    with torch.random.fork_rng():
        sampler.kernel.surrogate = False  # converged with the move, continued without it: its tuning is not read
        plain = sampler.resume(restored, 5, progress=False)
    assert plain.f.shape == (3, 25, 20) and plain.last_state().tuning == {}
    # a state whose tuning is not usable (NaN, wrong shape) is recomputed, not read
    bad = dataclasses.replace(samples.last_state(), tuning={"surrogate_noise": torch.full((1, 20), math.nan),
                                                            "surrogate_width": torch.tensor(1.0)})
    sampler.kernel.surrogate = True
    again = sampler.sample(3, warmup=0, num_chains=3, init=bad, progress=False)
    assert bool(torch.isfinite(again.last_state().tuning["surrogate_noise"]).all())


def test_surrogate_move_in_warmup_only():
    """``surrogate="warmup"``: the move runs in warm-up only, so the draws after it are those of the kernel without
    the move from the same state (same seed stream), and a run without warm-up never makes it."""
    with torch.random.fork_rng():
        torch.set_num_threads(1)
        x, y = _data()
        sampler = GibbsSampler(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y, sample_hyperparameters=True)
        sampler.kernel.surrogate = "warmup"
        first = sampler.sample(5, warmup=10, num_chains=2, seed=0, progress=False)
        state = first.last_state()
        assert "surrogate_noise" in state.tuning
        with_move = sampler.sample(8, warmup=0, num_chains=2, init=state, progress=False)
        sampler.kernel.surrogate = False
        without = sampler.sample(8, warmup=0, num_chains=2, init=state, progress=False)
    assert torch.equal(with_move.f, without.f)


def test_resume_by_the_other_kind_is_refused(run):
    sampler, samples = run
    fixed = GibbsSampler(sampler.target.model, BernoulliLogitLikelihood(), sampler.target.x, sampler.target.y)
    with pytest.raises(ValueError, match="sampled hyper-parameters"):
        fixed.resume(samples, 5, progress=False)


def test_arviz_export_includes_the_hyperparameters(run):
    pytest.importorskip("arviz")
    _, samples = run
    posterior = samples.to_arviz().posterior
    assert LENGTHSCALE in posterior and OUTPUTSCALE in posterior
    assert posterior[OUTPUTSCALE].shape == (3, 30)


def test_predict_integrates_over_the_draws(run):
    sampler, samples = run
    x_new = torch.linspace(-4, 4, 5, dtype=torch.float64).unsqueeze(-1)
    pred = samples.predict(x_new, generator=torch.Generator().manual_seed(0))
    assert pred.f_mean.shape == (5,) and pred.f_draws.shape == (3, 30, 5) and pred.y_probs.shape == (5,)
    assert bool(((pred.y_probs > 0) & (pred.y_probs < 1)).all())
    # chunked (one draw per kernel evaluation) gives the same
    at_own = samples.predict(x_new, generator=torch.Generator().manual_seed(0), joint=False)
    assert torch.allclose(at_own.f_mean, pred.f_mean, atol=1e-12)


def test_predict_at_constant_theta_equals_fixed_theta_predict(run):
    """Every draw at the model's own θ: predict over θ gives the fixed-θ prediction (the same conditionals and the
    same random stream)."""
    sampler, samples = run
    params = sampler.kernel.hyperparameters
    at_model = params.constrained(params.initial(1))
    constant = {k: at_model[k][0].to(v).expand_as(v).clone() for k, v in samples.hyperparameters.items()}
    x_new = torch.linspace(-4, 4, 6, dtype=torch.float64).unsqueeze(-1)
    at_constant = dataclasses.replace(samples, hyperparameters=constant)
    over_theta = at_constant.predict(x_new, generator=torch.Generator().manual_seed(3))
    fixed = dataclasses.replace(samples, hyperparameters={}).predict(x_new, generator=torch.Generator().manual_seed(3))
    for field in ("f_mean", "f_var", "f_draws", "y_probs"):
        assert torch.allclose(getattr(over_theta, field), getattr(fixed, field), atol=1e-9), field


def test_multi_latent_and_linear_observations_run():
    """T = 2 independent priors (a batched model; the θ of both latents sampled) and pairwise comparisons (linear
    observations) run, record and predict."""
    x, y = _data(12)
    batched = _prior_model(torch.Size([2]))
    x2 = torch.cat([x, 0.5 * x], -1)
    sampler = GibbsSampler(batched, LogisticSoftmaxLikelihood(num_classes=2), x2, y, sample_hyperparameters=True)
    samples = sampler.sample(5, warmup=3, num_chains=3, seed=0, progress=False)
    assert samples.f.shape == (3, 5, 2, 12) and samples.hyperparameters[LENGTHSCALE].shape == (3, 5, 2, 1, 2)
    assert samples.hyperparameters["mean_module.constant"].shape == (3, 5, 2)
    assert samples.predict(x2[:3]).f_mean.shape == (2, 3)
    pairs = torch.tensor([[0, 1], [2, 3], [4, 1], [5, 6], [7, 8], [9, 10], [11, 0]])
    outcome = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    sampler = GibbsSampler(_scaled_rbf_prior(), PairwiseLogitLikelihood(), x, outcome, comparisons=pairs,
                           sample_hyperparameters=True)  # fmt: skip
    samples = sampler.sample(5, warmup=3, num_chains=2, seed=0, progress=False)
    assert samples.f.shape == (2, 5, 12) and samples.hyperparameters[OUTPUTSCALE].shape == (2, 5)
    assert samples.predict(x[:4]).f_draws.shape == (2, 5, 4)


def test_hyperparameters_is_the_draws_dict_and_old_states_load():
    """``samples.hyperparameters`` holds the draws; a state dict saved before the rename (key ``"hyper"``) still
    loads."""
    x, y = _data()
    sampler = GibbsSampler(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y, sample_hyperparameters=True)
    samples = sampler.sample(4, warmup=2, num_chains=2, seed=0, progress=False)
    assert LENGTHSCALE in samples.hyperparameters and not hasattr(samples, "hyper")
    state = samples.state_dict()
    state["hyper"] = state.pop("hyperparameters")
    restored = PosteriorSamples.from_state_dict(state, sampler=sampler)
    assert all(torch.equal(restored.hyperparameters[k], v) for k, v in samples.hyperparameters.items())


# ---------------------------------------------------------------------------------------------- (a') inducing points
@pytest.mark.parametrize("zero_noise", [False, True])
def test_noisy_collapsed_log_marginal_against_dense_identity(zero_noise):
    """With per-datum noise d (g = μ + Aᵀv + √d ε, v ~ N(0, I)): log Z and q(v) against the dense Gaussian identities
    of g ~ N(μ, S), S = AᵀA + D: log E exp(hᵀg - gᵀΛg / 2) = hᵀμ - μᵀΛμ / 2 - log|I + SΛ| / 2 + rᵀS(I + ΛS)⁻¹r / 2
    (r = h - Λμ), and v | tilts from E[v | g] = AS⁻¹(g - μ), Cov[v | g] = I - AS⁻¹Aᵀ; a zero precision, and a zero
    d (an inducing input among the data); d = 0 everywhere is the noiseless marginal."""
    g = torch.Generator().manual_seed(7)
    M, N = 2, 4
    A = 0.8 * torch.randn(2, M, N, generator=g, dtype=torch.float64)
    mu, h = (torch.randn(2, N, generator=g, dtype=torch.float64) for _ in range(2))
    lam = 2.0 * torch.rand(2, N, generator=g, dtype=torch.float64)
    lam[0, 1] = 0.0
    d = 0.1 + 0.5 * torch.rand(2, N, generator=g, dtype=torch.float64)
    if zero_noise:
        d[:, 0] = 0.0
    log_z, q = collapsed_log_marginal(A, mu, h, lam, d)
    for b in range(2):
        S = A[b].mT @ A[b] + torch.diag(d[b])
        Lam, eye = torch.diag(lam[b]), torch.eye(N, dtype=torch.float64)
        r = h[b] - lam[b] * mu[b]
        Sigma_g = S @ torch.linalg.inv(eye + Lam @ S)  # (S⁻¹ + Λ)⁻¹
        expected = h[b] @ mu[b] - 0.5 * mu[b] @ Lam @ mu[b] - 0.5 * torch.logdet(eye + S @ Lam) + 0.5 * r @ Sigma_g @ r
        assert math.isclose(float(log_z[b]), float(expected), rel_tol=0, abs_tol=1e-10)
        P = A[b] @ torch.linalg.inv(S)  # A S⁻¹
        mean_v = P @ Sigma_g @ r
        cov_v = torch.eye(M, dtype=torch.float64) - P @ A[b].mT + P @ Sigma_g @ P.mT
        assert torch.allclose(q.mean[b], mean_v, atol=1e-10)
        R = q.chol_covariance[b]
        assert torch.allclose(R @ R.mT, cov_v, atol=1e-10)
    noiseless, _ = collapsed_log_marginal(A, mu, h, lam)
    assert torch.allclose(collapsed_log_marginal(A, mu, h, lam, torch.zeros_like(d))[0], noiseless, atol=1e-14)


class NoiseConstantsDropped(HyperparameterGibbsKernel):
    """A deliberately wrong θ density of the inducing-point model: the pseudo-observations (h, λ) / (1 + λd) without
    the per-datum constants h²d / (2(1 + λd)) - log(1 + λd) / 2, which depend on θ through d."""

    def _collapsed(self, mean, A, log_prior, ok, h, lam, d=None, others=None):
        if d is not None:
            shrink = 1.0 / (1.0 + lam * d)
            h, lam, d = h * shrink, lam * shrink, None
        return super()._collapsed(mean, A, log_prior, ok, h, lam, d, others)


class OtherBlocksIgnored(HyperparameterGibbsKernel):
    """A deliberately wrong θ density with latent blocks: the other blocks' prior density at their current values
    left out (θ moved as if they did not exist)."""

    def _collapsed(self, mean, A, log_prior, ok, h, lam, d=None, others=None):
        return super()._collapsed(mean, A, log_prior, ok, h, lam, d, None)


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, inducing",
    [(BERNOULLI_CASE, (0.3, 1.0)), (STUDENT_T, (0.3, 1.0)), (HETEROSCEDASTIC_GAUSSIAN, None)],
    ids=["bernoulli-inducing", "student_t-inducing", "heteroscedastic_gaussian-blocks"],
)
def test_geweke_inducing_points_and_latent_blocks(case, inducing):
    """Joint test of (θ, f, y) with θ from its prior, 2000 chains x 150 transitions, with two inducing inputs among
    and between the data, and with latent blocks (two latents, each with its own θ): every |z| <= 4.5. The broken
    kernels fail in these configurations with fewer chains and transitions (test_geweke_detects_the_missing_f_redraw
    [inducing], test_geweke_quick_latent_blocks)."""
    z = geweke_z_hyperparameters(case.make(), case.sample_targets, inducing_points=inducing, **SLOW_GEWEKE)
    assert z.abs().max() <= Z_TOL, z


@pytest.mark.parametrize("theta_sampler", ["hmc", "slice"])
def test_geweke_quick_inducing_points(theta_sampler):
    """Inducing points in the fast tier, θ by HMC (its gradient by autograd) and by the slice move: two inducing
    inputs (Bernoulli, 400 chains x 60 transitions) and one far from the data, where d carries most of the prior
    variance (Student-t, 2000 x 100, the reference's 2.5e5 draws): the kernel passes; the θ density without the
    noise's constants fails the second."""
    def kernel(cls):
        return lambda target: cls(target, theta_sampler=theta_sampler)

    case = BERNOULLI_CASE
    z = geweke_z_hyperparameters(case.make(), case.sample_targets, kernel(HyperparameterGibbsKernel), num_chains=400,
                                 num_sweeps=60, burn_in=10, num_reference=20_000,
                                 inducing_points=(0.3, 1.0))  # fmt: skip
    assert z.abs().max() <= Z_TOL, z
    kw = {"num_chains": 2_000, "num_sweeps": 100, "burn_in": 10, "inducing_points": (3.0,)}
    z = geweke_z_hyperparameters(STUDENT_T.make(), STUDENT_T.sample_targets, kernel(HyperparameterGibbsKernel), **kw)
    assert z.abs().max() <= Z_TOL, z
    z_broken = geweke_z_hyperparameters(STUDENT_T.make(), STUDENT_T.sample_targets, kernel(NoiseConstantsDropped),
                                        **kw)  # fmt: skip
    assert z_broken.abs().max() > Z_TOL, z_broken


@pytest.mark.parametrize("theta_sampler", ["hmc", "slice"])
def test_geweke_quick_latent_blocks(theta_sampler):
    """Latent blocks in the fast tier (heteroscedastic Gaussian, 400 chains x 60 transitions), θ by HMC and by the
    slice move: the kernel passes; the θ density without the other block's prior density fails."""
    case = HETEROSCEDASTIC_GAUSSIAN
    kw = {"num_chains": 400, "num_sweeps": 60, "burn_in": 10, "num_reference": 20_000}
    z = geweke_z_hyperparameters(case.make(), case.sample_targets,
                                 lambda target: HyperparameterGibbsKernel(target, theta_sampler=theta_sampler), **kw)
    assert z.abs().max() <= Z_TOL, z
    z_broken = geweke_z_hyperparameters(case.make(), case.sample_targets,
                                        lambda target: OtherBlocksIgnored(target, theta_sampler=theta_sampler), **kw)
    assert z_broken.abs().max() > Z_TOL, z_broken


BF_Z = torch.tensor([[0.3]], dtype=torch.float64)


def _within(draws: torch.Tensor, truth: float, what: str) -> float:
    """Assert the mean of ``draws`` (chains, draws) is within 4.5 Monte Carlo standard errors (bulk ESS) of
    ``truth``; returns the tolerance."""
    ess = float(bulk_ess(draws.numpy()[..., None])[0])
    tolerance = 4.5 * float(draws.std()) / math.sqrt(ess)
    assert abs(float(draws.mean()) - truth) <= tolerance, (what, float(draws.mean()), truth, tolerance)
    return tolerance


@pytest.mark.parametrize("name", ["bernoulli", "student_t"])
def test_inducing_point_posterior_against_brute_force(name):
    """One inducing input (0.3) for the three data points: the posterior of log ℓ (mean and a tail probability) and
    E[f | y] against brute force with the inducing-point model's covariance AᵀA + D in place of K (the exact
    marginal of f when u and f | u are integrated out), within 4.5 Monte Carlo standard errors. E[f | y] catches an
    f-step that ignores the tilt (f ~ p(f | u), the fixed-θ sampler's), which Geweke's joint test cannot see."""
    make, y, outputscale = BF_CASES[name]
    likelihood, y = make(), torch.tensor(y, dtype=torch.float64)
    sampler = GibbsSampler(_lengthscale_only_prior(outputscale), likelihood, BF_X, y, inducing_points=BF_Z,
                           sample_hyperparameters=True)  # fmt: skip
    u, density, f_mean = _brute_force_log_lengthscale(likelihood, y, outputscale, sampler.target.jitter,
                                                      inducing=BF_Z)  # fmt: skip
    density, f_mean = density.detach(), f_mean.detach()
    true_mean = float(torch.trapezoid(density * u, u))
    cut = BF_LOC - 0.5 * BF_SCALE
    above = u >= cut - 1e-12
    true_tail = float(torch.trapezoid(density[above], u[above]))

    C, S = 64, 300
    samples = sampler.sample(S, warmup=100, num_chains=C, seed=0, progress=False)
    assert samples.u.shape == (C, S, 1)
    log_ell = samples.hyperparameters[LENGTHSCALE].reshape(C, S).log()
    tolerance = _within(log_ell, true_mean, "log lengthscale")
    assert abs(true_mean - BF_LOC) > 3 * tolerance  # the data move the posterior: the test could fail
    indicator = (log_ell >= cut).double()
    ess_tail = float(bulk_ess(indicator.numpy()[..., None])[0])
    tail_tolerance = 4.5 * math.sqrt(true_tail * (1 - true_tail) / ess_tail)
    assert abs(float(indicator.mean()) - true_tail) <= tail_tolerance, (float(indicator.mean()), true_tail)
    for i in range(3):
        _within(samples.f[..., i], float(f_mean[i]), f"E[f_{i} | y]")


def test_inducing_point_draws_and_predict():
    """The inducing-point chains record u at their own θ (u = μ_Z + L_θ v) and resume, predict
    conditions on u at each draw's θ, and at a constant θ equals the fixed-θ inducing-point prediction."""
    x, y = _data(12)
    Z = x[::3] + 0.1
    sampler = GibbsSampler(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y, inducing_points=Z,
                           sample_hyperparameters=True)  # fmt: skip
    samples = sampler.sample(6, warmup=4, num_chains=2, seed=0, progress=False)
    assert samples.f.shape == (2, 6, 12) and samples.u.shape == (2, 6, 4) and samples.f_update == "hyper"
    x_new = torch.linspace(-4, 4, 5, dtype=torch.float64).unsqueeze(-1)
    pred = samples.predict(x_new, generator=torch.Generator().manual_seed(0))
    assert pred.f_draws.shape == (2, 6, 5) and bool(((pred.y_probs > 0) & (pred.y_probs < 1)).all())
    params = sampler.kernel.hyperparameters
    at_model = params.constrained(params.initial(1))
    constant = {k: at_model[k][0].to(v).expand_as(v).clone() for k, v in samples.hyperparameters.items()}
    over_theta = dataclasses.replace(samples, hyperparameters=constant).predict(
        x_new, generator=torch.Generator().manual_seed(3)
    )
    fixed = dataclasses.replace(samples, hyperparameters={}).predict(x_new, generator=torch.Generator().manual_seed(3))
    for field in ("f_mean", "f_var", "f_draws", "y_probs"):
        assert torch.allclose(getattr(over_theta, field), getattr(fixed, field), atol=1e-9), field
    more = sampler.resume(samples, 3, progress=False)
    whole = sampler.sample(9, warmup=4, num_chains=2, seed=0, progress=False)
    assert more.u.shape == (2, 9, 4) and torch.equal(more.u, whole.u) and torch.equal(more.f, whole.f)


# ---------------------------------------------------------------------------------------------- (b') latent blocks
HET_Y = (4.0, 1.0, 7.0)  # three observations at one input: a large mean and a large spread
HET_XI, HET_LOC, HET_SCALE = 3.0, 0.0, 0.7  # max precision; log outputscale ~ N(loc, scale²) for both latents


def _heteroscedastic_model() -> GPPrior:
    batch = torch.Size([2])
    prior = gpytorch.priors.LogNormalPrior(HET_LOC, HET_SCALE)
    base = gpytorch.kernels.RBFKernel(batch_shape=batch)
    base.raw_lengthscale.requires_grad_(False)
    kernel = gpytorch.kernels.ScaleKernel(base, batch_shape=batch, outputscale_prior=prior)
    return GPPrior(gpytorch.means.ZeroMean(batch_shape=batch), kernel).double()


def test_latent_blocks_posterior_against_brute_force():
    """Heteroscedastic Gaussian, three observations at one input (so each latent is one value, f₀ and g₀, up to the
    jitter): the posterior of both latents' log outputscales (a, b) by brute force -- a 61 x 61 grid times
    p(y | a, b) = ∫ N(g₀ | 0, e^b) N(y | 0, e^a 11ᵀ + (ξσ(g₀))⁻¹ I) dg₀ (f₀ integrated in closed form, g₀ by
    Gauss-Hermite) -- against the sampler's posterior means of a and b within 4.5 Monte Carlo standard errors; the
    data move both away from the prior."""
    likelihood = HeteroscedasticGaussianLikelihood(max_precision=HET_XI).double()
    y = torch.tensor(HET_Y, dtype=torch.float64)
    # the likelihood is N(y | f, 1 / (ξ σ(g))): checked at one point before it is used in closed form
    check = likelihood.log_prob_at(y[:1], torch.tensor([[[0.4, -0.3]]], dtype=torch.float64))
    sd = (1.0 / (HET_XI * torch.sigmoid(torch.tensor(-0.3, dtype=torch.float64)))).sqrt()
    assert math.isclose(float(check.detach().sum()), float(torch.distributions.Normal(0.4, sd).log_prob(y[0])),
                        rel_tol=1e-12)  # fmt: skip

    grid = torch.linspace(HET_LOC - 5 * HET_SCALE, HET_LOC + 5 * HET_SCALE, 61, dtype=torch.float64)
    a, b = torch.meshgrid(grid, grid, indexing="ij")  # log outputscales of f and g
    t, w = (torch.tensor(v) for v in np.polynomial.hermite.hermgauss(100))
    g0 = (0.5 * b).exp().unsqueeze(-1) * math.sqrt(2.0) * t  # (61, 61, 100)
    noise = 1.0 / (HET_XI * torch.sigmoid(g0))
    cov = a.exp()[..., None, None, None] * torch.ones(3, 3, dtype=torch.float64) + noise[..., None, None] * torch.eye(
        3, dtype=torch.float64
    )
    log_lik = torch.distributions.MultivariateNormal(torch.zeros(3, dtype=torch.float64), cov).log_prob(y)
    log_marginal = torch.logsumexp(log_lik + w.log() - 0.5 * math.log(math.pi), dim=-1)
    log_post = log_marginal - 0.5 * ((a - HET_LOC) / HET_SCALE).square() - 0.5 * ((b - HET_LOC) / HET_SCALE).square()
    post = (log_post - log_post.max()).exp()
    post = post / post.sum()
    true_a, true_b = float((post * a).sum()), float((post * b).sum())

    x = torch.zeros(3, 1, dtype=torch.float64)
    sampler = GibbsSampler(_heteroscedastic_model(), likelihood, x, y, sample_hyperparameters=True)
    C, S = 32, 200
    samples = sampler.sample(S, warmup=50, num_chains=C, seed=0, progress=False)
    log_scale = samples.hyperparameters[OUTPUTSCALE].log()  # (C, S, 2)
    for latent, truth in ((0, true_a), (1, true_b)):
        tolerance = _within(log_scale[..., latent], truth, f"log outputscale of latent {latent}")
        assert abs(truth - HET_LOC) > 3 * tolerance, (latent, truth, tolerance)  # the data move the posterior


# ------------------------------------------------------------------------------------------ (f) the HMC move's parts
def test_collapsed_marginal_adjoints_against_autograd():
    """log Z from B = I + SKS equals collapsed_log_marginal's from a factor of K, and its adjoints in K and μ equal
    autograd's through that factor (a zero precision included)."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(3, 6, 6, generator=g, dtype=torch.float64)
    K = (X @ X.mT + 0.1 * torch.eye(6, dtype=torch.float64)).requires_grad_(True)
    mu = torch.randn(3, 6, generator=g, dtype=torch.float64).requires_grad_(True)
    h, lam = torch.randn(3, 6, generator=g, dtype=torch.float64), torch.rand(3, 6, generator=g, dtype=torch.float64)
    lam[0, 2] = 0.0
    out = collapsed_marginal_adjoints(K.detach(), mu.detach(), h, lam)
    reference, _ = collapsed_log_marginal(torch.linalg.cholesky(K).mT, mu, h, lam)
    assert bool(out.ok.all())
    assert torch.allclose(out.log_z, reference.detach(), rtol=0, atol=1e-12)
    d_K, d_mu = torch.autograd.grad(reference.sum(), (K, mu))
    assert torch.allclose(out.d_covariance, (d_K + d_K.mT) / 2, rtol=0, atol=1e-12)
    assert torch.allclose(out.d_mean, d_mu, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "constraint",
    [gpytorch.constraints.Positive(), gpytorch.constraints.GreaterThan(1e-4), gpytorch.constraints.LessThan(2.0),
     gpytorch.constraints.Interval(0.1, 3.0), None],
    ids=["positive", "greater_than", "less_than", "interval", "none"],
)  # fmt: skip
def test_coordinates_are_logarithmic_and_invert(constraint):
    """The sampled coordinates: c = a + e^s above a bound (log|dc/ds| = s), b - e^s below one, a logistic map on an
    interval, the identity without a constraint; coordinates(value(s)) = s and log_slope = log|dc/ds| by autograd."""
    param = PriorParameter("p", "raw_p", torch.Size([4]), constraint, 0, 4)
    s = torch.tensor([-3.0, -0.5, 0.7, 2.5], dtype=torch.float64, requires_grad=True)
    c = param.value(s)
    (slope,) = torch.autograd.grad(c.sum(), s)
    assert torch.allclose(param.log_slope(s.detach()), slope.abs().log(), rtol=0, atol=1e-12)
    assert torch.allclose(param.coordinates(c.detach()), s.detach(), rtol=0, atol=1e-10)
    if type(constraint) in (gpytorch.constraints.Positive, gpytorch.constraints.GreaterThan):
        assert torch.allclose(c.detach(), constraint.lower_bound.double() + s.detach().exp())
    # the raw value GPyTorch holds maps back to the same constrained value
    assert torch.allclose(param.constrained(param.raw(c.detach())), c.detach(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("gradient_error", [1.0, 1.5])
def test_hmc_move_leaves_a_gaussian_invariant(gradient_error):
    """4,000 chains started at exact draws of N(m, diag(s²)) keep that law through 5 HMC moves (scale, step size and
    time fixed), also with a wrong gradient (x 1.5: only the Metropolis test keeps the law); moments within 4.5
    standard errors."""
    g = torch.Generator().manual_seed(0)
    C, m, sd = 4000, torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64), torch.tensor([0.3, 1.0, 2.5]).double()

    def log_density(x, index):
        z = (x - m) / sd
        return -0.5 * z.square().sum(-1), -gradient_error * z / sd, ()

    x = m + sd * torch.randn(C, 3, generator=g, dtype=torch.float64)
    scale, step = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64), torch.full((C,), 0.6, dtype=torch.float64)
    accepted = []
    for _ in range(5):
        log_p, grad, _ = log_density(x, None)
        move = hmc_move(x, log_p, grad, (), log_density, scale, step, 1.7, g, 32)
        x = move.x
        accepted.append(float(move.accept_prob.mean()))
    z_mean = (x.mean(0) - m) / (sd / math.sqrt(C))
    z_var = (x.var(0) / sd.square() - 1) / math.sqrt(2 / C)
    assert float(z_mean.abs().max()) <= 4.5 and float(z_var.abs().max()) <= 4.5, (z_mean, z_var)
    assert 0.2 < min(accepted) < 1.0


def test_per_class_values_are_not_read_as_per_chain_when_classes_equal_chains():
    """Three classes and three chains: the class scales (3,) and the per-class mean constants keep their class
    dimension in the draws, (chains, draws, 3) (a shared value whose first dimension equals the number of chains used
    to be recorded as one value per chain)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(15, 2, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (15,), generator=g).double()
    batch = torch.Size([3])
    prior = GPPrior(
        gpytorch.means.ConstantMean(batch_shape=batch, constant_prior=gpytorch.priors.NormalPrior(0.0, 1.0)),
        gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=batch), batch_shape=batch),
    ).double()
    sampler = GibbsSampler(prior, LogisticSoftmaxLikelihood(num_classes=3).double(), x, y,
                           sample_hyperparameters=True)  # fmt: skip
    samples = sampler.sample(4, warmup=2, num_chains=3, seed=0, progress=False)
    draws = samples.hyperparameters
    assert draws["class_scales"].shape == (3, 4, 3) and draws["mean_module.constant"].shape == (3, 4, 3)
    more = sampler.resume(samples, 2, progress=False)
    assert more.hyperparameters["class_scales"].shape == (3, 6, 3)  # resume returns all draws


def test_noise_of_inverts_the_pathwise_draw():
    """``WhitenedGaussian.noise_of`` (the surrogate move's η) gives back the standard normal of a pathwise draw."""
    g = torch.Generator().manual_seed(0)
    M = torch.randn(3, 6, 6, generator=g, dtype=torch.float64)
    C = torch.linalg.cholesky(torch.eye(6, dtype=torch.float64) + M @ M.mT).mT.tril()  # any lower C, C diag > 0
    C = C + 2.0 * torch.eye(6, dtype=torch.float64)
    q = WhitenedGaussian(torch.randn(3, 6, generator=g, dtype=torch.float64), C)
    eps = torch.randn(3, 6, generator=g, dtype=torch.float64)
    assert torch.allclose(q.noise_of(q.draw(eps)), eps, atol=1e-12)
    assert torch.allclose(q.draw(q.noise_of(q.mean)), q.mean, atol=1e-12)


# ---------------------------------------------------------------------------------------------- (g) latent moves
class LatentMovesOnly(HyperparameterGibbsKernel):
    """The latent moves (HMC on p(f | θ, y), whitened) as the whole transition, θ and Ω never moved: on their own
    they must leave the posterior invariant."""

    def __init__(self, target, **kwargs):
        super().__init__(target, latent_moves=2, **kwargs)

    def step(self, chains, generator, adapt):
        return self.latent_step(chains, generator, adapt)


class LatentPriorDropped(LatentMovesOnly):
    """A deliberately wrong latent move: the whitened prior's term -|v|²/2 left out of its density (the likelihood
    alone, a flat prior on v)."""

    def _latent_density(self, chains):
        density = super()._latent_density(chains)

        def log_density(x, index):
            log_p, grad, payload = density(x, index)
            return log_p + 0.5 * x.square().sum(-1), grad + x, payload

        return log_density


@pytest.mark.parametrize("case", [BERNOULLI_CASE, STUDENT_T, TWO_BIT_LOGIT], ids=lambda case: case.name)
def test_geweke_quick_latent_moves(case):
    """The latent moves alone as the transition (400 chains x 60 transitions; one latent and two) pass Geweke's
    test; without the whitened prior's term they fail it."""
    kw = {"num_chains": 400, "num_sweeps": 60, "burn_in": 10, "num_reference": 20_000}
    z = geweke_z_hyperparameters(case.make(), case.sample_targets, LatentMovesOnly, **kw)
    assert z.abs().max() <= Z_TOL, z
    z_broken = geweke_z_hyperparameters(case.make(), case.sample_targets, LatentPriorDropped, **kw)
    assert z_broken.abs().max() > Z_TOL, z_broken


def test_geweke_quick_with_latent_moves():
    """The whole transition with a latent move first (Bernoulli, 400 chains x 60 transitions) passes."""
    case = BERNOULLI_CASE
    z = geweke_z_hyperparameters(case.make(), case.sample_targets, num_chains=400, num_sweeps=60, burn_in=10,
                                 num_reference=20_000,
                                 kernel_cls=lambda t: HyperparameterGibbsKernel(t, latent_moves=1))
    assert z.abs().max() <= Z_TOL, z


def test_latent_moves_adapt_and_resume_bit_for_bit():
    """With latent moves: their step sizes are adapted in warm-up, kept in the last state (``ChainState.tuning``,
    through ``state_dict``), and a resumed run continues bit for bit; a state without them starts from the default."""
    with torch.random.fork_rng():
        torch.set_num_threads(1)
        x, y = _data()
        sampler = GibbsSampler(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y, sample_hyperparameters=True)
        sampler.kernel.latent_moves = 2
        samples = sampler.sample(20, warmup=20, num_chains=3, seed=0, progress=False)
        step = samples.last_state().tuning["latent_step_size"]
        assert step.shape == (3,) and bool((step > 0).all()) and not torch.equal(step, torch.full_like(step, 0.1))
        assert sampler.kernel.last_run["latent_step_size"] == pytest.approx(float(step.mean()))
        assert sampler.kernel.last_run["latent_evaluations_per_step"] > 2
        whole = sampler.sample(30, warmup=20, num_chains=3, seed=0, progress=False)
        restored = PosteriorSamples.from_state_dict(samples.state_dict(), sampler=sampler)
        more = sampler.resume(restored, 10, progress=False)
    assert torch.equal(more.f, whole.f)
    assert all(torch.equal(more.hyperparameters[k], whole.hyperparameters[k]) for k in whole.hyperparameters)
    bad = dataclasses.replace(samples.last_state(), tuning={"latent_step_size": torch.full((3,), math.nan)})
    again = sampler.sample(3, warmup=0, num_chains=3, init=bad, progress=False)
    assert torch.equal(again.last_state().tuning["latent_step_size"], torch.full((3,), 0.1, dtype=torch.float64))


def test_latent_moves_are_refused_where_not_implemented():
    x, y = _data(8)
    target = PosteriorTarget(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y)
    for bad in (-1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="latent_moves must be a non-negative integer"):
            HyperparameterGibbsKernel(target, latent_moves=bad)
    sparse = PosteriorTarget(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y, inducing_points=x[::2])
    with pytest.raises(ValueError, match="latent_moves=1 needs the exact model with pointwise observations"):
        HyperparameterGibbsKernel(sparse, latent_moves=1)
    sampler = GibbsSampler(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y, inducing_points=x[::2],
                           sample_hyperparameters=True)
    sampler.kernel.latent_moves = 1  # set after construction: refused when a run starts
    with pytest.raises(ValueError, match="latent_moves=1 needs the exact model"):
        sampler.sample(2, warmup=0, num_chains=2, seed=0, progress=False)


# ---------------------------------------------------------------------------------------------- (h) dispersed starts
def _fresh_chains(kernel, num_chains, seed):
    g = torch.Generator().manual_seed(seed)
    f = kernel.target.initial_f(num_chains, g)
    return kernel.init(f, kernel.target.y, None, 0), g


def test_fresh_runs_start_the_chains_apart():
    """A fresh run moves each chain's coordinates by U(-s, s) (``init_spread``, default 1): the chains differ, stay
    within the spread of the model's values, with their prior recomputed; the same seed gives the same starts;
    ``init_spread=0`` keeps every chain at the model's values."""
    x, y = _data(8)
    kernel = HyperparameterGibbsKernel(PosteriorTarget(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y))
    chains, g = _fresh_chains(kernel, 5, 0)
    spread = kernel.overdisperse(chains, g)
    delta = spread.theta - chains.theta
    assert bool((delta.abs() <= kernel.init_spread).all()) and float(delta.abs().min()) > 0
    assert float(spread.theta.std(0).min()) > 0.1  # the chains differ
    again = kernel.overdisperse(*_fresh_chains(kernel, 5, 0))
    assert torch.equal(again.theta, spread.theta)
    prior = kernel._prior(spread.theta)
    assert torch.allclose(spread.A, prior.A) and torch.allclose(spread.log_prior, prior.log_prior)
    kernel.init_spread = 0.0
    assert torch.equal(kernel.overdisperse(chains, g).theta, chains.theta)
    for bad in (-0.5, math.nan, True, "1"):
        with pytest.raises(ValueError, match="init_spread must be a non-negative number"):
            HyperparameterGibbsKernel(kernel.target, init_spread=bad)


class FirstChainUnfactorisable(HyperparameterGibbsKernel):
    """Once ``failing`` is set (after ``init``), the prior reports chain 0's factorisation as failed."""

    failing = False

    def _prior(self, theta, grad=False):
        prior = super()._prior(theta, grad)
        ok = prior.ok.clone()
        ok[0] = ok[0] and not self.failing
        return prior._replace(ok=ok)


def test_a_start_that_cannot_be_factorised_keeps_the_model_values():
    x, y = _data(8)
    kernel = FirstChainUnfactorisable(PosteriorTarget(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y))
    chains, g = _fresh_chains(kernel, 3, 0)
    kernel.failing = True
    spread = kernel.overdisperse(chains, g)
    assert torch.equal(spread.theta[0], chains.theta[0]) and torch.equal(spread.A[0], chains.A[0])
    assert not torch.equal(spread.theta[1], chains.theta[1])


def test_sample_disperses_fresh_runs_only():
    """``sample`` without ``init`` calls the hook (the chains' first draws differ from those of ``init_spread=0``);
    a resumed run does not (it continues bit for bit: ``test_resume_continues_bit_for_bit``)."""
    x, y = _data(8)
    runs = []
    for spread in (1.0, 0.0):
        sampler = GibbsSampler(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y, sample_hyperparameters=True)
        sampler.kernel.init_spread = spread
        runs.append(sampler.sample(2, warmup=0, num_chains=3, seed=0, progress=False))
    assert not torch.equal(runs[0].hyperparameters[LENGTHSCALE], runs[1].hyperparameters[LENGTHSCALE])


# ---------------------------------------------------------------------------------------------- (j) joint HMC
class JointPriorDropped(HyperparameterHMCKernel):
    """A deliberately wrong joint move: the whitened prior's term -|v|²/2 left out of its density."""

    def _joint_density(self, chains):
        density = super()._joint_density(chains)
        P = chains.theta.shape[-1]

        def log_density(x, index):
            log_p, grad, payload = density(x, index)
            v = x[:, P:]
            grad = torch.cat([grad[:, :P], grad[:, P:] + v], -1)
            return log_p + 0.5 * v.square().sum(-1), grad, payload

        return log_density


@pytest.mark.parametrize("case", [BERNOULLI_CASE, STUDENT_T, TWO_BIT_LOGIT], ids=lambda case: case.name)
def test_geweke_quick_joint_hmc(case):
    """The joint HMC move of (θ, v) as the whole transition (400 chains x 60 transitions; one latent and two) passes
    Geweke's test; without the whitened prior's term it fails."""
    kw = {"num_chains": 400, "num_sweeps": 60, "burn_in": 10, "num_reference": 20_000}
    z = geweke_z_hyperparameters(case.make(), case.sample_targets, HyperparameterHMCKernel, **kw)
    assert z.abs().max() <= Z_TOL, z
    z_broken = geweke_z_hyperparameters(case.make(), case.sample_targets, JointPriorDropped, **kw)
    assert z_broken.abs().max() > Z_TOL, z_broken


@pytest.mark.slow
@pytest.mark.parametrize("case", [BERNOULLI_CASE, STUDENT_T], ids=lambda case: case.name)
def test_geweke_joint_hmc(case):
    """The joint HMC move at the slow tier's size (SLOW_GEWEKE): every |z| <= 4.5."""
    z = geweke_z_hyperparameters(case.make(), case.sample_targets, HyperparameterHMCKernel, **SLOW_GEWEKE)
    assert z.abs().max() <= Z_TOL, z


@pytest.mark.parametrize("name", list(BF_CASES))
def test_joint_hmc_lengthscale_posterior_against_brute_force(name):
    """As test_lengthscale_posterior_against_brute_force, for HMCSampler(..., sample_hyperparameters=True)."""
    make, y, outputscale = BF_CASES[name]
    likelihood, y = make(), torch.tensor(y, dtype=torch.float64)
    sampler = HMCSampler(_lengthscale_only_prior(outputscale), likelihood, BF_X, y, sample_hyperparameters=True)
    assert isinstance(sampler.kernel, HyperparameterHMCKernel)
    u, density, _ = _brute_force_log_lengthscale(likelihood, y, outputscale, sampler.target.jitter)
    true_mean = float(torch.trapezoid(density * u, u))
    C, S = 64, 300
    samples = sampler.sample(S, warmup=100, num_chains=C, seed=0, progress=False)
    log_ell = samples.hyperparameters[LENGTHSCALE].reshape(C, S).log()
    mean, sd = float(log_ell.mean()), float(log_ell.std())
    tolerance = 4.5 * sd / math.sqrt(float(bulk_ess(log_ell.numpy()[..., None])[0]))
    assert abs(mean - true_mean) <= tolerance, (mean, true_mean, tolerance)
    assert abs(true_mean - BF_LOC) > 3 * tolerance  # the data move the posterior: the test could fail


def test_joint_hmc_draws_resume_and_predict():
    """Draws of θ and f, an adapted step, length and scale over (θ, v) in the last state, a bit-for-bit resume
    (through ``state_dict``), ``predict``, and resumes by another kind of sampler refused."""
    with torch.random.fork_rng():
        x, y = _data()
        sampler = HMCSampler(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y, sample_hyperparameters=True)
        samples = sampler.sample(10, warmup=20, num_chains=3, seed=0, progress=False)
        state = samples.last_state()
        assert samples.f.shape == (3, 10, 20) and samples.hyperparameters[OUTPUTSCALE].shape == (3, 10)
        assert state.scale.shape == (2 + 20,) and state.trajectory_length is not None
        assert sampler.kernel.last_run["evaluations_per_step"] > 2
        whole = sampler.sample(15, warmup=20, num_chains=3, seed=0, progress=False)
        restored = PosteriorSamples.from_state_dict(samples.state_dict(), sampler=sampler)
        more = sampler.resume(restored, 5, progress=False)
        prediction = samples.predict(x[:4], generator=torch.Generator().manual_seed(0))
    assert torch.equal(more.f, whole.f)
    assert all(torch.equal(more.hyperparameters[k], whole.hyperparameters[k]) for k in whole.hyperparameters)
    assert prediction.f_draws.shape == (3, 10, 4) and bool(((prediction.y_probs > 0) & (prediction.y_probs < 1)).all())
    gibbs = GibbsSampler(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y, sample_hyperparameters=True)
    with pytest.raises(ValueError, match="drawn by HMC with sampled hyper-parameters, but this sampler runs Gibbs"):
        gibbs.resume(samples, 2, progress=False)
    with pytest.raises(ValueError, match="drawn by Gibbs with sampled hyper-parameters, but this sampler runs HMC"):
        sampler.resume(gibbs.sample(2, warmup=2, num_chains=3, seed=0, progress=False), 2, progress=False)


def test_joint_hmc_routes_and_refusals():
    x, y = _data(8)
    sampler = posterior_sampler(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y, method="hmc",
                                sample_hyperparameters=True)  # fmt: skip
    assert isinstance(sampler, HMCSampler) and isinstance(sampler.kernel, HyperparameterHMCKernel)
    auto = posterior_sampler(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y, sample_hyperparameters=True)
    assert isinstance(auto.kernel, HyperparameterGibbsKernel) and not isinstance(auto.kernel, HyperparameterHMCKernel)
    with pytest.raises(ValueError, match="num_steps is an option of HMC on the latents at fixed hyper-parameters"):
        HMCSampler(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y, sample_hyperparameters=True, num_steps=3)
    with pytest.raises(ValueError, match="sample_hyperparameters must be True or False"):
        HMCSampler(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y, sample_hyperparameters=1)
    sparse = PosteriorTarget(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y, inducing_points=x[::2])
    with pytest.raises(ValueError, match="inducing_points and linear observations are not supported"):
        HyperparameterHMCKernel(sparse)
    counts = PoissonLogitLikelihood(rate_scale=5.0, rate_scale_prior=(2.0, 0.5)).double()
    assert counts.samples_constants
    with pytest.raises(ValueError, match="samples them"):
        HMCSampler(_scaled_rbf_prior(), counts, x, y.round(), sample_hyperparameters=True)
    kernel = HMCSampler(_scaled_rbf_prior(), BernoulliLogitLikelihood(), x, y, sample_hyperparameters=True).kernel
    kernel.latent_moves = 1
    with pytest.raises(ValueError, match="options of the Gibbs kernel's moves"):
        MCMC(kernel).sample(2, warmup=0, num_chains=2, seed=0, progress=False)
