r"""The nested protocol's settings on every likelihood: ``inner_steps`` :math:`k` x ``true_steps`` :math:`j`.

The one-call fit ``CAVI(model, likelihood, num_data=N).fit(x, y, learn_hyperparameters=True)`` runs, below
``NESTED_MAX_DATA`` points, L-BFGS on the hyper-parameters of :math:`J(\theta)`, the true ``VariationalELBO`` at the
:math:`q(u)` reached by :math:`k` CAVI steps from a snapshot and :math:`j` natural-gradient steps on the true ELBO
(``gpytorch_augment/inference/nested.py``). Its defaults :math:`k = 3`, :math:`j = 3` were chosen on pilots of four
likelihoods; this script measures the grid :data:`GRID` on one problem per exported likelihood class
(:data:`PROBLEMS`; :data:`SKIPPED` says which classes have none and why).

Per problem and split (seeds :data:`SEEDS`, not used by any tuning): one data split, ``M`` k-means inducing inputs
(fixed, shared), and the same start for every setting (ARD lengthscales 1 on standardised inputs, outputscale 1,
mean 0, likelihood constants at their defaults, :math:`q(u)` at its initial value). Each setting is a fresh model
fitted by the one call with ``hyper_options={"inner_steps": k, "true_steps": j}`` and every other default; the
settings of a split run one after the other in a rotating order, one thread. Measured per run: the wall (and CPU)
time of the call, the final true ELBO per datum (GPyTorch's ``VariationalELBO`` on the training data, the
registered priors included), the held-out test NLL (``-likelihood.log_marginal(y*, q(f*)).mean()``: each class's
own predictive log-density, closed form or quadrature), whether the run stopped on its cap (``trace.converged``),
its L-BFGS iterations and the warnings it raised.

Run ``python benchmarks/studies/nested_settings.py`` (full grid, ``results/nested_settings.{json,md}``) or ``--quick``
(seconds; two settings, one split, tiny problems, to ``$TMPDIR/gpytorch_augment_benchmarks/``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: the shared modules

import _common as common  # noqa: E402
import _report  # noqa: E402
import gpytorch  # noqa: E402
import hyperparameters as hp  # noqa: E402
import regression as rg  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from gpytorch_augment import (  # noqa: E402
    CAVI,
    BayesianSVMLikelihood,
    BernoulliLogitLikelihood,
    BinomialLogitLikelihood,
    CAVIVariationalStrategy,
    HeteroscedasticGaussianLikelihood,
    HeteroscedasticStudentTLikelihood,
    LaplaceLikelihood,
    LogisticSoftmaxLikelihood,
    MaternThreeHalvesLikelihood,
    NegativeBinomialLogitLikelihood,
    OrdinalLogitLikelihood,
    PoissonLogitLikelihood,
    StudentTLikelihood,
)
from gpytorch_augment.datasets import load_keel, load_rdataset  # noqa: E402
from gpytorch_augment.inference.fit_options import FitOptions  # noqa: E402

NESTED_MAX_ITER, NESTED_TOL = FitOptions().resolved("nested").max_iter, FitOptions().resolved("nested").tol

# ---------------------------------------------------------------------------------------------------- declared
#: the grid, declared before any run: inner_steps k (CAVI steps per evaluation) x true_steps j (natural-gradient
#: steps on the true ELBO after them)
GRID = {"inner_steps": [1, 3, 10], "true_steps": [0, 1, 3]}
#: the package's defaults (fit_hyperparameters)
DEFAULT = (3, 3)
#: the seeded splits: none of them was used to choose anything (hyperparameters.py and the pilots used 0-4)
SEEDS = (100, 101, 102)
NUM_INDUCING = 32  #: k-means inducing inputs, fixed (fewer where the training set is smaller)
NUM_TEST_SYNTHETIC = 1000  #: held-out points of the synthetic problems
#: one problem per likelihood class: data source, training-set cap, and the likelihood at its default constants
PROBLEMS: dict[str, dict[str, Any]] = {
    "BernoulliLogit / heart": {"data": "heart", "max_train": None},
    "BayesianSVM / pima": {"data": "pima", "max_train": 400},
    "BinomialLogit / synthetic": {"data": "synthetic_binomial", "max_train": 400},
    "PoissonLogit / quakes": {"data": "quakes", "max_train": 400},
    "NegativeBinomialLogit / quakes": {"data": "quakes", "max_train": 400},
    "StudentT / Boston": {"data": "boston", "max_train": 300},
    "Laplace / Boston": {"data": "boston", "max_train": 300},
    "MaternThreeHalves / Boston": {"data": "boston", "max_train": 300},
    "HeteroscedasticGaussian / mcycle": {"data": "mcycle", "max_train": None},
    "HeteroscedasticStudentT / mcycle": {"data": "mcycle", "max_train": None},
    "LogisticSoftmax / satimage": {"data": "satimage", "max_train": 300},
    "OrdinalLogit / synthetic": {"data": "synthetic_ordinal", "max_train": 400},
}
#: exported likelihood classes without a problem here
SKIPPED = {
    "PairwiseLogitLikelihood": "its data are comparisons (linear observations f_a - f_b), not one target per point; "
    "benchmarks/preference.py measures it",
    "LaplaceTransformLikelihood": "the generic class has no ready instance of its own; its two named instances "
    "(MaternThreeHalvesLikelihood, BayesianSVMLikelihood) are measured",
    "AugmentedLikelihood": "the abstract base class",
}
#: the synthetic problems: a GP draw (RBF, lengthscale, outputscale) on U[-1, 1]^2 inputs through the likelihood
SYNTHETIC = {"lengthscale": 0.5, "outputscale": {"synthetic_binomial": 2.0, "synthetic_ordinal": 4.0},
             "binomial_trials": (1, 10), "ordinal_cutpoints": (-2.0, -0.7, 0.7, 2.0)}  # fmt: skip


def make_likelihood(problem: str, num_classes: int) -> Any:
    """The problem's likelihood at its default constants (float64)."""
    cls = problem.split(" /")[0]
    if cls == "LogisticSoftmax":
        return LogisticSoftmaxLikelihood(num_classes=num_classes).double()
    if cls == "OrdinalLogit":
        return OrdinalLogitLikelihood(num_classes=num_classes).double()
    return {
        "BernoulliLogit": BernoulliLogitLikelihood, "BayesianSVM": BayesianSVMLikelihood,
        "BinomialLogit": BinomialLogitLikelihood, "PoissonLogit": PoissonLogitLikelihood,
        "NegativeBinomialLogit": NegativeBinomialLogitLikelihood, "StudentT": StudentTLikelihood,
        "Laplace": LaplaceLikelihood, "MaternThreeHalves": MaternThreeHalvesLikelihood,
        "HeteroscedasticGaussian": HeteroscedasticGaussianLikelihood,
        "HeteroscedasticStudentT": HeteroscedasticStudentTLikelihood,
    }[cls]().double()  # fmt: skip


