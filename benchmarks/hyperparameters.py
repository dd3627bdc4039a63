r"""The one-call fit against GPyTorch's and BoTorch's best protocols: the model each method stops at.

Every method learns the hyper-parameters and :math:`q(u)` from the same start (ARD lengthscales 1 on standardised
inputs, outputscale 1, mean 0, likelihood constants at their defaults, the same fixed k-means inducing inputs) and
runs until **its own standard stopping rule** says so:

* **ours** -- ``CAVI(model, likelihood, num_data).fit(x, y, learn_hyperparameters=True)`` with every default (the
  nested protocol up to 50,000 points): the whole call is timed;
* **SVGP+Adam** -- GPyTorch's ``VariationalELBO``, Adam on every parameter; **NGD+Adam** -- GPyTorch's ``NGD`` on a
  ``NaturalVariationalDistribution`` plus Adam on the hyper-parameters; both stopped by :class:`Plateau` on their
  training objective, over the grid :data:`GRID`;
* **BoTorch** -- one call of ``botorch.fit_gpytorch_mll`` with its defaults.

The peers use GPyTorch's own likelihood where it has one (``BernoulliLikelihood``, ``StudentTLikelihood``); where it
has none (heteroscedastic, counts) and for the logistic-softmax link they train **our** likelihood, a plain GPyTorch
likelihood, on the true ELBO; ``satimage`` also reports GPyTorch's ``SoftmaxLikelihood`` beside it.

Per problem: ``--splits`` seeded random train/test splits (default 5); per split all methods run one after the other
in a rotating order, one thread each. The report gives per method the median wall time to stop and the mean ± sd of
the test NLL and error (RMSE for regression); the best peer configuration (lowest mean test NLL) and the fastest peer
configuration whose mean test NLL is within 0.01 of ours; the two targets; and, secondary, the time-to-target curves
(test NLL against wall time, evaluation time excluded) in the JSON.

Run ``python benchmarks/hyperparameters.py [--problems heart pima ...] [--splits 5] [--quick]``; results go to
``results/hyperparameters.{json,md}``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import _report  # noqa: E402
import gpytorch  # noqa: E402
import regression as rg  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from gpytorch_augment import (  # noqa: E402
    CAVI,
    BernoulliLogitLikelihood,
    CAVIVariationalStrategy,
    HeteroscedasticGaussianLikelihood,
    LogisticSoftmaxLikelihood,
    PoissonLogitLikelihood,
    StudentTLikelihood,
)
from gpytorch_augment.datasets import load_keel, load_rdataset  # noqa: E402

#: the peers' grid, declared before any run ("full" = all the training data)
GRID = {
    "SVGP+Adam": {"lr": [0.01, 0.05], "batch_size": [256, "full"]},
    "NGD+Adam": {"ngd_lr": [0.1], "lr": [0.05], "batch_size": [256, "full"]},
    "BoTorch": {"call": ["fit_gpytorch_mll(mll) with its defaults"]},
}
#: per problem: kind, inducing points, training subsample, time cap per peer run (s)
PROBLEMS = {
    "heart": {"kind": "binary", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "pima": {"kind": "binary", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "boston": {"kind": "student_t", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "mcycle": {"kind": "heteroscedastic", "num_inducing": 20, "max_train": None, "cap": 30.0},
    "quakes": {"kind": "counts", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "magic5000": {"kind": "binary", "num_inducing": 100, "max_train": 5000, "cap": 120.0},
    "magic": {"kind": "binary", "num_inducing": 100, "max_train": None, "cap": 300.0},
    "satimage": {"kind": "multiclass", "num_inducing": 50, "max_train": 2000, "cap": 180.0},
}
DF = 4.0  #: Student-t degrees of freedom, fixed for every method
NLL_MARGIN = 0.005  #: target 1: our mean test NLL <= the best peer's + this
#: target 2: the fastest comparable peer's median time over ours, at <= 1,000 points and above
SPEED_TARGETS = {"small": 10.0, "large": 5.0}
COMPARABLE = 0.01  #: a peer counts for the speed target only if its mean test NLL is within this of ours
#: multi-class: the logistic-softmax link's variants, each also fitted by ours (the gap to softmax with and without)
LINK_VARIANTS = {
    "ours, class scales": {"learn_class_scales": True},
    "ours, bijective": {"bijective": True},
    "ours, bijective + class scales": {"bijective": True, "learn_class_scales": True},
}


class Plateau:
    """The peers' standard stopping rule on their training objective: the mean loss of the latest window of
    ``max(window, one epoch)`` steps improves on the previous window's by less than ``tol`` nats per datum, or the
    time cap is reached."""

    def __init__(self, steps_per_epoch: int, window: int = 50, tol: float = 1e-4, cap: float = 60.0) -> None:
        self.window, self.tol, self.cap = max(window, steps_per_epoch), tol, cap
        self.losses: list[float] = []

    def done(self, loss: float, elapsed: float) -> tuple[bool, bool]:
        """``(stop, converged)`` after a step with training loss ``loss``."""
        self.losses.append(loss)
        w, n = self.window, len(self.losses)
        if n >= 2 * w and n % w == 0:
            previous, latest = np.mean(self.losses[-2 * w : -w]), np.mean(self.losses[-w:])
            if previous - latest < self.tol:
                return True, True
        return elapsed > self.cap, False


# ---------------------------------------------------------------------------------------------------- problems
def _standardised_split(x: np.ndarray, y: np.ndarray, seed: int, standardise_y: bool) -> dict[str, Tensor]:
    perm = np.random.RandomState(seed).permutation(len(y))
    n_test = int(round(0.2 * len(y)))
    test, train = perm[:n_test], perm[n_test:]
    mu, sd = x[train].mean(0), x[train].std(0)
    sd = np.where(sd > 0, sd, 1.0)
    ym, ys = (y[train].mean(), y[train].std()) if standardise_y else (0.0, 1.0)

    def t(a: np.ndarray) -> Tensor:
        return torch.as_tensor(np.ascontiguousarray(a), dtype=torch.float64)

    return {"x": t((x[train] - mu) / sd), "y": t((y[train] - ym) / ys), "xt": t((x[test] - mu) / sd),
            "yt": t((y[test] - ym) / ys)}  # fmt: skip


def load(name: str, p: dict[str, Any], seed: int, quick: bool) -> dict[str, Any]:
    """Split ``seed`` of problem ``name`` (``quick``: at most 300 training points)."""
    max_train = 300 if quick else p["max_train"]
    if name == "boston":
        d = rg.load_boston(seed=seed, max_train=max_train)
        data = {"x": d.x_train, "y": d.y_train, "xt": d.x_test, "yt": d.y_test, "K": 1}
    elif name == "mcycle":
        frame = load_rdataset("MASS", "mcycle")
        data = {**_standardised_split(frame[["times"]].to_numpy(float), frame["accel"].to_numpy(float), seed, True),
                "K": 1}  # fmt: skip
    elif name == "quakes":
        frame = load_rdataset("datasets", "quakes")
        x = frame[["lat", "long", "depth", "mag"]].to_numpy(float)
        data = {**_standardised_split(x, frame["stations"].to_numpy(float), seed, False), "K": 1}
    else:
        d = load_keel(name.removesuffix("5000"), seed=seed, max_train=max_train)
        data = {"x": d.x_train, "y": d.y_train, "xt": d.x_test, "yt": d.y_test, "K": d.num_classes}
    if max_train is not None and data["y"].shape[-1] > max_train:
        data["x"], data["y"] = data["x"][:max_train], data["y"][:max_train]
    data["K"] = data["K"] if p["kind"] == "multiclass" else 1
    data["T"] = 2 if p["kind"] == "heteroscedastic" else data["K"]
    return data


class Model(gpytorch.models.ApproximateGP):
    """``T`` independent latents (``T = 1``: one) with constant mean and scaled ARD-RBF kernel at fixed ``Z``."""

    def __init__(self, Z: Tensor, T: int, distribution_cls: type, strategy_cls: type) -> None:
        batch = torch.Size([T]) if T > 1 else torch.Size()
        q_u = distribution_cls(Z.size(-2), batch_shape=batch)
        strategy = strategy_cls(self, Z, q_u, learn_inducing_locations=False)
        if T > 1:
            strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(strategy, num_tasks=T)
        super().__init__(strategy)
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
        kernel = gpytorch.kernels.RBFKernel(ard_num_dims=Z.size(-1), batch_shape=batch)
        self.covar_module = gpytorch.kernels.ScaleKernel(kernel, batch_shape=batch)
        self.covar_module.base_kernel.lengthscale = torch.ones_like(kernel.lengthscale)
        self.covar_module.outputscale = torch.ones_like(self.covar_module.outputscale)

    def forward(self, x: Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def likelihood_for(kind: str, family: str, K: int, **options: Any) -> Any:
    """Our likelihood (``family="ours"``, or a peer training it), or GPyTorch's where it has one; ``options`` go to
    the logistic-softmax likelihood."""
    gpytorch_own = family in ("SVGP+Adam", "NGD+Adam", "BoTorch")
    if kind == "binary":
        return gpytorch.likelihoods.BernoulliLikelihood() if gpytorch_own else BernoulliLogitLikelihood()
    if kind == "student_t":
        if not gpytorch_own:
            return StudentTLikelihood(df=DF, scale=1.0).double()
        lik = gpytorch.likelihoods.StudentTLikelihood()
        lik.deg_free, lik.noise = DF, 1.0
        lik.raw_deg_free.requires_grad_(False)
        return lik.double()
    if kind == "heteroscedastic":
        return HeteroscedasticGaussianLikelihood().double()
    if kind == "counts":
        return PoissonLogitLikelihood().double()
    if family.endswith("softmax"):
        return gpytorch.likelihoods.SoftmaxLikelihood(num_features=K, num_classes=K, mixing_weights=False).double()
    return LogisticSoftmaxLikelihood(num_classes=K, **options).double()


def evaluator(kind: str, model: Model, lik: Any, data: dict[str, Any]) -> Callable[[], dict[str, float]]:
    """Test NLL and error (RMSE for regression) of the method's own predictive, the same code for every method."""
    xt, yt, K = data["xt"], data["yt"], data["K"]
    if kind == "binary":
        return common.binary_evaluator(model, lik, xt, yt)
    if kind == "student_t":
        evaluate = rg.make_evaluator(model, lik, xt, yt, DF)
        return lambda: {k: v for k, v in evaluate().items() if k != "scale"}
    if kind in ("heteroscedastic", "counts"):

        def evaluate() -> dict[str, float]:
            model.eval()
            with torch.no_grad():
                q = model(xt)
                nll = -lik.log_marginal(yt, q).mean()
                mean = lik.marginal(q).mean
            model.train()
            return {"test_nll": float(nll), "test_rmse": float((mean - yt).pow(2).mean().sqrt())}

        return evaluate
    eps = torch.randn(256, xt.shape[0], K, generator=torch.Generator().manual_seed(1), dtype=xt.dtype)

    def evaluate_multiclass() -> dict[str, float]:  # the same fixed draws of q(f*) through each method's own link
        model.eval()
        with torch.no_grad():
            q = model(xt)
            T = q.mean.shape[-1]  # K latents, or K - 1 for the bijective link (the same first K - 1 draws)
            probs = lik.forward(q.mean + q.variance.sqrt() * eps[..., :T]).probs.mean(0)
        model.train()
        p = probs.gather(-1, yt.long().unsqueeze(-1)).squeeze(-1).clamp_min(1e-12)
        error = (probs.argmax(-1) != yt.long()).double().mean()
        return {"test_nll": float(-p.log().mean()), "test_error": float(error)}

    return evaluate_multiclass


