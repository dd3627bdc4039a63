"""Input checks run once, at the public entry points (engines, MLLs, ``expected_log_prob``).

Each raises ``ValueError`` naming the offending argument and, where useful, an offending value.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_finite(name: str, t: Tensor) -> Tensor:
    """Raise if ``t`` holds NaN or infinite values."""
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_floating_point() and not torch.isfinite(t).all():
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
    bad = (y < 0) | (y != y.round())
    if bad.any():
        raise ValueError(f"{name} must be non-negative integer counts; found {y[bad].flatten()[0].item()}")
    return y