# ---------------------------------------------------------------------------------------------------- data
def _t(a: Any) -> Tensor:
    return torch.as_tensor(np.ascontiguousarray(a), dtype=torch.float64)


def synthetic(kind: str, n_train: int, n_test: int, seed: int) -> dict[str, Any]:
    """A GP draw through the likelihood's own sampling: binomial (trials uniform in 1..10) or ordinal (K = 5)."""
    generator = torch.Generator().manual_seed(seed)
    n = n_train + n_test
    x = torch.rand(n, 2, generator=generator, dtype=torch.float64) * 2 - 1
    d2 = (x.unsqueeze(-2) - x.unsqueeze(-3)).pow(2).sum(-1)
    K = SYNTHETIC["outputscale"][kind] * torch.exp(-0.5 * d2 / SYNTHETIC["lengthscale"] ** 2)
    L = torch.linalg.cholesky(K + 1e-6 * torch.eye(n, dtype=torch.float64))
    f = L @ torch.randn(n, generator=generator, dtype=torch.float64)
    kw: dict[str, Tensor] = {}
    if kind == "synthetic_binomial":
        lo, hi = SYNTHETIC["binomial_trials"]
        trials = torch.randint(lo, hi + 1, (n,), generator=generator).double()
        dist = BinomialLogitLikelihood().double().forward(f, trials=trials)
        y = torch.binomial(dist.total_count, dist.probs, generator=generator)
        kw = {"trials": trials}
        num_classes = 1
    else:
        cut = SYNTHETIC["ordinal_cutpoints"]
        probs = OrdinalLogitLikelihood(len(cut) + 1, cutpoints=cut).double().forward(f).probs
        y = torch.multinomial(probs, 1, generator=generator).squeeze(-1).double()
        num_classes = len(cut) + 1
    mu, sd = x[:n_train].mean(0), x[:n_train].std(0)
    x = (x - mu) / sd
    out = {"x": x[:n_train], "y": y[:n_train], "xt": x[n_train:], "yt": y[n_train:], "K": num_classes,
           "kw": {k: v[:n_train] for k, v in kw.items()}, "kwt": {k: v[n_train:] for k, v in kw.items()}}  # fmt: skip
    return out


