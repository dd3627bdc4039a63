r"""On the GPU: CAVI and the samplers against GPyTorch and NumPyro on one device, float32 and float64, in four parts
(``--parts``): ``cavi`` (CAVI, frozen and learned hyper-parameters, against SVGP + Adam, NGD and
``LargeBatchVariationalStrategy`` on ``scale.synthetic_data``, time to target test NLL), ``samplers`` (Gibbs and HMC
against NumPyro's vectorised NUTS, worst bulk ESS per second), ``polya_gamma`` (torch-native draws against the host
round trip) and ``syncs`` (host synchronisations per step). Sizes :data:`SIZES` (``--quick`` = ``--size tiny``, a
CPU smoke run). What is measured and how to read ``gpu.{json,md}`` (default ``results/gpu``): ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # the checkout's package, installed or not

import _common as common  # noqa: E402
import _report  # noqa: E402
import gpytorch  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from scale import synthetic_data  # noqa: E402
from torch import Tensor  # noqa: E402

from gpytorch_augment import (  # noqa: E402
    CAVI,
    BernoulliLogitLikelihood,
    CAVIVariationalStrategy,
    GibbsSampler,
    GPPrior,
    HMCSampler,
    kmeans_plus_plus,
)
from gpytorch_augment.distributions.polya_gamma import _has_polyagamma, _sample_numpy  # noqa: E402
from gpytorch_augment.distributions.polya_gamma_torch import sample_polya_gamma  # noqa: E402
from gpytorch_augment.inference.diagnostics import bulk_ess  # noqa: E402
from gpytorch_augment.inference.schedules import AdaptiveStep  # noqa: E402

#: test NLL tolerance (nats) defining "reached the target"
TOLERANCE = 0.005
DTYPES = {"float32": torch.float32, "float64": torch.float64}

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"ns": [3000], "ms": [16], "batch_sizes": [256], "adam_lrs": [0.05], "ngd_lrs": [0.1],
             "max_time": 0.5, "eval_every": 5, "n_test": 500, "chains": [4], "sampler_n": 20,
             "sampler_draws": 30, "sampler_warmup": 20, "pg_sizes": [1000, 10000]},
    "short": {"ns": [1_000_000], "ms": [500], "batch_sizes": [8192], "adam_lrs": [0.01, 0.05], "ngd_lrs": [0.1],
              "max_time": 5.0, "eval_every": 25, "n_test": 10_000, "chains": [64, 1024], "sampler_n": 100,
              "sampler_draws": 200, "sampler_warmup": 100, "pg_sizes": [10_000, 1_000_000]},
    "full": {"ns": [1_000_000, 10_000_000], "ms": [500, 2000], "batch_sizes": [1024, 16384],
             "adam_lrs": [0.01, 0.05], "ngd_lrs": [0.1, 0.5], "max_time": 30.0, "eval_every": 50,
             "n_test": 10_000, "chains": [64, 256, 1024], "sampler_n": 200, "sampler_draws": 500,
             "sampler_warmup": 200, "pg_sizes": [10_000, 100_000, 1_000_000, 10_000_000]},
}  # fmt: skip


class _Stop(Exception):
    """Raised from a fit's callback when a run's time cap is reached."""


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def card_name(device: torch.device) -> str:
    """The GPU's name (e.g. ``NVIDIA H100 80GB HBM3``), or the CPU's description."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({common.machine_info()['processor']}, {torch.get_num_threads()} thread(s))"


def peak_memory_mb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


# ---------------------------------------------------------------------------------------------------- CAVI part
class RunClock:
    """A run's training clock: wall time between evaluations (synchronised), a time cap, and the test-NLL trace."""

    def __init__(self, device: torch.device, evaluate: Callable[[], dict[str, float]], max_time: float) -> None:
        self.device, self.evaluate, self.max_time = device, evaluate, max_time
        self.train_time, self.steps = 0.0, 0
        self.trace: list[tuple[float, int, float]] = []
        synchronize(device)
        self._last = time.perf_counter()

    def checkpoint(self, steps: int) -> None:
        """Stop the clock, evaluate, record; raise :class:`_Stop` past the cap."""
        synchronize(self.device)
        self.train_time += time.perf_counter() - self._last
        self.steps = steps
        nll = self.evaluate()["test_nll"]
        self.trace.append((self.train_time, steps, nll))
        if self.train_time >= self.max_time or not math.isfinite(nll):
            raise _Stop
        self._last = time.perf_counter()

    def summary(self) -> dict[str, Any]:
        best = min((nll for _, _, nll in self.trace), default=math.nan)
        return {"train_time": self.train_time, "steps": self.steps, "best_test_nll": best,
                "step_time": self.train_time / self.steps if self.steps else None, "trace": self.trace}  # fmt: skip


