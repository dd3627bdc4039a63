r"""Choosing inducing inputs :math:`Z` from the training inputs :math:`X` (``N x D``).

* :func:`kmeans_plus_plus`: k-means++ seeding (Arthur and Vassilvitskii, 2007) followed by a few Lloyd
  iterations; the centroids are placed where the data are dense.
* :func:`greedy_variance`: the greedy conditional-variance selection of Burt, Rasmussen and van der Wilk (2020)
  ("Greedy Variance Inducing Point Selection"): repeatedly add the training input whose prior variance,
  conditioned on the inputs chosen so far, is largest,

  .. math::
      i_{m+1} = \arg\max_i \big[k(x_i, x_i) - K_{x_i Z_m} K_{Z_m Z_m}^{-1} K_{Z_m x_i}\big].

  It works with any GPyTorch kernel, and the :math:`Z` it returns make the Nyström residual
  :math:`\mathrm{tr}(K_{XX} - Q_{XX})` small, which is what the sparse-GP bound pays for.

Both process the data in chunks of rows: neither forms an :math:`N\times M` distance or kernel matrix in one
piece (``greedy_variance`` does keep the :math:`N\times M` incremental Cholesky factor, see its docstring).

Example::

    >>> import gpytorch, torch
    >>> from gpytorch_augment import greedy_variance, kmeans_plus_plus
    >>> x = torch.randn(200, 2, generator=torch.Generator().manual_seed(0))
    >>> kmeans_plus_plus(x, 10, generator=torch.Generator().manual_seed(0)).shape
    torch.Size([10, 2])
    >>> greedy_variance(x, 10, gpytorch.kernels.RBFKernel()).shape
    torch.Size([10, 2])
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["greedy_variance", "kmeans_plus_plus"]

#: default chunk size: about this many elements per (chunk x M) block
_CHUNK_ELEMENTS = 2**21


def _check_points(x: Tensor, num_inducing: int) -> int:
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a tensor of shape (N, D), got {getattr(x, 'shape', type(x).__name__)}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"x must have at least one row and one column, got shape {tuple(x.shape)}")
    if not torch.is_floating_point(x):
        raise ValueError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    if not torch.isfinite(x).all():
        raise ValueError("x contains NaN or infinite values")
    if isinstance(num_inducing, bool) or int(num_inducing) != num_inducing or not 1 <= int(num_inducing) <= x.shape[0]:
        raise ValueError(f"num_inducing must be an integer in [1, N = {x.shape[0]}], got {num_inducing}")
    return int(num_inducing)


def _chunk_size(chunk_size: int | None, width: int) -> int:
    if chunk_size is None:
        return max(1, _CHUNK_ELEMENTS // max(width, 1))
    if isinstance(chunk_size, bool) or int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    return int(chunk_size)


def _sample_index(weights: Tensor, generator: torch.Generator | None) -> int:
    """One index drawn with probability proportional to ``weights`` (inverse CDF: no 2^24 category limit)."""
    cdf = weights.cumsum(0)
    total = cdf[-1]
    if not total > 0:
        return int(torch.randint(weights.numel(), (1,), generator=generator, device=weights.device))
    u = torch.rand((), generator=generator, dtype=cdf.dtype, device=cdf.device) * total
    return min(int(torch.searchsorted(cdf, u.reshape(1), right=True)), weights.numel() - 1)


def _argmax_random_ties(values: Tensor, generator: torch.Generator | None) -> int:
    """The index of the largest value; ties (within 1e-12 relative) broken uniformly at random."""
    top = values.max()
    ties = torch.nonzero(values >= top - 1e-12 * top.abs(), as_tuple=False).squeeze(-1)
    if ties.numel() == 1:
        return int(ties)
    pick = torch.randint(ties.numel(), (1,), generator=generator, device=ties.device)
    return int(ties[pick])


@torch.no_grad()
def kmeans_plus_plus(
    x: Tensor,
    num_inducing: int,
    generator: torch.Generator | None = None,
    num_iters: int = 10,
    chunk_size: int | None = None,
) -> Tensor:
    r"""``num_inducing`` cluster centres of the rows of ``x``: k-means++ seeding, then ``num_iters`` Lloyd iterations.

    Seeding picks the first centre uniformly and every next one with probability proportional to the squared
    distance :math:`D(x)^2` to the nearest centre chosen so far (an :math:`O(\log M)`-competitive start); Lloyd
    iterations then alternate assignment and centroid steps, stopping early when no assignment changes. A cluster
    that empties keeps its previous centre. Distances are computed as
    :math:`\lVert x\rVert^2 - 2x^\top c + \lVert c\rVert^2` on chunks of ``chunk_size`` rows, so memory is
    :math:`O(N + \text{chunk}\cdot M)`; time :math:`O(NMD)` per iteration.

    :param x: training inputs, ``(N, D)``.
    :param num_inducing: :math:`M \le N`.
    :param generator: a ``torch.Generator`` for the random choices (``None``: the global RNG).
    :param num_iters: Lloyd iterations after seeding (0: seeding only).
    :param chunk_size: rows per chunk (default: about :math:`2^{21}/M`).
    :returns: :math:`Z`, ``(M, D)``, in ``x``'s dtype and device.

    Example::

        >>> import torch
        >>> from gpytorch_augment import kmeans_plus_plus
        >>> from gpytorch_augment.testing.models import SVGP
        >>> x_train = torch.randn(200, 2, generator=torch.Generator().manual_seed(0))
        >>> Z = kmeans_plus_plus(x_train, 10, generator=torch.Generator().manual_seed(0))
        >>> model = SVGP(Z)
        >>> Z.shape
        torch.Size([10, 2])
    """
    num_inducing = _check_points(x, num_inducing)
    if isinstance(num_iters, bool) or int(num_iters) < 0:
        raise ValueError(f"num_iters must be a non-negative integer, got {num_iters}")
    n = x.shape[0]
    chunk = _chunk_size(chunk_size, num_inducing)
    sq_norms = x.pow(2).sum(-1)

    def sq_dist_to(center: Tensor) -> Tensor:
        out = torch.empty(n, dtype=x.dtype, device=x.device)
        for s in range(0, n, chunk):
            xc = x[s : s + chunk]
            out[s : s + chunk] = sq_norms[s : s + chunk] - 2 * (xc @ center) + center.pow(2).sum()
        return out.clamp_min_(0)

    # ---- k-means++ seeding
    chosen = [int(torch.randint(n, (1,), generator=generator, device=x.device))]
    min_d2 = sq_dist_to(x[chosen[0]])
    min_d2[chosen[0]] = 0
    for _ in range(1, num_inducing):
        i = _sample_index(min_d2, generator)
        chosen.append(i)
        min_d2 = torch.minimum(min_d2, sq_dist_to(x[i]))
        min_d2[i] = 0
    centers = x[torch.tensor(chosen, device=x.device)].clone()

    # ---- Lloyd iterations
    assign = torch.full((n,), -1, dtype=torch.long, device=x.device)
    for _ in range(int(num_iters)):
        sums = torch.zeros(num_inducing, x.shape[1], dtype=torch.float64, device=x.device)
        counts = torch.zeros(num_inducing, dtype=torch.float64, device=x.device)
        c_norms = centers.pow(2).sum(-1)
        changed = 0
        for s in range(0, n, chunk):
            xc = x[s : s + chunk]
            d2 = sq_norms[s : s + chunk, None] - 2 * (xc @ centers.mT) + c_norms
            a = d2.argmin(-1)
            changed += int((a != assign[s : s + chunk]).sum())
            assign[s : s + chunk] = a
            sums.index_add_(0, a, xc.to(torch.float64))
            counts.index_add_(0, a, torch.ones_like(a, dtype=torch.float64))
        nonempty = counts > 0
        centers[nonempty] = (sums[nonempty] / counts[nonempty, None]).to(x.dtype)
        if changed == 0:
            break
    return centers


def _kernel_dtype(kernel: torch.nn.Module, fallback: torch.dtype) -> torch.dtype:
    for p in kernel.parameters():
        return p.dtype
    return fallback


@torch.no_grad()
def greedy_variance(
    x: Tensor,
    num_inducing: int,
    kernel: torch.nn.Module,
    generator: torch.Generator | None = None,
    chunk_size: int | None = None,
    threshold: float = 0.0,
    max_candidates: int | None = None,
    return_indices: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Greedy conditional-variance selection of inducing inputs among the rows of ``x`` (Burt et al., 2020).

    Start with the input of largest prior variance :math:`k(x_i, x_i)`; then repeatedly add the input whose
    variance conditioned on the chosen set :math:`Z_m`,
    :math:`d_i = k(x_i, x_i) - K_{x_i Z_m}K_{Z_mZ_m}^{-1}K_{Z_m x_i}`, is largest. This is a pivoted (incremental)
    Cholesky factorisation of :math:`K_{XX}`: with :math:`V` the :math:`N\times m` factor so far and pivot
    :math:`p`, the new column is :math:`v = (K_{Xp} - V V_p^\top)/\sqrt{d_p}` and :math:`d \leftarrow d - v^2`.
    Cost :math:`O(NM^2)` time plus :math:`NM` kernel evaluations (one column per step, evaluated on chunks of
    ``chunk_size`` rows through ``kernel(x1, x2).to_dense()`` and ``kernel(x, diag=True)``, so any GPyTorch
    kernel works); memory :math:`O(NM)` for :math:`V` (float64). For very large :math:`N`, pass
    ``max_candidates`` to select among a random subset of the rows.

    Ties (e.g. the first pick with a stationary kernel, where every :math:`k(x_i, x_i)` is equal) are broken
    uniformly at random with ``generator``.

    :param x: candidate inputs, ``(N, D)``.
    :param num_inducing: :math:`M \le N`.
    :param kernel: a GPyTorch kernel (e.g. ``model.covar_module``) with no batch shape.
    :param generator: a ``torch.Generator`` for tie-breaking and candidate subsampling.
    :param chunk_size: rows per chunk (default: about :math:`2^{21}/M`).
    :param threshold: stop early once the largest conditional variance is :math:`\le` ``threshold`` (the
        returned :math:`Z` then has fewer than :math:`M` rows). With the default 0 the selection stops early only
        if the data are exhausted (fewer than :math:`M` distinct inputs), with a warning.
    :param max_candidates: select among this many rows drawn at random without replacement (``None``: all).
    :param return_indices: also return the row indices of ``x`` that were chosen.
    :returns: :math:`Z`, ``(M, D)`` (rows of ``x``, in selection order), and the indices if asked.

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import greedy_variance
        >>> x_train = torch.randn(200, 2, generator=torch.Generator().manual_seed(0))
        >>> kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
        >>> Z = greedy_variance(x_train, 10, kernel, generator=torch.Generator().manual_seed(0))
        >>> Z.shape
        torch.Size([10, 2])
    """
    num_inducing = _check_points(x, num_inducing)
    if not callable(kernel):
        raise ValueError(f"kernel must be a GPyTorch kernel, got {type(kernel).__name__}")
    if not float(threshold) >= 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    candidates = torch.arange(x.shape[0], device=x.device)
    if max_candidates is not None:
        if isinstance(max_candidates, bool) or int(max_candidates) < num_inducing:
            raise ValueError(
                f"max_candidates must be an integer >= num_inducing = {num_inducing}, got {max_candidates}"
            )
        if int(max_candidates) < x.shape[0]:
            perm = torch.randperm(x.shape[0], generator=generator, device=x.device)
            candidates = perm[: int(max_candidates)].sort().values
    xs = x[candidates] if candidates.numel() < x.shape[0] else x
    xk = xs.to(_kernel_dtype(kernel, xs.dtype))
    n = xk.shape[0]
    chunk = _chunk_size(chunk_size, num_inducing)

    def evaluate(rows: slice, pivot: Tensor | None) -> Tensor:
        if pivot is None:
            out = kernel(xk[rows], diag=True)
        else:
            out = kernel(xk[rows], pivot.unsqueeze(0)).to_dense()[..., 0]
        out = out.to_dense() if hasattr(out, "to_dense") else out
        if out.shape != (min(rows.stop, n) - rows.start,):
            raise ValueError(
                f"the kernel returned shape {tuple(out.shape)} for {min(rows.stop, n) - rows.start} inputs: "
                "greedy_variance needs a kernel with no batch shape"
            )
        return out.to(torch.float64)

    d = torch.cat([evaluate(slice(s, s + chunk), None) for s in range(0, n, chunk)])
    if not torch.isfinite(d).all():
        raise ValueError("the kernel's diagonal k(x, x) is not finite")
    chosen = _pivoted_cholesky(lambda rows, p: evaluate(rows, xk[p]), d, num_inducing, chunk, threshold, generator)
    index = candidates[torch.tensor(chosen, device=x.device, dtype=torch.long)]
    Z = x[index].clone()
    return (Z, index) if return_indices else Z


