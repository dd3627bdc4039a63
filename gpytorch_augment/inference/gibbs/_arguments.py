"""Argument checks of :class:`~gpytorch_augment.inference.gibbs.sampler.GibbsSampler`: each returns the value in
the form the sampler uses, or raises a ``ValueError`` naming the argument."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from torch import Tensor

from .state import GibbsState


def check_seed(seed: Any) -> None:
    """``ValueError`` naming ``seed`` unless it is ``None`` or an integer a ``torch.Generator`` takes."""
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer or None, got {seed!r}")
    if not 0 <= int(seed) < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64) (a torch.Generator seed) or None, got {seed!r}")


def check_alpha(alpha: Any, sparse: bool) -> float:
    """``alpha`` as a float in [0, 1], or a ``ValueError`` naming it."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)):
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    if not 0.0 <= float(alpha) <= 1.0:  # NaN fails too
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    if float(alpha) != 0.0 and not sparse:
        raise ValueError(
            f"alpha = {alpha!r} needs inducing_points: the Power-EP alpha of the VI-Gibbs sampler exists only for the "
            "inducing-point model (the exact sampler has no approximation to tune)"
        )
    return float(alpha)


def initial_state(init: GibbsState | Mapping[str, Any] | Tensor | None) -> GibbsState | None:
    """``init`` of :meth:`GibbsSampler.sample` as a :class:`GibbsState` (``None``: start from the prior)."""
    if init is None or isinstance(init, GibbsState):
        return init
    if isinstance(init, Mapping):
        if "f" not in init:
            raise ValueError(f"init must contain the latents under key 'f'; got keys {sorted(init)}")
        return GibbsState.from_state_dict(init)
    return GibbsState(f=init)
