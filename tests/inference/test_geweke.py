r"""Geweke joint-distribution tests of the Gibbs sampler (``augmentations.md`` §12 (g)).

Two simulators of the joint :math:`p(f, y)` of a tiny model (explicit prior over :math:`N = 3` points):

* **marginal-conditional** (the reference): :math:`f \sim p(f)`, :math:`y \sim p(y \mid f)`, :math:`2.5\cdot10^5` draws;
* **successive-conditional**: from a prior draw, repeat "one full sampler sweep given the current :math:`y`,
  then :math:`y \sim p(y \mid f)`" in :math:`C` independent vectorised chains for 300 sweeps, dropping the
  first 50. §12 (g) asks for :math:`C = 2\cdot10^4`; the default :math:`C = 4000` keeps the suite fast (the
  threshold stays 4.5; the environment variable ``GPYTORCH_AUGMENT_GEWEKE_CHAINS=20000`` runs the full size).

If the sampler leaves :math:`p(f \mid y)` invariant, both simulate the same joint. The per-chain means of the
test functions :math:`f_i, f_i^2, y_i, f_i y_i` are compared with the reference by
:math:`z = \text{difference} / \text{combined standard error}` (from the across-chain spread); every
:math:`|z|` must be :math:`\le 4.5`. A sampler with a deliberately wrong potential (:math:`h/2`) must fail.

Likelihoods register once: the cases come from ``tests/likelihoods/registry.py`` (``CASES``, each with
``make()``, ``sample_targets(f, generator, **kwargs)`` and optionally ``make_kwargs(shape, generator)`` for
per-datum keyword data such as binomial trials, and ``skip`` -- ``skip["g"]`` skips this test), plus the
test-only multi-latent cases of ``tests/likelihoods/toy_multilatent.py``; the local list below is the fallback
when the registry does not exist.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import pytest
import torch

from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler
from gpytorch_augment.likelihoods import AugmentedLikelihood
from tests.inference.test_gibbs import FixedPrior

Z_TOL = 4.5
NUM_POINTS = 3
#: chains of the successive-conditional simulator; §12 (g) asks for 2e4 (set GPYTORCH_AUGMENT_GEWEKE_CHAINS=20000)
NUM_CHAINS = int(os.environ.get("GPYTORCH_AUGMENT_GEWEKE_CHAINS", 4_000))
NUM_SWEEPS = 300
BURN_IN = 50
#: marginal-conditional reference draws (§12 (g): 1e6; its standard error enters the combined SE, and at 2.5e5 it
#: is already ~8x smaller than the simulator's)
NUM_REFERENCE = 250_000


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@dataclass
class GewekeCase:
    """A likelihood and a way to draw targets from it (the shape of the shared registry's cases)."""

    name: str
    make: Callable[[], AugmentedLikelihood]
    sample_targets: Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def _bernoulli_targets(f: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.bernoulli(torch.sigmoid(f), generator=generator)


LOCAL_CASES = [GewekeCase("bernoulli_logit", BernoulliLogitLikelihood, _bernoulli_targets)]

try:  # the shared protocol-suite registry
    from tests.likelihoods.registry import CASES as _REGISTRY_CASES
except ImportError:
    _REGISTRY_CASES = None
try:  # test-only multi-latent likelihoods (exercise the T > 1 paths of the engine)
    from tests.likelihoods.toy_multilatent import SELF_TEST_CASES as _MULTI_LATENT_CASES
except ImportError:
    _MULTI_LATENT_CASES = []
CASES = list(_REGISTRY_CASES) if _REGISTRY_CASES else LOCAL_CASES


def _case_id(case: Any) -> str:
    return str(getattr(case, "name", None) or getattr(case, "id", None) or repr(case))


# ---------------------------------------------------------------------------------------------- the model
def tiny_prior(num_latents: int, seed: int = 0):
    """Explicit, well-conditioned 3x3 prior(s) with a non-zero mean (one per latent)."""
    g = torch.Generator().manual_seed(seed)
    shape = (num_latents,) if num_latents > 1 else ()
    A = torch.randn(shape + (NUM_POINTS, NUM_POINTS), generator=g)
    K = 1.5 * (A @ A.mT / NUM_POINTS + 0.3 * torch.eye(NUM_POINTS))
    mu = 0.5 * torch.randn(shape + (NUM_POINTS,), generator=g)
    return mu, K


def _to_likelihood_layout(f: torch.Tensor, num_latents: int) -> torch.Tensor:
    """Storage layout (C, N) / (C, T, N) -> likelihood layout (C, N) / (C, N, T)."""
    return f if num_latents == 1 else f.mT


def _test_functions(f: torch.Tensor, y: torch.Tensor, num_latents: int) -> torch.Tensor:
    """f, f^2, y and f*y for every point (and latent), flattened along the last dimension."""
    f = _to_likelihood_layout(f, num_latents)  # (C, N) or (C, N, T)
    y = y.to(f.dtype)
    if num_latents == 1:
        return torch.cat([f, f**2, y, f * y], -1)
    batch = f.shape[:-2]
    parts = [f, f**2, f * y.unsqueeze(-1), y]
    return torch.cat([p.reshape(*batch, -1) for p in parts], -1)


def _expand(kwargs: dict[str, torch.Tensor], batch: torch.Size) -> dict[str, torch.Tensor]:
    """Per-datum keyword data (N,) -> (*batch, N)."""
    return {k: v.expand(batch + v.shape) for k, v in kwargs.items()}


def _joint_z(
    likelihood: AugmentedLikelihood,
    sample_targets: Callable[..., torch.Tensor],
    inducing: bool = False,
    make_kwargs: Callable[[torch.Size, torch.Generator], dict[str, torch.Tensor]] | None = None,
    num_chains: int = NUM_CHAINS,
    num_sweeps: int = NUM_SWEEPS,
    burn_in: int = BURN_IN,
    seed: int = 0,
    num_inducing: int = 2,
    alpha: float = 0.0,
) -> torch.Tensor:
    """z-scores of the successive-conditional simulator against the marginal-conditional reference."""
    T = likelihood.num_latents
    mu, K = tiny_prior(T, seed=seed)
    model = FixedPrior(mu, K)
    x = torch.arange(NUM_POINTS, dtype=torch.float64).unsqueeze(-1)
    g = torch.Generator().manual_seed(seed)

    Z = x[:num_inducing] if inducing else None
    kwargs = make_kwargs(torch.Size([NUM_POINTS]), g) if make_kwargs is not None else {}

    def targets(f_storage: torch.Tensor) -> torch.Tensor:
        return sample_targets(_to_likelihood_layout(f_storage, T), g, **_expand(kwargs, f_storage.shape[:1]))

    # the prior the sampler targets: exact f ~ N(mu, K + jitter I); projected process f = mu + A^T v
    probe_y = targets(mu.unsqueeze(0))[0]
    sampler = GibbsSampler(model, likelihood, x, probe_y, inducing_points=Z, alpha=alpha, **kwargs)
    terms = sampler._terms
    root = terms.A.mT if inducing else terms.L  # f = mu + root @ eps
    mu_t = terms.mu

    def prior_draws(n: int) -> torch.Tensor:
        eps = torch.randn((n,) + root.shape[:-1][:-1] + (root.shape[-1],), generator=g)
        f = mu_t + (root @ eps.unsqueeze(-1)).squeeze(-1)  # (n, T, N)
        return f[:, 0] if T == 1 else f

    # marginal-conditional reference
    f_ref = prior_draws(NUM_REFERENCE)
    y_ref = targets(f_ref)
    ref = _test_functions(f_ref, y_ref, T)
    ref_mean, ref_se = ref.mean(0), ref.std(0) / math.sqrt(ref.shape[0])

    # successive-conditional simulator, chains vectorised
    f = prior_draws(num_chains)
    y = targets(f)
    total = torch.zeros_like(ref_mean.expand(num_chains, -1))
    for sweep in range(num_sweeps):
        f = sampler.sweep(f, y=y, generator=g).f
        y = targets(f)
        if sweep >= burn_in:
            total += _test_functions(f, y, T)
    chain_means = total / (num_sweeps - burn_in)
    sc_mean, sc_se = chain_means.mean(0), chain_means.std(0) / math.sqrt(num_chains)
    diff, se = sc_mean - ref_mean, (sc_se**2 + ref_se**2).sqrt()
    # a test function that is constant in both simulators (e.g. y_i with zero binomial trials) has z = 0
    return torch.where(se > 0, diff / se, torch.where(diff == 0, 0.0, math.inf))


class HalvedPotential(AugmentedLikelihood):
    """A deliberately wrong likelihood: every member delegates to ``base`` except that the potential is h/2."""

    def __init__(self, base: AugmentedLikelihood) -> None:
        super().__init__()
        self.base = base
        self.num_latents = base.num_latents

    def check_targets(self, y, **kwargs):
        return self.base.check_targets(y, **kwargs)

    def forward(self, f, *args, **kwargs):
        return self.base.forward(f, *args, **kwargs)

    def marginal(self, function_dist, *args, **kwargs):
        return self.base.marginal(function_dist, *args, **kwargs)

    def aux_prior(self, y):
        return self.base.aux_prior(y)

    def aux_conditional(self, y, f):
        return self.base.aux_conditional(y, f)

    def potential_and_precision(self, y, aux, f=None):
        h, lam = self.base.potential_and_precision(y, aux, f)
        return h / 2, lam

    def log_tilt_constant(self, y, aux):
        return self.base.log_tilt_constant(y, aux)

    def aux_posterior(self, y, f_mean, f_var):
        return self.base.aux_posterior(y, f_mean, f_var)

    def expected_potential_and_precision(self, y, q_aux, f_mean, f_var):
        return self.base.expected_potential_and_precision(y, q_aux, f_mean, f_var)

    def expected_log_tilt_constant(self, y, q_aux):
        return self.base.expected_log_tilt_constant(y, q_aux)

    def aux_kl(self, y, q_aux):
        return self.base.aux_kl(y, q_aux)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_geweke_exact_sampler(case):
    reason = (getattr(case, "skip", None) or {}).get("g")
    if reason:
        pytest.skip(reason)
    z = _joint_z(case.make(), case.sample_targets, make_kwargs=getattr(case, "make_kwargs", None))
    assert z.abs().max() <= Z_TOL, z


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_geweke_overrelaxed_exact_sampler(case, monkeypatch):
    """Over-relaxation (``overrelaxation=-0.7``) keeps every registered sampler exact, including the partially
    collapsed scan orders (heteroscedastic: ``f | g`` is over-relaxed w.r.t. the conditional *collapsed* over Ω,
    which is valid because Ω is redrawn before anything conditions on it) and the sampled likelihood constants.
    Fewer chains than the plain test: the over-relaxed chains mix faster."""
    reason = (getattr(case, "skip", None) or {}).get("g")
    if reason:
        pytest.skip(reason)
    monkeypatch.setitem(globals(), "GibbsSampler", partial(GibbsSampler, overrelaxation=-0.7))
    z = _joint_z(case.make(), case.sample_targets, make_kwargs=getattr(case, "make_kwargs", None), num_chains=2_000)
    assert z.abs().max() <= Z_TOL, z


@pytest.mark.parametrize("case", _MULTI_LATENT_CASES, ids=_case_id)
def test_geweke_multi_latent_paths(case):
    """The T > 1 paths (latent-major potentials, one batched draw for all latents, per-latent auxiliaries) on the
    test-only multi-latent likelihoods; fewer chains (the per-sweep cost scales with T)."""
    z = _joint_z(case.make(), case.sample_targets, make_kwargs=getattr(case, "make_kwargs", None), num_chains=2_000)
    assert z.abs().max() <= Z_TOL, z


def test_geweke_inducing_point_sampler():
    """The inducing-point (VI-Gibbs) sampler with Z = X (every d_i = 0) is an exact Gibbs sampler for any alpha.

    (With M < N it samples p(f | u) and targets an approximation, which a joint-distribution test cannot check: the
    (u, f) | Ω step is checked against its closed form in ``test_sparse_gibbs.py``.)"""
    case = LOCAL_CASES[0]
    z = _joint_z(
        case.make(), case.sample_targets, inducing=True, num_chains=3_000, num_sweeps=200, num_inducing=3, alpha=1.0
    )
    assert z.abs().max() <= Z_TOL, z


def test_geweke_detects_wrong_potential():
    """The test can fail: halving the potential h gives |z| far above the threshold, even with a tenth of the
    chains and a third of the sweeps."""
    case = LOCAL_CASES[0]
    z = _joint_z(HalvedPotential(case.make()), case.sample_targets, num_chains=2_000, num_sweeps=100, burn_in=20)
    assert z.abs().max() > 3 * Z_TOL, z
