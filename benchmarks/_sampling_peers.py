r"""The samplers of ``sampling.py`` behind one interface, ``run(...) -> Run``: an **end-to-end** piece (setup,
compilation, warm-up and ``draws`` per chain from prior draws) and a **steady-state** piece (``draws`` more per chain
from where the first ended, compiled code and adapted settings reused). Ours: ``GibbsSampler`` / ``HMCSampler``;
NumPyro's and Pyro's ``NUTS(potential_fn=U)`` on the original model in the whitened parametrisation
:math:`f_t = \mu_t + L_t v_t` with our sampler's prior factors (the same :math:`K + \epsilon I`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from _sampling_problems import JITTER, Problem

from gpytorch_augment import GibbsSampler, HMCSampler


@dataclass
class Run:
    """Draws of f (chains, draws, T*N) and wall seconds of the end-to-end and steady-state pieces."""

    f_e2e: np.ndarray
    e2e_wall: float
    f_steady: np.ndarray
    steady_wall: float
    extra: dict[str, Any] = field(default_factory=dict)


def whitened_prior(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """(mu (T, N), L (T, N, N)) exactly as our samplers factorise the prior."""
    terms = GibbsSampler(problem.prior, problem.likelihood, problem.x, problem.y, jitter=JITTER).target.terms
    return terms.mu.numpy().copy(), terms.L.numpy().copy()


def _flat(f: torch.Tensor) -> np.ndarray:
    f = f.detach().to(torch.float64).numpy()
    return f.reshape(f.shape[0], f.shape[1], -1)


def run_ours(problem: Problem, kind: str, chains: int, warmup: int, draws: int, seed: int, **opts: Any) -> Run:
    """``kind`` "gibbs" or "hmc"; ``opts`` go to the sampler's constructor. The end-to-end clock includes building
    the sampler (prior factorisation; for HMC the Laplace mode and preconditioner)."""
    cls = GibbsSampler if kind == "gibbs" else HMCSampler
    t0 = time.perf_counter()
    sampler = cls(problem.prior, problem.likelihood, problem.x, problem.y, jitter=JITTER, **opts)
    if kind == "hmc":
        sampler.kernel.laplace  # noqa: B018  (builds the preconditioner inside the end-to-end clock)
    first = sampler.sample(draws, warmup=warmup, num_chains=chains, seed=seed, progress=False)
    e2e = time.perf_counter() - t0
    t1 = time.perf_counter()
    second = sampler.sample(draws, warmup=0, num_chains=chains, init=first.last_state(), progress=False)
    steady = time.perf_counter() - t1
    extra = {"options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in opts.items()}}
    if kind == "hmc":
        extra.update({k: v for k, v in sampler.kernel.last_run.items() if k != "step_size"})
        extra["step_size_median"] = float(sampler.kernel.last_run["step_size"].median())
    return Run(_flat(first.f), e2e, _flat(second.f), steady, extra)


def _numpyro_potential(problem: Problem, mu: np.ndarray, L: np.ndarray):
    import jax.numpy as jnp

    mu_j, L_j = jnp.asarray(mu), jnp.asarray(L)

    def potential(v: Any) -> Any:
        f = mu_j + jnp.einsum("tij,tj->ti", L_j, v)
        return 0.5 * jnp.sum(v * v) - problem.jax_log_lik(f)

    return potential


def _numpyro_continue(kernel: Any, state: Any, chains: int, draws: int, vectorized: bool) -> tuple[Any, float]:
    """``draws`` more NUTS transitions per chain from the adapted ``state`` (leading chain axis) with the kernel's
    own ``sample``, compiled once (``jax.jit`` of a ``lax.scan``; all chains at once if ``vectorized``, else chain
    after chain): an untimed call compiles, the timed call is the steady state. (NumPyro's ``MCMC.run`` recompiles
    a ``potential_fn`` sampler on every call, so a second ``run`` would time the compiler.)"""
    import jax
    from jax import lax

    def one(st: Any) -> Any:
        def body(s: Any, _: Any) -> Any:
            s = kernel.sample(s, (), {})
            return s, (s.z, s.num_steps, s.diverging)

        return lax.scan(body, st, None, length=draws)[1]

    if vectorized:  # after a vectorized MCMC.run the kernel's sample is already vmapped over chains
        fn = jax.jit(one)
        jax.block_until_ready(fn(state))
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(state))
        return out, time.perf_counter() - t0
    fn = jax.jit(one)  # ``kernel``: a fresh, un-vmapped NUTS (see run_numpyro)
    jax.block_until_ready(fn(jax.tree_util.tree_map(lambda a: a[0], state)))
    t0 = time.perf_counter()
    parts = [jax.block_until_ready(fn(jax.tree_util.tree_map(lambda a, c=c: a[c], state))) for c in range(chains)]
    wall = time.perf_counter() - t0
    return jax.tree_util.tree_map(lambda *a: np.stack(a), *parts), wall


def run_numpyro(problem: Problem, mu: np.ndarray, L: np.ndarray, chains: int, warmup: int, draws: int, seed: int,
                dense: bool = False, chain_method: str = "sequential") -> Run:
    """NumPyro's NUTS with its defaults (target acceptance 0.8, max tree depth 10, diagonal or dense mass matrix
    adapted in windows), chains from prior draws of v: ``MCMC.run`` end to end, then
    :func:`_numpyro_continue` for the steady state."""
    import jax
    from numpyro.infer import MCMC, NUTS

    kernel = NUTS(potential_fn=_numpyro_potential(problem, mu, L), dense_mass=dense)
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=draws, num_chains=chains, chain_method=chain_method,
                progress_bar=False)
    init = np.random.default_rng(seed).standard_normal((chains,) + mu.shape)

    def to_f(v: Any) -> np.ndarray:
        return (mu + np.einsum("tij,cstj->csti", L, np.asarray(v))).reshape(chains, draws, -1)

    t0 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), init_params=init, extra_fields=("num_steps", "diverging"))
    v = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
    e2e = time.perf_counter() - t0
    fields = mcmc.get_extra_fields(group_by_chain=True)
    vectorized = chain_method == "vectorized"
    if not vectorized:  # MCMC vmaps the kernel's sample over chains: a fresh kernel gives the per-chain one (same
        # potential, settings and warm-up length; the adapted state has passed warm-up, so it no longer adapts)
        kernel = NUTS(potential_fn=_numpyro_potential(problem, mu, L), dense_mass=dense)
        kernel.init(jax.random.PRNGKey(seed), warmup, init_params=init[0])
    (z, steps, div), steady = _numpyro_continue(kernel, mcmc.last_state, chains, draws, vectorized)
    extra = {"chain_method": chain_method, "dense_mass": dense,
             "mean_leapfrog_steps_e2e": float(np.mean(np.asarray(fields["num_steps"]))),
             "mean_leapfrog_steps": float(np.mean(np.asarray(steps))), "divergences": int(np.sum(np.asarray(div)))}
    return Run(to_f(v), e2e, to_f(z), steady, extra)


def run_pyro(problem: Problem, mu: np.ndarray, L: np.ndarray, chains: int, warmup: int, draws: int, seed: int) -> Run:
    """Pyro's NUTS (defaults, diagonal mass), ``num_chains=1`` per chain, chains sequential; the potential is the
    likelihood's ``log_prob_at`` with autograd. Only the end-to-end draws exist (the steady state is the sampling
    phase of the same run, timed by ``hook_fn``)."""
    import pyro
    from pyro.infer import MCMC, NUTS

    mu_t, L_t = torch.as_tensor(mu), torch.as_tensor(L)
    T = problem.num_latents

    def potential(params: dict[str, torch.Tensor]) -> torch.Tensor:
        v = params["v"]
        f = mu_t + (L_t @ v.unsqueeze(-1)).squeeze(-1)
        arg = f[0] if T == 1 else f.T
        return 0.5 * (v * v).sum() - problem.likelihood.log_prob_at(problem.y, arg).sum()

    gen, out, e2e, steady = np.random.default_rng(seed), [], 0.0, 0.0
    for c in range(chains):
        pyro.set_rng_seed(seed + c)
        marks: dict[str, float] = {}

        def hook(kernel: Any, params: Any, stage: str, i: int) -> None:
            if stage.startswith("Warmup") and i == warmup - 1:
                marks["warm"] = time.perf_counter()

        init = {"v": torch.as_tensor(gen.standard_normal(mu.shape))}
        mcmc = MCMC(NUTS(potential_fn=potential), num_samples=draws, warmup_steps=warmup, initial_params=init,
                    hook_fn=hook, disable_progbar=True)
        t0 = time.perf_counter()
        mcmc.run()
        t1 = time.perf_counter()
        e2e, steady = e2e + t1 - t0, steady + t1 - marks.get("warm", t0)
        v = mcmc.get_samples()["v"].to(torch.float64)
        out.append((mu_t + (L_t @ v.unsqueeze(-1)).squeeze(-1)).reshape(draws, -1).numpy())
    f = np.stack(out)
    return Run(f, e2e, f, steady, {"chain_method": "sequential (num_chains=1 each)"})
