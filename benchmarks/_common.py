r"""Shared scaffolding of the benchmark scripts in this folder; each script keeps only its problem (data, models,
methods) and its tables (``benchmarks/README.md`` lists the pieces).

The pattern: :func:`run_arguments` and :func:`start_run` (options, threads, dtype, seed, machine record); fixed
inducing inputs (:func:`kmeans_inducing_points`) and the sparse GP (:class:`SparseGP`); each method a
:class:`MethodSpec` run round-robin by :func:`run_interleaved`, each on its own clock; :func:`time_to_target` and
:func:`speedup` read the traces; ``_report.write_report`` writes the tables.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import gpytorch
import numpy as np
import torch
from torch import Tensor

#: where full runs write their results (committed)
RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: where ``--quick`` runs write by default (the committed results are full runs only)
QUICK_DIR = Path(tempfile.gettempdir()) / "gpytorch_augment_benchmarks"


# ---------------------------------------------------------------------------------------------------- environment
def configure_torch(threads: int = 1, dtype: torch.dtype = torch.float64) -> None:
    """Set the number of intra-op threads and the default floating dtype for the whole process."""
    if threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads}")
    torch.set_num_threads(threads)
    torch.set_default_dtype(dtype)


def machine_info() -> dict[str, Any]:
    """Versions, thread count and the load average at the time of the call (the machine is shared)."""
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


def start_run(threads: int, seed: int, dtype: torch.dtype = torch.float64) -> dict[str, Any]:
    """The start of a comparison: :func:`configure_torch`, then the global torch seed; returns :func:`machine_info`
    (taken between the two), to be closed by :func:`close_machine_info`."""
    configure_torch(threads=threads, dtype=dtype)
    machine = machine_info()
    torch.manual_seed(seed)
    return machine


def close_machine_info(machine: dict[str, Any]) -> dict[str, Any]:
    """Turn ``machine``, a :func:`machine_info` taken at the start of a run, into the record of the whole run: its
    load average becomes ``load_average_start`` and the load average now is added as ``load_average_end``."""
    machine["load_average_start"] = machine.pop("load_average_1_5_15_min")
    machine["load_average_end"] = machine_info()["load_average_1_5_15_min"]
    return machine


def peak_rss_mb() -> float:
    """The process's peak resident set size so far (``resource.getrusage``: ``ru_maxrss``, KiB on Linux), in MiB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def proc_status_mb(field: str) -> float | None:
    """A size from ``/proc/self/status`` in MiB: ``VmRSS`` (now) or ``VmHWM`` (its peak); ``None`` off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:  # pragma: no cover - not Linux
        return None
    return None


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter ``VmHWM`` to the current RSS (``/proc/self/clear_refs``, value 5; Linux
    >= 4.0); ``ru_maxrss`` is not reset. Returns whether it worked."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:  # pragma: no cover
        return False


# ---------------------------------------------------------------------------------------------------- command line
def run_arguments(
    parser: argparse.ArgumentParser,
    quick_help: str,
    threads_help: str = "torch threads for every method",
    caps: bool = True,
) -> argparse.ArgumentParser:
    """Add the options every comparison takes: ``--quick`` (``quick_help``), ``--threads`` (default 1),
    ``--max-time`` and ``--max-iter`` (caps on each run, only with ``caps``; see :meth:`StoppingRule.capped`),
    ``--output-dir`` (see :func:`output_dir`) and ``--seed`` (default 0)."""
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--threads", type=int, default=1, help=f"{threads_help} (default 1)")
    if caps:
        parser.add_argument("--max-time", type=float, default=None, help="cap on each run's own clock [s]")
        parser.add_argument("--max-iter", type=int, default=None, help="cap on each run's iterations")
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help=f"default {RESULTS_DIR} (full run) or {QUICK_DIR} (--quick: never overwrites the results)",
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser


def output_dir(requested: Path | None, quick: bool, full: Path = RESULTS_DIR) -> Path:
    """``requested`` if given, else :data:`QUICK_DIR` for a quick run and ``full`` (:data:`RESULTS_DIR`) for a full
    one."""
    return requested or (QUICK_DIR if quick else full)


def run_config(rule: StoppingRule, schedule: EvalSchedule, seed: int, tolerance: float) -> dict[str, Any]:
    """The settings every round-robin comparison records in its ``config``: inducing points (by
    :func:`kmeans_inducing_points`), dtype, threads, tolerance, stopping rule, evaluation schedule, execution, seed."""
    return {
        "inducing_points": f"k-means (scikit-learn, seed {seed}, n_init 3) of the training inputs, fixed",
        "dtype": "float64",
        "threads": torch.get_num_threads(),
        "tolerance_nats": tolerance,
        "stopping": asdict(rule),
        "schedule": asdict(schedule),
        "execution": "all methods round-robin (one step of each unfinished method in turn), after 2 untimed "
        "warm-up steps of each on throw-away models",
        "seed": seed,
    }


def rule_settings(rule: dict[str, Any]) -> str:
    """A :class:`StoppingRule` record (``asdict``) in words, for a report's settings."""
    return (f"plateau: ≤ {rule['min_improvement']} over {rule['patience']} evaluations spanning ≥ "
            f"{rule['min_window_iterations']} iterations; max {rule['max_iter']} iterations, {rule['max_time']:.0f} s")


