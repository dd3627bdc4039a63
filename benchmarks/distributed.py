r"""Mini-batch CAVI on one process vs two processes (``torch.distributed``, gloo on 127.0.0.1), 10⁷ points of the
scale benchmark's synthetic classifier (:func:`shard`): both layouts take the same global batches (:func:`batch_rows`),
so the final q(u) must agree. Time per step and epoch, throughput, the all-reduce's share, per-process peak memory.
Set-up, targets and how to read ``results/distributed.{json,md}``: ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import _report  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from gpytorch_augment import CAVI, BernoulliLogitLikelihood, CAVIVariationalStrategy  # noqa: E402

#: rows generated per seeded chunk (so that any row range is reproducible without generating the rest)
CHUNK = 100_000


def shard(n: int, start: int, stop: int, dim: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    r"""Rows ``[start, stop)`` of the synthetic data set of ``n`` rows: chunk ``c`` of ``CHUNK`` rows is drawn from
    a generator seeded with ``seed * 1_000_003 + c``, so every row has the same value whichever range is asked."""
    x = torch.empty(stop - start, dim)
    y = torch.empty(stop - start)
    for c in range(start // CHUNK, (stop - 1) // CHUNK + 1 if stop > start else start // CHUNK):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + c)
        lo, hi = c * CHUNK, min((c + 1) * CHUNK, n)
        xc = torch.randn(hi - lo, dim, generator=gen)
        f = 2 * torch.sin(2 * xc[:, 0]) + xc[:, 1] * xc[:, 2] - 0.5 * xc[:, 3] ** 2 + 0.5
        yc = torch.bernoulli(torch.sigmoid(f), generator=gen)
        a, b = max(lo, start), min(hi, stop)
        x[a - start : b - start] = xc[a - lo : b - lo]
        y[a - start : b - start] = yc[a - lo : b - lo]
    return x, y


def batch_rows(t: int, half: int, half_rows: int, per_half: int, seed: int) -> Tensor:
    """The rows (relative to half ``half``) of global batch ``t`` that come from that half."""
    gen = torch.Generator().manual_seed(seed * 7919 + t * 2 + half)
    return torch.randint(0, half_rows, (per_half,), generator=gen)


def Model(Z: Tensor) -> common.SparseGP:
    """Whitened Cholesky q(u) at fixed ``Z``, constant mean, ARD RBF kernel with lengthscales and outputscale 2."""
    hypers = {"lengthscale": [2.0] * Z.shape[-1], "outputscale": 2.0, "mean_constant": 0.0}
    return common.SparseGP(Z, strategy_cls=CAVIVariationalStrategy, hypers=hypers, frozen=False)


def worker(rank: int, world: int, port: int, settings: dict[str, Any], out: str) -> None:
    """One process of a run: its half (or all) of the data, ``steps`` CAVI steps, its measurements to ``out``."""
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    n, dim, m, batch, steps, seed = (settings[k] for k in ("n", "dim", "m", "batch", "steps", "seed"))
    collective_time = [0.0]
    if world > 1:
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
        original = dist.all_reduce

        def timed_all_reduce(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                collective_time[0] += time.perf_counter() - start

        dist.all_reduce = timed_all_reduce
    rss_before = common.peak_rss_mb()
    half = n // 2
    bounds = [(0, half), (half, n)]
    mine = [rank] if world > 1 else [0, 1]
    parts = [shard(n, *bounds[r], dim, seed) for r in mine]
    rss_data = common.peak_rss_mb()
    Z = shard(n, 0, m, dim, seed)[0]
    model = Model(Z)
    cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=n, step_size=settings["step_size"])
    per_half = batch // 2
    times, cpu_times = [], []
    for t in range(steps):
        xs, ys = [], []
        for r, (x, y) in zip(mine, parts):
            rows = batch_rows(t, r, bounds[r][1] - bounds[r][0], per_half, seed)
            xs.append(x[rows])
            ys.append(y[rows])
        xb, yb = torch.cat(xs), torch.cat(ys)
        start, cpu_start = time.perf_counter(), time.process_time()
        cavi.step(xb, yb)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    result = {
        "rank": rank,
        "world": world,
        "step_times": times,
        "step_cpu_times": cpu_times,
        "collective_time": collective_time[0],
        "rss_before_data_mb": rss_before,
        "rss_after_data_mb": rss_data,
        "peak_rss_mb": common.peak_rss_mb(),
        "q": [p.detach().clone() for p in model.variational_parameters()],
    }
    torch.save(result, Path(out) / f"world{world}_rank{rank}.pt")
    if world > 1:
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_layout(world: int, settings: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, settings, str(tmp))) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a worker of the {world}-process run failed (exit code {p.exitcode})")
    return [torch.load(tmp / f"world{world}_rank{r}.pt", weights_only=False) for r in range(world)]


def summarise(runs: dict[int, list[dict[str, Any]]], settings: dict[str, Any]) -> dict[str, Any]:
    """Per-layout figures and the ratios the targets are stated in."""
    warm = settings["warmup_steps"]
    layouts = {}
    for world, ranks in runs.items():
        # a step of the layout ends when its slowest rank ends
        per_step = [max(r["step_times"][t] for r in ranks) for t in range(len(ranks[0]["step_times"]))][warm:]
        step = sum(per_step) / len(per_step)
        epoch_steps = settings["n"] / settings["batch"]
        total = sum(sum(r["step_times"][warm:]) for r in ranks) / len(ranks)
        cpu_step = max(sum(r["step_cpu_times"][warm:]) / len(r["step_cpu_times"][warm:]) for r in ranks)
        layouts[world] = {
            "processes": world,
            "time_per_step_s": step,
            "cpu_time_per_step_s": cpu_step,
            "time_per_epoch_s": step * epoch_steps,
            "epoch_extrapolated": settings["steps"] < epoch_steps,
            "throughput_points_per_s": settings["batch"] / step,
            "all_reduce_share": (sum(r["collective_time"] for r in ranks) / len(ranks)) / total if world > 1 else 0.0,
            "peak_rss_mb": max(r["peak_rss_mb"] for r in ranks),
            "peak_above_start_mb": max(r["peak_rss_mb"] - r["rss_before_data_mb"] for r in ranks),
        }
    one, two = layouts[1], layouts[2]
    q1 = runs[1][0]["q"]
    q_diff = max(
        float(((a - b).abs().max() / b.abs().max().clamp_min(1e-300)))
        for r in runs[2]
        for a, b in zip(r["q"], q1)
    )
    return {
        "layouts": {str(k): v for k, v in layouts.items()},
        "throughput_ratio": two["throughput_points_per_s"] / one["throughput_points_per_s"],
        # each process on a core of its own: a step costs the busiest rank's CPU time
        "cpu_throughput_ratio": one["cpu_time_per_step_s"] / two["cpu_time_per_step_s"],
        "memory_ratio": two["peak_rss_mb"] / one["peak_rss_mb"],
        "memory_ratio_above_start": two["peak_above_start_mb"] / one["peak_above_start_mb"],
        "max_relative_q_difference": q_diff,
    }


def report(result: dict[str, Any]) -> tuple[str, dict[str, Any], list[_report.Table]]:
    """Title, settings and tables of a result record (what :func:`_report.write_report` renders)."""
    s, r = result["settings"], result["summary"]
    rows = [[lay["processes"], lay["time_per_step_s"] * 1e3, lay["cpu_time_per_step_s"] * 1e3, lay["time_per_epoch_s"],
             lay["epoch_extrapolated"], lay["throughput_points_per_s"], 100 * lay["all_reduce_share"],
             lay["peak_rss_mb"], lay["peak_above_start_mb"]] for lay in r["layouts"].values()]  # fmt: skip
    settings = {
        "command": "python benchmarks/distributed.py",
        "N, D, M": f"{s['n']}, {s['dim']}, {s['m']}",
        "global batch, steps (warm-up excluded)": f"{s['batch']}, {s['steps']} ({s['warmup_steps']})",
        "processes": "one torch thread each, gloo on 127.0.0.1",
        **_report.machine_settings(result["machine"]),
    }
    ratios = [
        ["throughput, 2 processes ÷ 1 (wall clock)", r["throughput_ratio"]],
        ["throughput, 2 processes ÷ 1 (busiest rank's CPU time)", r["cpu_throughput_ratio"]],
        ["peak memory per process, 2 ÷ 1", r["memory_ratio"]],
        ["peak memory above the start, 2 ÷ 1", r["memory_ratio_above_start"]],
        ["final q(u), largest relative difference 2 vs 1", r["max_relative_q_difference"]],
    ]
    tables = [
        _report.Table("Layouts", ["processes", "time / step [ms]", "CPU time / step, busiest rank [ms]",
                                  "time / epoch [s]", "epoch extrapolated", "points / s", "all-reduce share [%]",
                                  "peak RSS / process [MiB]", "peak above start [MiB]"], rows),
        _report.Table("Two processes against one", ["quantity", "value"], ratios),
    ]  # fmt: skip
    return "Multi-process CAVI", settings, tables


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.run_arguments(parser, "2*10^5 points, 30 steps", caps=False)
    parser.add_argument("--n", type=int, default=None, help="data points (default 10^7, quick 2*10^5)")
    parser.add_argument("--batch-size", type=int, default=10_000, help="global batch size (default %(default)s)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default: one epoch, quick 30)")
    args = parser.parse_args(argv)
    machine = common.start_run(args.threads, args.seed)
    n = args.n or (200_000 if args.quick else 10_000_000)
    steps = args.steps or (30 if args.quick else n // args.batch_size)
    settings = {
        "n": n,
        "dim": 10,
        "m": 200,
        "batch": args.batch_size,
        "steps": steps,
        "warmup_steps": min(5, steps // 5),
        "seed": args.seed,
        "step_size": 0.05,
    }
    out = common.output_dir(args.output_dir, args.quick)
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:  # the workers' measurements and final q(u)
        for world in (1, 2):
            print(f"{world} process(es): {steps} steps of {args.batch_size:,} points out of {n:,} ...", flush=True)
            runs[world] = run_layout(world, settings, Path(tmp))
    result = {
        "settings": settings,
        "machine": common.close_machine_info(machine),
        "summary": summarise(runs, settings),
    }
    _report.write_report(out, "distributed", result, *report(result))


if __name__ == "__main__":
    main()
