"""The sampler framework (:mod:`gpytorch_augment.inference.mcmc`): kernels are siblings run by one driver, a kernel of
one's own runs under it unchanged, the draws predict through the target's public interface, the names renamed in 0.3
and the ``kernel=`` keyword are gone, and the sampler modules import no cycle."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import gpytorch
import pytest
import torch

import gpytorch_augment
from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler, GPPrior, HMCSampler, posterior_sampler
from gpytorch_augment.inference import gibbs as gibbs_package
from gpytorch_augment.inference.gibbs import GibbsKernel
from gpytorch_augment.inference.hmc import HMCKernel
from gpytorch_augment.inference.mcmc import (
    MCMC,
    ChainState,
    MCMCKernel,
    PosteriorPrediction,
    PosteriorSamples,
    PosteriorSummary,
    PosteriorTarget,
)

PACKAGE = Path(gpytorch_augment.__file__).resolve().parent


def _problem(n: int = 6) -> tuple[GPPrior, torch.Tensor, torch.Tensor]:
    x = torch.linspace(-2, 2, n, dtype=torch.float64).unsqueeze(-1)
    prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel()).double()
    return prior, x, (x.squeeze(-1) > 0).double()


class _IndependenceChains(NamedTuple):
    f: torch.Tensor  # (C, T, N)
    y: torch.Tensor
    log_lik: torch.Tensor  # (C,)


class PriorIndependenceKernel(MCMCKernel[_IndependenceChains]):
    r"""Independence Metropolis-Hastings with the GP prior as proposal: accept :math:`f' \sim p(f)` with probability
    :math:`\min(1, p(y \mid f') / p(y \mid f))`. Exact for :math:`p(f \mid y)`, and written against the public
    interface of the target only: ``init`` and ``step`` are all a new kernel needs."""

    name = "prior-independence"

    def __init__(self, target: PosteriorTarget) -> None:
        self.target = target

    def _log_lik(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        value = self.target.likelihood.log_prob_at(y, self.target.to_likelihood(f))
        return value.reshape(f.shape[0], -1).sum(-1)

    def init(self, f: torch.Tensor, y: torch.Tensor, state: ChainState | None, num_warmup: int) -> _IndependenceChains:
        return _IndependenceChains(f, y, self._log_lik(f, y))

    def step(self, chains: _IndependenceChains, generator: torch.Generator, adapt: bool) -> _IndependenceChains:
        proposal = self.target.initial_f(chains.f.shape[0], generator)  # a prior draw per chain
        log_lik = self._log_lik(proposal, chains.y)
        u = torch.rand(log_lik.shape, generator=generator, dtype=log_lik.dtype)
        accept = u.log() < log_lik - chains.log_lik
        f = torch.where(accept.view(-1, 1, 1), proposal, chains.f)
        return _IndependenceChains(f, chains.y, torch.where(accept, log_lik, chains.log_lik))


def test_the_kernel_protocol_is_init_and_step():
    """Two abstract methods (NumPyro's ``init`` / ``sample``); every other method of the protocol is a hook with a
    default, and the driver's hooks are called in the documented order."""
    assert MCMCKernel.__abstractmethods__ == frozenset({"init", "step"})
    calls: list[str] = []

    class Traced(PriorIndependenceKernel):
        def init(self, *args: Any) -> _IndependenceChains:
            calls.append("init")
            return super().init(*args)

        def end_warmup(self, chains: _IndependenceChains) -> _IndependenceChains:
            calls.append("end_warmup")
            return chains

        def finish(self, chains: _IndependenceChains, num_kept_iterations: int) -> None:
            calls.append(f"finish({num_kept_iterations})")

    prior, x, y = _problem(n=4)
    MCMC(Traced(PosteriorTarget(prior, BernoulliLogitLikelihood(), x, y))).sample(
        3, warmup=2, thin=2, seed=0, progress=False
    )
    assert calls == ["init", "end_warmup", "finish(6)"]


def test_the_samplers_are_constructors_of_the_driver_without_forwarding():
    """``GibbsSampler`` / ``HMCSampler`` add only ``__init__`` to ``MCMC``: the settings are reached on ``kernel`` and
    ``target``, and ``sweep`` exists once, on the driver."""
    for cls in (GibbsSampler, HMCSampler):
        assert [name for name in vars(cls) if not name.startswith("__")] == [], cls
        assert "__init__" in vars(cls)
    prior, x, y = _problem()
    gibbs = GibbsSampler(prior, BernoulliLogitLikelihood(), x, y, overrelaxation=-0.5)
    hmc = HMCSampler(prior, BernoulliLogitLikelihood(), x, y, num_steps=3)
    assert gibbs.kernel.overrelaxation == -0.5 and hmc.kernel.num_steps == (3, 3)
    assert gibbs.target is gibbs.kernel.target and gibbs.target.likelihood is not None
    for name in ("likelihood", "model", "jitter", "terms", "refresh", "overrelaxation", "sample_latent"):
        assert not hasattr(gibbs, name), name
    for name in ("laplace", "step_size", "last_run", "num_steps", "curvature"):
        assert not hasattr(hmc, name), name
    assert [c for c in (MCMC, GibbsSampler, HMCSampler, GibbsKernel, HMCKernel) if "sweep" in vars(c)] == [MCMC]


def test_sweep_is_one_step_of_the_kernel():
    """``MCMC.sweep`` is ``init`` then one non-adapting ``step`` from the given latents, at the given targets: for
    Gibbs it draws as the first transition of a run from the same state and generator."""
    prior, x, y = _problem()
    sampler = GibbsSampler(prior, BernoulliLogitLikelihood(), x, y)
    f0 = torch.linspace(-1, 1, 6, dtype=torch.float64).expand(3, 6)
    swept = sampler.sweep(f0, generator=torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(4)
    kernel = sampler.kernel
    chains = kernel.step(kernel.init(f0.unsqueeze(1).clone(), sampler.target.y, None, 0), g, adapt=False)
    torch.testing.assert_close(swept.f, kernel.last_state(chains).f, rtol=0, atol=0)
    assert swept.f.shape == (3, 6) and swept.aux  # the last draw of Omega comes back too
    flipped = sampler.sweep(f0, y=1.0 - y, generator=torch.Generator().manual_seed(4)).f
    assert not torch.equal(flipped, swept.f)  # conditioned on the targets given
    custom = MCMC(PriorIndependenceKernel(PosteriorTarget(prior, BernoulliLogitLikelihood(), x, y)))
    assert custom.sweep(f0, generator=torch.Generator().manual_seed(0)).f.shape == (3, 6)


def test_the_samplers_are_sibling_drivers_of_their_kernels():
    prior, x, y = _problem()
    gibbs = GibbsSampler(prior, BernoulliLogitLikelihood(), x, y)
    hmc = HMCSampler(prior, BernoulliLogitLikelihood(), x, y)
    assert isinstance(gibbs, MCMC) and isinstance(hmc, MCMC)
    assert not issubclass(HMCSampler, GibbsSampler) and not issubclass(GibbsSampler, HMCSampler)
    assert isinstance(gibbs.kernel, GibbsKernel) and isinstance(hmc.kernel, HMCKernel)
    assert not hasattr(hmc, "inducing_distribution")  # no Gibbs option leaks into HMC
    for sampler in (gibbs, hmc):
        samples = sampler.sample(6, warmup=4, num_chains=2, seed=1, progress=False)
        assert type(samples) is PosteriorSamples and samples.target is sampler.target
        assert isinstance(samples.last_state(), ChainState)
        assert isinstance(samples.summary(), PosteriorSummary)
        assert isinstance(samples.predict(x[:2]), PosteriorPrediction)


def test_a_kernel_of_ones_own_runs_under_the_driver():
    """The driver owns chains, warm-up, thinning, recording and resume for any kernel; the draws predict."""
    prior, x, y = _problem(n=4)
    mcmc = MCMC(PriorIndependenceKernel(PosteriorTarget(prior, BernoulliLogitLikelihood(), x, y)))
    whole = mcmc.sample(30, warmup=10, thin=2, num_chains=3, seed=5, progress=False)
    assert whole.f.shape == (3, 30, 4) and whole.f_update == "prior-independence" and whole.num_sweeps == 70
    first = mcmc.sample(12, warmup=10, thin=2, num_chains=3, seed=5, progress=False)
    torch.testing.assert_close(mcmc.resume(first, 18, progress=False).f, whole.f, rtol=0, atol=0)
    assert whole.predict(torch.zeros(2, 1, dtype=torch.float64)).y_probs.shape == (2,)
    with pytest.raises(TypeError, match="MCMCKernel"):
        MCMC(object())


def test_the_custom_kernel_agrees_with_gibbs_in_distribution():
    """The posterior mean of f from the protocol-only kernel matches the Gibbs sampler's (a test that fails for a
    driver that mis-records draws or mis-applies thinning)."""
    prior, x, y = _problem(n=3)
    target = PosteriorTarget(prior, BernoulliLogitLikelihood(), x, y)
    ours = MCMC(PriorIndependenceKernel(target)).sample(3000, warmup=200, num_chains=4, seed=0, progress=False)
    gibbs = GibbsSampler(prior, BernoulliLogitLikelihood(), x, y).sample(
        3000, warmup=200, num_chains=4, seed=1, progress=False
    )
    mean_ours, mean_gibbs = ours.f.mean((0, 1)), gibbs.f.mean((0, 1))
    sd = gibbs.f.reshape(-1, 3).std(0)
    assert bool(((mean_ours - mean_gibbs).abs() < 0.15 * sd).all()), (mean_ours, mean_gibbs, sd)


def test_draws_predict_through_the_target_alone():
    prior, x, y = _problem()
    sampler = GibbsSampler(prior, BernoulliLogitLikelihood(), x, y)
    samples = sampler.sample(8, warmup=4, num_chains=2, seed=3, progress=False)
    restored = PosteriorSamples.from_state_dict(samples.state_dict(), sampler=sampler.target)
    x_new = torch.tensor([[0.3], [-1.1]], dtype=torch.float64)
    expected = samples.predict(x_new, joint=False).y_probs
    torch.testing.assert_close(restored.predict(x_new, joint=False).y_probs, expected)


@pytest.mark.parametrize(
    ("module", "old"),
    [
        (gpytorch_augment, "GibbsSamples"),
        (gpytorch_augment.inference, "GibbsState"),
        (gpytorch_augment.inference, "GibbsPrediction"),
        (gpytorch_augment.inference, "GibbsSummary"),
        (gibbs_package, "GibbsState"),
        (gibbs_package, "BlockedGibbsKernel"),
    ],
)
def test_the_names_renamed_in_0_3_are_gone(module, old):
    """0.x keeps no aliases (the CHANGELOG lists the renames): an old name is an ``AttributeError``."""
    with pytest.raises(AttributeError, match=old):
        getattr(module, old)


def test_posterior_sampler_takes_method_and_no_kernel_keyword():
    prior, x, y = _problem()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the keyword warns about nothing
        assert type(posterior_sampler(prior, BernoulliLogitLikelihood(), x, y, method="hmc")) is HMCSampler
        assert type(posterior_sampler(prior, BernoulliLogitLikelihood(), x, y, method="gibbs")) is GibbsSampler
    with pytest.raises(TypeError, match="kernel"):
        posterior_sampler(prior, BernoulliLogitLikelihood(), x, y, kernel="gibbs")


# ------------------------------------------------------------------------------------------------- import cycles
def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The package modules ``path`` imports at module level (relative imports resolved; a ``from package import
    name`` counts as an import of the submodule ``name`` where one exists, else of the package)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:  # module level only: lazy imports never cycle
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p) if node.level else node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if (PACKAGE.parent / sub.replace(".", "/")).with_suffix(".py").exists() else module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m.startswith("gpytorch_augment")}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the directed graph, or ``None``."""
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt]
            if state.get(nxt) is None and (found := visit(nxt, path + [nxt])) is not None:
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if state.get(start) is None and (found := visit(start, [start])) is not None:
            return found
    return None


def test_the_cycle_check_can_fail():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_sampler_modules_import_no_cycle():
    files = [p for sub in ("mcmc", "gibbs", "hmc") for p in (PACKAGE / "inference" / sub).glob("*.py")]
    graph = {_module_name(p): _imports(p) for p in files}
    modules = set(graph)
    graph = {m: {d for d in deps if d in modules and d != m} for m, deps in graph.items()}
    # a package's __init__ re-exports its modules; a module importing its own package's __init__ would be a cycle
    assert _cycle(graph) is None, _cycle(graph)
    assert len(graph) >= 12 and any(graph.values())  # the sampler modules were found, and their imports
