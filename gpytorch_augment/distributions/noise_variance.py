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

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions import NoiseVariance
        >>> v = NoiseVariance(mean=torch.tensor([1.3]), median=torch.tensor([1.0]), lower=torch.tensor([0.4]),
        ...                   upper=torch.tensor([2.5]))
        >>> bool((v.lower <= v.median).all() and (v.median <= v.upper).all())
        True
    """

    mean: Tensor
    median: Tensor
    lower: Tensor
    upper: Tensor
