"""The validated settings of one fit: what :meth:`CAVIEngine.run <gpytorch_augment.inference.engine.CAVIEngine.run>`
iterates over and when it stops (built and checked against the engine by
:func:`~gpytorch_augment.inference._fit_setup.fit_config`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..core.data import ObservedData
from ._batches import Batch, BatchCheck, ShuffleCursor, loader_batches, tensor_batches
from .convergence import CAVITrace

#: the stopping rule of a fit: ``(trace, is_last_batch_of_the_epoch) -> stop``
StopRule = Callable[[CAVITrace, bool], bool]


@dataclass
class FitConfig:
    """What a fit iterates over and when it stops; built (and every argument checked) by
    :func:`~gpytorch_augment.inference._fit_setup.fit_config`. The data are either ``data``, checked once as a
    whole, or the batches of ``data_loader``, each checked by ``check_batch`` as it comes."""

    data: ObservedData | None
    batch_size: int | None
    data_loader: Iterable[Any] | None
    check_batch: BatchCheck | None
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
        """The batches of one epoch as ``(batch, is_last_batch_of_the_epoch)``; with sharded data every rank yields
        ``num_batches`` of them (a rank whose shard runs out takes empty batches)."""
        if self.data_loader is not None:
            assert self.check_batch is not None
            return loader_batches(self.data_loader, self.check_batch)
        assert self.data is not None
        batches = tensor_batches(self.data, self.batch_size, self.generator, self.cursor)
        return padded(batches, self.num_batches, self.data) if self.sharded else batches

    @property
    def total_steps(self) -> int | None:
        """The cap on the number of steps (``None``: none), for the progress bar."""
        total = self.max_iter
        if self.num_epochs is not None and self.num_batches is not None:
            steps = self.num_epochs * self.num_batches
            total = steps if total is None else min(total, steps)
        return total


def padded(batches: Iterator[Batch], num_batches: int | None, data: ObservedData) -> Iterator[Batch]:
    """``batches`` followed by empty batches of ``data`` up to ``num_batches`` in all (the last one closes the
    epoch)."""
    count = 0
    for batch, _ in batches:
        count += 1
        yield batch, count == num_batches
    while num_batches is not None and count < num_batches:
        count += 1
        yield data.take(slice(0, 0)), count == num_batches
