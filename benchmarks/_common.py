r"""Shared helpers for the benchmark scripts in this folder.

Every benchmark follows the same pattern:

1. :func:`configure_torch` fixes the thread count and the default dtype (the machine is shared: one thread per
   process keeps timings comparable between methods);
2. :func:`kmeans_inducing_points` places fixed inducing inputs;
3. each method is a pair of callables, ``step()`` (one training iteration) and ``evaluate()`` (test metrics), run by
   :func:`run_interleaved` (all methods round-robin, so that they share the machine's load) or
   :func:`run_until_plateau` (one method), which time ``step`` only (evaluation is excluded from the method's
   clock) and stop each method when its test metric has stopped improving or a cap is hit;
4. :func:`time_to_target` reads off the wall time and the iterations until a method first comes within a tolerance of
   the best value reached by any method;
5. :func:`write_json` and :func:`markdown_table` write ``results/<name>.{json,md}``.

The helpers know nothing about any particular model or library; they are plain functions and dataclasses.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

RESULTS_DIR = Path(__file__).resolve().parent / "results"


# ---------------------------------------------------------------------------------------------------- environment
def configure_torch(threads: int = 1, dtype: torch.dtype = torch.float64) -> None:
    """Set the number of intra-op threads and the default floating dtype for the whole process."""
    if threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads}")
    torch.set_num_threads(threads)
    torch.set_default_dtype(dtype)


def machine_info() -> dict[str, Any]:
    """Versions, thread count and the load average at the time of the call (the machine is shared)."""
    import gpytorch
    import linear_operator

    try:
        load = list(os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        load = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "gpytorch": gpytorch.__version__,
        "linear_operator": linear_operator.__version__,
        "torch_threads": torch.get_num_threads(),
        "default_dtype": str(torch.get_default_dtype()),
        "load_average_1_5_15_min": load,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# ---------------------------------------------------------------------------------------------------- inducing points
def kmeans_inducing_points(x: Tensor, num_inducing: int, seed: int = 0, n_init: int = 3) -> Tensor:
    """``num_inducing`` k-means centroids of the rows of ``x`` (scikit-learn, seeded), in ``x``'s dtype."""
    from sklearn.cluster import KMeans

    if not 0 < num_inducing <= x.shape[-2]:
        raise ValueError(f"num_inducing must be in [1, {x.shape[-2]}], got {num_inducing}")
    km = KMeans(n_clusters=num_inducing, n_init=n_init, random_state=seed).fit(x.detach().cpu().numpy())
    return torch.as_tensor(km.cluster_centers_, dtype=x.dtype, device=x.device)


def median_heuristic_lengthscales(x: Tensor, max_points: int = 2000, seed: int = 0) -> Tensor:
    """Per-dimension median of ``|x_i - x_j|`` over pairs of a (seeded) subsample, times ``sqrt(D)``.

    For an ARD kernel this gives every dimension the same share of the median squared distance.
    """
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randperm(x.shape[-2], generator=gen)[:max_points]
    sub = x[idx]
    diffs = (sub.unsqueeze(-2) - sub.unsqueeze(-3)).abs()
    iu = torch.triu_indices(sub.shape[0], sub.shape[0], offset=1)
    med = diffs[iu[0], iu[1]].median(dim=0).values
    return med.clamp_min(1e-6) * math.sqrt(x.shape[-1])


# ---------------------------------------------------------------------------------------------------- metrics
def bernoulli_nll(probs: Tensor, y: Tensor, eps: float = 1e-12) -> float:
    r"""Mean negative log predictive probability :math:`-\frac1n\sum\log p(y_i)` of labels ``y`` in {0, 1}."""
    p = probs.clamp(eps, 1 - eps)
    return float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())


def error_rate(probs: Tensor, y: Tensor) -> float:
    """Fraction of labels ``y`` in {0, 1} not predicted by thresholding ``probs`` at 1/2."""
    return float(((probs > 0.5).to(y.dtype) != y).to(torch.float64).mean())


