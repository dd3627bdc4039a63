"""Small dense linear-algebra helpers shared by the Gaussian core and the engines (batched, any device)."""

from __future__ import annotations

from torch import Tensor
from torch.linalg import solve_triangular

__all__ = ["add_to_diagonal", "mv", "tri_solve", "vecmat"]


def tri_solve(L: Tensor, rhs: Tensor, upper: bool = False, left: bool = True) -> Tensor:
    """:math:`L^{-1}\\,\\mathrm{rhs}` (or :math:`\\mathrm{rhs}\\,L^{-1}` with ``left=False``) for triangular ``L``."""
    return solve_triangular(L, rhs, upper=upper, left=left)


def mv(mat: Tensor, vec: Tensor) -> Tensor:
    """Batched matrix-vector product ``mat @ vec``: ``(..., m, n) x (..., n) -> (..., m)``."""
    return (mat @ vec.unsqueeze(-1)).squeeze(-1)


def vecmat(vec: Tensor, mat: Tensor) -> Tensor:
    r"""``vec @ mat`` per latent for a chain-free stack of matrices: ``vec`` ``(..., T, n)``, ``mat`` ``(T, n, m)``
    -> ``(..., T, m)``.

    One matrix-matrix product per latent serves every leading (chain) index at once, which is much faster than a
    batched matrix-vector product per chain (fastest with ``mat`` contiguous); :math:`Mv` is ``vecmat(v, M.mT)``.
    """
    T, n, m = mat.shape
    if T == 1:
        return (vec.reshape(-1, n) @ mat[0]).reshape(*vec.shape[:-1], m)
    lead = vec.shape[:-2]
    flat = vec.reshape(-1, T, n).transpose(0, 1)  # (T, chains, n)
    return (flat @ mat).transpose(0, 1).reshape(*lead, T, m)


def add_to_diagonal(mat: Tensor, value: float) -> Tensor:
    """Add ``value`` to the diagonal of (a batch of) square matrices, in place; returns ``mat``."""
    mat.diagonal(dim1=-1, dim2=-2).add_(value)
    return mat
