"""CAVI and Gibbs chains over several processes (``torch.distributed``, gloo on 127.0.0.1), against one process.

Two ranks are spawned once for all the agreement checks (each writes its results to a file; the test process
computes the single-process references); a second spawn checks that a rank that fails makes the others raise
instead of hanging. Every process group has a short timeout, and every join is bounded.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import socket
import sys
import traceback
from pathlib import Path

import gpytorch
import pytest
import torch

from gpytorch_augment import (
    CAVI,
    BernoulliLogitLikelihood,
    GibbsSampler,
    PairwiseLogitLikelihood,
    PoissonLogitLikelihood,
)
from gpytorch_augment.core.distributed import DistributedError
from gpytorch_augment.inference.mcmc import rank_seed
from gpytorch_augment.inference.schedules import RobbinsMonro
from tests.inference.test_gibbs import PlainGP
from tests.models import SVGP

#: the slow tier (multi-process runs): `pytest -m "not slow"` leaves it out
pytestmark = pytest.mark.slow

WORLD = 2
TIMEOUT_S = 20
JOIN_S = 240
N = 60


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _data(counts: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(N, 1, generator=g, dtype=torch.float64) * 6 - 3
    f = 0.5 + torch.sin(2 * x.squeeze(-1))
    y = torch.poisson(3 * torch.sigmoid(f), generator=g) if counts else torch.bernoulli(torch.sigmoid(f), generator=g)
    z = torch.linspace(-3, 3, 8, dtype=torch.float64).unsqueeze(-1)
    return x, y, z


def _shard(n: int, rank: int, split: str) -> slice:
    """Rows of ``rank``: halves, 70/30, or everything on rank 0 (rank 1 empty)."""
    cut = {"even": n // 2, "uneven": (7 * n) // 10, "empty": n}[split]
    return slice(0, cut) if rank == 0 else slice(cut, n)


def _q(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.variational_parameters()]


def full_batch(rank: int, split: str, hyper: bool = False, counts: bool = False) -> dict:
    """Full-batch CAVI (optionally with Adam hyper-parameter steps, or a Poisson likelihood whose rate scale is
    updated in closed form) on this rank's shard (``rank = -1``: all the data in one process)."""
    x, y, z = _data(counts)
    if rank >= 0:
        rows = _shard(N, rank, split)
        x, y = x[rows], y[rows]
    torch.manual_seed(0)
    model = SVGP(z, mean_constant=0.3).double()
    likelihood = PoissonLogitLikelihood(rate_scale=2.0).double() if counts else BernoulliLogitLikelihood()
    cavi = CAVI(model, likelihood, num_data=N)
    optimizer = torch.optim.Adam(model.hyperparameters(), lr=0.05) if hyper else None
    trace = cavi.fit(x, y, max_iter=6, tol=0.0, hyper_optimizer=optimizer)
    out = {"elbo": torch.tensor(trace.elbo), "q": _q(model), "final": float(cavi.elbo(x, y))}
    out["hyper"] = [p.detach().clone() for p in model.hyperparameters()]
    out["likelihood"] = [p.detach().clone() for p in likelihood.parameters()]
    return out


def comparisons(rank: int) -> dict:
    """Full-batch CAVI on pairwise comparisons (linear observations): every rank holds all the points and its share
    of the comparisons (the rows of the design), 70/30."""
    x, _, z = _data()
    g = torch.Generator().manual_seed(4)
    first = torch.randint(0, N, (40,), generator=g)
    pairs = torch.stack([first, (first + torch.randint(1, N, (40,), generator=g)) % N], -1)
    labels = torch.ones(40, dtype=torch.float64)
    if rank >= 0:
        rows = _shard(40, rank, "uneven")
        pairs, labels = pairs[rows], labels[rows]
    torch.manual_seed(0)
    model = SVGP(z).double()
    cavi = CAVI(model, PairwiseLogitLikelihood(), num_data=40)
    trace = cavi.fit(x, labels, comparisons=pairs, max_iter=6, tol=0.0)
    return {"elbo": torch.tensor(trace.elbo), "q": _q(model)}


def minibatch(rank: int) -> dict:
    """Mini-batch steps on a fixed sequence of global batches; rank r takes the r-th half of every batch."""
    x, y, z = _data()
    g = torch.Generator().manual_seed(5)
    batches = [torch.randperm(N, generator=g)[:20] for _ in range(6)]
    torch.manual_seed(0)
    model = SVGP(z, mean_constant=0.3).double()
    cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=N, step_size=RobbinsMonro(tau=1.0, kappa=0.7))
    trace = []
    for idx in batches:
        if rank >= 0:
            idx = idx[:12] if rank == 0 else idx[12:]  # uneven halves of the global batch
        trace.append(float(cavi.step(x[idx], y[idx])))
    return {"elbo": torch.tensor(trace), "q": _q(model)}


def chains(rank: int) -> dict:
    x, y, _ = _data()
    sampler = GibbsSampler(PlainGP(mean_constant=0.3).double(), BernoulliLogitLikelihood(), x[:20], y[:20])
    samples = sampler.sample(5, warmup=2, num_chains=5, seed=3, progress=False)
    return {"f": samples.f, "num_chains": samples.num_chains}


def checkpoint(rank: int, path: str) -> dict:
    x, y, z = _data()
    rows = _shard(N, rank, "even")
    model = SVGP(z, mean_constant=0.3).double()
    cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=N)
    cavi.fit(x[rows], y[rows], max_iter=3, tol=0.0)
    cavi.save_checkpoint(path)
    return {"q": _q(model)}


