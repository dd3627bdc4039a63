"""Argument checks of the driver :class:`~gpytorch_augment.inference.mcmc.MCMC`: each returns the value in the form
the driver uses, or raises a ``ValueError`` naming the argument."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..._validation import check_finite
from .state import ChainState
from .target import PosteriorTarget


def check_count(name: str, value: Any, minimum: int) -> int:
    """``value`` as an ``int`` if it is an integer ``>= minimum``, else a ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_seed(seed: Any) -> None:
    """``ValueError`` naming ``seed`` unless it is ``None`` or an integer a ``torch.Generator`` takes."""
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer or None, got {seed!r}")
    if not 0 <= int(seed) < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64) (a torch.Generator seed) or None, got {seed!r}")


def initial_state(init: ChainState | Mapping[str, Any] | Tensor | None) -> ChainState | None:
    """``init`` of :meth:`MCMC.sample` as a :class:`ChainState` (``None``: start from the prior)."""
    if init is None or isinstance(init, ChainState):
        return init
    if isinstance(init, Mapping):
        if "f" not in init:
            raise ValueError(f"init must contain the latents under key 'f'; got keys {sorted(init)}")
        return ChainState.from_state_dict(init)
    return ChainState(f=init)


def check_init_state(target: PosteriorTarget, state: ChainState, num_chains: int, with_constants: bool) -> None:
    """Every shared field of an ``init`` state checked up front (shape, finiteness), not only ``f``: a clear
    ``ValueError`` naming the field rather than a raw error (or a silent start) later. ``with_constants``: the
    kernel samples the likelihood's constants, so ``init.hyper`` is checked too."""
    T, n, C = target.num_latents, target.num_data, num_chains
    target.from_storage(state.f, num_chains)
    if not isinstance(state.num_sweeps, int) or isinstance(state.num_sweeps, bool) or state.num_sweeps < 0:
        raise ValueError(f"init.num_sweeps must be a non-negative integer; got {state.num_sweeps!r}")
    if not isinstance(state.aux, Mapping):
        raise ValueError(f"init.aux must be a dict of tensors; got {type(state.aux).__name__}")
    for name, value in state.aux.items():
        if not isinstance(value, Tensor):
            raise ValueError(f"init.aux[{name!r}] must be a tensor; got {type(value).__name__}")
        if value.dim() < 2 or value.shape[0] not in (1, C) or value.shape[1] != n:
            raise ValueError(
                f"init.aux[{name!r}] must have shape (chains, N, ...) with chains = 1 or {C} and N = {n}; "
                f"got shape {tuple(value.shape)}"
            )
        if bool(torch.isnan(value).any()):
            raise ValueError(f"init.aux[{name!r}] holds NaN")
    if state.u is not None:
        if not target.is_sparse:
            raise ValueError("init.u holds inducing values but this sampler has no inducing points")
        M = target.num_inducing
        u = torch.as_tensor(state.u)
        layout = u.unsqueeze(-2) if T == 1 and u.dim() >= 1 else u
        if layout.dim() != 3 or layout.shape[0] not in (1, C) or layout.shape[-2:] != (T, M):
            expected = f"(chains, M), M = {M}" if T == 1 else f"(chains, T, M), T = {T}, M = {M}"
            raise ValueError(f"init.u must have shape {expected}; got shape {tuple(u.shape)}")
        check_finite("init.u", u)
    if state.step_size is not None:
        step = state.step_size
        if not isinstance(step, Tensor) or step.dim() != 1 or step.shape[0] not in (1, C):
            raise ValueError(
                f"init.step_size must be a tensor of shape (chains,) with chains = 1 or {C}; got "
                f"{tuple(step.shape) if isinstance(step, Tensor) else type(step).__name__}"
            )
        if not bool((torch.isfinite(step) & (step > 0)).all()):
            raise ValueError("init.step_size must hold positive finite step sizes")
    length = state.trajectory_length
    if length is not None and (
        isinstance(length, bool) or not isinstance(length, (int, float)) or not (math.isfinite(length) and length > 0)
    ):
        raise ValueError(f"init.trajectory_length must be a positive number or None; got {length!r}")
    if state.hyper and with_constants:
        current = target.constants_snapshot({})
        for name, value in state.hyper.items():
            value = torch.as_tensor(value)
            check_finite(f"init.hyper[{name!r}]", value)
            shape = current.get(name, value).shape
            per_chain = value.dim() >= 1 and value.shape[1:] == shape and value.shape[0] in (1, C)
            if value.shape != shape and not per_chain:
                raise ValueError(
                    f"init.hyper[{name!r}] must have the parameter's shape {tuple(shape)} or (chains, "
                    f"*{tuple(shape)}) with chains = 1 or {C}; got shape {tuple(value.shape)}"
                )
