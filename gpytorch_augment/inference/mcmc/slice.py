r"""Slice sampling along a random direction (Neal 2003, "Slice sampling", Ann. Statist. 31), vectorised over chains.

One move of a chain at :math:`x_0 \in \mathbb R^P` with log density :math:`\ell` (known up to a constant):

1. a direction :math:`d` uniform on the unit sphere, and the level :math:`\log u = \ell(x_0) - e`,
   :math:`e \sim \mathrm{Exp}(1)` (:math:`u \sim \mathcal U(0, p(x_0))`); along the line
   :math:`x_0 + t d` the slice is :math:`S = \{t : \ell(x_0 + t d) > \log u\}`;
2. **stepping out** (Neal's Fig. 3): an interval of width :math:`w` placed uniformly around :math:`t = 0`,
   :math:`[-wU, w - wU]`, and at most :math:`m - 1` steps of :math:`w` in all, :math:`J = \lfloor mV\rfloor` of them
   to the left and :math:`m - 1 - J` to the right, each end stepping out while it lies in the slice;
3. **shrinkage** (Fig. 5): :math:`t_1` uniform on the interval; accepted if in the slice, else the interval shrinks to
   :math:`t_1` on its side of 0, and again.

Neal shows (his section 4) that the move leaves :math:`p` invariant: the level and the line are drawn given
:math:`x_0` by a kernel reversible for the uniform law under the graph of :math:`p`, and for the stepping-out
procedure with the randomised split of the :math:`m` steps and shrinkage towards the current point the probability
of building an interval from which :math:`t_1` is drawn is the same starting from :math:`t_1` as from 0, so the
move along the line is reversible for the uniform law on :math:`S` (no acceptance test is needed with stepping out).
The direction is drawn independently of :math:`x_0` and is symmetric, so the whole move is reversible for
:math:`p`. A width chosen from the chains' own history breaks this only while it changes: adapt it in warm-up only.

Vectorised: every round evaluates the log density once, as one batch of the chains (and interval ends) still in
play; a chain leaves as soon as it is done. A point where the density cannot be evaluated (a factorisation failed,
a value not finite) counts as outside the slice.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["MAX_SHRINKS", "MAX_STEPS_OUT", "LogDensity", "SliceMove", "slice_move"]

#: Neal's :math:`m`: the interval grows by at most :math:`m - 1` steps of the width
MAX_STEPS_OUT = 10
#: shrinkage rounds before a chain gives up and stays where it is (the interval has then shrunk by about
#: :math:`2^{-60}`: reached only where the density is not finite at the current point)
MAX_SHRINKS = 60

#: ``log_density(x, index)``: the log density at points ``x`` ``(n, P)`` of the chains ``index`` ``(n,)``, and a
#: tuple of tensors with leading dimension ``n`` computed with it (kept for the accepted points)
LogDensity = Callable[[Tensor, Tensor], tuple[Tensor, tuple[Tensor, ...]]]


class SliceMove(NamedTuple):
    """The result of :func:`slice_move`: the new points ``x`` ``(C, P)``, their log densities ``log_p`` ``(C,)`` and
    payloads, the distance ``t`` moved along the unit direction ``(C,)`` and the number of batched evaluations."""

    x: Tensor
    log_p: Tensor
    payload: tuple[Tensor, ...]
    t: Tensor
    evaluations: int


def _finite(log_p: Tensor) -> Tensor:
    """Non-finite log densities (NaN, :math:`\\pm\\infty`) as :math:`-\\infty`: outside every slice."""
    return torch.where(torch.isfinite(log_p), log_p, torch.full_like(log_p, -math.inf))


def slice_move(
    x0: Tensor,
    log_p0: Tensor,
    payload0: tuple[Tensor, ...],
    log_density: LogDensity,
    width: Tensor,
    generator: torch.Generator | None,
    max_steps_out: int = MAX_STEPS_OUT,
    max_shrinks: int = MAX_SHRINKS,
) -> SliceMove:
    r"""One random-direction slice-sampling move of every chain (module docstring).

    :param x0: the current points ``(C, P)``.
    :param log_p0: their log densities ``(C,)``, finite.
    :param payload0: what ``log_density`` returns with them (kept for a chain that does not move).
    :param log_density: see :data:`LogDensity`.
    :param width: the step-out width per chain ``(C,)`` (along a unit direction).
    :param generator: drives every draw.
    :param max_steps_out: Neal's :math:`m`.
    :param max_shrinks: see :data:`MAX_SHRINKS`.

    Example (a standard normal in 2-D, 4000 chains, 20 moves)::

        >>> import torch
        >>> from gpytorch_augment.inference.mcmc.slice import slice_move
        >>> g = torch.Generator().manual_seed(0)
        >>> log_p = lambda x, idx: (-0.5 * x.square().sum(-1), ())
        >>> x = torch.full((4000, 2), 3.0, dtype=torch.float64)
        >>> for _ in range(20):
        ...     move = slice_move(x, log_p(x, None)[0], (), log_p, torch.full((4000,), 2.0), g)
        ...     x = move.x
        >>> bool(x.mean(0).abs().max() < 0.1), bool((x.var(0) - 1).abs().max() < 0.1)
        (True, True)
    """
    C, P = x0.shape
    kw = {"dtype": x0.dtype, "device": x0.device}
    width = width.to(**kw)
    z = torch.randn((C, P), generator=generator, **kw)
    d = z / z.norm(dim=-1, keepdim=True)
    e = torch.empty(C, **kw).exponential_(1.0, generator=generator)
    level = log_p0 - e
    left = -width * torch.rand(C, generator=generator, **kw)
    right = left + width
    steps_left = torch.floor(max_steps_out * torch.rand(C, generator=generator, **kw))
    steps_right = (max_steps_out - 1) - steps_left
    chains = torch.arange(C, device=x0.device)
    evaluations = 0

    def evaluate(t: Tensor, index: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        nonlocal evaluations
        evaluations += 1
        log_p, payload = log_density(x0[index] + t.unsqueeze(-1) * d[index], index)
        return _finite(log_p), payload

    # stepping out: both ends of every chain in one batch, then the ends still in the slice
    both = torch.cat([chains, chains])
    log_p_ends, _ = evaluate(torch.cat([left, right]), both)
    log_left, log_right = log_p_ends[:C].clone(), log_p_ends[C:].clone()
    while True:
        go_left = (steps_left > 0) & (log_left > level)
        go_right = (steps_right > 0) & (log_right > level)
        if not bool((go_left | go_right).any()):
            break
        left = torch.where(go_left, left - width, left)
        right = torch.where(go_right, right + width, right)
        steps_left = steps_left - go_left.to(steps_left.dtype)
        steps_right = steps_right - go_right.to(steps_right.dtype)
        idx_l, idx_r = chains[go_left], chains[go_right]
        log_p_ends, _ = evaluate(torch.cat([left[idx_l], right[idx_r]]), torch.cat([idx_l, idx_r]))
        log_left[idx_l] = log_p_ends[: idx_l.numel()]
        log_right[idx_r] = log_p_ends[idx_l.numel() :]

    # shrinkage
    x, log_p = x0.clone(), log_p0.clone()
    payload = tuple(p.clone() for p in payload0)
    t_done = torch.zeros(C, **kw)
    pending = chains
    for _ in range(max_shrinks):
        if pending.numel() == 0:
            break
        lo, hi = left[pending], right[pending]
        t = lo + (hi - lo) * torch.rand(pending.numel(), generator=generator, **kw)
        log_p_t, payload_t = evaluate(t, pending)
        accept = log_p_t > level[pending]
        done = pending[accept]
        x[done] = x0[done] + t[accept].unsqueeze(-1) * d[done]
        log_p[done] = log_p_t[accept]
        t_done[done] = t[accept]
        for buf, new in zip(payload, payload_t):
            buf[done] = new[accept]
        rejected = ~accept
        pending, t = pending[rejected], t[rejected]
        below = t < 0
        left[pending] = torch.where(below, t, left[pending])
        right[pending] = torch.where(below, right[pending], t)
    return SliceMove(x, log_p, payload, t_done, evaluations)
