r"""The Magic-Telescope study of Galy-Fajou's thesis (2023): sparse sampling (VI-Gibbs, α in :data:`ALPHAS`) against
VI-HMC (:class:`VIHMC`, fixed and dual-averaged step), standard VI (L-BFGS) and augmented VI (CAVI) on KEEL ``magic``,
k-fold cross-validation, fixed hyper-parameters and inducing inputs, every method round-robin for the same budget on
its own clock; targets per fold against CAVI's level (:func:`fold_targets`); an exact-posterior quality reference.
Set-up, targets and how to read ``results/sparse_sampling.{json,md,png}``: ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402
import _report  # noqa: E402

from gpytorch_augment import (  # noqa: E402
    CAVI,
    BernoulliLogitLikelihood,
    CAVIVariationalStrategy,
    GibbsSampler,
    kmeans_plus_plus,
)
from gpytorch_augment.datasets import load_keel  # noqa: E402

#: the declared grids and settings (fixed before any run)
ALPHAS = (0.0, 0.5, 1.0)
NUM_INDUCING = 50
TOLERANCE = 1e-3
HMC_STEP, HMC_LEAPFROG = 0.1, 10
HMC_ADAPT, HMC_TARGET_ACCEPT = 50, 0.65  # dual-averaging window (iterations) and target of the adapted VI-HMC row
GH_NODES = 20
HYPERS = {"outputscale": 2.0, "mean_constant": 0.0}
SUBSET = 2000
HMC_ROWS = ["VI-HMC", "VI-HMC (dual avg.)"]
METHODS = [f"VI-Gibbs α={a:g}" for a in ALPHAS] + HMC_ROWS + ["Std. VI (L-BFGS)", "Aug. VI (CAVI)"]


# ---------------------------------------------------------------------------------------------------- data
def load_magic() -> tuple[Tensor, Tensor]:
    """All 19,020 points of KEEL ``magic``, raw features (standardised per fold later), labels in {0, 1}."""
    data = load_keel("magic", test_fraction=0.1, standardize=False)
    return torch.cat([data.x_train, data.x_test]), torch.cat([data.y_train, data.y_test])


def folds(n: int, k: int, seed: int) -> list[Tensor]:
    """``k`` disjoint test index sets of a seeded permutation of ``range(n)``."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return list(perm.chunk(k))


