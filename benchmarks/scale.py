r"""Scale and hyper-parameter learning: mini-batch CAVI against GPyTorch's SVGP+Adam and NGD+Adam, in three parts
(``--skip`` any): (a) KEEL ``magic``, hyper-parameters learned by Adam in every method, round-robin, time to within
:data:`TOLERANCE` of the best test NLL; (b) 10^6 synthetic points (:func:`synthetic_data`): time per epoch and peak
RSS, each method in its own subprocess; (c) time per step against N. One torch thread per process. What is measured
and how to read ``results/scale.{json,md,png}``: ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import _report  # noqa: E402
import gpytorch  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from gpytorch_augment import CAVI, BernoulliLogitLikelihood, CAVIVariationalStrategy, kmeans_plus_plus  # noqa: E402
from gpytorch_augment.datasets import load_keel  # noqa: E402
from gpytorch_augment.inference.schedules import AdaptiveStep  # noqa: E402

#: test NLL tolerance (nats) defining "reached the target"
TOLERANCE = 0.005
#: evaluate the test metrics every this many iterations in (a)
EVAL_EVERY = 25


# ---------------------------------------------------------------------------------------------------- model
def sparse_gp(Z: Tensor, distribution_cls: type, strategy_cls: type, lengthscale: Tensor) -> common.SparseGP:
    """:class:`_common.SparseGP` with fixed inducing inputs ``Z``, the method's variational strategy and distribution,
    and learnable hyper-parameters starting at ``lengthscale``, outputscale 1, mean 0."""
    hypers = {"lengthscale": lengthscale, "outputscale": 1.0, "mean_constant": 0.0}
    return common.SparseGP(Z, distribution_cls, strategy_cls, hypers, frozen=False)


def batch_stream(x: Tensor, y: Tensor, batch_size: int, seed: int) -> Callable[[], tuple[Tensor, Tensor]]:
    """Endless mini-batches of ``(x, y)`` (:func:`_common.index_batches`): the same sequence for every method."""
    next_index = common.index_batches(y.shape[-1], batch_size, seed)

    def next_batch() -> tuple[Tensor, Tensor]:
        idx = next_index()
        return x[idx], y[idx]

    return next_batch


def build_method(
    engine: str, lr: float, Z: Tensor, lengthscale: Tensor, num_data: int, next_batch: Callable
) -> tuple[common.SparseGP, gpytorch.likelihoods.Likelihood, Callable[[], Any]]:
    """A fresh model, likelihood and one-iteration ``step()`` for ``engine`` in {"cavi", "adam", "ngd"}."""
    if engine == "cavi":
        model = sparse_gp(Z, gpytorch.variational.NaturalVariationalDistribution, CAVIVariationalStrategy, lengthscale)
        likelihood: gpytorch.likelihoods.Likelihood = BernoulliLogitLikelihood()
        cavi = CAVI(model, likelihood, num_data=num_data, step_size=AdaptiveStep())
        hyper = torch.optim.Adam(model.hyperparameters(), lr=lr)

        def step() -> Any:
            xb, yb = next_batch()
            return cavi.step(xb, yb, hyper_optimizer=hyper)

        return model, likelihood, step

    likelihood = gpytorch.likelihoods.BernoulliLikelihood()
    if engine == "adam":
        model = sparse_gp(
            Z,
            gpytorch.variational.CholeskyVariationalDistribution,
            gpytorch.variational.VariationalStrategy,
            lengthscale,
        )
        optimizers: list[torch.optim.Optimizer] = [torch.optim.Adam(model.parameters(), lr=lr)]
    elif engine == "ngd":
        model = sparse_gp(
            Z,
            gpytorch.variational.NaturalVariationalDistribution,
            gpytorch.variational.VariationalStrategy,
            lengthscale,
        )
        optimizers = [
            gpytorch.optim.NGD(model.variational_parameters(), num_data=num_data, lr=0.1),
            torch.optim.Adam(model.hyperparameters(), lr=lr),
        ]
    else:
        raise ValueError(f"unknown engine {engine!r}")
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=num_data)

    def loss() -> Tensor:
        xb, yb = next_batch()
        return -mll(model(xb), yb)

    return model, likelihood, common.gradient_step(loss, *optimizers)


# ---------------------------------------------------------------------------------------------------- (a)
def run_magic(args: argparse.Namespace) -> dict[str, Any]:
    data = load_keel("magic", test_fraction=0.2, seed=0)
    x, y, x_test, y_test = data.x_train, data.y_train, data.x_test, data.y_test
    num_data = y.numel()
    Z = kmeans_plus_plus(x, args.num_inducing, generator=torch.Generator().manual_seed(0))
    lengthscale = common.median_heuristic_lengthscales(x, seed=0)
    lrs = [float(v) for v in args.lrs]
    specs = [(engine, lr) for engine in ("cavi", "adam", "ngd") for lr in lrs]
    names = {("cavi", lr): f"CAVI adaptive + Adam lr={lr:g}" for lr in lrs}
    names.update({("adam", lr): f"SVGP+Adam lr={lr:g}" for lr in lrs})
    names.update({("ngd", lr): f"NGD lr=0.1 + Adam lr={lr:g}" for lr in lrs})

    common.warm_up(
        (
            build_method(engine, lr, Z, lengthscale, num_data, batch_stream(x, y, args.batch_size, 99))[2]
            for engine, lr in specs
        ),
        repeats=3,
    )
    methods, models = [], {}
    for engine, lr in specs:
        model, likelihood, step = build_method(
            engine, lr, Z, lengthscale, num_data, batch_stream(x, y, args.batch_size, seed=1)
        )
        evaluate = common.binary_evaluator(model, likelihood, x_test, y_test)
        settings = {"engine": engine, "hyper_lr": lr, "link": "logit" if engine == "cavi" else "probit"}
        methods.append(common.MethodSpec(names[engine, lr], step, evaluate, settings))
        models[names[engine, lr]] = model
    rule = common.StoppingRule(
        patience=args.patience,
        min_improvement=1e-4,
        min_window_iterations=args.patience * EVAL_EVERY,
        max_iter=args.max_iter or 10**7,
        max_time=args.max_time,
    )

    def on_done(name: str, trace: common.Trace) -> None:
        common.print_run(
            name, trace, f"best test NLL {min(trace.metrics['test_nll']):.4f}  ", width=32, indent="  (a) "
        )

    start = time.perf_counter()
    traces = common.run_interleaved(methods, "test_nll", rule, schedule=lambda t: t % EVAL_EVERY == 0, on_done=on_done)
    wall = time.perf_counter() - start

    runs = []
    for method in methods:
        trace = traces[method.name]
        runs.append(
            {
                "name": method.name,
                **method.settings,
                "trace": trace.to_dict(),
                **common.run_summary(trace, final=("test_nll", "test_error")),
                "num_iterations": trace.num_iterations,
                "final_hyperparameters": common.hyperparameter_values(models[method.name]),
            }
        )
    best_any = min(r["best_test_nll"] for r in runs)
    target = best_any + TOLERANCE
    hits = {}
    for r in runs:
        hit = hits[r["name"]] = common.hit_record(r, "test_nll", target)
        r["reached_target"] = hit is not None
        r["time_to_target"] = hit["time"] if hit else None
        r["cpu_time_to_target"] = hit["cpu_time"] if hit else None
        r["iterations_to_target"] = hit["iteration"] if hit else None

    def fastest(engine: str) -> dict[str, Any] | None:
        rs = [r for r in runs if r["engine"] == engine]
        done = [r for r in rs if r["reached_target"]]
        if done:
            return min(done, key=lambda r: r["time_to_target"])
        return min(rs, key=lambda r: r["best_test_nll"]) if rs else None

    cavi = fastest("cavi")
    speedups = {}
    for engine in ("adam", "ngd"):
        b = fastest(engine)
        if cavi is None or b is None or not cavi["reached_target"]:
            speedups[engine] = None
            continue
        speedups[engine] = {
            "baseline": b["name"],
            **common.speedup(b, hits[b["name"]], cavi, hits[cavi["name"]]),
            "baseline_best_nll_minus_cavi_best_nll": b["best_test_nll"] - cavi["best_test_nll"],
        }
    return {
        "data": {"name": "magic", "n_train": num_data, "n_test": y_test.numel(), "dim": x.shape[-1]},
        "settings": {
            "num_inducing": args.num_inducing,
            "batch_size": args.batch_size,
            "hyper_lrs": lrs,
            "ngd_lr": 0.1,
            "eval_every": EVAL_EVERY,
            "stopping_rule": vars(rule) if hasattr(rule, "__dict__") else str(rule),
            "tolerance": TOLERANCE,
            "initial_lengthscale": lengthscale.tolist(),
        },
        "best_test_nll_any_run": best_any,
        "target": target,
        "cavi_reported": cavi["name"] if cavi else None,
        "speedups": speedups,
        "issue_targets": {
            "vs_svgp_adam_ge_20": bool(speedups.get("adam") and speedups["adam"]["wall"] >= 20),
            "vs_ngd_ge_3": bool(speedups.get("ngd") and speedups["ngd"]["wall"] >= 3),
        },
        "runs": runs,
        "wall_time": wall,
    }


# ---------------------------------------------------------------------------------------------------- (b) and (c)
def synthetic_data(n: int, dim: int = 10, seed: int = 0, chunk: int = 100_000) -> tuple[Tensor, Tensor]:
    r"""``x ~ N(0, I_D)``, ``y ~ Bernoulli(sigma(f(x)))`` with :math:`f(x) = 2\sin(2x_1) + x_2x_3 - x_4^2/2 + 1/2`,
    generated in chunks (float64)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.empty(n, dim)
    y = torch.empty(n)
    for s in range(0, n, chunk):
        xc = torch.randn(min(chunk, n - s), dim, generator=gen)
        f = 2 * torch.sin(2 * xc[:, 0]) + xc[:, 1] * xc[:, 2] - 0.5 * xc[:, 3] ** 2 + 0.5
        x[s : s + chunk] = xc
        y[s : s + chunk] = torch.bernoulli(torch.sigmoid(f), generator=gen)
    return x, y


