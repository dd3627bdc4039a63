r"""Multi-class GP classification on KEEL ``satimage``: closed-form CAVI with the logistic-softmax likelihood against
GPyTorch's ``SoftmaxLikelihood`` SVGP trained by Adam.

The GP part is identical for every method::

    f_j ~ GP(c_j, s_j^2 k_RBF-ARD(l_j)),  j = 1..J  (J = K = 6, or K - 1 = 5 for the bijective link),
    u_j = f_j(Z) with M = 100 fixed k-means inducing inputs Z (the same for every method),
    q(u_j) = N(m_j, S_j) (whitened), one batched strategy inside IndependentMultitaskVariationalStrategy.

The kernel and mean hyper-parameters are chosen once by the baseline's own procedure (:func:`choose_hyperparameters`:
a short Adam fit of the softmax SVGP on a subset) and frozen for every method; only q(u) (and, where stated, the class
scales) is optimised:

* **CAVI** -- ``gpytorch_augment.CAVI`` full-batch steps with ``LogisticSoftmaxLikelihood``
  (:math:`p(y=k\mid f) = \theta_k\sigma(f_k)/\sum_l\theta_l\sigma(f_l)`), over-parametrised or bijective link, with
  :math:`\theta \equiv 1` or with the closed-form class-scale update inside every step;
* **SVGP+Adam** -- ``VariationalStrategy`` + ``CholeskyVariationalDistribution`` in
  ``IndependentMultitaskVariationalStrategy``, ``gpytorch.likelihoods.SoftmaxLikelihood(mixing_weights=False)``
  (the softmax link: a different model), ``VariationalELBO`` (Monte-Carlo expected log-likelihood, GPyTorch's default
  10 samples), full-batch Adam on the variational parameters.

Every method is evaluated with the same predictive machinery: class probabilities :math:`E_{q(f_*)}[\text{link}(f_*)]`
by 512 fixed standard-normal draws while tracking (shared by all methods, so their noise is common), and by
:math:`2^{14}` scrambled-Sobol points for the final numbers (the latent variance integrated, not plugged in).

Run ``python benchmarks/multiclass.py`` (full, ~20 min on 2 shared cores) or ``--quick`` (smoke check, < 2 min).
Results go to ``results/multiclass.{json,md,png}`` (``--render results/multiclass.json`` re-renders them).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import gpytorch  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from gpytorch_augment import CAVI, CAVIVariationalStrategy, LogisticSoftmaxLikelihood  # noqa: E402
from gpytorch_augment.datasets import load_keel  # noqa: E402
from gpytorch_augment.likelihoods.logistic_softmax import _expectation  # noqa: E402

#: where ``--quick`` writes by default (the committed results are full runs only)
QUICK_DIR = Path(tempfile.gettempdir()) / "gpytorch_augment_benchmarks"
#: draws of the tracking predictive (shared by every method)
TRACKING_DRAWS = 512
#: "equal accuracy" slack for the secondary target (fraction of test points)
ACCURACY_SLACK = 0.0
#: accuracy levels of the time-to-accuracy table: the baseline's best tracked accuracy minus these
ACCURACY_GAPS = (0.02, 0.015, 0.01, 0.005, 0.0)


# ---------------------------------------------------------------------------------------------------- model
class MultiLatentSVGP(gpytorch.models.ApproximateGP):
    """``J`` independent latent GPs (constant mean, scaled ARD-RBF kernel) with one batched variational strategy."""

    def __init__(self, inducing_points: Tensor, num_latents: int, strategy_cls: type) -> None:
        batch = torch.Size([num_latents])
        q_u = gpytorch.variational.CholeskyVariationalDistribution(inducing_points.size(-2), batch_shape=batch)
        base = strategy_cls(self, inducing_points, q_u, learn_inducing_locations=False)
        super().__init__(gpytorch.variational.IndependentMultitaskVariationalStrategy(base, num_tasks=num_latents))
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
        kernel = gpytorch.kernels.RBFKernel(ard_num_dims=inducing_points.size(-1), batch_shape=batch)
        self.covar_module = gpytorch.kernels.ScaleKernel(kernel, batch_shape=batch)

    def forward(self, x: Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    def set_hyperparameters(self, hypers: dict[str, Any]) -> None:
        """Latent ``j`` of this model gets latent ``j`` of ``hypers``; then the prior is frozen."""
        J = self.mean_module.constant.shape[0]
        self.covar_module.base_kernel.lengthscale = torch.as_tensor(hypers["lengthscale"])[:J].unsqueeze(-2)
        self.covar_module.outputscale = torch.as_tensor(hypers["outputscale"])[:J]
        self.mean_module.constant.data.copy_(torch.as_tensor(hypers["mean_constant"])[:J])
        self.mean_module.requires_grad_(False)
        self.covar_module.requires_grad_(False)


def _softmax_likelihood(num_classes: int) -> gpytorch.likelihoods.SoftmaxLikelihood:
    return gpytorch.likelihoods.SoftmaxLikelihood(
        num_features=num_classes, num_classes=num_classes, mixing_weights=False
    )


def choose_hyperparameters(
    x: Tensor, y: Tensor, Z: Tensor, num_classes: int, subset: int, iterations: int, lr: float = 0.05, seed: int = 0
) -> dict[str, Any]:
    """The fixed procedure that picks the frozen hyper-parameters: the **baseline's** own model (softmax SVGP,
    ``VariationalELBO``) on a seeded random subset, Adam on q(u) and every hyper-parameter for a fixed number of
    iterations from median-heuristic lengthscales, outputscale 1 and mean 0 (not to convergence)."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randperm(x.shape[0], generator=gen)[:subset]
    xs, ys = x[idx], y[idx]
    model = MultiLatentSVGP(Z, num_classes, gpytorch.variational.VariationalStrategy)
    lengthscale = common.median_heuristic_lengthscales(x, seed=seed)
    model.covar_module.base_kernel.lengthscale = lengthscale.expand(num_classes, 1, -1)
    likelihood = _softmax_likelihood(num_classes)
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=ys.numel())
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    start = time.perf_counter()
    for _ in range(iterations):
        optimizer.zero_grad(set_to_none=True)
        loss = -mll(model(xs), ys)
        loss.backward()
        optimizer.step()
    return {
        "lengthscale": model.covar_module.base_kernel.lengthscale.detach().squeeze(-2).tolist(),
        "outputscale": model.covar_module.outputscale.detach().tolist(),
        "mean_constant": model.mean_module.constant.detach().tolist(),
        "procedure": (
            f"GPyTorch SVGP with SoftmaxLikelihood (the baseline's model; IndependentMultitaskVariationalStrategy, "
            f"CholeskyVariationalDistribution, VariationalELBO) on a seeded random subset of {xs.shape[0]} training "
            f"points with the same fixed Z; Adam lr={lr} on q(u) and all hyper-parameters for {iterations} "
            "iterations from median-heuristic lengthscales, outputscale 1, mean 0; then frozen for every method "
            "(the bijective link uses the first K-1 latents')"
        ),
        "fit_seconds": time.perf_counter() - start,
        "subset_elbo_per_datum": float(-loss.detach()),
    }


