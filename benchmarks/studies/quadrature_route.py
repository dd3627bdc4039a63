r"""Matérn-3/2 regression and the Bayesian SVM: the augmented closed-form route against GPyTorch's quadrature route
for the same model.

**The two routes.**

* **ours** -- ``CAVI(model, likelihood, N).fit(x, y)`` (frozen hyper-parameters: full-batch closed-form steps until
  the relative change of the augmented ELBO is below 1e-8) and ``CAVI(...).fit(x, y, learn_hyperparameters=True)``
  (learned: the one-call nested protocol), every default, with ``MaternThreeHalvesLikelihood`` or
  ``BayesianSVMLikelihood``, ``CAVIVariationalStrategy`` and a Cholesky :math:`q(u)`;
* **peer** -- GPyTorch's SVGP (``VariationalStrategy``: whitened, ``CholeskyVariationalDistribution``) trained by
  full-batch Adam on the ``VariationalELBO`` with a likelihood written here as a subclass of GPyTorch's
  ``_OneDimensionalLikelihood``: its ``forward(f)`` is the same observation model, and GPyTorch computes the
  expected log-likelihood by 20-point Gauss--Hermite quadrature (:class:`QuadratureMatern`,
  :class:`QuadratureSVM`). Frozen: Adam on :math:`q(u)` only; learned: :math:`q(u)`, mean, kernel and (Matérn)
  the noise scale :math:`\rho`. Stopped by the peers' standard plateau rule of ``hyperparameters.py``
  (:class:`hyperparameters.Plateau`: the mean training loss of the last 50 steps improves on the previous 50 by
  less than 1e-4 nats per datum) or a time cap. Learning rate from :data:`LR_GRID`, chosen per problem and setting
  on a pilot split (seed :data:`PILOT_SEED`, not reported): the fastest to the pilot's target.

**The model, the same for both.** Constant mean, scaled ARD RBF kernel, ``M`` fixed inducing inputs from the
package's ``kmeans_plus_plus`` (seeded by the split), whitened full-covariance :math:`q(u)`. Learned: both start
from lengthscales 1, outputscale 1, mean 0 and (Matérn) :math:`\rho = 1` on standardised data. Frozen: the values
of a setup fit (untimed, per split): 300 full-batch Adam steps (lr 0.05) of the peer's SVGP with the quadrature
likelihood on every parameter; then :math:`q(u)` is reset and both routes fit it alone.

**The metric, the same code for both** (:func:`test_metrics`, on each method's :math:`q(f_*)` by 40-point
Gauss--Hermite): Matérn: the test NLL :math:`-\frac1n\sum\log\int p(y_*\mid f)q(f_*)df` of the standardised
target, with the method's own :math:`\rho`, and the RMSE of the predictive mean. SVM: the pseudo-likelihood
:math:`e^{-2\max(1 - s_yf, 0)}` is not a law of :math:`y`, so there is no test NLL of the training model itself;
the metric is the one the package defines for it (``docs/maths/generic.md``): the NLL of the normalised predictive
:math:`p(y_* = 1) = E_{q(f_*)}\,\sigma(2\max(1 + f, 0) - 2\max(1 - f, 0))`, and the test error.

**Measured**, per split (``--splits`` seeded 80/20 splits; the methods run one after the other in one process, one
thread, float64, in an order that rotates with the split): each method's wall time to stop, its final test metrics
and its time to target = the first evaluation at or below (best final test NLL of the split's methods of the same
setting) + 0.005 nats, evaluation time excluded from every clock (ours: evaluated after every CAVI step / L-BFGS
iteration through ``fit``'s callback; the peer: after every step up to 20, then every 10th).

Run ``python benchmarks/studies/quadrature_route.py [--problems boston heart ...] [--splits 5]`` or ``--quick``;
results go to ``results/quadrature_route.{json,md}`` (``--quick``: to the temporary folder).
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: the shared modules

import _common as common  # noqa: E402
import _report  # noqa: E402
import gpytorch  # noqa: E402
import hyperparameters as hp  # noqa: E402
import torch  # noqa: E402
from gpytorch.constraints import Positive  # noqa: E402
from gpytorch.likelihoods.likelihood import _OneDimensionalLikelihood  # noqa: E402
from torch import Tensor  # noqa: E402
from torch.distributions import Distribution, constraints  # noqa: E402

from gpytorch_augment import (  # noqa: E402
    CAVI,
    BayesianSVMLikelihood,
    CAVIVariationalStrategy,
    MaternThreeHalvesLikelihood,
    kmeans_plus_plus,
)
from gpytorch_augment._numerics import gauss_hermite  # noqa: E402

#: the peer's learning rates, declared before any run; the best is chosen per problem and setting on the pilot split
LR_GRID = (0.01, 0.05, 0.1)
#: the pilot split (not reported): its seed differs from every reported split's
PILOT_SEED = 1000
#: time to target: the first evaluation at or below the best final test NLL of the split's methods + this
TOLERANCE = 0.005
#: per problem: likelihood, inducing points, the peer's time cap per run (s, full run)
PROBLEMS = {
    "boston": {"likelihood": "matern", "num_inducing": 50, "cap": 30.0},
    "mcycle": {"likelihood": "matern", "num_inducing": 20, "cap": 30.0},
    "heart": {"likelihood": "svm", "num_inducing": 50, "cap": 30.0},
    "pima": {"likelihood": "svm", "num_inducing": 50, "cap": 30.0},
}
#: ``--quick``: boston and heart, one split, this many training points and inducing inputs, this cap (s)
QUICK = {"max_train": 100, "num_inducing": 20, "cap": 1.0}
SETTINGS = ("frozen", "learned")
#: the setup fit that chooses the frozen hyper-parameters (untimed, per split, with the peer's model)
SETUP = {"optimizer": "Adam", "lr": 0.05, "steps": 300}
#: Gauss--Hermite nodes of the shared test metric
EVAL_NODES = 40
_SQRT3 = math.sqrt(3.0)


# ---------------------------------------------------------------------------------------------------- the peer
class MaternNoise(Distribution):
    r"""The Matérn-3/2 noise law :math:`p(y\mid f) = \frac a4(1 + a|y - f|)e^{-a|y - f|}`, :math:`a = \sqrt3/\rho`
    (its log-density only: what GPyTorch's quadrature needs)."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real

    def __init__(self, loc: Tensor, scale: Tensor) -> None:
        self.loc, self.scale = torch.broadcast_tensors(loc, scale)
        super().__init__(self.loc.shape, validate_args=False)

    def log_prob(self, value: Tensor) -> Tensor:
        a = _SQRT3 / self.scale
        distance = a * (value - self.loc).abs()
        return torch.log(a / 4) + torch.log1p(distance) - distance


class HingePseudoLikelihood(Distribution):
    r"""The SVM's pseudo-likelihood :math:`L(y\mid f) = e^{-2\max(1 - s_yf, 0)}`, :math:`s_y = 2y - 1`, as a
    ``log_prob`` over labels {0, 1} (not normalised: :math:`L(0\mid f) + L(1\mid f) < 1`)."""

    arg_constraints = {"f": constraints.real}
    support = constraints.boolean

    def __init__(self, f: Tensor) -> None:
        self.f = f
        super().__init__(f.shape, validate_args=False)

    def log_prob(self, value: Tensor) -> Tensor:
        return -2 * torch.relu(1 - (2 * value - 1) * self.f)


class QuadratureMatern(_OneDimensionalLikelihood):
    r"""Matérn-3/2 regression for GPyTorch's quadrature route: ``forward(f)`` is :class:`MaternNoise` with the
    scale :math:`\rho` (a positive parameter, softplus-constrained)."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.register_parameter("raw_scale", torch.nn.Parameter(torch.zeros(1)))
        self.register_constraint("raw_scale", Positive())
        self.scale = scale

    @property
    def scale(self) -> Tensor:
        return self.raw_scale_constraint.transform(self.raw_scale)

    @scale.setter
    def scale(self, value: float) -> None:
        self.initialize(
            raw_scale=self.raw_scale_constraint.inverse_transform(torch.as_tensor(value).to(self.raw_scale))
        )

    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> MaternNoise:
        return MaternNoise(function_samples, self.scale.to(function_samples))


class QuadratureSVM(_OneDimensionalLikelihood):
    """The Bayesian SVM for GPyTorch's quadrature route: ``forward(f)`` is :class:`HingePseudoLikelihood`."""

    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> HingePseudoLikelihood:
        return HingePseudoLikelihood(function_samples)


# ---------------------------------------------------------------------------------------------------- the metric
def test_metrics(kind: str, model: Any, scale: Tensor | None, x: Tensor, y: Tensor) -> dict[str, float]:
    """The test metrics of ``model``'s :math:`q(f_*)` at ``x`` (eval mode, then back to train mode): the same code
    for every method. ``kind`` is ``"matern"`` (``scale`` = the method's :math:`\\rho`; NLL and RMSE) or ``"svm"``
    (NLL of the normalised predictive and the error)."""
    model.eval()
    with torch.no_grad():
        q = model(x)
        nodes, weights = gauss_hermite(q.mean, q.variance, EVAL_NODES)
        if kind == "matern":
            a = _SQRT3 / scale.detach().reshape(()).to(nodes)
            distance = a * (y - nodes).abs()
            log_p = torch.log(a / 4) + torch.log1p(distance) - distance
            log_predictive = torch.logsumexp(weights.log() + log_p, dim=0)
            out = {"test_nll": float(-log_predictive.mean()), "test_rmse": float((q.mean - y).pow(2).mean().sqrt())}
        else:
            logits = 2 * (torch.relu(1 + nodes) - torch.relu(1 - nodes))
            probs = (weights * torch.sigmoid(logits)).sum(0)
            out = {"test_nll": common.bernoulli_nll(probs, y), "test_error": common.error_rate(probs, y)}
    model.train()
    return out


def true_elbo(kind: str, model: Any, scale: Tensor | None, x: Tensor, y: Tensor) -> float:
    r"""The true ELBO per datum of ``model``'s :math:`q(u)` on the training data (untimed; the same code for both
    routes): ``VariationalELBO`` with the package's likelihood as a plain GPyTorch likelihood (Matérn: 20-point
    Gauss--Hermite at the method's own :math:`\rho`; SVM: the closed-form :math:`E\log L`)."""
    if kind == "matern":
        likelihood = MaternThreeHalvesLikelihood(scale=float(scale.detach().reshape(())), learn_scale=False).double()
    else:
        likelihood = BayesianSVMLikelihood()
    with torch.no_grad():
        return float(gpytorch.mlls.VariationalELBO(likelihood, model, num_data=y.numel())(model(x), y))


class Clock:
    """A method's own wall clock with the evaluations excluded, and its trace of (time, steps, test metrics)."""

    def __init__(self, evaluate: Callable[[], dict[str, float]]) -> None:
        self.evaluate, self.excluded, self.trace = evaluate, 0.0, []
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start - self.excluded

    def record(self, steps: int) -> dict[str, float]:
        t0 = time.perf_counter()
        values = self.evaluate()
        # 6 decimals: microseconds and micro-nats, far below the 0.005-nat tolerance (keeps the record small)
        values = {k: round(v, 6) for k, v in values.items()}
        self.trace.append({"time": round(t0 - self.start - self.excluded, 6), "steps": steps, **values})
        self.excluded += time.perf_counter() - t0
        return values


# ---------------------------------------------------------------------------------------------------- methods
def frozen_hyperparameters(kind: str, data: dict[str, Any], Z: Tensor) -> dict[str, Any]:
    """The setup fit (:data:`SETUP`): the kernel, mean and (Matérn) :math:`\\rho` both routes then keep fixed."""
    model = hp.Model(Z, 1, gpytorch.variational.CholeskyVariationalDistribution,
                     gpytorch.variational.VariationalStrategy, unit_start=True).double()  # fmt: skip
    likelihood = (QuadratureMatern() if kind == "matern" else QuadratureSVM()).double()
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=data["y"].numel())
    optimizer = torch.optim.Adam([*model.parameters(), *likelihood.parameters()], lr=SETUP["lr"])
    step = common.gradient_step(lambda: -mll(model(data["x"]), data["y"]), optimizer)
    for _ in range(SETUP["steps"]):
        step()
    hypers = common.hyperparameter_values(model)
    hypers["scale"] = float(likelihood.scale.detach()) if kind == "matern" else None
    return hypers


