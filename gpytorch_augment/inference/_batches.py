"""How :meth:`CAVI.fit <gpytorch_augment.CAVI.fit>` walks through the data (full batch, shuffled mini-batches of
tensors checked once as a whole, or the batches of a torch ``DataLoader``, each checked as it comes) and keeps its
clock and progress bar. Every batch is an :class:`~gpytorch_augment.core.ObservedData`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..core.data import ObservedData
from .convergence import CAVITrace

#: a batch of checked data and whether it is the last of its epoch
Batch = tuple[ObservedData, bool]
#: the check of a data loader's batch ``(x, y, kwargs)``
BatchCheck = Callable[[Tensor, Tensor, dict[str, Any]], ObservedData]


def take(t: Tensor, idx: Tensor | slice) -> Tensor:
    """The data points ``idx`` of a per-datum tensor whose last dimension indexes the data."""
    return t[..., idx]


def unpack(batch: Any) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """A data-loader batch as ``(x, y, kwargs)``: ``(x, y)``, ``(x, y, {name: tensor})`` or
    ``{"x": x, "y": y, name: tensor, ...}``."""
    if isinstance(batch, Mapping):
        if "x" not in batch or "y" not in batch:
            raise ValueError(f"a dict batch needs the keys 'x' and 'y', got {sorted(batch)}")
        return batch["x"], batch["y"], {k: v for k, v in batch.items() if k not in ("x", "y")}
    if isinstance(batch, (tuple, list)):
        if len(batch) == 2:
            return batch[0], batch[1], {}
        if len(batch) == 3 and isinstance(batch[2], Mapping):
            return batch[0], batch[1], dict(batch[2])
    raise ValueError(
        "the data loader must yield (x, y), (x, y, {name: per-datum tensor}) or {'x': x, 'y': y, name: tensor}; "
        f"got a {type(batch).__name__}" + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
    )


def loader_batches(data_loader: Any, check: BatchCheck) -> Iterator[Batch]:
    """One epoch of a data loader as ``(batch, is_last_batch_of_the_epoch)``, each batch checked by ``check`` (the
    loader's batches enter here: nothing checked them before)."""
    iterator = iter(data_loader)
    batch = next(iterator, None)
    while batch is not None:
        following = next(iterator, None)
        yield check(*unpack(batch)), following is None
        batch = following


@dataclass
class ShuffleCursor:
    """Where a shuffled mini-batch fit is in its data: the permutation of the epoch under way (``None`` between
    epochs), how many of its points were handed out, and the shuffling generator's state after drawing it (so that
    a fit reloaded from a checkpoint continues with the same batches)."""

    order: Tensor | None = None
    position: int = 0
    rng_state: Tensor | None = None
    #: a generator state from a checkpoint, to be set on the shuffling generator when the next fit starts
    pending_rng_state: Tensor | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"order": self.order, "position": self.position, "rng_state": self.rng_state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.order, self.position = state.get("order"), int(state.get("position", 0))
        self.rng_state = self.pending_rng_state = state.get("rng_state")


def _rng_state(generator: torch.Generator | None, device: torch.device) -> Tensor:
    """The state of the generator the permutation is drawn from (``None``: torch's default one for ``device``)."""
    if generator is not None:
        return generator.get_state()
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.random.get_rng_state()


def _set_rng_state(generator: torch.Generator | None, device: torch.device, state: Tensor) -> None:
    if generator is not None:
        generator.set_state(state)
    elif device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.random.set_rng_state(state)


def tensor_batches(
    data: ObservedData,
    batch_size: int | None,
    generator: torch.Generator | None,
    cursor: ShuffleCursor | None = None,
) -> Iterator[Batch]:
    """One epoch over ``data``: the full batch (``data`` itself), or a fresh random permutation (drawn from
    ``generator``, default torch's global generator) in batches of ``batch_size`` (:meth:`ObservedData.take
    <gpytorch_augment.core.ObservedData.take>`: per-datum keyword data are sliced along with the targets, nothing is
    checked again). With a ``cursor``, an epoch left unfinished continues where it stopped and the cursor follows the
    batches."""
    num_data, x = data.num_data, data.x
    if batch_size is None or batch_size >= num_data:
        yield data, True
        return
    cursor = ShuffleCursor() if cursor is None else cursor
    # the permutation is drawn on the generator's device (a CPU generator with CUDA data works), then moved
    device = torch.device(generator.device if generator is not None else x.device)
    if cursor.pending_rng_state is not None:
        _set_rng_state(generator, device, cursor.pending_rng_state)
        cursor.pending_rng_state = None
    if cursor.order is None or cursor.order.shape[-1] != num_data:
        cursor.order = torch.randperm(num_data, generator=generator, device=device).to(x.device)
        cursor.position, cursor.rng_state = 0, _rng_state(generator, device)
    order = cursor.order.to(x.device)
    for start in range(cursor.position, num_data, batch_size):
        idx = order[start : start + batch_size]
        last = start + batch_size >= num_data
        cursor.position = start + idx.shape[0]
        if last:
            cursor.order, cursor.position = None, 0
        yield data.take(idx), last


def progress_bar(total: int | None, desc: str = "CAVI", unit: str = "step") -> Any:
    """A tqdm bar: the notebook widget when ipywidgets is installed, plain text otherwise (without tqdm's warning)."""
    try:
        import ipywidgets  # noqa: F401
        from tqdm.auto import tqdm
    except ImportError:
        from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, mininterval=0.5)


class Clock:
    """Training wall time: :meth:`elapsed` excludes the time spent inside :meth:`paused` blocks."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self._paused = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self._start - self._paused

    @contextmanager
    def paused(self) -> Iterator[None]:
        before = time.perf_counter()
        try:
            yield
        finally:
            self._paused += time.perf_counter() - before


def show_progress(bar: Any, trace: CAVITrace) -> None:
    postfix = {"elbo": f"{trace.elbo[-1]:.4f}", "epoch": trace.epoch[-1]}
    if trace.held_out:
        postfix["held_out"] = f"{trace.held_out[-1]:.4f}"
    bar.set_postfix(postfix, refresh=False)
    bar.update(1)
