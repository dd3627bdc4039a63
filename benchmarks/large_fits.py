r"""Issue 41, items 1 and 2: learned fits where the data are many, on one CPU thread.

Every method learns the hyper-parameters and q(u) from the same start (GPyTorch's default initial values, the same
fixed k-means inducing inputs) and runs until its own stopping rule: ours is the one-call fit
(``CAVI(...).fit(x, y, learn_hyperparameters=True)``) under each protocol of :data:`OURS` (``"auto"``: the default
for the size); the peers -- SVGP + Adam, NGD + Adam and GPyTorch's ``LargeBatchVariationalStrategy`` + Adam -- stop
by ``hyperparameters.Plateau`` (their training loss per datum gains less than ``1e-4`` over a window of at least an
epoch) or at the problem's time cap, in the :data:`GRID` configuration chosen on the pilot split :data:`PILOT_SEED`
(lowest test NLL), never on a reported split. Measured per split: the time to each method's own stop, its test NLL,
and the time each method first reaches the split's *target*, the best final test NLL of any method + 0.005 (a peer's
curve is evaluated every quarter epoch, the evaluations' own time excluded; ours counts only at its end). How to read
``results/large_fits.{json,md}``: ``benchmarks/README.md``. ``--merge`` combines runs.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import _report  # noqa: E402
import gpytorch  # noqa: E402
import hyperparameters as hp  # noqa: E402
import scale  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from gpytorch_augment import CAVI, CAVIVariationalStrategy  # noqa: E402
from gpytorch_augment.datasets import load_keel  # noqa: E402

#: our protocols (hyper_options of the one-call fit); "auto" is what a user gets
OURS = {"ours (auto)": {}, "ours (stochastic)": {"protocol": "stochastic"}, "ours (nested)": {"protocol": "nested"}}
#: the peers' grid, declared before any run; the pilot split picks one configuration per family
GRID = {
    "SVGP+Adam": {"lr": [0.01, 0.05, 0.1], "batch_size": [1024]},
    "NGD+Adam": {"ngd_lr": [0.1], "lr": [0.05, 0.1], "batch_size": [1024]},
    "LargeBatch+Adam": {"lr": [0.05, 0.1], "batch_size": [4096]},
}
PILOT_SEED = 100
TEST_POINTS = 10_000  #: held-out points of the synthetic problems
NLL_MARGIN = 0.005  #: the target: the best final test NLL of any method on the split + this
#: per problem: kind, source, training points, inducing points, time cap per peer run (s); declared before any run
PROBLEMS = {
    "magic": {"kind": "binary", "source": "keel", "num_train": None, "num_inducing": 100, "cap": 300.0},
    "binary-2e4": {"kind": "binary", "source": "synthetic", "num_train": 20_000, "num_inducing": 100, "cap": 300.0},
    "counts-2e4": {"kind": "counts", "source": "synthetic", "num_train": 20_000, "num_inducing": 100, "cap": 300.0},
    "binary-1e5": {"kind": "binary", "source": "synthetic", "num_train": 100_000, "num_inducing": 100, "cap": 600.0},
    "counts-1e5": {"kind": "counts", "source": "synthetic", "num_train": 100_000, "num_inducing": 100, "cap": 600.0},
    "binary-1e6": {"kind": "binary", "source": "synthetic", "num_train": 1_000_000, "num_inducing": 100,
                   "cap": 1800.0},
    "counts-1e6": {"kind": "counts", "source": "synthetic", "num_train": 1_000_000, "num_inducing": 100,
                   "cap": 1800.0},
}  # fmt: skip
#: a problem whose pilot grid would take hours on one thread takes the configurations chosen on a smaller one
PILOT_FROM = {"binary-1e6": "binary-1e5", "counts-1e6": "counts-1e5"}
#: the nested protocol on all the data is run only up to this many points (it is the slow reference above)
NESTED_UP_TO = 20_000
#: a peer goes on past its own stop until it reaches the target or this many times ours' (auto) time: enough to
#: tell whether ours is this many times faster to the target (the issue's target ratio at N >= 10^5)
HORIZON = 5.0


def synthetic(kind: str, n: int, seed: int) -> dict[str, Any]:
    r"""``scale.synthetic_data``'s inputs and latent function; binary labels as there, or counts
    :math:`y \sim \mathrm{Poisson}(5\,\sigma(f(x)))` drawn from the same generator."""
    x, y = scale.synthetic_data(n + TEST_POINTS, seed=seed)
    x = x.double()
    if kind == "counts":
        f = 2 * torch.sin(2 * x[:, 0]) + x[:, 1] * x[:, 2] - 0.5 * x[:, 3] ** 2 + 0.5
        y = torch.poisson(5.0 * torch.sigmoid(f), generator=torch.Generator().manual_seed(seed + 1))
    y = y.double()
    return {"x": x[:n], "y": y[:n], "xt": x[n:], "yt": y[n:], "K": 1, "T": 1}


def load(p: dict[str, Any], seed: int) -> dict[str, Any]:
    if p["source"] == "keel":
        d = load_keel("magic", seed=seed, max_train=p["num_train"])
        return {"x": d.x_train, "y": d.y_train, "xt": d.x_test, "yt": d.y_test, "K": 1, "T": 1}
    return synthetic(p["kind"], p["num_train"], seed)


class QuarterCurve(hp.Curve):
    """:class:`hyperparameters.Curve` at doubling step counts and every ``every`` steps."""

    def __init__(self, evaluate: Any, every: int) -> None:
        super().__init__(evaluate)
        self.every = max(1, every)

    def maybe(self, step: int, start: float) -> None:
        if step & (step - 1) == 0 or step % self.every == 0:
            self.record(start)


def run_ours(p: dict[str, Any], data: dict[str, Any], Z: Tensor, options: dict[str, Any]) -> dict[str, Any]:
    lik = hp.likelihood_for(p["kind"], "ours", 1)
    model = hp.Model(Z, 1, gpytorch.variational.CholeskyVariationalDistribution, CAVIVariationalStrategy).double()
    evaluate = hp.evaluator(p["kind"], model, lik, data)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = CAVI(model, lik, num_data=data["y"].shape[-1]).fit(
            data["x"], data["y"], learn_hyperparameters=True, hyper_options=options or None
        )
    wall = time.perf_counter() - start
    metrics = evaluate()
    return {"time": wall, **metrics, "converged": result.converged, "status": result.status.value,
            "protocol": result.protocol, "stages": result.stages, "iterations": result.num_steps,
            "curve": [{"time": wall, **metrics}], "warnings": [str(w.message)[:200] for w in caught]}  # fmt: skip


def run_peer(p: dict[str, Any], data: dict[str, Any], Z: Tensor, family: str, cfg: dict[str, Any],
             target: float | None = None, horizon: float | None = None) -> dict[str, Any]:  # fmt: skip
    """SVGP + Adam (Cholesky q(u)), NGD + Adam (natural q(u)) or LargeBatch + Adam on mini-batches of
    ``cfg["batch_size"]`` until :class:`hyperparameters.Plateau` or the cap: the time, NLL and steps at that stop.
    With ``horizon``, the run then goes on (its curve recorded) until its test NLL reaches ``target`` or its training
    time reaches ``horizon`` (or the cap), to measure its time to the target."""
    n = data["y"].shape[-1]
    natural = family.startswith("NGD")
    dist = gpytorch.variational.NaturalVariationalDistribution if natural else (
        gpytorch.variational.CholeskyVariationalDistribution)  # fmt: skip
    strategy = gpytorch.variational.LargeBatchVariationalStrategy if family.startswith("LargeBatch") else (
        gpytorch.variational.VariationalStrategy)  # fmt: skip
    model = hp.Model(Z, 1, dist, strategy).double()
    lik = hp.likelihood_for(p["kind"], "SVGP+Adam", 1)
    mll = gpytorch.mlls.VariationalELBO(lik, model, num_data=n)
    bs = min(int(cfg["batch_size"]), n)
    steps_per_epoch = -(-n // bs)
    curve = QuarterCurve(hp.evaluator(p["kind"], model, lik, data), every=max(1, steps_per_epoch // 4))
    optimizers = hp.peer_optimizers(model, lik, natural, n, cfg)
    x, y = data["x"], data["y"]
    generator = torch.Generator().manual_seed(0)
    rule = hp.Plateau(steps_per_epoch=steps_per_epoch, cap=p["cap"])
    start, step, own = time.perf_counter(), 0, None
    while True:
        perm = torch.randperm(n, generator=generator)
        for s in range(0, n, bs):
            idx = perm[s : s + bs]
            for opt in optimizers:
                opt.zero_grad()
            loss = -mll(model(x[idx]), y[idx])
            loss.backward()
            for opt in optimizers:
                opt.step()
            step += 1
            curve.maybe(step, start)
            elapsed = time.perf_counter() - start - curve.excluded
            if own is None:
                stop, converged = rule.done(float(loss.detach()), elapsed)
                if stop:
                    curve.record(start)
                    own = {**curve.points[-1], "time": elapsed, "converged": converged, "iterations": step}
            if own is not None:
                reached = target is not None and curve.points and curve.points[-1]["test_nll"] <= target
                if horizon is None or reached or elapsed >= min(horizon, p["cap"]):
                    return {**own, "continued_to": elapsed, "curve": curve.points}


def grid(family: str) -> list[dict[str, Any]]:
    g = GRID[family]
    return [{"lr": lr, "batch_size": bs, **({"ngd_lr": g["ngd_lr"][0]} if "ngd_lr" in g else {})}
            for bs in g["batch_size"] for lr in g["lr"]]  # fmt: skip


def label(family: str, cfg: dict[str, Any]) -> str:
    return f"{family} lr {cfg['lr']}, batch {cfg['batch_size']}"


def safely(run: Any, *args: Any) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        return run(*args)
    except (RuntimeError, ValueError, FloatingPointError) as error:  # e.g. NGD's q(u) stops being PD
        return {"time": time.perf_counter() - start, "test_nll": math.nan, "converged": False, "curve": [],
                "failed": f"{type(error).__name__}: {str(error)[:200]}"}  # fmt: skip


def pilot(name: str, p: dict[str, Any]) -> dict[str, Any]:
    data = load(p, PILOT_SEED)
    Z = common.kmeans_inducing_points(data["x"][:20_000], p["num_inducing"], seed=PILOT_SEED)
    print(f"== {name} pilot split (seed {PILOT_SEED}): {tuple(data['x'].shape)} train", flush=True)
    runs, chosen = {}, {}
    for family in GRID:
        for cfg in grid(family):
            torch.manual_seed(PILOT_SEED)
            r = safely(run_peer, p, data, Z, family, cfg)
            runs[label(family, cfg)] = {k: v for k, v in r.items() if k != "curve"}
            print(f"   pilot {label(family, cfg):36s} {r['time']:8.2f}s  nll {r['test_nll']:.4f}", flush=True)
            best = chosen.get(family)
            better = best is None or r["test_nll"] < runs[label(family, best)]["test_nll"]
            if not math.isnan(r["test_nll"]) and better:
                chosen[family] = cfg
    return {"seed": PILOT_SEED, "runs": runs, "chosen": chosen}


def time_to(run: dict[str, Any], target: float) -> float | None:
    hits = [pt["time"] for pt in run.get("curve", []) if pt["test_nll"] <= target]
    return min(hits) if hits else None


def run_problem(name: str, seeds: list[int], pilots: dict[str, Any] | None, quick: bool = False) -> dict[str, Any]:
    """Per split: ours first (every protocol of :data:`OURS`), then each peer in its pilot-chosen configuration to
    its own stop and on until it reaches ours' best NLL + :data:`NLL_MARGIN` or :data:`HORIZON` times ours' time."""
    p = dict(PROBLEMS[name])
    if quick:  # a smoke run: 3,000 points, 10 s per peer run
        p.update(num_train=3000, cap=10.0)
    source = name if pilots and name in pilots else PILOT_FROM.get(name, name)
    chosen_record = pilots[source] if pilots and source in pilots else pilot(name, p)
    ours_specs = [(k, v) for k, v in OURS.items() if k != "ours (nested)" or (p["num_train"] or 0) <= NESTED_UP_TO]
    peer_specs = [(label(f, cfg), (f, cfg)) for f, cfg in chosen_record["chosen"].items()]
    splits = []
    for seed in seeds:
        data = load(p, seed)
        Z = common.kmeans_inducing_points(data["x"][:20_000], p["num_inducing"], seed=seed)
        print(f"== {name} split {seed}: {tuple(data['x'].shape)} train, M = {Z.shape[0]}", flush=True)
        runs = {}
        for key, spec in ours_specs[seed % len(ours_specs):] + ours_specs[: seed % len(ours_specs)]:
            torch.manual_seed(seed)
            runs[key] = safely(run_ours, p, data, Z, spec)
            print(f"   {key:36s} {runs[key]['time']:8.2f}s  nll {runs[key]['test_nll']:.4f}  "
                  f"{runs[key].get('status', '')} {[s['num_data'] for s in runs[key].get('stages', [])]}",
                  flush=True)  # fmt: skip
        provisional = min(r["test_nll"] for r in runs.values() if not math.isnan(r["test_nll"])) + NLL_MARGIN
        horizon = HORIZON * runs["ours (auto)"]["time"]
        for key, (family, cfg) in peer_specs[seed % len(peer_specs):] + peer_specs[: seed % len(peer_specs)]:
            torch.manual_seed(seed)
            r = runs[key] = safely(run_peer, p, data, Z, family, cfg, provisional, horizon)
            best = min((c["test_nll"] for c in r["curve"]), default=math.nan)
            print(f"   {key:36s} {r['time']:8.2f}s  nll {r['test_nll']:.4f}  (went on to "
                  f"{r.get('continued_to', math.nan):.1f}s, best {best:.4f})", flush=True)  # fmt: skip
        target = min(r["test_nll"] for r in runs.values() if not math.isnan(r["test_nll"])) + NLL_MARGIN
        for r in runs.values():
            r["time_to_target"] = time_to(r, target)
        splits.append({"seed": seed, "target": target, "horizon": horizon, "runs": runs})
    return {"problem": name, **p, "num_train": int(data["y"].shape[-1]), "pilot": chosen_record, "splits": splits}


def summarise(record: dict[str, Any]) -> dict[str, Any]:
    """Per method: mean ± sd of time and NLL, time to target (median, with how many splits reached it); per split the
    ratios fastest peer / ours (auto) to the target and to the own stop."""
    methods = list(record["splits"][0]["runs"])
    rows = {}
    for m in methods:
        rs = [s["runs"][m] for s in record["splits"]]
        hits = [r["time_to_target"] for r in rs if r["time_to_target"] is not None]
        rows[m] = {"time": [r["time"] for r in rs], "nll": [r["test_nll"] for r in rs],
                   "time_to_target": [r["time_to_target"] for r in rs], "reached": len(hits)}  # fmt: skip
    ratios = []
    for s in record["splits"]:
        ours = s["runs"]["ours (auto)"]
        # a peer that failed (e.g. NGD's q(u) no longer positive definite) has no model to compare
        peers = {k: v for k, v in s["runs"].items() if not k.startswith("ours") and _finite(v["test_nll"])}
        reached = [v["time_to_target"] for v in peers.values() if v["time_to_target"] is not None]
        fastest_stop = min((v["time"] for v in peers.values()), default=math.nan)
        ratios.append({
            "seed": s["seed"],
            "to_target": (min(reached) / ours["time_to_target"]) if reached and ours["time_to_target"] else None,
            # no peer reached the target: the time they went on for over ours' time is a lower bound of the ratio
            "to_target_lower_bound": None if reached or not ours["time_to_target"] else
            min(v.get("continued_to", v["time"]) for v in peers.values()) / ours["time_to_target"],
            "to_own_stop": fastest_stop / ours["time"],
        })  # fmt: skip
    return {"rows": rows, "ratios": ratios}


def _finite(value: float | None) -> bool:
    """A measured number (a NaN is written to JSON as null)."""
    return value is not None and math.isfinite(value)


def _mean_sd(values: list[float | None], spec: str = ".3g") -> str:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return _report.MISSING
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{statistics.fmean(vals):{spec}} ± {sd:{spec}}"


def tables(records: list[dict[str, Any]]) -> list[_report.Table]:
    out = []
    for rec in records:
        summary = summarise(rec)
        rows = [[m, _mean_sd(r["time"]), _mean_sd(r["nll"], ".4f"), _mean_sd(r["time_to_target"]),
                 f"{r['reached']}/{len(r['time'])}"] for m, r in summary["rows"].items()]  # fmt: skip
        out.append(_report.Table(f"{rec['problem']} (N = {rec['num_train']:,}, {rec['kind']})",
                                 ["method", "time to own stop [s]", "test NLL", "time to target [s]", "reached"],
                                 rows))  # fmt: skip
        out.append(_report.Table(
            f"{rec['problem']}: fastest peer / ours (auto), per split",
            ["seed", "target NLL", "to the target", "to the own stop"],
            [[r["seed"], f"{s['target']:.4f}",
              _report.cell(r["to_target"], ".2f") if r["to_target"] is not None else
              (f"> {r['to_target_lower_bound']:.2f} (no peer reached it)" if r["to_target_lower_bound"] else
               "ours did not reach it"),
              f"{r['to_own_stop']:.2f}"] for r, s in zip(summary["ratios"], rec["splits"])],
        ))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("problems", nargs="*", default=["magic", "counts-2e4", "binary-1e5"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--pilots", type=Path, help="a large_fits JSON whose pilot choices to re-use")
    parser.add_argument("--out-name", default="large_fits")
    parser.add_argument("--out", type=Path, default=common.RESULTS_DIR)
    parser.add_argument("--merge", type=Path, nargs="+", help="combine these JSON records into one report")
    parser.add_argument("--quick", action="store_true", help="a smoke run (3,000 points, 10 s caps), to a temp dir")
    args = parser.parse_args(argv)
    out = common.output_dir(None if args.out == common.RESULTS_DIR else args.out, args.quick)
    machine = common.start_run(threads=1, seed=0)
    runs_settings: list[dict[str, Any]] = []
    if args.merge:
        merged = [json.loads(path.read_text()) for path in args.merge]
        records = [r for m in merged for r in m["results"]]
        runs_settings = [m["report"]["settings"] for m in merged]
    else:
        pilots = None
        if args.pilots:
            pilots = {r["problem"]: r["pilot"] for r in json.loads(args.pilots.read_text())["results"]}
        records = [run_problem(name, args.seeds, pilots, args.quick) for name in args.problems]
    settings = {"problems": ", ".join(r["problem"] for r in records), "seeds": str(args.seeds),
                "grid": str(GRID), "ours": str(OURS), "target": f"best final test NLL of any method + {NLL_MARGIN}",
                **_report.machine_settings(common.close_machine_info(machine))}  # fmt: skip
    if runs_settings:  # a merge: the machine and load of each run, not of the merge
        settings = {"merged from": ", ".join(str(p.name) for p in args.merge), "grid": str(GRID), "ours": str(OURS),
                    "target": settings["target"],
                    **{f"run {i + 1}: {k}": v for i, rs in enumerate(runs_settings) for k, v in rs.items()
                       if k not in ("grid", "ours", "target")}}  # fmt: skip
    _report.write_report(out, args.out_name, {"results": records, "grid": GRID, "problems": PROBLEMS},
                         "Learned fits at scale: the one-call fit against SVGP, NGD and LargeBatch + Adam",
                         settings, tables(records))  # fmt: skip


if __name__ == "__main__":
    main()
