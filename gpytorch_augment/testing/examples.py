"""A complete :class:`~gpytorch_augment.testing.case.LikelihoodCase`, for the examples of this subpackage and as a
template: the Bernoulli-logit likelihood with its Pólya-Gamma augmentation.

Example::

    >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
    >>> BERNOULLI_CASE.make().num_latents
    1
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..distributions import PolyaGamma
from ..distributions.auxiliary import AuxiliaryDistribution
from ..likelihoods import AugmentedLikelihood, BernoulliLogitLikelihood
from .case import LikelihoodCase, marginalise_single_pg

__all__ = ["BERNOULLI_CASE"]


def _bernoulli_targets(f: Tensor, generator: torch.Generator, **kwargs: Tensor) -> Tensor:
    return torch.bernoulli(torch.sigmoid(f), generator=generator)


def _pg_posterior(likelihood: AugmentedLikelihood, y: Tensor, q_aux: dict[str, Tensor]) -> AuxiliaryDistribution:
    return AuxiliaryDistribution(omega=PolyaGamma(torch.ones_like(q_aux["c"]), q_aux["c"]))


#: the Bernoulli-logit likelihood registered for the protocol suite
BERNOULLI_CASE = LikelihoodCase(
    name="bernoulli_example",
    make=lambda: BernoulliLogitLikelihood().double(),
    sample_targets=_bernoulli_targets,
    marginalise=marginalise_single_pg,
    q_aux_distribution=_pg_posterior,
)
