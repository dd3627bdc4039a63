"""The benchmarks' one renderer (``benchmarks/_report.py``): tables and JSON, no prose; and the scripts that use it
import and render a result record."""

from __future__ import annotations

import doctest
import importlib
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
#: the benchmarks a user reruns, then the studies behind decisions (``benchmarks/studies/``)
SEARCH = [str(BENCHMARKS), str(BENCHMARKS / "studies")]


@pytest.fixture(scope="module")
def report():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("_report")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_renderer_writes_tables_and_json(report, tmp_path: Path) -> None:
    table = report.Table("Speed", ["method", "time [s]", "reached"], [["CAVI", 0.2345678, True], ["Adam", None, False]])
    md = report.write_report(tmp_path, "demo", {"runs": [1, float("nan")]}, "A title", {"N": 10}, [table], echo=False)
    text = md.read_text()
    assert text.startswith("# A title\n") and "## Settings" in text and "| N | 10 |" in text
    assert "## Speed" in text and "| CAVI | 0.2346 | yes |" in text and "| Adam | — | no |" in text
    record = json.loads((tmp_path / "demo.json").read_text())
    assert record["runs"] == [1, None]
    assert record["report"]["tables"][0]["columns"] == ["method", "time [s]", "reached"]
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        report.Table("bad", ["a", "b", "c"], [[1, 2]])


def test_the_renderer_doctests(report) -> None:
    failures, tried = doctest.testmod(report, verbose=False)
    assert tried and not failures


def test_the_renderer_writes_a_figure_link(report, tmp_path: Path) -> None:
    drawn = []
    report.write_report(tmp_path, "fig", {}, "T", {}, [], figure=lambda p, r: drawn.append(p), echo=False)
    assert drawn == [tmp_path / "fig.png"] and "![T](fig.png)" in (tmp_path / "fig.md").read_text()


#: scripts that report through the renderer: each renders its committed result record (benchmarks/results/)
CONVERTED = {name: name for name in ("regression", "classification", "multiclass", "scale", "sampler_choice",
                                      "hyper_objective", "distributed", "sparse_sampling",
                                      "hyperparameters_large", "quadrature_route")}  # fmt: skip
CONVERTED["_sampling_report"] = "sampling"


