"""Input checks run once, at the public entry points (engines, MLLs, ``expected_log_prob``).

Each raises ``ValueError`` naming the offending argument and, where useful, an offending value.

Checks of the data's *values* (finite, labels, counts) read a result back from the device, a host synchronisation on
CUDA. A loop over slices of data already checked as a whole (``CAVI.fit`` on tensors) runs inside
:func:`checked_data`, where those value checks are skipped; shape and type checks always run.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

_VALUES_CHECKED = contextvars.ContextVar("gpytorch_augment_values_checked", default=False)


@contextmanager
def checked_data() -> Iterator[None]:
    """Inside, :func:`checking_values` is ``False``: the data passed on were validated as a whole beforehand, so the
    value checks (each a host synchronisation on CUDA) are skipped for their slices."""
    token = _VALUES_CHECKED.set(True)
    try:
        yield
    finally:
        _VALUES_CHECKED.reset(token)


def checking_values() -> bool:
    """Whether the data's values are to be checked (``False`` inside :func:`checked_data`)."""
    return not _VALUES_CHECKED.get()


def check_finite(name: str, t: Tensor) -> Tensor:
    """Raise if ``t`` holds NaN or infinite values."""
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_floating_point() and checking_values() and not torch.isfinite(t).all():
        bad = t[~torch.isfinite(t)].flatten()[0].item()
        raise ValueError(f"{name} contains non-finite values (e.g. {bad}); remove or impute them first")
    return t


def check_inputs_targets(x: Tensor, y: Tensor) -> None:
    """Check that inputs ``x`` (``(..., N, D)``) and targets ``y`` (``(..., N)``) are finite and aligned."""
    check_finite("x", x)
    check_finite("y", y)
    if x.dim() < 2:
        raise ValueError(f"x must have shape (N, D) (or (..., N, D)); got shape {tuple(x.shape)}")
    if y.dim() < 1 or x.shape[-2] != y.shape[-1]:
        raise ValueError(
            f"x and y disagree on the number of data points: x has shape {tuple(x.shape)} "
            f"(N = {x.shape[-2]}), y has shape {tuple(y.shape)}"
        )


def check_values_in(name: str, y: Tensor, allowed: tuple[float, ...]) -> None:
    """Raise unless every entry of ``y`` is one of ``allowed``."""
    check_finite(name, y)
    if not checking_values():
        return
    ok = torch.zeros_like(y, dtype=torch.bool)
    for a in allowed:
        ok |= y == a
    if not ok.all():
        bad = y[~ok].flatten()[0].item()
        raise ValueError(f"{name} must take values in {set(allowed)}; found {bad}")


def check_counts(name: str, y: Tensor) -> Tensor:
    """Raise unless ``y`` holds finite non-negative integers; return it as a floating tensor."""
    check_finite(name, y)
    if not y.is_floating_point():
        y = y.to(torch.get_default_dtype())
    if not checking_values():
        return y
    bad = (y < 0) | (y != y.round())
    if bad.any():
        raise ValueError(f"{name} must be non-negative integer counts; found {y[bad].flatten()[0].item()}")
    return y


def accepted_target_keywords(likelihood: Any) -> frozenset[str]:
    """The per-datum keyword arguments ``likelihood.check_targets`` takes (e.g. ``trials`` of the binomial).

    The named keyword parameters of ``check_targets`` (after the targets), plus the names a likelihood declares in an
    optional class attribute ``target_keywords`` (for one that reads them from ``**kwargs``).

    Example::

        >>> from gpytorch_augment import BernoulliLogitLikelihood, BinomialLogitLikelihood
        >>> from gpytorch_augment._validation import accepted_target_keywords
        >>> sorted(accepted_target_keywords(BinomialLogitLikelihood())), sorted(accepted_target_keywords(
        ...     BernoulliLogitLikelihood()))
        (['trials'], [])
    """
    names = set(getattr(likelihood, "target_keywords", ()) or ())
    try:
        parameters = list(inspect.signature(likelihood.check_targets).parameters.values())
    except (TypeError, ValueError):  # no signature: rely on the declared names
        return frozenset(names)
    keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names.update(p.name for p in parameters[1:] if p.kind in keyword_kinds)
    return frozenset(names)


def check_target_keywords(likelihood: Any, kwargs: Mapping[str, Any], where: str) -> None:
    """Raise ``TypeError`` naming every keyword of ``kwargs`` that ``likelihood`` does not take as per-datum data
    (a mistyped option would otherwise be passed on and silently ignored).

    Example::

        >>> from gpytorch_augment import BernoulliLogitLikelihood
        >>> from gpytorch_augment._validation import check_target_keywords
        >>> check_target_keywords(BernoulliLogitLikelihood(), {"learn_hyperparameter": True}, "CAVI.fit")
        Traceback (most recent call last):
            ...
        TypeError: CAVI.fit got unexpected keyword argument(s) ['learn_hyperparameter']: ...
    """
    unknown = sorted(set(kwargs) - accepted_target_keywords(likelihood))
    if unknown:
        accepted = sorted(accepted_target_keywords(likelihood))
        raise TypeError(
            f"{where} got unexpected keyword argument(s) {unknown}: extra keywords are per-datum data of the "
            f"likelihood, and {type(likelihood).__name__} takes "
            + (f"only {accepted}" if accepted else "none")
            + " (check the spelling of the engine's own options)"
        )


def squeezed_targets(x: Tensor, y: Tensor) -> Tensor:
    """Targets of shape ``(N, 1)`` (a column, as from a data frame) for inputs ``(N, D)`` become ``(N,)``; any other
    ``y`` is returned unchanged.

    Example::

        >>> import torch
        >>> from gpytorch_augment._validation import squeezed_targets
        >>> squeezed_targets(torch.zeros(3, 2), torch.zeros(3, 1)).shape
        torch.Size([3])
    """
    if (
        isinstance(x, Tensor)
        and isinstance(y, Tensor)
        and x.dim() >= 2
        and y.dim() == x.dim()
        and y.shape[-1] == 1
        and y.shape[-2] == x.shape[-2]
        and x.shape[-2] != 1
    ):
        return y.squeeze(-1)
    return y


def check_nonempty(x: Tensor, where: str) -> None:
    """Raise ``ValueError`` if the inputs ``x`` (``(..., N, D)``) hold no data points."""
    if x.dim() >= 2 and x.shape[-2] == 0:
        raise ValueError(f"{where} got no data: x has shape {tuple(x.shape)} (N = 0 data points)")
