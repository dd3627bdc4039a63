r"""Issue 15, item 4: the large-data protocol of ``CAVI.fit(x, y, learn_hyperparameters=True)`` on 10⁶ points
against GPyTorch's SVGP+Adam, hyper-parameters learned by every method, the same model and start (``scale.py``'s
synthetic problem). Ours is the ``"stochastic"`` protocol at its defaults, driven one step at a time as
``CAVI.fit``'s loop does (``cavi.step(batch, hyper_optimizer=adam)`` on a batch of the data checked once, then
``float(elbo)``) so that it runs round-robin with the peers of :data:`GRID`, each for the same budget on its own
clock. Measured: s / epoch (extrapolated from the median step after :data:`STEADY_FROM`), test NLL at the budget,
peak RSS. How to read ``results/hyperparameters_large.{json,md}``: ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import _report  # noqa: E402
import gpytorch  # noqa: E402
import numpy as np  # noqa: E402
import scale  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from gpytorch_augment import CAVI, BernoulliLogitLikelihood, CAVIVariationalStrategy  # noqa: E402
from gpytorch_augment.inference.fit_options import FitOptions  # noqa: E402
from gpytorch_augment.inference.hyperparameters import hyperparameters_of  # noqa: E402

_DEFAULTS = FitOptions().resolved("stochastic")
#: the stochastic protocol's defaults, read from the package (not chosen here)
OURS_LR = float(_DEFAULTS.lr)
OURS_DEFAULT_BATCH = int(_DEFAULTS.batch_size)

#: the grid, fixed before any run
GRID = {
    "ours": {"protocol": "stochastic", "batch_size": [1024, 4096], "lr": [OURS_LR]},
    "SVGP+Adam": {"batch_size": [256, 1024, 4096], "lr": [0.01, 0.05]},
}
#: the headline compares ours at the protocol's default batch size with the peer at its best batch size (best =
#: lowest test NLL after the budget); the other row of ours is reported beside it
HEADLINE_BATCH = OURS_DEFAULT_BATCH
FULL = {"num_train": 1_000_000, "num_test": 10_000, "budget": 65.0}
QUICK = {"num_train": 100_000, "num_test": 10_000, "budget": 10.0}
NUM_INDUCING = 200
DIM = 10
KMEANS_SUBSET = 20_000
STEADY_FROM = 20  #: steps dropped before the median step time (warm-up of caches and allocator)
EVAL_EVERY = 250  #: evaluations at steps 1, 2, 4, 8, ... and every EVAL_EVERY steps (plus at the budget)
TARGET_RATIO = 0.5  #: the issue's target: ours' epoch time <= 0.5 x the peer's at its best batch size
CHOLESKY = gpytorch.variational.CholeskyVariationalDistribution  #: q(u) of every method


def probe_memory(specs: list[common.MethodSpec], hwm_reset: bool, steps: int = 3) -> dict[str, Any]:
    """Each method alone, on a throw-away model: the peak RSS above the RSS before it of ``steps`` training steps and
    of one evaluation (``VmHWM`` reset before each; ``None`` where it cannot be reset). Doubles as the warm-up."""
    out = {}
    for spec in specs:
        record: dict[str, Any] = {}
        for phase, run in (("steps", lambda: [spec.step() for _ in range(steps)]), ("evaluate", spec.evaluate)):
            gc.collect()
            base = common.proc_status_mb("VmRSS")
            common.reset_peak_rss()
            run()
            peak = common.proc_status_mb("VmHWM")
            record[f"{phase}_peak_above_mb"] = peak - base if hwm_reset and peak is not None else None
        out[spec.name] = record
    return out


def schedule(t: int) -> bool:
    return t > 0 and (t & (t - 1) == 0 or t % EVAL_EVERY == 0)


# ---------------------------------------------------------------------------------------------------- methods
def make_ours(data: dict[str, Any], Z: Tensor, ls: Tensor, batch_size: int) -> common.MethodSpec:
    model = scale.sparse_gp(Z, CHOLESKY, CAVIVariationalStrategy, ls)  # the common start (median-heuristic ls)
    lik = BernoulliLogitLikelihood()
    n = data["y"].shape[-1]
    cavi = CAVI(model, lik, num_data=n)
    adam = torch.optim.Adam(hyperparameters_of(cavi), lr=OURS_LR)  # what fit_hyperparameters builds
    checked = cavi.check_data(data["x"], data["y"])  # as CAVI.fit: the data checked once, as a whole
    next_index = common.index_batches(n, batch_size, seed=0)  # the batches of scale.batch_stream

    def step() -> float:
        elbo = cavi.step(checked.take(next_index()), hyper_optimizer=adam)  # a step on checked data checks nothing
        return float(elbo)  # CAVI.fit's one host synchronisation per step

    name = f"ours: stochastic protocol, batch {batch_size}"
    settings = {"family": "ours", "batch_size": batch_size, "lr": OURS_LR, "step_size": "default (Robbins-Monro)"}
    return common.MethodSpec(name, step, common.binary_evaluator(model, lik, data["xt"], data["yt"]), settings)


def make_peer(data: dict[str, Any], Z: Tensor, ls: Tensor, batch_size: int, lr: float) -> common.MethodSpec:
    model = scale.sparse_gp(Z, CHOLESKY, gpytorch.variational.VariationalStrategy, ls)
    lik = BernoulliLogitLikelihood()
    mll = gpytorch.mlls.VariationalELBO(lik, model, num_data=data["y"].shape[-1])
    adam = torch.optim.Adam([p for p in (*model.parameters(), *lik.parameters()) if p.requires_grad], lr=lr)
    next_batch = scale.batch_stream(data["x"], data["y"], batch_size, seed=0)

    def loss() -> Tensor:
        xb, yb = next_batch()
        return -mll(model(xb), yb)

    name = f"SVGP+Adam lr {lr}, batch {batch_size}"
    settings = {"family": "SVGP+Adam", "batch_size": batch_size, "lr": lr}
    return common.MethodSpec(name, common.gradient_step(loss, adam),
                             common.binary_evaluator(model, lik, data["xt"], data["yt"]), settings)  # fmt: skip


def methods(data: dict[str, Any], Z: Tensor, ls: Tensor) -> list[common.MethodSpec]:
    out = [make_ours(data, Z, ls, b) for b in GRID["ours"]["batch_size"]]
    for b in GRID["SVGP+Adam"]["batch_size"]:
        for lr in GRID["SVGP+Adam"]["lr"]:
            out.append(make_peer(data, Z, ls, b, lr))
    return out


# ---------------------------------------------------------------------------------------------------- run
def run(quick: bool, budget: float | None, seed: int) -> dict[str, Any]:
    size = dict(QUICK if quick else FULL)
    if budget is not None:
        size["budget"] = budget
    n = size["num_train"]
    rss_start = common.peak_rss_mb()
    t0 = time.perf_counter()
    x, y = scale.synthetic_data(n, DIM, seed=seed)
    xt, yt = scale.synthetic_data(size["num_test"], DIM, seed=seed + 1)
    data_time = time.perf_counter() - t0
    sub = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:KMEANS_SUBSET]
    t0 = time.perf_counter()
    Z = common.kmeans_inducing_points(x[sub], NUM_INDUCING, seed=seed, n_init=1)
    kmeans_time = time.perf_counter() - t0
    ls = common.median_heuristic_lengthscales(x, max_points=1000)
    data = {"x": x, "y": y, "xt": xt, "yt": yt}
    gc.collect()
    rss_data, setup_peak = common.proc_status_mb("VmRSS"), common.peak_rss_mb()
    hwm_reset = common.reset_peak_rss()  # from here VmHWM is the peak of the methods' runs only
    print(f"== N = {n}, test {size['num_test']}, M = {NUM_INDUCING}, budget {size['budget']} s per method; data "
          f"{data_time:.1f} s, k-means {kmeans_time:.1f} s, RSS after data {rss_data:.0f} MiB", flush=True)  # fmt: skip
    probes = probe_memory(methods(data, Z, ls), hwm_reset)  # also the untimed warm-up, on throw-away models
    gc.collect()
    common.reset_peak_rss()  # the probes ran on throw-away models: the peak of the interleaved runs from here
    rule = common.StoppingRule(patience=10**9, min_improvement=-math.inf, max_iter=10**9, max_time=size["budget"])
    traces = common.run_interleaved(
        methods(data, Z, ls), "test_nll", rule, schedule,
        on_done=lambda name, t: common.print_run(name, t, f"nll {t.metrics['test_nll'][-1]:.4f} ", width=40),
    )  # fmt: skip
    memory = {
        "rss_start_mb": rss_start, "rss_after_data_mb": rss_data, "setup_peak_rss_mb": setup_peak,
        "process_peak_rss_mb": common.peak_rss_mb(), "hwm_reset_after_data": hwm_reset,
        "peak_rss_during_runs_mb": common.proc_status_mb("VmHWM") if hwm_reset else common.peak_rss_mb(),
        "n_by_m_matrix_mb": n * NUM_INDUCING * 8 / 2**20,
        "data_mb": (x.numel() + y.numel() + xt.numel() + yt.numel()) * x.element_size() / 2**20,
    }  # fmt: skip
    memory["peak_above_data_mb"] = memory["peak_rss_during_runs_mb"] - rss_data
    memory["per_method_probe"] = probes
    specs = {m.name: m.settings for m in methods(data, Z, ls)}
    runs = {}
    for name, tr in traces.items():
        steady = tr.step_times[STEADY_FROM:] or tr.step_times
        b = specs[name]["batch_size"]
        step_wall = float(np.median(steady))
        step_cpu = tr.cpu_time[-1] / max(tr.num_iterations, 1)
        runs[name] = {
            **specs[name], "steps": tr.num_iterations, "run_time": tr.total_time, "run_cpu_time": tr.cpu_time[-1],
            "median_step_time": step_wall, "mean_cpu_step_time": step_cpu,
            "epoch_time_extrapolated": step_wall * n / b, "epoch_cpu_time_extrapolated": step_cpu * n / b,
            "epochs_covered": tr.num_iterations * b / n, "final_test_nll": tr.metrics["test_nll"][-1],
            "final_test_error": tr.metrics["test_error"][-1], "best_test_nll": min(tr.metrics["test_nll"]),
            "trace": tr.to_dict(),
        }  # fmt: skip
    return {"size": size, "memory": memory, "runs": runs, "data_time": data_time, "kmeans_time": kmeans_time,
            **summarise(runs)}  # fmt: skip


def summarise(runs: dict[str, Any]) -> dict[str, Any]:
    peers = {k: r for k, r in runs.items() if r["family"] == "SVGP+Adam"}
    ours = {k: r for k, r in runs.items() if r["family"] == "ours"}
    best_peer = min(peers, key=lambda k: peers[k]["final_test_nll"])
    bp = peers[best_peer]
    for r in runs.values():
        r["epoch_ratio_to_best_peer"] = r["epoch_time_extrapolated"] / bp["epoch_time_extrapolated"]
        r["epoch_cpu_ratio_to_best_peer"] = r["epoch_cpu_time_extrapolated"] / bp["epoch_cpu_time_extrapolated"]
        r["nll_minus_best_peer"] = r["final_test_nll"] - bp["final_test_nll"]
    headline = next(k for k, r in ours.items() if r["batch_size"] == HEADLINE_BATCH)
    h = runs[headline]
    return {
        "best_peer": best_peer, "headline": headline, "epoch_ratio": h["epoch_ratio_to_best_peer"],
        "epoch_cpu_ratio": h["epoch_cpu_ratio_to_best_peer"],
        "ratio_met": h["epoch_ratio_to_best_peer"] <= TARGET_RATIO,
        "nll_gap": h["nll_minus_best_peer"], "nll_met": h["nll_minus_best_peer"] <= 0.0,
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------------- output
def report(result: dict[str, Any]) -> tuple[str, dict[str, Any], list[_report.Table]]:
    """Title, settings and tables of a result record (what :func:`_report.write_report` renders)."""
    size, mem, runs, cfg, grid = result["size"], result["memory"], result["runs"], result["config"], result["grid"]
    budget = size["budget"]
    ours, peer = grid["ours"], grid["SVGP+Adam"]
    title = f"The large-data protocol vs SVGP+Adam, hyper-parameters learned, N = {size['num_train']:,}" + (
        " (quick smoke run)" if result["quick"] else ""
    )
    settings = {
        "command": f"python benchmarks/hyperparameters_large.py{' --quick' if result['quick'] else ''}",
        "whole script (s)": result["wall_time_total"],
        "problem": f"scale.synthetic_data, D = {cfg['dim']}, logistic link",
        "N train / N test": f"{size['num_train']:,} / {size['num_test']:,} (test: another seed)",
        "inducing points": f"M = {cfg['num_inducing']}, k-means of a seeded {cfg['kmeans_subset']:,}-point subset, "
        "fixed, shared",
        "initial hyper-parameters": "median-heuristic ARD lengthscales, outputscale 1, mean 0 (every method)",
        "likelihood": "BernoulliLogitLikelihood (every method)",
        "dtype, torch threads": f"{cfg['dtype']}, {cfg['threads']}",
        "ours": f"{ours['protocol']} protocol of CAVI.fit(..., learn_hyperparameters=True): Adam lr {ours['lr']}, "
        f"Robbins-Monro step on q(u), batch {ours['batch_size']}",
        "peer": f"GPyTorch SVGP (whitened VariationalStrategy, Cholesky q(u), VariationalELBO) + Adam on every "
        f"parameter, lr {peer['lr']}, batch {peer['batch_size']}",
        "headline: ours at batch": cfg["headline_batch"],
        "peer's best run (lowest test NLL at the budget)": result["best_peer"],
        "budget per method (s, own clock, evaluation excluded)": budget,
        "execution": "all methods round-robin in one process",
        "s / epoch (extrapolated)": f"median step time (steps after the first {cfg['steady_from']}) × N / batch",
        "CPU s / epoch (extrapolated)": "mean CPU time per step × N / batch",
        "evaluations": f"at steps 1, 2, 4, 8, ..., every {cfg['eval_every']} steps and at the budget",
        "data / k-means (s)": f"{result['data_time']:.1f} / {result['kmeans_time']:.1f}",
        "seed": cfg["seed"],
        **_report.machine_settings(result["machine"]),
    }
    roles = {result["headline"]: "headline", result["best_peer"]: "peer's best"}
    rows = [[
        name, roles.get(name), r["family"], r["batch_size"], r["lr"], 1e3 * r["median_step_time"],
        r["epoch_time_extrapolated"], r["epoch_cpu_time_extrapolated"], r["epoch_ratio_to_best_peer"],
        r["epoch_cpu_ratio_to_best_peer"], r["final_test_nll"], r["nll_minus_best_peer"], r["final_test_error"],
        r["steps"], r["epochs_covered"],
    ] for name, r in runs.items()]  # fmt: skip
    tables = [_report.Table(
        "Runs",
        ["method", "role", "family", "batch", "lr", "ms / step (median)", "s / epoch (extrap.)",
         "CPU s / epoch (extrap.)", "epoch ratio to peer's best", "CPU epoch ratio to peer's best",
         f"test NLL after {budget:g} s", "− peer's best", "test error", "steps", "epochs covered"], rows,
    )]  # fmt: skip
    tables.append(_report.Table(
        "Targets (headline against the peer's best run)", ["quantity", "measured", "target", "met"],
        [["epoch time ratio, wall", result["epoch_ratio"], f"≤ {cfg['target_ratio']}", result["ratio_met"]],
         ["epoch time ratio, CPU", result["epoch_cpu_ratio"], None, None],
         [f"test NLL after {budget:g} s, difference (nats)", result["nll_gap"], "≤ 0", result["nll_met"]]],
    ))  # fmt: skip
    tables.append(_report.Table(
        "Memory (one process holds every method)", ["quantity", "MiB"],
        [["RSS after imports", mem["rss_start_mb"]],
         ["RSS after the data and inducing inputs were built", mem["rss_after_data_mb"]],
         ["train and test data", mem["data_mb"]],
         ["peak RSS of the set-up", mem.get("setup_peak_rss_mb")],
         ["peak RSS during the runs" + (" (VmHWM, reset after the data)" if mem["hwm_reset_after_data"]
                                        else " (ru_maxrss: VmHWM could not be reset)"), mem["peak_rss_during_runs_mb"]],
         ["peak during the runs above the RSS after the data", mem["peak_above_data_mb"]],
         ["process peak including the set-up (ru_maxrss)", mem["process_peak_rss_mb"]],
         ["size an N × M float64 matrix would take", mem["n_by_m_matrix_mb"]]],
    ))  # fmt: skip
    probes = mem.get("per_method_probe", {})
    tables.append(_report.Table(
        "Each method alone: peak RSS above the RSS before it [MiB]", ["method", "3 training steps", "1 evaluation"],
        [[name, (probes.get(name) or {}).get("steps_peak_above_mb"),
          (probes.get(name) or {}).get("evaluate_peak_above_mb")] for name in runs],
    ))  # fmt: skip
    return title, settings, tables


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = common.run_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0]),
                                  "N = 10⁵, 10 s per method", caps=False)  # fmt: skip
    parser.add_argument("--budget", type=float, default=None, help="seconds of training per method")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    machine = common.start_run(args.threads, args.seed)
    result = run(args.quick, args.budget, args.seed)
    result.update({
        "machine": common.close_machine_info(machine), "grid": GRID, "quick": args.quick,
        "config": {"num_inducing": NUM_INDUCING, "dim": DIM, "kmeans_subset": KMEANS_SUBSET,
                   "steady_from": STEADY_FROM, "eval_every": EVAL_EVERY, "headline_batch": HEADLINE_BATCH,
                   "target_ratio": TARGET_RATIO, "threads": torch.get_num_threads(), "dtype": "float64",
                   "seed": args.seed},
        "wall_time_total": time.perf_counter() - start,
    })  # fmt: skip
    out = common.output_dir(args.output_dir, args.quick)
    _report.write_report(out, "hyperparameters_large", result, *report(result))
    return result


if __name__ == "__main__":
    main()
