"""Input checks run once, at the public entry points (engines, MLLs, ``expected_log_prob``).

Each raises ``ValueError`` naming the offending argument and, where useful, an offending value.

Checks of the data's *values* (finite, labels, counts) read a result back from the device, a host synchronisation on
CUDA: they run where data enter (:func:`gpytorch_augment.core.check_data`, which gives the checked
:class:`~gpytorch_augment.core.ObservedData` an engine's steps take), never inside an engine's loop.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from gpytorch.variational import IndependentMultitaskVariationalStrategy
from torch import Tensor


def check_finite(name: str, t: Tensor) -> Tensor:
    """Raise if ``t`` holds NaN or infinite values."""
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_floating_point() and not torch.isfinite(t).all():
        bad = t[~torch.isfinite(t)].flatten()[0].item()
        raise ValueError(f"{name} contains non-finite values (e.g. {bad}); remove or impute them first")
    return t


def check_finite_state(name: str, state: Any) -> None:
    """Raise ``ValueError`` naming the first entry of a (nested) state dict whose floating tensor holds NaN or
    infinite values (a checkpoint written after a fit diverged would otherwise load silently); the bounds of
    constraints (entries named ``...constraint...``) may be infinite.

    Example::

        >>> import math, torch
        >>> from gpytorch_augment._validation import check_finite_state
        >>> check_finite_state("state", {"model": {"mean": torch.tensor([0.0, math.nan])}})
        Traceback (most recent call last):
            ...
        ValueError: state['model']['mean'] holds non-finite values (e.g. nan): ...
    """
    if isinstance(state, Tensor):
        # a constraint's bound may be infinite (gpytorch's Interval with upper_bound=inf); NaN is never valid
        ok = torch.isnan(state).logical_not() if "constraint" in name else torch.isfinite(state)
        if state.is_floating_point() and not ok.all():
            bad = state[~ok].flatten()[0].item()
            raise ValueError(
                f"{name} holds non-finite values (e.g. {bad}): the state was saved after the run diverged or was "
                "corrupted; load an earlier checkpoint"
            )
    elif isinstance(state, Mapping):
        for key, value in state.items():
            check_finite_state(f"{name}[{key!r}]", value)
    elif isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            check_finite_state(f"{name}[{i}]", value)
    elif isinstance(state, float) and not math.isfinite(state):
        raise ValueError(f"{name} is {state}: the state was saved after the run diverged or was corrupted")


def check_state_keys(name: str, state: Any, required: tuple[str, ...]) -> None:
    """Raise ``ValueError`` unless ``state`` is a mapping holding every key of ``required``."""
    if not isinstance(state, Mapping):
        raise ValueError(f"{name} must be a dict as returned by state_dict(), got {type(state).__name__}")
    missing = [k for k in required if k not in state]
    if missing:
        raise ValueError(
            f"{name} lacks the key(s) {missing} (it has {sorted(map(str, state))}): pass what state_dict() returned"
        )


def check_state_fits(name: str, module: torch.nn.Module, state: Mapping[str, Any], what: str) -> None:
    """Raise ``ValueError`` naming ``name`` unless the state dict ``state`` has exactly the entries of
    ``module.state_dict()``, each tensor of the same shape (a checkpoint of a model with other inducing points,
    latents or classes, or of another likelihood, would otherwise fail inside torch).

    Example::

        >>> import torch
        >>> from gpytorch_augment._validation import check_state_fits
        >>> check_state_fits("state['model']", torch.nn.Linear(2, 1), torch.nn.Linear(3, 1).state_dict(), "model")
        Traceback (most recent call last):
            ...
        ValueError: state['model'] does not fit this model (Linear): weight has shape (1, 3) there but (1, 2) here; ...
    """
    own = module.state_dict()
    if not isinstance(state, Mapping):
        raise ValueError(f"{name} must be a dict as returned by state_dict(), got {type(state).__name__}")
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    shapes = [
        f"{key} has shape {tuple(state[key].shape)} there but {tuple(value.shape)} here"
        for key, value in own.items()
        if key in state and isinstance(value, Tensor) and isinstance(state[key], Tensor)
        and state[key].shape != value.shape
    ]  # fmt: skip
    problems = shapes + ([f"it lacks {missing}"] if missing else []) + ([f"it has no place for {unexpected}"]
                                                                        if unexpected else [])  # fmt: skip
    if problems:
        raise ValueError(
            f"{name} does not fit this {what} ({type(module).__name__}): {'; '.join(problems[:3])}; the checkpoint "
            f"was saved from a {what} of another kind or size (inducing points M, latents or classes K, likelihood): "
            f"load it into one built as the saved one was"
        )


def fits_batch(shape: torch.Size, batch: torch.Size) -> bool:
    """Whether ``shape`` broadcasts into the batch shape ``batch`` (without enlarging it)."""
    try:
        return torch.broadcast_shapes(shape, batch) == batch
    except RuntimeError:
        return False


def check_inputs_targets(x: Tensor, y: Tensor, batch_shape: torch.Size | None = None) -> None:
    """Check that inputs ``x`` (``(..., N, D)``) and targets ``y`` (``(..., N)``) are finite and aligned.

    The leading (batch) dimensions of ``y`` must broadcast into ``batch_shape`` (default: those of ``x``): a row of
    targets ``(1, N)`` for inputs ``(N, D)`` is an error, not a batch.

    Example::

        >>> import torch
        >>> from gpytorch_augment._validation import check_inputs_targets
        >>> check_inputs_targets(torch.zeros(3, 1), torch.zeros(1, 3))
        Traceback (most recent call last):
            ...
        ValueError: y has shape (1, 3): its leading dimensions (1,) are not batch dimensions of ...
    """
    check_finite("x", x)
    check_finite("y", y)
    if x.dim() < 2:
        raise ValueError(f"x must have shape (N, D) (or (..., N, D)); got shape {tuple(x.shape)}")
    if y.dim() < 1 or x.shape[-2] != y.shape[-1]:
        raise ValueError(
            f"x and y disagree on the number of data points: x has shape {tuple(x.shape)} "
            f"(N = {x.shape[-2]}), y has shape {tuple(y.shape)}{one_hot_hint(y, x.shape[-2])}"
        )
    batch = x.shape[:-2] if batch_shape is None else torch.Size(batch_shape)
    if not fits_batch(y.shape[:-1], batch):
        raise ValueError(
            f"y has shape {tuple(y.shape)}: its leading dimensions {tuple(y.shape[:-1])} are not batch dimensions of "
            f"the inputs x of shape {tuple(x.shape)} (batch shape {tuple(batch)}); targets must have shape (N,) "
            "(or (*batch, N)): for a row of targets pass y.reshape(-1)"
        )


def check_values_in(name: str, y: Tensor, allowed: tuple[float, ...]) -> None:
    """Raise unless every entry of ``y`` is one of ``allowed``."""
    check_finite(name, y)
    ok = torch.zeros_like(y, dtype=torch.bool)
    for a in allowed:
        ok |= y == a
    if not ok.all():
        bad = y[~ok].flatten()[0].item()
        raise ValueError(f"{name} must take values in {set(allowed)}; found {bad}")


def one_hot_hint(y: Tensor, num_data: int) -> str:
    """A sentence for the error of targets ``y`` that do not hold one target per data point: where ``y`` is an
    ``(N, K)`` matrix of 0/1 rows (one-hot labels), say that the likelihoods take class indices; else ``""``.

    Example::

        >>> import torch
        >>> from gpytorch_augment._validation import one_hot_hint
        >>> one_hot_hint(torch.eye(3)[[0, 2, 1, 1]], 4)[:43]
        ': y looks like one-hot labels of 3 classes;'
    """
    if y.dim() < 2 or y.shape[-2] != num_data or y.shape[-1] < 2 or y.is_complex():
        return ""
    values = y.detach()
    if not bool(((values == 0) | (values == 1)).all()) or not bool((values.sum(-1) == 1).all()):
        return ""
    return (
        f": y looks like one-hot labels of {y.shape[-1]} classes; the likelihoods take one class index in "
        f"0..{y.shape[-1] - 1} per data point, shape ({num_data},): pass y.argmax(-1)"
    )


def check_class_labels(y: Tensor, num_classes: int) -> Tensor:
    """Labels ``y`` must be integer class indices in ``0..num_classes-1`` (``ValueError`` naming the first bad one);
    returned as floats (the default dtype for integer labels)."""
    check_finite("labels y", y)
    if not y.is_floating_point():
        y = y.to(torch.get_default_dtype())
    bad = (y != y.round()) | (y < 0) | (y > num_classes - 1)
    if bad.any():
        raise ValueError(
            f"labels y must be integer class indices in 0..{num_classes - 1}; found {y[bad].flatten()[0].item()}"
        )
    return y


def exact_float(name: str, t: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """An integer (or boolean) tensor converted to the floating ``dtype`` (default: torch's default dtype), exactly:
    ``ValueError`` if some entry has no exact representation there (e.g. counts above ``2**24`` in float32). A
    floating tensor is returned unchanged.

    Example::

        >>> import torch
        >>> from gpytorch_augment._validation import exact_float
        >>> exact_float("y", torch.tensor([2**24 + 1, 3]), torch.float64).tolist()
        [16777217.0, 3.0]
        >>> exact_float("y", torch.tensor([2**24 + 1, 3]), torch.float32)
        Traceback (most recent call last):
            ...
        ValueError: y holds integers that torch.float32 cannot represent exactly (e.g. 16777217): ...
    """
    if not isinstance(t, Tensor) or t.is_floating_point() or t.is_complex():
        return t
    dtype = torch.get_default_dtype() if dtype is None else dtype
    out = t.to(dtype)
    limit = 2 ** {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}.get(dtype, 53)
    info = torch.iinfo(t.dtype) if t.dtype != torch.bool else None
    # a narrow integer dtype (int8 .. int32, uint8) may hold no value beyond the limit; then there is nothing to check
    # (and comparing with the limit would overflow in that dtype)
    if t.numel() and info is not None and max(info.max, -info.min) > limit:
        inexact = (t > limit) | (t < -limit)  # beyond, not every integer is representable: ask for exactness up front
        if inexact.any():
            bad = t[inexact].flatten()[0].item()
            raise ValueError(
                f"{name} holds integers that {dtype} cannot represent exactly (e.g. {bad}): pass them as float64 "
                "(y.double()) with a float64 model (model.double(), likelihood.double())"
            )
    return out


def as_tensors(*values: Any, kwargs: dict[str, Any] | None = None) -> tuple[Any, ...]:
    """``values`` with every numpy array (what scikit-learn and pandas' ``.to_numpy()`` return) converted as
    ``torch.as_tensor`` converts it (its dtype kept: float64 stays float64, int64 stays int64); anything else is
    returned unchanged. Numpy arrays among the per-datum keyword data ``kwargs`` (``trials=``) are replaced in place.

    Example::

        >>> import numpy as np
        >>> from gpytorch_augment._validation import as_tensors
        >>> kwargs = {"trials": np.array([3, 4])}
        >>> x, y = as_tensors(np.zeros((2, 1)), [0, 1], kwargs=kwargs)
        >>> x.dtype, y, kwargs["trials"]
        (torch.float64, [0, 1], tensor([3, 4]))
    """
    if kwargs is not None:
        for key, value in list(kwargs.items()):
            if isinstance(value, np.ndarray):
                kwargs[key] = torch.as_tensor(value)
    return tuple(torch.as_tensor(v) if isinstance(v, np.ndarray) else v for v in values)


def float_targets(y: Tensor, kwargs: dict[str, Any], dtype: torch.dtype, name: str = "y") -> Tensor:
    """Integer targets (and integer per-datum keyword data, e.g. ``trials=``, replaced in ``kwargs``) converted
    exactly to the data's floating ``dtype`` (see :func:`exact_float`). A bool keyword tensor is left as it is, for
    the likelihood's ``check_targets`` to accept or refuse (a bool mask converted to 0/1 would pass as indices)."""
    for key, value in list(kwargs.items()):
        if isinstance(value, Tensor) and not value.is_floating_point() and value.dtype != torch.bool:
            kwargs[key] = exact_float(key, value, dtype)
    return exact_float(name, y, dtype)


def check_counts(name: str, y: Tensor) -> Tensor:
    """Raise unless ``y`` holds finite non-negative integers; return it as a floating tensor (an integer tensor is
    converted exactly to the default dtype, ``ValueError`` if it cannot be: see :func:`exact_float`)."""
    check_finite(name, y)
    y = exact_float(name, y)
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


def check_broadcasts(name: str, t: Tensor, shape: torch.Size, hint: str | None = None) -> torch.Size:
    """The shape that ``t`` and the data's ``shape`` broadcast to; ``ValueError`` naming ``name`` if they do not
    (one value per datum, a number, or a column ``(K, 1)`` of ``K`` values for every datum all broadcast). The
    message ends with ``hint`` (default: those three forms).

    Example::

        >>> import torch
        >>> from gpytorch_augment._validation import check_broadcasts
        >>> check_broadcasts("q", torch.zeros(2, 1), torch.Size([3]))
        torch.Size([2, 3])
        >>> check_broadcasts("q", torch.zeros(2), torch.Size([3]))
        Traceback (most recent call last):
            ...
        ValueError: q has shape (2,), which does not broadcast against the data's shape (3,): ...
    """
    try:
        return torch.broadcast_shapes(t.shape, shape)
    except RuntimeError:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)}, which does not broadcast against the data's shape {tuple(shape)}: "
            + (hint or f"pass a number, one {name} per datum, or a column (K, 1) for K values per datum")
        ) from None


