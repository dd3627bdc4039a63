r"""Preference learning: ``PairwiseAugmentedGP`` (its default exact path: CAVI on the Pólya-Gamma tilts) against
BoTorch's ``PairwiseGP`` (Laplace, probit and logit links, ``fit_gpytorch_mll``), every model learning its kernel, on
three synthetic utilities: cold fits at m comparisons of ``m // 4 + 10`` points and BO-loop refits along
:data:`LOOP_SIZES` (warm starts), the methods interleaved on the same data. Held out: log-loss, accuracy, 90%
coverage of the true differences; for m ≤ 200 the exact posterior (Gibbs) as reference. Grid, protocols and how to
read ``results/preference.{json,md}``: ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import _report  # noqa: E402
import gpytorch  # noqa: E402
import torch  # noqa: E402
from botorch.fit import fit_gpytorch_mll  # noqa: E402
from botorch.models.likelihoods.pairwise import PairwiseLogitLikelihood as BoTorchLogit  # noqa: E402
from botorch.models.likelihoods.pairwise import PairwiseProbitLikelihood  # noqa: E402
from botorch.models.pairwise_gp import PairwiseGP, PairwiseLaplaceMarginalLogLikelihood  # noqa: E402
from torch import Tensor  # noqa: E402

from gpytorch_augment import GibbsSampler, GPPrior, PairwiseLogitLikelihood  # noqa: E402
from gpytorch_augment._numerics import gauss_hermite  # noqa: E402
from gpytorch_augment.preference import PairwiseAugmentedGP  # noqa: E402

Z90 = 1.6448536269514722


def _branin(x: Tensor) -> Tensor:
    a, b = 15 * x[..., 0] - 5, 15 * x[..., 1]
    value = (b - 5.1 / (4 * math.pi**2) * a**2 + 5 / math.pi * a - 6) ** 2 + 10 * (1 - 1 / (8 * math.pi)) * torch.cos(a)
    return -(value - 54.3) / 51.9 * 2  # standardised over the square, times 2


UTILITIES: dict[str, Callable[[Tensor], Tensor]] = {
    "quadratic": lambda x: -10 * ((x - 0.6) ** 2).sum(-1),
    "sines": lambda x: 2 * torch.sin(6 * x[..., 0]) * torch.cos(4 * x[..., 1]),
    "branin": _branin,
}


def comparisons_of(u: Tensor, m: int, generator: torch.Generator) -> Tensor:
    """``m`` random pairs of different points with the winner drawn from the logit model, winner first."""
    n = u.shape[-1]
    first = torch.randint(0, n, (m,), generator=generator)
    second = (first + torch.randint(1, n, (m,), generator=generator)) % n
    pairs = torch.stack([first, second], -1)
    wins = torch.bernoulli(torch.sigmoid(u[first] - u[second]), generator=generator).bool()
    return torch.where(wins.unsqueeze(-1), pairs, pairs.flip(-1))


def difference_moments(
    posterior_mvn: gpytorch.distributions.MultivariateNormal, pairs: Tensor
) -> tuple[Tensor, Tensor]:
    """Mean and sd of f(a) - f(b) for each held-out pair under a joint Gaussian over the test points."""
    mean = posterior_mvn.mean.reshape(-1)
    cov = posterior_mvn.covariance_matrix.reshape(mean.shape[-1], -1)
    a, b = pairs[:, 0], pairs[:, 1]
    var = cov[a, a] + cov[b, b] - 2 * cov[a, b]
    return mean[a] - mean[b], var.clamp_min(1e-12).sqrt()


def metrics(mean: Tensor, sd: Tensor, truth: Tensor, probit: bool) -> dict[str, float]:
    """Held-out log-loss and accuracy of the predictive p(first wins), and the 90% coverage of the true difference
    (on the logit scale; a probit latent is rescaled by 1.7 for the coverage only)."""
    if probit:
        p = torch.distributions.Normal(0.0, 1.0).cdf(mean / (1 + sd**2).sqrt())
        mean, sd = 1.7 * mean, 1.7 * sd
    else:  # E sigma(g) by Gauss-Hermite
        nodes, weights = gauss_hermite(mean, sd**2, 40)
        p = (weights * torch.sigmoid(nodes)).sum(0)
    return {"p": p, "coverage": float(((truth - mean).abs() <= Z90 * sd).double().mean())}


def _scores(p: Tensor, outcomes: Tensor) -> dict[str, float]:
    p = p.clamp(1e-12, 1 - 1e-12)
    log_loss = -(outcomes * p.log() + (1 - outcomes) * (1 - p).log()).mean()
    return {"log_loss": float(log_loss), "accuracy": float(((p > 0.5).double() == outcomes).double().mean())}


def fit_augmented(X: Tensor, comparisons: Tensor) -> tuple[Any, float]:
    start = time.perf_counter()
    model = PairwiseAugmentedGP(X, comparisons)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit()
    return model, time.perf_counter() - start


def fit_pairwise_gp(X: Tensor, comparisons: Tensor, link: str) -> tuple[Any, float]:
    start = time.perf_counter()
    likelihood = PairwiseProbitLikelihood() if link == "probit" else BoTorchLogit()
    model = PairwiseGP(X, comparisons, likelihood=likelihood)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_gpytorch_mll(PairwiseLaplaceMarginalLogLikelihood(model.likelihood, model))
    return model, time.perf_counter() - start


def gibbs_reference(model: PairwiseAugmentedGP, X_test: Tensor, pairs: Tensor, seed: int) -> tuple[Tensor, Tensor]:
    """Posterior mean and sd of the held-out differences under the exact posterior at the augmented model's kernel
    (Gibbs on the training points, then the GP conditional at the test points)."""
    kernel = model.covar_module
    prior = GPPrior(gpytorch.means.ZeroMean(), kernel)
    labels = torch.ones(model.comparisons.shape[0], dtype=X_test.dtype)
    sampler = GibbsSampler(prior, PairwiseLogitLikelihood(), model.datapoints, labels, comparisons=model.comparisons)
    samples = sampler.sample(500, warmup=200, num_chains=4, seed=seed, progress=False)
    draws = samples.predict(X_test).f_draws.reshape(-1, X_test.shape[0])
    g = draws[:, pairs[:, 0]] - draws[:, pairs[:, 1]]
    return g.mean(0), g.std(0)


def warm_up() -> None:
    """One fit of each method on a 20-comparison problem (its time is not recorded)."""
    generator = torch.Generator().manual_seed(99)
    X = torch.rand(15, 2, generator=generator, dtype=torch.float64)
    comparisons = comparisons_of(UTILITIES["quadratic"](X), 20, generator)
    fit_augmented(X, comparisons)
    for link in ("probit", "logit"):
        fit_pairwise_gp(X, comparisons, link)


def run_one(name: str, m: int, seed: int, with_gibbs: bool, index: int = 0) -> list[dict[str, Any]]:
    utility = UTILITIES[name]
    generator = torch.Generator().manual_seed(seed)
    n = m // 4 + 10
    X = torch.rand(n, 2, generator=generator, dtype=torch.float64)
    comparisons = comparisons_of(utility(X), m, generator)
    X_test, pairs, truth, outcomes = held_out(utility, generator)
    rows = []
    fitted = {}
    for method in ("augmented (CAVI)", "PairwiseGP probit", "PairwiseGP logit"):
        if method.startswith("augmented"):
            model, seconds = fit_augmented(X, comparisons)
        else:
            model, seconds = fit_pairwise_gp(X, comparisons, method.split()[-1])
        fitted[method] = model
        with torch.no_grad():
            mean, sd = difference_moments(model.posterior(X_test).distribution, pairs)
        result = metrics(mean, sd, truth, probit=method.endswith("probit"))
        rows.append({"utility": name, "m": m, "n": n, "seed": index, "method": method, "fit_s": seconds,
                     **_scores(result["p"], outcomes), "coverage90": result["coverage"], "mean_err_sd": None,
                     "_moments": (mean, sd)})  # fmt: skip
    if with_gibbs:
        g_mean, g_sd = gibbs_reference(fitted["augmented (CAVI)"], X_test, pairs, seed)
        p = metrics(g_mean, g_sd, truth, probit=False)
        rows.append({"utility": name, "m": m, "n": n, "seed": index, "method": "exact Gibbs (reference)",
                     "fit_s": None,
                     **_scores(p["p"], outcomes), "coverage90": p["coverage"], "mean_err_sd": 0.0})  # fmt: skip
        for row in rows[:-1]:
            mean, _ = row["_moments"]
            scale = 1.7 if row["method"].endswith("probit") else 1.0
            row["mean_err_sd"] = float(((scale * mean - g_mean).abs() / g_sd).mean())
    for row in rows:
        row.pop("_moments", None)
    return rows


LOOP_SIZES = [50, 100, 200, 400, 1000]


def held_out(utility: Callable[[Tensor], Tensor], generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """100 fresh points, 500 fresh pairs of them, the true differences and the drawn outcomes."""
    X_test = torch.rand(100, 2, generator=generator, dtype=torch.float64)
    u_test = utility(X_test)
    first = torch.randint(0, 100, (500,), generator=generator)
    pairs = torch.stack([first, (first + torch.randint(1, 100, (500,), generator=generator)) % 100], -1)
    truth = u_test[pairs[:, 0]] - u_test[pairs[:, 1]]
    return X_test, pairs, truth, torch.bernoulli(torch.sigmoid(truth), generator=generator)


def run_loop(name: str, seed: int, index: int) -> list[dict[str, Any]]:
    """The BO-loop protocol: one model per method along a growing data set, refitted from its last state."""
    utility = UTILITIES[name]
    generator = torch.Generator().manual_seed(seed)
    X_test, pairs, truth, outcomes = held_out(utility, generator)
    X = torch.empty(0, 2, dtype=torch.float64)
    comparisons = torch.empty(0, 2, dtype=torch.long)
    models: dict[str, Any] = {}
    rows = []
    for m in LOOP_SIZES:
        n_new = m // 4 + 10 - X.shape[0]
        X = torch.cat([X, torch.rand(n_new, 2, generator=generator, dtype=torch.float64)])
        comparisons = torch.cat([comparisons, comparisons_of(utility(X), m - comparisons.shape[0], generator)])
        for method in ("augmented (CAVI)", "PairwiseGP probit", "PairwiseGP logit"):
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if method not in models:
                    models[method] = (PairwiseAugmentedGP(X, comparisons) if method.startswith("augmented") else
                                      PairwiseGP(X, comparisons, likelihood=PairwiseProbitLikelihood()
                                                 if method.endswith("probit") else BoTorchLogit()))  # fmt: skip
                else:
                    models[method].set_train_data(X, comparisons, update_model=not method.startswith("augmented"))
                model = models[method]
                if method.startswith("augmented"):
                    model.fit()
                else:
                    fit_gpytorch_mll(PairwiseLaplaceMarginalLogLikelihood(model.likelihood, model))
            seconds = time.perf_counter() - start
            with torch.no_grad():
                mean, sd = difference_moments(model.posterior(X_test).distribution, pairs)
            result = metrics(mean, sd, truth, probit=method.endswith("probit"))
            rows.append({"utility": name, "m": m, "n": X.shape[0], "seed": index, "method": method, "fit_s": seconds,
                         **_scores(result["p"], outcomes), "coverage90": result["coverage"]})  # fmt: skip
        print(rows[-3:], flush=True)
    return rows


def ratio_table(title: str, rows: list[dict[str, Any]], utilities: list[str], sizes: list[int], seeds: int) -> Any:
    """Mean ± sd over the seeds of the baseline's fit time over ours, and of the log-loss difference."""
    speed = []
    for name in utilities:
        for m in sizes:
            for other in ("PairwiseGP probit", "PairwiseGP logit"):
                ratios, gaps = [], []
                for seed in range(seeds):
                    by = {r["method"]: r for r in rows if (r["utility"], r["m"], r["seed"]) == (name, m, seed)}
                    ratios.append(by[other]["fit_s"] / by["augmented (CAVI)"]["fit_s"])
                    gaps.append(by["augmented (CAVI)"]["log_loss"] - by[other]["log_loss"])
                speed.append([name, m, other, common.mean_sd(ratios), common.mean_sd(gaps, "+.4f")])
    return _report.Table(title, ["utility", "m", "baseline", "speed-up (baseline time / ours)",
                                 "log-loss difference (ours - baseline)"], speed)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = common.run_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]),
                                  "one utility, 50 and 200 comparisons", caps=False)  # fmt: skip
    parser.add_argument("--seeds", type=int, default=None, help="seeds per (utility, m); default 3 (--quick: 1)")
    args = parser.parse_args(argv)
    machine = common.start_run(args.threads, args.seed)
    utilities = ["quadratic"] if args.quick else list(UTILITIES)
    sizes = [50, 200] if args.quick else [50, 200, 1000]
    seeds = args.seeds or (1 if args.quick else 3)
    warm_up()
    rows: list[dict[str, Any]] = []
    loop_rows: list[dict[str, Any]] = []
    for name in utilities:
        for m in sizes:
            for seed in range(seeds):
                rows += run_one(name, m, seed=1000 * seed + m, with_gibbs=m <= 200, index=seed)
                print(rows[-1], flush=True)
        if not args.quick:
            for seed in range(seeds):
                loop_rows += run_loop(name, seed=77 + 1000 * seed, index=seed)
    machine = common.close_machine_info(machine)
    columns = ["utility", "m", "n", "method", "fit [s]", "log-loss", "accuracy", "90% coverage", "|mean - Gibbs| / sd"]
    table = _report.Table("Cold fits: held-out comparisons", columns, [
        [r["utility"], r["m"], r["n"], r["method"], r["fit_s"], r["log_loss"], r["accuracy"], r["coverage90"],
         r["mean_err_sd"]] for r in rows])  # fmt: skip
    tables = [table, ratio_table(f"Cold fits: PairwiseAugmentedGP against PairwiseGP (mean ± sd over {seeds} seeds)",
                                 rows, utilities, sizes, seeds)]  # fmt: skip
    if loop_rows:
        tables.append(_report.Table("BO-loop refits (warm start): held-out comparisons", columns[:-1], [
            [r["utility"], r["m"], r["n"], r["method"], r["fit_s"], r["log_loss"], r["accuracy"], r["coverage90"]]
            for r in loop_rows]))  # fmt: skip
        tables.append(ratio_table(f"BO-loop refits: PairwiseAugmentedGP against PairwiseGP (mean ± sd over {seeds} "
                                  "seeds)", loop_rows, utilities, LOOP_SIZES, seeds))  # fmt: skip
    settings = {"utilities": ", ".join(utilities), "comparisons m (cold fits)": ", ".join(map(str, sizes)),
                "comparisons m (BO loop)": "none" if args.quick else ", ".join(map(str, LOOP_SIZES)), "seeds": seeds,
                "points n": "m // 4 + 10", "held-out": "500 pairs of 100 points",
                "augmented model": "exact path (no inducing points), default options",
                **_report.machine_settings(machine)}
    _report.write_report(common.output_dir(args.output_dir, args.quick), "preference",
                         {"rows": rows, "loop_rows": loop_rows, "machine": machine},
                         "Preference learning: PairwiseAugmentedGP against PairwiseGP", settings, tables)  # fmt: skip


if __name__ == "__main__":
    main()