def build(kind: str, route: str, Z: Tensor, hypers: dict[str, Any] | None) -> tuple[Any, Any]:
    """Model and likelihood of one run; ``hypers`` set and frozen (``None``: learned from the common start)."""
    strategy = CAVIVariationalStrategy if route == "ours" else gpytorch.variational.VariationalStrategy
    model = hp.Model(Z, 1, gpytorch.variational.CholeskyVariationalDistribution, strategy, unit_start=True).double()
    frozen = hypers is not None
    if frozen:
        common.set_hyperparameters(model, hypers, frozen=True)
    scale = hypers["scale"] if frozen else 1.0
    if kind == "matern":
        likelihood = (MaternThreeHalvesLikelihood(scale=scale, learn_scale=not frozen) if route == "ours" else
                      QuadratureMatern(scale))  # fmt: skip
        if frozen and route != "ours":
            likelihood.raw_scale.requires_grad_(False)
    else:
        likelihood = BayesianSVMLikelihood() if route == "ours" else QuadratureSVM()
    return model, likelihood.double()


def _scale(kind: str, likelihood: Any) -> Tensor | None:
    return likelihood.scale if kind == "matern" else None


def run_ours(kind: str, data: dict[str, Any], Z: Tensor, hypers: dict[str, Any] | None) -> dict[str, Any]:
    """``CAVI(...).fit``: full batch with frozen ``hypers``, the one-call fit when ``hypers`` is ``None``."""
    model, likelihood = build(kind, "ours", Z, hypers)
    clock = Clock(lambda: test_metrics(kind, model, _scale(kind, likelihood), data["xt"], data["yt"]))
    clock.record(0)
    clock.excluded = time.perf_counter() - clock.start  # the clock starts at the call
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = CAVI(model, likelihood, num_data=data["y"].numel()).fit(
            data["x"], data["y"], learn_hyperparameters=hypers is None, callback=lambda t, _: clock.record(t + 1)
        )
    wall = clock.elapsed()
    final = clock.record(trace.num_steps)  # the state fit leaves (untimed)
    return {"time": wall, **final, "converged": trace.converged, "iterations": trace.num_steps,
            **_end_state(kind, model, likelihood, data),
            "warnings": [str(w.message)[:200] for w in caught], "trace": clock.trace}  # fmt: skip


