r"""Solvers: :func:`reverse_cholesky`, the bracketed Newton root finder, the bounded one-dimensional maximiser and
the Abate--Whitt Euler inversion of a Laplace transform."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor


def reverse_cholesky(B: Tensor, checked: bool = True) -> Tensor:
    r"""Lower-triangular :math:`C` with :math:`B = C^\top C`, so that :math:`\mathrm{chol}(B^{-1}) = C^{-1}`.

    Computed as :math:`C = \mathrm{flip}(\mathrm{chol}(\mathrm{flip}(B)))^\top` where ``flip`` reverses both axes.
    ``checked``: GPyTorch's ``psd_safe_cholesky`` (jitter retries; it reads the factorisation's status back, a host
    synchronisation on CUDA). ``checked=False`` is for precisions :math:`B \succeq I` (whitened posteriors), whose
    factorisation cannot fail in exact arithmetic and which jitter would not help: no retry, no synchronisation, and a
    failed factorisation (non-finite entries) gives NaN factors, which surface as a non-finite ELBO.

    Example::

        >>> import torch
        >>> B = torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
        >>> C = reverse_cholesky(B, checked=False)
        >>> torch.allclose(C.mT @ C, B), bool(C[0, 1] == 0)
        (True, True)
    """
    flipped = B.flip(-1, -2)
    if checked:
        from linear_operator.utils.cholesky import psd_safe_cholesky

        factor = psd_safe_cholesky(flipped)
    else:
        factor, info = torch.linalg.cholesky_ex(flipped)
        factor = torch.where((info > 0)[..., None, None], torch.nan, factor)
    return factor.flip(-1, -2).mT


def safeguarded_newton(
    fn: Callable[[Tensor], tuple[Tensor, Tensor]],
    lo: Tensor,
    hi: Tensor,
    x0: Tensor | None = None,
    *,
    increasing: bool | None = None,
    rtol: float = 1e-13,
    atol: float = 1e-13,
    max_iter: int = 100,
) -> Tensor:
    r"""Elementwise root of :math:`g(x) = 0` in :math:`[lo, hi]` by Newton steps safeguarded by a bracket.

    ``fn(x)`` returns :math:`(g(x), g'(x))`, elementwise in ``x`` (a batch of independent scalar equations, one per
    element of ``broadcast(lo, hi, x0)``). Every step shrinks the bracket to the side where :math:`g` changes
    sign, and a Newton step :math:`x - g/g'` that is not finite or leaves the open bracket is replaced by
    bisection; so the iteration always converges (at worst linearly, like bisection) and, near a simple root,
    quadratically: a handful of steps from a reasonable start. It stops when a step is below
    ``atol + rtol * |x|`` (``rtol`` at least two machine epsilons) or the bracket is that narrow, or after
    ``max_iter`` steps.

    Without ``increasing``, :math:`g` is evaluated at both ends first; where it has the same sign at both, the end
    with the smaller :math:`|g|` is returned (for a monotone :math:`g`, the root clipped to :math:`[lo, hi]`).
    With ``increasing=True``/``False`` (a monotone :math:`g` whose direction is known) those two evaluations
    are skipped, and a root beyond the bracket is approached by bisection towards the nearer end.
    :math:`g` must be finite on the bracket.

    :param fn: :math:`x \mapsto (g(x), g'(x))`.
    :param lo: lower ends of the brackets.
    :param hi: upper ends of the brackets (``hi >= lo``).
    :param x0: starting points (clamped into the bracket; default the midpoints), e.g. the previous root.
    :param increasing: the direction of a monotone :math:`g`, if known.
    :returns: the roots, shape ``broadcast(lo, hi, x0)``.

    Example::

        >>> g = lambda x: (x**3 - 2, 3 * x**2)
        >>> safeguarded_newton(g, torch.tensor(0.0), torch.tensor(2.0), increasing=True)   # 2 ** (1 / 3)
        tensor(1.2599)
    """
    lo, hi = torch.broadcast_tensors(lo, hi) if x0 is None else torch.broadcast_tensors(lo, hi, x0)[:2]
    # always checked: one read back from the device, in a function whose iteration reads its convergence flag anyway
    if reversed_brackets := int((hi < lo).sum()):
        raise ValueError(
            f"safeguarded_newton: every bracket needs hi >= lo, got hi < lo in {reversed_brackets} of {lo.numel()}"
        )
    x = (lo + hi) / 2 if x0 is None else torch.minimum(torch.maximum(x0, lo), hi)
    if increasing is None:
        g_lo, g_hi = fn(lo)[0], fn(hi)[0]
        sign_lo = torch.sign(g_lo)
        bracketed = sign_lo * torch.sign(g_hi) < 0
        # no sign change: the end nearer the root (a zero at either end is also caught here)
        x = torch.where(bracketed, x, torch.where(g_hi.abs() < g_lo.abs(), hi, lo))
        done = ~bracketed
    else:
        sign_lo = torch.full_like(x, -1.0 if increasing else 1.0)
        done = torch.zeros_like(x, dtype=torch.bool)
    rtol = max(rtol, 2 * torch.finfo(x.dtype).eps)  # else adjacent floats may alternate until max_iter
    # the convergence test reads a flag back from the device: on an accelerator only every 4th iteration (a finished
    # element no longer moves, so the extra iterations change nothing but their cost)
    check_every = 1 if x.device.type == "cpu" else 4
    for it in range(max_iter):
        if it % check_every == 0 and bool(done.all()):
            break
        g, slope = fn(x)
        beyond = g * sign_lo > 0  # g has its sign at lo: the root lies beyond x
        lo, hi = torch.where(beyond, x, lo), torch.where(beyond, hi, x)
        newton = x - g / slope
        inside = (newton > lo) & (newton < hi)  # False for nan and inf too
        new_x = torch.where(done | (g == 0), x, torch.where(inside, newton, (lo + hi) / 2))
        tol = atol + rtol * new_x.abs()
        done = done | ((new_x - x).abs() <= tol) | (hi - lo <= tol)
        x = new_x
    return x


def bounded_maximise(
    objective: Callable[[Tensor], Tensor],
    lo: float,
    hi: float,
    incumbent: Tensor,
    *,
    grid_points: int = 48,
    golden_steps: int = 45,
) -> Tensor:
    r"""Elementwise maximiser of a one-dimensional objective on :math:`[lo, hi]`: the best point of a uniform grid,
    refined by golden-section search between its neighbours; the ``incumbent`` where that is no better.

    ``objective`` maps points of shape ``(G, *incumbent.shape)`` to values of the same shape (a batch of independent
    scalar problems, one per element of ``incumbent``). The golden section keeps a bracket around the maximum with
    one evaluation per step, so the result is the maximiser to :math:`2\Delta\cdot 0.618^{\text{golden\_steps}}`
    (:math:`\Delta` the grid step) for an objective unimodal between the grid neighbours of its best point; the grid
    guards against other local maxima. Returning the incumbent where the search finds no higher value makes a
    coordinate step that uses it monotone.

    :param objective: :math:`x \mapsto F(x)`, vectorised.
    :param lo: lower end of the search interval.
    :param hi: upper end (``hi > lo``).
    :param incumbent: the current point of every problem.
    :returns: the maximisers, shape ``incumbent.shape``.
    """
    grid = torch.linspace(lo, hi, grid_points, dtype=incumbent.dtype, device=incumbent.device)
    grid = grid.view(-1, *([1] * incumbent.dim())).expand(-1, *incumbent.shape)
    centre = grid.gather(0, objective(grid).argmax(0, keepdim=True))
    step = (hi - lo) / (grid_points - 1)
    a, b = (centre - step).clamp_min(lo), (centre + step).clamp_max(hi)
    ratio = (math.sqrt(5.0) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = objective(c), objective(d)
    for _ in range(golden_steps):  # keep the bracket [a, b] around the maximum; one evaluation per step
        left = fc >= fd
        a, b = torch.where(left, a, c), torch.where(left, d, b)
        new = torch.where(left, b - ratio * (b - a), a + ratio * (b - a))
        f_new = objective(new)
        c, d, fc, fd = (
            torch.where(left, new, d),
            torch.where(left, c, new),
            torch.where(left, f_new, fd),
            torch.where(left, fc, f_new),
        )
    best = torch.where(fc >= fd, c, d)
    current = incumbent.unsqueeze(0)
    return torch.where(objective(best) >= objective(current), best, current)[0]


#: Abate--Whitt Euler inversion: the discretisation error is about :math:`e^{-A}` (relative to the function at
#: :math:`3t, 5t, \dots`), ``EULER_TERMS`` terms of the alternating series are summed and the last
#: ``EULER_AVERAGED`` partial sums are averaged with binomial weights (Euler summation). With :math:`A = 18.4`,
#: 15 and 11 (their choice) the error is ~1e-8 and the round-off :math:`e^{A/2}\epsilon\approx 10^{-12}`.
EULER_A = 18.4
EULER_TERMS = 15
EULER_AVERAGED = 11


@lru_cache(maxsize=8)
def _euler_weights(terms: int, averaged: int) -> tuple[np.ndarray, np.ndarray]:
    """The weight of each series term :math:`k = 0..n+m` in the binomially averaged partial sums, and the sign
    :math:`(-1)^k` folded in (term 0 halved)."""
    binomial = np.array([math.comb(averaged, j) for j in range(averaged + 1)], dtype=np.float64) / 2.0**averaged
    # term k enters the partial sums s_{n+j} for every j with n + j >= k
    weights = np.array([binomial[max(k - terms, 0):].sum() for k in range(terms + averaged + 1)])
    weights *= (-1.0) ** np.arange(terms + averaged + 1)
    weights[0] *= 0.5
    return weights, np.arange(terms + averaged + 1, dtype=np.float64)


def euler_inversion(
    transform: Callable[[Tensor], Tensor],
    t: Tensor,
    *,
    a: float = EULER_A,
    terms: int = EULER_TERMS,
    averaged: int = EULER_AVERAGED,
) -> Tensor:
    r"""The inverse Laplace transform :math:`g(t)` of :math:`\hat g(s) = \int_0^\infty e^{-st} g(t)\,dt`, at
    every point ``t > 0``, by the Euler algorithm of Abate and Whitt (1995, "Numerical inversion of Laplace
    transforms of probability distributions"):

    .. math::
        g(t) \approx \frac{e^{A/2}}{t}\sum_{j=0}^{m} \binom mj 2^{-m} s_{n+j}, \qquad
        s_n = \tfrac12\operatorname{Re}\hat g\big(\tfrac{A}{2t}\big)
        + \sum_{k=1}^{n} (-1)^k \operatorname{Re}\hat g\big(\tfrac{A + 2k\pi i}{2t}\big),

    the trapezoid rule on the Bromwich contour (discretisation error :math:`\sum_{k\ge1}e^{-kA}g((2k+1)t)`)
    followed by Euler summation of the alternating tail. For a CDF :math:`F` pass :math:`\hat g(s) = \varphi(s)/s`
    (:math:`\varphi` the transform of the law), for its density :math:`\hat g = \varphi`. The error is about
    :math:`e^{-A}` absolute for a CDF and, for a density, relative to its values at :math:`3t, 5t, \dots` (so
    small on a decreasing tail, larger deep in an increasing left tail).

    :param transform: :math:`s \mapsto \hat g(s)`, evaluated on complex ``s`` of shape ``(*t.shape, n + m + 1)``
        with :math:`\operatorname{Re} s > 0` (the analytic continuation, elementwise).
    :param t: points, float64 (any shape).
    :returns: :math:`g(t)`, shape of ``t``.

    Example::

        >>> import torch
        >>> from gpytorch_augment._numerics import euler_inversion
        >>> t = torch.tensor([0.5, 1.0, 3.0], dtype=torch.float64)
        >>> cdf = euler_inversion(lambda s: 1 / (s * (1 + s)), t)     # Exp(1): F(t) = 1 - exp(-t)
        >>> bool(torch.allclose(cdf, 1 - torch.exp(-t), atol=1e-8))
        True
    """
    weights, k = _euler_weights(int(terms), int(averaged))
    w = torch.as_tensor(weights, dtype=t.dtype, device=t.device)
    k = torch.as_tensor(k, dtype=t.dtype, device=t.device)
    tt = t.unsqueeze(-1)
    s = torch.complex(a / (2 * tt).expand(*t.shape, k.numel()), math.pi * k / tt)
    values = transform(s).real
    return math.exp(a / 2) / t * (w * values).sum(-1)