# ---------------------------------------------------------------------------------------------------- methods
@dataclass
class MethodSpec:
    name: str
    engine: str  # "cavi" | "adam"
    bijective: bool = False
    learn_class_scales: bool = False
    lr: float | None = None

    @property
    def link(self) -> str:
        if self.engine == "adam":
            return "softmax"
        scales = ", θ learned" if self.learn_class_scales else ", θ = 1"
        return "logistic-softmax" + (", bijective" if self.bijective else "") + scales


def default_methods(quick: bool) -> list[MethodSpec]:
    methods = [
        MethodSpec("CAVI", "cavi"),
        MethodSpec("CAVI + class scales", "cavi", learn_class_scales=True),
        MethodSpec("CAVI bijective", "cavi", bijective=True),
        MethodSpec("CAVI bijective + class scales", "cavi", bijective=True, learn_class_scales=True),
        MethodSpec("SVGP+Adam lr=0.05", "adam", lr=0.05),
        MethodSpec("SVGP+Adam lr=0.01", "adam", lr=0.01),
    ]
    if quick:
        methods = [m for m in methods if m.name not in ("CAVI bijective", "SVGP+Adam lr=0.01")]
    return methods


@dataclass
class Built:
    model: MultiLatentSVGP
    likelihood: Any
    step: Callable[[], Any]
    link: Callable[[Tensor], Tensor]  # latents (..., N, J) -> class probabilities (..., N, K)