def load(problem: str, seed: int, max_train: int | None, max_test: int | None = None) -> dict[str, Any]:
    """Split ``seed`` of the problem's data: training inputs standardised with training statistics (and real
    targets too), training set capped at ``max_train`` points (the first of the seeded permutation)."""
    source = PROBLEMS[problem]["data"]
    if source.startswith("synthetic"):
        return synthetic(source, max_train or 400, max_test or NUM_TEST_SYNTHETIC, seed)
    if source == "boston":
        d = rg.load_boston(seed=seed, max_train=max_train)
        data = {"x": d.x_train, "y": d.y_train, "xt": d.x_test, "yt": d.y_test, "K": 1}
    elif source == "mcycle":
        frame = load_rdataset("MASS", "mcycle")
        x, y = frame[["times"]].to_numpy(float), frame["accel"].to_numpy(float)
        data = {**common.standardised_split(x, y, seed, True), "K": 1}
    elif source == "quakes":
        frame = load_rdataset("datasets", "quakes")
        x = frame[["lat", "long", "depth", "mag"]].to_numpy(float)
        data = {**common.standardised_split(x, frame["stations"].to_numpy(float), seed, False), "K": 1}
    else:
        d = load_keel(source, seed=seed, max_train=max_train)
        data = {"x": d.x_train, "y": d.y_train, "xt": d.x_test, "yt": d.y_test, "K": d.num_classes}
    if max_train is not None and data["y"].shape[-1] > max_train:
        data["x"], data["y"] = data["x"][:max_train], data["y"][:max_train]
    if max_test is not None:
        data["xt"], data["yt"] = data["xt"][:max_test], data["yt"][:max_test]
    data["kw"], data["kwt"] = {}, {}
    return data


# ---------------------------------------------------------------------------------------------------- one run
def true_elbo(model: Any, lik: Any, x: Tensor, y: Tensor, kw: dict[str, Tensor]) -> float:
    """GPyTorch's ``VariationalELBO`` per datum on the training data (the registered priors included)."""
    with torch.no_grad():
        return float(gpytorch.mlls.VariationalELBO(lik, model, num_data=y.shape[-1])(model(x), y, **kw))


def test_nll(model: Any, lik: Any, xt: Tensor, yt: Tensor, kwt: dict[str, Tensor]) -> float:
    """``-mean log p(y* | data)`` under the likelihood's own predictive (``log_marginal``), in eval mode."""
    model.eval()
    lik.eval()
    try:
        with torch.no_grad():
            return float(-lik.log_marginal(yt, model(xt), **kwt).mean())
    finally:
        model.train()
        lik.train()


def run_setting(problem: str, data: dict[str, Any], Z: Tensor, k: int, j: int, max_iter: int | None) -> dict[str, Any]:
    """One fit of a fresh model at ``(k, j)`` from the common start; its time, true ELBO, test NLL and end."""
    lik = make_likelihood(problem, data["K"])
    model = hp.Model(Z, lik.num_latents, gpytorch.variational.CholeskyVariationalDistribution,
                     CAVIVariationalStrategy, unit_start=True).double()  # fmt: skip
    x, y, n = data["x"], data["y"], data["y"].shape[-1]
    start, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trace = CAVI(model, lik, num_data=n).fit(
                x, y, learn_hyperparameters=True, max_iter=max_iter,
                hyper_options={"inner_steps": k, "true_steps": j}, **data["kw"],
            )  # fmt: skip
        except Exception as error:  # noqa: BLE001 - a failure is a result, reported
            failed = f"{type(error).__name__}: {error}"[:300]
            return {"k": k, "j": j, "time": time.perf_counter() - start, "failed": failed,
                    "warnings": [str(w.message)[:200] for w in caught]}  # fmt: skip
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    values = trace.elbo
    by_rule = len(values) >= 2 and abs(values[-1] - values[-2]) <= NESTED_TOL * max(1.0, abs(values[-1]))
    capped = not trace.converged and trace.num_steps >= (max_iter or NESTED_MAX_ITER)
    ended = "cap" if capped else ("rule" if by_rule else "stall") + ("" if trace.converged else ", uncertified")
    elbo = true_elbo(model, lik, x, y, data["kw"])
    nll = test_nll(model, lik, data["xt"], data["yt"], data["kwt"])
    return {"k": k, "j": j, "time": wall, "cpu_time": cpu, "true_elbo": elbo, "test_nll": nll,
            "converged": bool(trace.converged), "ended": ended, "iterations": trace.num_steps,
            "objective_last": trace.elbo[-1] if trace.elbo else None,
            "finite": math.isfinite(elbo) and math.isfinite(nll),
            "warnings": [f"{type(w.message).__name__}: {str(w.message)[:200]}" for w in caught]}  # fmt: skip


