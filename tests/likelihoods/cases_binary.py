"""Registry case for the Bernoulli likelihood with the logistic link (docs/maths/binary.md)."""

from __future__ import annotations

import torch
from torch import Tensor

from gpytorch_augment import BernoulliLogitLikelihood
from gpytorch_augment.distributions import PolyaGamma
from gpytorch_augment.distributions.auxiliary import AuxiliaryDistribution
from gpytorch_augment.likelihoods import AugmentedLikelihood
from gpytorch_augment.testing.case import AuxDict, LikelihoodCase, cyclic_targets, marginalise_single_pg


def _bernoulli_targets(f: Tensor, generator: torch.Generator, **kwargs: Tensor) -> Tensor:
    return torch.bernoulli(torch.sigmoid(f), generator=generator)


def _bernoulli_q_aux(likelihood: AugmentedLikelihood, y: Tensor, q_aux: AuxDict) -> AuxiliaryDistribution:
    c = q_aux["c"]
    return AuxiliaryDistribution(omega=PolyaGamma(torch.ones_like(c), c))


BERNOULLI = LikelihoodCase(
    name="bernoulli_logit",
    make=lambda: BernoulliLogitLikelihood().double(),
    sample_targets=_bernoulli_targets,
    marginalise=marginalise_single_pg,
    q_aux_distribution=_bernoulli_q_aux,
    example_targets=cyclic_targets(2),
)

#: this module's cases (the registry collects the ``CASES`` of every ``cases_*.py`` module)
CASES: list[LikelihoodCase] = [BERNOULLI]
