r"""Is ``CAVI(..., hyper_objective=VariationalELBO(...))`` stable? The true-ELBO M-step with a whitened and with an
unwhitened CAVI strategy, on the multi-class benchmark's problem (KEEL ``satimage``, logistic-softmax, θ = 1).

The loop alternates a closed-form CAVI step on q(u) (the augmented bound) with an Adam step on the hyper-parameters
along the **true** ELBO at that q(u): two different objectives, so nothing guarantees convergence. With the whitened
``CAVIVariationalStrategy`` (u = μ_Z + L v, q(v) fixed during the M-step) the hyper-parameters move the latent
function values themselves -- a mean constant shifts every f -- so the M-step competes with the CAVI step; with
``UnwhitenedCAVIVariationalStrategy`` q(u) pins the function values at Z during the M-step. This script measures
both, with everything else as in ``multiclass.py`` (same subset, Z, initialisation, Adam lr, 1000 iterations; the
subset's true ELBO every 100 iterations), then freezes each fit's hyper-parameters, fits q(u) by CAVI on all
training data (whitened strategy, as every CAVI row of ``multiclass.py``) and reports the test accuracy and NLL.

Run ``python benchmarks/studies/hyper_objective.py`` (~15 min on 2 shared cores) or ``--quick``; results go to
``results/hyper_objective.{json,md}``.
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
import multiclass as mc  # noqa: E402

from gpytorch_augment.datasets import load_keel  # noqa: E402

SPECS = {
    "whitened": mc.MethodConfig("true-ELBO M-step, whitened", "cavi", hypers="own-true"),
    "unwhitened": mc.MethodConfig("true-ELBO M-step, unwhitened", "cavi", hypers="own-true", unwhitened=True),
    "augmented": mc.MethodConfig("augmented-bound M-step (default), whitened", "cavi"),
}


def fit_q_u(spec: mc.MethodConfig, x: Any, y: Any, Z: Any, K: int, hypers: dict[str, Any], max_steps: int) -> mc.Built:
    """q(u) by full-batch CAVI at the frozen hyper-parameters until the augmented ELBO changes by < 1e-6 / datum."""
    built = mc.build(spec, x, y, Z, K, hypers)
    previous = None
    for _ in range(max_steps):
        value = float(built.step())
        if previous is not None and abs(value - previous) < 1e-6:
            break
        previous = value
    return built


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="subsampled smoke check")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default results/)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    common.configure_torch(args.threads)
    quick = args.quick
    data = load_keel("satimage", seed=0, max_train=800 if quick else None)
    x, y, x_test, y_test = data.x_train, data.y_train, data.x_test, data.y_test
    K = data.num_classes
    Z = common.kmeans_inducing_points(x, 30 if quick else 100, seed=0)
    iterations, checkpoint = (60, 20) if quick else (mc.HYPER_ITERATIONS, mc.HYPER_CHECKPOINT)
    rows = {}
    for key, spec in SPECS.items():
        hypers = mc.choose_hyperparameters(
            spec, x, y, Z, K, subset=min(2000, x.shape[0]), iterations=iterations, checkpoint=checkpoint
        )
        built = fit_q_u(spec, x, y, Z, K, hypers, max_steps=100 if quick else 1000)
        final = mc.final_metrics(built, x_test, y_test)
        rows[key] = {"name": spec.name, "hyperparameters": hypers,
                     "final": {k: v for k, v in final.items() if k != "reliability"}}
        print(f"{spec.name}: subset ELBO trace {[round(v, 3) for _, v in hypers['subset_elbo_trace']]}, "
              f"test accuracy {final['accuracy']:.4f}, NLL {final['test_nll']:.4f}", flush=True)
    result = {"quick": quick, "machine": common.machine_info(), "rows": rows,
              "wall_time_total": time.perf_counter() - start}
    _report.write_report(common.output_dir(args.out, quick), "hyper_objective", result, *report(result), echo=False)
    return result


def report(result: dict[str, Any]) -> tuple[str, dict[str, Any], list[_report.Table]]:
    """Title, settings and tables of a result record (what :func:`_report.write_report` renders)."""
    rows = list(result["rows"].values())
    trace0 = rows[0]["hyperparameters"]["subset_elbo_trace"]
    columns = ["hyper-parameter loop", *(f"it. {int(i)}" for i, _ in trace0), "fit [s]", "test acc.", "test NLL",
               "mean constants"]  # fmt: skip
    table = []
    for r in rows:
        h = r["hyperparameters"]
        table.append([r["name"], *(v for _, v in h["subset_elbo_trace"]), h["fit_seconds"], r["final"]["accuracy"],
                      r["final"]["test_nll"], f"{min(h['mean_constant']):+.2f} … {max(h['mean_constant']):+.2f}"])
    title = "Stability of the true-ELBO M-step" + (" (quick smoke run)" if result["quick"] else "")
    settings = {
        "command": f"python benchmarks/studies/hyper_objective.py{' --quick' if result['quick'] else ''}",
        "problem": "KEEL satimage, logistic-softmax with θ = 1",
        "hyper-parameters": "the procedure of multiclass.py (seeded 2,000-point subset, fixed k-means Z, "
        "median-heuristic initialisation, Adam lr 0.05), then q(u) by CAVI on all training data",
        "columns 'it. n'": "the subset's true ELBO per datum after n iterations",
        "whole script (s)": result["wall_time_total"],
        **_report.machine_settings(result["machine"]),
    }
    return title, settings, [_report.Table("True ELBO per datum along the hyper-parameter loop", columns, table)]


if __name__ == "__main__":
    main()