def warm_up(problem: str, seed: int) -> None:
    """An untimed fit of two iterations on 30 points: the lazy imports (L-BFGS loads ``torch._dynamo``, ~2.6 s) and
    first-call costs are not charged to the first timed setting."""
    data = load(problem, seed, 30, max_test=10)
    Z = common.kmeans_inducing_points(data["x"], 4, seed=seed)
    for k, j in ((1, 0), (1, 1)):
        run_setting(problem, data, Z, k, j, 2)


def settings_of(quick: bool) -> list[tuple[int, int]]:
    if quick:
        return [(1, 0), DEFAULT]
    return [(k, j) for k in GRID["inner_steps"] for j in GRID["true_steps"]]


def run_problem(problem: str, seeds: list[int], quick: bool, max_train: int | None) -> dict[str, Any]:
    p = PROBLEMS[problem]
    cap = 60 if quick else (max_train if max_train is not None else p["max_train"])
    settings = settings_of(quick)
    runs: list[dict[str, Any]] = []
    n = None
    warm_up(problem, seeds[0])
    for s, seed in enumerate(seeds):
        data = load(problem, seed, cap, max_test=100 if quick else None)
        n = data["y"].shape[-1]
        m = min(8 if quick else NUM_INDUCING, n)
        Z = common.kmeans_inducing_points(data["x"], m, seed=seed)
        order = settings[s % len(settings) :] + settings[: s % len(settings)]  # no setting always runs first
        print(f"== {problem} split {seed}: N = {n}, D = {data['x'].shape[-1]}, test {data['yt'].shape[-1]}, "
              f"M = {m}", flush=True)  # fmt: skip
        for k, j in order:
            torch.manual_seed(seed)
            r = {"seed": seed, **run_setting(problem, data, Z, k, j, 10 if quick else None)}
            runs.append(r)
            if "failed" in r:
                print(f"   k={k:2d} j={j}  FAILED after {r['time']:.1f}s: {r['failed'][:120]}", flush=True)
                continue
            note = "" if r["converged"] else "  (cap)"
            note += f"  [{len(r['warnings'])} warning(s): {r['warnings'][0][:80]}]" if r["warnings"] else ""
            print(f"   k={k:2d} j={j}  {r['time']:6.2f}s  it {r['iterations']:3d}  elbo {r['true_elbo']:+.4f}  "
                  f"nll {r['test_nll']:.4f}{note}", flush=True)  # fmt: skip
    return summarise(problem, runs, n, settings)


