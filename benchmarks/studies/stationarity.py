r"""Where the one-call fit stops: the nested protocol's stationarity test and its polish restarts, on every likelihood.

The nested protocol (``gpytorch_augment/inference/nested.py``) stops when :math:`J(\theta)` changes by less than
``tol`` or when L-BFGS cannot move. Such a stop counts as converged only if the true ELBO's gradient in the
hyper-parameters, with :math:`q(u)` at its optimum, is at most ``NESTED_GTOL`` per datum in every entry; otherwise
the fit warns, or with ``hyper_options={"restarts": r}`` goes on in *polish* mode (exact gradients at a held
:math:`q(u)`, re-solved after every iteration) up to ``r`` times. This script measures, on the problems of
``nested_settings.py`` (one per likelihood class, splits :data:`SEEDS`):

* ``default``: ``CAVI(...).fit(x, y, learn_hyperparameters=True)``, every default (``restarts=0``);
* ``restarts=2``: the same with ``hyper_options={"restarts": 2}``;

per run the wall time, whether it was certified (``trace.converged``), how it ended, the largest gradient entry
at the end (``NestedProtocol.stationarity()``, measured after the timed call), the true ELBO per datum and the
test NLL. The settings of a split run one after the other in a rotating order, one thread, after an untimed warm-up.

Run ``python benchmarks/studies/stationarity.py`` (``results/stationarity.{json,md}``) or ``--quick`` (seconds, to
``$TMPDIR/gpytorch_augment_benchmarks/``).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: the shared modules

import _common as common  # noqa: E402
import _report  # noqa: E402
import gpytorch  # noqa: E402
import hyperparameters as hp  # noqa: E402
import nested_settings as ns  # noqa: E402
import torch  # noqa: E402

from gpytorch_augment import CAVI, CAVIVariationalStrategy  # noqa: E402
from gpytorch_augment.inference.fit_options import FitOptions  # noqa: E402
from gpytorch_augment.inference.hyperparameters import hyperparameters_of  # noqa: E402
from gpytorch_augment.inference.nested import NestedProtocol  # noqa: E402

_NESTED = FitOptions().resolved("nested")  #: the nested protocol's defaults
NESTED_GTOL, NESTED_MAX_ITER, NESTED_TOL = _NESTED.gtol, _NESTED.max_iter, _NESTED.tol
#: the settings, declared before any run: the default, and two polish restarts
SETTINGS = {"default": {}, "restarts=2": {"restarts": 2}}
SEEDS = ns.SEEDS  #: the splits of nested_settings.py (no tuning used them)


def measure_fit(problem: str, data: dict[str, Any], Z: torch.Tensor, max_iter: int | None,
                hyper_options: dict[str, Any] | None = None,
                around: Callable[[], AbstractContextManager] = nullcontext) -> dict[str, Any]:  # fmt: skip
    """The default one-call fit (``hyper_options`` added; inside ``around()``) of split ``data``: its wall time, how
    it ended, the largest gradient entry at the end (measured after the timed call), the true ELBO per datum and
    the test NLL."""
    lik = ns.make_likelihood(problem, data["K"])
    model = hp.Model(Z, lik.num_latents, gpytorch.variational.CholeskyVariationalDistribution,
                     CAVIVariationalStrategy, unit_start=True).double()  # fmt: skip
    x, y, n = data["x"], data["y"], data["y"].shape[-1]
    cavi = CAVI(model, lik, num_data=n)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught, around():
        warnings.simplefilter("always")
        try:
            trace = cavi.fit(x, y, learn_hyperparameters=True, max_iter=max_iter, hyper_options=hyper_options,
                             **data["kw"])  # fmt: skip
        except Exception as error:  # noqa: BLE001 - a failure is a result, reported
            return {"time": time.perf_counter() - start, "failed": f"{type(error).__name__}: {error}"}
    wall = time.perf_counter() - start
    values = trace.elbo
    by_rule = len(values) >= 2 and abs(values[-1] - values[-2]) <= NESTED_TOL * max(1.0, abs(values[-1]))
    capped = not trace.converged and trace.num_steps >= (max_iter or NESTED_MAX_ITER)
    ended = "cap" if capped else ("rule" if by_rule else "stall")
    model.train()
    lik.train()
    gradient = NestedProtocol(cavi, cavi.check_data(x, y, data["kw"]), hyperparameters_of(cavi)).stationarity()
    elbo = ns.true_elbo(model, lik, x, y, data["kw"])
    nll = ns.test_nll(model, lik, data["xt"], data["yt"], data["kwt"])
    return {"time": wall, "converged": bool(trace.converged), "ended": ended, "iterations": trace.num_steps,
            "gradient": gradient, "true_elbo": elbo, "test_nll": nll,
            "warnings": [f"{type(w.message).__name__}: {str(w.message)[:160]}" for w in caught]}  # fmt: skip


def run_setting(problem: str, data: dict[str, Any], Z: torch.Tensor, name: str, max_iter: int | None) -> dict:
    return {"setting": name, **measure_fit(problem, data, Z, max_iter, SETTINGS[name])}


def run_rotated(
    problem: str, seeds: list[int], quick: bool, choices: list[Any], run: Callable[..., dict[str, Any]], label: str
) -> dict[str, Any]:
    """``run(problem, data, Z, choice, max_iter)`` for every choice on every split of ``problem``, the choices in a
    rotating order per split, after an untimed warm-up; each run printed as ``label`` and the choice."""
    cap = 60 if quick else ns.PROBLEMS[problem]["max_train"]
    runs, n = [], None
    ns.warm_up(problem, seeds[0])
    for s, seed in enumerate(seeds):
        data = ns.load(problem, seed, cap, max_test=100 if quick else None)
        n = data["y"].shape[-1]
        Z = common.kmeans_inducing_points(data["x"], min(8 if quick else ns.NUM_INDUCING, n), seed=seed)
        for choice in choices[s % len(choices):] + choices[: s % len(choices)]:
            torch.manual_seed(seed)
            r = {"seed": seed, **run(problem, data, Z, choice, 10 if quick else None)}
            runs.append(r)
            if "failed" in r:
                print(f"   {problem} {seed} {label}{choice}: FAILED {r['failed'][:100]}", flush=True)
                continue
            evaluations = f" ev {r['evaluations']:4d}" if "evaluations" in r else ""
            print(f"   {problem} {seed} {label}{choice!s:10s} {r['time']:7.2f}s it {r['iterations']:3d}{evaluations} "
                  f"{r['ended']:5s} certified {r['converged']!s:5s} |g| {r['gradient']:.1e} "
                  f"elbo {r['true_elbo']:+.4f} nll {r['test_nll']:.4f}", flush=True)  # fmt: skip
    return {"problem": problem, "num_train": n, "runs": runs}


def run_problem(problem: str, seeds: list[int], quick: bool) -> dict[str, Any]:
    return run_rotated(problem, seeds, quick, list(SETTINGS), run_setting, "")


def _end(run: dict[str, Any]) -> str:
    return f"{run['ended']}, {'certified' if run['converged'] else 'warned'}"


def report_tables(results: list[dict[str, Any]]) -> list[_report.Table]:
    rows = []
    for result in results:
        by = {}
        for r in result["runs"]:
            by.setdefault(r["seed"], {})[r["setting"]] = r
        for seed, pair in by.items():
            a, b = pair.get("default", {}), pair.get("restarts=2", {})
            if "failed" in a or "failed" in b or not a or not b:
                rows.append([result["problem"], seed] + [None] * 9)
                continue
            rows.append([
                result["problem"], seed, _end(a), f"{a['gradient']:.1e}", f"{a['time']:.1f}", _end(b),
                f"{b['gradient']:.1e}", f"{b['time'] / a['time']:.2f}", f"{b['true_elbo'] - a['true_elbo']:+.4f}",
                f"{b['test_nll'] - a['test_nll']:+.4f}", f"{a['test_nll']:.4f}",
            ])  # fmt: skip
    columns = ["problem", "split", "default: end", "its largest gradient", "its time (s)", "restarts=2: end",
               "its largest gradient", "time ratio", "true ELBO gain", "test NLL change", "default test NLL"]
    return [_report.Table("Per split: the default fit and two polish restarts", columns, rows)]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.run_arguments(parser, "tiny problems, one split, 10 iterations", caps=False)
    parser.add_argument("--problems", nargs="+", default=list(ns.PROBLEMS), choices=list(ns.PROBLEMS),
                        metavar="PROBLEM")  # fmt: skip
    parser.add_argument("--splits", type=int, default=len(SEEDS), help=f"the first splits of {SEEDS}")
    parser.add_argument("--tag", default=None, help="write stationarity_TAG.{json,md}")
    args = parser.parse_args(argv)
    machine = common.start_run(threads=args.threads, seed=args.seed)
    out = common.output_dir(args.output_dir, args.quick)
    seeds = list(SEEDS[: 1 if args.quick else args.splits])
    problems = args.problems[:2] if args.quick else args.problems
    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    for problem in problems:  # the record is rewritten after every problem: a crash keeps what was measured
        results.append(run_problem(problem, seeds, args.quick))
        record = {"machine": common.close_machine_info(dict(machine)), "arguments": list(argv or sys.argv[1:]),
                  "settings": SETTINGS, "gtol": NESTED_GTOL, "seeds": seeds,
                  "total_wall_time": time.perf_counter() - started, "results": results}  # fmt: skip
        settings = {
            "command": "python benchmarks/studies/stationarity.py " + " ".join(record["arguments"]),
            "settings (declared before any run)": str(SETTINGS),
            "stationarity test": f"largest |dELBO/dθ| per datum at the optimal q(u) ≤ {NESTED_GTOL:g}",
            "problems, splits, start": "those of nested_settings.py; splits " + ", ".join(map(str, seeds)),
            "total wall time (s)": round(record["total_wall_time"], 1),
            **_report.machine_settings(record["machine"]),
        }
        _report.write_report(out, "stationarity" + (f"_{args.tag}" if args.tag else ""), record,
                             "Where the one-call fit stops: the stationarity test and polish restarts", settings,
                             report_tables(results), echo=False)  # fmt: skip
    return results


if __name__ == "__main__":
    main()
