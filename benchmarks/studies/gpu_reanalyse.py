r"""Re-read a ``gpu.py`` record whose GPyTorch peers were fed empty batches at first, and estimate what they measure.

Until 2026-11-26 the peers' batch sampler in ``gpu.py`` (``_batches``) drew its first permutation only once
``n / batch_size`` calls had passed: the first :math:`E = \lfloor n / b \rfloor` steps of every SVGP run (Adam, NGD,
``LargeBatchVariationalStrategy``) saw no data, cost about as much as a real step (the kernel factorisation and the
KL term) and left q(u) at its start. CAVI's runs go through the package's own ``fit`` and are not affected. The
first GPU record (an H100, 2026-11-26) has that flaw; the device time to rerun it was spent, so this script gives
the estimate its traces allow, labelled as such:

* the empty steps' time: :math:`E` times the mean step time up to the last checkpoint at or before step :math:`E`
  (every step there was empty);
* a peer's corrected time to target: its recorded time to target minus that time; its corrected step time: the time
  after step :math:`E` over the steps after it;
* runs with :math:`E` at or above their step count trained on nothing: marked, not estimated.

The checkpoints are 25 steps apart, so both methods' times to target carry that resolution (CAVI's first checkpoint
is its earliest possible time).

Usage::

    python benchmarks/studies/gpu_reanalyse.py benchmarks/results/gpu/gpu.json --output-dir benchmarks/results/gpu
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: the shared modules
import _report  # noqa: E402


def empty_steps(record: dict[str, Any]) -> int:
    """The number of empty batches a peer run received first: ``floor(n / batch_size)``."""
    return record["n"] // record["batch_size"]


def corrected(record: dict[str, Any]) -> dict[str, Any]:
    """One peer run's estimate (see the module docstring); CAVI's runs are returned unchanged."""
    out = {**record, "empty_steps": 0, "empty_time": 0.0, "corrected_time_to_target": record["time_to_target"],
           "corrected_step_time": record.get("step_time"), "trained": True}  # fmt: skip
    if record["engine"] == "cavi":
        return out
    e = empty_steps(record)
    before = [(t, s) for t, s, _ in record["trace"] if s <= e]
    out["empty_steps"] = e
    if not before or e >= record["steps"]:
        out.update(empty_time=None, corrected_time_to_target=None, corrected_step_time=None, trained=False)
        return out
    t_last, s_last = before[-1]
    empty_time = e * t_last / s_last
    ttt = record["time_to_target"]
    out["empty_time"] = empty_time
    out["corrected_time_to_target"] = None if ttt is None else ttt - empty_time
    out["corrected_step_time"] = (record["train_time"] - empty_time) / (record["steps"] - e)
    return out


def speedups(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """CAVI's speed-up over each peer's fastest run per configuration, raw and corrected."""
    keys = ("n", "m", "dtype", "batch_size", "hyperparameters")
    rows = []
    for config in sorted({tuple(r[k] for k in keys) for r in records}, key=str):
        runs = [r for r in records if tuple(r[k] for k in keys) == config]
        cavi = next((r for r in runs if r["engine"] == "cavi"), None)
        if cavi is None or cavi["time_to_target"] is None:
            continue
        for peer in sorted({r["engine"] for r in runs} - {"cavi"}):
            timed = [r for r in runs if r["engine"] == peer and r["corrected_time_to_target"] is not None]
            if not timed:
                trained = any(r["trained"] for r in runs if r["engine"] == peer)
                rows.append({"config": config, "peer": peer, "peer_lr": None, "raw_speedup": None,
                             "corrected_peer_time": None, "cavi_time": cavi["time_to_target"], "speedup": None,
                             "note": "target not reached" if trained else "no data seen within the time cap"})
                continue
            best = min(timed, key=lambda r: r["corrected_time_to_target"])
            rows.append({"config": config, "peer": peer, "peer_lr": best["lr"],
                         "raw_speedup": best["time_to_target"] / cavi["time_to_target"],
                         "corrected_peer_time": best["corrected_time_to_target"],
                         "cavi_time": cavi["time_to_target"],
                         "speedup": best["corrected_time_to_target"] / cavi["time_to_target"], "note": ""})
    return rows


def report(result: dict[str, Any]) -> tuple[str, dict[str, Any], list[_report.Table]]:
    title = f"On the GPU, re-read: GPyTorch peers without their empty first batches ({result['card']}; estimates)"
    settings = {"card": result["card"], "source record": result["source"], "size": result["size"],
                "torch / gpytorch (device image)": result["versions"]}  # fmt: skip
    rows = [[r["n"], r["m"], r["dtype"], r["hyperparameters"], r["engine"], r["lr"], r["empty_steps"],
             r["empty_time"], r["time_to_target"], r["corrected_time_to_target"],
             None if r["corrected_step_time"] is None else 1e3 * r["corrected_step_time"], r["best_test_nll"]]
            for r in result["runs"]]  # fmt: skip
    tables = [_report.Table("Time to target, raw and without the empty steps (estimate)",
                            ["N", "M", "dtype", "hyper-parameters", "method", "lr", "empty steps", "their time [s]",
                             "raw time to target [s]", "corrected [s]", "corrected step [ms]", "best test NLL"],
                            rows)]  # fmt: skip
    rows = [[*s["config"], s["peer"], s["peer_lr"], s["corrected_peer_time"], s["cavi_time"], s["raw_speedup"],
             s["speedup"], s["note"]] for s in result["speedups"]]  # fmt: skip
    tables.append(_report.Table("CAVI's speed-up over each peer's fastest run: raw record and corrected estimate",
                                ["N", "M", "dtype", "batch", "hyper-parameters", "peer", "peer lr", "peer [s]",
                                 "CAVI [s]", "raw speed-up", "corrected speed-up", "note"], rows))  # fmt: skip
    return title, settings, tables


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records", type=Path, nargs="+", help="gpu.py JSON records (their CAVI parts are re-read)")
    p.add_argument("--output-dir", type=Path, default=Path(__file__).resolve().parent.parent / "results" / "gpu")
    p.add_argument("--name", default="gpu_corrected")
    args = p.parse_args(argv)
    sources = [json.loads(path.read_text()) for path in args.records]
    runs = [corrected(r) for source in sources for r in source.get("cavi", [])]
    first = sources[0]
    result = {"card": first["card"], "size": first["size"], "source": ", ".join(p.name for p in args.records),
              "versions": f"{first['machine']['torch']} / {first['machine']['gpytorch']}", "runs": runs,
              "speedups": speedups(runs)}  # fmt: skip
    title, settings, tables = report(result)
    _report.write_report(args.output_dir, args.name, result, title, settings, tables, echo=False)
    return result


if __name__ == "__main__":
    main()
