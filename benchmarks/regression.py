r"""Robust GP regression on MASS ``Boston``: closed-form CAVI with a Student-t likelihood (ν = 4, σ fixed) against
GPyTorch's ``StudentTLikelihood`` SVGP trained by Adam, every method on the same frozen kernel (chosen by GPyTorch
alone, :func:`choose_hyperparameters`); only q(u) is optimised. An informative row learns σ; ``--no-sensitivity``
skips the second comparison at the moment-matched σ. What is measured and how to read it: ``benchmarks/README.md``.
:func:`load_boston` and :func:`choose_hyperparameters` are also used by ``sampling.py``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import _report  # noqa: E402
import gpytorch  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from gpytorch_augment import CAVI, CAVIVariationalStrategy, GPPrior, StudentTLikelihood  # noqa: E402
from gpytorch_augment.datasets import load_rdataset  # noqa: E402
from gpytorch_augment.likelihoods.student_t import StudentTPredictive  # noqa: E402

#: test NLL tolerance (nats) defining "reached the target"
TOLERANCE = 0.005
#: degrees of freedom of the Student-t likelihood, fixed for every method (GPyTorch's constraint needs nu > 2)
DF = 4.0


# ---------------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class RegressionData:
    """A split of a regression data set, standardised with training statistics (``y_mean``, ``y_std`` undo the
    target's: an NLL in original units is the standardised NLL plus ``log(y_std)``)."""

    name: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    feature_names: list[str]
    y_mean: float
    y_std: float
    split: str


def load_boston(test_fraction: float = 0.2, seed: int = 0, max_train: int | None = None) -> RegressionData:
    """MASS ``Boston`` (506 tracts, 13 features, target ``medv``): :func:`_common.standardised_split` (``max_train``
    keeps the first training points of the permutation, for smoke runs)."""
    frame = load_rdataset("MASS", "Boston")
    names = [c for c in frame.columns if c not in ("rownames", "medv")]
    d = common.standardised_split(frame[names].to_numpy(dtype=np.float64), frame["medv"].to_numpy(dtype=np.float64),
                                  seed, True, test_fraction, max_train)  # fmt: skip
    split = (f"numpy.random.RandomState({seed}).permutation(506): first {len(d['yt'])} test, the other {len(d['y'])} "
             f"training{' (truncated by max_train)' if max_train is not None else ''}; features and medv standardised "
             "with training statistics")  # fmt: skip
    return RegressionData("MASS Boston", d["x"], d["y"], d["xt"], d["yt"], names, d["y_mean"], d["y_std"], split)


# ---------------------------------------------------------------------------------------------------- model
def gp_prior(hypers: dict[str, Any]) -> GPPrior:
    """The prior GP(c, s² k_RBF-ARD) at the fixed ``hypers`` (:func:`_common.set_hyperparameters`), for the samplers."""
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=len(hypers["lengthscale"])))
    prior = GPPrior(gpytorch.means.ConstantMean(), kernel)
    common.set_hyperparameters(prior, hypers)
    return prior