def run_peer(
    kind: str, data: dict[str, Any], Z: Tensor, hypers: dict[str, Any] | None, lr: float, cap: float
) -> dict[str, Any]:
    """SVGP + full-batch Adam (``lr``) on the ``VariationalELBO`` with the quadrature likelihood, until
    :class:`hyperparameters.Plateau` (window 50 steps, 1e-4 nats per datum) or ``cap`` seconds."""
    model, likelihood = build(kind, "peer", Z, hypers)
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=data["y"].numel())
    params = [p for p in (*model.parameters(), *likelihood.parameters()) if p.requires_grad]
    step = common.gradient_step(lambda: -mll(model(data["x"]), data["y"]), torch.optim.Adam(params, lr=lr))
    rule = hp.Plateau(steps_per_epoch=1, cap=cap)
    clock = Clock(lambda: test_metrics(kind, model, _scale(kind, likelihood), data["xt"], data["yt"]))
    clock.record(0)
    clock.excluded = time.perf_counter() - clock.start
    t, stop, converged = 0, False, False
    while not stop:
        loss = float(step().detach())
        t += 1
        stop, converged = rule.done(loss, clock.elapsed())
        if t <= 20 or t % 10 == 0 or stop:
            final = clock.record(t)
    return {"time": clock.elapsed(), **final, "converged": converged, "iterations": t, "lr": lr,
            **_end_state(kind, model, likelihood, data), "trace": clock.trace}  # fmt: skip