def _memory(rss_start: float, rss_data: float) -> dict[str, Any]:
    return {
        "rss_start_mb": rss_start,
        "rss_after_data_mb": rss_data,
        "peak_rss_mb": common.peak_rss_mb(),
        "vm_hwm_mb": common.proc_status_mb("VmHWM"),
    }


def worker_kmeans(n: int, num_inducing: int, iters: int, z_path: str) -> dict[str, Any]:
    """Subprocess: chunked k-means++ (+ Lloyd) on all ``n`` points; saves Z."""
    common.configure_torch(1, torch.float64)
    rss_start = common.peak_rss_mb()
    x, _ = synthetic_data(n)
    rss_data = common.peak_rss_mb()
    start = time.perf_counter()
    Z = kmeans_plus_plus(x, num_inducing, generator=torch.Generator().manual_seed(0), num_iters=iters)
    elapsed = time.perf_counter() - start
    torch.save(Z, z_path)
    return {"time": elapsed, "num_iters": iters, **_memory(rss_start, rss_data)}


def worker_fit(engine: str, n: int, steps: int, batch_size: int, z_path: str) -> dict[str, Any]:
    """Subprocess: data, then ``steps`` training steps of ``engine`` (CAVI + Adam on the hyper-parameters, or
    GPyTorch SVGP + Adam), then the test NLL on 10,000 held-out points; times and peak RSS."""
    common.configure_torch(1, torch.float64)
    rss_start = common.peak_rss_mb()
    x, y = synthetic_data(n)
    rss_data = common.peak_rss_mb()
    x_test, y_test = synthetic_data(10_000, seed=123)
    Z = torch.load(z_path)
    lengthscale = torch.full((x.shape[-1],), math.sqrt(x.shape[-1]))
    model, likelihood, _ = build_method(
        "cavi" if engine == "cavi_fixed" else engine, 0.01, Z, lengthscale, n, lambda: (x[:batch_size], y[:batch_size])
    )
    evaluate = common.binary_evaluator(model, likelihood, x_test, y_test)
    times: list[float] = []
    cpu_times: list[float] = []
    if engine in ("cavi", "cavi_fixed"):
        cavi = CAVI(model, likelihood, num_data=n, step_size=AdaptiveStep())
        hyper = torch.optim.Adam(model.hyperparameters(), lr=0.01) if engine == "cavi" else None
        last = [time.perf_counter(), time.process_time()]

        def callback(t: int, value: float) -> None:
            now = [time.perf_counter(), time.process_time()]
            times.append(now[0] - last[0])
            cpu_times.append(now[1] - last[1])
            last[:] = now

        # the public mini-batch path: fit on the full tensors, one permutation per epoch, steps touch their batch only
        trace = cavi.fit(
            x,
            y,
            batch_size=batch_size,
            max_iter=steps,
            num_epochs=1,
            hyper_optimizer=hyper,
            callback=callback,
            generator=torch.Generator().manual_seed(0),
        )
        finite = all(math.isfinite(v) for v in trace.elbo)
    else:
        mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=n)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
        finite = True
        for t in range(steps):
            t0, c0 = time.perf_counter(), time.process_time()
            idx = order[t * batch_size : (t + 1) * batch_size]
            opt.zero_grad(set_to_none=True)
            loss = -mll(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
            finite = finite and math.isfinite(float(loss))
    memory = _memory(rss_start, rss_data)
    metrics = evaluate()
    skip = min(3, len(times) - 1)  # first steps: allocations and caches
    per_step = float(np.median(times[skip:]))
    steps_per_epoch = math.ceil(n / batch_size)
    return {
        "engine": engine,
        "n": n,
        "batch_size": batch_size,
        "num_inducing": Z.shape[0],
        "steps_timed": len(times),
        "median_step_time": per_step,
        "median_step_cpu_time": float(np.median(cpu_times[skip:])),
        "mean_step_time": float(np.mean(times[skip:])),
        "steps_per_epoch": steps_per_epoch,
        "epoch_time_extrapolated": per_step * steps_per_epoch,
        "test_nll_after_steps": metrics["test_nll"],
        "test_error_after_steps": metrics["test_error"],
        **memory,
        "data_mb": (x.numel() * x.element_size() + y.numel() * y.element_size()) / 2**20,
        "n_by_m_float64_mb": n * Z.shape[0] * 8 / 2**20,
        "finite": finite,
    }


def _subprocess(args: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_synthetic(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """(b): chunked k-means++ on the full data, then each method, every one in its own fresh subprocess (started
    before this process holds any data, so that no worker inherits a large peak RSS)."""
    z_path = out_dir / "_scale_Z.pt"
    common_args = ["--big-n", str(args.big_n), "--big-m", str(args.big_m), "--z-path", str(z_path)]
    kmeans = _subprocess(["--worker", "kmeans", "--kmeans-iters", str(args.kmeans_iters), *common_args])
    print(
        f"  (b) k-means++ on {args.big_n:,} points: {kmeans['time']:.1f} s, peak RSS {kmeans['peak_rss_mb']:.0f} MiB",
        flush=True,
    )
    results = {}
    for engine in ("cavi", "cavi_fixed", "adam"):
        r = _subprocess(
            ["--worker", engine, "--big-steps", str(args.big_steps), "--big-batch", str(args.big_batch), *common_args]
        )
        results[engine] = r
        print(
            f"  (b) {engine:10s} {r['median_step_time'] * 1e3:7.1f} ms/step, epoch "
            f"~{r['epoch_time_extrapolated']:6.1f} s, "
            f"peak RSS {r['peak_rss_mb']:.0f} MiB (after data {r['rss_after_data_mb']:.0f} MiB), "
            f"test NLL after {r['steps_timed']} steps {r['test_nll_after_steps']:.4f}",
            flush=True,
        )
    z_path.unlink(missing_ok=True)
    c, a = results["cavi"], results["adam"]
    return {
        "settings": {
            "n": args.big_n,
            "dim": 10,
            "num_inducing": args.big_m,
            "batch_size": args.big_batch,
            "steps_timed": args.big_steps,
            "kmeans_iters": args.kmeans_iters,
        },
        "kmeans_plus_plus": kmeans,
        "cavi": c,
        "cavi_fixed_hyperparameters": results["cavi_fixed"],
        "svgp_adam": a,
        "epoch_time_ratio_svgp_over_cavi": a["epoch_time_extrapolated"] / c["epoch_time_extrapolated"],
        "step_cpu_time_ratio_svgp_over_cavi": a["median_step_cpu_time"] / c["median_step_cpu_time"],
    }


def run_per_step_vs_n(args: argparse.Namespace) -> dict[str, Any]:
    """(c): median time of a CAVI step inside ``fit(x, y, batch_size=...)`` (with and without the hyper-parameter
    step) for growing N, same batch and the same inducing inputs. Wall and CPU time between consecutive steps
    (``callback`` time stamps); three passes (N ascending, descending, ascending), the smallest median kept, so that
    a change of the machine's load does not masquerade as a trend in N."""
    data = {n: synthetic_data(n, seed=1) for n in args.ns}
    Z = synthetic_data(args.curve_m, seed=7)[0]
    medians: dict[tuple[int, str], list[tuple[float, float]]] = {}
    finite = True
    for order in (list(args.ns), list(reversed(args.ns)), list(args.ns)):
        for n in order:
            x, y = data[n]
            lengthscale = torch.full((x.shape[-1],), math.sqrt(x.shape[-1]))
            for label, with_hyper in (("step", False), ("step_and_hyper", True)):
                model = sparse_gp(
                    Z, gpytorch.variational.NaturalVariationalDistribution, CAVIVariationalStrategy, lengthscale
                )
                cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=n, step_size=AdaptiveStep())
                hyper = torch.optim.Adam(model.hyperparameters(), lr=0.01) if with_hyper else None
                stamps: list[tuple[float, float]] = []
                trace = cavi.fit(
                    x,
                    y,
                    batch_size=args.curve_batch,
                    max_iter=args.curve_steps,
                    num_epochs=args.curve_steps,
                    hyper_optimizer=hyper,
                    generator=torch.Generator().manual_seed(0),
                    callback=lambda t, v: stamps.append((time.perf_counter(), time.process_time())),
                )
                finite = finite and all(math.isfinite(v) for v in trace.elbo)
                gaps = np.diff(np.asarray(stamps), axis=0)[2:]  # the first steps: allocations and caches
                medians.setdefault((n, label), []).append((float(np.median(gaps[:, 0])), float(np.median(gaps[:, 1]))))
    rows = []
    for n in args.ns:
        row: dict[str, Any] = {"n": n}
        for label in ("step", "step_and_hyper"):
            row[label] = min(m[0] for m in medians[n, label])
            row[f"{label}_cpu"] = min(m[1] for m in medians[n, label])
        rows.append(row)
        print(
            f"  (c) N = {n:>9,d}: step {row['step'] * 1e3:6.1f} ms ({row['step_cpu'] * 1e3:6.1f} CPU), "
            f"step + hyper {row['step_and_hyper'] * 1e3:6.1f} ms ({row['step_and_hyper_cpu'] * 1e3:6.1f} CPU)",
            flush=True,
        )
    del data

    def spread(key: str) -> float:
        values = [r[key] for r in rows]
        return max(values) / min(values)

    return {
        "settings": {
            "dim": 10,
            "num_inducing": args.curve_m,
            "batch_size": args.curve_batch,
            "steps": args.curve_steps,
        },
        "rows": rows,
        "finite": finite,
        "max_over_min_step": spread("step"),
        "max_over_min_step_and_hyper": spread("step_and_hyper"),
        "max_over_min_step_cpu": spread("step_cpu"),
        "max_over_min_step_and_hyper_cpu": spread("step_and_hyper_cpu"),
    }


# ---------------------------------------------------------------------------------------------------- output
def report(result: dict[str, Any]) -> tuple[str, dict[str, Any], list[_report.Table]]:
    """Title, settings and tables of a result record (what :func:`_report.write_report` renders)."""
    a, b, c = result["magic"], result["synthetic"], result["per_step_vs_n"]
    info = result["machine"]
    title = "Scale: mini-batch CAVI vs GPyTorch SVGP + Adam and NGD + Adam" + (" (quick)" if result["quick"] else "")
    settings = {
        "command": f"python benchmarks/scale.py{' --quick' if result['quick'] else ''}",
        "threads": "1 per process, float64",
        "tolerance (nats)": TOLERANCE,
        "evaluations (magic)": f"every {EVAL_EVERY} iterations",
        "whole script (s)": result["wall_time"],
        "load average at start / end": f"{result['load_start']} / {result['load_end']}",
        "torch / gpytorch": f"{info['torch']} / {info['gpytorch']}",
        "date (UTC)": info.get("date_utc"),
    }
    tables = []
    if a:
        settings.update({
            "(a) magic: N train / N test / D": f"{a['data']['n_train']} / {a['data']['n_test']} / {a['data']['dim']}",
            "(a) inducing points, batch": "M = 100 k-means++ (fixed), batch 100, hyper-parameters learned by Adam",
            "(a) best test NLL of any run / target": f"{a['best_test_nll_any_run']:.4f} / {a['target']:.4f}",
            "(a) CAVI run reported": a["cavi_reported"],
        })  # fmt: skip
        rows = [[
            r["name"], "logistic (Pólya-Gamma)" if r["link"] == "logit" else "probit (GPyTorch)", r.get("hyper_lr"),
            r["time_to_target"] if r["reached_target"] else None, r["iterations_to_target"] if r["reached_target"]
            else None, r["best_test_nll"], r["final_test_nll"], r["final_test_error"], 1e3 * r["median_step_time"],
            f"{r['num_iterations']}, {r['total_time']:.0f}, {r['stop_reason']}",
        ] for r in a["runs"]]  # fmt: skip
        tables.append(_report.Table(
            "(a) KEEL magic, hyper-parameters learned",
            ["run", "likelihood", "Adam lr", "time to target [s]", "iterations to target", "best test NLL",
             "final test NLL", "final error", "ms / iteration", "run: its, s, stop"], rows,
        ))  # fmt: skip
        rows = []
        for engine, label in (("adam", "SVGP + Adam"), ("ngd", "NGD + Adam")):
            sp = a["speedups"].get(engine)
            rows.append([label, sp["baseline"], sp["wall"], sp["cpu"], sp["iterations"], sp["cost_per_iteration"],
                         sp["is_lower_bound"], sp["baseline_best_nll_minus_cavi_best_nll"]] if sp else
                        [label, None, None, None, None, None, None, None])  # fmt: skip
        tables.append(_report.Table(
            "(a) CAVI speed-ups against the fastest run of each baseline",
            ["baseline", "fastest run", "wall", "CPU", "iterations", "cost per iteration", "lower bound",
             "baseline best NLL − CAVI's"], rows,
        ))  # fmt: skip
    if b:
        st = b["settings"]
        settings.update({
            "(b) synthetic: N, D, M, batch": f"{st['n']}, 10, {st['num_inducing']}, {st['batch_size']}",
            "(b) steps timed (first 3 dropped)": st["steps_timed"],
            "(b) k-means++ on all points: s, peak RSS MiB": f"{b['kmeans_plus_plus']['time']:.1f}, "
            f"{b['kmeans_plus_plus']['peak_rss_mb']:.0f}",
            "(b) N × M float64 matrix / data / RSS after import (MiB)": f"{b['cavi']['n_by_m_float64_mb']:.0f} / "
            f"{b['cavi']['data_mb']:.0f} / {b['cavi']['rss_start_mb']:.0f}",
            "(b) epoch time ratio SVGP / CAVI (wall, CPU)": f"{b['epoch_time_ratio_svgp_over_cavi']:.2f}, "
            f"{b['step_cpu_time_ratio_svgp_over_cavi']:.2f}",
        })  # fmt: skip
        rows = []
        for key, label in (
            ("cavi", "CAVI (fit, batch_size) + Adam on hyper-parameters"),
            ("cavi_fixed_hyperparameters", "CAVI (fit, batch_size), hyper-parameters fixed"),
            ("svgp_adam", "GPyTorch SVGP + Adam"),
        ):
            r = b[key]
            rows.append([label, 1e3 * r["median_step_time"], 1e3 * r["median_step_cpu_time"],
                         r["epoch_time_extrapolated"], r["test_nll_after_steps"], r["peak_rss_mb"], r["vm_hwm_mb"],
                         r["rss_after_data_mb"], r["peak_rss_mb"] - r["rss_after_data_mb"], r["finite"]])  # fmt: skip
        tables.append(_report.Table(
            f"(b) {st['n']} synthetic points, hyper-parameters learned",
            ["method", "ms / step (median)", "CPU ms / step", "epoch [s] (extrapolated)",
             f"test NLL after {st['steps_timed']} steps", "peak RSS [MiB]", "VmHWM [MiB]", "RSS after data [MiB]",
             "peak − after data [MiB]", "finite"], rows,
        ))  # fmt: skip
    if c:
        settings.update({
            "(c) per-step time: D, M, batch, steps": f"10, {c['settings']['num_inducing']}, "
            f"{c['settings']['batch_size']}, {c['settings']['steps']} (smallest of three passes)",
            "(c) largest / smallest over N: step (wall, CPU)": f"{c['max_over_min_step']:.2f}, "
            f"{c['max_over_min_step_cpu']:.2f}",
            "(c) largest / smallest over N: with hyper step (wall, CPU)": f"{c['max_over_min_step_and_hyper']:.2f}, "
            f"{c['max_over_min_step_and_hyper_cpu']:.2f}",
        })  # fmt: skip
        rows = [[r["n"], 1e3 * r["step"], 1e3 * r["step_cpu"], 1e3 * r["step_and_hyper"], 1e3 * r["step_and_hyper_cpu"]]
                for r in c["rows"]]  # fmt: skip
        tables.append(_report.Table(
            "(c) per-step time against N",
            ["N", "CAVI step [ms]", "CPU [ms]", "CAVI step + hyper-parameter step [ms]", "CPU [ms]"], rows,
        ))  # fmt: skip
    return title, settings, tables


def figure(path: Path, result: dict[str, Any]) -> None:
    a, c = result["magic"], result["per_step_vs_n"]
    fig, axes = common.new_figure(2, (12, 4.5))
    colors = {"cavi": "C0", "adam": "C1", "ngd": "C2"}
    styles = {lr: ls for lr, ls in zip(a["settings"]["hyper_lrs"], ["-", "--", ":"])}
    for r in a["runs"]:
        tr = r["trace"]
        t = np.maximum(np.asarray(tr["time"]), 1e-2)
        axes[0].plot(
            t,
            tr["metrics"]["test_nll"],
            color=colors[r["engine"]],
            ls=styles.get(r["hyper_lr"], "-"),
            lw=1.2,
            label=r["name"],
        )
        if r["reached_target"]:
            axes[0].plot([r["time_to_target"]], [a["target"]], "o", color=colors[r["engine"]], ms=5)
    axes[0].axhline(a["target"], color="k", lw=0.8, ls="--", label=f"target (best + {TOLERANCE})")
    axes[0].set_xscale("log")
    lo = a["best_test_nll_any_run"]
    axes[0].set_ylim(lo - 0.005, lo + 0.06)
    axes[0].set_xlabel("training wall time [s] (own clock)")
    axes[0].set_ylabel("test NLL (magic)")
    axes[0].set_title("(a) magic, M = 100, batch 100, hyper-parameters learned")
    axes[0].legend(fontsize=7)
    ns = [r["n"] for r in c["rows"]]
    axes[1].plot(ns, [1e3 * r["step"] for r in c["rows"]], "o-", label="CAVI step")
    axes[1].plot(
        ns, [1e3 * r["step_and_hyper"] for r in c["rows"]], "s-", label="CAVI step + Adam step on AugmentedELBO"
    )
    axes[1].set_xscale("log")
    axes[1].set_ylim(0, 1.3 * max(1e3 * r["step_and_hyper"] for r in c["rows"]))
    axes[1].set_xlabel("N (number of training points)")
    axes[1].set_ylabel("median time per step [ms]")
    axes[1].set_title(
        f"(c) per-step time vs N (M = {c['settings']['num_inducing']}, batch {c['settings']['batch_size']})"
    )
    axes[1].legend(fontsize=8)
    common.save_figure(fig, path)


# ---------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.run_arguments(p, "smoke check, < 2 min", caps=True)  # --max-time, --max-iter: (a)'s caps on each run
    p.add_argument("--patience", type=int, default=None, help="(a): evaluations without improvement before stopping")
    p.add_argument("--lrs", nargs="+", default=None, help="(a): Adam learning rates of the hyper-parameters")
    p.add_argument("--num-inducing", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--big-n", type=int, default=None)
    p.add_argument("--big-m", type=int, default=200)
    p.add_argument("--big-batch", type=int, default=1000)
    p.add_argument("--big-steps", type=int, default=None)
    p.add_argument("--kmeans-iters", type=int, default=None)
    p.add_argument("--ns", type=int, nargs="+", default=None)
    p.add_argument("--curve-m", type=int, default=200)
    p.add_argument("--curve-batch", type=int, default=1000)
    p.add_argument("--curve-steps", type=int, default=None)
    p.add_argument("--skip", nargs="*", default=[], choices=["magic", "synthetic", "curve"])
    # internal: one method of (b) in a fresh process
    p.add_argument("--worker", choices=["kmeans", "cavi", "cavi_fixed", "adam"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--z-path", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick
    defaults = {
        "max_time": 10.0 if quick else 90.0,
        "patience": 8 if quick else 40,
        "lrs": ["0.2"] if quick else ["0.01", "0.05", "0.2"],
        "big_n": 100_000 if quick else 1_000_000,
        "big_steps": 12 if quick else 150,
        "kmeans_iters": 1 if quick else 3,
        "ns": [1_000, 10_000, 100_000] if quick else [1_000, 10_000, 100_000, 1_000_000],
        "curve_steps": 8 if quick else 30,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker == "kmeans":
        print(json.dumps(worker_kmeans(args.big_n, args.big_m, args.kmeans_iters, args.z_path)))
        return
    if args.worker is not None:
        print(json.dumps(worker_fit(args.worker, args.big_n, args.big_steps, args.big_batch, args.z_path)))
        return
    machine = common.start_run(args.threads, args.seed)
    out_dir = common.output_dir(args.output_dir, args.quick)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    load_start = list(os.getloadavg())
    print(
        f"scale benchmark ({'quick' if args.quick else 'full'}), {args.threads} thread(s), output {out_dir}", flush=True
    )
    result: dict[str, Any] = {"quick": args.quick, "machine": machine, "load_start": load_start}
    # (b) first: its workers are started while this process is still small (see run_synthetic)
    result["synthetic"] = run_synthetic(args, out_dir) if "synthetic" not in args.skip else None
    result["magic"] = run_magic(args) if "magic" not in args.skip else None
    result["per_step_vs_n"] = run_per_step_vs_n(args) if "curve" not in args.skip else None
    result["load_end"] = [round(v, 2) for v in os.getloadavg()]
    result["load_start"] = [round(v, 2) for v in load_start]
    result["wall_time"] = time.perf_counter() - start
    result["peak_rss_main_process_mb"] = common.peak_rss_mb()
    draw = result["magic"] and result["per_step_vs_n"]  # the figure shows (a) and (c)
    _report.write_report(out_dir, "scale", result, *report(result), figure=figure if draw else None, echo=False)
    print(f"done in {result['wall_time']:.0f} s -> {out_dir}", flush=True)


if __name__ == "__main__":
    main()