def schedule_settings(sched: dict[str, Any]) -> str:
    """An :class:`EvalSchedule` record (``asdict``) in words, for a report's settings."""
    return (f"every iteration to {sched['dense_until']}, every {sched['every']} to {sched['sparse_from']}, then every "
            f"{sched['sparse_every']}")


# ---------------------------------------------------------------------------------------------------- data
def standardised_split(x: np.ndarray, y: np.ndarray, seed: int, standardise_y: bool, test_fraction: float = 0.2,
                       max_train: int | None = None) -> dict[str, Any]:  # fmt: skip
    """A seeded split of ``(x, y)``: the first ``round(test_fraction * n)`` entries of
    ``numpy.random.RandomState(seed).permutation(n)`` are the test set; ``max_train`` keeps the first training points
    of the permutation. Inputs (and, with ``standardise_y``, targets) standardised with the training statistics;
    float64 tensors ``x``, ``y``, ``xt``, ``yt`` and the target's ``y_mean``, ``y_std``."""
    perm = np.random.RandomState(seed).permutation(len(y))
    n_test = int(round(test_fraction * len(y)))
    test, train = perm[:n_test], perm[n_test:]
    train = train if max_train is None else train[:max_train]
    mu, sd = x[train].mean(0), x[train].std(0)
    sd = np.where(sd > 0, sd, 1.0)
    ym, ys = (float(y[train].mean()), float(y[train].std())) if standardise_y else (0.0, 1.0)

    def t(a: np.ndarray) -> Tensor:
        return torch.as_tensor(np.ascontiguousarray(a), dtype=torch.float64)

    return {"x": t((x[train] - mu) / sd), "y": t((y[train] - ym) / ys), "xt": t((x[test] - mu) / sd),
            "yt": t((y[test] - ym) / ys), "y_mean": ym, "y_std": ys}  # fmt: skip


def index_batches(n: int, batch_size: int, seed: int, device: torch.device | None = None) -> Callable[[], Tensor]:
    """Endless index batches of ``range(n)`` from fresh seeded permutations (full batches only, drawn on
    ``device``): the same sequence for every method."""
    gen = torch.Generator(device=device or "cpu").manual_seed(seed)
    state: dict[str, Any] = {"order": torch.empty(0, dtype=torch.long, device=device), "pos": 0}

    def next_batch() -> Tensor:
        if state["pos"] + batch_size > state["order"].numel():  # the first call draws the first permutation
            state["order"], state["pos"] = torch.randperm(n, generator=gen, device=device), 0
        idx = state["order"][state["pos"] : state["pos"] + batch_size]
        state["pos"] += batch_size
        return idx

    return next_batch


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


