r"""The noise level of a heteroscedastic likelihood under the variational posterior of its noise latent."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

__all__ = ["NoiseVariance"]


class NoiseVariance(NamedTuple):
    r"""The noise variance :math:`v(g) = \mathrm{Var}(y\mid f, g)` under :math:`q(g)`, per input.

    :ivar mean: :math:`E_{q(g)} v(g)` (closed form).
    :ivar median: :math:`v(m_g)`.
    :ivar lower, upper: the central ``level`` band of :math:`v(g)` (exact: :math:`v` is monotone in :math:`g`).
    """

    mean: Tensor
    median: Tensor
    lower: Tensor
    upper: Tensor
