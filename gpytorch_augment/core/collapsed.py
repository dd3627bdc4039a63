r"""The collapsed marginal of Gaussian tilts in the prior's own covariance, with its adjoints in :math:`K` and
:math:`\mu`: the gradient of a hyper-parameter move without differentiating a factorisation.

For :math:`f \sim \mathcal N(\mu, K)` and tilts :math:`e^{h_i f_i - \frac12\lambda_i f_i^2}`, :math:`\lambda \ge 0`,
write :math:`r = h - \lambda\odot\mu`, :math:`S = \mathrm{diag}(\sqrt\lambda)` and
:math:`B = I + SKS = L_B L_B^\top` (eigenvalues :math:`\ge 1`: it factorises wherever :math:`K \succeq 0`). Then

.. math::
    \log Z = \log\int \mathcal N(f \mid \mu, K) \prod_i e^{h_i f_i - \frac12\lambda_i f_i^2}\, df
    = \textstyle\sum_i \big(h_i\mu_i - \tfrac12\lambda_i\mu_i^2\big)
      + \tfrac12 r^\top K r - \tfrac12\lVert L_B^{-1} S K r\rVert^2 - \sum_j \log (L_B)_{jj}

(with :math:`f = \mu + g`: :math:`\mathbb E\, e^{r^\top g - \frac12 g^\top\Lambda g} = \lvert B\rvert^{-1/2}
e^{\frac12 r^\top (K^{-1} + \Lambda)^{-1} r}` and :math:`(K^{-1} + \Lambda)^{-1} = K - KSB^{-1}SK`), the same value
as :func:`~gpytorch_augment.core.collapsed_log_marginal` computes from a factor of :math:`K`. Its derivatives are

.. math::
    \frac{\partial \log Z}{\partial \mu} = a, \qquad
    \frac{\partial \log Z}{\partial K} = \tfrac12\big(a a^\top - S B^{-1} S\big), \qquad
    a = r - S B^{-1} S K r = h - \Lambda m,

:math:`m = \mu + Ka` the posterior mean (:math:`K^{-1}(m - \mu) = h - \Lambda m` at the optimum, and
:math:`S B^{-1} S = (K + \Lambda^{-1})^{-1}` by Woodbury, written without :math:`\Lambda^{-1}`): the Gaussian
process marginal likelihood's gradient (Rasmussen & Williams 2006, eq. 5.9) for the pseudo-observations
:math:`h/\lambda` with noise :math:`1/\lambda`. A hyper-parameter's gradient is then one vector-Jacobian product of
the prior's mean and covariance with :math:`(a, \partial\log Z/\partial K)` (autograd through the kernel only).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .linalg import add_to_diagonal, tri_solve

__all__ = ["CollapsedAdjoints", "collapsed_marginal_adjoints"]


class CollapsedAdjoints(NamedTuple):
    """:math:`\\log Z` ``(*b)``, its adjoints ``d_covariance`` ``(*b, N, N)`` and ``d_mean`` ``(*b, N)``, and ``ok``
    ``(*b)``: whether :math:`B` factorised (elsewhere the values are not meaningful)."""

    log_z: Tensor
    d_covariance: Tensor
    d_mean: Tensor
    ok: Tensor


def collapsed_marginal_adjoints(K: Tensor, mu: Tensor, h: Tensor, lam: Tensor) -> CollapsedAdjoints:
    r""":math:`\log Z` and its adjoints in ``K`` ``(*b, N, N)`` and ``mu`` ``(*b, N)`` for potentials ``h`` and
    precisions ``lam`` ``(*b, N)`` (module docstring). One factorisation of :math:`B`, one inverse.

    Example::

        >>> import torch
        >>> from gpytorch_augment.core import collapsed_log_marginal
        >>> from gpytorch_augment.core.collapsed import collapsed_marginal_adjoints
        >>> g = torch.Generator().manual_seed(0)
        >>> X = torch.randn(5, 5, generator=g, dtype=torch.float64)
        >>> K, mu = X @ X.T + torch.eye(5, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)
        >>> h, lam = torch.randn(5, generator=g, dtype=torch.float64), torch.rand(5, generator=g, dtype=torch.float64)
        >>> out = collapsed_marginal_adjoints(K, mu, h, lam)
        >>> reference, _ = collapsed_log_marginal(torch.linalg.cholesky(K).mT, mu, h, lam)
        >>> bool(torch.isclose(out.log_z, reference))
        True
    """
    dtype = K.dtype
    mu, h, lam = mu.to(dtype), h.to(dtype), lam.to(dtype)
    s = lam.clamp_min(0.0).sqrt()
    r = h - lam * mu
    B = add_to_diagonal(s.unsqueeze(-1) * K * s.unsqueeze(-2), 1.0)
    LB, info = torch.linalg.cholesky_ex(B)
    ok = info == 0
    eye = torch.eye(K.shape[-1], dtype=dtype, device=K.device)
    LB = torch.where(ok[..., None, None], LB, eye)
    Kr = (K @ r.unsqueeze(-1)).squeeze(-1)
    t = tri_solve(LB, (s * Kr).unsqueeze(-1)).squeeze(-1)  # L_B^{-1} S K r
    log_z = (
        (h * mu - 0.5 * lam * mu.square()).sum(-1)
        + 0.5 * (r * Kr).sum(-1)
        - 0.5 * t.square().sum(-1)
        - LB.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    )
    a = r - s * tri_solve(LB.mT, t.unsqueeze(-1), upper=True).squeeze(-1)
    W = s.unsqueeze(-1) * torch.cholesky_inverse(LB) * s.unsqueeze(-2)
    d_covariance = 0.5 * (a.unsqueeze(-1) * a.unsqueeze(-2) - W)
    return CollapsedAdjoints(log_z, d_covariance, a, ok)
