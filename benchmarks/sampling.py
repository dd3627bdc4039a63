r"""Effective samples per second: the blocked Gibbs sampler against Pyro's NUTS on the original model.

Two exact-GP posteriors (no inducing points), each sampled by

* **Gibbs** -- ``gpytorch_augment.GibbsSampler`` on the augmented model (:math:`\Omega \mid f`, then
  :math:`f \mid \Omega` in closed form), ``num_chains`` chains vectorised as one batch, with the exact over-relaxed
  :math:`f`-update for every :math:`a` of a grid (``--overrelaxation-grid``, default -0.5 ... -0.8) and the plain
  blocked Gibbs sampler (:math:`a = 0`). The headline :math:`a` is chosen *before* looking at the reported Gibbs
  draws: short pilot runs with other seeds (``--pilot-seeds``) estimate each :math:`a`'s minimum bulk, tail and sd
  ESS per second, and the :math:`a` whose worst ratio to NUTS over the three diagnostics is largest is the headline;
* **NUTS** -- Pyro's ``NUTS`` (adaptive step size and diagonal mass matrix, max tree depth 10, target acceptance
  0.8: Pyro's defaults) on the *original, non-augmented* posterior in the whitened parametrisation

  .. math::
      f = \mu + L v,\qquad v \sim \mathcal N(0, I),\qquad L = \mathrm{chol}(K + \epsilon I)\ \text{(computed once)},
      \qquad U(v) = \tfrac12\lVert v\rVert^2 - \textstyle\sum_i \log p(y_i \mid f_i),

  the same number of chains run one after the other (``num_chains=1`` each), with an analytic gradient of
  :math:`U` (checked against the likelihood's own ``log_prob_at`` and autograd), the cheapest way to drive Pyro's
  NUTS that we measured.

Problems (the kernel hyper-parameters are fixed, the same for both samplers, chosen by a short fixed procedure):

(a) **Bernoulli-logit** on KEEL ``heart`` (training split, 216 points, 13 standardised raw features);
(b) **Student-t** regression (:math:`\nu`, :math:`\sigma` fixed) on MASS ``Boston`` (training split, 405 points,
    13 standardised features, standardised ``medv``), with the hyper-parameters of ``regression.py``.

For each: warm-up and sampling wall (and CPU) times, time per draw, lag-1 autocorrelation, bulk ESS (the
estimator of ``GibbsSamples.summary()``, Vehtari et al. 2021, applied to both sets of draws of :math:`f`), ESS/s
(median and minimum over the :math:`N` latent coordinates), ArviZ's tail and sd ESS, and the Gibbs/NUTS ratios.

Run ``python benchmarks/sampling.py`` (full, < 20 min on 2 shared cores) or ``--quick`` (smoke check, < 2 min).
``results/sampling.md`` explains what is measured and how to read it; ``results/sampling.json`` holds everything.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import numpy as np  # noqa: E402
import regression  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler, GibbsSamples, StudentTLikelihood  # noqa: E402
from gpytorch_augment.datasets import load_keel  # noqa: E402
from gpytorch_augment.inference.diagnostics import bulk_ess, rank_normalized_rhat  # noqa: E402
from gpytorch_augment.likelihoods.augmented_likelihood import AugmentedLikelihood  # noqa: E402

#: the issue's target: Gibbs minimum ESS/s at least this many times NUTS's
TARGET_RATIO = 10.0
#: jitter added to the prior covariance by both samplers
JITTER = 1e-6

LogLik = Callable[[Tensor], tuple[Tensor, Tensor]]


# ---------------------------------------------------------------------------------------------------- problems
@dataclass
class Problem:
    """One posterior: data, the fixed prior, the augmented likelihood (Gibbs) and the same log-likelihood with its
    gradient in closed form (NUTS)."""

    key: str
    title: str
    x: Tensor
    y: Tensor
    prior: regression.GPPrior
    likelihood: AugmentedLikelihood
    log_lik: LogLik  # f (N,) -> (sum_i log p(y_i | f_i), d/df)
    hypers: dict[str, Any]
    data_note: str


def bernoulli_logit_log_lik(y: Tensor) -> LogLik:
    r""":math:`\sum_i y_i f_i - \log(1 + e^{f_i})` and its gradient :math:`y - \sigma(f)`, labels in {0, 1}."""

    def log_lik(f: Tensor) -> tuple[Tensor, Tensor]:
        return (y * f - torch.nn.functional.softplus(f)).sum(-1), y - torch.sigmoid(f)

    return log_lik


def student_t_log_lik(y: Tensor, df: float, scale: float) -> LogLik:
    r""":math:`\sum_i \log t_\nu(y_i \mid f_i, \sigma)` and its gradient :math:`(\nu + 1) r / (\nu\sigma^2 + r^2)`,
    :math:`r = y - f`."""
    c = df * scale**2
    const = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(math.pi * df) - math.log(scale)

    def log_lik(f: Tensor) -> tuple[Tensor, Tensor]:
        r = y - f
        return (const - (df + 1) / 2 * torch.log1p(r * r / c)).sum(-1), (df + 1) * r / (c + r * r)

    return log_lik


def check_log_lik(problem: Problem, seed: int = 0) -> dict[str, float]:
    """The closed-form log-likelihood and gradient used by NUTS against ``likelihood.log_prob_at`` and autograd, at
    a random ``f``; raises if they disagree (NUTS must sample the same posterior as Gibbs)."""
    gen = torch.Generator().manual_seed(seed)
    f = (problem.y.std() * torch.randn(problem.y.shape, generator=gen, dtype=problem.y.dtype)).requires_grad_(True)
    reference = problem.likelihood.log_prob_at(problem.y, f).sum()
    (grad_ref,) = torch.autograd.grad(reference, f)
    reference = reference.detach()
    value, grad = problem.log_lik(f.detach())
    out = {
        "abs_diff_log_lik": float((value - reference).abs()),
        "max_abs_diff_gradient": float((grad - grad_ref).abs().max()),
    }
    if out["abs_diff_log_lik"] > 1e-8 * max(1.0, float(reference.abs())) or out["max_abs_diff_gradient"] > 1e-8:
        raise RuntimeError(f"{problem.key}: NUTS log-likelihood disagrees with the likelihood's log_prob_at: {out}")
    return out


def choose_heart_hyperparameters(x: Tensor, y: Tensor, iterations: int = 300, lr: float = 0.05) -> dict[str, Any]:
    """Short fixed fit: GPyTorch SVGP with Z = all training inputs (a full-rank variational GP), Cholesky q(u), the
    logistic ``BernoulliLogitLikelihood`` as a plain GPyTorch likelihood, ``VariationalELBO``, Adam on q(u) and all
    hyper-parameters for ``iterations`` steps from lengthscales sqrt(D), outputscale 1, mean 0 (not the median
    heuristic: it is 0 for binary features)."""
    model = common.SparseGP(x)
    model.covar_module.base_kernel.lengthscale = math.sqrt(x.size(-1))
    final, seconds = common.train_svgp(model, BernoulliLogitLikelihood(), x, y, iterations, lr)
    return {
        **common.hyperparameter_values(model),
        "elbo_per_datum": final,
        "procedure": (
            f"GPyTorch SVGP with Z = all {x.shape[0]} training inputs (VariationalStrategy + "
            f"CholeskyVariationalDistribution, logistic likelihood, VariationalELBO), Adam lr={lr} on q(u) and "
            f"all hyper-parameters for {iterations} steps (not to convergence) from lengthscales sqrt(D), "
            "outputscale 1, mean 0; then frozen"
        ),
        "fit_seconds": seconds,
    }


def heart_problem(seed: int, hyper_iterations: int, max_train: int | None) -> Problem:
    data = load_keel("heart", test_fraction=0.2, seed=seed, max_train=max_train)
    x, y = data.x_train, data.y_train
    hypers = choose_heart_hyperparameters(x, y, iterations=hyper_iterations)
    return Problem(
        key="heart",
        title="heart, Bernoulli-logit",
        x=x,
        y=y,
        prior=regression.GPPrior(hypers),
        likelihood=BernoulliLogitLikelihood(),
        log_lik=bernoulli_logit_log_lik(y),
        hypers=hypers,
        data_note=(
            f"KEEL heart, load_keel('heart', test_fraction=0.2, seed={seed}) training split: {x.shape[0]} points, "
            f"{x.shape[1]} raw features standardised with training statistics, labels in {{0, 1}}"
        ),
    )


def boston_problem(seed: int, hyper_iterations: int, max_train: int | None) -> Problem:
    """The posterior of ``regression.py``'s model (same split, kernel, nu and sigma), but exact: no inducing points
    (``regression.py``'s k-means Z serve only to choose sigma, as there)."""
    data = regression.load_boston(test_fraction=0.2, seed=seed, max_train=max_train)
    num_inducing = 100 if max_train is None else 30
    Z = common.kmeans_inducing_points(data.x_train, num_inducing, seed=seed)
    hypers = regression.choose_hyperparameters(
        data, Z, iterations=hyper_iterations, scale_iterations=400 if max_train is None else 60
    )
    x, y = data.x_train, data.y_train
    return Problem(
        key="boston",
        title=f"Boston, Student-t (ν={hypers['df']:g}, σ={hypers['scale']:.3f})",
        x=x,
        y=y,
        prior=regression.GPPrior(hypers),
        likelihood=StudentTLikelihood(df=hypers["df"], scale=hypers["scale"], learn_scale=False),
        log_lik=student_t_log_lik(y, hypers["df"], hypers["scale"]),
        hypers=hypers,
        data_note=(
            f"MASS Boston training split ({data.split}): {x.shape[0]} points, {x.shape[1]} features; Student-t "
            f"nu = {hypers['df']:g}, sigma = {hypers['scale']:.4f} fixed (regression.py's procedure)"
        ),
    )


# ---------------------------------------------------------------------------------------------------- samplers
@dataclass
class Run:
    """Draws of f, shape (chains, draws, N), and the clocks of one sampler on one problem."""

    f: np.ndarray
    warmup_wall: float
    warmup_cpu: float
    sample_wall: float
    sample_cpu: float
    setup_wall: float
    extra: dict[str, Any]


class GibbsRunner:
    """``GibbsSampler`` on one problem, every chain in one vectorised batch, run in timed pieces: :meth:`warmup`
    (``sample(1, warmup=W-1)``), then any number of :meth:`draws` segments, each continuing the same chains and
    random stream (``sample(n, init=last_state)``; the concatenated draws equal those of one long run)."""

    def __init__(self, problem: Problem, chains: int, seed: int, overrelaxation: float = 0.0) -> None:
        with common.Stopwatch() as setup:
            self.sampler = GibbsSampler(
                problem.prior, problem.likelihood, problem.x, problem.y, jitter=JITTER, overrelaxation=overrelaxation
            )
        self.overrelaxation = overrelaxation
        self.setup_wall = setup.elapsed
        self.chains, self.seed = chains, seed
        self.state = None
        self.warm, self.clock = common.Stopwatch(), common.Stopwatch()
        self.parts: list[Any] = []
        self.num_warmup = 0

    def warmup(self, sweeps: int) -> None:
        if sweeps <= 0:
            return
        with self.warm:
            samples = self.sampler.sample(1, warmup=sweeps - 1, num_chains=self.chains, seed=self.seed, progress=False)
        self.state, self.num_warmup = samples.last_state(), sweeps

    def draws(self, num: int) -> None:
        seed = self.seed if self.state is None else None
        with self.clock:
            samples = self.sampler.sample(
                num, warmup=0, num_chains=self.chains, seed=seed, init=self.state, progress=False
            )
        self.state = samples.last_state()
        self.parts.append(samples)

    def result(self) -> Run:
        samples = GibbsSamples.cat(self.parts, dim="draw")
        summary = samples.summary()
        return Run(
            f=samples.f.detach().cpu().numpy().astype(np.float64),
            warmup_wall=self.warm.elapsed,
            warmup_cpu=self.warm.cpu,
            sample_wall=self.clock.elapsed,
            sample_cpu=self.clock.cpu,
            setup_wall=self.setup_wall,
            extra={
                "f_update": samples.f_update,
                "overrelaxation": self.overrelaxation,
                "sweeps_per_chain": self.num_warmup + samples.num_draws,
                "ms_per_sweep_all_chains": 1e3 * self.clock.elapsed / samples.num_draws,
                "summary_ess_bulk_min": float(summary.ess_bulk.min()),
                "summary_rhat_max": float(summary.rhat.max()),
            },
        )


class _WhitenedPotential(torch.autograd.Function):
    r""":math:`U(v) = \tfrac12\lVert v\rVert^2 - \ell(\mu + Lv)` with the analytic gradient
    :math:`v - L^\top \nabla_f\ell`."""

    @staticmethod
    def forward(ctx: Any, v: Tensor, mu: Tensor, L: Tensor, log_lik: LogLik) -> Tensor:
        value, grad_f = log_lik(mu + L @ v)
        ctx.save_for_backward(v, L, grad_f)
        return 0.5 * (v * v).sum() - value

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, None, None, None]:
        v, L, grad_f = ctx.saved_tensors
        return grad_output * (v - L.mT @ grad_f), None, None, None