# ---------------------------------------------------------------------------------------------------- methods
class Curve:
    """Test metrics against training wall time, the evaluations' own time excluded, at doubling step counts."""

    def __init__(self, evaluate: Callable[[], dict[str, float]]) -> None:
        self.evaluate, self.points, self.excluded, self.next = evaluate, [], 0.0, 1

    def maybe(self, step: int, start: float) -> None:
        if step >= self.next:
            self.next *= 2
            self.record(start)

    def record(self, start: float) -> None:
        t0 = time.perf_counter()
        metrics = self.evaluate()
        self.points.append({"time": t0 - start - self.excluded, **metrics})
        self.excluded += time.perf_counter() - t0


def run_ours(p: dict[str, Any], data: dict[str, Any], Z: Tensor, **options: Any) -> dict[str, Any]:
    lik = likelihood_for(p["kind"], "ours", data["K"], **options)
    T = lik.num_latents if p["kind"] == "multiclass" else data["T"]
    model = Model(Z, T, gpytorch.variational.CholeskyVariationalDistribution, CAVIVariationalStrategy).double()
    curve = Curve(evaluator(p["kind"], model, lik, data))
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = CAVI(model, lik, num_data=data["y"].shape[-1]).fit(
            data["x"], data["y"], learn_hyperparameters=True, callback=lambda t, v: curve.maybe(t + 1, start)
        )
    wall = time.perf_counter() - start - curve.excluded
    final = curve.evaluate()
    return {"time": wall, **final, "converged": trace.converged, "iterations": trace.num_steps,
            "warnings": [str(w.message)[:200] for w in caught], "curve": curve.points}  # fmt: skip