# ---------------------------------------------------------------------------------------------------- models
class SparseGP(gpytorch.models.ApproximateGP):
    r"""Sparse variational GP at fixed inducing inputs ``Z`` (``(M, D)``): ``num_latents`` independent latents, each
    with a constant mean (``zero_mean``: none) and a scaled ARD RBF kernel; ``q(u)`` of ``distribution_cls`` in
    ``strategy_cls`` (several latents: inside ``IndependentMultitaskVariationalStrategy``). ``hypers``: initial
    values (:func:`set_hyperparameters`, one latent), then frozen with ``frozen``; ``None``: GPyTorch's defaults."""

    def __init__(
        self,
        inducing_points: Tensor,
        distribution_cls: type = gpytorch.variational.CholeskyVariationalDistribution,
        strategy_cls: type = gpytorch.variational.VariationalStrategy,
        hypers: dict[str, Any] | None = None,
        frozen: bool = True,
        num_latents: int = 1,
        zero_mean: bool = False,
    ) -> None:
        batch = torch.Size([num_latents]) if num_latents > 1 else torch.Size()
        q_u = distribution_cls(inducing_points.size(-2), batch_shape=batch)
        strategy = strategy_cls(self, inducing_points, q_u, learn_inducing_locations=False)
        if num_latents > 1:
            strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(strategy, num_tasks=num_latents)
        super().__init__(strategy)
        self.mean_module = gpytorch.means.ZeroMean() if zero_mean else gpytorch.means.ConstantMean(batch_shape=batch)
        kernel = gpytorch.kernels.RBFKernel(ard_num_dims=inducing_points.size(-1), batch_shape=batch)
        self.covar_module = gpytorch.kernels.ScaleKernel(kernel, batch_shape=batch)
        if hypers is not None:
            set_hyperparameters(self, hypers, frozen=frozen)

    def forward(self, x: Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def set_hyperparameters(module: Any, hypers: dict[str, Any], frozen: bool = True) -> None:
    """Write ``hypers = {"lengthscale": [D floats], "outputscale": float, "mean_constant": float}`` into
    ``module.covar_module`` (a ``ScaleKernel`` of an ARD kernel) and ``module.mean_module`` (a ``ConstantMean``);
    with ``frozen`` both are then excluded from gradients."""
    module.covar_module.base_kernel.lengthscale = torch.as_tensor(hypers["lengthscale"])
    module.covar_module.outputscale = float(hypers["outputscale"])
    module.mean_module.constant.data.fill_(float(hypers["mean_constant"]))
    if frozen:
        module.mean_module.requires_grad_(False)
        module.covar_module.requires_grad_(False)


def hyperparameter_values(module: Any) -> dict[str, Any]:
    """The values :func:`set_hyperparameters` writes, read from ``module``."""
    return {
        "lengthscale": module.covar_module.base_kernel.lengthscale.detach().reshape(-1).tolist(),
        "outputscale": float(module.covar_module.outputscale.detach()),
        "mean_constant": float(module.mean_module.constant.detach()),
    }


def train_svgp(
    model: gpytorch.models.ApproximateGP, likelihood: Any, x: Tensor, y: Tensor, iterations: int, lr: float
) -> tuple[float, float]:
    """Full-batch GPyTorch SVGP training: ``iterations`` Adam steps (``lr``) on every parameter of ``model`` along
    the ``VariationalELBO`` of ``(x, y)``; returns the final ELBO per datum and the wall time of the steps."""
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=y.numel())
    step = gradient_step(lambda: -mll(model(x), y), torch.optim.Adam(model.parameters(), lr=lr))
    start = time.perf_counter()
    for _ in range(iterations):
        step()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        return float(mll(model(x), y)), seconds