def _model(Z: Tensor, dist: type, strategy: type, learned: bool, dtype: torch.dtype) -> common.SparseGP:
    hypers = {"lengthscale": [math.sqrt(Z.shape[-1])] * Z.shape[-1], "outputscale": 1.0, "mean_constant": 0.0}
    return common.SparseGP(Z.cpu(), dist, strategy, hypers, frozen=not learned).to(device=Z.device, dtype=dtype)


def _batches(n: int, batch_size: int, device: torch.device, seed: int) -> Callable[[], Tensor]:
    """Endless index batches from seeded permutations drawn on the device (:func:`_common.index_batches`)."""
    return common.index_batches(n, batch_size, seed, device)


def run_cavi(data: dict[str, Tensor], Z: Tensor, batch_size: int, learned: bool, size: dict[str, Any]) -> dict:
    """CAVI through the public ``fit`` (mini-batch; with ``learned``, the one-call fit), stopped by its clock."""
    x, y, device = data["x"], data["y"], data["x"].device
    model = _model(Z, gpytorch.variational.NaturalVariationalDistribution, CAVIVariationalStrategy, learned, x.dtype)
    likelihood = BernoulliLogitLikelihood().to(device=device, dtype=x.dtype)
    cavi = CAVI(model, likelihood, num_data=y.numel(), step_size=AdaptiveStep())
    clock = RunClock(device, common.binary_evaluator(model, likelihood, data["x_test"], data["y_test"]),
                     size["max_time"])  # fmt: skip

    def callback(t: int, value: float) -> None:
        if (t + 1) % size["eval_every"] == 0:
            clock.checkpoint(t + 1)

    kwargs: dict[str, Any] = {"batch_size": batch_size, "generator": torch.Generator(device=device).manual_seed(0)}
    if learned:
        # the stochastic protocol (what the one-call fit chooses above NESTED_MAX_DATA points) at every size
        kwargs.update(learn_hyperparameters=True, hyper_options={"protocol": "stochastic"}, num_epochs=10**6, tol=0.0)
    else:
        kwargs.update(num_epochs=10**6, tol=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            cavi.fit(x, y, callback=callback, **kwargs)
        except _Stop:
            pass
    return clock.summary()


def run_cavi_default(data: dict[str, Tensor], Z: Tensor, size: dict[str, Any]) -> dict:
    """The one-call fit with every default (the subsample protocol at these sizes), end to end: one evaluation, at
    its own stop."""
    x, y, device = data["x"], data["y"], data["x"].device
    model = _model(Z, gpytorch.variational.NaturalVariationalDistribution, CAVIVariationalStrategy, True, x.dtype)
    likelihood = BernoulliLogitLikelihood().to(device=device, dtype=x.dtype)
    clock = RunClock(device, common.binary_evaluator(model, likelihood, data["x_test"], data["y_test"]), math.inf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = CAVI(model, likelihood, num_data=y.numel()).fit(
            x, y, learn_hyperparameters=True, generator=torch.Generator(device=device).manual_seed(0))
    clock.checkpoint(max(result.num_steps, 1))
    return {**clock.summary(), "protocol": result.protocol, "status": result.status.value, "stages": result.stages}


def run_peer(data: dict[str, Tensor], Z: Tensor, batch_size: int, learned: bool, engine: str, lr: float,
             size: dict[str, Any]) -> dict:  # fmt: skip
    """GPyTorch: ``adam`` (Cholesky q(u), Adam on everything), ``ngd`` (natural q(u), NGD lr=``lr``, Adam 0.01 on
    the hyper-parameters) or ``large_batch`` (``LargeBatchVariationalStrategy``, Cholesky q(u), Adam)."""
    x, y, device = data["x"], data["y"], data["x"].device
    V = gpytorch.variational
    if engine == "ngd":
        model = _model(Z, V.NaturalVariationalDistribution, V.VariationalStrategy, learned, x.dtype)
        optimizers: list[torch.optim.Optimizer] = [gpytorch.optim.NGD(model.variational_parameters(),
                                                                      num_data=y.numel(), lr=lr)]  # fmt: skip
        if learned:
            optimizers.append(torch.optim.Adam(model.hyperparameters(), lr=0.01))
    else:
        strategy = V.LargeBatchVariationalStrategy if engine == "large_batch" else V.VariationalStrategy
        model = _model(Z, V.CholeskyVariationalDistribution, strategy, learned, x.dtype)
        optimizers = [torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)]
    likelihood = BernoulliLogitLikelihood().to(device=device, dtype=x.dtype)
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=y.numel())
    next_batch = _batches(y.numel(), batch_size, device, seed=0)
    step = common.gradient_step(lambda: -mll(model(x[idx := next_batch()]), y[idx]), *optimizers)
    clock = RunClock(device, common.binary_evaluator(model, likelihood, data["x_test"], data["y_test"]),
                     size["max_time"])  # fmt: skip
    t = 0
    try:
        while True:
            step()
            t += 1
            if t % size["eval_every"] == 0:
                clock.checkpoint(t)
    except _Stop:
        pass
    return clock.summary()