# ---------------------------------------------------------------------------------------------------- timing
class Stopwatch:
    """Accumulates the wall time (``time.perf_counter``) and the process CPU time (``time.process_time``) spent
    inside ``with stopwatch:`` blocks.

    On a shared, oversubscribed machine the wall time includes waiting for a core; with one torch thread the CPU
    time does not, so it is the steadier of the two (both are recorded).
    """

    def __init__(self) -> None:
        self.elapsed = 0.0
        self.cpu = 0.0
        self._start: tuple[float, float] | None = None

    def __enter__(self) -> Stopwatch:
        self._start = (time.perf_counter(), time.process_time())
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._start is not None
        self.elapsed += time.perf_counter() - self._start[0]
        self.cpu += time.process_time() - self._start[1]
        self._start = None


@dataclass
class EvalSchedule:
    """Evaluate after every iteration up to ``dense_until``, then every ``every`` iterations, then every
    ``sparse_every`` iterations from ``sparse_from`` on (iteration 0 = the initial state is always evaluated)."""

    dense_until: int = 100
    every: int = 5
    sparse_from: int = 1000
    sparse_every: int = 10

    def __call__(self, t: int) -> bool:
        if t <= self.dense_until:
            return True
        if t < self.sparse_from:
            return t % self.every == 0
        return t % self.sparse_every == 0


@dataclass
class StoppingRule:
    """Stop when the best ``metric`` has improved by no more than ``min_improvement`` over a window of the last
    ``patience`` evaluations that also spans at least ``min_window_iterations`` iterations (so that a noisy or
    oscillating optimiser is not stopped on a short excursion), or at ``max_iter`` iterations, or when the method's
    own clock passes ``max_time`` seconds."""

    patience: int = 20
    min_improvement: float = 1e-4
    min_window_iterations: int = 0
    max_iter: int = 10_000
    max_time: float = 300.0


@dataclass
class Trace:
    """What :func:`run_until_plateau` records: one entry per evaluation.

    ``time`` is the method's own wall clock (training steps only), in seconds, ``cpu_time`` the same in process CPU
    time; ``iteration`` the number of steps taken.
    """

    iteration: list[int] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    cpu_time: list[float] = field(default_factory=list)
    metrics: dict[str, list[float]] = field(default_factory=dict)
    stop_reason: str = ""
    step_times: list[float] = field(default_factory=list)

    def record(self, iteration: int, elapsed: float, cpu: float, values: dict[str, float]) -> None:
        self.iteration.append(iteration)
        self.time.append(elapsed)
        self.cpu_time.append(cpu)
        for key, value in values.items():
            self.metrics.setdefault(key, []).append(float(value))

    @property
    def total_time(self) -> float:
        return self.time[-1] if self.time else 0.0

    @property
    def num_iterations(self) -> int:
        return self.iteration[-1] if self.iteration else 0

    def median_step_time(self) -> float:
        return float(np.median(self.step_times)) if self.step_times else float("nan")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("step_times")
        out["median_step_time"] = self.median_step_time()
        return out


class _Run:
    """The state of one method inside :func:`run_interleaved`."""

    def __init__(self, step: Callable[[], Any], evaluate: Callable[[], dict[str, float]]) -> None:
        self.step, self.evaluate = step, evaluate
        self.trace = Trace()
        self.clock = Stopwatch()
        self.best: list[float] = []  # best metric so far, per evaluation
        self.t = 0
        self.done = False

    def check(self, metric: str, rule: StoppingRule, on_eval: Callable | None, name: str) -> None:
        """Evaluate (untimed), record, and decide whether the run has stopped."""
        values = self.evaluate()
        self.trace.record(self.t, self.clock.elapsed, self.clock.cpu, values)
        if on_eval is not None:
            on_eval(name, self.t, self.clock.elapsed, values)
        value = values[metric]
        if not math.isfinite(value):
            self.trace.stop_reason, self.done = "non-finite", True
            return
        self.best.append(min(value, self.best[-1]) if self.best else value)
        # the latest evaluation at least `patience` evaluations and `min_window_iterations` iterations back
        j = len(self.best) - 1 - rule.patience
        while j >= 0 and self.trace.iteration[j] > self.t - rule.min_window_iterations:
            j -= 1
        if j >= 0 and self.best[j] - self.best[-1] <= rule.min_improvement:
            self.trace.stop_reason, self.done = "plateau", True