def _end_state(kind: str, model: Any, likelihood: Any, data: dict[str, Any]) -> dict[str, Any]:
    """Where a run ends (untimed): its true ELBO per datum on the training data and its hyper-parameters."""
    scale = _scale(kind, likelihood)
    model.train()
    return {"train_elbo": true_elbo(kind, model, scale, data["x"], data["y"]),
            "hyperparameters": {**common.hyperparameter_values(model),
                                "scale": None if scale is None else float(scale.detach().reshape(()))}}  # fmt: skip


def time_to_target(run: dict[str, Any], target: float) -> float | None:
    """The method's own time at its first evaluation with test NLL ``<= target`` (``None``: never)."""
    return next((p["time"] for p in run["trace"] if p["test_nll"] <= target), None)


def time_to_settle(run: dict[str, Any], target: float) -> float | None:
    """The method's own time at the first evaluation from which the test NLL stays ``<= target`` to the end of the
    run (``None``: the run ends above it)."""
    first = None
    for point in reversed(run["trace"]):
        if point["test_nll"] > target:
            break
        first = point["time"]
    return first


#: the readings of "time to target": name -> (level of a split's setting, time of a run at that level)
READINGS: dict[str, tuple[Callable[[dict[str, Any]], float], Callable[[dict[str, Any], float], float | None]]] = {
    "target": (lambda runs: min(r["test_nll"] for r in runs.values()) + TOLERANCE, time_to_target),
    "settled": (lambda runs: min(r["test_nll"] for r in runs.values()) + TOLERANCE, time_to_settle),
    "ours_level": (lambda runs: runs["ours"]["test_nll"] + TOLERANCE, time_to_target),
}


