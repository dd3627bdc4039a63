"""Tables of ``sampling.py``'s report (NumPyro figures first), rendered by ``_report.py``."""

from __future__ import annotations

from typing import Any

import _report

LABELS = {"hmc": "HMC (ours, Laplace-preconditioned)", "gibbs": "Gibbs (ours, over-relaxed)",
          "numpyro": "NumPyro NUTS (default)", "numpyro_dense": "NumPyro NUTS (dense mass)",
          "numpyro_other_method": "NumPyro NUTS (default, other chain method)", "pyro": "Pyro NUTS (secondary)"}


def _main_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for p in result["problems"]:
        for chains, rnd in p["rounds"].items():
            for i, (name, r) in enumerate(rnd["runs"].items()):
                s, e, extra = r["steady"], r["e2e"], r["extra"]
                method = extra.get("chain_method", "")
                agree = rnd["agreement"].get(name)
                rows.append([
                    p["title"] if i == 0 else "", chains if i == 0 else "", LABELS[name] + (f" [{method}]" if method
                                                                                           else ""),
                    s["ms_per_draw"], s["ess_worst_min"], s["ess_bulk_median"], s["ess_per_s_worst_min"],
                    s["ess_per_s_bulk_median"], e["wall"], e["rhat_max"], e["ess_per_s_worst_min"],
                    "ref." if agree is None else f"{agree['max_abs_z']:.1f} / {agree['sd_ratio_min']:.2f}–"
                    f"{agree['sd_ratio_max']:.2f}",
                ])
    return rows


def _ratio_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for p in result["problems"]:
        for chains, rnd in p["rounds"].items():
            for key, r in rnd["ratios"].items():
                ours, ref = key.split("/")
                rows.append([p["key"], chains, LABELS[ours].split(" (")[0] + " ÷ " + LABELS[ref].removeprefix(
                    "NumPyro NUTS "), r["ess_per_s_worst_min"], r["ess_per_s_bulk_min"], r["ess_per_s_tail_min"],
                    r["ess_per_s_sd_min"], r["ess_per_s_bulk_median"], r["e2e_worst"], r["e2e_wall_ref_over_ours"]])
    return rows


def _verdict_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for v in result["verdicts"]:
        rows.append([v["problem"], v["chains"], v["best"], v["e2e"], v["e2e_target"], v["e2e_met"], v["steady"],
                     v["steady_target"], v["steady_met"], v["rhat_ok"]])
    return rows


def _best_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for b in result.get("best_against_best", []):
        for phase, label in (("steady", "steady state"), ("e2e", "end to end")):
            r = b[phase]
            verdict = "met" if r["met"] else f"**missed by {r['target'] / r['ratio']:.1f}×**"
            rows.append([b["problem"], label, r["ours"], r["ours_rate"], r["peer"], r["peer_rate"], r["ratio"],
                         f"≥ {r['target']:.0f}×: {verdict}", f"{r['ours_rhat']:.3f}"])
    return rows


def report(result: dict[str, Any]) -> tuple[str, dict[str, Any], list[_report.Table]]:
    """Title, settings and tables of a result record (what :func:`_report.write_report` renders)."""
    cfg, v = result["config"], result["versions"]
    head = ["problem", "chains", "sampler", "steady ms / draw", "worst ESS (min)", "bulk ESS median",
            "steady worst-ESS/s", "steady bulk-ESS/s median", "end-to-end wall [s]", "e2e max R̂",
            "e2e worst-ESS/s", "vs NumPyro: max |z| / sd ratio range"]
    title = "Exact samplers vs NumPyro NUTS: effective samples per second" + (" (quick)" if cfg["quick"] else "")
    settings = {
        "command": f"python benchmarks/sampling.py{' --quick' if cfg['quick'] else ''}",
        "versions": f"jax {v['jax']}, numpyro {v['numpyro']}, pyro {v['pyro']}, torch {v['torch']}",
        "draws": f"warm-up {cfg['warmup']}, then {cfg['draws']} per chain (end to end), then {cfg['draws']} more "
        f"(steady state); Pyro {cfg['pyro_warmup']} + {cfg['pyro_draws']}, 4 chains",
        "threads, XLA_FLAGS": f"{cfg['threads']}, {cfg['xla_flags']}",
        "worst ESS": "min over the latent coordinates of min(bulk, tail, sd) ArviZ ESS",
        "pilot runs": f"seed {cfg['pilot_seed']}, 4 chains, {cfg['pilot_warmup']} + {cfg['pilot_draws']} draws",
        **{f"chosen settings: {p['key']}": str(p["pilot"]["chosen"]) for p in result["problems"]},
        **{f"problem: {p['title']}": f"N = {p['n']}, T = {p['num_latents']}; {p['data_note']}; hyper-parameters: "
           f"{p['hyperparameters'].get('procedure', '')}" for p in result["problems"]},
        **{f"failed: {k}": val for k, val in result.get("failures", {}).items()},
        "merged from per-problem runs": bool(result.get("merged_from")),
        "whole script (s)": result["wall_time_total"],
        **_report.machine_settings(result["machine"]),
    }  # fmt: skip
    best = _best_rows(result)
    tables = [
        _report.Table("Best against best (our best sampler and chain count ≤ 16 ÷ NumPyro's best: default at 4 "
                      "sequential or 16 vectorised chains, dense mass at 4; worst of bulk/tail/sd min ESS per second)",
                      ["problem", "phase", "our best", "worst-ESS/s", "NumPyro's best", "worst-ESS/s", "ratio",
                       "target", "our e2e max R̂"], best),
        _report.Table("Targets (best of ours ÷ NumPyro default NUTS, worst-ESS per second)",
                      ["problem", "chains", "our best", "end to end", "target", "met", "steady state", "target",
                       "met", "our e2e R̂ < 1.01"], _verdict_rows(result)),
        _report.Table("Ratios", ["problem", "chains", "ours ÷ peer", "steady worst-ESS/s", "bulk min", "tail min",
                                 "sd min", "bulk median", "end-to-end worst-ESS/s", "e2e wall peer ÷ ours"],
                      _ratio_rows(result)),
        _report.Table("Every run", head, _main_rows(result)),
    ]  # fmt: skip
    return title, settings, [t for t in tables if t.rows]  # a record from before the best-against-best view
