r"""The exact CDF of the Pólya-Gamma law :math:`\mathrm{PG}(b, c)`, for tests of its samplers and inversions.

.. math::
    F(x) = \cosh^b(c/2)\,\frac{2^b}{\Gamma(b)}\sum_{n\ge0}(-1)^n\frac{\Gamma(n+b)}{n!}
    \Big[e^{-\alpha_n c}\,\Phi\Big(\frac{cx-\alpha_n}{\sqrt x}\Big)
    + e^{\alpha_n c}\,\Phi\Big(-\frac{cx+\alpha_n}{\sqrt x}\Big)\Big],
    \qquad \alpha_n = \frac{2n+b}{2},

each term in log space (``log_ndtr``), so the left tail (:math:`F \approx e^{-b^2/(8x)}`) is exact down to the
smallest positive float64.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def polya_gamma_cdf(x: Tensor, b: float, c: float = 0.0, terms: int = 200) -> Tensor:
    """:math:`F(x)` of :math:`\\mathrm{PG}(b, c)` at float64 ``x > 0`` (the series' first ``terms`` terms: enough
    for :math:`x \\lesssim 50`)."""
    x = x.to(torch.float64).unsqueeze(-1)
    n = torch.arange(terms, dtype=torch.float64)
    alpha = (2 * n + b) / 2
    log_weight = (
        b * (math.log(math.cosh(c / 2)) + math.log(2.0)) - math.lgamma(b)
        + torch.lgamma(n + b) - torch.lgamma(n + 1)
    )  # fmt: skip
    root = x.sqrt()
    first = log_weight - alpha * c + torch.special.log_ndtr((c * x - alpha) / root)
    second = log_weight + alpha * c + torch.special.log_ndtr(-(c * x + alpha) / root)
    sign = 1.0 - 2.0 * (n % 2)
    return (sign * (first.exp() + second.exp())).sum(-1).clamp(0.0, 1.0)