def _pivoted_cholesky(
    column: Callable[[slice, int], Tensor],
    d: Tensor,
    num_inducing: int,
    chunk: int,
    threshold: float,
    generator: torch.Generator | None,
) -> list[int]:
    """The pivots of a greedy pivoted Cholesky factorisation: ``column(rows, p)`` evaluates :math:`K_{rows, p}`,
    ``d`` (float64, modified in place) holds the diagonal; stops at ``num_inducing`` pivots or when the largest
    remaining conditional variance is at most ``threshold`` (or numerically zero)."""
    n = d.shape[0]
    V = torch.empty(n, num_inducing, dtype=torch.float64, device=d.device)
    chosen: list[int] = []
    scale = float(d.max())
    for m in range(num_inducing):
        p = _argmax_random_ties(d, generator)
        dp = float(d[p])
        if m > 0 and (dp <= threshold or dp <= 1e-12 * scale):
            if threshold == 0.0:
                warnings.warn(
                    f"greedy_variance stopped after {m} of {num_inducing} points: every remaining input is already "
                    "(numerically) spanned by the chosen ones (fewer distinct inputs than num_inducing?)",
                    stacklevel=3,
                )
            break
        chosen.append(p)
        root = dp**0.5
        vp = V[p, :m].clone()
        for s in range(0, n, chunk):
            rows = slice(s, s + chunk)
            col = column(rows, p)
            if m > 0:
                col = col - V[rows, :m] @ vp
            V[rows, m] = col / root
        d.sub_(V[:, m].pow(2)).clamp_min_(0)
        d[torch.tensor(chosen, device=d.device)] = -1.0  # never pick twice
    return chosen

