r"""One Hamiltonian Monte Carlo move of a batch of chains on a differentiable log density, with a payload.

For a log density :math:`\ell(x)`, :math:`x \in \mathbb R^P` (known up to a constant), a diagonal scale
:math:`\sigma \in \mathbb R^P_{>0}` and a step size :math:`\varepsilon`, one move of a chain at :math:`x_0`:

1. works in the scaled coordinates :math:`z = x / \sigma` (unit mass: the kinetic energy
   :math:`\frac12\lVert p\rVert^2`, i.e. the mass matrix :math:`\mathrm{diag}(\sigma)^{-2}` in :math:`x`);
2. draws the momentum :math:`p \sim \mathcal N(0, I)` and integrates Hamilton's equations for
   :math:`H(z, p) = -\ell(\sigma z) + \frac12\lVert p\rVert^2` by :math:`n = \lceil t / \varepsilon\rceil` leapfrog
   steps (the time :math:`t` is given, drawn independently of the state);
3. accepts the end point with probability :math:`\min(1, e^{H_0 - H_n})` (Metropolis), else stays.

The leapfrog map is volume-preserving and reversible under :math:`p \mapsto -p`, and :math:`\sigma`,
:math:`\varepsilon` and :math:`t` do not depend on the current state, so the move leaves :math:`\ell` invariant
(Neal 2011, "MCMC using Hamiltonian dynamics", §3.2). A point where :math:`\ell` or its gradient is not finite, or
where the energy error exceeds :data:`DIVERGENCE`, ends the chain's trajectory as a rejection (a divergence).

Vectorised over chains: each leapfrog step evaluates :math:`\ell` and :math:`\nabla\ell` once, as one batch of the
chains whose trajectories are still running (chains with a larger step size take fewer steps and leave earlier).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["DIVERGENCE", "HMCMove", "LogDensityGrad", "hmc_move"]

#: an energy error :math:`H_k - H_0` above this ends a trajectory as a divergence (NumPyro's and Stan's 1000)
DIVERGENCE = 1000.0

#: ``log_density(x, index)``: at points ``x`` ``(n, P)`` of the chains ``index`` ``(n,)``, the log density ``(n,)``,
#: its gradient ``(n, P)`` and a tuple of tensors with leading dimension ``n`` kept for the accepted points
LogDensityGrad = Callable[[Tensor, Tensor], tuple[Tensor, Tensor, tuple[Tensor, ...]]]


class HMCMove(NamedTuple):
    """The result of :func:`hmc_move` for ``C`` chains: the new points ``x`` ``(C, P)``, their log densities, gradients
    and payloads; the acceptance probabilities ``(C,)``; the proposals ``z1`` and their momenta ``p1`` in the scaled
    coordinates ``(C, P)`` (for a trajectory-length adaptation); the integration times ``(C,)``; the number of
    batched evaluations; the chains that diverged ``(C,)``."""

    x: Tensor
    log_p: Tensor
    grad: Tensor
    payload: tuple[Tensor, ...]
    accept_prob: Tensor
    z0: Tensor
    z1: Tensor
    p1: Tensor
    times: Tensor
    evaluations: int
    diverged: Tensor


def _select(mask: Tensor, new: Tensor, old: Tensor) -> Tensor:
    return torch.where(mask.reshape((-1,) + (1,) * (new.dim() - 1)), new, old)


def hmc_move(
    x0: Tensor,
    log_p0: Tensor,
    grad0: Tensor,
    payload0: tuple[Tensor, ...],
    log_density: LogDensityGrad,
    scale: Tensor,
    step_size: Tensor,
    time: float,
    generator: torch.Generator | None,
    max_steps: int,
) -> HMCMove:
    r"""One HMC move of every chain (module docstring).

    :param x0: current points ``(C, P)``, with ``log_p0`` ``(C,)``, ``grad0`` ``(C, P)`` and ``payload0`` (each
        ``(C, ...)``) computed at them.
    :param log_density: the log density and its gradient (:data:`LogDensityGrad`).
    :param scale: :math:`\sigma`, ``(P,)`` or ``(C, P)``.
    :param step_size: :math:`\varepsilon` per chain ``(C,)``.
    :param time: the integration time :math:`t` (each chain takes :math:`\lceil t/\varepsilon_c\rceil` steps, at most
        ``max_steps``).
    """
    C = x0.shape[0]
    scale = scale.expand_as(x0)
    steps = torch.ceil(time / step_size).clamp(1, max_steps).long()
    eps = step_size.unsqueeze(-1)
    p = torch.randn(x0.shape, generator=generator, dtype=x0.dtype, device=x0.device)
    z = x0 / scale
    H0 = -log_p0 + 0.5 * p.pow(2).sum(-1)
    g = grad0 * scale  # the gradient in z
    log_p, grad, payload = log_p0, grad0, payload0
    running = torch.isfinite(log_p0)
    diverged = ~running
    evaluations = 0
    for k in range(int(steps.max())):
        active = running & (k < steps)
        if not bool(active.any()):
            break
        index = torch.nonzero(active).flatten()
        p_half = p[index] + 0.5 * eps[index] * g[index]
        z_new = z[index] + eps[index] * p_half
        lp, gr, pay = log_density(z_new * scale[index], index)
        evaluations += 1
        ok = torch.isfinite(lp) & torch.isfinite(gr).all(-1)
        g_new = torch.where(ok.unsqueeze(-1), gr * scale[index], torch.zeros_like(gr))
        p_new = p_half + 0.5 * eps[index] * g_new
        energy = -lp + 0.5 * p_new.pow(2).sum(-1)
        ok = ok & torch.isfinite(energy) & (energy - H0[index] < DIVERGENCE)
        # chains that diverge stop where they are (their proposal is rejected below)
        rows = index[ok]
        z[rows], p[rows], g[rows] = z_new[ok], p_new[ok], g_new[ok]
        log_p = log_p.clone()
        log_p[rows] = lp[ok]
        grad = grad.clone()
        grad[rows] = gr[ok]
        payload = tuple(_scatter(old, new, rows, ok) for old, new in zip(payload, pay))
        bad = index[~ok]
        running[bad], diverged[bad] = False, True
    H1 = -log_p + 0.5 * p.pow(2).sum(-1)
    accept_prob = torch.where(diverged, torch.zeros_like(H0), torch.exp(torch.clamp(H0 - H1, max=0.0)))
    u = torch.rand(C, generator=generator, dtype=x0.dtype, device=x0.device)
    accept = (u < accept_prob) & ~diverged
    x1 = z * scale
    x = _select(accept, x1, x0)
    out_payload = tuple(_select(accept, new, old) for new, old in zip(payload, payload0))
    return HMCMove(
        x=x,
        log_p=torch.where(accept, log_p, log_p0),
        grad=_select(accept, grad, grad0),
        payload=out_payload,
        accept_prob=accept_prob,
        z0=x0 / scale,
        z1=z,
        p1=p,
        times=(steps.to(x0.dtype) * step_size),
        evaluations=evaluations,
        diverged=diverged,
    )


def _scatter(old: Tensor, new: Tensor, rows: Tensor, ok: Tensor) -> Tensor:
    out = old.clone()
    out[rows] = new[ok]
    return out

