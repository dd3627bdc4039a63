r"""Joint distributions over a likelihood's auxiliary variables :math:`\Omega`.

Auxiliary variables are carried around as plain ``dict[str, Tensor]`` (one tensor per variable, one
entry per datum). :class:`AuxiliaryDistribution` is the joint law of such a dict, written by the chain rule
as an ordered sequence of factors, each either a ``torch.distributions.Distribution`` or a callable that
builds one from the variables before it:

.. math::
    p(\Omega) = \prod_j p(\Omega_j \mid \Omega_{<j}).

Example (the Poisson augmentation of :doc:`/maths/counts`)::

    >>> import torch
    >>> from torch.distributions import Poisson
    >>> from gpytorch_augment.distributions import AuxiliaryDistribution, PolyaGamma
    >>> y, f, rate = torch.tensor([1.0, 3.0]), torch.tensor([0.5, -1.0]), torch.tensor([2.0, 2.0])
    >>> joint = AuxiliaryDistribution(n=Poisson(rate), omega=lambda aux: PolyaGamma(y + aux["n"], f.abs()))
    >>> aux = joint.sample(generator=torch.Generator().manual_seed(0))
    >>> sorted(aux), joint.log_prob(aux).shape
    (['n', 'omega'], torch.Size([2]))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor
from torch.distributions import Distribution

from .._random import seeded_by

Factor = Distribution | Callable[[Mapping[str, Tensor]], Distribution]


class NotReparameterized:
    """Mixin of the auxiliary-variable laws whose draws are not differentiable in their parameters: ``rsample``
    raises ``NotImplementedError`` saying so and pointing to ``sample`` (torch's own message is empty)."""

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:
        raise NotImplementedError(
            f"{type(self).__name__} draws are not reparameterisable (has_rsample is False): no gradient flows "
            "through them; use sample() (its draws carry no gradient)"
        )


class AuxiliaryDistribution:
    """Joint law of a ``dict`` of auxiliary variables, factorised over data points.

    :param factors: ``name=factor`` in sampling order; a factor is a distribution or a callable
        ``aux_so_far -> distribution`` (for hierarchical augmentations).

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions import PolyaGamma
        >>> from gpytorch_augment.distributions.auxiliary import AuxiliaryDistribution
        >>> b, c = torch.ones(3, dtype=torch.float64), torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
        >>> q = AuxiliaryDistribution(omega=PolyaGamma(b, c))
        >>> draw = q.sample()
        >>> draw["omega"].shape, q.log_prob(draw).shape
        (torch.Size([3]), torch.Size([3]))
    """

    def __init__(self, **factors: Factor) -> None:
        if not factors:
            raise ValueError("AuxiliaryDistribution needs at least one factor")
        self.factors = factors

    def _factor(self, name: str, aux: Mapping[str, Tensor]) -> Distribution:
        factor = self.factors[name]
        return factor if isinstance(factor, Distribution) else factor(aux)

    def sample(self, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """One joint draw; reproducible for a seeded ``generator`` (or the global torch seed)."""
        aux: dict[str, Tensor] = {}
        with seeded_by(generator, self._device()):
            for name in self.factors:
                aux[name] = self._factor(name, aux).sample()
        return aux

    def _device(self) -> torch.device | None:
        """The device of the first factor that is a distribution with tensor parameters (for seeding), if any."""
        for factor in self.factors.values():
            if isinstance(factor, Distribution):
                for value in vars(factor).values():
                    if isinstance(value, Tensor):
                        return value.device
        return None

    def log_prob(self, aux: Mapping[str, Tensor]) -> Tensor:
        """:math:`\\log p(\\Omega)`, summed over the variables, one value per datum."""
        return sum(self._factor(name, aux).log_prob(aux[name]) for name in self.factors)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(self.factors)})"