# ---------------------------------------------------------------------------------------------------- splits
def split(name: str, seed: int, quick: bool) -> tuple[dict[str, Any], Tensor, dict[str, Any]]:
    """Split ``seed`` of problem ``name`` (the loaders and standardisation of ``hyperparameters.py``), its
    inducing inputs and its frozen hyper-parameters."""
    p = PROBLEMS[name]
    data = hp.load(name, {"kind": "binary" if p["likelihood"] == "svm" else "regression", "max_train": None},
                   seed, quick)  # fmt: skip
    if quick:  # a smoke run: the first QUICK["max_train"] training points of the split
        data["x"], data["y"] = data["x"][: QUICK["max_train"]], data["y"][: QUICK["max_train"]]
    num_inducing = QUICK["num_inducing"] if quick else p["num_inducing"]
    Z = kmeans_plus_plus(data["x"], min(num_inducing, data["y"].numel()),
                         generator=torch.Generator().manual_seed(seed))  # fmt: skip
    return data, Z, frozen_hyperparameters(p["likelihood"], data, Z)


def run_split(name: str, seed: int, lrs: dict[str, list[float]], quick: bool, rotate: int) -> dict[str, Any]:
    """Every method of problem ``name`` on split ``seed`` (``lrs``: the peer's learning rates per setting), one
    after the other in an order rotated by ``rotate``; the targets and times to target."""
    kind, cap = PROBLEMS[name]["likelihood"], QUICK["cap"] if quick else PROBLEMS[name]["cap"]
    data, Z, hypers = split(name, seed, quick)
    jobs = [(s, "ours", None) for s in SETTINGS] + [(s, "peer", lr) for s in SETTINGS for lr in lrs[s]]
    jobs = jobs[rotate % len(jobs) :] + jobs[: rotate % len(jobs)]
    print(f"== {name} split {seed}: N = {data['y'].numel()}, test {data['yt'].numel()}, M = {Z.shape[0]}", flush=True)
    runs: dict[str, dict[str, Any]] = {s: {} for s in SETTINGS}
    for setting, route, lr in jobs:
        torch.manual_seed(seed)
        frozen = hypers if setting == "frozen" else None
        result = run_ours(kind, data, Z, frozen) if route == "ours" else run_peer(kind, data, Z, frozen, lr, cap)
        label = "ours" if route == "ours" else f"peer lr {lr}"
        runs[setting][label] = result
        print(f"   {setting:8s} {label:14s} {result['time']:7.2f} s  {result['iterations']:5d} it  "
              f"nll {result['test_nll']:.4f}{'' if result['converged'] else '  (cap)'}", flush=True)  # fmt: skip
    for setting in SETTINGS:
        levels = {reading: level(runs[setting]) for reading, (level, _) in READINGS.items()}
        # the routes start from the same q(f) (the prior); where it already meets a level, no time is measured
        start = min(r["trace"][0]["test_nll"] for r in runs[setting].values())
        met_at_start = {reading: start <= level for reading, level in levels.items()}
        for r in runs[setting].values():
            for reading, (_, when) in READINGS.items():
                r[f"time_to_{reading}"] = None if met_at_start[reading] else when(r, levels[reading])
        runs[setting] = {"levels": levels, "met_at_start": met_at_start, "runs": runs[setting]}
    return {"seed": seed, "num_train": data["y"].numel(), "num_test": data["yt"].numel(), "num_inducing": Z.shape[0],
            "frozen_hyperparameters": hypers, "settings": runs}  # fmt: skip