def whitened_prior(problem: Problem) -> tuple[Tensor, Tensor]:
    """:math:`\\mu` and :math:`L = \\mathrm{chol}(K + \\epsilon I)`, computed once (float64)."""
    with torch.no_grad():
        prior = problem.prior.forward(problem.x)
        K = prior.lazy_covariance_matrix.to_dense().to(torch.float64)
        K = K + JITTER * torch.eye(K.shape[-1], dtype=K.dtype)
        return prior.mean.to(torch.float64), torch.linalg.cholesky(K)


class NutsRunner:
    r"""Pyro ``MCMC(NUTS(potential_fn=U), num_chains=1)``, one chain per call of :meth:`chain`; the warm-up /
    sampling boundary is timed by Pyro's ``hook_fn``. Each chain starts from a prior draw :math:`v \sim N(0, I)`
    (as Gibbs starts from a prior draw of f)."""

    def __init__(self, problem: Problem, warmup: int, draws: int, seed: int, max_tree_depth: int = 10) -> None:
        with common.Stopwatch() as setup:
            self.mu, self.L = whitened_prior(problem)
        self.setup_wall = setup.elapsed
        self.problem, self.num_warmup, self.num_draws = problem, warmup, draws
        self.seed, self.max_tree_depth = seed, max_tree_depth
        self.gen = torch.Generator().manual_seed(seed)
        self.calls = 0
        self.f_draws: list[np.ndarray] = []
        self.per_chain: list[dict[str, Any]] = []
        self.warm_wall = self.warm_cpu = self.sample_wall = self.sample_cpu = 0.0

    def potential(self, params: dict[str, Tensor]) -> Tensor:
        self.calls += 1
        return _WhitenedPotential.apply(params["v"], self.mu, self.L, self.problem.log_lik)

    def chain(self, index: int) -> None:
        import pyro
        from pyro.infer import MCMC, NUTS

        warmup, draws = self.num_warmup, self.num_draws
        pyro.set_rng_seed(self.seed + 1 + index)
        v0 = torch.randn(self.L.shape[-1], generator=self.gen, dtype=self.L.dtype)
        marks: dict[str, Any] = {}

        def hook(kernel: Any, params: Any, stage: str, i: int) -> None:
            if stage.startswith("Warmup") and i == warmup - 1:
                marks["warm"] = (time.perf_counter(), time.process_time(), self.calls)
            elif stage.startswith("Sample") and i == draws - 1:
                marks["diagnostics"] = dict(kernel.diagnostics())

        kernel = NUTS(
            potential_fn=self.potential,
            adapt_step_size=True,
            adapt_mass_matrix=True,
            full_mass=False,
            max_tree_depth=self.max_tree_depth,
            target_accept_prob=0.8,
        )
        mcmc = MCMC(
            kernel, num_samples=draws, warmup_steps=warmup, initial_params={"v": v0}, hook_fn=hook,
            disable_progbar=True,
        )
        self.calls = 0
        t0, c0 = time.perf_counter(), time.process_time()
        mcmc.run()
        t1, c1 = time.perf_counter(), time.process_time()
        tw, cw, gw = marks.get("warm", (t0, c0, 0))
        self.warm_wall += tw - t0
        self.warm_cpu += cw - c0
        self.sample_wall += t1 - tw
        self.sample_cpu += c1 - cw
        v = mcmc.get_samples()["v"].to(torch.float64)
        with torch.no_grad():
            self.f_draws.append((self.mu + v @ self.L.mT).numpy())
        divergences = [d for d in marks.get("diagnostics", {}).get("divergences", []) if d >= 0]
        stats = {
            "warmup_wall": tw - t0,
            "sample_wall": t1 - tw,
            "warmup_gradients": gw,
            "sample_gradients": self.calls - gw,
            "gradients_per_draw": (self.calls - gw) / draws,
            "step_size": float(kernel.step_size),
            "acceptance_rate": float(marks.get("diagnostics", {}).get("acceptance rate", float("nan"))),
            "divergences": len(divergences),
        }
        self.per_chain.append(stats)
        print(
            f"  NUTS chain {index}: warm-up {tw - t0:.1f} s ({gw} gradients), sampling {t1 - tw:.1f} s "
            f"({stats['gradients_per_draw']:.1f} gradients / draw, step {kernel.step_size:.3g}, "
            f"{len(divergences)} divergences)",
            flush=True,
        )

    def result(self) -> Run:
        total_grads = sum(c["sample_gradients"] for c in self.per_chain)
        raw_ms, raw_cpu_ms = raw_gradient_ms(self.problem, self.mu, self.L)
        return Run(
            f=np.stack(self.f_draws),
            warmup_wall=self.warm_wall,
            warmup_cpu=self.warm_cpu,
            sample_wall=self.sample_wall,
            sample_cpu=self.sample_cpu,
            setup_wall=self.setup_wall,
            extra={
                "per_chain": self.per_chain,
                "gradients_per_draw": total_grads / (len(self.per_chain) * self.num_draws),
                "ms_per_gradient_sampling": 1e3 * self.sample_wall / max(total_grads, 1),
                "ms_per_gradient_cpu": 1e3 * self.sample_cpu / max(total_grads, 1),
                "ms_per_gradient_raw": raw_ms,
                "ms_per_gradient_raw_cpu": raw_cpu_ms,
                "sample_cpu_overhead_free": 1e-3 * raw_cpu_ms * total_grads,
                "divergences": sum(c["divergences"] for c in self.per_chain),
                "max_tree_depth": self.max_tree_depth,
                "mass_matrix": "diagonal, adapted",
            },
        )


