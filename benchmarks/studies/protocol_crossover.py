r"""Where the one-call fit's nested protocol stops being faster than its stochastic protocol: both protocols of
``CAVI.fit(x, y, learn_hyperparameters=True)`` (``hyper_options={"protocol": ...}``, every other option at its
default) on the synthetic binary data of ``scale.py`` at growing ``N``, the same start (M fixed k-means inducing
inputs, lengthscales 1, outputscale 1), one thread, interleaved per size.

The table gives, per ``N`` and protocol, the wall time of the whole call (each under its own stopping rule) and the
test NLL on 10,000 held-out points; the crossover is the smallest ``N`` at which the stochastic protocol stops first
with a test NLL within 0.005 of the nested one's. The default threshold
:data:`~gpytorch_augment.inference.hyperparameters.NESTED_MAX_DATA` is set from it.

Run ``python benchmarks/studies/protocol_crossover.py [--sizes 2000 8000 32000] [--quick]``; results go to
``results/protocol_crossover.{json,md}``.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: the shared modules

import _common as common  # noqa: E402
import _report  # noqa: E402
import gpytorch  # noqa: E402
import hyperparameters as hb  # noqa: E402
import torch  # noqa: E402
from scale import synthetic_data  # noqa: E402

from gpytorch_augment import CAVI, BernoulliLogitLikelihood, CAVIVariationalStrategy  # noqa: E402

SIZES = [2_000, 8_000, 32_000]  #: training sizes, declared before any run
NUM_INDUCING = 100
NUM_TEST = 10_000
PROTOCOLS = ("nested", "stochastic")


def run(protocol: str, x: torch.Tensor, y: torch.Tensor, data: dict[str, Any], Z: torch.Tensor) -> dict[str, Any]:
    model = hb.Model(Z, 1, gpytorch.variational.CholeskyVariationalDistribution, CAVIVariationalStrategy,
                     unit_start=True).double()  # fmt: skip
    likelihood = BernoulliLogitLikelihood()
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = CAVI(model, likelihood, num_data=y.shape[-1]).fit(
            x, y, learn_hyperparameters=True, hyper_options={"protocol": protocol},
            generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
    wall = time.perf_counter() - start
    metrics = common.binary_evaluator(model, likelihood, data["xt"], data["yt"])()
    return {"time": wall, **metrics, "converged": trace.converged, "steps": trace.num_steps,
            "warnings": [str(w.message)[:160] for w in caught]}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    sizes = [500, 1000] if args.quick else args.sizes
    machine = common.start_run(threads=1, seed=0)
    x_all, y_all = synthetic_data(max(sizes) + NUM_TEST, seed=0)
    x_all, y_all = x_all.double(), y_all.double()
    data = {"xt": x_all[-NUM_TEST:], "yt": y_all[-NUM_TEST:]}
    rows = []
    for n in sizes:
        x, y = x_all[:n], y_all[:n]
        Z = common.kmeans_inducing_points(x, NUM_INDUCING, seed=0)
        order = PROTOCOLS if len(rows) % 2 == 0 else PROTOCOLS[::-1]  # alternate which protocol runs first
        for protocol in order:
            result = run(protocol, x, y, data, Z)
            rows.append({"num_train": n, "protocol": protocol, **result})
            print(f"N = {n:6d} {protocol:10s} {result['time']:8.2f}s nll {result['test_nll']:.4f}", flush=True)
    machine = common.close_machine_info(machine)
    table = _report.Table(
        "Each protocol under its own stopping rule",
        ["N", "protocol", "time (s)", "test NLL", "test error", "converged", "iterations / steps"],
        [[r["num_train"], r["protocol"], r["time"], r["test_nll"], r["test_error"], r["converged"], r["steps"]]
         for r in rows],
    )  # fmt: skip
    settings = {"command": "python benchmarks/studies/protocol_crossover.py" + (" --quick" if args.quick else ""),
                "data": f"scale.py's synthetic binary problem, {NUM_TEST} held-out points",
                "model": f"M = {NUM_INDUCING} fixed k-means inducing inputs, lengthscales 1, outputscale 1",
                **_report.machine_settings(machine)}  # fmt: skip
    record = {"machine": machine, "sizes": sizes, "rows": rows}
    _report.write_report(common.output_dir(args.out, args.quick), "protocol_crossover", record,
                         "The one-call fit: nested against stochastic protocol", settings, [table])  # fmt: skip
    return record


if __name__ == "__main__":
    main()