def split(x: Tensor, y: Tensor, test_idx: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Train/test split, features standardised with the training mean and sd."""
    mask = torch.ones(x.shape[0], dtype=torch.bool)
    mask[test_idx] = False
    mean, sd = x[mask].mean(0), x[mask].std(0).clamp_min(1e-12)
    return (x[mask] - mean) / sd, y[mask], (x[test_idx] - mean) / sd, y[test_idx]


def hypers_for(x_train: Tensor) -> dict[str, Any]:
    return {**HYPERS, "lengthscale": common.median_heuristic_lengthscales(x_train).tolist()}


# ---------------------------------------------------------------------------------------------------- predictive
def gauss_hermite(n: int = GH_NODES) -> tuple[Tensor, Tensor]:
    """Nodes and weights of :math:`E_{\\mathcal N(0,1)} g(\\xi) \\approx \\sum_k w_k g(\\xi_k)`."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(n)
    return torch.as_tensor(nodes), torch.as_tensor(weights / math.sqrt(2 * math.pi))


class SparseTerms:
    """The whitened sparse prior at training and test inputs: :math:`u = \\mu_Z + Lv`, :math:`f_i \\mid v \\sim
    \\mathcal N(\\mu_i + a_i^\\top v, d_i)`."""

    def __init__(self, model: Any, Z: Tensor, x: Tensor, x_test: Tensor, jitter: float = 1e-6) -> None:
        with torch.no_grad():
            zz = model.forward(Z)
            L = torch.linalg.cholesky(zz.covariance_matrix + jitter * torch.eye(Z.shape[0]))
            self.mu_Z = zz.mean
            self.A, self.mu, self.d = self._at(model, Z, L, x)
            self.A_test, self.mu_test, self.d_test = self._at(model, Z, L, x_test)
        self.L = L

    @staticmethod
    def _at(model: Any, Z: Tensor, L: Tensor, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        K_zx = model.covar_module(Z, x).to_dense()
        A = torch.linalg.solve_triangular(L, K_zx, upper=False)
        k_diag = model.covar_module(x, diag=True)
        return A, model.mean_module(x), (k_diag - A.pow(2).sum(0)).clamp_min(0)

    def v_of_u(self, u: Tensor) -> Tensor:
        return torch.linalg.solve_triangular(self.L, (u - self.mu_Z).unsqueeze(-1), upper=False).squeeze(-1)

    def test_probs(self, v: Tensor) -> Tensor:
        r""":math:`p(y_* = 1 \mid v) = E_{\mathcal N(m_*, d_*)}\sigma(f_*)` by Gauss–Hermite, per draw ``(S, N*)``."""
        nodes, weights = gauss_hermite()
        m = self.mu_test + v @ self.A_test
        f = m.unsqueeze(-1) + self.d_test.sqrt().unsqueeze(-1) * nodes
        return (torch.sigmoid(f) * weights).sum(-1)


class DrawPredictive:
    """``evaluate()`` of a sampler: the test NLL and error of the average of :math:`p(y_* \\mid v^{(s)})` over the
    last half of the draws so far (draws are converted to probabilities lazily, untimed)."""

    def __init__(self, terms: SparseTerms, y_test: Tensor) -> None:
        self.terms, self.y_test = terms, y_test
        self.pending: list[Tensor] = []  # v draws not yet converted
        self.probs: list[Tensor] = []

    def __call__(self) -> dict[str, float]:
        if self.pending:
            self.probs.extend(self.terms.test_probs(torch.stack(self.pending)).unbind(0))
            self.pending.clear()
        if not self.probs:
            return {"test_nll": float("inf"), "test_error": 1.0}
        p = torch.stack(self.probs[len(self.probs) // 2 :]).mean(0)
        return {"test_nll": common.bernoulli_nll(p, self.y_test), "test_error": common.error_rate(p, self.y_test)}


# ---------------------------------------------------------------------------------------------------- methods
def vi_gibbs(model: Any, x: Tensor, y: Tensor, Z: Tensor, terms: SparseTerms, y_test: Tensor, alpha: float, seed: int):
    """VI-Gibbs: one ``GibbsSampler.sweep`` per step from a prior draw (u ~ p(u), f ~ p(f|u))."""
    sampler = GibbsSampler(model, BernoulliLogitLikelihood(), x, y, inducing_points=Z, alpha=alpha)
    g = torch.Generator().manual_seed(seed)
    v0 = torch.randn(Z.shape[0], generator=g)
    state = {"f": terms.mu + v0 @ terms.A + terms.d.sqrt() * torch.randn(x.shape[0], generator=g)}
    predictive = DrawPredictive(terms, y_test)
    predictive.pending.append(v0)  # the starting point is the first "draw" (iteration 0)

    def step() -> None:
        new = sampler.sweep(state["f"], generator=g)
        state["f"] = new.f
        predictive.pending.append(terms.v_of_u(new.u[0]))

    return common.MethodSpec(f"VI-Gibbs α={alpha:g}", step, predictive, {"alpha": alpha, "chains": 1})


class VIHMC:
    r"""HMC on the whitened inducing values of Hensman et al. (2015): potential
    :math:`U(v) = \tfrac12\lVert v\rVert^2 - \sum_i\sum_k w_k \log\sigma\big(s_i(\mu_i + a_i^\top v +
    \sqrt{d_i}\,\xi_k)\big)`, gradient :math:`v - A\big(\sum_k w_k s_i\sigma(-s_i f_{ik})\big)_i`; leapfrog with
    identity mass, Metropolis correction. With ``adapt > 0`` the step size follows Hoffman & Gelman's dual
    averaging for the first ``adapt`` iterations (target acceptance :data:`HMC_TARGET_ACCEPT`) and is then frozen at
    its averaged value."""

    def __init__(
        self, terms: SparseTerms, y: Tensor, step: float, leapfrog: int, generator: torch.Generator, adapt: int = 0
    ):
        self.terms, self.s = terms, 2 * y - 1
        self.nodes, self.weights = gauss_hermite()
        self.eps, self.n_leap, self.g = step, leapfrog, generator
        self.v = torch.randn(terms.A.shape[0], generator=generator)
        self.u_and_grad = self.potential(self.v)
        self.accepted = self.proposed = 0
        self.adapt = adapt
        self._mu, self._h_bar, self._log_eps_bar = math.log(10 * step), 0.0, 0.0

    def _adapt_step_size(self, accept_prob: float) -> None:
        """One dual-averaging update (gamma 0.05, t0 10, kappa 0.75), while ``proposed <= adapt``."""
        t = self.proposed
        if t > self.adapt:
            return
        eta = 1.0 / (t + 10)
        self._h_bar = (1 - eta) * self._h_bar + eta * (HMC_TARGET_ACCEPT - accept_prob)
        log_eps = self._mu - math.sqrt(t) / 0.05 * self._h_bar
        w = t**-0.75
        self._log_eps_bar = w * log_eps + (1 - w) * self._log_eps_bar
        self.eps = math.exp(self._log_eps_bar if t == self.adapt else log_eps)

    def potential(self, v: Tensor) -> tuple[Tensor, Tensor]:
        t = self.terms
        f = (t.mu + v @ t.A).unsqueeze(-1) + t.d.sqrt().unsqueeze(-1) * self.nodes  # (N, K)
        sf = self.s.unsqueeze(-1) * f
        loglik = (torch.nn.functional.logsigmoid(sf) * self.weights).sum()
        dm = ((torch.sigmoid(-sf) * self.weights).sum(-1)) * self.s
        return 0.5 * v.dot(v) - loglik, v - t.A @ dm

    def step(self) -> Tensor:
        v, (U0, grad) = self.v, self.u_and_grad
        p0 = torch.randn(v.shape, generator=self.g)
        p = p0 - 0.5 * self.eps * grad
        x = v.clone()
        for i in range(self.n_leap):
            x = x + self.eps * p
            U, grad = self.potential(x)
            if i < self.n_leap - 1:
                p = p - self.eps * grad
        p = p - 0.5 * self.eps * grad
        log_accept = (U0 + 0.5 * p0.dot(p0)) - (U + 0.5 * p.dot(p))
        self.proposed += 1
        if bool(torch.log(torch.rand((), generator=self.g)) < log_accept):
            self.v, self.u_and_grad = x, (U, grad)
            self.accepted += 1
        if self.adapt:
            self._adapt_step_size(float(torch.nan_to_num(log_accept, nan=-math.inf).clamp(max=0).exp()))
        return self.v


def vi_hmc(terms: SparseTerms, y: Tensor, y_test: Tensor, seed: int, adapt: int = 0):
    hmc = VIHMC(terms, y, HMC_STEP, HMC_LEAPFROG, torch.Generator().manual_seed(seed), adapt=adapt)
    predictive = DrawPredictive(terms, y_test)
    predictive.pending.append(hmc.v)  # the starting point is the first "draw" (iteration 0)

    def step() -> None:
        predictive.pending.append(hmc.step())

    def evaluate() -> dict[str, float]:
        return {**predictive(), "acceptance": hmc.accepted / max(hmc.proposed, 1)}

    name, settings = HMC_ROWS[bool(adapt)], {"step_size": HMC_STEP, "leapfrog": HMC_LEAPFROG, "adapt": adapt}
    return common.MethodSpec(name, step, evaluate, settings), hmc


def std_vi(Z: Tensor, hypers: dict[str, Any], x: Tensor, y: Tensor, x_test: Tensor, y_test: Tensor):
    """GPyTorch SVGP, q(u) by L-BFGS on the true ELBO (hyper-parameters frozen)."""
    import gpytorch

    model = common.SparseGP(Z, hypers=hypers)
    likelihood = BernoulliLogitLikelihood()
    elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=y.numel())
    opt = torch.optim.LBFGS(list(model.variational_parameters()), lr=1.0, max_iter=1, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad(set_to_none=True)
        loss = -elbo(model(x), y)
        loss.backward()
        return loss

    return common.MethodSpec(
        "Std. VI (L-BFGS)", lambda: opt.step(closure), common.binary_evaluator(model, likelihood, x_test, y_test)
    )


def aug_vi(Z: Tensor, hypers: dict[str, Any], x: Tensor, y: Tensor, x_test: Tensor, y_test: Tensor):
    model = common.SparseGP(Z, strategy_cls=CAVIVariationalStrategy, hypers=hypers)
    likelihood = BernoulliLogitLikelihood()
    cavi = CAVI(model, likelihood, num_data=y.numel())
    return common.MethodSpec(
        "Aug. VI (CAVI)", lambda: cavi.step(x, y), common.binary_evaluator(model, likelihood, x_test, y_test)
    )


# ---------------------------------------------------------------------------------------------------- one fold
def fold_methods(x, y, x_test, y_test, seed: int) -> tuple[list[common.MethodSpec], list[VIHMC], dict[str, Any]]:
    """Every method of one fold on the same Z and hyper-parameters."""
    hypers = hypers_for(x)
    Z = kmeans_plus_plus(x, NUM_INDUCING, torch.Generator().manual_seed(seed), num_iters=10)
    prior = common.SparseGP(Z, hypers=hypers)  # only its forward (the prior) is used by the samplers
    terms = SparseTerms(prior, Z, x, x_test)
    methods = [vi_gibbs(prior, x, y, Z, terms, y_test, a, seed + i) for i, a in enumerate(ALPHAS)]
    hmc_rows = [vi_hmc(terms, y, y_test, seed + 10, adapt) for adapt in (0, HMC_ADAPT)]
    methods += [spec for spec, _ in hmc_rows]
    methods += [std_vi(Z, hypers, x, y, x_test, y_test), aug_vi(Z, hypers, x, y, x_test, y_test)]
    return methods, [hmc for _, hmc in hmc_rows], hypers


def fold_targets(traces: dict[str, common.Trace]) -> dict[str, Any]:
    """The three targets (``benchmarks/README.md``), for every VI-Gibbs α, from one fold's traces."""
    cavi = traces["Aug. VI (CAVI)"]
    level = cavi.metrics["test_nll"][-1] + TOLERANCE
    cavi_hit = common.time_to_target(cavi, "test_nll", level)
    # the faster VI-HMC row (a lower bound, its whole run time, where neither reaches the level)
    hmc_hits = [common.time_to_target(traces[name], "test_nll", level) for name in HMC_ROWS]
    hmc_hit = min((h for h in hmc_hits if h), key=lambda h: h.time, default=None)
    out = {"cavi_final_nll": cavi.metrics["test_nll"][-1], "cavi_time": cavi_hit.time}
    for a in ALPHAS:
        trace = traces[f"VI-Gibbs α={a:g}"]
        hit = common.time_to_target(trace, "test_nll", level)
        hmc_time = hmc_hit.time if hmc_hit else min(traces[name].total_time for name in HMC_ROWS)
        out[f"alpha={a:g}"] = {
            "time": hit.time if hit else None,
            "time_over_cavi": hit.time / cavi_hit.time if hit else None,
            "final_minus_cavi": trace.metrics["test_nll"][-1] - cavi.metrics["test_nll"][-1],
            "hmc_over_gibbs": hmc_time / hit.time if hit else None,
            "hmc_ratio_is_lower_bound": hmc_hit is None,
        }
    return out


def run_fold(x, y, x_test, y_test, seed: int, rule: common.StoppingRule) -> dict[str, Any]:
    methods, hmcs, hypers = fold_methods(x, y, x_test, y_test, seed)
    traces = common.run_interleaved(
        methods,
        "test_nll",
        rule,
        schedule=common.EvalSchedule(dense_until=60, every=5, sparse_from=400, sparse_every=20),
    )
    for name, trace in traces.items():
        common.print_run(name, trace, f"NLL {trace.metrics['test_nll'][-1]:.4f}  ", indent="  ")
    return {
        "hypers": hypers,
        "hmc_acceptance": {name: h.accepted / max(h.proposed, 1) for name, h in zip(HMC_ROWS, hmcs)},
        "hmc_step_size": {name: h.eps for name, h in zip(HMC_ROWS, hmcs)},
        "runs": {
            name: {**common.run_summary(t, ("test_nll", "test_error")), "trace": t.to_dict()}
            for name, t in traces.items()
        },
        "targets": fold_targets(traces),
    }


# ---------------------------------------------------------------------------------------------------- exact reference
def exact_reference(x, y, x_test, y_test, seed: int, sweeps: int) -> dict[str, Any]:
    """On a 2,000-point training subset: the exact sampler's predictive against CAVI and VI-Gibbs on the same Z."""
    idx = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))[:SUBSET]
    xs, ys = x[idx], y[idx]
    hypers = hypers_for(x)
    Z = kmeans_plus_plus(xs, NUM_INDUCING, torch.Generator().manual_seed(seed), num_iters=10)
    prior = common.SparseGP(Z, hypers=hypers)
    likelihood = BernoulliLogitLikelihood()
    out: dict[str, Any] = {"num_train": int(xs.shape[0]), "sweeps": sweeps}
    start = time.perf_counter()
    exact = GibbsSampler(prior, likelihood, xs, ys).sample(sweeps, warmup=sweeps // 4, seed=seed, progress=False)
    p = exact.predict(x_test).y_probs
    out["Exact Gibbs (N³)"] = _metrics(p, y_test, time.perf_counter() - start)
    terms = SparseTerms(prior, Z, xs, x_test)
    for a in ALPHAS:
        start = time.perf_counter()
        s = GibbsSampler(prior, likelihood, xs, ys, inducing_points=Z, alpha=a)
        draws = s.sample(sweeps, warmup=sweeps // 4, seed=seed, progress=False)
        p = terms.test_probs(terms.v_of_u(draws.u[0])).mean(0)
        out[f"VI-Gibbs α={a:g}"] = _metrics(p, y_test, time.perf_counter() - start)
    start = time.perf_counter()
    model = common.SparseGP(Z, strategy_cls=CAVIVariationalStrategy, hypers=hypers)
    CAVI(model, likelihood, num_data=SUBSET).fit(xs, ys, max_iter=200, tol=1e-9)
    out["Aug. VI (CAVI)"] = {
        **common.binary_evaluator(model, likelihood, x_test, y_test)(),
        "seconds": time.perf_counter() - start,
    }
    return out


def _metrics(p: Tensor, y: Tensor, seconds: float) -> dict[str, float]:
    return {"test_nll": common.bernoulli_nll(p, y), "test_error": common.error_rate(p, y), "seconds": seconds}


# ---------------------------------------------------------------------------------------------------- output
def mean_sd(values: list[float | None], spec: str = ".4f") -> str | None:
    """``"mean ± sd"`` (sd with ``ddof=1``, 0 for one value) of the values that are not ``None``; ``None`` (an
    empty cell) where there are none.

    >>> mean_sd([1.0, 2.0, None], ".2f"), mean_sd([3.0], ".1f"), mean_sd([None])
    ('1.50 ± 0.71', '3.0 ± 0.0', None)
    """
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if v.size == 0:
        return None
    return f"{v.mean():{spec}} ± {v.std(ddof=1) if v.size > 1 else 0.0:{spec}}"


def _count(flags: list[bool]) -> str:
    return f"{sum(flags)}/{len(flags)}"


def report(result: dict[str, Any]) -> tuple[str, dict[str, Any], list[_report.Table]]:
    """Title, settings and tables of a result record (what :func:`_report.write_report` renders)."""
    fs, cfg = result["folds"], result["config"]
    tol, hmc = cfg["tolerance"], cfg.get("hmc", {})
    methods = [m for m in METHODS if all(m in f["runs"] for f in fs)]
    hmc_rows = [m for m in HMC_ROWS if all(m in f.get("hmc_acceptance", {}) for f in fs)]
    alphas = [a for a in cfg.get("alphas", ALPHAS) if all(f"alpha={a:g}" in f["targets"] for f in fs)]
    title = f"Sparse sampling on KEEL magic ({len(fs)}-fold CV, M = {cfg['num_inducing']})" + (
        " (quick smoke run)" if cfg.get("quick") else ""
    )
    settings = {
        "command": f"python benchmarks/sparse_sampling.py{' --quick' if cfg.get('quick') else ''}",
        "data": cfg["data"],
        "inducing points": f"M = {cfg['num_inducing']}, k-means++ of each fold's training inputs, fixed",
        "hyper-parameters (fixed)": cfg.get("hypers_rule"),
        "budget per method and fold (s)": cfg["max_time"],
        "execution": "one torch thread, round-robin, each method on its own clock (evaluation excluded)",
        "summary over folds": "mean ± sd (sd with ddof 1)",
        "tolerance τ (nats)": tol,
        "VI-HMC step size, leapfrog steps": f"{hmc.get('step_size')}, {hmc.get('leapfrog')}",
        "VI-HMC (dual avg.) adaptation: iterations, target acceptance": (
            f"{hmc['adapt']}, {hmc['target_accept']}" if "adapt" in hmc else None  # not recorded before
        ),
        "Gauss–Hermite nodes": cfg.get("gauss_hermite_nodes"),
        "seed": cfg.get("seed"),
        **_report.machine_settings(result["machine"]),
    }
    rows = []
    for name in methods:
        runs = [f["runs"][name] for f in fs]
        rows.append([
            name,
            mean_sd([r["final_test_nll"] for r in runs]),
            mean_sd([r["final_test_error"] for r in runs]),
            mean_sd([r["trace"]["iteration"][-1] for r in runs], ".0f"),
            mean_sd([1e3 * r["median_step_time"] for r in runs], ".1f"),
        ])  # fmt: skip
    tables = [
        _report.Table("Runs (mean ± sd over folds)",
                      ["method", "final test NLL", "final test error", "iterations", "ms / iteration"], rows),
    ]  # fmt: skip
    if hmc_rows:
        tables.append(_report.Table(
            "VI-HMC samplers (mean ± sd over folds)", ["method", "acceptance rate", "final step size"],
            [[name, mean_sd([f["hmc_acceptance"][name] for f in fs], ".3f"),
              mean_sd([f["hmc_step_size"][name] for f in fs], ".4f")] for name in hmc_rows],
        ))  # fmt: skip
    tables.append(_report.Table(
        "Targets: CAVI's level (mean ± sd over folds)",
        ["CAVI's converged test NLL", f"CAVI's time to it (+{tol:g} nats) [s]"],
        [[mean_sd([f["targets"]["cavi_final_nll"] for f in fs]),
          mean_sd([f["targets"]["cavi_time"] for f in fs], ".3f")]],
    ))  # fmt: skip
    rows = []
    for a in alphas:
        t = [f["targets"][f"alpha={a:g}"] for f in fs]
        rows.append([
            f"VI-Gibbs α={a:g}",
            _count([x["time"] is not None for x in t]),
            mean_sd([x["time_over_cavi"] for x in t], ".2f"),
            _count([x["time_over_cavi"] is not None and x["time_over_cavi"] <= 2 for x in t]),
            mean_sd([x["final_minus_cavi"] for x in t]),
            _count([x["final_minus_cavi"] <= tol for x in t]),
            mean_sd([x["hmc_over_gibbs"] for x in t], ".1f"),
            _count([x["hmc_ratio_is_lower_bound"] for x in t]),
            _count([x["hmc_over_gibbs"] is not None and x["hmc_over_gibbs"] >= 10 for x in t]),
        ])  # fmt: skip
    tables.append(_report.Table(
        "Targets per VI-Gibbs α (folds meeting each; ratios mean ± sd over the folds that reach CAVI's level)",
        ["method", "reaches CAVI NLL", "time / CAVI time", "≤ 2×", "final − CAVI (nats)", "no worse (≤ τ)",
         "VI-HMC time / its time", "folds where that is a lower bound", "≥ 10×"], rows,
    ))  # fmt: skip
    ref = result.get("exact_reference")
    if ref:
        names = [k for k in ref if isinstance(ref[k], dict)]
        tables.append(_report.Table(
            f"Quality reference ({ref['num_train']} training points of fold 1, {ref['sweeps']} sweeps, same test set)",
            ["method", "test NLL", "test error", "seconds"],
            [[k, ref[k]["test_nll"], ref[k]["test_error"], ref[k]["seconds"]] for k in names],
        ))  # fmt: skip
    return title, settings, tables


def plot(path: Path, result: dict[str, Any]) -> None:
    """Test NLL and error against wall time, mean ± sd over folds (each trace held at its last value)."""
    fig, axes = common.new_figure(2, (11, 4))
    cap = result["config"]["max_time"]
    grid = np.logspace(-2.5, math.log10(cap), 80)
    for name in METHODS:
        for ax, metric in zip(axes, ("test_nll", "test_error")):
            curves = []
            for f in result["folds"]:
                tr = f["runs"][name]["trace"]
                t, v = np.asarray(tr["time"]), np.asarray(tr["metrics"][metric], dtype=float)
                idx = np.searchsorted(t, grid, side="right") - 1
                curves.append(np.where(idx >= 0, v[np.clip(idx, 0, None)], np.nan))
            c = np.asarray(curves)
            m, s = np.nanmean(c, 0), np.nanstd(c, 0)
            ax.plot(grid, m, label=name)
            ax.fill_between(grid, m - s, m + s, alpha=0.2)
    for ax, label in zip(axes, ("test NLL", "test error")):
        ax.set_xscale("log")
        ax.set_xlabel("wall time [s] (own clock, one thread)")
        ax.set_ylabel(label)
    axes[0].set_ylim(None, min(0.7, axes[0].get_ylim()[1]))
    axes[1].set_ylim(None, min(0.35, axes[1].get_ylim()[1]))
    axes[0].legend(fontsize=8)
    common.save_figure(fig, path)


# ---------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.run_arguments(p, "2 folds of a 4,000-point subsample, 3 s per method (< 2 min)", caps=True)
    p.add_argument("--folds", type=int, default=None, help="folds (default 10, or 2 with --quick)")
    p.add_argument("--no-reference", action="store_true", help="skip the exact-posterior reference")
    return p.parse_args(argv)


def study(
    quick: bool,
    seed: int = 0,
    num_folds: int | None = None,
    max_time: float | None = None,
    reference: bool = True,
    max_points: int | None = None,
) -> dict[str, Any]:
    """The whole study; returns the result record (rendered by :func:`report`)."""
    machine = common.start_run(1, seed)
    x, y = load_magic()
    if max_points is None and quick:
        max_points = 4000
    if max_points is not None:
        keep = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))[:max_points]
        x, y = x[keep], y[keep]
    num_folds = num_folds or (2 if quick else 10)
    max_time = max_time or (3.0 if quick else 6.0)
    rule = common.StoppingRule(patience=10**9, max_iter=10**9, max_time=max_time)
    test_sets = folds(x.shape[0], 10 if num_folds <= 10 else num_folds, seed)[:num_folds]
    result: dict[str, Any] = {"folds": []}
    for k, test_idx in enumerate(test_sets):
        print(f"fold {k + 1}/{num_folds}", flush=True)
        result["folds"].append(run_fold(*split(x, y, test_idx), seed + 100 * k, rule))
    if reference:
        sweeps = 40 if quick else 150
        result["exact_reference"] = exact_reference(*split(x, y, test_sets[0]), seed, sweeps)
    result["config"] = {
        "data": f"KEEL magic, {x.shape[0]} points, folds of a seeded permutation (test = one tenth each)"
        + (f", the first {num_folds} of 10" if num_folds < 10 else ""),
        "max_time": max_time,
        "num_inducing": NUM_INDUCING,
        "alphas": ALPHAS,
        "tolerance": TOLERANCE,
        "hmc": {
            "step_size": HMC_STEP,
            "leapfrog": HMC_LEAPFROG,
            "adapt": HMC_ADAPT,
            "target_accept": HMC_TARGET_ACCEPT,
        },
        "gauss_hermite_nodes": GH_NODES,
        "hypers_rule": "outputscale 2, mean 0, ARD median-heuristic lengthscales of the fold's training inputs",
        "seed": seed,
        "quick": quick,
    }
    result["machine"] = common.close_machine_info(machine)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    result = study(args.quick, args.seed, args.folds, args.max_time, not args.no_reference)
    out = common.output_dir(args.output_dir, args.quick)
    _report.write_report(out, "sparse_sampling", result, *report(result), figure=plot)
    return result


if __name__ == "__main__":
    main()