@pytest.mark.parametrize("name", sorted(CONVERTED))
def test_a_converted_script_renders_its_result_record(report, name: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    sys.path[:0] = SEARCH
    try:
        script = importlib.import_module(name)
    finally:
        del sys.path[: len(SEARCH)]
    assert not hasattr(script, "write_markdown") and not hasattr(script, "markdown"), f"{name}.py writes Markdown"
    result = json.loads((BENCHMARKS / "results" / f"{CONVERTED[name]}.json").read_text())
    title, settings, tables = script.report(result)
    md = report.write_report(tmp_path, name, result, title, settings, tables, echo=False).read_text()
    prose = [
        line for line in md.splitlines() if line and not line.startswith(("#", "|", "![")) and line.strip()
    ]  # fmt: skip
    assert not prose, f"{name}: prose in the report: {prose[:3]}"
    assert len(tables) >= 1 and all(t.rows for t in tables)


def _script(name: str):
    sys.path[:0] = SEARCH
    try:
        return importlib.import_module(name)
    finally:
        del sys.path[: len(SEARCH)]


def test_sparse_sampling_renders_a_record_without_the_later_fields(report, tmp_path: Path) -> None:
    """The committed record predates ``config.hmc.adapt``: that setting renders as an empty cell; a record without
    the exact reference, or with only the default-α targets, renders the tables it has."""
    pytest.importorskip("matplotlib")
    script = _script("sparse_sampling")
    result = json.loads((BENCHMARKS / "results" / "sparse_sampling.json").read_text())
    _, settings, _ = script.report(result)
    assert settings["VI-HMC (dual avg.) adaptation: iterations, target acceptance"] is None
    result["config"]["hmc"].update(adapt=50, target_accept=0.65)
    del result["exact_reference"]
    for fold in result["folds"]:
        del fold["targets"]["alpha=0"]
    _, settings, tables = script.report(result)
    assert settings["VI-HMC (dual avg.) adaptation: iterations, target acceptance"] == "50, 0.65"
    assert not any(t.title.startswith("Quality reference") for t in tables)
    by_title = {t.title.split(" (")[0]: t for t in tables}
    assert [row[0] for row in by_title["Targets per VI-Gibbs α"].rows] == ["VI-Gibbs α=0.5", "VI-Gibbs α=1"]
    assert all(t.rows for t in tables)


def test_the_converted_scripts_doctests() -> None:
    pytest.importorskip("matplotlib")
    for name in ("sparse_sampling", "hyperparameters_large"):
        failures, _ = doctest.testmod(_script(name), verbose=False)
        assert not failures, name


def _gpu_record() -> dict:
    """A result record of ``benchmarks/gpu.py`` with one run per part (values arbitrary, shapes as written)."""
    run = {"n": 1000, "m": 8, "dtype": "float64", "batch_size": 100, "hyperparameters": "frozen", "lr": None,
           "time_to_target": 0.5, "steps": 50, "step_time": 0.01, "best_test_nll": 0.6, "peak_memory_mb": None,
           "error": None, "trace": [[0.5, 50, 0.6]], "target": 0.605}  # fmt: skip
    runs = [{**run, "engine": "cavi"}, {**run, "engine": "adam", "lr": 0.05, "time_to_target": 2.0}]
    return {
        "card": "NVIDIA H100 80GB HBM3", "device": "cuda", "size": "short", "dtypes": ["float64"],
        "has_large_batch": True, "wall_time": 10.0, "cavi": runs, "speedups": _script("gpu").speedups(runs),
        "samplers": [{"method": "GibbsSampler", "dtype": "float64", "chains": 64, "n": 100, "seconds": 1.0,
                      "worst_ess": 500.0, "ess_per_second": 500.0, "error": None},
                     {"method": "NumPyro NUTS (vectorized)", "dtype": "float64", "chains": 64, "n": 100,
                      "error": "numpyro is not installed"}],
        "polya_gamma": [{"n": 1000, "torch_native_s": 1e-3, "host_round_trip_s": None, "host_over_native": None}],
        "syncs": [{"what": "CAVI mini-batch step", "syncs": 2}, {"what": "Gibbs sweep", "syncs": None}],
    }  # fmt: skip


def test_the_gpu_benchmark_renders_every_part_with_the_card_named(report, tmp_path: Path) -> None:
    """``benchmarks/gpu.py``'s report: one table per part, the card in the title and the settings, no prose; the
    speed-up is the peer's time to target over CAVI's."""
    script = _script("gpu")
    record = _gpu_record()
    assert record["speedups"] == [{"config": (1000, 8, "float64", 100, "frozen"), "ours": "cavi", "peer": "adam",
                                   "peer_lr": 0.05, "peer_time": 2.0, "cavi_time": 0.5, "speedup": 4.0}]  # fmt: skip
    # the one-call fit with its defaults is one of ours, never a peer
    learned = [{**r, "hyperparameters": "learned"} for r in record["cavi"]]
    learned.append({**learned[0], "engine": "cavi_default", "time_to_target": 1.0})
    rows = script.speedups(learned)
    expected = [("cavi", "adam", 4.0), ("cavi_default", "adam", 2.0)]
    assert [(r["ours"], r["peer"], r["speedup"]) for r in rows] == expected
    title, settings, tables = script.report(record)
    assert "NVIDIA H100" in title and settings["card"] == record["card"]
    assert [t.title.split(" ")[0] for t in tables] == ["CAVI", "CAVI's", "Samplers,", "PG(1,", "Host"]
    md = report.write_report(tmp_path, "gpu", record, title, settings, tables, echo=False).read_text()
    prose = [line for line in md.splitlines() if line.strip() and not line.startswith(("#", "|"))]
    assert not prose
    assert "| NumPyro NUTS (vectorized) | float64 | 64 | 100 | — | — | — | numpyro is not installed |" in md


def test_the_gpu_benchmark_batches_are_full_from_the_first_step(report) -> None:
    """The peers' index batches: full and disjoint within a pass over the data, from the very first call (the first
    GPU run handed them empty batches until ``n / batch_size`` steps had passed)."""
    import torch

    next_batch = _script("gpu")._batches(100, 30, torch.device("cpu"), seed=0)
    batches = [next_batch() for _ in range(3)]
    assert [b.numel() for b in batches] == [30, 30, 30]
    assert torch.cat(batches).unique().numel() == 90


def test_the_gpu_reanalysis_removes_the_empty_steps_time(report) -> None:
    """``gpu_reanalyse.py``: a peer that saw ⌊n / b⌋ empty batches first loses their time (the mean step time up to
    the last checkpoint before them); a run that never passed them is marked, CAVI is left alone."""
    script = _script("gpu_reanalyse")
    base = {"n": 1000, "m": 8, "dtype": "float64", "batch_size": 100, "hyperparameters": "frozen", "lr": 0.1,
            "error": None, "best_test_nll": 0.5}  # fmt: skip
    peer = {**base, "engine": "adam", "steps": 20, "train_time": 4.0, "time_to_target": 3.0,
            "trace": [(1.0, 5, 0.69), (2.0, 10, 0.69), (3.0, 15, 0.5), (4.0, 20, 0.5)]}  # fmt: skip
    fixed = script.corrected(peer)
    assert fixed["empty_steps"] == 10 and fixed["empty_time"] == 2.0
    assert fixed["corrected_time_to_target"] == 1.0 and fixed["corrected_step_time"] == 0.2
    assert not script.corrected({**peer, "steps": 10, "trace": peer["trace"][:2]})["trained"]
    cavi = {**base, "engine": "cavi", "steps": 20, "train_time": 1.0, "time_to_target": 0.5, "trace": []}
    assert script.corrected(cavi)["corrected_time_to_target"] == 0.5
    rows = script.speedups([script.corrected(cavi), fixed])
    assert rows[0]["speedup"] == 2.0 and rows[0]["raw_speedup"] == 6.0


def test_the_quadrature_route_baselines_are_our_observation_models() -> None:
    """``benchmarks/studies/quadrature_route.py``'s GPyTorch likelihoods: ``forward(f).log_prob(y)`` is our
    ``log_prob_at(y, f)`` (Matérn-3/2 at the same ρ; the SVM's pseudo-likelihood), so both routes fit one model."""
    import torch

    from gpytorch_augment import BayesianSVMLikelihood, MaternThreeHalvesLikelihood

    script = _script("quadrature_route")
    f = torch.linspace(-3, 3, 25, dtype=torch.float64)
    y = torch.linspace(-2, 2, 25, dtype=torch.float64).flip(0)
    ours, peer = MaternThreeHalvesLikelihood(scale=0.4).double(), script.QuadratureMatern(0.4).double()
    assert torch.allclose(peer.scale.detach(), torch.tensor(0.4, dtype=torch.float64))
    assert torch.allclose(peer.forward(f).log_prob(y), ours.log_prob_at(y, f))
    labels = (torch.arange(25) % 2).double()
    assert torch.allclose(
        script.QuadratureSVM().forward(f).log_prob(labels), BayesianSVMLikelihood().log_prob_at(labels, f)
    )