class _ExactGaussianGP(gpytorch.models.ExactGP):
    def __init__(self, x: Tensor, y: Tensor, likelihood: gpytorch.likelihoods.GaussianLikelihood) -> None:
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=x.size(-1)))

    def forward(self, x: Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def choose_hyperparameters(
    data: RegressionData,
    Z: Tensor,
    iterations: int = 200,
    lr: float = 0.1,
    scale_iterations: int = 400,
    scale_lr: float = 0.05,
    df: float = DF,
) -> dict[str, Any]:
    r"""The fixed procedure that picks the frozen hyper-parameters (the same for every method and for
    ``sampling.py``); it uses GPyTorch's own machinery only, none of this package's.

    1. Kernel and mean: an exact GP with a Gaussian likelihood (``ConstantMean`` + ``ScaleKernel(RBF-ARD)``) fitted
       to all training points by maximising the exact marginal likelihood with Adam (``lr``, ``iterations`` steps,
       Cholesky), from lengthscales :math:`\sqrt D`, outputscale 1, mean 0, noise 1 (not the median heuristic,
       which is 0 for the binary feature ``chas`` and would pin that lengthscale at 0).
    2. The Student-t scale: GPyTorch's SVGP (``VariationalStrategy`` + ``CholeskyVariationalDistribution``, the
       inducing inputs ``Z``, the kernel of step 1 frozen) with GPyTorch's ``StudentTLikelihood`` (``deg_free`` =
       ``df`` fixed), Adam (``scale_lr``, ``scale_iterations`` steps) on q(u) and the noise, from the
       moment-matched scale :math:`\sigma_{\mathcal N}\sqrt{(\nu-2)/\nu}` (same variance as the Gaussian
       noise). The moment-matched value is recorded too.
    """
    x, y = data.x_train, data.y_train
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = _ExactGaussianGP(x, y, likelihood)
    model.covar_module.base_kernel.lengthscale = math.sqrt(x.shape[-1])
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    step = common.gradient_step(lambda: -mll(model(x), y), torch.optim.Adam(model.parameters(), lr=lr))
    start = time.perf_counter()
    model.train()
    with gpytorch.settings.max_cholesky_size(100_000):
        for _ in range(iterations):
            step()
        with torch.no_grad():
            final = float(-mll(model(x), y))
    noise = float(likelihood.noise.detach())
    hypers: dict[str, Any] = {
        "lengthscale": model.covar_module.base_kernel.lengthscale.detach().reshape(-1).tolist(),
        "outputscale": float(model.covar_module.outputscale.detach()),
        "mean_constant": float(model.mean_module.constant.detach()),
        "gaussian_noise_variance": noise,
        "exact_gaussian_neg_mll_per_datum": final,
        "df": df,
        "scale_moment_matched": math.sqrt(noise * (df - 2) / df),
    }

    svgp = common.SparseGP(
        Z, gpytorch.variational.CholeskyVariationalDistribution, gpytorch.variational.VariationalStrategy, hypers
    )
    student = gpytorch.likelihoods.StudentTLikelihood()
    student.deg_free = df
    student.noise = hypers["scale_moment_matched"] ** 2
    elbo = gpytorch.mlls.VariationalELBO(student, svgp, num_data=y.numel())
    optimizer = torch.optim.Adam([*svgp.variational_parameters(), student.raw_noise], lr=scale_lr)
    step = common.gradient_step(lambda: -elbo(svgp(x), y), optimizer)
    for _ in range(scale_iterations):
        step()
    hypers["scale"] = float(student.noise.detach().sqrt())
    hypers["procedure"] = (
        f"kernel and mean: exact GP with a Gaussian likelihood on all {x.shape[0]} training points, Adam lr={lr} "
        f"for {iterations} steps on the exact marginal likelihood (Cholesky) from lengthscales sqrt(D), outputscale "
        f"1, mean 0, noise 1; Student-t nu = {df:g} fixed; sigma: GPyTorch SVGP (M = {Z.shape[0]} fixed Z, the "
        f"kernel frozen) with GPyTorch's StudentTLikelihood, Adam lr={scale_lr} for {scale_iterations} steps on "
        f"q(u) and the noise, from the moment-matched sigma_gauss * sqrt((nu - 2) / nu) = "
        f"{hypers['scale_moment_matched']:.4f}; everything then frozen"
    )
    hypers["fit_seconds"] = time.perf_counter() - start
    return hypers


def check_gpytorch_parametrisation(df: float, scale: float, seed: int = 0) -> dict[str, float]:
    r"""Compare log-densities: GPyTorch's ``StudentTLikelihood(deg_free=nu, noise=sigma^2)``, ours with
    ``(df=nu, scale=sigma)`` and SciPy's ``t.logpdf(y, nu, loc=f, scale=sigma)`` at random ``(y, f)``.

    Also GPyTorch's with ``noise = sigma`` (the other possible reading), which must disagree; raises if the
    ``noise = sigma^2`` reading does not match to 1e-10.
    """
    from scipy import stats

    gen = torch.Generator().manual_seed(seed)
    f = 2 * torch.randn(200, generator=gen, dtype=torch.float64)
    y = f + 3 * scale * torch.randn(200, generator=gen, dtype=torch.float64) ** 3

    def gpytorch_logp(noise: float) -> Tensor:
        lik = gpytorch.likelihoods.StudentTLikelihood().to(torch.float64)
        lik.deg_free, lik.noise = df, noise
        with torch.no_grad():
            return lik(f).log_prob(y)

    ours = StudentTLikelihood(df=df, scale=scale).to(torch.float64)
    with torch.no_grad():
        logp_ours = ours.log_prob_at(y, f)
    logp_scipy = torch.as_tensor(stats.t.logpdf(y.numpy(), df, loc=f.numpy(), scale=scale))
    squared = gpytorch_logp(scale**2)
    out = {
        "max_abs_diff_gpytorch_noise_sigma2_vs_ours": float((squared - logp_ours).abs().max()),
        "max_abs_diff_gpytorch_noise_sigma2_vs_scipy": float((squared - logp_scipy).abs().max()),
        "max_abs_diff_ours_vs_scipy": float((logp_ours - logp_scipy).abs().max()),
        "max_abs_diff_gpytorch_noise_sigma_vs_scipy": float((gpytorch_logp(scale) - logp_scipy).abs().max()),
    }
    if out["max_abs_diff_gpytorch_noise_sigma2_vs_scipy"] > 1e-10 or out["max_abs_diff_ours_vs_scipy"] > 1e-10:
        raise RuntimeError(f"Student-t parametrisations disagree: {out}")
    return out


# ---------------------------------------------------------------------------------------------------- methods
@dataclass
class MethodConfig:
    """The settings of one method of the comparison."""

    name: str
    engine: str  # "cavi" | "adam"
    lr: float | None = None
    learn_scale: bool = False  # CAVI only: closed-form sigma update (informative row)

    @property
    def compared(self) -> bool:
        """Whether the run is part of the speed comparison (same fixed model as every other compared run)."""
        return not self.learn_scale


def default_methods() -> list[MethodConfig]:
    return [
        MethodConfig("CAVI", "cavi"),
        MethodConfig("SVGP+Adam lr=0.1", "adam", 0.1),
        MethodConfig("SVGP+Adam lr=0.01", "adam", 0.01),
        MethodConfig("CAVI, learns σ (informative)", "cavi", learn_scale=True),
    ]


def build(
    spec: MethodConfig, x: Tensor, y: Tensor, Z: Tensor, hypers: dict[str, Any]
) -> tuple[common.SparseGP, gpytorch.likelihoods.Likelihood, Callable[[], Any]]:
    """The model, its likelihood and a ``step()`` closure doing one full-batch training iteration."""
    num_data = y.numel()
    if spec.engine == "cavi":
        natural = gpytorch.variational.NaturalVariationalDistribution
        model = common.SparseGP(Z, natural, CAVIVariationalStrategy, hypers)
        likelihood = StudentTLikelihood(df=hypers["df"], scale=hypers["scale"], learn_scale=spec.learn_scale)
        model.train()
        likelihood.train()
        cavi = CAVI(model, likelihood, num_data=num_data)

        def step() -> Any:
            return cavi.step(x, y)

        return model, likelihood, step
    if spec.engine != "adam":
        raise ValueError(f"unknown engine {spec.engine!r}")
    model = common.SparseGP(
        Z, gpytorch.variational.CholeskyVariationalDistribution, gpytorch.variational.VariationalStrategy, hypers
    )
    likelihood = gpytorch.likelihoods.StudentTLikelihood()
    likelihood.deg_free = hypers["df"]
    likelihood.noise = hypers["scale"] ** 2  # GPyTorch's noise is the squared scale
    likelihood.requires_grad_(False)
    model.train()
    likelihood.train()
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=num_data)
    optimizer = torch.optim.Adam(list(model.variational_parameters()), lr=spec.lr)
    return model, likelihood, common.gradient_step(lambda: -mll(model(x), y), optimizer)