def choose_lr(pilot: dict[str, Any], setting: str) -> float:
    """The peer's learning rate for ``setting``: the fastest to settle at the pilot's target; if none does, the
    lowest final test NLL."""
    peers = {k: r for k, r in pilot["settings"][setting]["runs"].items() if k != "ours"}
    hits = {k: r["time_to_settled"] for k, r in peers.items() if r["time_to_settled"] is not None}
    best = min(hits, key=hits.get) if hits else min(peers, key=lambda k: peers[k]["test_nll"])
    return peers[best]["lr"]


def run_problem(name: str, splits: int, quick: bool) -> dict[str, Any]:
    pilot = run_split(name, PILOT_SEED, {s: list(LR_GRID) for s in SETTINGS}, quick, rotate=0)
    chosen = {s: choose_lr(pilot, s) for s in SETTINGS}
    print(f"   chosen on the pilot split: {chosen}", flush=True)
    reported = [run_split(name, seed, {s: [chosen[s]] for s in SETTINGS}, quick, rotate=seed + 1)
                for seed in range(splits)]  # fmt: skip
    return {"problem": name, **PROBLEMS[name], "pilot": pilot, "chosen_lr": chosen, "splits": reported,
            "summary": summarise(reported)}  # fmt: skip


# ---------------------------------------------------------------------------------------------------- summary
def _mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _ratio(ours: dict[str, Any], peer: dict[str, Any], reading: str) -> tuple[float | None, bool]:
    """Peer time over ours at ``reading``: ``(None, False)`` where ours never got there; the peer's whole run and
    ``True`` (a lower bound) where the peer never did."""
    mine, theirs = ours[f"time_to_{reading}"], peer[f"time_to_{reading}"]
    if mine is None:
        return None, False
    return (peer["time"] if theirs is None else theirs) / mine, theirs is None


def _geomean(values: list[float]) -> float | None:
    return math.exp(statistics.fmean(map(math.log, values))) if values else None