# ---------------------------------------------------------------------------------------------------- summary
def _mean_sd(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(problem: str, runs: list[dict[str, Any]], n: int | None, settings: list[tuple[int, int]]) -> dict:
    rows: dict[str, dict[str, Any]] = {}
    for k, j in settings:
        of = [r for r in runs if (r["k"], r["j"]) == (k, j)]
        ok = [r for r in of if "failed" not in r and r["finite"]]
        row: dict[str, Any] = {"k": k, "j": j, "splits": len(of), "failed": len(of) - len(ok),
                               "capped": sum(not r["converged"] for r in ok),
                               "stalled": sum(r["ended"].startswith("stall") for r in ok)
                               if all("ended" in r for r in ok) else None,
                               "warned": sum(bool(r.get("warnings")) for r in of)}  # fmt: skip
        for key in ("time", "cpu_time", "true_elbo", "test_nll", "iterations"):
            row[key + "_mean"], row[key + "_sd"] = _mean_sd([float(r[key]) for r in ok])
        rows[f"{k},{j}"] = row
    usable = {key: row for key, row in rows.items() if row["failed"] == 0}
    best = min(usable, key=lambda key: usable[key]["test_nll_mean"]) if usable else None
    best_elbo = max(usable, key=lambda key: usable[key]["true_elbo_mean"]) if usable else None
    default = f"{DEFAULT[0]},{DEFAULT[1]}"
    out: dict[str, Any] = {"problem": problem, "num_train": n, "rows": rows, "runs": runs, "best_nll": best,
                           "best_elbo": best_elbo}  # fmt: skip
    if best is not None and default in usable:
        d, b = rows[default], rows[best]
        paired = [_paired(runs, DEFAULT, (b["k"], b["j"]), seed, "test_nll") for seed in _seeds(runs)]
        paired = [v for v in paired if v is not None]
        within = [key for key, row in usable.items() if row["test_nll_mean"] <= b["test_nll_mean"] + 0.01]
        fastest = min(within, key=lambda key: usable[key]["time_mean"])
        out.update({
            "default_nll_gap": d["test_nll_mean"] - b["test_nll_mean"],
            "default_nll_gap_paired_sd": _mean_sd(paired)[1],
            "default_time_ratio": d["time_mean"] / b["time_mean"],
            "default_elbo_gap": rows[best_elbo]["true_elbo_mean"] - d["true_elbo_mean"],
            "fastest_within_0.01": fastest,
            "default_time_over_fastest": d["time_mean"] / usable[fastest]["time_mean"],
        })  # fmt: skip
    return out


def _seeds(runs: list[dict[str, Any]]) -> list[int]:
    return sorted({r["seed"] for r in runs})


def _paired(runs: list[dict[str, Any]], a: tuple[int, int], b: tuple[int, int], seed: int, key: str) -> float | None:
    ra = [r for r in runs if (r["k"], r["j"]) == a and r["seed"] == seed and "failed" not in r]
    rb = [r for r in runs if (r["k"], r["j"]) == b and r["seed"] == seed and "failed" not in r]
    return ra[0][key] - rb[0][key] if ra and rb else None


def _setting(key: str | None) -> str | None:
    return None if key is None else "(" + key.replace(",", ", ") + ")"


def report_tables(results: list[dict[str, Any]]) -> list[_report.Table]:
    """The summary table, then one table per problem (every setting: mean ± sd over the splits)."""
    summary = _report.Table(
        "Summary: the best (k, j) by mean test NLL per likelihood, and the default (3, 3) against it",
        ["problem", "N", "best (k, j) by test NLL", "its test NLL", "default (3, 3) test NLL",
         "default − best NLL (paired sd)", "default time / best's", "fastest within 0.01 nats of best",
         "default time / fastest's", "best (k, j) by true ELBO", "its ELBO − default's", "runs capped / failed"],
        [[r["problem"], r["num_train"], _setting(r["best_nll"]),
          _fmt(r["rows"][r["best_nll"]]["test_nll_mean"]) if r["best_nll"] else None,
          _fmt(r["rows"].get(f"{DEFAULT[0]},{DEFAULT[1]}", {}).get("test_nll_mean")),
          f"{r['default_nll_gap']:+.4f} ({r['default_nll_gap_paired_sd']:.4f})" if "default_nll_gap" in r else None,
          f"{r['default_time_ratio']:.2f}" if "default_time_ratio" in r else None,
          _setting(r.get("fastest_within_0.01")),
          f"{r['default_time_over_fastest']:.2f}" if "default_time_over_fastest" in r else None,
          _setting(r["best_elbo"]), f"{r['default_elbo_gap']:+.4f}" if "default_elbo_gap" in r else None,
          f"{sum(v['capped'] for v in r['rows'].values())} / {sum(v['failed'] for v in r['rows'].values())}"]
         for r in results],
    )  # fmt: skip
    tables = [summary]
    for r in results:
        tables.append(_report.Table(
            f"{r['problem']} (N = {r['num_train']})",
            ["(k, j)", "splits", "time (s)", "CPU time (s)", "L-BFGS iterations", "true ELBO / datum", "test NLL",
             "capped", "stalled", "failed", "warned"],
            [[_setting(key), v["splits"], _pm(v, "time", ".2f"), _pm(v, "cpu_time", ".2f"),
              _pm(v, "iterations", ".0f"), _pm(v, "true_elbo", ".4f"), _pm(v, "test_nll", ".4f"), v["capped"],
              v.get("stalled"), v["failed"], v["warned"]] for key, v in r["rows"].items()],
        ))  # fmt: skip
    return tables


def _fmt(value: float | None) -> str | None:
    return None if value is None or math.isnan(value) else f"{value:.4f}"


def _pm(row: dict[str, Any], key: str, spec: str) -> str | None:
    mean, sd = row[key + "_mean"], row[key + "_sd"]
    return None if math.isnan(mean) else f"{format(mean, spec)} ± {format(sd, spec)}"


def write_results(out: Path, record: dict[str, Any], name: str) -> None:
    settings = {
        "command": "python benchmarks/studies/nested_settings.py " + " ".join(record["arguments"]),
        "grid (declared before any run)": f"inner_steps k ∈ {GRID['inner_steps']} × true_steps j ∈ "
        f"{GRID['true_steps']}; default {DEFAULT}",
        "splits (seeds)": ", ".join(str(s) for s in record["seeds"]),
        "fit": "CAVI(model, likelihood, num_data=N).fit(x, y, learn_hyperparameters=True, "
        "hyper_options={'inner_steps': k, 'true_steps': j}); every other default (nested protocol, L-BFGS, "
        "tol 1e-6 on J, cap 500 iterations)",
        "start (every setting)": "ARD lengthscales 1 (standardised inputs), outputscale 1, mean 0, likelihood "
        "constants at their defaults, the same fixed k-means inducing inputs",
        "inducing inputs": f"M = {NUM_INDUCING} k-means centroids (scikit-learn, seeded by the split) of the "
        "training inputs, fixed",
        "true ELBO": "GPyTorch VariationalELBO per datum on the training data, after the fit",
        "test NLL": "-mean likelihood.log_marginal(y*, q(f*)) on the held-out points",
        "synthetic data": str(SYNTHETIC),
        "skipped classes": "; ".join(f"{k}: {v}" for k, v in SKIPPED.items()),
        "execution": "one thread; per split the settings one after the other, in a rotating order, after an "
        "untimed warm-up fit; " + (f"{len(record['runs_merged'])} processes side by side" if "runs_merged" in record
                                   else "one process"),
        ("wall time of the longest part (s)" if "runs_merged" in record else "total wall time (s)"): round(
            record["total_wall_time"], 1
        ),
        **_report.machine_settings(record["machine"]),
    }  # fmt: skip
    _report.write_report(out, name, record, "The nested protocol's settings (k, j) on every likelihood",
                         settings, report_tables(record["results"]), echo=False)  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.run_arguments(parser, "tiny problems, settings (1, 0) and (3, 3), one split, 10 iterations", caps=False)
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS), metavar="PROBLEM")
    parser.add_argument("--splits", type=int, default=len(SEEDS), help=f"the first splits of {SEEDS}")
    parser.add_argument("--max-train", type=int, default=None, help="override every problem's training cap")
    parser.add_argument("--tag", default=None, help="write nested_settings_TAG.{json,md} (a part, for --merge)")
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="combine the JSON files of separate runs into nested_settings.{json,md}",
    )
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.merge, common.output_dir(args.output_dir, False))
    machine = common.start_run(threads=args.threads, seed=args.seed)
    out = common.output_dir(args.output_dir, args.quick)
    seeds = list(SEEDS[: 1 if args.quick else args.splits])
    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    for problem in args.problems:  # the record is rewritten after every problem: a crash keeps what was measured
        results.append(run_problem(problem, seeds, args.quick, args.max_train))
        record = {"machine": common.close_machine_info(dict(machine)), "arguments": list(argv or sys.argv[1:]),
                  "grid": GRID, "default": DEFAULT, "seeds": seeds, "problems": PROBLEMS, "skipped": SKIPPED,
                  "total_wall_time": time.perf_counter() - started, "results": results}  # fmt: skip
        write_results(out, record, "nested_settings" + (f"_{args.tag}" if args.tag else ""))
    return results


def merge(paths: list[Path], out: Path) -> list[dict[str, Any]]:
    """One report from parts run in separate processes (each with its own problems), in :data:`PROBLEMS` order."""
    import json

    records = [json.loads(Path(p).read_text()) for p in paths]
    by_problem = {r["problem"]: r for record in records for r in record["results"]}
    results = [by_problem[name] for name in PROBLEMS if name in by_problem]
    machine = dict(records[0]["machine"])
    machine["load_average_start"] = max((rec["machine"]["load_average_start"] for rec in records), key=lambda v: v[0])
    machine["load_average_end"] = max((rec["machine"]["load_average_end"] for rec in records), key=lambda v: v[0])
    record = {"machine": machine, "runs_merged": [Path(p).name for p in paths],
              "arguments": [a for rec in records for a in ["|", *rec["arguments"]]][1:], "grid": GRID,
              "default": DEFAULT, "seeds": records[0]["seeds"], "problems": PROBLEMS, "skipped": SKIPPED,
              "total_wall_time": max(rec["total_wall_time"] for rec in records), "results": results}  # fmt: skip
    write_results(out, record, "nested_settings")
    return results


if __name__ == "__main__":
    main()
