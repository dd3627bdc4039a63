r"""The multi-process seam: the few collectives the engines need, over ``torch.distributed``.

A CAVI step needs only the batch's sufficient statistics (:math:`M^2 + M` numbers per latent) and a few scalars
(the batch's ELBO terms and size), so one all-reduce per step makes every rank hold the same :math:`q(u)`. Every
function here is the identity (no communication) when ``torch.distributed`` is not initialised or the group has a
single process, so single-process code pays nothing.

Failures are loud: a collective that fails (a peer crashed, or the process group's timeout expired because a peer
never arrived) raises :class:`DistributedError` naming the operation, instead of hanging; set the timeout with
``torch.distributed.init_process_group(..., timeout=datetime.timedelta(seconds=...))``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor

__all__ = [
    "DistributedError",
    "all_gather_objects",
    "all_reduce_gradients",
    "all_reduce_sum",
    "broadcast_flag",
    "collective_device",
    "is_distributed",
    "rank",
    "world_size",
]

T = TypeVar("T")


class DistributedError(RuntimeError):
    """A collective operation failed: another process probably failed, left, or timed out.

    Example::

        >>> from gpytorch_augment.core.distributed import DistributedError
        >>> issubclass(DistributedError, RuntimeError)
        True
    """


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def is_distributed(group: Any = None) -> bool:
    """Whether ``torch.distributed`` is initialised with more than one process in ``group`` (default group).

    Example::

        >>> from gpytorch_augment.core.distributed import is_distributed
        >>> is_distributed()          # no torch.distributed process group here
        False
    """
    dist = _dist()
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def world_size(group: Any = None) -> int:
    """The number of processes of ``group`` (1 without ``torch.distributed``).

    Example::

        >>> from gpytorch_augment.core.distributed import world_size
        >>> world_size()
        1
    """
    dist = _dist()
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def rank(group: Any = None) -> int:
    """This process's rank in ``group`` (0 without ``torch.distributed``).

    Example::

        >>> from gpytorch_augment.core.distributed import rank
        >>> rank()
        0
    """
    dist = _dist()
    return dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0


def _collective(name: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except RuntimeError as err:  # gloo/NCCL report a lost peer or an expired timeout as RuntimeError
        raise DistributedError(
            f"torch.distributed {name} failed ({err}); another process probably failed or timed out -- "
            "check the other ranks' output"
        ) from err


def all_reduce_sum(tensors: Sequence[Tensor], group: Any = None) -> list[Tensor]:
    """The sums over ranks of ``tensors`` (any shapes, one dtype and device), by **one** flat all-reduce.

    Returns new tensors (the inputs are not modified); without a multi-process group, the inputs themselves.

    Example::

        >>> import torch
        >>> from gpytorch_augment.core.distributed import all_reduce_sum
        >>> all_reduce_sum([torch.ones(2)])[0].tolist()      # one process: the identity
        [1.0, 1.0]
    """
    if not is_distributed(group):
        return list(tensors)
    flat = torch.cat([t.reshape(-1) for t in tensors])
    _collective("all_reduce", lambda: _dist().all_reduce(flat, group=group))
    out, start = [], 0
    for t in tensors:
        out.append(flat[start : start + t.numel()].view(t.shape))
        start += t.numel()
    return out


def all_reduce_gradients(params: Iterable[Tensor], weight: float, group: Any = None) -> None:
    r"""Replace every gradient by :math:`\sum_r w_r g_r` over ranks (``weight`` is this rank's :math:`w_r`), like
    DDP's averaging with per-rank weights; a missing gradient counts as zero (and becomes a zero tensor).

    Example::

        >>> import torch
        >>> from gpytorch_augment.core.distributed import all_reduce_gradients
        >>> p = torch.ones(2, requires_grad=True)
        >>> p.sum().backward()
        >>> all_reduce_gradients([p], weight=1.0)            # one process: unchanged
        >>> p.grad.tolist()
        [1.0, 1.0]
    """
    if not is_distributed(group):
        return
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    summed = all_reduce_sum([weight * g for g in grads], group)
    for p, g in zip(params, summed):
        p.grad = g.clone()


def collective_device(group: Any = None) -> torch.device:
    """Where the group's collectives take tensors: the current CUDA device for NCCL, the CPU otherwise.

    It needs an initialised process group (``torch.distributed.init_process_group``), so the example shows
    the single-process case, where no collective (and hence no device) is needed.

    Example::

        >>> from gpytorch_augment.core.distributed import all_reduce_sum, is_distributed, rank, world_size
        >>> is_distributed(), world_size(), rank()          # a single process: no group, no collectives
        (False, 1, 0)
        >>> import torch
        >>> all_reduce_sum([torch.tensor([1.0, 2.0])])      # so every collective is the identity
        [tensor([1., 2.])]
    """
    if _dist().get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_flag(flag: bool, group: Any = None, src: int = 0) -> bool:
    """Rank ``src``'s ``flag`` on every rank (so that every rank takes the same decision).

    Example::

        >>> from gpytorch_augment.core.distributed import broadcast_flag
        >>> broadcast_flag(True)
        True
    """
    if not is_distributed(group):
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=collective_device(group))
    _collective("broadcast", lambda: _dist().broadcast(t, src=src, group=group))
    return bool(t.item())


def all_gather_objects(obj: T, group: Any = None) -> list[T]:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` without a multi-process group.

    Example::

        >>> from gpytorch_augment.core.distributed import all_gather_objects
        >>> all_gather_objects({"n": 3})
        [{'n': 3}]
    """
    if not is_distributed(group):
        return [obj]
    out: list[Any] = [None] * world_size(group)
    _collective("all_gather_object", lambda: _dist().all_gather_object(out, obj, group=group))
    return out