def summarise(reported: list[dict[str, Any]]) -> dict[str, Any]:
    """Per setting: each method's median time to stop and at each reading, test metrics (mean ± sd), and per
    reading the speed-up (peer time / ours, per split and their geometric mean; a lower bound where the peer never
    got there, undefined where ours did not)."""
    out = {}
    for setting in SETTINGS:
        pairs = []
        for s in reported:
            block = s["settings"][setting]["runs"]
            (peer_label,) = [k for k in block if k != "ours"]
            pairs.append((block["ours"], block[peer_label], s["settings"][setting]["met_at_start"]))
        rows = {}
        for index, label in enumerate(("ours", "peer")):
            rs = [pair[index] for pair in pairs]
            error_key = "test_rmse" if "test_rmse" in rs[0] else "test_error"
            nll, err = _mean_sd([r["test_nll"] for r in rs]), _mean_sd([r[error_key] for r in rs])
            rows[label] = {"median_time": statistics.median(r["time"] for r in rs), "nll_mean": nll[0],
                           "nll_sd": nll[1], "error_name": error_key, "error_mean": err[0], "error_sd": err[1],
                           "splits": len(rs), "capped": sum(not r["converged"] for r in rs),
                           "elbo_mean": statistics.fmean(r["train_elbo"] for r in rs),
                           "median_iterations": statistics.median(r["iterations"] for r in rs)}  # fmt: skip
            for reading in READINGS:
                hits = [r[f"time_to_{reading}"] for r in rs if r[f"time_to_{reading}"] is not None]
                rows[label][f"hits_{reading}"] = len(hits)
                rows[label][f"median_time_to_{reading}"] = statistics.median(hits) if hits else None
        speedups = {}
        for reading in READINGS:
            ratios = [_ratio(ours, peer, reading) for ours, peer, _ in pairs]
            defined = [r for r, _ in ratios if r is not None]
            speedups[reading] = {"per_split": [r for r, _ in ratios], "lower_bound": any(lb for _, lb in ratios),
                                 "met_at_start": sum(met[reading] for _, _, met in pairs),
                                 "geomean": _geomean(defined), "min": min(defined, default=None),
                                 "max": max(defined, default=None), "defined": len(defined)}  # fmt: skip
        out[setting] = {
            "rows": rows,
            "speedups": speedups,
            "stop_time_ratio_geomean": _geomean([peer["time"] / ours["time"] for ours, peer, _ in pairs]),
            "nll_gap_mean": statistics.fmean(o["test_nll"] - p["test_nll"] for o, p, _ in pairs),
            "elbo_gap_mean": statistics.fmean(o["train_elbo"] - p["train_elbo"] for o, p, _ in pairs),
        }
    return out


def _speedup_cell(sp: dict[str, Any], splits: int) -> str:
    """The geometric mean [min, max] of the defined ratios, how many splits define one, and why the others do not."""
    start = sp["met_at_start"]
    never = splits - sp["defined"] - start
    notes = [f"{sp['defined']}/{splits} splits"] if sp["defined"] < splits else []
    notes += [f"{never} ours never"] if never else []
    notes += [f"{start} met at the start"] if start else []
    if sp["geomean"] is None:
        return "— (" + ", ".join(notes) + ")"
    cell = f"{'> ' if sp['lower_bound'] else ''}{sp['geomean']:.2f}× [{sp['min']:.2f}, {sp['max']:.2f}]"
    return cell + (" (" + ", ".join(notes) + ")" if notes else "")


