r"""End to end with learned hyper-parameters (issue 15): the package's one-call fit against GPyTorch's and BoTorch's
best protocols, every second of hyper-parameter learning counted.

Problems: KEEL ``heart`` (a Bayesian-optimisation-sized problem, 216 training points), MASS ``Boston`` (Student-t),
KEEL ``magic`` and KEEL ``satimage`` (6 classes; logistic-softmax against GPyTorch's ``SoftmaxLikelihood``). Every
method starts from the same hyper-parameters (median-heuristic ARD lengthscales, outputscale 1, mean 0, likelihood
scale 1 where there is one) and the same fixed k-means inducing inputs. The methods:

* **ours** -- ``CAVI.fit(x, y, learn_hyperparameters=True)``'s collapsed protocol, one outer step per timed step
  (:class:`~gpytorch_augment.inference.hyperparameters.CollapsedProtocol` with its defaults: closed-form
  :math:`q(\Omega)` and :math:`q^*(u)`, a fresh 20-iteration L-BFGS on the collapsed bound, doubling subsets from
  2,048 points);
* **SVGP+Adam** -- GPyTorch's ``VariationalELBO``, Adam on every parameter; **NGD+Adam** -- GPyTorch's
  ``NGD`` on a ``NaturalVariationalDistribution`` plus Adam on the hyper-parameters; each over the grid
  :data:`GRID`, declared here before any run;
* **BoTorch** -- one call of ``botorch.fit_gpytorch_mll`` on the ``VariationalELBO`` (its defaults: L-BFGS-B up to
  1,024 training points, full-batch Adam with its stopping rule above), timed as one step.

All methods run interleaved (:func:`_common.run_interleaved`), each stopped by a plateau of its test NLL or a time
cap. The target of a problem is the best test NLL any run reaches plus 0.005 nats; the table gives each method's
time to it, and the speed-up of ours over the fastest peer (at its best grid point).

Run ``python benchmarks/hyperparameters.py`` (~25 min on 2 shared cores; ``magic`` and ``satimage`` training sets
subsampled, see :data:`PROBLEMS`) or ``--quick``; results go to ``results/hyperparameters.{json,md}``.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import gpytorch  # noqa: E402
import regression as rg  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from gpytorch_augment import (  # noqa: E402
    CAVI,
    BernoulliLogitLikelihood,
    CAVIVariationalStrategy,
    LogisticSoftmaxLikelihood,
    StudentTLikelihood,
)
from gpytorch_augment.datasets import load_keel  # noqa: E402
from gpytorch_augment.inference.hyperparameters import hyperparameters_of  # noqa: E402
from gpytorch_augment.inference.nested import NestedProtocol  # noqa: E402

#: the peers' grid, fixed before any run: learning rates and batch sizes ("full" = all the training data)
GRID = {
    "SVGP+Adam": {"lr": [0.01, 0.1], "batch_size": [256, 1024, "full"]},
    "NGD+Adam": {"ngd_lr": [0.1], "lr": [0.03], "batch_size": [256, 1024, "full"]},
    "BoTorch": {"call": ["fit_gpytorch_mll(mll) with its defaults"]},
}
#: per problem: loader, likelihood kind, inducing points, training subsample (full run), time cap per method (s)
PROBLEMS = {
    "heart": {"kind": "binary", "num_inducing": 50, "max_train": None, "cap": 20.0},
    "boston": {"kind": "student_t", "num_inducing": 50, "max_train": None, "cap": 20.0},
    "magic": {"kind": "binary", "num_inducing": 100, "max_train": 5000, "cap": 40.0},
    "satimage": {"kind": "multiclass", "num_inducing": 50, "max_train": 2000, "cap": 40.0},
}
DF = 4.0  #: Student-t degrees of freedom, fixed for both likelihoods
TOLERANCE = 0.005  #: nats above the best test NLL that count as reaching the target
SCHEDULE = common.EvalSchedule(dense_until=30, every=10, sparse_from=300, sparse_every=30)


# ---------------------------------------------------------------------------------------------------- problems
def load(name: str, max_train: int | None, seed: int = 0) -> dict[str, Any]:
    if name == "boston":
        d = rg.load_boston(seed=seed, max_train=max_train)
        return {"x": d.x_train, "y": d.y_train, "xt": d.x_test, "yt": d.y_test, "K": 1}
    d = load_keel(name, seed=seed, max_train=max_train)
    return {"x": d.x_train, "y": d.y_train, "xt": d.x_test, "yt": d.y_test, "K": d.num_classes}


class Model(gpytorch.models.ApproximateGP):
    """``K`` independent latents (``K = 1``: one) with constant mean and scaled ARD-RBF kernel at fixed ``Z``."""

    def __init__(self, Z: Tensor, K: int, distribution_cls: type, strategy_cls: type) -> None:
        batch = torch.Size([K]) if K > 1 else torch.Size()
        q_u = distribution_cls(Z.size(-2), batch_shape=batch)
        strategy = strategy_cls(self, Z, q_u, learn_inducing_locations=False)
        if K > 1:
            strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(strategy, num_tasks=K)
        super().__init__(strategy)
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
        kernel = gpytorch.kernels.RBFKernel(ard_num_dims=Z.size(-1), batch_shape=batch)
        self.covar_module = gpytorch.kernels.ScaleKernel(kernel, batch_shape=batch)

    def forward(self, x: Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def initialise(model: Model, lengthscale: Tensor) -> Model:
    """The common start: median-heuristic lengthscales, outputscale 1, mean 0."""
    shape = model.covar_module.base_kernel.lengthscale.shape
    model.covar_module.base_kernel.lengthscale = lengthscale.expand(shape)
    model.covar_module.outputscale = torch.ones_like(model.covar_module.outputscale)
    model.mean_module.constant.data.zero_()
    return model.double()


def likelihood_for(kind: str, ours: bool, K: int) -> Any:
    if kind == "binary":
        return BernoulliLogitLikelihood() if ours else gpytorch.likelihoods.BernoulliLikelihood()
    if kind == "student_t":
        if ours:
            return StudentTLikelihood(df=DF, scale=1.0).double()
        lik = gpytorch.likelihoods.StudentTLikelihood()
        lik.deg_free = DF
        lik.noise = 1.0
        lik.raw_deg_free.requires_grad_(False)
        return lik.double()
    if ours:
        return LogisticSoftmaxLikelihood(num_classes=K).double()
    return gpytorch.likelihoods.SoftmaxLikelihood(num_features=K, num_classes=K, mixing_weights=False).double()


def evaluator(kind: str, model: Model, lik: Any, xt: Tensor, yt: Tensor, K: int) -> Any:
    if kind == "binary":
        return common.binary_evaluator(model, lik, xt, yt)
    if kind == "student_t":
        return rg.make_evaluator(model, lik, xt, yt, DF)
    eps = torch.randn(256, xt.shape[0], K, generator=torch.Generator().manual_seed(1), dtype=xt.dtype)

    def evaluate() -> dict[str, float]:  # the same fixed draws of q(f*) through each method's own link
        model.eval()
        with torch.no_grad():
            q = model(xt)
            probs = lik.forward(q.mean + q.variance.sqrt() * eps).probs.mean(0)
        model.train()
        p = probs.gather(-1, yt.long().unsqueeze(-1)).squeeze(-1).clamp_min(1e-12)
        error = (probs.argmax(-1) != yt.long()).double().mean()
        return {"test_nll": float(-p.log().mean()), "test_error": float(error)}

    return evaluate


# ---------------------------------------------------------------------------------------------------- methods
def batches(n: int, batch_size: int, seed: int) -> Any:
    """Shuffled mini-batch indices forever (``batch_size >= n``: all the data every step)."""
    g = torch.Generator().manual_seed(seed)
    while True:
        if batch_size >= n:
            yield slice(None)
            continue
        perm = torch.randperm(n, generator=g)
        for s in range(0, n - batch_size + 1, batch_size):
            yield perm[s : s + batch_size]


def make_ours(p: dict[str, Any], data: dict[str, Any], Z: Tensor, ls: Tensor) -> common.MethodSpec:
    model = initialise(Model(Z, data["K"], gpytorch.variational.CholeskyVariationalDistribution,
                             CAVIVariationalStrategy), ls)  # fmt: skip
    lik = likelihood_for(p["kind"], True, data["K"])
    cavi = CAVI(model, lik, num_data=data["y"].shape[-1])
    protocol = NestedProtocol(cavi, data["x"], data["y"], hyperparameters_of(cavi))
    return common.MethodSpec("ours: collapsed + L-BFGS", protocol.step,
                             evaluator(p["kind"], model, lik, data["xt"], data["yt"], data["K"]),
                             {"protocol": "CAVI.fit(learn_hyperparameters=True), collapsed"})  # fmt: skip


def make_peer(p: dict[str, Any], data: dict[str, Any], Z: Tensor, ls: Tensor, family: str, **cfg: Any) -> Any:
    n, K = data["y"].shape[-1], data["K"]
    natural = family == "NGD+Adam"
    dist = gpytorch.variational.NaturalVariationalDistribution if natural else (
        gpytorch.variational.CholeskyVariationalDistribution)  # fmt: skip
    model = initialise(Model(Z, K, dist, gpytorch.variational.VariationalStrategy), ls)
    lik = likelihood_for(p["kind"], False, K)
    mll = gpytorch.mlls.VariationalELBO(lik, model, num_data=n)
    x, y = data["x"], data["y"]
    evaluate = evaluator(p["kind"], model, lik, data["xt"], data["yt"], K)
    if family == "BoTorch":
        import botorch

        model.train_inputs, model.train_targets = (x,), y
        state = {"done": False}

        def fit_once() -> None:
            if not state["done"]:
                # an ABNORMAL line-search exit of L-BFGS-B (frequent on the ELBO) counts as a fit, not a failure
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    botorch.fit_gpytorch_mll(
                        mll, optimizer_kwargs={"timeout_sec": p["cap"]}, warning_handler=lambda w: True
                    )
                mll.train()
                state["done"] = True

        return common.MethodSpec("BoTorch fit_gpytorch_mll", fit_once, evaluate, {"family": family})
    bs = n if cfg["batch_size"] == "full" else min(int(cfg["batch_size"]), n)
    hyper = [*model.hyperparameters(), *lik.parameters()]
    optimizers = [torch.optim.Adam([q for q in hyper if q.requires_grad], lr=cfg["lr"])]
    if natural:
        optimizers.insert(0, gpytorch.optim.NGD(model.variational_parameters(), num_data=n, lr=cfg["ngd_lr"]))
    else:
        optimizers = [torch.optim.Adam([q for q in (*model.parameters(), *lik.parameters()) if q.requires_grad],
                                       lr=cfg["lr"])]  # fmt: skip
    it = batches(n, bs, seed=0)

    def loss() -> Tensor:
        idx = next(it)
        return -mll(model(x[idx]), y[..., idx])

    step = common.gradient_step(loss, *optimizers)
    label = f"{family} lr {cfg['lr']}, batch {cfg['batch_size']}"
    return common.MethodSpec(label, step, evaluate, {"family": family, **cfg})


def methods(p: dict[str, Any], data: dict[str, Any], Z: Tensor, ls: Tensor) -> list[common.MethodSpec]:
    n = data["y"].shape[-1]
    out = [make_ours(p, data, Z, ls), make_peer(p, data, Z, ls, "BoTorch")]
    for family in ("SVGP+Adam", "NGD+Adam"):
        grid = GRID[family]
        sizes = [b for b in grid["batch_size"] if b == "full" or b < n]
        for bs in sizes:
            for lr in grid["lr"]:
                extra = {"ngd_lr": grid["ngd_lr"][0]} if family == "NGD+Adam" else {}
                out.append(make_peer(p, data, Z, ls, family, lr=lr, batch_size=bs, **extra))
    return out


# ---------------------------------------------------------------------------------------------------- runs
TARGETS = {"heart": 10.0, "boston": 3.0, "magic": 3.0, "satimage": 5.0}  #: the issue's speed-up targets


def run_problem(name: str, p: dict[str, Any], quick: bool, cap: float | None) -> dict[str, Any]:
    max_train = p["max_train"]
    if quick:
        max_train = min(max_train or 10**9, 400 if p["kind"] != "multiclass" else 300)
    data = load(name, max_train)
    data["K"] = data["K"] if p["kind"] == "multiclass" else 1
    Z = common.kmeans_inducing_points(data["x"], min(p["num_inducing"], 20 if quick else 10**9), seed=0)
    ls = common.median_heuristic_lengthscales(data["x"])
    p = dict(p, cap=cap or (8.0 if quick else p["cap"]))
    print(f"== {name}: {tuple(data['x'].shape)} train, {tuple(data['xt'].shape)} test, M = {Z.shape[0]}", flush=True)
    common.warm_up([m.step for m in methods(p, data, Z, ls) if not m.name.startswith("BoTorch")], repeats=1)
    rule = common.StoppingRule(patience=15, min_improvement=1e-4, min_window_iterations=60, max_time=p["cap"])
    traces = common.run_interleaved(
        methods(p, data, Z, ls), "test_nll", rule, SCHEDULE,
        on_done=lambda n, t: common.print_run(n, t, f"nll {t.metrics['test_nll'][-1]:.4f} "),
    )  # fmt: skip
    error = "test_rmse" if p["kind"] == "student_t" else "test_error"
    runs = {k: {**common.run_summary(t, final=("test_nll", error)), "trace": t.to_dict()}
            for k, t in traces.items()}  # fmt: skip
    return summarise(name, runs, data, Z.shape[0])


def summarise(name: str, runs: dict[str, Any], data: dict[str, Any], M: int) -> dict[str, Any]:
    best = min(r["best_test_nll"] for r in runs.values())
    target = best + TOLERANCE
    for r in runs.values():
        r["hit"] = common.hit_record(r, "test_nll", target)
        r["final_test_error"] = r.get("final_test_error", r.get("final_test_rmse"))
    ours_name = next(k for k in runs if k.startswith("ours"))
    ours = runs[ours_name]
    peers = {k: r for k, r in runs.items() if k != ours_name}
    hitting = {k: r for k, r in peers.items() if r["hit"] is not None}
    fastest = min(hitting, key=lambda k: hitting[k]["hit"]["time"]) if hitting else None
    ratio = lower = None
    if ours["hit"] is not None:
        if fastest is not None:
            ratio = hitting[fastest]["hit"]["time"] / ours["hit"]["time"]
        else:  # no peer reached the target within its cap: the longest peer run bounds the ratio from below
            lower = max(r["total_time"] for r in peers.values()) / ours["hit"]["time"]
    best_peer_final = min(r["final_test_nll"] for r in peers.values())
    return {
        "problem": name, "num_train": int(data["y"].shape[-1]), "num_test": int(data["yt"].shape[-1]),
        "num_inducing": M, "best_test_nll": best, "target": target, "runs": runs, "ours": ours_name,
        "fastest_peer": fastest, "speedup": ratio, "speedup_lower_bound": lower, "speedup_target": TARGETS[name],
        "final_nll_gap": ours["final_test_nll"] - best_peer_final,
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------------- output
def _t(hit: dict[str, Any] | None) -> str:
    return "never" if hit is None else f"{hit['time']:.2f} s ({hit['iteration']} it)"


def write_markdown(path: Path, result: dict[str, Any]) -> None:
    lines = [
        "# End to end with learned hyper-parameters (issue 15)", "",
        "Time until the test NLL first comes within 0.005 nats of the best any run reached, every second of "
        "hyper-parameter learning counted; same initial hyper-parameters and inducing inputs for every method; "
        "peers at their best over the grid declared in `benchmarks/hyperparameters.py` (`GRID`).", "",
        common.machine_sentence(result["machine"]), f"* Subsampling: {result['subsampling']}", "",
        "## Summary", "",
    ]  # fmt: skip
    rows = []
    for r in result["problems"].values():
        ours = r["runs"][r["ours"]]
        sp = r["speedup"]
        cell = (
            f"{sp:.1f}×"
            if sp is not None
            else (f"> {r['speedup_lower_bound']:.1f}×" if r["speedup_lower_bound"] else "ours missed the target")
        )
        met = sp is not None and sp >= r["speedup_target"] or (r["speedup_lower_bound"] or 0) >= r["speedup_target"]
        fastest = r["runs"][r["fastest_peer"]] if r["fastest_peer"] else None
        rows.append([
            f"{r['problem']} (N = {r['num_train']}, M = {r['num_inducing']})", _t(ours["hit"]),
            f"{r['fastest_peer']}: {_t(fastest['hit'])}" if fastest else "none reached it", cell,
            f"≥ {r['speedup_target']:.0f}×: {'met' if met else 'missed'}",
            f"{ours['final_test_nll']:.4f} ({r['final_nll_gap']:+.4f})", f"{ours['final_test_error']:.4f}",
        ])  # fmt: skip
    lines.append(common.markdown_table(
        ["problem", "ours to target", "fastest peer to target", "speed-up", "target", "ours final NLL (vs best peer)",
         "ours final error (RMSE for Boston)"], rows))  # fmt: skip
    for r in result["problems"].values():
        lines += ["", f"## {r['problem']}: best test NLL {r['best_test_nll']:.4f}, target {r['target']:.4f}", ""]
        rows = [
            [
                k,
                _t(v["hit"]),
                f"{v['final_test_nll']:.4f}",
                f"{v['final_test_error']:.4f}",
                f"{v['total_time']:.1f}",
                v["trace"]["iteration"][-1],
                v["stop_reason"],
            ]
            for k, v in sorted(r["runs"].items(), key=lambda kv: (kv[1]["hit"] or {"time": 1e9})["time"])
        ]
        lines.append(
            common.markdown_table(
                ["method", "to target", "final NLL", "final error", "run time [s]", "iterations", "stop"], rows
            )
        )
    common.write_text(path, "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = common.run_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0]), "small subsets")
    parser.add_argument("--problems", nargs="*", default=list(PROBLEMS), help="which problems (default all)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    machine = common.start_run(args.threads, args.seed)
    problems = {name: run_problem(name, PROBLEMS[name], args.quick, args.max_time) for name in args.problems}
    result = {
        "machine": common.close_machine_info(machine), "grid": GRID, "problems": problems,
        "config": {k: copy.deepcopy(v) for k, v in PROBLEMS.items()}, "quick": args.quick,
        "subsampling": "quick run: every training set subsampled" if args.quick else (
            "magic: 5,000 of 15,216 training points and satimage: 2,000 of 5,148 (seeded subsample of load_keel's "
            "split, to keep the full run within ~25 min on the shared machine); heart and Boston: all"),
        "wall_time_total": time.perf_counter() - start,
    }  # fmt: skip
    common.write_results(common.output_dir(args.output_dir, args.quick), "hyperparameters", result, write_markdown)
    return result


if __name__ == "__main__":
    main()