def gradient_step(loss: Callable[[], Tensor], *optimizers: torch.optim.Optimizer) -> Callable[[], Tensor]:
    """A ``step()`` closure for gradient-based training: zero the gradients of every optimiser, evaluate ``loss()``,
    back-propagate, step every optimiser (in the order given); ``step()`` returns the loss."""

    def step() -> Tensor:
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        value = loss()
        value.backward()
        for optimizer in optimizers:
            optimizer.step()
        return value

    return step


# ---------------------------------------------------------------------------------------------------- metrics
def bernoulli_nll(probs: Tensor, y: Tensor, eps: float = 1e-12) -> float:
    r"""Mean negative log predictive probability :math:`-\frac1n\sum\log p(y_i)` of labels ``y`` in {0, 1}."""
    p = probs.clamp(eps, 1 - eps)
    return float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())


def error_rate(probs: Tensor, y: Tensor) -> float:
    """Fraction of labels ``y`` in {0, 1} not predicted by thresholding ``probs`` at 1/2."""
    return float(((probs > 0.5).to(y.dtype) != y).to(torch.float64).mean())


def categorical_metrics(probs: Tensor, y: Tensor, floor: float = 1e-12) -> dict[str, float]:
    """Test NLL (probabilities floored at ``floor``) and error of class probabilities ``probs`` (..., N, K) at labels
    ``y`` (class indices)."""
    labels = y.long()
    p = probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1).clamp_min(floor)
    return {"test_nll": float(-p.log().mean()), "test_error": float((probs.argmax(-1) != labels).double().mean())}


def binary_evaluator(
    model: gpytorch.models.ApproximateGP, likelihood: Any, x_test: Tensor, y_test: Tensor
) -> Callable[[], dict[str, float]]:
    """An ``evaluate()`` returning the test NLL and error of the method's own predictive ``likelihood(model(x_test))``
    (labels in {0, 1}), computed in eval mode; model and likelihood are back in train mode afterwards."""

    def evaluate() -> dict[str, float]:
        model.eval()
        likelihood.eval()
        with torch.no_grad():
            probs = likelihood(model(x_test)).probs
        model.train()
        likelihood.train()
        return {"test_nll": bernoulli_nll(probs, y_test), "test_error": error_rate(probs, y_test)}

    return evaluate


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

    def capped(self, max_time: float | None = None, max_iter: int | None = None) -> StoppingRule:
        """Override ``max_time`` and ``max_iter`` where given (``--max-time``, ``--max-iter``); returns ``self``."""
        if max_time is not None:
            self.max_time = max_time
        if max_iter is not None:
            self.max_iter = max_iter
        return self