def _time_to_target(run: dict[str, Any], target: float) -> float | None:
    return next((t for t, _, nll in run["trace"] if nll <= target), None)


def cavi_part(args: argparse.Namespace, size: dict[str, Any], device: torch.device) -> list[dict[str, Any]]:
    """Every (N, M, dtype, batch size, protocol) configuration of the CAVI part; one record per run."""
    records = []
    has_large_batch = hasattr(gpytorch.variational, "LargeBatchVariationalStrategy")
    for n in size["ns"]:
        x_all, y_all = synthetic_data(n)
        x_test_all, y_test_all = synthetic_data(size["n_test"], seed=123)
        for dtype_name in args.dtypes:
            dtype = DTYPES[dtype_name]
            data = {"x": x_all.to(device=device, dtype=dtype), "y": y_all.to(device=device, dtype=dtype),
                    "x_test": x_test_all.to(device=device, dtype=dtype),
                    "y_test": y_test_all.to(device=device, dtype=dtype)}  # fmt: skip
            for m in size["ms"]:
                sub = data["x"][torch.randperm(n, generator=torch.Generator().manual_seed(1))[:20_000].to(device)]
                Z = kmeans_plus_plus(sub, m, generator=torch.Generator(device=device).manual_seed(0))
                for learned in (False, True):
                    for batch_size in size["batch_sizes"]:
                        specs: list[tuple[str, float | None]] = [("cavi", None)]
                        if learned and batch_size == size["batch_sizes"][0]:  # batch-free: once per (N, M, dtype)
                            specs.append(("cavi_default", None))
                        specs += [("adam", lr) for lr in size["adam_lrs"]]
                        specs += [("ngd", lr) for lr in size["ngd_lrs"]]
                        if has_large_batch:
                            specs += [("large_batch", lr) for lr in size["adam_lrs"]]
                        config = {"n": n, "m": m, "dtype": dtype_name, "batch_size": batch_size,
                                  "hyperparameters": "learned" if learned else "frozen"}  # fmt: skip
                        runs = []
                        for engine, lr in specs:
                            reset_peak_memory(device)
                            try:
                                if engine == "cavi":
                                    result = run_cavi(data, Z, batch_size, learned, size)
                                elif engine == "cavi_default":
                                    result = run_cavi_default(data, Z, size)
                                else:
                                    result = run_peer(data, Z, batch_size, learned, engine, lr, size)
                                error = None
                            except (RuntimeError, ValueError) as err:  # e.g. out of memory: recorded, not fatal
                                result, error = {"trace": [], "best_test_nll": math.nan}, str(err)[:300]
                            runs.append({**config, "engine": engine, "lr": lr, **result, "error": error,
                                         "peak_memory_mb": peak_memory_mb(device)})  # fmt: skip
                            print(f"  cavi part {config} {engine} lr={lr}: best NLL {result['best_test_nll']:.4f}, "
                                  f"{result.get('steps', 0)} steps" + (f" ERROR {error}" if error else ""), flush=True)
                        best = min((r["best_test_nll"] for r in runs if math.isfinite(r["best_test_nll"])),
                                   default=math.nan)  # fmt: skip
                        for r in runs:
                            r["target"] = best + TOLERANCE
                            r["time_to_target"] = _time_to_target(r, best + TOLERANCE)
                        records += runs
            del data
    return records


