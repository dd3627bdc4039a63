"""Small dense linear-algebra helpers shared by the Gaussian core and the engines (batched, any device)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.linalg import solve_triangular

__all__ = ["BLOCK_ELEMENTS", "add_to_diagonal", "block_width", "mv", "tri_solve", "vecmat"]

#: the products over the data (the whitened cross-covariance, the marginal variances, the sufficient statistics) run
#: over blocks of data points whose ``(*b, M, n)`` slices hold about this many entries (16 MiB in float64): the
#: temporaries then stay in cache instead of streaming ``M x N`` arrays through memory several times (measured in
#: benchmarks/README.md, engine notes)
BLOCK_ELEMENTS = 2**21


def tri_solve(L: Tensor, rhs: Tensor, upper: bool = False, left: bool = True) -> Tensor:
    """:math:`L^{-1}\\,\\mathrm{rhs}` (or :math:`\\mathrm{rhs}\\,L^{-1}` with ``left=False``) for triangular ``L``.

    Example::

        >>> import torch
        >>> from gpytorch_augment.core.linalg import tri_solve
        >>> tri_solve(torch.tensor([[2.0, 0.0], [1.0, 1.0]]), torch.tensor([[2.0], [2.0]])).squeeze(-1).tolist()
        [1.0, 1.0]
    """
    return solve_triangular(L, rhs, upper=upper, left=left)


def block_width(num_columns: int, rows: int, device: torch.device | str = "cpu") -> int:
    """How many data points (columns) a block holds such that, with ``rows`` rows per point, it has about
    :data:`BLOCK_ELEMENTS` entries: ``num_columns`` (one block, the whole) unless there are at least two blocks' worth
    of points, or on a device other than the CPU (blocks are for the CPU's caches; a GPU gains from large arrays).
    Split with ``tensor.split(width, dim)`` -- whose backward joins the blocks' gradients in one concatenation, where
    slicing would allocate a full-size gradient per block -- and sum or concatenate the blocks' results: equal to the
    one-piece result up to rounding.

    Example::

        >>> from gpytorch_augment.core.linalg import block_width
        >>> block_width(1000, 100), block_width(10**6, 100), block_width(10**6, 100, "meta")
        (1000, 20971, 1000000)
    """
    width = max(1, BLOCK_ELEMENTS // max(1, rows))
    return num_columns if num_columns < 2 * width or torch.device(device).type != "cpu" else width


def mv(mat: Tensor, vec: Tensor) -> Tensor:
    """Batched matrix-vector product ``mat @ vec``: ``(..., m, n) x (..., n) -> (..., m)``.

    Example::

        >>> import torch
        >>> from gpytorch_augment.core.linalg import mv
        >>> mv(torch.eye(2) * 3, torch.ones(2)).tolist()
        [3.0, 3.0]
    """
    return (mat @ vec.unsqueeze(-1)).squeeze(-1)


def vecmat(vec: Tensor, mat: Tensor) -> Tensor:
    r"""``vec @ mat`` per latent for a chain-free stack of matrices: ``vec`` ``(..., T, n)``, ``mat`` ``(T, n, m)``
    -> ``(..., T, m)``.

    One matrix-matrix product per latent serves every leading (chain) index at once, which is much faster than a
    batched matrix-vector product per chain (fastest with ``mat`` contiguous); :math:`Mv` is ``vecmat(v, M.mT)``.

    Example::

        >>> import torch
        >>> from gpytorch_augment.core.linalg import vecmat
        >>> vecmat(torch.ones(5, 1, 2), torch.tensor([[[1.0, 2.0], [3.0, 4.0]]]))[0].tolist()  # 5 chains, T = 1
        [[4.0, 6.0]]
    """
    T, n, m = mat.shape
    if T == 1:
        return (vec.reshape(-1, n) @ mat[0]).reshape(*vec.shape[:-1], m)
    lead = vec.shape[:-2]
    flat = vec.reshape(-1, T, n).transpose(0, 1)  # (T, chains, n)
    return (flat @ mat).transpose(0, 1).reshape(*lead, T, m)


def add_to_diagonal(mat: Tensor, value: float) -> Tensor:
    """Add ``value`` to the diagonal of (a batch of) square matrices, in place; returns ``mat``.

    Example::

        >>> import torch
        >>> from gpytorch_augment.core.linalg import add_to_diagonal
        >>> add_to_diagonal(torch.zeros(2, 2), 1.5).diagonal().tolist()
        [1.5, 1.5]
    """
    mat.diagonal(dim1=-1, dim2=-2).add_(value)
    return mat
