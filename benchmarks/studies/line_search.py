r"""How many evaluations one line search of the one-call fit may spend: ``FitOptions.max_line_search``, on every
likelihood.

Near its optimum the nested objective :math:`J(\theta)` (``gpytorch_augment/inference/nested.py``) has an envelope
gradient that no longer matches :math:`J` exactly, and torch's strong-Wolfe line search can spend most of its
evaluations without finding an acceptable step. This script runs the default one-call fit with the cap of
evaluations per line search at each value of :data:`CAPS` (declared before any run), on the problems and splits of
``nested_settings.py`` (one per likelihood class, splits 100-102, none of them used by ``hyperparameters.py``), and
reports per run the wall time, the L-BFGS iterations, the evaluations of :math:`J`, how the fit ended, the largest
gradient entry at the end, the true ELBO per datum and the test NLL. The caps of a split run one after the other in a
rotating order, one thread, after an untimed warm-up.

Run ``python benchmarks/studies/line_search.py`` (``results/line_search.{json,md}``), ``--problems ... --tag part``
for a part, or ``--quick`` (seconds, to ``$TMPDIR/gpytorch_augment_benchmarks/``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: the shared modules

import _common as common  # noqa: E402
import _report  # noqa: E402
import nested_settings as ns  # noqa: E402
import stationarity as st  # noqa: E402
import torch  # noqa: E402

from gpytorch_augment.inference.nested import NestedObjective  # noqa: E402

#: the caps compared, declared before any run: torch's own default (25, the package's until this script) and 10
CAPS = (25, 10)
SEEDS = ns.SEEDS  #: the splits of nested_settings.py


def run_cap(problem: str, data: dict[str, Any], Z: torch.Tensor, cap: int, max_iter: int | None) -> dict[str, Any]:
    """The default one-call fit with ``cap`` evaluations per line search, and how many evaluations of J it made."""
    counts = {"evaluations": 0}

    @contextmanager
    def counted_evaluations() -> Iterator[None]:
        call = NestedObjective.__call__

        def counted(self: NestedObjective, *args: Any, **kwargs: Any) -> torch.Tensor:
            counts["evaluations"] += 1
            return call(self, *args, **kwargs)

        NestedObjective.__call__ = counted
        try:
            yield
        finally:
            NestedObjective.__call__ = call

    result = st.measure_fit(problem, data, Z, max_iter, hyper_options={"max_line_search": cap},
                            around=counted_evaluations)  # fmt: skip
    return {"cap": cap, **result, **({} if "failed" in result else counts)}


def run_problem(problem: str, seeds: list[int], quick: bool) -> dict[str, Any]:
    return st.run_rotated(problem, seeds, quick, list(CAPS), run_cap, "cap ")


def report_tables(results: list[dict[str, Any]]) -> list[_report.Table]:
    a, b = CAPS
    rows, ratios = [], []
    for result in results:
        by: dict[int, dict[int, dict[str, Any]]] = {}
        for r in result["runs"]:
            by.setdefault(r["seed"], {})[r["cap"]] = r
        for seed, pair in by.items():
            ra, rb = pair.get(a, {}), pair.get(b, {})
            if not ra or not rb or "failed" in ra or "failed" in rb:
                rows.append([result["problem"], seed] + [None] * 8)
                continue
            ratios.append(rb["time"] / ra["time"])
            rows.append([
                result["problem"], seed, f"{ra['ended']}, {'certified' if ra['converged'] else 'warned'}",
                f"{ra['iterations']} / {ra['evaluations']}", f"{ra['time']:.1f}",
                f"{rb['ended']}, {'certified' if rb['converged'] else 'warned'}",
                f"{rb['iterations']} / {rb['evaluations']}", f"{rb['time'] / ra['time']:.2f}",
                f"{rb['true_elbo'] - ra['true_elbo']:+.4f}", f"{rb['test_nll'] - ra['test_nll']:+.4f}",
            ])  # fmt: skip
    columns = [
        "problem", "split", f"cap {a}: end", "its iterations / evaluations", "its time (s)", f"cap {b}: end",
        "its iterations / evaluations", "time ratio", "true ELBO change", "test NLL change",
    ]  # fmt: skip
    tables = [_report.Table(f"Per split: cap {b} against cap {a}", columns, rows)]
    if ratios:
        summary = [[len(ratios), f"{statistics.median(ratios):.2f}", f"{min(ratios):.2f}", f"{max(ratios):.2f}"]]
        tables.append(_report.Table("Time ratio over every split", ["runs", "median", "min", "max"], summary))
    return tables


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.run_arguments(parser, "tiny problems, one split, 10 iterations", caps=False)
    parser.add_argument("--problems", nargs="+", default=list(ns.PROBLEMS), choices=list(ns.PROBLEMS),
                        metavar="PROBLEM")  # fmt: skip
    parser.add_argument("--tag", default=None, help="write line_search_TAG.{json,md}")
    parser.add_argument("--merge", type=Path, nargs="+", default=None, help="combine parts into line_search.*")
    args = parser.parse_args(argv)
    out = common.output_dir(args.output_dir, args.quick)
    if args.merge:
        import json

        records = [json.loads(Path(p).read_text()) for p in args.merge]
        results = [r for rec in records for r in rec["results"]]
        order = list(ns.PROBLEMS)
        results.sort(key=lambda r: order.index(r["problem"]))
        parts = [Path(p).name for p in args.merge]
        record = {**records[0], "arguments": ["--merge", *parts], "parts": parts, "results": results,
                  "total_wall_time": sum(rec["total_wall_time"] for rec in records)}  # fmt: skip
        return _write(out, "line_search", record, results)
    machine = common.start_run(threads=args.threads, seed=args.seed)
    seeds = list(SEEDS[:1] if args.quick else SEEDS)
    problems = args.problems[:2] if args.quick else args.problems
    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    for problem in problems:  # the record is rewritten after every problem: a crash keeps what was measured
        results.append(run_problem(problem, seeds, args.quick))
        record = {"machine": common.close_machine_info(dict(machine)), "arguments": list(argv or sys.argv[1:]),
                  "caps": CAPS, "seeds": seeds, "total_wall_time": time.perf_counter() - started,
                  "results": results}  # fmt: skip
        _write(out, "line_search" + (f"_{args.tag}" if args.tag else ""), record, results)
    return results


def _write(out: Path, stem: str, record: dict[str, Any], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    settings = {
        "command": "python benchmarks/studies/line_search.py " + " ".join(record.get("arguments", [])),
        "caps (declared before any run)": str(CAPS),
        "problems, splits, start": "those of nested_settings.py; splits " + ", ".join(map(str, record["seeds"])),
        "parts": ", ".join(record.get("parts", [])) or "one run",
        "total wall time (s)": round(record["total_wall_time"], 1),
        **_report.machine_settings(record["machine"]),
    }
    _report.write_report(out, stem, record, "The line search's cap of evaluations in the one-call fit", settings,
                         report_tables(results), echo=False)  # fmt: skip
    return results


if __name__ == "__main__":
    main()
