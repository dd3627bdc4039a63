r"""The negative multinomial distribution (and measure) of the logistic-softmax augmentation."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributions import Distribution, constraints

from .auxiliary import NotReparameterized

__all__ = ["NegativeMultinomial"]


#: largest Poisson rate drawn (``torch.poisson`` overflows int64 near 9.2e18)
_MAX_RATE = 1e15


class NegativeMultinomial(NotReparameterized, Distribution):
    r"""Negative multinomial :math:`\mathrm{NM}(n \mid 1, p)` over counts :math:`n \in \mathbb N^J`,

    .. math::
        \mathrm{NM}(n \mid 1, p) = \Gamma\Big(1 + \sum_j n_j\Big)\, p_0 \prod_{j=1}^J \frac{p_j^{n_j}}{n_j!},
        \qquad p_0 = 1 - \sum_j p_j > 0,

    parametrised by ``log_probs`` (:math:`\log p_j`, shape ``(*batch, J)``) and ``log_p0`` (shape ``batch``, passed
    separately so that it never suffers the cancellation of :math:`1 - \sum_j p_j`). With ``log_p0=None`` it is the
    **measure** :math:`\mathrm{NM}/p_0` (``log_prob`` without the :math:`\log p_0` term), the improper prior of the
    over-parametrised logistic-softmax augmentation; such a measure cannot be sampled.

    Sampling: :math:`G \sim \mathrm{Ga}(1, \text{rate } p_0)`, then :math:`n_j \sim \mathrm{Po}(G p_j)` independently.

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions import NegativeMultinomial
        >>> log_probs = torch.tensor([0.2, 0.3], dtype=torch.float64).log()
        >>> d = NegativeMultinomial(log_probs, log_p0=torch.tensor(0.5, dtype=torch.float64).log())
        >>> d.sample((4,)).shape
        torch.Size([4, 2])
        >>> round(float(d.log_prob(torch.zeros(2, dtype=torch.float64)).exp()), 6)   # NM(0 | 1, p) = p0
        0.5
    """

    arg_constraints: dict = {}
    support = constraints.independent(constraints.nonnegative_integer, 1)
    has_rsample = False

    def __init__(self, log_probs: Tensor, log_p0: Tensor | None = None, validate_args: bool | None = None) -> None:
        self.log_probs = log_probs
        self.log_p0 = None if log_p0 is None else log_p0.expand(log_probs.shape[:-1])
        super().__init__(log_probs.shape[:-1], log_probs.shape[-1:], validate_args=False)

    @property
    def mean(self) -> Tensor:
        if self.log_p0 is None:
            raise ValueError("the negative-multinomial measure (log_p0=None) has no mean")
        return (self.log_probs - self.log_p0.unsqueeze(-1)).exp()

    def sample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:
        if self.log_p0 is None:
            raise ValueError("the negative-multinomial measure (log_p0=None) is improper and cannot be sampled")
        shape = self._extended_shape(torch.Size(sample_shape))
        with torch.no_grad():
            gamma = torch.empty(shape[:-1], dtype=self.log_probs.dtype, device=self.log_probs.device).exponential_()
            rate = gamma.unsqueeze(-1) * (self.log_probs - self.log_p0.unsqueeze(-1)).exp()
            if not bool((rate < _MAX_RATE).all()):  # torch.poisson returns garbage (int64 overflow) beyond
                raise ValueError(
                    f"NegativeMultinomial: counts overflow (a Poisson rate of {rate.max().item():.3g}; log p0 down to "
                    f"{self.log_p0.min().item():.3g}): the latent values are extreme (e.g. every latent << 0 in the "
                    "logistic-softmax likelihood); check the model's scales (outputscale, mean) or the inputs"
                )
            return torch.poisson(rate.expand(shape))

    def log_prob(self, value: Tensor) -> Tensor:
        total = value.sum(-1)
        lp = torch.lgamma(1 + total) + (value * self.log_probs - torch.lgamma(value + 1)).sum(-1)
        return lp if self.log_p0 is None else lp + self.log_p0
