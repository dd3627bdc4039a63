"""The validated settings of one fit: what :meth:`CAVIEngine.run <gpytorch_augment.inference.engine.CAVIEngine.run>`
iterates over and when it stops (built and checked against the engine by
:func:`~gpytorch_augment.inference._fit_setup.fit_config`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ._batches import Batch, ShuffleCursor, loader_batches, per_datum, tensor_batches
from .convergence import CAVITrace

#: the stopping rule of a fit: ``(trace, is_last_batch_of_the_epoch) -> stop``
StopRule = Callable[[CAVITrace, bool], bool]


@dataclass
class FitConfig:
    """What a fit iterates over and when it stops; built (and every argument checked) by
    :func:`~gpytorch_augment.inference._fit_setup.fit_config`."""

    x: Tensor | None
    y: Tensor | None
    kwargs: dict[str, Any]
    batch_size: int | None
    data_loader: Iterable[Any] | None
    generator: torch.Generator | None
    hyper_optimizer: torch.optim.Optimizer | None
    hyper_steps: int
    max_iter: int | None
    num_epochs: int | None
    num_batches: int | None
    check: StopRule
    sharded: bool = False
    cursor: ShuffleCursor | None = None

    def epoch(self) -> Iterator[Batch]:
        """The batches of one epoch as ``(x, y, kwargs, is_last_batch_of_the_epoch)``; with sharded data every rank
        yields ``num_batches`` of them (a rank whose shard runs out takes empty batches)."""
        if self.data_loader is not None:
            return loader_batches(self.data_loader)
        assert self.x is not None and self.y is not None
        batches = tensor_batches(self.x, self.y, self.batch_size, self.generator, self.kwargs, self.cursor)
        return padded(batches, self.num_batches, self.x, self.y, self.kwargs) if self.sharded else batches

    @property
    def prechecked(self) -> bool:
        """Whether the batches are slices of tensors whose values ``fit_config`` checked as a whole (then the loop
        skips the per-batch value checks, each a host synchronisation on CUDA); a data loader's batches are
        checked one by one."""
        return self.data_loader is None

    @property
    def total_steps(self) -> int | None:
        """The cap on the number of steps (``None``: none), for the progress bar."""
        total = self.max_iter
        if self.num_epochs is not None and self.num_batches is not None:
            steps = self.num_epochs * self.num_batches
            total = steps if total is None else min(total, steps)
        return total


def padded(
    batches: Iterator[Batch], num_batches: int | None, x: Tensor, y: Tensor, kwargs: dict[str, Any]
) -> Iterator[Batch]:
    """``batches`` followed by empty batches up to ``num_batches`` in all (the last one closes the epoch)."""
    count = 0
    for xb, yb, kb, _ in batches:
        count += 1
        yield xb, yb, kb, count == num_batches
    empty = slice(0, 0)
    while num_batches is not None and count < num_batches:
        count += 1
        kb = {k: (v[..., empty] if per_datum(v, y.shape[-1]) else v) for k, v in kwargs.items()}
        yield x[..., empty, :], y[..., empty], kb, count == num_batches
