r"""Tests of :class:`~gpytorch_augment.HMCSampler` (Laplace-preconditioned HMC on the exact posterior).

Exactness, over every registered likelihood (``tests/likelihoods/registry.py``): the closed-form
``log_prob_and_grad`` equals autograd of ``log_prob_at``; the Geweke joint-distribution test with the HMC transition;
the brute-force posterior test (HMC means of f and f² against importance sampling from the prior, N = 3). Each can
fail: a likelihood whose log-density is halved (the wrong posterior) must fail both sampler tests. API: the same
``sample`` / ``resume`` / ``PosteriorSamples`` interface as ``GibbsSampler``.
"""

from __future__ import annotations

import math

import gpytorch
import pytest
import torch

from gpytorch_augment import BernoulliLogitLikelihood, HMCSampler, PosteriorSamples
from gpytorch_augment.inference.mcmc.adaptation import ChEESAdaptation
from gpytorch_augment.testing.geweke import Z_TOL
from gpytorch_augment.testing.hmc import hmc_geweke_z, hmc_posterior_z, violation_log_prob_and_grad
from tests.inference.test_geweke import _one_thread  # noqa: F401  (autouse: one torch thread)
from tests.likelihoods.registry import CASES


class HalvedLogLik(BernoulliLogitLikelihood):
    """A deliberately wrong likelihood for HMC: :math:`\\tfrac12 \\log p(y \\mid f)` (a flatter posterior)."""

    def log_prob_and_grad(self, y, f, **kwargs):
        value, grad = super().log_prob_and_grad(y, f, **kwargs)
        return value / 2, grad / 2

    def log_prob_grad(self, y, f, **kwargs):
        return super().log_prob_grad(y, f, **kwargs) / 2

    def log_prob_at(self, y, f, **kwargs):
        return super().log_prob_at(y, f, **kwargs) / 2


def _bernoulli_case():
    return next(c for c in CASES if c.name == "bernoulli_logit")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_log_prob_and_grad_matches_autograd(case):
    ratios = violation_log_prob_and_grad(case)
    assert max(ratios.values()) <= 1, ratios


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hmc_geweke(case):
    reason = case.skip.get("g")  # the Geweke test needs a normalised likelihood to simulate y from
    if reason:
        pytest.skip(reason)
    z = hmc_geweke_z(case)
    assert z.abs().max() <= Z_TOL, z


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hmc_posterior_matches_importance_sampling(case):
    z = hmc_posterior_z(case)
    assert z.abs().max() <= Z_TOL, z


MULTI_LATENT = [c for c in CASES if c.make().num_latents > 1]


@pytest.mark.parametrize("case", MULTI_LATENT, ids=lambda c: c.name)
def test_hmc_diagonal_curvature_is_exact(case):
    """The per-latent (block-diagonal) preconditioner of several latents: Geweke and brute force."""
    assert hmc_geweke_z(case, curvature="diagonal").abs().max() <= Z_TOL
    assert hmc_posterior_z(case, curvature="diagonal").abs().max() <= Z_TOL