def run_interleaved_samplers(
    problem: Problem,
    warmup: int,
    gibbs_draws: int,
    nuts_draws: int,
    chains: int,
    seed: int,
    overrelaxations: list[float],
) -> tuple[dict[float, Run], Run]:
    """The samplers on one problem, interleaved so that they share the machine's load: the warm-ups of the Gibbs
    samplers (one per over-relaxation ``a``, ``a = 0`` the plain sampler), then for each chain k a segment of
    ``gibbs_draws / chains`` sweeps of each Gibbs sampler (all chains, continuing the stream) followed by NUTS
    chain k (its warm-up and draws). Each sampler's clocks count its own pieces only."""
    gibbs = {a: GibbsRunner(problem, chains, seed, overrelaxation=a) for a in overrelaxations}
    nuts = NutsRunner(problem, warmup, nuts_draws, seed)
    for runner in gibbs.values():
        runner.warmup(warmup)
    segments = [gibbs_draws // chains + (1 if k < gibbs_draws % chains else 0) for k in range(chains)]
    for k in range(chains):
        for runner in gibbs.values():
            runner.draws(segments[k])
        nuts.chain(k)
    return {a: runner.result() for a, runner in gibbs.items()}, nuts.result()


#: the diagnostics whose minimum over coordinates enters the choice of the over-relaxation
DIAGNOSTICS = ("bulk", "tail", "sd")


def min_ess(f: np.ndarray, bulk: np.ndarray | None = None) -> dict[str, float | None]:
    """Minimum over coordinates of the bulk ESS (ours; ``bulk`` if already computed) and of ArviZ's tail and sd ESS
    (``None`` without ArviZ)."""
    out: dict[str, float | None] = {"bulk": float((bulk_ess(f) if bulk is None else bulk).min())}
    for method in ("tail", "sd"):
        ess = arviz_ess(f, method)
        out[method] = float(ess.min()) if ess is not None else None
    return out


def pilot_overrelaxation(
    problem: Problem, grid: list[float], seeds: list[int], warmup: int, draws: int, chains: int
) -> dict[str, Any]:
    """Short Gibbs runs for every over-relaxation ``a`` of ``grid`` and every pilot seed (seeds other than the
    reported run's): minimum bulk / tail / sd ESS per second of sampling wall time, averaged over the seeds."""
    per_a: dict[float, dict[str, float | None]] = {}
    for a in grid:
        rates: dict[str, list[float]] = {k: [] for k in DIAGNOSTICS}
        for seed in seeds:
            runner = GibbsRunner(problem, chains, seed, overrelaxation=a)
            runner.warmup(warmup)
            runner.draws(draws)
            run = runner.result()
            for k, value in min_ess(run.f).items():
                if value is not None:
                    rates[k].append(value / run.sample_wall)
        per_a[a] = {k: (float(np.mean(v)) if v else None) for k, v in rates.items()}
    return {"grid": grid, "seeds": seeds, "warmup": warmup, "draws_per_chain": draws, "ess_per_s_min": per_a}


def choose_overrelaxation(pilot: dict[str, Any], nuts: dict[str, Any]) -> tuple[float, dict[float, float]]:
    """The grid value whose *worst* pilot ratio to NUTS over the diagnostics (min ESS/s, bulk, tail and sd) is
    largest; returns it and every grid value's worst ratio."""
    worst = {}
    for a, rates in pilot["ess_per_s_min"].items():
        ratios_a = [rates[k] / nuts[f"ess_{k}_per_s_min"] for k in DIAGNOSTICS if rates[k] is not None]
        worst[a] = min(ratios_a)
    return max(worst, key=worst.get), worst


def raw_gradient_ms(problem: Problem, mu: Tensor, L: Tensor, repeats: int = 300) -> tuple[float, float]:
    """Milliseconds (wall, CPU) of one evaluation of U(v) and its gradient alone, outside Pyro (the block with the
    median CPU time of 3)."""
    v = torch.zeros(L.shape[-1], dtype=L.dtype, requires_grad=True)
    blocks = []
    for _ in range(3):
        with common.Stopwatch() as clock:
            for _ in range(repeats):
                torch.autograd.grad(_WhitenedPotential.apply(v, mu, L, problem.log_lik), v)
        blocks.append((1e3 * clock.elapsed / repeats, 1e3 * clock.cpu / repeats))
    return sorted(blocks, key=lambda b: b[1])[1]


def smoke(problem: Problem) -> None:
    """A few untimed iterations of both samplers (first-call allocations, imports), on throw-away objects."""
    from pyro.infer import MCMC, NUTS

    GibbsSampler(problem.prior, problem.likelihood, problem.x, problem.y, jitter=JITTER).sample(
        4, warmup=2, num_chains=2, seed=0, progress=False
    )
    mu, L = whitened_prior(problem)

    def potential(params: dict[str, Tensor]) -> Tensor:
        return _WhitenedPotential.apply(params["v"], mu, L, problem.log_lik)

    init = {"v": torch.zeros(L.shape[-1], dtype=L.dtype)}
    MCMC(NUTS(potential_fn=potential, max_tree_depth=3), 3, 3, initial_params=init, disable_progbar=True).run()


# ---------------------------------------------------------------------------------------------------- diagnostics
def lag1_autocorrelation(f: np.ndarray) -> np.ndarray:
    """Lag-1 autocorrelation per coordinate of draws (chains, draws, N), pooled over chains."""
    centred = f - f.mean(axis=1, keepdims=True)
    return (centred[:, 1:] * centred[:, :-1]).sum(axis=(0, 1)) / (centred * centred).sum(axis=(0, 1))


def arviz_ess(f: np.ndarray, method: str = "bulk") -> np.ndarray | None:
    """ArviZ's ESS (``method`` "bulk": a cross-check of the estimator; "tail": 5 % and 95 % quantiles; "sd": the
    posterior standard deviation) of the same draws, or ``None`` without ArviZ."""
    try:
        import arviz as az
    except ImportError:
        return None
    return np.asarray(az.ess(az.convert_to_dataset(f), method=method)["x"].values)


def statistics(run: Run) -> dict[str, Any]:
    """Per-coordinate diagnostics of one run and their summaries."""
    f = run.f
    C, S, N = f.shape
    ess = bulk_ess(f)
    rhat = rank_normalized_rhat(f)
    rho1 = lag1_autocorrelation(f)
    az_ess = arviz_ess(f)
    minima = min_ess(f, bulk=ess)
    out = {
        "chains": C,
        "draws_per_chain": S,
        "num_coordinates": N,
        "warmup_wall": run.warmup_wall,
        "warmup_cpu": run.warmup_cpu,
        "sample_wall": run.sample_wall,
        "sample_cpu": run.sample_cpu,
        "setup_wall": run.setup_wall,
        "ms_per_draw": 1e3 * run.sample_wall / (C * S),
        "ms_per_draw_cpu": 1e3 * run.sample_cpu / (C * S),
        "lag1_autocorrelation_median": float(np.median(rho1)),
        "lag1_autocorrelation_max": float(rho1.max()),
        "ess_bulk_median": float(np.median(ess)),
        "ess_bulk_min": float(ess.min()),
        "ess_per_draw_median": float(np.median(ess)) / (C * S),
        "ess_per_s_median": float(np.median(ess)) / run.sample_wall,
        "ess_per_s_min": float(ess.min()) / run.sample_wall,
        "ess_per_cpu_s_median": float(np.median(ess)) / run.sample_cpu,
        "ess_per_cpu_s_min": float(ess.min()) / run.sample_cpu,
        "ess_per_s_min_incl_warmup": float(ess.min()) / (run.sample_wall + run.warmup_wall),
        "ess_per_s_median_incl_warmup": float(np.median(ess)) / (run.sample_wall + run.warmup_wall),
        "rhat_max": float(np.nanmax(rhat)),
        "arviz_ess_bulk_min": float(az_ess.min()) if az_ess is not None else None,
        "arviz_ess_bulk_median": float(np.median(az_ess)) if az_ess is not None else None,
        "arviz_ess_tail_min": minima["tail"],
        "arviz_ess_sd_min": minima["sd"],
        **run.extra,
    }
    out["ess_bulk_per_s_min"] = out["ess_per_s_min"]
    for k in ("tail", "sd"):
        value = out[f"arviz_ess_{k}_min"]
        out[f"ess_{k}_per_s_min"] = value / run.sample_wall if value is not None else None
    out["_ess"] = ess  # per coordinate, for the figure (dropped from the JSON summary)
    out["_rho"] = rho1
    return out


def agreement(gibbs: Run, nuts: Run, g: dict[str, Any], n: dict[str, Any]) -> dict[str, float]:
    r"""Do both samplers describe the same posterior? Per coordinate, :math:`z = (\bar f_G - \bar f_N) /
    \sqrt{\mathrm{MCSE}_G^2 + \mathrm{MCSE}_N^2}` with :math:`\mathrm{MCSE} = \mathrm{sd}/\sqrt{\mathrm{ESS}}`, and
    the ratio of posterior standard deviations."""
    mg, mn = gibbs.f.mean(axis=(0, 1)), nuts.f.mean(axis=(0, 1))
    sg, sn = gibbs.f.std(axis=(0, 1), ddof=1), nuts.f.std(axis=(0, 1), ddof=1)
    mcse = np.sqrt(sg**2 / g["_ess"] + sn**2 / n["_ess"])
    z = (mg - mn) / mcse
    ratio = sg / sn
    return {
        "max_abs_z_mean": float(np.abs(z).max()),
        "fraction_abs_z_gt_3": float((np.abs(z) > 3).mean()),
        "median_sd_ratio_gibbs_over_nuts": float(np.median(ratio)),
        "min_sd_ratio": float(ratio.min()),
        "max_sd_ratio": float(ratio.max()),
        "max_abs_mean_diff": float(np.abs(mg - mn).max()),
        "median_posterior_sd": float(np.median(sg)),
    }


def ratios(g: dict[str, Any], n: dict[str, Any]) -> dict[str, Any]:
    out = {
        "ess_per_s_median": g["ess_per_s_median"] / n["ess_per_s_median"],
        "ess_per_s_min": g["ess_per_s_min"] / n["ess_per_s_min"],
        "ess_per_cpu_s_median": g["ess_per_cpu_s_median"] / n["ess_per_cpu_s_median"],
        "ess_per_cpu_s_min": g["ess_per_cpu_s_min"] / n["ess_per_cpu_s_min"],
        "ess_per_s_min_incl_warmup": g["ess_per_s_min_incl_warmup"] / n["ess_per_s_min_incl_warmup"],
        "ms_per_draw_nuts_over_gibbs": n["ms_per_draw"] / g["ms_per_draw"],
        "ess_per_cpu_s_min_vs_overhead_free_nuts": (
            g["ess_per_cpu_s_min"] * n["sample_cpu_overhead_free"] / n["ess_bulk_min"]
        ),
        "ess_per_draw_median_gibbs_over_nuts": g["ess_per_draw_median"] / n["ess_per_draw_median"],
    }
    for k in ("tail", "sd"):
        have = g[f"ess_{k}_per_s_min"] is not None and n[f"ess_{k}_per_s_min"] is not None
        out[f"ess_{k}_per_s_min"] = g[f"ess_{k}_per_s_min"] / n[f"ess_{k}_per_s_min"] if have else None
    out["worst_of_bulk_tail_sd"] = min(
        v for v in (out["ess_per_s_min"], out["ess_tail_per_s_min"], out["ess_sd_per_s_min"]) if v is not None
    )
    out["target_min_ess_per_s_ge_10"] = bool(out["ess_per_s_min"] >= TARGET_RATIO)
    return out


# ---------------------------------------------------------------------------------------------------- output
def _public(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stats.items() if not k.startswith("_")}


def write_markdown(path: Path, result: dict[str, Any]) -> None:
    cfg, m = result["config"], result["machine"]
    headers = [
        "problem",
        "sampler",
        "chains × draws",
        "warm-up [s]",
        "sampling [s]",
        "ms / draw",
        "lag-1 autocorr. (median)",
        "bulk ESS median / min",
        "ESS/s median",
        "ESS/s min",
        "ESS/CPU-s min",
        "tail / sd ESS min (ArviZ)",
        "max R̂",
    ]
    rows = []
    for p in result["problems"]:
        for i, (label, s) in enumerate(_gibbs_rows(p) + [("NUTS (Pyro)", p["nuts"])]):
            rows.append(
                [
                    p["title"] if i == 0 else "",
                    label,
                    f"{s['chains']} × {s['draws_per_chain']}",
                    f"{s['warmup_wall']:.1f}",
                    f"{s['sample_wall']:.1f}",
                    f"{s['ms_per_draw']:.2f}",
                    f"{s['lag1_autocorrelation_median']:.3f}",
                    f"{s['ess_bulk_median']:.0f} / {s['ess_bulk_min']:.0f}",
                    f"{s['ess_per_s_median']:.1f}",
                    f"{s['ess_per_s_min']:.1f}",
                    f"{s['ess_per_cpu_s_min']:.1f}",
                    f"{_num(s['arviz_ess_tail_min'])} / {_num(s['arviz_ess_sd_min'])}",
                    f"{s['rhat_max']:.3f}",
                ]
            )
    ratio_headers = [
        "problem",
        "Gibbs",
        "bulk ESS/s ratio, median",
        "bulk ESS/s ratio, min",
        "tail ESS/s ratio, min",
        "sd ESS/s ratio, min",
        "worst of bulk / tail / sd",
        "bulk min, CPU time",
        "bulk min, incl. warm-up",
        "bulk min, CPU, vs overhead-free NUTS",
        "time / draw NUTS ÷ Gibbs",
        f"target ≥ {TARGET_RATIO:g}× (min bulk ESS/s)",
    ]
    ratio_rows = []
    for p in result["problems"]:
        for i, (label, r) in enumerate(_ratio_rows(p)):
            ratio_rows.append(
                [
                    p["title"] if i == 0 else "",
                    label.removeprefix("Gibbs (").removesuffix(")"),
                    f"{r['ess_per_s_median']:.1f}×",
                    f"**{r['ess_per_s_min']:.1f}×**",
                    _times(r["ess_tail_per_s_min"]),
                    _times(r["ess_sd_per_s_min"]),
                    f"{r['worst_of_bulk_tail_sd']:.1f}×",
                    f"{r['ess_per_cpu_s_min']:.1f}×",
                    f"{r['ess_per_s_min_incl_warmup']:.1f}×",
                    f"{r['ess_per_cpu_s_min_vs_overhead_free_nuts']:.1f}×",
                    f"{r['ms_per_draw_nuts_over_gibbs']:.1f}×",
                    "met" if r["target_min_ess_per_s_ge_10"] else "**NOT met**",
                ]
            )
    pilot_headers = [
        "problem",
        "a",
        "pilot min bulk ESS/s",
        "pilot min tail ESS/s",
        "pilot min sd ESS/s",
        "worst pilot ratio to NUTS",
        "headline",
    ]
    pilot_rows = []
    for p in result["problems"]:
        pilot = p["pilot"]
        for i, a in enumerate(pilot["grid"]):
            rates = pilot["ess_per_s_min"][a]
            pilot_rows.append(
                [
                    p["title"] if i == 0 else "",
                    f"{a:g}",
                    *(_num(rates[k]) for k in DIAGNOSTICS),
                    f"{pilot['worst_ratio_to_nuts'][a]:.1f}×",
                    "**chosen**" if a == pilot["chosen"] else "",
                ]
            )
    lines = [
        "# Gibbs sampling vs NUTS: effective samples per second"
        + (" — QUICK smoke run, not a result" if cfg["quick"] else ""),
        "",
        f"Generated by `python benchmarks/sampling.py{' --quick' if cfg['quick'] else ''}` ({m['date_utc']}, whole "
        f"script {result['wall_time_total']:.0f} s). Issue 3 item 6, issue 4 item 10 (second half).",
        "",
        "Exact GP posteriors (no inducing points), fixed kernel hyper-parameters shared by both samplers, "
        f"{cfg['chains']} chains each, float64, `torch.set_num_threads({cfg['threads']})` for all. Gibbs: "
        "`GibbsSampler` on the augmented model, chains vectorised, with the exact over-relaxed f-update "
        "(`overrelaxation=a`: f' = m + a(f - m) + sqrt(1 - a²)(f̃ - m) with f̃ ~ p(f | Ω) and m its mean, which "
        "leaves p(f | Ω) and hence the posterior invariant) for every a of the grid "
        f"{', '.join(f'{a:g}' for a in cfg['overrelaxation_grid'])}, and the plain blocked Gibbs sampler (a = 0). "
        "**The headline a is chosen before the reported draws are looked at**: pilot runs of every a with other "
        f"seeds ({', '.join(map(str, cfg['pilot_seeds']))}; same warm-up, draws and chains) estimate its minimum "
        "bulk, tail and sd ESS per second, and the a whose worst ratio to NUTS over these three diagnostics is "
        "largest is the headline (table 'Choice of a' below); the reported runs of all a use seed "
        f"{cfg['seed']}. NUTS: Pyro "
        f"{result['versions']['pyro']} `NUTS` on the original model in the whitened parametrisation f = μ + Lv, "
        "chains one after the other; Pyro's defaults (adapted step size and diagonal mass matrix, max tree depth "
        "10, target acceptance 0.8), analytic gradient. ESS is the rank-normalised bulk ESS of "
        "`GibbsSamples.summary()` "
        "(Vehtari et al. 2021) applied to both sets of draws of f; median and minimum over the N latent "
        "coordinates. ESS/s uses the sampling wall time only (warm-up is reported separately and in 'incl. warm-up'). "
        "The samplers run interleaved (Gibbs warm-ups, then 1/chains of each Gibbs sampler's draws before each NUTS "
        "chain) so that all see the same machine load over the same period. Over-relaxation anti-correlates "
        "successive draws, which helps posterior means and quantiles (bulk and tail ESS) more than the posterior "
        "variance: the sd-ESS columns show that trade-off, and it is why the choice of a looks at all three.",
        "",
        common.markdown_table(headers, rows),
        common.markdown_table(ratio_headers, ratio_rows),
        "### Choice of a (pilot runs, independent of the reported draws)",
        "",
        "Pilot min ESS/s: minimum over coordinates, per second of sampling wall time, mean over the pilot seeds; "
        "the worst ratio divides each by the reported NUTS run's value of the same diagnostic.",
        "",
        common.markdown_table(pilot_headers, pilot_rows),
    ]
    for p in result["problems"]:
        a, n = p["agreement"], p["nuts"]
        lines += [
            f"* **{p['title']}** (N = {p['n']}): NUTS used {n['gradients_per_draw']:.1f} gradient evaluations per "
            f"draw ({n['ms_per_gradient_cpu']:.2f} CPU-ms each including Pyro's overhead; the potential and its "
            f"gradient alone take {n['ms_per_gradient_raw_cpu']:.2f} CPU-ms), {n['divergences']} "
            f"divergent transitions after warm-up; Gibbs {p['gibbs']['ms_per_sweep_all_chains']:.1f} ms "
            f"(a = {p['overrelaxation']:g}) and {p['gibbs_plain']['ms_per_sweep_all_chains']:.1f} ms (plain) per "
            f"sweep of all {cfg['chains']} chains. Same posterior (headline Gibbs vs NUTS)? max |z| of the "
            "difference of posterior means "
            f"{a['max_abs_z_mean']:.2f} over {p['n']} coordinates ({100 * a['fraction_abs_z_gt_3']:.1f}% with "
            f"|z| > 3), posterior sd ratio Gibbs/NUTS median {a['median_sd_ratio_gibbs_over_nuts']:.3f} "
            f"(range {a['min_sd_ratio']:.2f}–{a['max_sd_ratio']:.2f}). ArviZ's bulk ESS of the same draws: min "
            f"{_num(p['gibbs']['arviz_ess_bulk_min'])} (Gibbs), {_num(n['arviz_ess_bulk_min'])} (NUTS).",
        ]
    lines += [""] + [f"* {note}" for note in result["notes"]]
    lines += [
        "",
        "## How to read this",
        "",
        "* 'ms / draw' = sampling wall time / (chains × draws per chain): for Gibbs the chains share one vectorised "
        "sweep, for NUTS they run one after the other. 'ESS/s' = bulk ESS of a coordinate f_i over all chains / "
        "the sampling wall time of all chains; the ratios are Gibbs ÷ NUTS. 'ESS/CPU-s' and 'CPU time' use process "
        "CPU time instead (one torch thread each, so waiting for a core on the shared machine is left out). "
        "'incl. warm-up' divides by warm-up + sampling time.",
        "* 'vs overhead-free NUTS' (CPU time): a hypothetical NUTS with the same gradient evaluations per draw "
        "and the same ESS, each gradient costing only the evaluation of U and its gradient measured outside Pyro "
        "(no tree building, no Python bookkeeping). It is optimistic for NUTS and bounds what a compiled "
        "implementation (Stan, NumPyro, BlackJAX) could gain: Pyro's per-gradient overhead is a large part of "
        "NUTS's cost at these sizes.",
        "* Costs scale differently: a Gibbs sweep factorises I + Λ^½ K Λ^½ once per chain, O(N³); a NUTS gradient "
        "is a matrix-vector product with L, O(N²), times the gradient evaluations per draw, which grow with the "
        "posterior's condition number (here: with N/σ² for the Student-t model). The ratios therefore depend on N "
        "and on the hyper-parameters; they are measurements for these two posteriors, not constants.",
        "* NUTS's ESS per draw can exceed 1 (anti-correlated successive draws: negative lag-1 autocorrelation). "
        "The two samplers target the same posterior: the z-scores of the differences of the posterior means, "
        "and the sd ratios, above.",
        "",
        "## Set-up",
        "",
    ]
    for p in result["problems"]:
        h = p["hyperparameters"]
        lines.append(
            f"* **{p['title']}**: {p['data_note']}. Kernel ScaleKernel(RBF-ARD) + ConstantMean: outputscale "
            f"{h['outputscale']:.4f}, mean {h['mean_constant']:.4f}, lengthscales "
            f"[{', '.join(f'{v:.3g}' for v in h['lengthscale'])}] — {h['procedure']}. Jitter {JITTER:g} on K for "
            f"both. Warm-up {p['config']['warmup']} iterations for both samplers; draws per chain: Gibbs "
            f"{p['config']['gibbs_draws']}, NUTS {p['config']['nuts_draws']}."
        )
    lines += [
        f"* Machine: {m['cpu_count']} cores shared with other jobs (other engineers' processes ran at the same "
        f"time); load average (1, 5, 15 min) at start {[round(v, 1) for v in m['load_average_start']]}, at end "
        f"{[round(v, 1) for v in m['load_average_end']]}; torch {m['torch']}, gpytorch {m['gpytorch']}. Wall "
        "times include waiting for a core; the CPU-time ratio does not. Compare ratios, not absolute seconds.",
        "",
        "![ESS/s per coordinate](sampling.png)",
        "",
    ]
    common.write_text(path, "\n".join(lines))


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def _times(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}×"


def _gibbs_rows(p: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, statistics) of every Gibbs run of a problem: the headline first, then the rest of the grid, then
    the plain sampler."""
    a_star = p["overrelaxation"]
    rows = [(f"Gibbs (ours, over-relaxed a = {a_star:g}, headline)", p["gibbs"])]
    rows += [(f"Gibbs (over-relaxed a = {a})", s) for a, s in p["gibbs_grid"].items() if float(a) != a_star]
    return rows + [("Gibbs (plain, a = 0)", p["gibbs_plain"])]


def _ratio_rows(p: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    a_star = p["overrelaxation"]
    rows = [(f"Gibbs (ours, over-relaxed a = {a_star:g}, headline)", p["ratios"])]
    rows += [(f"Gibbs (over-relaxed a = {a})", r) for a, r in p["ratios_grid"].items() if float(a) != a_star]
    return rows + [("Gibbs (plain, a = 0)", p["ratios_plain"])]


def plot(path: Path, result: dict[str, Any], per_coordinate: dict[str, dict[str, np.ndarray]]) -> None:
    problems = result["problems"]
    fig, axes = common.new_figure(len(problems), (5.5 * len(problems), 4), squeeze=False)
    import matplotlib.ticker  # after new_figure, which selects the backend

    for ax, p in zip(axes[0], problems):
        a = p["overrelaxation"]
        for name, color, label in (
            ("gibbs", "C3", f"Gibbs (ours, over-relaxed a = {a:g})"),
            ("gibbs_plain", "C1", "Gibbs (plain)"),
            ("nuts", "C0", "NUTS (Pyro)"),
        ):
            ess_s = np.sort(per_coordinate[p["key"]][name] / p[name]["sample_wall"])
            ax.step(ess_s, np.arange(1, len(ess_s) + 1) / len(ess_s), where="post", color=color, label=label)
            ax.axvline(ess_s[0], color=color, lw=0.8, ls=":")
        ax.set_xscale("log")
        lo, hi = ax.get_xlim()
        ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if lo <= t <= hi]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("bulk ESS per second of sampling (log scale)")
        ax.set_ylabel("fraction of latent coordinates ≤ x")
        ax.set_title(f"{p['title']}: min ratio {p['ratios']['ess_per_s_min']:.1f}×", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(
        f"ESS/s over the N latent coordinates f_i ({result['config']['chains']} chains each, 1 thread; dotted: minimum)"
        + (" — QUICK smoke run" if result["config"]["quick"] else ""),
        fontsize=10,
    )
    common.save_figure(fig, path)


# ---------------------------------------------------------------------------------------------------- main
@dataclass
class Settings:
    warmup: int
    gibbs_draws: int
    nuts_draws: int
    hyper_iterations: int
    max_train: int | None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.run_arguments(p, "small smoke run (< 2 min)", threads_help="torch threads for both samplers", caps=False)
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--only", choices=("heart", "boston"), default=None, help="run one problem only")
    p.add_argument(
        "--overrelaxation-grid",
        type=lambda text: [float(v) for v in text.split(",")],
        default=[-0.5, -0.6, -0.7, -0.8],
        help="over-relaxations a run alongside the plain sampler; the headline one is chosen by pilot runs "
        "(default -0.5,-0.6,-0.7,-0.8)",
    )
    p.add_argument(
        "--pilot-seeds",
        type=lambda text: [int(v) for v in text.split(",")],
        default=[101, 102],
        help="seeds of the pilot runs that choose the headline a (default 101,102; must differ from --seed)",
    )
    args = p.parse_args(argv)
    if args.seed in args.pilot_seeds:
        p.error("--pilot-seeds must not contain --seed: the headline a is chosen on independent runs")
    if any(not -1.0 < a < 0.0 for a in args.overrelaxation_grid):
        p.error("--overrelaxation-grid values must lie in (-1, 0)")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import pyro

    args = parse_args(argv)
    wall_start = time.perf_counter()
    machine = common.start_run(args.threads, args.seed)
    if args.quick:
        settings = {
            "heart": Settings(warmup=60, gibbs_draws=200, nuts_draws=60, hyper_iterations=30, max_train=80),
            "boston": Settings(warmup=60, gibbs_draws=200, nuts_draws=60, hyper_iterations=30, max_train=80),
        }
        chains = min(args.chains, 2)
    else:
        settings = {
            "heart": Settings(warmup=500, gibbs_draws=2000, nuts_draws=1000, hyper_iterations=300, max_train=None),
            "boston": Settings(warmup=300, gibbs_draws=2000, nuts_draws=500, hyper_iterations=200, max_train=None),
        }
        chains = args.chains
    builders = {"heart": heart_problem, "boston": boston_problem}
    keys = [args.only] if args.only else ["heart", "boston"]

    problems, per_coordinate = [], {}
    for key in keys:
        st = settings[key]
        problem = builders[key](args.seed, st.hyper_iterations, st.max_train)
        check = check_log_lik(problem, seed=args.seed)
        print(f"{problem.title}: N = {problem.x.shape[0]}, hyper-parameters chosen in "
              f"{problem.hypers['fit_seconds']:.1f} s; log-likelihood check {check}", flush=True)
        smoke(problem)
        grid = list(args.overrelaxation_grid)
        with common.Stopwatch() as pilot_clock:
            pilot = pilot_overrelaxation(problem, grid, args.pilot_seeds, st.warmup, st.gibbs_draws, chains)
        pilot["wall_seconds"] = pilot_clock.elapsed
        print(f"  pilot runs ({pilot_clock.elapsed:.0f} s): min ESS/s per a {pilot['ess_per_s_min']}", flush=True)
        runs, nuts = run_interleaved_samplers(
            problem, st.warmup, st.gibbs_draws, st.nuts_draws, chains, args.seed, grid + [0.0]
        )
        n = statistics(nuts)
        a_star, worst = choose_overrelaxation(pilot, n)
        pilot["worst_ratio_to_nuts"] = worst
        pilot["chosen"] = a_star
        stats = {a: statistics(run) for a, run in runs.items()}
        g, gp = stats[a_star], stats[0.0]
        gibbs = runs[a_star]
        print(f"  headline a = {a_star:g} (pilot worst ratios {worst})", flush=True)
        print(f"  Gibbs: warm-up {gibbs.warmup_wall:.1f} s, sampling {gibbs.sample_wall:.1f} s, ESS min "
              f"{g['ess_bulk_min']:.0f}, ESS/s min {g['ess_per_s_min']:.1f}", flush=True)
        print(f"  NUTS: warm-up {nuts.warmup_wall:.1f} s, sampling {nuts.sample_wall:.1f} s, ESS min "
              f"{n['ess_bulk_min']:.0f}, ESS/s min {n['ess_per_s_min']:.1f}", flush=True)
        r, rp = ratios(g, n), ratios(gp, n)
        print(f"  ratio of min ESS/s Gibbs/NUTS: {r['ess_per_s_min']:.1f}x (CPU {r['ess_per_cpu_s_min']:.1f}x); "
              f"plain Gibbs {rp['ess_per_s_min']:.1f}x (CPU {rp['ess_per_cpu_s_min']:.1f}x)", flush=True)
        per_coordinate[key] = {"gibbs": g["_ess"], "gibbs_plain": gp["_ess"], "nuts": n["_ess"]}
        problems.append(
            {
                "key": key,
                "title": problem.title,
                "n": int(problem.x.shape[0]),
                "data_note": problem.data_note,
                "hyperparameters": problem.hypers,
                "log_lik_check": check,
                "config": asdict(st),
                "gibbs": _public(g),
                "gibbs_plain": _public(gp),
                "nuts": _public(n),
                "overrelaxation": a_star,
                "pilot": pilot,
                "gibbs_grid": {f"{a:g}": _public(stats[a]) for a in grid},
                "ratios_grid": {f"{a:g}": ratios(stats[a], n) for a in grid},
                "ratios": r,
                "ratios_plain": rp,
                "agreement": agreement(gibbs, nuts, g, n),
                "ess_per_coordinate": {"gibbs": g["_ess"], "gibbs_plain": gp["_ess"], "nuts": n["_ess"]},
            }
        )

    common.close_machine_info(machine)
    result = {
        "benchmark": "sampling",
        "issue": "issue 3 item 6; issue 4 item 10 (second half)",
        "config": {
            "quick": args.quick,
            "chains": chains,
            "threads": torch.get_num_threads(),
            "dtype": "float64",
            "jitter": JITTER,
            "seed": args.seed,
            "overrelaxation_grid": list(args.overrelaxation_grid),
            "pilot_seeds": list(args.pilot_seeds),
            "gibbs": "GibbsSampler(prior, likelihood, x, y, jitter, overrelaxation=a) for every a of the grid and "
            "a = 0 (plain), f_update 'auto' (GPML-stable draw); headline a chosen by pilot runs; chains as "
            "one batch; warm-up = sample(1, warmup=W-1), then `chains` segments sample(S/chains, init=last_state) "
            "continuing the stream",
            "nuts": "pyro.infer.NUTS(potential_fn=U, adapt_step_size, adapt_mass_matrix, full_mass=False, "
            "max_tree_depth=10, target_accept_prob=0.8) in MCMC(num_chains=1) per chain, chains sequential; "
            "U(v) = |v|^2/2 - log p(y | mu + L v) with an analytic gradient (torch.autograd.Function)",
            "timing": "time.perf_counter (wall) and time.process_time (CPU) around each piece; NUTS's warm-up/"
            "sampling boundary from MCMC's hook_fn; one tiny untimed run of each sampler first; interleaved: Gibbs "
            "warm-up, then for each k a Gibbs segment and NUTS chain k, so both samplers share the machine's load",
        },
        "versions": {"pyro": pyro.__version__},
        "machine": machine,
        "problems": problems,
        "notes": notes(problems),
        "wall_time_total": time.perf_counter() - wall_start,
    }
    out = common.output_dir(args.output_dir, args.quick)
    common.write_results(out, "sampling", result, write_markdown, lambda path, res: plot(path, res, per_coordinate))
    return result


def notes(problems: list[dict[str, Any]]) -> list[str]:
    """Plain-language reading of the ratios (filled in from the numbers)."""
    out = []
    for p in problems:
        r, rp = p["ratios"], p["ratios_plain"]
        verdict = "meets" if r["target_min_ess_per_s_ge_10"] else "misses"
        verdict_plain = "meets" if rp["target_min_ess_per_s_ge_10"] else "misses"
        out.append(
            f"{p['title']}: over-relaxed Gibbs (a = {p['overrelaxation']:g}, chosen by the pilot runs) {verdict} the "
            f"≥ {TARGET_RATIO:g}× target on minimum bulk ESS/s ({r['ess_per_s_min']:.1f}× wall, "
            f"{r['ess_per_cpu_s_min']:.1f}× CPU; worst of bulk / tail / sd {r['worst_of_bulk_tail_sd']:.1f}×); "
            "the plain Gibbs sampler "
            f"{verdict_plain} it ({rp['ess_per_s_min']:.1f}× wall, {rp['ess_per_cpu_s_min']:.1f}× CPU). A Gibbs draw "
            f"costs {1 / r['ms_per_draw_nuts_over_gibbs']:.2f}× a NUTS draw; it is worth "
            f"{r['ess_per_draw_median_gibbs_over_nuts']:.2f}× (over-relaxed) and "
            f"{rp['ess_per_draw_median_gibbs_over_nuts']:.2f}× (plain) as many effective samples (median coordinate)."
        )
    return out


if __name__ == "__main__":
    main()