def _worker(rank: int, port: int, out_dir: str, fail: bool) -> None:
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)  # as the test process (tests/conftest.py)
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=TIMEOUT_S)
    )
    result: dict = {}
    try:
        if fail:
            if rank == 1:
                raise RuntimeError("rank 1 fails on purpose")
            x, y, z = _data()
            cavi = CAVI(SVGP(z).double(), BernoulliLogitLikelihood(), num_data=N)
            try:
                cavi.step(x[:30], y[:30])
                result["raised"] = None
            except DistributedError as err:
                result["raised"] = str(err)
        else:
            for split in ("even", "uneven", "empty"):
                result[f"full/{split}"] = full_batch(rank, split)
            result["full/hyper"] = full_batch(rank, "uneven", hyper=True)
            result["full/poisson"] = full_batch(rank, "uneven", counts=True)
            result["minibatch"] = minibatch(rank)
            result["comparisons"] = comparisons(rank)
            result["chains"] = chains(rank)
            result["checkpoint"] = checkpoint(rank, str(Path(out_dir) / "checkpoint.pt"))
    except BaseException:
        result["error"] = traceback.format_exc()
        if fail:
            torch.save(result, Path(out_dir) / f"rank{rank}.pt")
            sys.exit(1)
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def _run(tmp_path: Path, fail: bool = False) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, str(tmp_path), fail)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(JOIN_S)
    for p in procs:
        if p.is_alive():
            p.kill()
            pytest.fail("a rank hung past the join timeout")
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    if not fail:
        for r, res in enumerate(results):
            assert "error" not in res, f"rank {r} failed:\n{res['error']}"
    return results


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[list[dict], Path]:
    path = tmp_path_factory.mktemp("distributed")
    return _run(path), path


def _close(a, b, tol=1e-10):
    for s, t in zip(a, b):
        torch.testing.assert_close(s, t, rtol=tol, atol=tol)


@pytest.mark.parametrize("split", ["even", "uneven", "empty"])
def test_sharded_full_batch_cavi_equals_one_process(two_ranks, split):
    results, _ = two_ranks
    reference = full_batch(-1, split)
    for res in results:  # every rank holds the same q(u), and the same global ELBO trace
        _close(res[f"full/{split}"]["q"], reference["q"])
        _close([res[f"full/{split}"]["elbo"]], [reference["elbo"]])
        assert res[f"full/{split}"]["final"] == pytest.approx(reference["final"], rel=1e-10)


def test_sharded_hyperparameter_gradients_and_closed_form_constants(two_ranks):
    results, _ = two_ranks
    hyper, poisson = full_batch(-1, "uneven", hyper=True), full_batch(-1, "uneven", counts=True)
    for res in results:
        _close(res["full/hyper"]["hyper"], hyper["hyper"], tol=1e-9)
        _close(res["full/hyper"]["q"], hyper["q"], tol=1e-9)
        _close(res["full/poisson"]["likelihood"], poisson["likelihood"])
        _close(res["full/poisson"]["q"], poisson["q"])


def test_sharded_comparisons_equal_one_process(two_ranks):
    """Linear observations (a comparison reads f_i - f_j) reduce over ranks like pointwise ones."""
    results, _ = two_ranks
    reference = comparisons(-1)
    for res in results:
        _close(res["comparisons"]["q"], reference["q"])
        _close([res["comparisons"]["elbo"]], [reference["elbo"]])


def test_sharded_minibatch_trajectory_equals_one_process(two_ranks):
    results, _ = two_ranks
    reference = minibatch(-1)
    for res in results:
        _close([res["minibatch"]["elbo"]], [reference["elbo"]])
        _close(res["minibatch"]["q"], reference["q"])


def test_chains_spread_over_ranks_equal_single_process_chains(two_ranks):
    results, _ = two_ranks
    x, y, _ = _data()
    assert results[0]["chains"]["num_chains"] == 5 and results[1]["chains"]["num_chains"] == 3
    gathered = results[0]["chains"]["f"]
    start = 0
    for r, count in enumerate((2, 3)):  # rank r runs chains [5r/2, 5(r+1)/2)
        sampler = GibbsSampler(PlainGP(mean_constant=0.3).double(), BernoulliLogitLikelihood(), x[:20], y[:20])
        alone = sampler.sample(5, warmup=2, num_chains=count, seed=rank_seed(3, r, WORLD), progress=False)
        torch.testing.assert_close(gathered[start : start + count], alone.f, rtol=0, atol=0)
        start += count
    torch.testing.assert_close(results[1]["chains"]["f"], gathered[2:], rtol=0, atol=0)


def test_checkpoint_written_by_rank_zero_loads_in_one_process(two_ranks):
    results, path = two_ranks
    _, _, z = _data()
    model = SVGP(z).double()
    cavi = CAVI(model, BernoulliLogitLikelihood(), num_data=N)
    cavi.load_state_dict(torch.load(path / "checkpoint.pt", weights_only=True))
    _close(_q(model), results[0]["checkpoint"]["q"], tol=0)
    assert cavi.num_steps == 3


def test_a_failing_rank_makes_the_others_raise(tmp_path):
    results = _run(tmp_path, fail=True)
    assert "rank 1 fails on purpose" in results[1]["error"]
    assert results[0].get("raised"), results[0]


def test_single_process_objects_are_untouched_by_the_distributed_code():
    """Without torch.distributed the engines take their single-process path (no collectives)."""
    x, y, z = _data()
    cavi = CAVI(SVGP(z).double(), BernoulliLogitLikelihood(), num_data=N)
    assert not cavi.distributed
    assert cavi.fit(x, y, max_iter=3).num_steps == 3
    assert isinstance(gpytorch.__version__, str)
