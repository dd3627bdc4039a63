"""How :meth:`CAVI.fit <gpytorch_augment.CAVI.fit>` walks through the data: full batch, shuffled mini-batches of
tensors, or the batches of a torch ``DataLoader``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

Batch = tuple[Tensor, Tensor, dict[str, Any], bool]


def take(t: Tensor, idx: Tensor | slice) -> Tensor:
    """The data points ``idx`` of a per-datum tensor whose last dimension indexes the data."""
    return t[..., idx]


def per_datum(value: Any, num_data: int) -> bool:
    """Whether a keyword argument is per-datum data (a tensor whose last dimension has ``num_data`` entries)."""
    return isinstance(value, Tensor) and value.dim() >= 1 and value.shape[-1] == num_data


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


def loader_batches(data_loader: Any) -> Iterator[Batch]:
    """One epoch of a data loader as ``(x, y, kwargs, is_last_batch_of_the_epoch)``."""
    iterator = iter(data_loader)
    batch = next(iterator, None)
    while batch is not None:
        following = next(iterator, None)
        xb, yb, kb = unpack(batch)
        yield xb, yb, kb, following is None
        batch = following


def tensor_batches(
    x: Tensor, y: Tensor, batch_size: int | None, generator: torch.Generator | None, kwargs: dict[str, Any]
) -> Iterator[Batch]:
    """One epoch over ``(x, y)``: the full batch, or a fresh random permutation (drawn from ``generator``) in
    batches of ``batch_size``; per-datum keyword data are sliced along with ``y``."""
    num_data = y.shape[-1]
    if batch_size is None or batch_size >= num_data:
        yield x, y, kwargs, True
        return
    # the permutation is drawn on the generator's device (a CPU generator with CUDA data works), then moved
    device = generator.device if generator is not None else x.device
    order = torch.randperm(num_data, generator=generator, device=device).to(x.device)
    for start in range(0, num_data, batch_size):
        idx = order[start : start + batch_size]
        kb = {k: (take(v, idx) if per_datum(v, num_data) else v) for k, v in kwargs.items()}
        yield x[..., idx, :], take(y, idx), kb, start + batch_size >= num_data


def progress_bar(total: int | None, desc: str = "CAVI", unit: str = "step") -> Any:
    """A tqdm bar: the notebook widget when ipywidgets is installed, plain text otherwise (without tqdm's warning)."""
    try:
        import ipywidgets  # noqa: F401
        from tqdm.auto import tqdm
    except ImportError:
        from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, mininterval=0.5)