def build(spec: MethodSpec, x: Tensor, y: Tensor, Z: Tensor, num_classes: int, hypers: dict[str, Any]) -> Built:
    """The model, its likelihood, a ``step()`` closure (one full-batch training iteration) and the link."""
    if spec.engine == "cavi":
        likelihood = LogisticSoftmaxLikelihood(
            num_classes, bijective=spec.bijective, learn_class_scales=spec.learn_class_scales
        )
        model = MultiLatentSVGP(Z, likelihood.num_latents, CAVIVariationalStrategy)
        model.set_hyperparameters(hypers)
        cavi = CAVI(model, likelihood, num_data=y.numel())
        return Built(model, likelihood, lambda: cavi.step(x, y), lambda f: likelihood(f).probs)
    likelihood = _softmax_likelihood(num_classes)
    model = MultiLatentSVGP(Z, num_classes, gpytorch.variational.VariationalStrategy)
    model.set_hyperparameters(hypers)
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=y.numel())
    optimizer = torch.optim.Adam(model.variational_parameters(), lr=spec.lr)

    def step() -> Any:
        optimizer.zero_grad(set_to_none=True)
        loss = -mll(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return Built(model, likelihood, step, lambda f: torch.softmax(f, -1))


@torch.no_grad()
def latent_moments(model: MultiLatentSVGP, x: Tensor) -> tuple[Tensor, Tensor]:
    model.eval()
    out = model(x)
    mean, var = out.mean, out.variance
    model.train()
    return mean, var


def classification_metrics(probs: Tensor, y: Tensor, bins: int = 10) -> dict[str, Any]:
    """Accuracy, NLL, mean confidence (max probability), expected calibration error and a reliability table."""
    labels = y.long()
    confidence, predicted = probs.max(-1)
    correct = (predicted == labels).to(torch.float64)
    edges = torch.linspace(0, 1, bins + 1)
    table, ece = [], 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (confidence > lo) & (confidence <= hi)
        if inside.any():
            acc, conf = float(correct[inside].mean()), float(confidence[inside].mean())
            ece += float(inside.double().mean()) * abs(acc - conf)
            table.append(
                {"bin": [float(lo), float(hi)], "count": int(inside.sum()), "accuracy": acc, "confidence": conf}
            )
    return {
        "accuracy": float(correct.mean()),
        "test_nll": float(-probs[torch.arange(len(labels)), labels].clamp_min(1e-300).log().mean()),
        "mean_confidence": float(confidence.mean()),
        "ece": ece,
        "reliability": table,
    }


def make_evaluator(built: Built, x_test: Tensor, y_test: Tensor, eps: Tensor) -> Callable[[], dict[str, float]]:
    """Tracking metrics from the fixed draws ``eps`` (untimed)."""

    def evaluate() -> dict[str, float]:
        mean, var = latent_moments(built.model, x_test)
        with torch.no_grad():
            probs = built.link(mean + var.sqrt() * eps[..., : mean.shape[-1]]).mean(0)
        m = classification_metrics(probs, y_test)
        return {"test_nll": m["test_nll"], "test_error": 1 - m["accuracy"], "mean_confidence": m["mean_confidence"]}

    return evaluate


def final_metrics(built: Built, x_test: Tensor, y_test: Tensor) -> dict[str, Any]:
    """The precise predictive, latent variance integrated by 2^14 scrambled-Sobol points (CAVI: the likelihood's own
    ``predict_proba``; softmax: the same rule applied to the softmax)."""
    model = built.model
    model.eval()
    with torch.no_grad():
        q_f = model(x_test)
        if isinstance(built.likelihood, LogisticSoftmaxLikelihood):
            probs = built.likelihood.predict_proba(q_f)
        else:
            probs = _expectation(lambda f: torch.softmax(f, -1), q_f.mean, q_f.variance)
    model.train()
    return classification_metrics(probs, y_test)


# ---------------------------------------------------------------------------------------------------- analysis
def _trace(run: dict[str, Any]) -> common.Trace:
    return common.Trace(**{k: v for k, v in run["trace"].items() if k != "median_step_time"})


def _hit(run: dict[str, Any], accuracy: float) -> dict[str, Any] | None:
    hit = common.time_to_target(_trace(run), "test_error", 1 - accuracy + 1e-12)
    return asdict(hit) if hit else None


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy targets, times to target and speed-ups of the fastest CAVI run over the fastest baseline run."""
    for r in runs:
        r["best_accuracy"] = 1 - min(r["trace"]["metrics"]["test_error"])
    cavi = [r for r in runs if r["engine"] == "cavi"]
    adam = [r for r in runs if r["engine"] == "adam"]
    best_baseline = max(r["best_accuracy"] for r in adam)
    best_cavi = max(r["best_accuracy"] for r in cavi)
    targets = {
        "baseline_best": best_baseline,
        "equal": min(best_baseline, best_cavi) - ACCURACY_SLACK,
    }
    out: dict[str, Any] = {"targets": targets, "speedups": {}}
    for r in runs:
        r["hits"] = {key: _hit(r, value) for key, value in targets.items()}
    for key in targets:
        c = [r for r in cavi if r["hits"][key]]
        b = [r for r in adam if r["hits"][key]]
        fc = min(c, key=lambda r: r["hits"][key]["time"]) if c else None
        fb = min(b, key=lambda r: r["hits"][key]["time"]) if b else None
        entry: dict[str, Any] = {"cavi": fc["name"] if fc else None, "baseline": fb["name"] if fb else None}
        if fc and fb:
            hc, hb = fc["hits"][key], fb["hits"][key]
            entry.update(
                wall=hb["time"] / hc["time"],
                cpu=hb["cpu_time"] / hc["cpu_time"],
                iterations_x_cost=(hb["iteration"] * fb["median_step_time"])
                / (hc["iteration"] * fc["median_step_time"]),
                cavi_time=hc["time"],
                baseline_time=hb["time"],
            )
        out["speedups"][key] = entry
    levels = []
    for gap in ACCURACY_GAPS:
        level = best_baseline - gap
        hits = {r["name"]: _hit(r, level) for r in runs}
        fc = min((r for r in cavi if hits[r["name"]]), key=lambda r: hits[r["name"]]["time"], default=None)
        fb = min((r for r in adam if hits[r["name"]]), key=lambda r: hits[r["name"]]["time"], default=None)
        levels.append({
            "gap": gap, "accuracy": level, "hits": hits,
            "fastest_cavi": fc["name"] if fc else None, "fastest_baseline": fb["name"] if fb else None,
            "speedup_wall": hits[fb["name"]]["time"] / hits[fc["name"]]["time"] if fc and fb else None,
        })
    out["accuracy_levels"] = levels
    best_final_baseline = max(adam, key=lambda r: r["final"]["accuracy"])
    best_final_cavi = max(cavi, key=lambda r: r["final"]["accuracy"])
    out["final"] = {
        "best_baseline": best_final_baseline["name"],
        "best_cavi": best_final_cavi["name"],
        "accuracy_difference": best_final_cavi["final"]["accuracy"] - best_final_baseline["final"]["accuracy"],
        "nll_difference": best_final_cavi["final"]["test_nll"] - best_final_baseline["final"]["test_nll"],
    }
    literal = out["speedups"]["baseline_best"]
    out["issue_target_met"] = bool(literal.get("wall", 0) >= 10 and out["final"]["accuracy_difference"] >= 0)
    return out


# ---------------------------------------------------------------------------------------------------- output
def _f(v: float | None, digits: int = 4) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _hit_cell(h: dict[str, Any] | None) -> str:
    return f"{h['time']:.1f} s / {h['iteration']} it." if h else "not reached"


def _level_sentence(level: dict[str, Any]) -> str:
    hits = level["hits"]
    cavi = f"CAVI {hits[level['fastest_cavi']]['time']:.1f} s" if level["fastest_cavi"] else "CAVI: not reached"
    base = f"Adam {hits[level['fastest_baseline']]['time']:.1f} s" if level["fastest_baseline"] else "Adam: not reached"
    ratio = f" (**{level['speedup_wall']:.1f}×**)" if level["speedup_wall"] else ""
    return f"{level['accuracy']:.4f} (best − {level['gap']:.3f}): {cavi} vs {base}{ratio}"


def write_markdown(path: Path, result: dict[str, Any]) -> None:
    runs, s, cfg, m = result["runs"], result["summary"], result["config"], result["machine"]
    t = s["targets"]
    headers = [
        "method", "link", f"to baseline's best acc. ({t['baseline_best']:.4f})", f"to equal acc. ({t['equal']:.4f})",
        "final acc.", "final NLL", "mean conf.", "ECE", "best acc. (tracked)", "ms / it.", "run: its, s, stop", "θ",
    ]
    rows = []
    for r in runs:
        f = r["final"]
        theta = r.get("class_scales")
        rows.append([
            r["name"], r["link"], _hit_cell(r["hits"]["baseline_best"]), _hit_cell(r["hits"]["equal"]),
            _f(f["accuracy"]), _f(f["test_nll"]), _f(f["mean_confidence"]), _f(f["ece"]), _f(r["best_accuracy"]),
            f"{1e3 * r['median_step_time']:.0f}",
            f"{r['trace']['iteration'][-1]}, {r['total_time']:.1f}, {r['stop_reason']}",
            "[" + ", ".join(f"{v:.2f}" for v in theta) + "]" if theta else "—",
        ])

    def speed(key: str) -> str:
        e = s["speedups"][key]
        if "wall" not in e:
            who = "no CAVI run" if e["cavi"] is None else "no baseline run"
            return f"not measurable: {who} reached it"
        return (
            f"{e['wall']:.1f}× in wall time ({e['cavi']}: {e['cavi_time']:.1f} s vs {e['baseline']}: "
            f"{e['baseline_time']:.1f} s; {e['cpu']:.1f}× in CPU time, {e['iterations_x_cost']:.1f}× as "
            "iterations × "
            "median time per iteration)"
        )

    fin = s["final"]
    quick_note = " — QUICK smoke run, not a result" if cfg["quick"] else ""
    lines = [
        f"# Multi-class classification on KEEL `satimage`{quick_note}",
        "",
        f"Generated by `python benchmarks/multiclass.py{' --quick' if cfg['quick'] else ''}` ({m['date_utc']}, whole "
        f"script {result['wall_time_total']:.0f} s). Issue 5, item 7.",
        "",
        f"N_train = {cfg['n_train']}, N_test = {cfg['n_test']}, D = {cfg['num_features']}, K = {cfg['num_classes']} "
        f"classes, M = {cfg['num_inducing']} fixed k-means inducing points shared by every method and latent, "
        f"{cfg['dtype']}, {cfg['threads']} torch thread, all methods run round-robin (one step of each in turn). "
        "Kernel ScaleKernel(RBF-ARD) + ConstantMean per latent GP, hyper-parameters frozen and identical for every "
        "method (chosen by the baseline's own procedure, see below).",
        "",
        common.markdown_table(headers, rows),
        f"* **Time to the baseline's best test accuracy** ({t['baseline_best']:.4f}, the issue's target): "
        f"{speed('baseline_best')}.",
        f"* **Time to equal accuracy** ({t['equal']:.4f} = the lower of the best accuracies reached by the two "
        f"families, i.e. an accuracy both reach): {speed('equal')}.",
        f"* **Time to accuracy levels** below the baseline's best (fastest run of each family, wall time): "
        + "; ".join(_level_sentence(level) for level in s["accuracy_levels"]) + ".",
        f"* **Final**: best CAVI run ({fin['best_cavi']}) minus best baseline ({fin['best_baseline']}): accuracy "
        f"{fin['accuracy_difference']:+.4f}, test NLL {fin['nll_difference']:+.4f} nats.",
        f"* Issue target (≥ 10× faster to the baseline's best accuracy, at equal or better final accuracy): "
        f"**{'met' if s['issue_target_met'] else 'NOT met'}**.",
        "",
        "## Calibration (final predictive, reliability per confidence bin)",
        "",
    ]
    for r in runs:
        rel = r["final"]["reliability"]
        cells = ", ".join(
            f"{b['bin'][0]:.1f}–{b['bin'][1]:.1f}: acc {b['accuracy']:.2f} / conf {b['confidence']:.2f} "
            f"(n={b['count']})"
            for b in rel
        )
        lines.append(f"* {r['name']}: {cells}")
    lines += ["", "## Reading", ""] + [f"* {p}" for p in result["reading"]] + [
        "",
        "## How this was measured",
        "",
        "* Times are each method's own clock (training steps only; evaluation excluded). 'to … acc.' is the first "
        "tracked evaluation at or above the target accuracy. Tracking uses 512 fixed normal draws per test point "
        "(the same draws for every method); the final columns use 2^14 scrambled-Sobol points. NLL = mean negative log "
        "predictive probability of the test labels; mean conf. = mean max-probability; ECE over 10 equal-width bins.",
        f"* Stopping: a run stops when its best tracked test NLL improved by ≤ {cfg['stopping']['min_improvement']} "
        f"over the last {cfg['stopping']['patience']} evaluations spanning ≥ "
        f"{cfg['stopping']['min_window_iterations']} iterations ('plateau'), at {cfg['stopping']['max_iter']} "
        f"iterations, or after {cfg['stopping']['max_time']:.0f} s "
        "of its own clock.",
        f"* Hyper-parameters: {result['hyperparameters']['procedure']}.",
        f"* Machine: {m['cpu_count']} cores shared with other jobs; load average at start "
        f"{[round(v, 1) for v in m['load_average_start']]}, at end {[round(v, 1) for v in m['load_average_end']]}; "
        f"torch {m['torch']}, gpytorch {m['gpytorch']}. Absolute times vary with the load; compare the ratios.",
        "",
        "![test accuracy and NLL vs time](multiclass.png)",
        "",
    ]
    common.write_text(path, "\n".join(lines))


def reading(result: dict[str, Any]) -> list[str]:
    """Plain-language observations computed from the numbers (under-confidence, class scales)."""
    runs = {r["name"]: r for r in result["runs"]}
    out = []
    for r in result["runs"]:
        f = r["final"]
        gap = f["accuracy"] - f["mean_confidence"]
        out.append(
            f"{r['name']} ({r['link']}): accuracy {f['accuracy']:.4f} vs mean confidence {f['mean_confidence']:.4f} "
            f"({'under' if gap > 0 else 'over'}-confident by {abs(gap):.3f}), ECE {f['ece']:.3f}, "
            f"NLL {f['test_nll']:.4f}."
        )
    for base, scaled in [("CAVI", "CAVI + class scales"), ("CAVI bijective", "CAVI bijective + class scales")]:
        if base in runs and scaled in runs:
            a, b = runs[base]["final"], runs[scaled]["final"]
            out.append(
                f"Class scales, {base} → {scaled}: NLL {a['test_nll']:.4f} → {b['test_nll']:.4f}, "
                f"ECE {a['ece']:.3f} → "
                f"{b['ece']:.3f}, mean confidence {a['mean_confidence']:.3f} → {b['mean_confidence']:.3f}, accuracy "
                f"{a['accuracy']:.4f} → {b['accuracy']:.4f}."
            )
    return out


def plot(path: Path, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for i, r in enumerate(result["runs"]):
        tr = r["trace"]
        metrics = zip(tr["time"], tr["metrics"]["test_error"], tr["metrics"]["test_nll"])
        pts = [(t, 1 - e, v) for t, e, v in metrics if t > 0]
        if not pts:
            continue
        ts, acc, nll = zip(*pts)
        style = "-" if r["engine"] == "cavi" else "--"
        axes[0].plot(ts, acc, style, color=f"C{i}", label=r["name"], lw=1.5)
        axes[1].plot(ts, nll, style, color=f"C{i}", label=r["name"], lw=1.5)
    t = result["summary"]["targets"]
    axes[0].axhline(t["baseline_best"], color="k", lw=0.8, ls="--", label="baseline's best accuracy")
    axes[0].set_ylim(t["baseline_best"] - 0.06, t["baseline_best"] + 0.01)
    axes[0].set_ylabel("test accuracy (tracked)")
    axes[1].set_ylabel("test NLL [nats / point] (tracked)")
    axes[1].set_ylim(0.25, 1.0)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("wall time of training steps [s] (log scale)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    cfg = result["config"]
    fig.suptitle(
        f"KEEL satimage, N={cfg['n_train']}, K={cfg['num_classes']}, M={cfg['num_inducing']}, fixed hyper-parameters"
        + (" — QUICK smoke run" if cfg["quick"] else "")
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="subsampled smoke run (< 2 min)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for every method (default 1)")
    p.add_argument("--max-time", type=float, default=None, help="cap on each run's own clock [s]")
    p.add_argument("--out", type=Path, default=None, help="output directory (default results/, --quick: a temp dir)")
    p.add_argument("--render", type=Path, default=None, help="only re-render the summary of a saved multiclass.json")
    return p.parse_args(argv)


def render(json_path: Path) -> None:
    """Recompute the summary and rewrite the Markdown and the plot from a saved ``multiclass.json``."""
    import json

    result = json.loads(Path(json_path).read_text())
    result["summary"] = summarise(result["runs"])
    result["reading"] = reading(result)
    out = Path(json_path).parent
    common.write_json(out / "multiclass.json", result)
    write_markdown(out / "multiclass.md", result)
    plot(out / "multiclass.png", result)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.render is not None:
        render(args.render)
        return {}
    start_all = time.perf_counter()
    common.configure_torch(args.threads)
    machine = common.machine_info()
    quick = args.quick
    data = load_keel("satimage", seed=0, max_train=800 if quick else None)
    x, y, x_test, y_test = data.x_train, data.y_train, data.x_test, data.y_test
    if quick:  # a seeded subset of the test set too: the tracking evaluations dominate a smoke run
        keep = torch.randperm(x_test.shape[0], generator=torch.Generator().manual_seed(0))[:400]
        x_test, y_test = x_test[keep], y_test[keep]
    K = data.num_classes
    M = 30 if quick else 100
    Z = common.kmeans_inducing_points(x, M, seed=0)
    hypers = choose_hyperparameters(x, y, Z, K, subset=min(2000, x.shape[0]), iterations=40 if quick else 300)
    print(f"hyper-parameters chosen in {hypers['fit_seconds']:.1f} s", flush=True)
    rule = common.StoppingRule(
        patience=20, min_improvement=5e-4, min_window_iterations=50, max_iter=5000,
        max_time=args.max_time or (15.0 if quick else 300.0),
    )
    schedule = common.EvalSchedule(dense_until=60, every=5, sparse_from=1000, sparse_every=10)
    eps = torch.randn(TRACKING_DRAWS, 1, K, generator=torch.Generator().manual_seed(1))
    specs = default_methods(quick)
    for spec in specs:  # untimed warm-up on throw-away models (first-call allocations)
        warm = build(spec, x, y, Z, K, hypers)
        for _ in range(2):
            warm.step()
    built = {spec.name: build(spec, x, y, Z, K, hypers) for spec in specs}
    methods = {name: (b.step, make_evaluator(b, x_test, y_test, eps)) for name, b in built.items()}

    def on_done(name: str, trace: common.Trace) -> None:
        print(f"{name}: {trace.num_iterations} its, {trace.total_time:.1f} s, {trace.stop_reason}", flush=True)

    load_start = machine["load_average_1_5_15_min"]
    traces = common.run_interleaved(methods, "test_nll", rule, schedule, on_done=on_done)
    runs = []
    for spec in specs:
        b, trace = built[spec.name], traces[spec.name]
        run = {
            **asdict(spec), "link": spec.link, "trace": trace.to_dict(), "total_time": trace.total_time,
            "median_step_time": trace.median_step_time(), "stop_reason": trace.stop_reason,
            "final": final_metrics(b, x_test, y_test),
        }
        if spec.engine == "cavi":
            run["class_scales"] = b.likelihood.class_scales.detach().tolist()
        runs.append(run)
    summary = summarise(runs)
    machine["load_average_start"] = load_start
    machine["load_average_end"] = common.machine_info()["load_average_1_5_15_min"]
    config = {
        "quick": quick, "n_train": int(x.shape[0]), "n_test": int(x_test.shape[0]), "num_features": int(x.shape[1]),
        "num_classes": K, "num_inducing": M, "threads": args.threads, "dtype": str(torch.get_default_dtype()),
        "stopping": asdict(rule), "schedule": asdict(schedule), "tracking_draws": TRACKING_DRAWS,
    }
    result = {
        "config": config, "machine": machine, "hyperparameters": hypers, "runs": runs, "summary": summary,
        "wall_time_total": time.perf_counter() - start_all,
    }
    result["reading"] = reading(result)
    out = args.out or (QUICK_DIR if quick else common.RESULTS_DIR)
    common.write_json(out / "multiclass.json", result)
    write_markdown(out / "multiclass.md", result)
    plot(out / "multiclass.png", result)
    print(f"wrote {out / 'multiclass.md'}", flush=True)
    return result


if __name__ == "__main__":
    main()
