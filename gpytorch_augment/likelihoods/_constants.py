r"""Positive likelihood constants (scales, degrees of freedom, rate scales, class scales): one mechanism for all.

A constant ``name`` is stored, GPyTorch style, as the raw parameter ``raw_<name>`` under a ``Positive()``
constraint, declared on the class by the descriptor :class:`PositiveConstant` and registered in ``__init__`` by
:func:`register_positive_constant`. The rules, the same for every likelihood:

* **Shape**: the parameter has shape ``(*batch_shape, *event_shape)`` (``event_shape`` is ``(1,)`` for a scalar
  constant, ``(K,)`` for one value per class) whatever the initial value is: a number, a 0-dim tensor or a tensor
  that broadcasts to that shape all give the same parameter. An initial value that does not broadcast raises.
* **Validation**: every assignment (constructor and setter) must be finite and :math:`> 0`, and representable in
  the parameter's dtype; otherwise a ``ValueError`` names the constant. Closed-form updates go through
  :func:`set_positive_constant` with ``update=True``, which writes them unchecked (a check would read the value back
  from the device at every CAVI step): a non-finite or non-positive update shows as the next step's non-finite ELBO,
  which ``CAVI.fit`` reports.
* **Per-chain values**: after construction, assigning a value whose shape is larger than the declared one (e.g. one
  value per Gibbs chain, ``(chains, 1)``) stores it as is; assigning a broadcastable value restores the declared
  shape. (Engines prefer :meth:`~gpytorch_augment.likelihoods.AugmentedLikelihood.constants`, which is not
  validated.)

Example::

    >>> import torch
    >>> from gpytorch_augment import LaplaceLikelihood
    >>> LaplaceLikelihood(scale=0.5, batch_shape=torch.Size([2])).raw_scale.shape
    torch.Size([2, 1])
    >>> LaplaceLikelihood(scale=0.0)
    Traceback (most recent call last):
    ...
    ValueError: scale must be positive and finite; got 0.0
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from gpytorch.constraints import Positive
from torch import Tensor

__all__ = ["PositiveConstant", "check_gamma_prior", "register_positive_constant", "set_positive_constant"]

_FLOAT64_ADVICE = "fit in float64 (model.double(), likelihood.double() and float64 x, y)"


def _first(value: Tensor, mask: Tensor) -> float:
    return float(value[mask].flatten()[0].item()) if mask.any() else float(value.flatten()[0].item())


def _as_float64(name: str, value: Any) -> Tensor:
    if isinstance(value, bool) or isinstance(value, str):
        raise ValueError(f"{name} must be a positive number or tensor; got {value!r}")
    try:
        # numbers in float64 (a number is a double already): 1e40 is reported as too large, not as inf
        tensor = value if isinstance(value, Tensor) else torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"{name} must be a positive number or tensor; got {value!r}") from error
    if not (tensor.is_floating_point() or tensor.dtype in (torch.int8, torch.int16, torch.int32, torch.int64)):
        raise ValueError(f"{name} must be a positive number or tensor; got dtype {tensor.dtype}")
    return tensor.detach().to(torch.float64)


def set_positive_constant(module: torch.nn.Module, name: str, value: Any, update: bool = False) -> None:
    """Validate ``value`` and write it into ``module.raw_<name>`` (the rules are in the module docstring).

    :param update: the value comes from a closed-form update inside a CAVI step: it is written without the checks
        of its values (a check would read the value back from the device at every step; a non-finite or
        non-positive update makes the next step's ELBO non-finite, which ``CAVI.fit`` reports as a
        ``FloatingPointError`` naming the step).
    :raises ValueError: naming ``name``, if ``value`` is not finite and positive, is not representable in the
        parameter's dtype, or does not broadcast to the declared shape (at construction).
    """
    param: torch.nn.Parameter = getattr(module, f"raw_{name}")
    constraint = getattr(module, f"raw_{name}_constraint")
    declared: torch.Size = module._positive_constant_shapes[name]
    wide = _as_float64(name, value)
    if not update and (bad := ~torch.isfinite(wide) | (wide <= 0)).any():
        raise ValueError(f"{name} must be positive and finite; got {_first(wide, bad)}")
    narrow = wide.to(param.dtype)
    raw = constraint.inverse_transform(narrow.to(param.device))
    if not update and (lost := ~torch.isfinite(narrow) | (narrow <= 0) | ~torch.isfinite(raw).to(narrow.device)).any():
        raise ValueError(
            f"{name} = {_first(wide, lost)} is not representable in {param.dtype} (overflow or underflow): "
            f"{_FLOAT64_ADVICE}, or rescale the data"
        )
    try:
        target = torch.broadcast_shapes(raw.shape, declared)
    except RuntimeError:
        target = None
    if target == declared:
        raw = raw.expand(declared)
    elif target is None or name not in module._positive_constant_set:
        raise ValueError(
            f"{name} has shape {tuple(raw.shape)}, which does not broadcast to its shape {tuple(declared)} "
            "(batch_shape + the constant's own shape)"
        )
    param.data = raw.clone()
    module._positive_constant_set.add(name)


def register_positive_constant(
    module: torch.nn.Module,
    name: str,
    value: Any,
    batch_shape: Sequence[int] = torch.Size(),
    event_shape: Sequence[int] = (1,),
    requires_grad: bool = True,
) -> None:
    """Register ``raw_<name>`` of shape ``(*batch_shape, *event_shape)`` with a ``Positive()`` constraint and set it
    to ``value`` (validated by :func:`set_positive_constant`). Pair it with a :class:`PositiveConstant` class
    attribute of the same name.

    :param requires_grad: ``False`` for a fixed constant (no gradient and, by convention, no closed-form update).
    """
    if not hasattr(module, "_positive_constant_shapes"):
        module._positive_constant_shapes = {}
        module._positive_constant_set = set()
    shape = torch.Size(batch_shape) + torch.Size(event_shape)
    module._positive_constant_shapes[name] = shape
    module.register_parameter(f"raw_{name}", torch.nn.Parameter(torch.zeros(shape), requires_grad=requires_grad))
    module.register_constraint(f"raw_{name}", Positive())
    set_positive_constant(module, name, value)


class PositiveConstant:
    """Descriptor of a positive constant registered by :func:`register_positive_constant`: reading gives the
    constrained value, ``Positive().transform(raw_<name>)``; assigning validates and stores (see the module rules).

    Example::

        >>> import torch
        >>> from gpytorch_augment.likelihoods import PoissonLogitLikelihood
        >>> likelihood = PoissonLogitLikelihood(rate_scale=torch.tensor(3.0))
        >>> likelihood.rate_scale = 2.0
        >>> likelihood.rate_scale
        tensor([2.], grad_fn=<SoftplusBackward0>)
    """

    def __init__(self, doc: str = "") -> None:
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, module: Any, owner: type | None = None) -> Any:
        if module is None:
            return self
        return getattr(module, f"raw_{self.name}_constraint").transform(getattr(module, f"raw_{self.name}"))

    def __set__(self, module: Any, value: Any) -> None:
        set_positive_constant(module, self.name, value)


def check_gamma_prior(name: str, prior: Any, labels: tuple[str, str] = ("a", "b")) -> tuple[float, float] | None:
    """``None``, or a ``(shape, rate)`` pair (named ``labels`` in errors) of finite positive numbers returned as floats.

    Example::

        >>> from gpytorch_augment.likelihoods._constants import check_gamma_prior
        >>> check_gamma_prior("rate_scale_prior", (2, 0.5))
        (2.0, 0.5)

    :raises ValueError: naming ``name`` otherwise.
    """
    if prior is None:
        return None
    la, lb = labels
    try:
        a, b = (float(v) for v in prior)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"{name} must be a pair ({la}, {lb}) of positive finite numbers; got {prior!r}") from error
    if not (math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0):
        raise ValueError(f"{name} ({la}, {lb}) must have finite {la} > 0 and {lb} > 0; got {prior!r}")
    return a, b