def run_interleaved(
    methods: dict[str, tuple[Callable[[], Any], Callable[[], dict[str, float]]]],
    metric: str,
    rule: StoppingRule,
    schedule: Callable[[int], bool] | None = None,
    on_eval: Callable[[str, int, float, dict[str, float]], Any] | None = None,
    on_done: Callable[[str, Trace], Any] | None = None,
) -> dict[str, Trace]:
    """Run several methods round-robin, each ``step()`` timed on the method's own clock.

    ``methods[name] = (step, evaluate)``: ``step()`` is one training iteration, ``evaluate()`` returns a dict of
    test metrics and is not timed; it runs at iteration 0 and whenever ``schedule(t)`` is true. ``metric`` names
    the entry that is minimised; each method stops by ``rule`` (or on a non-finite metric), independently.

    Round-robin (one step of every unfinished method in turn) rather than one method after the other: on a shared
    machine whose load drifts over minutes, every method then sees the same load over the same period, so the
    ratios of their clocks are not biased by when each happened to run.
    """
    schedule = schedule or EvalSchedule()
    runs = {name: _Run(step, evaluate) for name, (step, evaluate) in methods.items()}
    for name, run in runs.items():
        run.check(metric, rule, on_eval, name)
        if run.done and on_done is not None:
            on_done(name, run.trace)
    while not all(run.done for run in runs.values()):
        for name, run in runs.items():
            if run.done:
                continue
            before = run.clock.elapsed
            with run.clock:
                run.step()
            run.t += 1
            run.trace.step_times.append(run.clock.elapsed - before)
            capped = run.t >= rule.max_iter or run.clock.elapsed >= rule.max_time
            if schedule(run.t) or capped:
                run.check(metric, rule, on_eval, name)
            if capped and not run.done:
                run.trace.stop_reason, run.done = ("max_iter" if run.t >= rule.max_iter else "max_time"), True
            if run.done and on_done is not None:
                on_done(name, run.trace)
    return {name: run.trace for name, run in runs.items()}


def run_until_plateau(
    step: Callable[[], Any],
    evaluate: Callable[[], dict[str, float]],
    metric: str,
    rule: StoppingRule,
    schedule: Callable[[int], bool] | None = None,
) -> Trace:
    """One method alone: :func:`run_interleaved` with a single entry."""
    return run_interleaved({"run": (step, evaluate)}, metric, rule, schedule)["run"]


@dataclass
class Hit:
    """When a trace first reached a target: wall time, CPU time and iterations of the method's own clock."""

    time: float
    cpu_time: float
    iteration: int


def time_to_target(trace: Trace, metric: str, target: float) -> Hit | None:
    """The first evaluation with ``metric <= target``, or ``None`` if there is none."""
    for t, c, it, value in zip(trace.time, trace.cpu_time, trace.iteration, trace.metrics[metric]):
        if value <= target:
            return Hit(t, c, it)
    return None


# ---------------------------------------------------------------------------------------------------- output
def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Tensor):
        return _jsonable(obj.detach().cpu().tolist())
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj


def write_json(path: Path | str, obj: Any) -> Path:
    """Write ``obj`` (dicts, lists, numbers, tensors, arrays) as indented JSON; NaN becomes ``null``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(obj), indent=1) + "\n")
    return path


def write_text(path: Path | str, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; cells are ``str()``-ed (format numbers before passing them)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    for row in rows:
        cells = [str(c) for c in row]
        if len(cells) != len(headers):
            raise ValueError(f"row has {len(cells)} cells, the table {len(headers)} columns: {row}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"

