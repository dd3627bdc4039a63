"""A sampler's draws depend on its arguments only: ``sample(seed=s)`` twice on one sampler object gives the same draws
as a fresh sampler with seed ``s``, whatever ran on that object in between (Gibbs, exact and inducing-point, and HMC,
whose step-size adaptation must not start from an earlier run's step size); ``resume`` still continues a run."""

from __future__ import annotations

import gpytorch
import pytest
import torch

from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler, GPPrior, HMCSampler, posterior_sampler
from gpytorch_augment.inference.mcmc.state import ChainState


def _data():
    x = torch.linspace(-3, 3, 30, dtype=torch.float64).unsqueeze(-1)
    y = (torch.sin(2 * x.squeeze(-1)) > 0).double()
    prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())).double()
    return prior, x, y


def _make(kind):
    prior, x, y = _data()
    if kind == "gibbs":
        return GibbsSampler(prior, BernoulliLogitLikelihood(), x, y)
    if kind == "sparse":
        return GibbsSampler(prior, BernoulliLogitLikelihood(), x, y, inducing_points=x[::3].clone())
    if kind == "overrelaxed":
        return GibbsSampler(prior, BernoulliLogitLikelihood(), x, y, overrelaxation=-0.5)
    if kind == "auto":
        return posterior_sampler(prior, BernoulliLogitLikelihood(), x, y)
    return HMCSampler(prior, BernoulliLogitLikelihood(), x, y)


KINDS = ["gibbs", "sparse", "overrelaxed", "hmc", "auto"]


@pytest.mark.parametrize("warmup", [15, 0])
@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_draws_on_a_reused_sampler(kind, warmup):
    sampler = _make(kind)
    first = sampler.sample(8, warmup=warmup, num_chains=3, seed=9, progress=False)
    sampler.sample(4, warmup=10, num_chains=2, seed=2, progress=False)  # runs in between: another chain count,
    sampler.sample(6, warmup=25, num_chains=3, seed=1, progress=False)  # and the same one
    again = sampler.sample(8, warmup=warmup, num_chains=3, seed=9, progress=False)
    fresh = _make(kind).sample(8, warmup=warmup, num_chains=3, seed=9, progress=False)
    assert torch.equal(first.f, again.f) and torch.equal(first.f, fresh.f)
    if first.u is not None:
        assert torch.equal(first.u, again.u) and torch.equal(first.u, fresh.u)


@pytest.mark.parametrize("kind", KINDS)
def test_resume_continues_after_other_runs(kind):
    """The carry-over that is meant: ``resume`` continues the run it is given (its generator and, for HMC, its
    adapted step sizes), even after other runs on the same sampler."""
    sampler = _make(kind)
    short = sampler.sample(5, warmup=15, num_chains=3, seed=4, progress=False)
    sampler.sample(5, warmup=30, num_chains=3, seed=5, progress=False)
    both = sampler.resume(short, 6, progress=False)
    long = _make(kind).sample(11, warmup=15, num_chains=3, seed=4, progress=False)
    # HMC maps its kept coordinates to latents in one product per run: equal up to rounding
    torch.testing.assert_close(both.f, long.f, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("drawn_by, resumed_by", [("gibbs", "hmc"), ("hmc", "gibbs"), ("overrelaxed", "hmc")])
def test_resume_by_the_other_kind_of_sampler_raises_before_running(drawn_by, resumed_by, monkeypatch):
    """It ran every transition, then failed with an internal message about the draws' layout."""
    samples = _make(drawn_by).sample(2, warmup=2, num_chains=2, seed=0, progress=False)
    other = _make(resumed_by)
    monkeypatch.setattr(type(other), "sample", lambda *args, **kwargs: pytest.fail("a transition ran"))
    kinds = {"gibbs": "Gibbs", "overrelaxed": "Gibbs", "hmc": "HMC"}
    with pytest.raises(ValueError, match=f"^samples were drawn by {kinds[drawn_by]}, but this sampler runs"):
        other.resume(samples, 3, progress=False)


def test_hmc_last_state_carries_the_adapted_step_sizes():
    sampler = _make("hmc")
    run = sampler.sample(5, warmup=20, num_chains=3, seed=4, progress=False)
    step_size = run.last_state().step_size
    assert step_size.shape == (3,) and torch.equal(step_size, sampler.kernel.step_size)
    assert not torch.equal(run.last_state().step_size, torch.ones(3, dtype=torch.float64))
    restored = ChainState.from_state_dict(run.last_state().state_dict())
    assert torch.equal(restored.step_size, run.last_state().step_size)
    # a run from a state without step sizes (a tensor init) adapts from initial_step_size, like a fresh sampler
    a = sampler.sample(5, warmup=0, num_chains=3, seed=6, init=run.last_state().f, progress=False)
    b = _make("hmc").sample(5, warmup=0, num_chains=3, seed=6, init=run.last_state().f, progress=False)
    assert torch.equal(a.f, b.f)


def test_chain_concatenation_keeps_step_sizes():
    from gpytorch_augment import PosteriorSamples

    sampler = _make("hmc")
    runs = [sampler.sample(4, warmup=10, num_chains=2, seed=s, progress=False) for s in (1, 2)]
    joined = PosteriorSamples.cat(runs, dim="chain")
    expected = torch.cat([r.last_state().step_size for r in runs])
    assert torch.equal(joined.last_state().step_size, expected)


@pytest.mark.parametrize("bad", [torch.ones(2, dtype=torch.float64), -torch.ones(3, dtype=torch.float64)])
def test_bad_init_step_size_is_named(bad):
    sampler = _make("hmc")
    state = sampler.sample(3, warmup=5, num_chains=3, seed=0, progress=False).last_state()
    state.step_size = bad
    with pytest.raises(ValueError, match="init.step_size"):
        sampler.sample(3, warmup=0, num_chains=3, init=state, progress=False)