def report(result: dict[str, Any]) -> tuple[str, dict[str, Any], list[_report.Table]]:
    """The tables: speed-up per problem and setting; each method's metrics and times; the pilot's learning rates."""
    speed = _report.Table(
        "Speed-up: peer time / ours (geometric mean over splits [min, max])",
        ["problem", "likelihood", "setting", "peer lr", "ours − peer test NLL (mean)", "ours: time to target (s)",
         "peer: time to target (s)", "speed-up to target", "speed-up, settled at target",
         "speed-up to ours' NLL + 0.005", "time to stop: peer / ours"],
    )  # fmt: skip
    metrics = _report.Table(
        "Test metrics and times (mean ± sd over splits; times: medians)",
        ["problem", "setting", "method", "splits", "time to stop (s)", "iterations", "test NLL", "RMSE / error",
         "true ELBO / N (train)", "reached target", "stopped on cap"],
    )  # fmt: skip
    pilot = _report.Table(
        f"Pilot split (seed {result['pilot_seed']}): the peer's learning rate",
        [
            "problem",
            "setting",
            "method",
            "time to stop (s)",
            "test NLL",
            "time to pilot target (s)",
            "settled at pilot target (s)",
            "chosen",
        ],
    )
    for r in result["results"]:
        for setting in SETTINGS:
            sm = r["summary"][setting]
            ours, peer = sm["rows"]["ours"], sm["rows"]["peer"]
            n, sps = ours["splits"], sm["speedups"]
            speed.rows.append([r["problem"], r["likelihood"], setting, r["chosen_lr"][setting],
                               f"{sm['nll_gap_mean']:+.4f}", ours["median_time_to_target"],
                               peer["median_time_to_target"], _speedup_cell(sps["target"], n),
                               _speedup_cell(sps["settled"], n), _speedup_cell(sps["ours_level"], n),
                               f"{sm['stop_time_ratio_geomean']:.2f}×"])  # fmt: skip
            for label, row in (("ours", ours), (f"peer lr {r['chosen_lr'][setting]}", peer)):
                metrics.rows.append([r["problem"], setting, label, row["splits"], row["median_time"],
                                     row["median_iterations"], f"{row['nll_mean']:.4f} ± {row['nll_sd']:.4f}",
                                     f"{row['error_mean']:.4f} ± {row['error_sd']:.4f}",
                                     f"{row['elbo_mean']:.4f}", f"{row['hits_target']}/{row['splits']}",
                                     row["capped"]])  # fmt: skip
            for label, run in r["pilot"]["settings"][setting]["runs"].items():
                chosen = label != "ours" and run["lr"] == r["chosen_lr"][setting]
                pilot.rows.append([r["problem"], setting, label, run["time"], f"{run['test_nll']:.4f}",
                                   run["time_to_target"], run["time_to_settled"], chosen])  # fmt: skip
    settings = {
        "command": "python benchmarks/studies/quadrature_route.py " + " ".join(result.get("arguments", [])),
        "problems (N train)": ", ".join(f"{r['problem']} ({r['splits'][0]['num_train']}, M = "
                                        f"{r['splits'][0]['num_inducing']})" for r in result["results"]),
        "splits": f"seeds 0..{result['num_splits'] - 1} (80/20), pilot seed {result['pilot_seed']}",
        "ours": "CAVI(...).fit(x, y) (frozen) / .fit(x, y, learn_hyperparameters=True) (learned), every default",
        "peer": "SVGP (whitened Cholesky q(u)) + full-batch Adam, VariationalELBO, _OneDimensionalLikelihood "
        "(20-point Gauss-Hermite)",
        "peer's stopping rule": "plateau of the training loss: mean of the last 50 steps improves < 1e-4 nats per "
        f"datum on the previous 50, or the cap ({', '.join(str(r['cap']) for r in result['results'])} s)",
        "learning-rate grid (declared before any run)": str(list(result["lr_grid"])),
        "frozen hyper-parameters": f"setup fit per split: {result['setup']['steps']} full-batch Adam steps (lr "
        f"{result['setup']['lr']}) of the peer's SVGP, every parameter",
        "target": f"best final test NLL of the split's methods (same setting) + {result['tolerance']}: the first "
        "evaluation at or below it (to target), or the first from which the run stays there (settled); and ours' "
        f"own final test NLL + {result['tolerance']} (the level ours reaches)",
        "test metric": "Matérn: NLL of the standardised target; SVM: NLL of the normalised predictive; both by "
        f"{EVAL_NODES}-point Gauss-Hermite on q(f*)",
        **_report.machine_settings(result["machine"]),
    }  # fmt: skip
    title = "Matérn-3/2 and SVM: the augmented route against GPyTorch's quadrature route"
    return title, settings, [speed, metrics, pilot]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="boston and heart, 100 training points, 1 split")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--output-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    problems, splits = (["boston", "heart"], 1) if args.quick else (args.problems, args.splits)
    machine = common.start_run(threads=args.threads, seed=0)
    results = []
    for name in problems:  # the record is rewritten after every problem: a crash keeps what was measured
        results.append(run_problem(name, splits, args.quick))
        result = {"arguments": list(sys.argv[1:] if argv is None else argv), "lr_grid": LR_GRID,
                  "pilot_seed": PILOT_SEED, "tolerance": TOLERANCE, "setup": SETUP, "num_splits": splits,
                  "results": results, "machine": common.close_machine_info(dict(machine))}  # fmt: skip
        _report.write_report(common.output_dir(args.output_dir, args.quick), "quadrature_route", result,
                             *report(result), echo=name == problems[-1])  # fmt: skip
    return result


if __name__ == "__main__":
    main()
