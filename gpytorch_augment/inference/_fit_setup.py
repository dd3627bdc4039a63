"""A fit's arguments checked against the engine it runs on, once, up front: the data (:func:`fit_data`, which gives
the :class:`~gpytorch_augment.core.ObservedData` of tensors, checked as a whole) and every setting (:func:`fit_config`,
which returns the :class:`~gpytorch_augment.inference._fit_config.FitConfig` that
:meth:`CAVIEngine.run <gpytorch_augment.inference.engine.CAVIEngine.run>` iterates over)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.utils.data import DistributedSampler

from .._validation import check_integer
from ..core.data import ObservedData
from ..core.distributed import all_gather_objects
from ..likelihoods.augmented_likelihood import AugmentedLikelihood
from ._checks import check_full_batch
from ._fit_config import FitConfig, StopRule
from .convergence import CAVITrace, Convergence, RelativeChange
from .engine import CAVIEngine

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

#: a stopping rule as the caller gives it
Rule = Convergence | Callable[[CAVITrace], bool]


def check_minibatches(
    likelihood: AugmentedLikelihood, batch_size: int | None, data_loader: Iterable[Any] | None
) -> None:
    """``ValueError`` for mini-batches of a likelihood with linear observations (it is fitted on all of them at
    once)."""
    if likelihood.linear_observations and (batch_size is not None or data_loader is not None):
        raise ValueError(
            f"{type(likelihood).__name__} reads linear combinations of the inputs: fit it on the full data "
            "(no batch_size, no data_loader)"
        )


def fit_data(
    cavi: CAVIEngine, x: Tensor | None, y: Tensor | None, kwargs: dict[str, Any], batch_size: int | None,
    data_loader: Iterable[Any] | None,
) -> ObservedData | None:  # fmt: skip
    """A fit's data: tensors ``x, y`` (with the per-datum ``kwargs``) checked once, as a whole
    (:meth:`CAVIEngine.check_data <gpytorch_augment.inference.engine.CAVIEngine.check_data>`), or ``None`` for a
    data loader, whose batches are checked as they come (``ValueError`` if tensors, a batch size or keyword data
    are given beside it)."""
    if data_loader is not None:
        if x is not None or y is not None:
            raise ValueError("pass either x and y or a data_loader, not both")
        if batch_size is not None:
            raise ValueError("pass either batch_size or a data_loader (which sets its own batch size), not both")
        if kwargs:
            raise ValueError(
                f"with a data_loader, per-datum keyword arguments ({sorted(kwargs)}) must come in its batches: "
                "yield (x, y, {name: tensor}) or {'x': x, 'y': y, name: tensor}"
            )
        return None
    if x is None or y is None:
        raise ValueError("fit needs the data: x and y, or a data_loader")
    return cavi.check_data(x, y, kwargs, where="CAVI.fit")


def fit_config(cavi: CAVIEngine, data: ObservedData | None, *, max_iter: int | None, tol: float,
               hyper_optimizer: torch.optim.Optimizer | None, hyper_steps: int, batch_size: int | None,
               data_loader: Iterable[Any] | None, num_epochs: int | None, convergence: Rule | None,
               generator: torch.Generator | None) -> FitConfig:  # fmt: skip
    """Check every setting of a fit of ``cavi`` on ``data`` (checked by :func:`fit_data`; ``None`` with a
    ``data_loader``) and resolve the defaults: ``max_iter`` 100 for a full batch, ``num_epochs`` 10 for
    mini-batches, ``RelativeChange(tol)`` over a step (full batch) or an epoch of steps; shuffled mini-batches
    continue from the engine's :attr:`~gpytorch_augment.inference.engine.CAVIEngine.shuffle_cursor` (not with
    sharded data)."""
    minibatch = batch_size is not None or data_loader is not None
    group = cavi.process_group if cavi.distributed else None
    sharded = cavi.distributed
    if data_loader is not None:
        num_batches = _check_loader(cavi, data_loader, sharded, group)
    elif data is None:
        raise ValueError("fit needs the data: x and y, or a data_loader")
    else:
        batch_size, num_batches = _check_tensors(cavi, data, batch_size, sharded, group)
    if int(hyper_steps) < 1:
        raise ValueError(f"hyper_steps must be a positive integer, got {hyper_steps}")
    if hyper_optimizer is not None:
        cavi.check_hyper_optimizer(hyper_optimizer)
    if max_iter is None:
        max_iter = 100 if not minibatch else None
    max_iter = check_integer("max_iter", max_iter, 1, optional=True)
    if num_epochs is None:
        num_epochs = 10 if minibatch else None
    if num_epochs is not None and int(num_epochs) < 1:
        raise ValueError(f"num_epochs must be a positive integer or None, got {num_epochs}")
    if convergence is None:
        convergence = RelativeChange(tol, window=1 if not minibatch else max(1, num_batches or 1))
    check = _stop_rule(convergence)

    def check_batch(x: Tensor, y: Tensor, kwargs: dict[str, Any]) -> ObservedData:
        return cavi.check_data(x, y, kwargs, where="CAVI.step")  # a loader's batch enters here

    return FitConfig(
        data=None if data_loader is not None else data, batch_size=batch_size, data_loader=data_loader,
        check_batch=check_batch if data_loader is not None else None, generator=generator,
        hyper_optimizer=hyper_optimizer, hyper_steps=int(hyper_steps),
        max_iter=None if max_iter is None else int(max_iter),
        num_epochs=None if num_epochs is None else int(num_epochs),
        num_batches=num_batches, check=check, sharded=sharded, cursor=None if sharded else cavi.shuffle_cursor,
    )  # fmt: skip


def _stop_rule(convergence: Rule) -> StopRule:
    if isinstance(convergence, Convergence):
        convergence.reset()
        return convergence.check
    if callable(convergence):
        return lambda trace, epoch_end: bool(convergence(trace))
    raise ValueError(f"convergence must be a Convergence or a callable trace -> bool, got {convergence!r}")


def _check_loader(
    cavi: CAVIEngine,
    data_loader: Iterable[Any],
    sharded: bool = False,
    group: ProcessGroup | None = None,
) -> int | None:
    """Validate a data-loader fit; returns the number of batches per epoch (``None`` if unknown). With sharded
    data the loader's dataset is either the whole data set read through a ``DistributedSampler`` or this rank's
    shard (then the shards must add up to ``num_data``), and every rank's loader has the same length."""
    try:
        size = len(getattr(data_loader, "dataset", None))  # type: ignore[arg-type]
    except TypeError:
        size = None
    if sharded and size is not None and not isinstance(getattr(data_loader, "sampler", None), DistributedSampler):
        size = sum(all_gather_objects(size, group))
    if size is not None and size != cavi.num_data:
        raise ValueError(
            f"the data loader's dataset has {size} points but CAVI was built with num_data={cavi.num_data}: "
            "the batch statistics are scaled by num_data / batch size"
        )
    try:
        length = len(data_loader)
    except TypeError:
        length = None
    if sharded and len(set(all_gather_objects(length, group))) > 1:
        raise ValueError(
            "with sharded data every rank's data loader must yield the same number of batches per epoch "
            "(use a DistributedSampler, which pads the shards)"
        )
    return length


def _check_tensors(
    cavi: CAVIEngine,
    data: ObservedData,
    batch_size: int | None,
    sharded: bool = False,
    group: ProcessGroup | None = None,
) -> tuple[int | None, int]:
    """Check a fit on checked ``data`` against ``num_data`` and the batch size; returns ``(batch_size, batches per
    epoch)`` (with sharded data: the largest number over the ranks)."""
    local = data.num_data
    if batch_size is None:
        sizes = all_gather_objects(local, group) if sharded else [local]
        check_full_batch(sum(sizes), cavi.num_data, sharded)
        return None, 1
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or int(batch_size) < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
    sizes = all_gather_objects(local, group) if sharded else [local]
    if sum(sizes) != cavi.num_data:
        what = f"the {len(sizes)} shards hold {sum(sizes)}" if sharded else f"y has {sizes[0]}"
        raise ValueError(f"{what} data points but CAVI was built with num_data={cavi.num_data}")
    return int(batch_size), max(math.ceil(n / int(batch_size)) for n in sizes)
