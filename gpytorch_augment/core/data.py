r"""Data checked once: the value every step of an engine takes.

A public entry point (``CAVI.fit``, ``CAVI.step``, ``CAVI.elbo``, ``CAVI.hyper_step``, ``fit_hyperparameters``,
``CollapsedAugmentedELBO``) turns ``(likelihood, x, y, **kwargs)`` into one :class:`ObservedData` by
:func:`check_data`, which runs every check of the data once; everything inside takes that value (its canonical
targets, keyword tensors and observation design) and never checks the targets again. Its rows are taken without a
check (:meth:`ObservedData.take`: mini-batches, shards).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from torch import Tensor

from .._validation import (
    as_tensors,
    check_inputs_targets,
    check_nonempty,
    check_target_keywords,
    float_targets,
    squeezed_targets,
)
from .design import LinearObservations

__all__ = ["ObservedData", "TargetChecks", "check_data"]


class TargetChecks(Protocol):
    """What :func:`check_data` uses of a likelihood (an :class:`~gpytorch_augment.likelihoods.AugmentedLikelihood`
    has it all)."""

    linear_observations: bool

    def check_targets(self, y: Tensor, **kwargs: Any) -> Tensor:
        """The canonical targets of ``y`` (``ValueError`` for a value outside the likelihood's domain)."""

    def observation_design(self, y: Tensor, num_points: int) -> LinearObservations | None:
        """The design the canonical targets ``y`` read from ``num_points`` latent values (``None``: pointwise)."""


def _per_datum(value: Any, num_data: int) -> bool:
    """Whether a keyword value is per-datum data: a tensor whose last dimension has ``num_data`` entries."""
    return isinstance(value, Tensor) and value.dim() >= 1 and value.shape[-1] == num_data


@dataclass(frozen=True, eq=False)
class ObservedData:
    r"""Data of a likelihood, checked once: the inputs, the canonical targets, the per-datum keyword tensors and,
    for a likelihood of linear observations, the design :math:`g = Df` they read.

    **Rules.** Built by :func:`check_data` (an engine's entry point: ``CAVI.check_data``) or by :meth:`take` from one
    so built; immutable (frozen fields, read-only ``kwargs``); the targets :attr:`y` are what
    ``likelihood.check_targets`` returned, so the likelihood's members take them as they are. The last dimension of
    :attr:`y` and of every per-datum keyword tensor indexes the data, as the second-to-last of :attr:`x` does for a
    pointwise likelihood.

    Example::

        >>> import torch
        >>> from gpytorch_augment import BinomialLogitLikelihood
        >>> from gpytorch_augment.core import check_data
        >>> x = torch.linspace(0, 1, 5, dtype=torch.float64).unsqueeze(-1)
        >>> data = check_data(BinomialLogitLikelihood(), x, torch.tensor([0, 1, 2, 1, 3]),
        ...                   {"trials": torch.tensor([3, 3, 3, 4, 4])}, where="example")
        >>> data.num_data, data.y.shape, data.y.dtype          # canonical: successes and trials stacked
        (5, torch.Size([2, 5]), torch.float64)
        >>> batch = data.take(torch.tensor([0, 4]))            # two rows, not checked again
        >>> batch.x.shape, batch.y[1].tolist(), batch.kwargs["trials"].tolist()
        (torch.Size([2, 1]), [3.0, 4.0], [3.0, 4.0])
        >>> data.kwargs["trials"] = None
        Traceback (most recent call last):
            ...
        TypeError: 'mappingproxy' object does not support item assignment
    """

    #: the inputs ``(*batch, N, D)`` (``(N, D)`` for linear observations)
    x: Tensor
    #: the canonical targets, ``(..., n)``: one entry per datum (per observation, for linear observations) in the
    #: last dimension
    y: Tensor
    #: the per-datum keyword tensors of the likelihood (e.g. ``trials=``), integers converted exactly to ``x``'s dtype
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: the linear observations :math:`g = Df` the targets read (``None`` for a pointwise likelihood)
    design: LinearObservations | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kwargs, MappingProxyType):
            object.__setattr__(self, "kwargs", MappingProxyType(dict(self.kwargs)))

    @property
    def num_data(self) -> int:
        """The number of data (of observations, for linear observations): the targets' last dimension."""
        return int(self.y.shape[-1])

    def take(self, idx: Tensor | slice) -> ObservedData:
        """The data ``idx`` (indices or a slice of the data dimension), unchecked: the rows of ``x``, the entries of
        ``y`` and of every per-datum keyword tensor. ``ValueError`` for linear observations, which read points
        anywhere in ``x`` and are taken all at once."""
        if self.design is not None:
            raise ValueError("linear observations read points anywhere in x: they are taken all at once, not by rows")
        n = self.num_data
        kwargs = {k: (v[..., idx] if _per_datum(v, n) else v) for k, v in self.kwargs.items()}
        return ObservedData(self.x[..., idx, :], self.y[..., idx], kwargs)


def check_data(
    likelihood: TargetChecks,
    x: Any,
    y: Any,
    kwargs: Mapping[str, Any] | None = None,
    *,
    where: str,
    check_inputs: Callable[[Tensor, Tensor], None] | None = None,
    allow_empty: bool = False,
) -> ObservedData:
    """Every check of the data ``(x, y, **kwargs)`` of ``likelihood``, once, and the :class:`ObservedData` they give.

    In order: numpy arrays become tensors; every keyword must be one the likelihood takes (``TypeError`` naming
    ``where``); ``(N, 1)`` targets of a pointwise likelihood become ``(N,)``; ``check_inputs(x, y)`` (default:
    :func:`~gpytorch_augment._validation.check_inputs_targets`, finite and aligned; an engine adds its model's
    shape, dimension and dtype); integer targets and keyword tensors are converted exactly to ``x``'s floating
    dtype; ``x`` holds at least one point (unless ``allow_empty``: a shard of sharded data may hold none); the
    likelihood's ``check_targets`` gives the canonical targets, and ``observation_design`` the design they read.

    :raises ValueError: naming the offending argument (the messages of the checks above).
    :raises TypeError: for a keyword the likelihood does not take.
    """
    kwargs = dict(kwargs or {})
    x, y = as_tensors(x, y, kwargs=kwargs)
    check_target_keywords(likelihood, kwargs, where)
    if not likelihood.linear_observations:  # observations reading combinations of x are not aligned with it
        y = squeezed_targets(x, y)
    (check_inputs_targets if check_inputs is None else check_inputs)(x, y)
    if x.is_floating_point():  # integer targets (counts, trials=) converted exactly to the data's dtype
        y = float_targets(y, kwargs, x.dtype)
    if not allow_empty:
        check_nonempty(x, where)
    y = likelihood.check_targets(y, **kwargs)
    return ObservedData(x, y, kwargs, likelihood.observation_design(y, x.shape[-2]))
