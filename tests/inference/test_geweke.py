r"""Geweke joint-distribution tests of the Gibbs sampler (identity (g) of docs/maths/identities.md).

The simulator is :func:`gpytorch_augment.testing.geweke_z` (see :mod:`gpytorch_augment.testing.geweke`): a tiny
model (explicit prior over :math:`N = 3` points), the marginal-conditional reference (:math:`2.5\cdot10^5` draws)
against the successive-conditional simulator in :math:`C` vectorised chains for 300 sweeps, dropping the first 50;
every :math:`|z| \le 4.5`. identity (g) asks for :math:`C = 2\cdot10^4`; the default :math:`C = 4000` keeps the suite
fast (the threshold stays 4.5; the environment variable ``GPYTORCH_AUGMENT_GEWEKE_CHAINS=20000`` runs the full
size). A sampler with a deliberately wrong potential (:math:`h/2`) must fail.

Likelihoods register once: the cases come from ``tests/likelihoods/registry.py`` (``CASES``; ``skip["g"]`` skips
this test), plus the test-only multi-latent case of ``tests/likelihoods/toy_multilatent.py``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import pytest
import torch

from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler
from gpytorch_augment.likelihoods import AugmentedLikelihood
from gpytorch_augment.testing.geweke import NUM_POINTS, NUM_REFERENCE, Z_TOL, geweke_z, tiny_prior
from tests.likelihoods.registry import CASES
from tests.likelihoods.toy_multilatent import SELF_TEST_CASES as _MULTI_LATENT_CASES

#: the slow tier (Geweke batteries): `pytest -m "not slow"` leaves it out
pytestmark = pytest.mark.slow

#: chains of the successive-conditional simulator; identity (g) asks for 2e4 (set GPYTORCH_AUGMENT_GEWEKE_CHAINS=20000)
NUM_CHAINS = int(os.environ.get("GPYTORCH_AUGMENT_GEWEKE_CHAINS", 4_000))
NUM_SWEEPS = 300
BURN_IN = 50

__all__ = ["NUM_POINTS", "NUM_REFERENCE", "Z_TOL", "tiny_prior"]  # imported by other test modules


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@dataclass
class GewekeCase:
    """A likelihood and a way to draw targets from it (the shape of the registry's cases)."""

    name: str
    make: Callable[[], AugmentedLikelihood]
    sample_targets: Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def _bernoulli_targets(f: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.bernoulli(torch.sigmoid(f), generator=generator)


LOCAL_CASES = [GewekeCase("bernoulli_logit", BernoulliLogitLikelihood, _bernoulli_targets)]


def _case_id(case: Any) -> str:
    return str(getattr(case, "name", None) or getattr(case, "id", None) or repr(case))


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
    """:func:`~gpytorch_augment.testing.geweke_z` with this module's sizes and its ``GibbsSampler`` (looked up at
    call time, so that a test can substitute a configured sampler); ``num_inducing`` and ``alpha`` configure the
    inducing-point sampler (exact only with Z = X, i.e. ``num_inducing = 3``)."""
    sampler_cls = functools.partial(GibbsSampler, alpha=alpha) if alpha else GibbsSampler
    return geweke_z(
        likelihood, sample_targets, inducing=inducing, make_kwargs=make_kwargs, num_chains=num_chains,
        num_sweeps=num_sweeps, burn_in=burn_in, seed=seed, num_reference=NUM_REFERENCE, sampler_cls=sampler_cls,
        num_inducing=num_inducing,
    )  # fmt: skip


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
