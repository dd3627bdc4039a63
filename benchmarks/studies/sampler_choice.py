r"""Gibbs or HMC for the likelihoods ``sampling.py`` does not cover: the evidence behind their ``preferred_sampler``.

``sampling.py`` compares our samplers with NumPyro's NUTS on four real posteriors (Bernoulli-logit, Student-t,
heteroscedastic Gaussian, logistic-softmax). This script answers the narrower question
:func:`~gpytorch_augment.posterior_sampler` needs for every *other* registered likelihood -- which of our two exact
samplers draws more effective samples per second -- on one seeded synthetic posterior each:

* inputs :math:`x \in [-3, 3]^2` (:math:`N = 200`, uniform), prior :math:`\mathcal N(0, k)` with a unit-outputscale RBF
  kernel of lengthscale 1 per latent, a latent function drawn from it, targets drawn from the likelihood at declared
  constants (``PROBLEMS``; the likelihood's own ``forward`` draws them, the binomial's with 10 trials):
  binomial-logit, Poisson-logit (rate scale 5), negative-binomial-logit (:math:`r = 5`), Laplace (scale 0.3) and
  heteroscedastic Student-t (:math:`\nu = 4`, :math:`\xi = 10`, two latents);
* samplers at settings declared before any run (``SETTINGS``: the settings the pilots of ``sampling.py`` chose most
  often): ``GibbsSampler(overrelaxation=-0.5)`` and ``HMCSampler(num_steps=(3, 7))``; 4 and 16 chains; 300 warm-up
  transitions and 1,000 draws per chain, then a timed second run of 1,000 draws from the last state (steady state);
  interleaved in one process, one thread, float64;
* reported: the worst of bulk, tail and sd ArviZ ESS, minimum over coordinates, per second (steady state and end to
  end, as in ``sampling.py``), their ratio HMC ÷ Gibbs and max R̂.

Run::

    python benchmarks/studies/sampler_choice.py            # ~6 min -> results/sampler_choice.{json,md}
    python benchmarks/studies/sampler_choice.py --quick    # smoke check -> $TMPDIR
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: the shared modules

import _common as common  # noqa: E402
import _report  # noqa: E402
import gpytorch  # noqa: E402
import numpy as np  # noqa: E402
import sampling  # noqa: E402
import torch  # noqa: E402
from _sampling_problems import JITTER  # noqa: E402

from gpytorch_augment import (  # noqa: E402
    BinomialLogitLikelihood,
    GibbsSampler,
    GPPrior,
    HeteroscedasticStudentTLikelihood,
    HMCSampler,
    LaplaceLikelihood,
    NegativeBinomialLogitLikelihood,
    PoissonLogitLikelihood,
)

#: declared before any run
SETTINGS = {"gibbs": {"overrelaxation": -0.5}, "hmc": {"num_steps": (3, 7)}}
CHAIN_COUNTS = (4, 16)
FULL = {"n": 200, "warmup": 300, "draws": 1000}
QUICK = {"n": 60, "warmup": 50, "draws": 100}


def _binomial(likelihood: Any, f: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    trials = torch.full_like(f[0], 10.0)
    return torch.binomial(trials, torch.sigmoid(f[0]), generator=g), {"trials": trials}


def _from_forward(likelihood: Any, f: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Targets drawn from the likelihood's own ``forward(f)`` (under a seed taken from ``g``)."""
    with torch.random.fork_rng():
        torch.manual_seed(int(torch.randint(2**31, (1,), generator=g)))
        return likelihood.forward(f[0] if f.shape[0] == 1 else f.mT).sample(), {}


#: name -> (likelihood factory, number of latents, target sampler)
PROBLEMS = {
    "binomial_logit": (lambda: BinomialLogitLikelihood(), 1, _binomial),
    "poisson_logit": (lambda: PoissonLogitLikelihood(rate_scale=5.0), 1, _from_forward),
    "negative_binomial_logit": (lambda: NegativeBinomialLogitLikelihood(total_count=5.0), 1, _from_forward),
    "laplace": (lambda: LaplaceLikelihood(scale=0.3), 1, _from_forward),
    "heteroscedastic_student_t": (lambda: HeteroscedasticStudentTLikelihood(df=4.0, max_precision=10.0), 2,
                                  _from_forward),
}


def _prior(num_latents: int) -> GPPrior:
    batch = torch.Size([num_latents]) if num_latents > 1 else torch.Size()
    kernel = gpytorch.kernels.RBFKernel(batch_shape=batch)
    kernel.lengthscale = 1.0
    return GPPrior(gpytorch.means.ZeroMean(batch_shape=batch), kernel).double()


def build(name: str, n: int, seed: int) -> dict[str, Any]:
    """The seeded synthetic posterior ``name``: prior, likelihood, x, y and the likelihood's keyword data."""
    make, T, targets = PROBLEMS[name]
    g = torch.Generator().manual_seed(seed)
    x = 6.0 * torch.rand(n, 2, generator=g, dtype=torch.float64) - 3.0
    prior = _prior(T)
    with torch.no_grad():
        K = prior.covar_module(x).to_dense().reshape(T, n, n) + JITTER * torch.eye(n, dtype=x.dtype)
        f = (torch.linalg.cholesky(K) @ torch.randn(T, n, 1, generator=g, dtype=x.dtype)).squeeze(-1)
    likelihood = make().double()
    with torch.no_grad():
        y, kwargs = targets(likelihood, f, g)
    return {"prior": prior, "likelihood": likelihood, "x": x, "y": y, "kwargs": kwargs}