def check_points(name: str, x: Any, dim: int, dtype: torch.dtype) -> Tensor:
    """Query inputs ``x`` of shape ``(..., q, dim)`` in the model's floating ``dtype``, finite: ``x`` itself, else
    ``ValueError`` naming ``name`` (a 1-D ``x`` is refused: ``(q,)`` and ``(1, q)`` would be ambiguous; numpy arrays
    are converted as ``torch.as_tensor`` does).

    Example::

        >>> import torch
        >>> from gpytorch_augment._validation import check_points
        >>> check_points("X", torch.zeros(4), 2, torch.float64)
        Traceback (most recent call last):
            ...
        ValueError: X must have shape (..., q, 2) (q points of dimension 2); got shape (4,)
    """
    (x,) = as_tensors(x)
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 2 or x.shape[-1] != dim:
        raise ValueError(
            f"{name} must have shape (..., q, {dim}) (q points of dimension {dim}); got shape {tuple(x.shape)}"
        )
    if x.dtype != dtype:
        raise ValueError(
            f"{name} has dtype {x.dtype} but the model's parameters are {dtype}: pass {name}.to({dtype}) or convert "
            "the model"
        )
    return check_finite(name, x)


def check_integer(name: str, value: Any, least: int, *, optional: bool = False) -> int | None:
    """``value`` as an ``int`` if it is a whole number (an ``int``, or a float such as ``3.0``) ``>= least``
    (``None`` passes where ``optional``); else ``ValueError`` naming ``name`` (``True``, ``2.5``, ``inf``, ``nan``,
    strings and ``None`` where not optional are refused, never truncated).

    Example::

        >>> from gpytorch_augment._validation import check_integer
        >>> check_integer("restarts", 2.0, 0)
        2
        >>> check_integer("max_iter", 2.5, 1, optional=True)
        Traceback (most recent call last):
            ...
        ValueError: max_iter must be an integer >= 1 or None, got 2.5
    """
    if value is None and optional:
        return None
    whole = (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and int(value) == value
        and value >= least
    )
    if not whole:
        raise ValueError(f"{name} must be an integer >= {least}{' or None' if optional else ''}, got {value!r}")
    return int(value)