@pytest.mark.parametrize("case", MULTI_LATENT, ids=lambda c: c.name)
def test_joint_curvature_is_the_projected_hessian(case):
    """``W`` holds, per data point, the negative Hessian of log p(y_i | f_i) over its T latents (autograd, one point
    at a time), projected onto the PSD cone; the diagonal option keeps its diagonal."""
    g = torch.Generator().manual_seed(3)
    likelihood = case.make()
    T, N = likelihood.num_latents, 6
    kwargs = case.make_kwargs(torch.Size([N]), g)
    f = torch.randn(T, N, generator=g, dtype=torch.float64)
    y = case.sample_targets(f.mT, g, **kwargs)
    sampler = HMCSampler(_GP().double(), likelihood, torch.randn(N, 1, generator=g, dtype=torch.float64), y,
                         **kwargs)
    W = sampler.kernel._curvature(f, sampler.target.y)
    for i in range(N):
        kw = {k: v[i : i + 1] for k, v in kwargs.items()}
        H = torch.autograd.functional.hessian(
            lambda fi: likelihood.log_prob_at(sampler.target.y[i : i + 1], fi.unsqueeze(0), **kw).sum(), f[:, i])
        evals, evecs = torch.linalg.eigh(-H)
        torch.testing.assert_close(W[i], (evecs * evals.clamp_min(0)) @ evecs.mT, rtol=1e-6, atol=1e-8)
    assert (torch.linalg.eigvalsh(W) >= -1e-10).all() and W[:, 0, 1].abs().max() > 1e-3  # the latents couple
    diagonal = HMCSampler(_GP().double(), likelihood, sampler.target.x, y, curvature="diagonal", **kwargs)
    P = diagonal.kernel.laplace
    assert P.A.shape == (T, N, N) and sampler.kernel.laplace.A.shape == (1, T * N, T * N)
    torch.testing.assert_close(P.W, torch.diag_embed(P.W.diagonal(dim1=-2, dim2=-1)))


def test_wrong_target_fails_both():
    case = _bernoulli_case()
    wrong = type(case)(**{**case.__dict__, "make": lambda: HalvedLogLik().double()})
    assert hmc_geweke_z(wrong).abs().max() > Z_TOL
    assert hmc_posterior_z(case, likelihood=HalvedLogLik().double()).abs().max() > Z_TOL


class _GP(gpytorch.Module):
    def __init__(self):
        super().__init__()
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _sampler(device: torch.device | str = "cpu", **kwargs):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(25, 2, generator=g)
    y = torch.bernoulli(torch.sigmoid(2 * x[:, 0]), generator=g)
    return HMCSampler(_GP().to(device), BernoulliLogitLikelihood().to(device), x.to(device), y.to(device), **kwargs)


def test_resume_equals_one_run_and_api(device):
    a, b = _sampler(device), _sampler(device)
    long = a.sample(30, warmup=20, num_chains=3, seed=1, progress=False)
    short = b.sample(12, warmup=20, num_chains=3, seed=1, progress=False)
    both = b.resume(short, 18, progress=False)
    assert torch.equal(both.f, long.f)  # bit for bit: the chains continue from their stored coordinates
    reloaded = PosteriorSamples.from_state_dict(short.state_dict())
    assert torch.equal(b.resume(reloaded, 18, progress=False).f, long.f)
    assert long.f.shape == (3, 30, 25) and long.f_update == "hmc"
    assert 0 < a.kernel.last_run["acceptance_rate"] <= 1 and a.kernel.step_size.shape == (3,)
    assert long.summary().rhat.shape == (25,)
    assert long.predict(torch.zeros(4, 2, device=device)).y_probs.shape == (4,)
    assert long.f.device.type == torch.device(device).type


def test_invalid_options():
    with pytest.raises(ValueError, match="num_steps"):
        _sampler(num_steps=(3, 2))
    with pytest.raises(ValueError, match="target_accept"):
        _sampler(target_accept=1.5)
    with pytest.raises(ValueError, match="preconditioner"):
        _sampler(preconditioner="cavi")
    with pytest.raises(ValueError, match="curvature"):
        _sampler(curvature="full")
    with pytest.raises(ValueError, match="exact posterior"):
        _sampler(inducing_points=torch.zeros(3, 2))


# ---------------------------------------------------------------------------------------- ChEES trajectories
CHEES = {"trajectory": "chees", "trajectory_length": 1.5}


@pytest.mark.parametrize("name", ["bernoulli_logit", "student_t", "logistic_softmax"])
def test_chees_trajectories_are_exact(name):
    """Jittered trajectories of per-chain step counts (chains that finish wait for the others): Geweke at a fixed
    length, and the posterior after warm-up adapted the length and the step sizes."""
    case = next(c for c in CASES if c.name == name)
    assert hmc_geweke_z(case, **CHEES).abs().max() <= Z_TOL
    assert hmc_posterior_z(case, trajectory="chees").abs().max() <= Z_TOL