def ess_stats(f: np.ndarray, wall: float) -> dict[str, float]:
    """``sampling.py``'s statistics of draws (chains, draws, D), the ones this report uses: worst ESS, per second, wall
    and max R̂."""
    stats = sampling.ess_stats(f, wall)
    return {"ess_worst_min": stats["ess_worst_min"], "per_s": stats["ess_per_s_worst_min"], "wall": wall,
            "rhat_max": stats["rhat_max"]}


def run(problem: dict[str, Any], kind: str, chains: int, cfg: dict[str, int], seed: int) -> dict[str, Any]:
    cls = GibbsSampler if kind == "gibbs" else HMCSampler
    t0 = time.perf_counter()
    sampler = cls(problem["prior"], problem["likelihood"], problem["x"], problem["y"], jitter=JITTER,
                  **SETTINGS[kind], **problem["kwargs"])
    first = sampler.sample(cfg["draws"], warmup=cfg["warmup"], num_chains=chains, seed=seed, progress=False)
    e2e = time.perf_counter() - t0
    t1 = time.perf_counter()
    second = sampler.sample(cfg["draws"], warmup=0, num_chains=chains, init=first.last_state(), progress=False)
    steady = time.perf_counter() - t1

    def flat(s: Any) -> np.ndarray:
        f = s.f.detach().double().numpy()
        return f.reshape(f.shape[0], f.shape[1], -1)

    return {"steady": ess_stats(flat(second), steady), "e2e": ess_stats(flat(first), e2e)}


def _verdict(ratios: list[float]) -> str:
    """``"hmc"`` if HMC ÷ Gibbs > 1 at every chain count, ``"gibbs"`` if at none, else ``"split"``."""
    wins = [r > 1 for r in ratios]
    return "hmc" if all(wins) else "gibbs" if not any(wins) else "split"


def report(result: dict[str, Any]) -> tuple[str, dict[str, Any], list[_report.Table]]:
    """Title, settings and tables of a result record (what :func:`_report.write_report` renders)."""
    rows = []
    for name, rounds in result["problems"].items():
        for chains, r in rounds.items():
            rows.append([name, int(chains), r["ratio_e2e"], r["ratio_steady"], r["hmc"]["steady"]["per_s"],
                         r["gibbs"]["steady"]["per_s"],
                         max(r["hmc"]["e2e"]["rhat_max"], r["hmc"]["steady"]["rhat_max"]),
                         max(r["gibbs"]["e2e"]["rhat_max"], r["gibbs"]["steady"]["rhat_max"])])  # fmt: skip
    e2e = {name: _verdict([r["ratio_e2e"] for r in rounds.values()]) for name, rounds in result["problems"].items()}
    verdicts = [[name, steady, e2e.get(name)] for name, steady in result["verdict"].items()]
    settings = {
        "command": "python benchmarks/studies/sampler_choice.py",
        "date (UTC)": result["generated"],
        "posteriors": f"synthetic, N = {result['config']['n']}, two inputs, unit RBF prior, seeded",
        "sampler settings": str(SETTINGS),
        "warm-up / draws per chain": f"{result['config']['warmup']} / {result['config']['draws']} (then a timed "
        "second run of as many draws: steady state)",
        "ESS": "worst of bulk, tail and sd ESS, minimum over coordinates, per second",
        "verdict rule": "hmc: HMC faster in steady state at every chain count; gibbs: at none; split: otherwise",
        "whole script (s)": result["wall_time_total"],
        **_report.machine_settings(result["machine"]),
    }
    tables = [
        _report.Table("HMC ÷ Gibbs, worst-ESS per second",
                      ["likelihood", "chains", "end to end", "steady state", "HMC steady worst-ESS/s",
                       "Gibbs steady worst-ESS/s", "max R̂ HMC", "max R̂ Gibbs"], rows),
        _report.Table("Verdict", ["likelihood", "steady state", "end to end"], verdicts),
    ]  # fmt: skip
    return "Gibbs or HMC for the likelihoods sampling.py does not cover", settings, tables


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.run_arguments(p, "small smoke run", threads_help="torch threads", caps=False)
    args = p.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    wall = time.perf_counter()
    machine = common.start_run(args.threads, args.seed)
    problems: dict[str, Any] = {}
    verdict: dict[str, str] = {}
    for name in PROBLEMS:
        problem = build(name, cfg["n"], args.seed)
        problems[name] = {}
        for chains in CHAIN_COUNTS:
            runs = {kind: run(problem, kind, chains, cfg, args.seed + chains) for kind in ("hmc", "gibbs")}
            runs["ratio_steady"] = runs["hmc"]["steady"]["per_s"] / runs["gibbs"]["steady"]["per_s"]
            runs["ratio_e2e"] = runs["hmc"]["e2e"]["per_s"] / runs["gibbs"]["e2e"]["per_s"]
            problems[name][str(chains)] = runs
            print(f"{name:26s} {chains:2d} chains: HMC ÷ Gibbs steady {runs['ratio_steady']:.2f}×, "
                  f"end to end {runs['ratio_e2e']:.2f}×", flush=True)
        verdict[name] = _verdict([problems[name][str(c)]["ratio_steady"] for c in CHAIN_COUNTS])
    common.close_machine_info(machine)
    result = {"benchmark": "sampler_choice", "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ",
              time.gmtime()), "config": {**cfg, "settings": SETTINGS, "chain_counts": CHAIN_COUNTS,
              "seed": args.seed, "jitter": JITTER}, "machine": machine, "problems": problems, "verdict": verdict,
              "wall_time_total": time.perf_counter() - wall}
    _report.write_report(common.output_dir(args.output_dir, args.quick), "sampler_choice", result, *report(result))
    return result


if __name__ == "__main__":
    main()