def likelihood_scale(likelihood: gpytorch.likelihoods.Likelihood) -> Tensor:
    """:math:`\\sigma` of either Student-t likelihood."""
    if isinstance(likelihood, StudentTLikelihood):
        return likelihood.scale.detach()
    return likelihood.noise.detach().sqrt()


def make_evaluator(
    model: common.SparseGP, likelihood: gpytorch.likelihoods.Likelihood, x_test: Tensor, y_test: Tensor, df: float
) -> Callable[[], dict[str, float]]:
    r"""Test NLL (standardised units) and RMSE of the predictive mean, for every method by the same code.

    The predictive density is the exact :math:`\int t_\nu(y_*\mid f_*, \sigma)\,\mathcal N(f_*\mid m_*, s_*)\,df_*`
    (``StudentTPredictive``, ~1e-13 relative error) with the method's own :math:`q(f_*)` in eval mode and its own
    :math:`\sigma` — not GPyTorch's Monte-Carlo ``marginal``, which is noisy.
    """

    def evaluate() -> dict[str, float]:
        model.eval()
        with torch.no_grad():
            q = model(x_test)
            mean, var = q.mean, q.variance
            scale = likelihood_scale(likelihood)
            nll = -StudentTPredictive(torch.as_tensor(df, dtype=mean.dtype), mean, var, scale).log_prob(y_test).mean()
        model.train()
        return {
            "test_nll": float(nll),
            "test_rmse": float((mean - y_test).pow(2).mean().sqrt()),
            "scale": float(scale.reshape(-1)[0]),
        }

    return evaluate