def speedups(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration and each of ours (``cavi``; ``cavi_default``, the one-call fit with its defaults, in the
    learned configurations of the first batch size): its time to target against the fastest run of each peer
    engine (``None`` where either never reached the target)."""
    keys = sorted({(r["n"], r["m"], r["dtype"], r["batch_size"], r["hyperparameters"]) for r in records})
    out = []
    for key in keys:
        runs = [r for r in records if (r["n"], r["m"], r["dtype"], r["batch_size"], r["hyperparameters"]) == key]
        for ours in [r for r in runs if r["engine"].startswith("cavi")]:
            for engine in sorted({r["engine"] for r in runs if not r["engine"].startswith("cavi")}):
                hit = [r for r in runs if r["engine"] == engine and r["time_to_target"] is not None]
                fastest = min(hit, key=lambda r: r["time_to_target"]) if hit else None
                ratio = (fastest["time_to_target"] / ours["time_to_target"]
                         if fastest and ours["time_to_target"] else None)  # fmt: skip
                out.append({"config": key, "ours": ours["engine"], "peer": engine,
                            "peer_lr": fastest["lr"] if fastest else None,
                            "peer_time": fastest["time_to_target"] if fastest else None,
                            "cavi_time": ours["time_to_target"], "speedup": ratio})  # fmt: skip
    return out


# ---------------------------------------------------------------------------------------------------- samplers
def ExactGP(dim: int) -> GPPrior:
    """Zero mean, ``ScaleKernel(RBFKernel(ard_num_dims=D))`` with lengthscales :math:`\\sqrt D`, outputscale 1."""
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=dim))
    kernel.base_kernel.lengthscale = math.sqrt(dim)
    kernel.outputscale = 1.0
    return GPPrior(gpytorch.means.ZeroMean(), kernel)


def worst_ess(f: np.ndarray) -> float:
    """The smallest bulk ESS over the coordinates of ``f`` and ``f²`` (draws of shape (chains, draws, N))."""
    return float(min(bulk_ess(f).min(), bulk_ess(f * f).min()))


def run_package_sampler(cls: type, x: Tensor, y: Tensor, chains: int, size: dict[str, Any]) -> dict[str, Any]:
    device = x.device
    sampler = cls(ExactGP(x.shape[-1]).to(device=device, dtype=x.dtype), BernoulliLogitLikelihood(), x, y)
    warm = sampler.sample(2, warmup=size["sampler_warmup"], num_chains=chains, seed=0, progress=False)
    synchronize(device)
    start = time.perf_counter()
    samples = sampler.resume(warm, size["sampler_draws"], progress=False)
    synchronize(device)
    seconds = time.perf_counter() - start
    f = samples.f[:, 2:].detach().to("cpu", torch.float64).numpy()
    ess = worst_ess(f)
    return {"seconds": seconds, "worst_ess": ess, "ess_per_second": ess / seconds}


def run_numpyro(x: Tensor, y: Tensor, chains: int, size: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """NumPyro NUTS, vectorised chains, on the matching JAX device: f = L z, z ~ N(0, I), y ~ Bernoulli(logits=f)."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    jax.config.update("jax_enable_x64", x.dtype == torch.float64)
    if device.type == "cuda":
        try:
            jax_device = jax.devices("cuda")[0]
        except RuntimeError:  # older JAX names the platform "gpu"
            jax_device = jax.devices("gpu")[0]
    else:
        jax_device = jax.devices("cpu")[0]
    K = ExactGP(x.shape[-1]).to(dtype=torch.float64).covar_module(x.cpu().double()).to_dense().detach()
    L_np = torch.linalg.cholesky(K + 1e-6 * torch.eye(K.shape[-1], dtype=torch.float64)).numpy()
    np_dtype = np.float64 if x.dtype == torch.float64 else np.float32
    L = jax.device_put(jnp.asarray(L_np.astype(np_dtype)), jax_device)
    labels = jax.device_put(jnp.asarray(y.cpu().numpy().astype(np_dtype)), jax_device)

    def model(L: Any, labels: Any) -> None:
        z = numpyro.sample("z", dist.Normal(jnp.zeros(L.shape[0], dtype=L.dtype), 1.0).to_event(1))
        numpyro.sample("y", dist.Bernoulli(logits=L @ z).to_event(1), obs=labels)

    with jax.default_device(jax_device):
        mcmc = MCMC(NUTS(model), num_warmup=size["sampler_warmup"], num_samples=size["sampler_draws"],
                    num_chains=chains, chain_method="vectorized", progress_bar=False)  # fmt: skip
        mcmc.run(jax.random.PRNGKey(0), L, labels)  # warm-up and compilation
        mcmc.post_warmup_state = mcmc.last_state
        start = time.perf_counter()
        mcmc.run(mcmc.post_warmup_state.rng_key, L, labels)
        z = jax.block_until_ready(mcmc.get_samples(group_by_chain=True)["z"])
        seconds = time.perf_counter() - start
    f = np.asarray(z, dtype=np.float64) @ L_np.T
    ess = worst_ess(f)
    return {"seconds": seconds, "worst_ess": ess, "ess_per_second": ess / seconds}


def sampler_part(args: argparse.Namespace, size: dict[str, Any], device: torch.device) -> list[dict[str, Any]]:
    try:
        import numpyro  # noqa: F401

        has_numpyro = True
    except ImportError:
        has_numpyro = False
    records = []
    x_all, y_all = synthetic_data(size["sampler_n"], seed=5)
    for dtype_name in args.dtypes:
        dtype = DTYPES[dtype_name]
        x, y = x_all.to(device=device, dtype=dtype), y_all.to(device=device, dtype=dtype)
        for chains in size["chains"]:
            methods: list[tuple[str, Callable[[], dict[str, Any]]]] = [
                ("GibbsSampler", lambda: run_package_sampler(GibbsSampler, x, y, chains, size)),
                ("HMCSampler", lambda: run_package_sampler(HMCSampler, x, y, chains, size)),
            ]
            if has_numpyro:
                methods.append(("NumPyro NUTS (vectorized)", lambda: run_numpyro(x, y, chains, size, device)))
            for name, run in methods:
                try:
                    result, error = run(), None
                except (RuntimeError, ValueError, ImportError) as err:
                    result, error = {}, str(err)[:300]
                records.append({"method": name, "dtype": dtype_name, "chains": chains, "n": size["sampler_n"],
                                "draws": size["sampler_draws"], **result, "error": error})  # fmt: skip
                note = f" ERROR {error}" if error else ""
                print(f"  samplers {name} {dtype_name} chains={chains}: {result}{note}", flush=True)
            if not has_numpyro:
                records.append({"method": "NumPyro NUTS (vectorized)", "dtype": dtype_name, "chains": chains,
                                "n": size["sampler_n"], "error": "numpyro is not installed"})  # fmt: skip
    return records


# ---------------------------------------------------------------------------------------------------- Pólya-Gamma
def _best_of(fn: Callable[[], Any], device: torch.device, repeats: int = 3) -> float:
    fn()  # warm-up
    best = math.inf
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def polya_gamma_part(size: dict[str, Any], device: torch.device) -> list[dict[str, Any]]:
    """PG(1, c) draws: the torch-native sampler on ``device`` against the host round trip through ``polyagamma``."""
    records = []
    for n in size["pg_sizes"]:
        g = torch.Generator(device=device).manual_seed(0)
        c = torch.randn(n, generator=g, device=device, dtype=torch.float64).mul(2.0).abs()
        b = torch.ones_like(c)
        native = _best_of(lambda: sample_polya_gamma(b, c, g), device)
        host = None
        if _has_polyagamma():
            rng = np.random.default_rng(0)

            def round_trip() -> Tensor:
                draws = _sample_numpy(b.cpu().numpy(), c.cpu().numpy(), rng)
                return torch.from_numpy(draws).to(device)

            host = _best_of(round_trip, device)
        records.append({"n": n, "torch_native_s": native, "host_round_trip_s": host,
                        "host_over_native": host / native if host else None})  # fmt: skip
        print(f"  polya-gamma n={n}: native {native * 1e3:.2f} ms, host round trip "
              f"{'—' if host is None else f'{host * 1e3:.2f} ms'}", flush=True)  # fmt: skip
    return records


# ---------------------------------------------------------------------------------------------------- syncs
def count_syncs(fn: Callable[[], Any], device: torch.device) -> int | None:
    """Host synchronisations during ``fn()`` (``torch.cuda.set_sync_debug_mode('warn')``); ``None`` off CUDA."""
    if device.type != "cuda":
        return None
    synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # (the mode's own notice about its coverage is not a synchronisation)
    return sum("called a synchronizing" in str(w.message) for w in caught)


def sync_part(size: dict[str, Any], device: torch.device) -> list[dict[str, Any]]:
    """Host synchronisations per CAVI step (mini-batch, data checked beforehand, as inside ``fit``), per Gibbs
    sweep and per HMC transition (the difference between 11 and 1 steps of ``resume``, over 10)."""
    x, y = (t.to(device=device, dtype=torch.float64) for t in synthetic_data(2000, seed=3))
    Z = x[:32].clone()
    model = _model(Z, gpytorch.variational.NaturalVariationalDistribution, CAVIVariationalStrategy, False,
                   torch.float64)  # fmt: skip
    cavi = CAVI(model, BernoulliLogitLikelihood().to(device), num_data=y.numel())
    data = cavi.check_data(x, y)  # checked once, as CAVI.fit does
    cavi.step(data.take(slice(0, 256)))
    batch = data.take(slice(256, 512))

    def cavi_step() -> None:
        cavi.step(batch)  # a step on checked data checks nothing

    rows = [{"what": "CAVI mini-batch step (256 points, M = 32)", "syncs": count_syncs(cavi_step, device)}]
    xs, ys = x[: size["sampler_n"]], y[: size["sampler_n"]]
    for cls in (GibbsSampler, HMCSampler):
        sampler = cls(ExactGP(x.shape[-1]).to(device=device, dtype=torch.float64), BernoulliLogitLikelihood(), xs, ys)
        start = sampler.sample(2, warmup=2, num_chains=8, seed=0, progress=False)
        one = count_syncs(lambda: sampler.resume(start, 1, progress=False), device)
        eleven = count_syncs(lambda: sampler.resume(start, 11, progress=False), device)
        per = None if one is None or eleven is None else (eleven - one) / 10
        rows.append({"what": f"{cls.__name__}: per {'sweep' if cls is GibbsSampler else 'transition'} "
                     f"({size['sampler_n']} points, 8 chains)", "syncs": per})  # fmt: skip
    for row in rows:
        print(f"  syncs: {row['what']}: {'not applicable (CPU)' if row['syncs'] is None else row['syncs']}",
              flush=True)  # fmt: skip
    return rows


# ---------------------------------------------------------------------------------------------------- report
def report(result: dict[str, Any]) -> tuple[str, dict[str, Any], list[_report.Table]]:
    title = f"On the GPU: CAVI and the samplers ({result['card']})"
    settings = {"card": result["card"], "device": result["device"], "size": result["size"],
                "dtypes": ", ".join(result["dtypes"]), "torch / gpytorch": f"{torch.__version__} / "
                f"{gpytorch.__version__}", "LargeBatchVariationalStrategy": result["has_large_batch"],
                "wall time [s]": round(result["wall_time"], 1)}  # fmt: skip
    tables = []
    if result.get("cavi"):
        rows = [[r["n"], r["m"], r["dtype"], r["batch_size"], r["hyperparameters"], r["engine"], r["lr"],
                 r["time_to_target"], r.get("steps"), None if r.get("step_time") is None else 1e3 * r["step_time"],
                 r["best_test_nll"], r["peak_memory_mb"], r["error"]] for r in result["cavi"]]  # fmt: skip
        tables.append(_report.Table("CAVI against GPyTorch: time to target test NLL (best of the configuration + "
                                    f"{TOLERANCE})", ["N", "M", "dtype", "batch", "hyper-parameters", "method", "lr",
                                    "time to target [s]", "steps", "step [ms]", "best test NLL", "peak memory [MiB]",
                                    "error"], rows))  # fmt: skip
        rows = [[*s["config"], s.get("ours", "cavi"), s["peer"], s["peer_lr"], s["peer_time"], s["cavi_time"],
                 s["speedup"]] for s in result["speedups"]]  # fmt: skip
        tables.append(_report.Table("CAVI's speed-up over the fastest run of each peer (time to target)",
                                    ["N", "M", "dtype", "batch", "hyper-parameters", "ours", "peer", "peer lr",
                                     "peer [s]", "ours [s]", "speed-up"], rows))  # fmt: skip
    if result.get("samplers"):
        rows = [[r["method"], r["dtype"], r["chains"], r["n"], r.get("seconds"), r.get("worst_ess"),
                 r.get("ess_per_second"), r["error"]] for r in result["samplers"]]  # fmt: skip
        tables.append(_report.Table("Samplers, steady state: worst-metric bulk ESS (f and f²) per second",
                                    ["method", "dtype", "chains", "N", "sampling [s]", "worst ESS", "ESS / s",
                                     "error"], rows))  # fmt: skip
    if result.get("polya_gamma"):
        rows = [[r["n"], 1e3 * r["torch_native_s"], None if r["host_round_trip_s"] is None else
                 1e3 * r["host_round_trip_s"], r["host_over_native"]] for r in result["polya_gamma"]]  # fmt: skip
        tables.append(_report.Table("PG(1, c) draws: torch-native on the device against the host round trip",
                                    ["draws", "torch-native [ms]", "host round trip (polyagamma) [ms]",
                                     "host / native"], rows))  # fmt: skip
    if result.get("syncs"):
        rows = [[r["what"], "not applicable (CPU)" if r["syncs"] is None else r["syncs"]] for r in result["syncs"]]
        tables.append(_report.Table("Host synchronisations (torch.cuda.set_sync_debug_mode)", ["what", "syncs"], rows))
    return title, settings, tables


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.run_arguments(p, "the same as --size tiny (a CPU smoke run)", threads_help="torch CPU threads", caps=False)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--size", choices=sorted(SIZES), default="short")
    p.add_argument("--parts", nargs="+", choices=["cavi", "samplers", "polya_gamma", "syncs"],
                   default=["cavi", "samplers", "polya_gamma", "syncs"])  # fmt: skip
    p.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["float32", "float64"])
    p.add_argument("--ns", type=int, nargs="+", default=None, help="training set sizes (overrides --size's)")
    p.add_argument("--ms", type=int, nargs="+", default=None, help="numbers of inducing points")
    p.add_argument("--chains", type=int, nargs="+", default=None)
    p.add_argument("--max-time", type=float, default=None, help="cap of each run's training clock [s]")
    p.add_argument("--copy-to", type=Path, default=None, help="also copy gpu.{json,md} there (e.g. $OUT)")
    args = p.parse_args(argv)
    if args.quick:
        args.size = "tiny"
    args.output_dir = common.output_dir(args.output_dir, args.quick, full=common.RESULTS_DIR / "gpu")
    try:
        args.device = torch.device(args.device)
    except RuntimeError as err:
        p.error(f"--device: {err}")
    if args.device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here (use --device cpu)")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    machine = common.start_run(args.threads, args.seed)
    size = dict(SIZES[args.size])
    for key in ("ns", "ms", "chains", "max_time"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)
    device = args.device
    start = time.perf_counter()
    has_large_batch = hasattr(gpytorch.variational, "LargeBatchVariationalStrategy")
    result: dict[str, Any] = {"card": card_name(device), "device": str(device), "size": args.size,
                              "dtypes": args.dtypes, "settings": size, "machine": machine,
                              "has_large_batch": has_large_batch}  # fmt: skip
    print(f"gpu benchmark on {result['card']} ({args.size})", flush=True)

    def write() -> None:
        """The report of the parts run so far (rewritten after each, so a run stopped early leaves its tables)."""
        result["wall_time"] = time.perf_counter() - start
        title, settings, tables = report(result)
        _report.write_report(args.output_dir, "gpu", result, title, settings, tables, echo=False)
        if args.copy_to is not None:
            args.copy_to.mkdir(parents=True, exist_ok=True)
            for suffix in ("json", "md"):
                shutil.copy(args.output_dir / f"gpu.{suffix}", args.copy_to / f"gpu.{suffix}")

    # the quick parts first, then CAVI (the headline), then the samplers (NumPyro's compilation is the slowest)
    parts = {"syncs": lambda: sync_part(size, device), "polya_gamma": lambda: polya_gamma_part(size, device),
             "cavi": lambda: cavi_part(args, size, device), "samplers": lambda: sampler_part(args, size, device)}
    for name, run in parts.items():
        if name in args.parts:
            result[name] = run()
            if name == "cavi":
                result["speedups"] = speedups(result["cavi"])
            write()
    print(f"done in {result['wall_time']:.0f} s -> {args.output_dir}", flush=True)
    return result


if __name__ == "__main__":
    main()
