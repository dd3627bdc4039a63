r"""Linear observations: data that read a sparse linear combination of latent values.

A pointwise likelihood's datum :math:`i` reads :math:`f_i`. A *linear observation* :math:`j` reads
:math:`g_j = \sum_r w_{jr} f_{i_{jr}}` (a pairwise comparison reads :math:`f_a - f_b`; an aggregate a weighted sum),
i.e. :math:`g = Df` for a sparse design matrix :math:`D` with at most :math:`R` entries per row. Given the
auxiliary variables, each observation tilts :math:`g_j` by :math:`\exp(h_j g_j - \tfrac12\lambda_j g_j^2)`; in the
whitened coordinates of :mod:`~gpytorch_augment.core.prior` (:math:`f_X = \mu_X + A^\top v` for the inducing-point
part) the observation functionals are themselves a Gaussian process indexed by the observations, with

.. math::
    A_g = A D^\top,\qquad \mu_g = D\mu_X,\qquad k_{g,jj} = (DK_{XX}D^\top)_{jj},\qquad
    \lVert a_{g,j}\rVert^2 = \lVert A d_j\rVert^2 .

So every engine step that works on :class:`~gpytorch_augment.core.PriorTerms` -- the marginals of :math:`q(g)`
(which include the covariances :math:`\mathrm{Cov}(f_a, f_b)` between the points an observation reads, through
:math:`k_{g,jj}` and :math:`a_{g,j}`), the sufficient statistics :math:`\sum_j a_{g,j}\lambda_j a_{g,j}^\top`,
:math:`\sum_j a_{g,j}(h_j - \lambda_j\mu_{g,j})`, their all-reduce and the optimal :math:`q(v)` -- runs unchanged on
the terms :meth:`LinearObservations.observed` returns. Pointwise likelihoods never build one.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .prior import PriorTerms

__all__ = ["LinearObservations", "comparison_indices"]


def comparison_indices(pairs: Tensor) -> Tensor:
    r"""The compared pairs ``pairs`` ``(n, 2)`` as long indices, without rounding.

    Rules: an integer tensor is taken as is; a floating tensor must hold finite whole numbers that its dtype
    represents exactly (:math:`|v| \le 2^{p}` for a :math:`p`-bit significand, so no index is a rounded neighbour);
    bool and complex tensors are refused; a sequence is converted by ``torch.as_tensor`` first.

    :raises ValueError: naming ``comparisons`` for a wrong shape or dtype, or non-integer indices.
    """
    if not isinstance(pairs, Tensor):
        pairs = torch.as_tensor(pairs)
    if pairs.dim() != 2 or pairs.shape[-1] != 2:
        raise ValueError(f"comparisons must have shape (n, 2); got shape {tuple(pairs.shape)}")
    if pairs.dtype == torch.bool or pairs.is_complex():
        raise ValueError(f"comparisons must hold integer indices of the inputs x; got dtype {pairs.dtype}")
    if pairs.is_floating_point():
        exact = 2.0 / torch.finfo(pairs.dtype).eps  # 2**p: above it a float is not every integer
        finite = bool(torch.isfinite(pairs).all())
        if not finite or bool((pairs != pairs.round()).any()) or bool((pairs.abs() > exact).any()):
            raise ValueError(
                "comparisons must hold integer indices of the inputs x (pass a long tensor); got values that are "
                f"not whole numbers exactly representable in {pairs.dtype}"
            )
    return pairs.long()


class LinearObservations(NamedTuple):
    r"""The design :math:`g = Df` of ``n`` linear observations of ``num_points`` latent values: observation
    :math:`j` reads :math:`\sum_r` ``weight[j, r]`` :math:`\cdot f` [``index[j, r]``].

    Example (two comparisons of three items)::

        >>> import torch
        >>> from gpytorch_augment.core import LinearObservations
        >>> design = LinearObservations.comparisons(torch.tensor([[0, 1], [2, 1]]), num_points=3)
        >>> design.apply(torch.tensor([1.0, 0.5, -1.0]))               # f_0 - f_1, f_2 - f_1
        tensor([ 0.5000, -1.5000])
        >>> design.quadratic_diagonal(torch.eye(3))                   # Var(f_a - f_b) for independent unit f
        tensor([2., 2.])
    """

    index: Tensor  #: ``(n, R)`` latent points each observation reads (long)
    weight: Tensor  #: ``(n, R)`` their coefficients
    num_points: int  #: the number of latent points :math:`N`

    @classmethod
    def comparisons(cls, pairs: Tensor, num_points: int, dtype: torch.dtype | None = None) -> LinearObservations:
        r"""The design of comparisons :math:`g_j = f_{a_j} - f_{b_j}` for ``pairs`` ``(n, 2)`` = :math:`(a_j, b_j)`.

        :raises ValueError: naming ``comparisons`` unless they are integer indices in ``0..num_points-1`` of shape
            ``(n, 2)`` comparing two different points.
        """
        index = comparison_indices(pairs)
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= num_points):
            raise ValueError(
                f"comparisons must index the {num_points} inputs x (0..{num_points - 1}); found indices in "
                f"{int(index.min())}..{int(index.max())}"
            )
        if bool((index[:, 0] == index[:, 1]).any()):
            raise ValueError("comparisons must compare two different inputs; found a pair (i, i)")
        dtype = dtype or torch.get_default_dtype()
        weight = torch.tensor([1.0, -1.0], dtype=dtype, device=index.device).expand(index.shape[0], 2)
        return cls(index, weight, int(num_points))

    @property
    def num_observations(self) -> int:
        return int(self.index.shape[0])

    def take(self, idx: Tensor | slice) -> LinearObservations:
        """The design of the observations ``idx``."""
        return LinearObservations(self.index[idx], self.weight[idx], self.num_points)

    def apply(self, f: Tensor) -> Tensor:
        r""":math:`g = Df`: ``(..., N)`` -> ``(..., n)``."""
        return (f[..., self.index] * self.weight.to(f)).sum(-1)

    def transpose_apply(self, g: Tensor) -> Tensor:
        r""":math:`D^\top g`: ``(..., n)`` -> ``(..., N)`` (e.g. the gradient of a function of :math:`g`)."""
        contributions = (g.unsqueeze(-1) * self.weight.to(g)).reshape(*g.shape[:-1], -1)
        out = g.new_zeros(*g.shape[:-1], self.num_points)
        return out.index_add_(-1, self.index.reshape(-1), contributions)

    def quadratic_diagonal(self, K: Tensor) -> Tensor:
        r""":math:`\operatorname{diag}(DKD^\top)`: ``(..., N, N)`` -> ``(..., n)``, reading only the entries
        :math:`K_{i_r i_s}` of the points each observation reads."""
        w = self.weight.to(K)
        rows = K[..., self.index, :]  # (..., n, R, N)
        pairs = rows.gather(-1, self.index.unsqueeze(-2).expand(*rows.shape[:-1], self.index.shape[-1]))  # K_{i_r i_s}
        return torch.einsum("...jrs,jr,js->...j", pairs, w, w)

    def observed(self, terms: PriorTerms, K_XX: Tensor, data_jitter: float = 0.0) -> PriorTerms:
        r"""The prior terms of the observation functionals :math:`g = Df` (module docstring) from those of the
        latent points (``terms``) and their prior covariance ``K_XX`` ``(*b, N, N)``; ``data_jitter`` is the
        :math:`\epsilon` the terms added to :math:`\operatorname{diag} K_{XX}` (it enters as
        :math:`\epsilon\sum_r w_{jr}^2`)."""
        A = self.apply(terms.A)
        k = self.quadratic_diagonal(K_XX.to(terms.A.dtype))
        if data_jitter:
            k = k + data_jitter * self.weight.to(k).square().sum(-1)
        return PriorTerms(
            L=terms.L, A=A, mu_Z=terms.mu_Z, mu_X=self.apply(terms.mu_X), k_diag=k, a_sq=A.square().sum(-2)
        )