@torch.no_grad()
def true_elbo(
    model: common.SparseGP, likelihood: gpytorch.likelihoods.Likelihood, x: Tensor, y: Tensor, df: float
) -> float:
    r"""The true (non-augmented) ELBO per datum of the final q(u), the same code for every method:
    ``VariationalELBO`` with our ``StudentTLikelihood`` at the run's own :math:`\sigma`, whose ``expected_log_prob``
    is accurate to ~1e-12 (GPyTorch's own is 20-point Gauss--Hermite)."""
    reference = StudentTLikelihood(df=df, scale=likelihood_scale(likelihood).reshape(-1)[0], learn_scale=False)
    model.train()
    return float(gpytorch.mlls.VariationalELBO(reference, model, num_data=y.numel())(model(x), y))


# ---------------------------------------------------------------------------------------------------- analysis
#: the two readings of "time to converged test NLL" (see :func:`summarise`)
READINGS = {
    "literal": "first evaluation with test NLL <= (best test NLL of any compared run at any evaluation) + tolerance",
    "settled": "first evaluation from which the test NLL stays <= (best FINAL test NLL of the compared runs) + "
    "tolerance until the end of the run",
}


def _ratios(r: dict[str, Any], c: dict[str, Any], reading: str) -> dict[str, Any]:
    """Baseline ``r`` over CAVI ``c`` under ``reading``: :func:`_common.speedup` with the baseline's name."""
    return {"baseline": r["name"], **common.speedup(r, r["hits"][reading], c, c["hits"][reading])}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Targets, times to target under both :data:`READINGS`, and CAVI's speed-ups (per-run ``hits`` are added to
    ``runs``).

    *literal* (the brief's definition): target = best test NLL reached by any compared (fixed-sigma) run at any
    evaluation + TOLERANCE; a run's time is its first evaluation at or below it. A transient dip of a non-monotone
    optimiser (Adam) sets the target and counts as reaching it. *settled*: target = best *final* test NLL of the
    compared runs (where they end up) + TOLERANCE; a run's time is the first evaluation from which it stays at or
    below the target. The learned-sigma row (a different model) is measured against its own best / final value.
    """
    compared = [r for r in runs if r["compared"]]
    targets = {
        "literal": min(r["best_test_nll"] for r in compared) + TOLERANCE,
        "settled": min(r["final_test_nll"] for r in compared) + TOLERANCE,
    }
    for r in runs:
        trace = common.Trace.from_dict(r["trace"])
        r["hits"] = {}
        for reading, target in targets.items():
            if not r["compared"]:
                target = (r["best_test_nll"] if reading == "literal" else r["final_test_nll"]) + TOLERANCE
            if reading == "literal":
                hit = common.time_to_target(trace, "test_nll", target)
            else:
                hit = common.time_to_settle(trace, "test_nll", target)
            r["hits"][reading] = {"target": target, **asdict(hit)} if hit else None
    summary: dict[str, Any] = {
        "tolerance_nats": TOLERANCE,
        "readings": READINGS,
        "best_test_nll_any_evaluation": targets["literal"] - TOLERANCE,
        "best_final_test_nll": targets["settled"] - TOLERANCE,
        "targets": targets,
        "speedups": {},
        "issue_target_speedup_ge_20": {},
    }
    cavi = next((r for r in compared if r["engine"] == "cavi"), None)
    adam = [r for r in compared if r["engine"] == "adam"]
    for reading in READINGS:
        if cavi is None or cavi["hits"][reading] is None or not adam:
            summary["speedups"][reading] = None
            summary["issue_target_speedup_ge_20"][reading] = False
            continue
        candidates = [_ratios(r, cavi, reading) for r in adam]
        reached = [x for x in candidates if not x["is_lower_bound"]]
        best = min(reached or candidates, key=lambda x: x["wall"])
        summary["speedups"][reading] = best
        summary["issue_target_speedup_ge_20"][reading] = bool(best["wall"] >= 20)
    if cavi is not None and adam:
        summary["cavi_final_nll_minus_best_adam_final_nll"] = cavi["final_test_nll"] - min(
            r["final_test_nll"] for r in adam
        )
    return summary


# ---------------------------------------------------------------------------------------------------- output
def _hit_cells(r: dict[str, Any], reading: str, speedup: dict[str, Any] | None) -> list[str]:
    h = r["hits"][reading]
    time_cell = f"{h['time']:.3f}" if h else f"not reached ({r['total_time']:.1f})"
    if h and not r["compared"]:
        time_cell += " (own)"
    sp = "—"
    if speedup is not None and r["engine"] == "adam":
        lb = speedup["is_lower_bound"]
        sp = common.format_ratio(speedup["wall"], lb)
    return [time_cell, str(h["iteration"]) if h else "—", sp]


def _table(title: str, runs: list[dict[str, Any]], y_std: float) -> _report.Table:
    headers = [
        "method",
        "σ",
        "literal: time to target [s]",
        "its",
        "CAVI speed-up",
        "settled: time to target [s]",
        "its",
        "CAVI speed-up",
        "final test NLL",
        "best test NLL",
        "final true ELBO / datum",
        "final RMSE (std. / $1000)",
        "ms / it",
        "run: its, s, stop",
    ]
    cavi = next((r for r in runs if r["compared"] and r["engine"] == "cavi"), None)
    rows = []
    for r in runs:
        cells = [r["name"], f"{r['final_scale']:.4f}" + (" (learned)" if r["learn_scale"] else "")]
        for reading in READINGS:
            sp = _ratios(r, cavi, reading) if cavi and cavi["hits"][reading] and r["engine"] == "adam" else None
            cells += _hit_cells(r, reading, sp)
        cells += [
            f"{r['final_test_nll']:.4f}",
            f"{r['best_test_nll']:.4f}",
            f"{r['final_true_elbo_per_datum']:.4f}",
            f"{r['final_test_rmse']:.4f} / {r['final_test_rmse'] * y_std:.3f}",
            f"{1e3 * r['median_step_time']:.1f}",
            f"{r['trace']['iteration'][-1]}, {r['total_time']:.1f}, {r['stop_reason']}",
        ]
        rows.append(cells)
    return _report.Table(title, headers, rows)


def _speedup_table(title: str, block: dict[str, Any]) -> _report.Table:
    s = block["summary"]
    rows = []
    for reading in READINGS:
        sp = s["speedups"][reading]
        rows.append([
            reading, s["targets"][reading], sp["baseline"] if sp else None, sp["wall"] if sp else None,
            sp["cpu"] if sp else None, sp["iterations_x_cost"] if sp else None, sp["is_lower_bound"] if sp else None,
            s["issue_target_speedup_ge_20"][reading],
        ])  # fmt: skip
    columns = ["reading", "target test NLL", "fastest SVGP + Adam", "speed-up (wall)", "speed-up (CPU)",
               "speed-up (iterations × cost)", "lower bound", "≥ 20×"]  # fmt: skip
    return _report.Table(title, columns, rows)


def report(result: dict[str, Any]) -> tuple[str, dict[str, Any], list[_report.Table]]:
    """Title, settings and tables of a result record (what :func:`_report.write_report` renders)."""
    cfg, hyp = result["config"], result["hyperparameters"]
    title = "Student-t GP regression on MASS Boston" + (" (quick smoke run)" if cfg["quick"] else "")
    settings = {
        "command": f"python benchmarks/regression.py{' --quick' if cfg['quick'] else ''}",
        "N train / N test / D": f"{cfg['n_train']} / {cfg['n_test']} / {cfg['num_features']}",
        "inducing points": f"M = {cfg['num_inducing']}, {cfg['inducing_points']}",
        "split": cfg["split"],
        "Student-t ν, σ (fixed)": f"{hyp['df']:g}, {hyp['scale']:.4f}",
        "kernel": f"ScaleKernel(RBF-ARD) + ConstantMean, frozen ({hyp['procedure']})",
        "tolerance (nats)": TOLERANCE,
        "stopping": common.rule_settings(cfg["stopping"]),
        "evaluations": common.schedule_settings(cfg["schedule"]),
        **{f"GPyTorch StudentT check: {k}": v for k, v in result["parametrisation_check"].items()},
        "whole script (s)": result["wall_time_total"],
        **_report.machine_settings(result["machine"]),
    }
    tables = [
        _table(f"Runs, σ = {result['main']['scale']:.4f}", result["main"]["runs"], cfg["y_std"]),
        _speedup_table("CAVI against the fastest SVGP + Adam", result["main"]),
    ]
    sens = result.get("sensitivity")
    if sens:
        tables += [
            _table(f"Runs, σ = {sens['scale']:.4f} (moment-matched)", sens["runs"], cfg["y_std"]),
            _speedup_table(f"CAVI against the fastest SVGP + Adam, σ = {sens['scale']:.4f}", sens),
        ]
    return title, settings, tables


def plot(path: Path, result: dict[str, Any]) -> None:
    blocks = [("main", result["main"], result["hyperparameters"]["scale"])]
    if result.get("sensitivity"):
        blocks.append(("sensitivity", result["sensitivity"], result["sensitivity"]["scale"]))
    fig, axes = common.new_figure(len(blocks), (6.5 * len(blocks), 4.5), squeeze=False)
    styles = {"CAVI": ("C3", "-"), "SVGP+Adam lr=0.1": ("C2", "-"), "SVGP+Adam lr=0.01": ("C2", "--")}
    for ax, (label, block, scale) in zip(axes[0], blocks):
        s = block["summary"]
        for r in block["runs"]:
            color, ls = styles.get(r["name"], ("C1", ":"))
            pts = common.timed_points(r["trace"], "test_nll")
            if not pts:
                continue
            ts, vs = zip(*pts)
            ax.plot(ts, vs, ls, color=color, label=r["name"], lw=1.5)
            h = r["hits"]["settled"]
            if h and r["compared"]:
                ax.plot([h["time"]], [h["target"]], "o", ms=5, color=color)
        ax.axhline(s["targets"]["literal"], color="k", lw=0.8, ls=":", label="literal target")
        ax.axhline(s["targets"]["settled"], color="k", lw=0.8, ls="--", label="settled target (dots: settled)")
        lo = min(min(r["trace"]["metrics"]["test_nll"]) for r in block["runs"])
        ax.set_ylim(lo - 0.01, s["best_final_test_nll"] + 0.15)
        ax.set_xscale("log")
        ax.set_xlabel("wall time of training steps [s] (log scale)")
        ax.set_ylabel("test NLL [nats / point, standardised medv]")
        ax.set_title(f"{'main' if label == 'main' else 'sensitivity'}: σ = {scale:.4f}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    cfg = result["config"]
    fig.suptitle(
        f"Boston, Student-t (ν={result['hyperparameters']['df']:g}), N={cfg['n_train']}, M={cfg['num_inducing']}, "
        f"{cfg['threads']} thread(s)" + (" — QUICK smoke run" if cfg["quick"] else "")
    )
    common.save_figure(fig, path)


# ---------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.run_arguments(p, quick_help="smoke run (< 1 min)")
    p.add_argument("--no-sensitivity", action="store_true", help="skip the second comparison at the moment-matched σ")
    return p.parse_args(argv)


def compare(
    specs: list[MethodConfig],
    data: RegressionData,
    Z: Tensor,
    hypers: dict[str, Any],
    rule: common.StoppingRule,
    schedule: common.EvalSchedule,
    seed: int,
) -> dict[str, Any]:
    """Run ``specs`` round-robin on the same data, Z and hyper-parameters; the runs and their summary."""
    x, y = data.x_train, data.y_train
    common.warm_up(build(spec, x, y, Z, hypers)[2] for spec in specs)
    methods, built = [], {}
    for spec in specs:
        torch.manual_seed(seed)
        model, likelihood, step = build(spec, x, y, Z, hypers)
        built[spec.name] = (model, likelihood)
        evaluate = make_evaluator(model, likelihood, data.x_test, data.y_test, hypers["df"])
        methods.append(common.MethodSpec(spec.name, step, evaluate, {**asdict(spec), "compared": spec.compared}))

    def report(name: str, trace: common.Trace) -> None:
        nll, last = trace.metrics["test_nll"], {key: values[-1] for key, values in trace.metrics.items()}
        details = (
            f"final NLL {nll[-1]:.5f}  best {min(nll):.5f}  RMSE {last['test_rmse']:.4f}  sigma {last['scale']:.4f}  "
        )
        common.print_run(name, trace, details, width=30, indent="  ")

    started = time.perf_counter()
    traces = common.run_interleaved(methods, "test_nll", rule, schedule, on_done=report)
    runs = []
    for method in methods:
        trace = traces[method.name]
        runs.append(
            {
                **method.settings,
                **common.run_summary(trace, final=("test_nll", "test_rmse", "scale")),
                "final_true_elbo_per_datum": true_elbo(*built[method.name], x, y, hypers["df"]),
                "trace": trace.to_dict(),
            }
        )
    return {
        "scale": hypers["scale"],
        "runs": runs,
        "summary": summarise(runs),
        "wall_time_including_evaluation": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    wall_start = time.perf_counter()
    machine = common.start_run(args.threads, args.seed)

    data = load_boston(test_fraction=0.2, seed=args.seed)
    if args.quick:
        num_inducing, hyper_iters, scale_iters = 30, 40, 60
        rule = common.StoppingRule(
            patience=10, min_improvement=1e-4, min_window_iterations=50, max_iter=400, max_time=3.0
        )
        schedule = common.EvalSchedule(dense_until=50, every=5, sparse_from=200, sparse_every=10)
    else:
        num_inducing, hyper_iters, scale_iters = 100, 200, 400
        rule = common.StoppingRule(
            patience=20, min_improvement=1e-4, min_window_iterations=500, max_iter=20_000, max_time=90.0
        )
        schedule = common.EvalSchedule(dense_until=100, every=5, sparse_from=1000, sparse_every=10)
    rule.capped(args.max_time, args.max_iter)
    x = data.x_train
    print(f"Boston: train {tuple(x.shape)}, test {tuple(data.x_test.shape)}, threads {torch.get_num_threads()}",
          flush=True)

    Z = common.kmeans_inducing_points(x, num_inducing, seed=args.seed)
    hypers = choose_hyperparameters(data, Z, iterations=hyper_iters, scale_iterations=scale_iters)
    print(
        f"hyper-parameters ({hypers['fit_seconds']:.1f} s): outputscale {hypers['outputscale']:.4f}, mean "
        f"{hypers['mean_constant']:.4f}, lengthscale {[round(v, 3) for v in hypers['lengthscale']]}, Gaussian noise "
        f"{hypers['gaussian_noise_variance']:.4f}; Student-t nu {hypers['df']:g}, sigma {hypers['scale']:.4f} "
        f"(moment-matched {hypers['scale_moment_matched']:.4f})",
        flush=True,
    )
    check = check_gpytorch_parametrisation(hypers["df"], hypers["scale"], seed=args.seed)
    print(f"parametrisation check: {check}", flush=True)

    print(f"main comparison, sigma = {hypers['scale']:.4f}", flush=True)
    main_block = compare(default_methods(), data, Z, hypers, rule, schedule, args.seed)
    sensitivity = None
    if not args.quick and not args.no_sensitivity:
        sens_hypers = {**hypers, "scale": hypers["scale_moment_matched"]}
        print(f"sensitivity, sigma = {sens_hypers['scale']:.4f}", flush=True)
        specs = [s for s in default_methods() if s.compared]
        sensitivity = compare(specs, data, Z, sens_hypers, rule, schedule, args.seed)

    common.close_machine_info(machine)
    result = {
        "benchmark": "regression",
        "config": {
            "dataset": data.name,
            "split": data.split,
            "quick": args.quick,
            "n_train": int(x.shape[0]),
            "n_test": int(data.x_test.shape[0]),
            "num_features": int(x.shape[1]),
            "features": data.feature_names,
            "y_mean": data.y_mean,
            "y_std": data.y_std,
            "num_inducing": num_inducing,
            **common.run_config(rule, schedule, args.seed, TOLERANCE),
        },
        "hyperparameters": hypers,
        "parametrisation_check": check,
        "machine": machine,
        "main": main_block,
        "sensitivity": sensitivity,
        "wall_time_total": time.perf_counter() - wall_start,
    }
    title, settings, tables = report(result)
    out = common.output_dir(args.output_dir, args.quick)
    _report.write_report(out, "regression", result, title, settings, tables, figure=plot)
    return result


if __name__ == "__main__":
    main()