def check_real(name: str, value: Any, *, positive: bool = False, optional: bool = False) -> float | None:
    """``value`` as a finite ``float``, ``> 0`` if ``positive`` else ``>= 0`` (``None`` passes where ``optional``);
    else ``ValueError`` naming ``name``.

    Example::

        >>> from gpytorch_augment._validation import check_real
        >>> check_real("lr", "a", positive=True)
        Traceback (most recent call last):
            ...
        ValueError: lr must be a finite number > 0, got 'a'
    """
    if value is None and optional:
        return None
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= 0 if positive else value < 0):
        raise ValueError(f"{name} must be a finite number {'>' if positive else '>='} 0, got {value!r}")
    return float(value)


def check_latents(model: Any, strategy: Any, likelihood: Any) -> None:
    """Raise ``ValueError`` unless the model has one latent GP per latent of the likelihood (checked by the engines
    and the MLLs alike, on an ``ApproximateGP``, its CAVI strategy and an augmented likelihood).

    A likelihood with ``T > 1`` latents needs a strategy of batch shape ``[..., T]`` (usually inside GPyTorch's
    ``IndependentMultitaskVariationalStrategy`` with ``num_tasks = T``); a one-latent likelihood must not be given a
    multitask model.
    """
    T = int(likelihood.num_latents)
    name = type(likelihood).__name__
    wrapper = model.variational_strategy
    batch_shape = tuple(strategy._variational_distribution.batch_shape)
    if isinstance(wrapper, IndependentMultitaskVariationalStrategy):
        tasks = int(wrapper.num_tasks)
        if tasks != T:
            raise ValueError(
                f"the model's IndependentMultitaskVariationalStrategy has num_tasks={tasks} but {name} has "
                f"num_latents={T}: build the model with one latent GP per latent (num_tasks={T}, batch_shape=[{T}])"
            )
    if T > 1 and (not batch_shape or batch_shape[-1] != T):
        raise ValueError(
            f"{name} has num_latents={T} but the model's variational distribution has batch shape {batch_shape}: "
            f"use batch_shape=torch.Size([{T}]) for q(u), the mean and the kernel, inside "
            f"IndependentMultitaskVariationalStrategy(..., num_tasks={T})"
        )