def test_chees_fails_on_the_wrong_target():
    case = _bernoulli_case()
    wrong = type(case)(**{**case.__dict__, "make": lambda: HalvedLogLik().double()})
    assert hmc_geweke_z(wrong, **CHEES).abs().max() > Z_TOL


def test_chees_adapts_the_length_with_one_chain():
    """One chain has no cross-chain centre: the running mean of its states stands in, so the length moves (it stayed
    at its start when the centre was the one chain itself). The exact flow on N(0, I) lengthens a short start as
    with many chains, and so does a sampler's run with num_chains=1 (8 chains reach 1.9-2.0 here)."""
    g = torch.Generator().manual_seed(0)
    adapt = ChEESAdaptation(length=0.2, num_warmup=200, bounds=(0.01, 10.0))
    z = torch.randn(1, 1, 5, generator=g, dtype=torch.float64)
    for _ in range(200):
        p, u = torch.randn(z.shape, generator=g, dtype=z.dtype), float(torch.rand(1, generator=g))
        t = u * adapt.length
        z1, p1 = z * math.cos(t) + p * math.sin(t), p * math.cos(t) - z * math.sin(t)
        adapt.update(z, z1, p1, torch.ones(1, dtype=z.dtype), torch.full((1,), t, dtype=z.dtype))
        z = z1
    assert 1.0 < adapt.final < 4.0
    sampler = _sampler(trajectory="chees", trajectory_length=0.3)
    sampler.sample(5, warmup=300, num_chains=1, seed=0, progress=False)
    assert sampler.kernel.last_run["trajectory_length"] > 0.9


def test_chees_adapts_the_length_and_resume_continues_it():
    a, b = _sampler(trajectory="chees", trajectory_length=0.3), _sampler(trajectory="chees", trajectory_length=0.3)
    long = a.sample(30, warmup=60, num_chains=8, seed=2, progress=False)
    length = a.kernel.last_run["trajectory_length"]
    assert long.last_state().trajectory_length == length and length > 0.6  # a short start lengthens
    short = b.sample(10, warmup=60, num_chains=8, seed=2, progress=False)
    assert torch.equal(b.resume(short, 20, progress=False).f, long.f)
    assert a.kernel.trajectory_length == length  # sweep() runs at the adapted length
    with pytest.raises(ValueError, match="trajectory"):
        _sampler(trajectory="nuts")
    with pytest.raises(ValueError, match="trajectory_length"):
        _sampler(trajectory="chees", trajectory_length=0.0)
    with pytest.raises(ValueError, match="max_leapfrog_steps"):
        _sampler(trajectory="chees", max_leapfrog_steps=0)


@pytest.mark.parametrize("warmup", [1, 2])
def test_a_short_warmup_freezes_a_step_size_it_tried_successfully(warmup):
    """Dual averaging's first iterates probe steps far above the start (14x and 5x here after 1 and 2 iterations,
    every proposal then rejected); the frozen step is capped by the largest tried step that reached the target."""
    sampler = _sampler()
    samples = sampler.sample(40, warmup=warmup, num_chains=2, seed=0, progress=False)
    assert bool((sampler.kernel.last_run["step_size"] <= sampler.kernel.initial_step_size).all())
    assert sampler.kernel.last_run["acceptance_rate"] > 0.3
    assert bool((samples.f != samples.f[:, :1]).flatten(1).any(1).all())  # no chain frozen at one draw


def test_a_warmup_that_never_reaches_the_target_warns():
    sampler = _sampler(initial_step_size=200.0)
    with pytest.warns(RuntimeWarning, match="longer warmup"):
        sampler.sample(5, warmup=1, num_chains=2, seed=0, progress=False)