def run_peer(p: dict[str, Any], data: dict[str, Any], Z: Tensor, family: str, **cfg: Any) -> dict[str, Any]:
    n, K = data["y"].shape[-1], data["K"]
    natural = family.startswith("NGD")
    dist = gpytorch.variational.NaturalVariationalDistribution if natural else (
        gpytorch.variational.CholeskyVariationalDistribution)  # fmt: skip
    model = Model(Z, data["T"], dist, gpytorch.variational.VariationalStrategy).double()
    lik = likelihood_for(p["kind"], family, K)
    mll = gpytorch.mlls.VariationalELBO(lik, model, num_data=n)
    x, y = data["x"], data["y"]
    curve = Curve(evaluator(p["kind"], model, lik, data))
    if family == "BoTorch":
        import botorch

        model.train_inputs, model.train_targets = (x,), y
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an ABNORMAL line-search exit of L-BFGS-B counts as a fit
            botorch.fit_gpytorch_mll(mll, optimizer_kwargs={"timeout_sec": p["cap"]}, warning_handler=lambda w: True)
        wall = time.perf_counter() - start
        model.train()
        return {"time": wall, **curve.evaluate(), "converged": True, "iterations": None, "curve": []}
    bs = n if cfg["batch_size"] == "full" else min(int(cfg["batch_size"]), n)
    hyper = [q for q in (*model.hyperparameters(), *lik.parameters()) if q.requires_grad]
    if natural:
        optimizers = [gpytorch.optim.NGD(model.variational_parameters(), num_data=n, lr=cfg["ngd_lr"]),
                      torch.optim.Adam(hyper, lr=cfg["lr"])]  # fmt: skip
    else:
        optimizers = [torch.optim.Adam([*model.variational_parameters(), *hyper], lr=cfg["lr"])]
    generator = torch.Generator().manual_seed(0)
    rule = Plateau(steps_per_epoch=-(-n // bs), cap=p["cap"])
    start, step, converged = time.perf_counter(), 0, False
    while True:
        perm = torch.randperm(n, generator=generator) if bs < n else None
        for s in range(0, n, bs):
            idx = slice(None) if perm is None else perm[s : s + bs]
            for opt in optimizers:
                opt.zero_grad()
            loss = -mll(model(x[idx]), y[..., idx])
            loss.backward()
            for opt in optimizers:
                opt.step()
            step += 1
            curve.maybe(step, start)
            stop, converged = rule.done(float(loss.detach()), time.perf_counter() - start - curve.excluded)
            if stop:
                wall = time.perf_counter() - start - curve.excluded
                return {"time": wall, **curve.evaluate(), "converged": converged, "iterations": step,
                        "curve": curve.points}  # fmt: skip


def methods(p: dict[str, Any], data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(label, config)`` of every method of the problem, ours first."""
    n = data["y"].shape[-1]
    out: list[tuple[str, dict[str, Any]]] = [("ours", {"family": "ours"})]
    families = ["SVGP+Adam", "NGD+Adam"] + (["SVGP+Adam softmax"] if p["kind"] == "multiclass" else [])
    for family in families:
        grid = GRID[family.split()[0]]
        for bs in [b for b in grid["batch_size"] if b == "full" or b < n]:
            for lr in grid["lr"]:
                extra = {"ngd_lr": grid["ngd_lr"][0]} if family.startswith("NGD") else {}
                out.append((f"{family} lr {lr}, batch {bs}", {"family": family, "lr": lr, "batch_size": bs, **extra}))
    if p["kind"] in ("binary", "student_t"):  # BoTorch fits GPyTorch's likelihoods
        out.append(("BoTorch fit_gpytorch_mll", {"family": "BoTorch"}))
    if p["kind"] == "multiclass":
        out += [(label, {"family": "ours", **options}) for label, options in LINK_VARIANTS.items()]
    return out


# ---------------------------------------------------------------------------------------------------- runs
def run_problem(
    name: str, splits: int, quick: bool, only: list[str] | None = None, first_seed: int = 0
) -> dict[str, Any]:
    p = dict(PROBLEMS[name])
    if quick:
        p["cap"] = 10.0
    runs: dict[str, list[dict[str, Any]]] = {}
    for seed in range(first_seed, first_seed + splits):
        data = load(name, p, seed, quick)
        Z = common.kmeans_inducing_points(data["x"], min(p["num_inducing"], data["y"].shape[-1]), seed=seed)
        specs = [m for m in methods(p, data) if only is None or m[0] == "ours" or m[0].startswith(tuple(only))]
        order = specs[seed % len(specs):] + specs[: seed % len(specs)]  # rotate: no method always runs first
        print(f"== {name} split {seed}: {tuple(data['x'].shape)} train, M = {Z.shape[0]}", flush=True)
        for label, cfg in order:
            torch.manual_seed(seed)
            family = cfg["family"]
            options = {k: v for k, v in cfg.items() if k != "family"}
            start = time.perf_counter()
            try:
                result = run_ours(p, data, Z, **options) if family == "ours" else run_peer(
                    p, data, Z, family, **options)  # fmt: skip
            except (RuntimeError, ValueError, FloatingPointError) as error:  # e.g. NGD's q(u) stops being PD
                result = {"time": time.perf_counter() - start, "test_nll": math.nan, "converged": False,
                          "failed": f"{type(error).__name__}: {str(error)[:200]}"}  # fmt: skip
            runs.setdefault(label, []).append({"seed": seed, **result})
            note = f"  (failed: {result['failed'][:60]})" if "failed" in result else (
                "" if result["converged"] else "  (not converged)")  # fmt: skip
            print(f"   {label:34s} {result['time']:7.2f}s  nll {result['test_nll']:.4f}{note}", flush=True)
    return summarise(name, p, runs, data["y"].shape[-1])


def summarise(name: str, p: dict[str, Any], runs: dict[str, list[dict[str, Any]]], n: int) -> dict[str, Any]:
    error_key = "test_error" if p["kind"] in ("binary", "multiclass") else "test_rmse"
    rows = {}
    for label, runs_of_method in runs.items():
        rs = [r for r in runs_of_method if "failed" not in r]  # a failed run has no model to compare
        nll = [r["test_nll"] for r in rs] or [math.inf]
        err = [r[error_key] for r in rs] or [math.nan]
        rows[label] = {
            "median_time": statistics.median(r["time"] for r in runs_of_method), "nll_mean": statistics.fmean(nll),
            "nll_sd": statistics.stdev(nll) if len(nll) > 1 else 0.0, "error_mean": statistics.fmean(err),
            "error_sd": statistics.stdev(err) if len(err) > 1 else 0.0,
            "capped": sum(not r["converged"] for r in rs), "failed": len(runs_of_method) - len(rs),
            "splits": len(runs_of_method),
        }  # fmt: skip
    ours = rows["ours"]
    # logistic-softmax: both targets against the same likelihood trained by SVGP + Adam; the softmax peer is shown
    peers = {k: v for k, v in rows.items() if not k.startswith("ours") and "softmax" not in k}
    if not peers:  # a run of our variants only
        return {"problem": name, "kind": p["kind"], "num_train": n, "rows": rows, "runs": runs}
    best = min(peers, key=lambda k: peers[k]["nll_mean"])
    comparable = {k: v for k, v in peers.items() if v["nll_mean"] <= ours["nll_mean"] + COMPARABLE}
    fastest = min(comparable, key=lambda k: comparable[k]["median_time"]) if comparable else None
    speed_target = SPEED_TARGETS["small" if n <= 1000 else "large"]
    speedup = comparable[fastest]["median_time"] / ours["median_time"] if fastest else None
    return {
        "problem": name, "kind": p["kind"], "num_train": n, "rows": rows, "best_peer": best,
        "nll_gap": ours["nll_mean"] - peers[best]["nll_mean"], "nll_target_met": ours["nll_mean"]
        <= peers[best]["nll_mean"] + NLL_MARGIN, "fastest_comparable_peer": fastest, "speedup": speedup,
        "speed_target": speed_target, "speed_target_met": speedup is not None and speedup >= speed_target,
        "runs": runs,
    }  # fmt: skip


def _speed_verdict(result: dict[str, Any]) -> str:
    if result["fastest_comparable_peer"] is None:
        return "no peer within 0.01 of ours"
    return "met" if result["speed_target_met"] else "missed"


def report_tables(results: list[dict[str, Any]]) -> list[_report.Table]:
    """The targets table, then one table per problem (every method's median time, test NLL and error)."""
    targets = _report.Table(
        "Targets",
        ["problem", "N", "ours: median time (s)", "ours: test NLL", "best peer", "its test NLL", "NLL gap",
         "NLL target (≤ +0.005)", "fastest peer within 0.01", "its median time (s)", "speed-up", "speed target"],
        [[r["problem"], r["num_train"], r["rows"]["ours"]["median_time"],
          f"{r['rows']['ours']['nll_mean']:.4f} ± {r['rows']['ours']['nll_sd']:.4f}", r["best_peer"],
          f"{r['rows'][r['best_peer']]['nll_mean']:.4f} ± {r['rows'][r['best_peer']]['nll_sd']:.4f}",
          f"{r['nll_gap']:+.4f}", r["nll_target_met"], r["fastest_comparable_peer"],
          r["rows"][r["fastest_comparable_peer"]]["median_time"] if r["fastest_comparable_peer"] else None,
          r["speedup"], f"≥ {r['speed_target']:.0f}x: {_speed_verdict(r)}"]
         for r in results if "best_peer" in r],
    )  # fmt: skip
    tables = [targets]
    for r in results:
        tables.append(_report.Table(
            f"{r['problem']} ({r['kind']}, N = {r['num_train']})",
            ["method", "splits", "median time (s)", "test NLL", "error / RMSE",
             "not converged (cap, or ours: uncertified)", "failed"],
            [[k, v["splits"], v["median_time"], f"{v['nll_mean']:.4f} ± {v['nll_sd']:.4f}",
              f"{v['error_mean']:.4f} ± {v['error_sd']:.4f}", v["capped"], v.get("failed", 0)]
             for k, v in r["rows"].items()],
        ))  # fmt: skip
    return tables


def write_results(out: Path, name: str, record: dict[str, Any]) -> None:
    settings = {
        "command": "python benchmarks/hyperparameters.py " + " ".join(record.get("arguments", [])),
        "start (every method)": "ARD lengthscales 1 (standardised inputs), outputscale 1, mean 0, likelihood "
        "constants at their defaults, the same fixed k-means inducing inputs",
        "ours": "CAVI(...).fit(x, y, learn_hyperparameters=True), every default",
        "peers' stopping rule": "plateau of the training loss: window mean improves < 1e-4 nats per datum "
        "(window max(50 steps, one epoch)), or the per-problem cap",
        "grid": str(GRID),
        "Student-t ν (fixed)": DF,
        **_report.machine_settings(record["machine"]),
    }  # fmt: skip
    _report.write_report(out, name, record, "The one-call fit against the peers: the model each method stops at",
                         settings, report_tables(record["results"]), echo=False)  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0, help="splits are seeds first-seed, first-seed + 1, ...")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", default=None, help="run ours and the methods whose labels start so")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--merge", type=Path, nargs="+", default=None,
                        help="combine the JSON files of separate runs into results/hyperparameters.{json,md}")
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.merge, common.output_dir(args.out, False))
    machine = common.start_run(threads=1, seed=0)
    out = common.output_dir(args.out, args.quick)
    stem = "hyperparameters" if set(args.problems) == set(PROBLEMS) else "hyperparameters_" + "_".join(args.problems)
    stem += f"_seeds{args.first_seed}-{args.first_seed + args.splits - 1}" if args.first_seed else ""
    results: list[dict[str, Any]] = []
    for name in args.problems:  # the record is rewritten after every problem: a crash keeps what was measured
        results.append(run_problem(name, args.splits, args.quick, args.only, args.first_seed))
        record = {"machine": common.close_machine_info(dict(machine)), "arguments": list(argv or sys.argv[1:]),
                  "grid": GRID, "problems": PROBLEMS, "results": results}  # fmt: skip
        write_results(out, stem, record)
    return results


def merge(paths: list[Path], out: Path) -> list[dict[str, Any]]:
    """One report from runs made separately (e.g. the small and the large problems in two processes, or more
    splits of a problem run later with ``--first-seed``: their runs are pooled and summarised again; where two files
    hold the same split of a method, the earlier file's run is kept)."""
    import json

    records = [json.loads(Path(p).read_text()) for p in paths]
    pooled: dict[str, dict[str, Any]] = {}
    for r in (r for record in records for r in record["results"]):
        runs = pooled.setdefault(r["problem"], {"kind": r["kind"], "num_train": r["num_train"], "runs": {}})["runs"]
        for label, of_label in r["runs"].items():
            seen = {run["seed"] for run in runs.get(label, [])}
            runs.setdefault(label, []).extend(run for run in of_label if run["seed"] not in seen)
    order = [name for name in PROBLEMS if name in pooled]  # the script's order, whatever the files' order
    results = [summarise(name, {"kind": pooled[name]["kind"]}, pooled[name]["runs"], pooled[name]["num_train"])
               for name in order]  # fmt: skip
    machine = dict(records[0]["machine"])
    machine["load_average_end"] = max((rec["machine"]["load_average_end"] for rec in records), key=lambda v: v[0])
    record = {"machine": machine, "runs_merged": [Path(p).name for p in paths],
              "arguments": [a for rec in records for a in rec.get("arguments", [])], "grid": GRID,
              "problems": PROBLEMS, "results": results}  # fmt: skip
    write_results(out, "hyperparameters", record)
    return results


if __name__ == "__main__":
    main()