@dataclass
class Trace:
    """What :func:`run_interleaved` records of one method: one entry per evaluation.

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

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Trace:
        """The trace of a :meth:`to_dict` record (without the step times, which the record does not keep)."""
        return cls(**{f.name: record[f.name] for f in fields(cls) if f.name in record})


# ---------------------------------------------------------------------------------------------------- runner
@dataclass
class MethodSpec:
    """One named method of a comparison: ``step()`` is one training iteration (timed), ``evaluate()`` returns a dict
    of test metrics (untimed), ``settings`` describe the method in the results."""

    name: str
    step: Callable[[], Any]
    evaluate: Callable[[], dict[str, float]]
    settings: dict[str, Any] = field(default_factory=dict)


def warm_up(steps: Iterable[Callable[[], Any]], repeats: int = 2) -> None:
    """Call every ``step()`` of ``steps`` ``repeats`` times, untimed: a generator that builds each method on a
    throw-away model, so that first-call allocations and caches are out of the timed runs."""
    for step in steps:
        for _ in range(repeats):
            step()


class _Run:
    """The state of one method inside :func:`run_interleaved`."""

    def __init__(self, method: MethodSpec) -> None:
        self.method = method
        self.trace = Trace()
        self.clock = Stopwatch()
        self.best: list[float] = []  # best metric so far, per evaluation
        self.t = 0
        self.done = False

    def step(self) -> None:
        """One timed step."""
        before = self.clock.elapsed
        with self.clock:
            self.method.step()
        self.t += 1
        self.trace.step_times.append(self.clock.elapsed - before)

    def check(self, metric: str, rule: StoppingRule) -> None:
        """Evaluate (untimed), record, and decide whether the run has stopped on a non-finite metric or a plateau."""
        values = self.method.evaluate()
        self.trace.record(self.t, self.clock.elapsed, self.clock.cpu, values)
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

    def advance(self, metric: str, rule: StoppingRule, schedule: Callable[[int], bool]) -> None:
        """One step, an evaluation if ``schedule`` or a cap asks for one, and the caps of ``rule``."""
        self.step()
        capped = self.t >= rule.max_iter or self.clock.elapsed >= rule.max_time
        if schedule(self.t) or capped:
            self.check(metric, rule)
        if capped and not self.done:
            self.trace.stop_reason, self.done = ("max_iter" if self.t >= rule.max_iter else "max_time"), True


def run_interleaved(
    methods: Sequence[MethodSpec],
    metric: str,
    rule: StoppingRule,
    schedule: Callable[[int], bool] | None = None,
    on_done: Callable[[str, Trace], Any] | None = None,
) -> dict[str, Trace]:
    """Run several methods round-robin, each ``step()`` timed on the method's own clock; their traces by name.

    ``evaluate()`` runs at iteration 0 and whenever ``schedule(t)`` is true (default :class:`EvalSchedule`);
    ``metric`` names the entry that is minimised; each method stops by ``rule`` (or on a non-finite metric),
    independently. ``on_done(name, trace)`` is called when a method stops.

    Round-robin (one step of every unfinished method in turn) rather than one method after the other: on a shared
    machine whose load drifts over minutes, every method then sees the same load over the same period, so the
    ratios of their clocks are not biased by when each happened to run.
    """
    schedule = schedule or EvalSchedule()
    runs = [_Run(method) for method in methods]
    for run in runs:
        run.check(metric, rule)
        if run.done and on_done is not None:
            on_done(run.method.name, run.trace)
    while not all(run.done for run in runs):
        for run in runs:
            if run.done:
                continue
            run.advance(metric, rule, schedule)
            if run.done and on_done is not None:
                on_done(run.method.name, run.trace)
    return {run.method.name: run.trace for run in runs}


def run_summary(trace: Trace, final: Sequence[str] = ("test_nll",), best: str = "test_nll") -> dict[str, Any]:
    """How a run ended: stop reason, its own clock (wall and CPU), median time per step, the last value of every
    metric of ``final`` (``final_<metric>``) and the smallest of ``best`` (``best_<metric>``)."""
    return {
        "stop_reason": trace.stop_reason,
        "total_time": trace.total_time,
        "total_cpu_time": trace.cpu_time[-1],
        "median_step_time": trace.median_step_time(),
        **{f"final_{m}": trace.metrics[m][-1] for m in final},
        f"best_{best}": min(trace.metrics[best]),
    }


def print_run(name: str, trace: Trace, details: str = "", width: int = 28, indent: str = "") -> None:
    """One progress line for a finished run: iterations, own clock, median step time, ``details``, stop reason."""
    print(
        f"{indent}{name:{width}s} {trace.num_iterations:6d} it  {trace.total_time:7.2f} s  "
        f"{1e3 * trace.median_step_time():6.1f} ms/it  {details}({trace.stop_reason})",
        flush=True,
    )


# ---------------------------------------------------------------------------------------------------- time to target
@dataclass
class Hit:
    """When a trace first reached a target: wall time, CPU time and iterations of the method's own clock."""

    time: float
    cpu_time: float
    iteration: int


def _hit_at(trace: Trace, index: int) -> Hit:
    return Hit(trace.time[index], trace.cpu_time[index], trace.iteration[index])


def time_to_target(trace: Trace, metric: str, target: float) -> Hit | None:
    """The first evaluation with ``metric <= target``, or ``None`` if there is none."""
    for j, value in enumerate(trace.metrics[metric]):
        if value <= target:
            return _hit_at(trace, j)
    return None


def time_to_settle(trace: Trace, metric: str, level: float) -> Hit | None:
    """The first evaluation from which ``metric`` stays ``<= level`` until the end of the trace (``None`` if the
    last evaluation is above ``level``)."""
    values = trace.metrics[metric]
    first = None
    for j in range(len(values) - 1, -1, -1):
        if values[j] > level:
            break
        first = j
    return None if first is None else _hit_at(trace, first)


def hit_record(run: dict[str, Any], metric: str, target: float) -> dict[str, Any] | None:
    """:func:`time_to_target` of a run record's ``trace`` (a :meth:`Trace.to_dict`), as a dict."""
    hit = time_to_target(Trace.from_dict(run["trace"]), metric, target)
    return asdict(hit) if hit else None


def speedup(
    baseline: dict[str, Any],
    baseline_hit: dict[str, Any] | None,
    reference: dict[str, Any],
    reference_hit: dict[str, Any],
) -> dict[str, Any]:
    """How many times longer the ``baseline`` run took to a target than the ``reference`` run: in wall time, in CPU
    time, in iterations, in median cost per iteration and as iterations × median cost per iteration.

    The runs are :func:`run_summary` records with a ``trace``, the hits :class:`Hit` dicts; where the baseline never
    reached the target (``baseline_hit`` is ``None``) its whole run is used and the ratios are lower bounds
    (``is_lower_bound``).
    """
    done = baseline_hit is not None
    its = baseline_hit["iteration"] if done else baseline["trace"]["iteration"][-1]
    wall = baseline_hit["time"] if done else baseline["total_time"]
    cpu = baseline_hit["cpu_time"] if done else baseline["total_cpu_time"]
    cost, reference_cost = baseline["median_step_time"], reference["median_step_time"]
    return {
        "wall": wall / reference_hit["time"],
        "cpu": cpu / reference_hit["cpu_time"],
        "iterations_x_cost": (its * cost) / (reference_hit["iteration"] * reference_cost),
        "iterations": its / reference_hit["iteration"],
        "cost_per_iteration": cost / reference_cost,
        "is_lower_bound": not done,
    }


# ---------------------------------------------------------------------------------------------------- output
def format_ratio(value: float, lower_bound: bool = False) -> str:
    """``"12.3×"``, or ``"> 12.3×"`` for a lower bound."""
    return f"{'> ' if lower_bound else ''}{value:.1f}×"


# ---------------------------------------------------------------------------------------------------- figures
def new_figure(ncols: int, figsize: tuple[float, float], squeeze: bool = True) -> tuple[Any, Any]:
    """A Matplotlib figure with one row of ``ncols`` axes, on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=figsize, squeeze=squeeze)


def save_figure(fig: Any, path: Path) -> None:
    """Lay out, save as PNG (110 dpi, creating the parent folders) and close ``fig``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def timed_points(trace: dict[str, Any], *metrics: str) -> list[tuple[float, ...]]:
    """``(time, metric values...)`` of every evaluation after the first step of a :meth:`Trace.to_dict` record (a
    log time axis cannot show ``time == 0``)."""
    columns = zip(trace["time"], *(trace["metrics"][m] for m in metrics))
    return [point for point in columns if point[0] > 0]


def mean_sd(values: list[float], spec: str = ".3g") -> str:
    """``"mean ± sd"`` of ``values`` (sample sd; a single value is printed alone)."""
    t = torch.tensor(values, dtype=torch.float64)
    if t.numel() == 1:
        return format(float(t), spec)
    return f"{format(float(t.mean()), spec)} ± {format(float(t.std()), spec.lstrip('+'))}"
