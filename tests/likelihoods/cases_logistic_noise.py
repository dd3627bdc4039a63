r"""Registry case of regression with logistic noise (:class:`~gpytorch_augment.LogisticNoiseLikelihood`).

One Pólya-Gamma variable with a :math:`\mathrm{PG}(2, 0)` prior and a precision linear in it, so identity (c) is the
closed-form Pólya-Gamma Laplace transform (:func:`~gpytorch_augment.testing.marginalise_single_pg`), compared with
the logistic density written directly (not through the transform). Targets are drawn by inverting the logistic CDF.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gpytorch_augment.distributions import PolyaGamma
from gpytorch_augment.distributions.auxiliary import AuxiliaryDistribution
from gpytorch_augment.likelihoods import AugmentedLikelihood, LogisticNoiseLikelihood
from gpytorch_augment.testing.case import AuxDict, LikelihoodCase, marginalise_single_pg, real_targets

SCALE = 0.6


def _logistic_targets(f: Tensor, generator: torch.Generator, **kwargs: Tensor) -> Tensor:
    u = torch.rand(f.shape, generator=generator, dtype=f.dtype)
    return f + SCALE * torch.logit(u)


def _q_aux_distribution(likelihood: AugmentedLikelihood, y: Tensor, q_aux: AuxDict) -> AuxiliaryDistribution:
    r""":math:`q^*(\omega) = \mathrm{PG}(2, \sqrt{2\tilde r})` from the stored :math:`\tilde r`."""
    c = (2 * q_aux["r"]).sqrt()
    return AuxiliaryDistribution(omega=PolyaGamma(torch.full_like(c, 2.0), c))


LOGISTIC_NOISE = LikelihoodCase(
    name="logistic_noise",
    make=lambda: LogisticNoiseLikelihood(scale=SCALE).double(),
    sample_targets=_logistic_targets,
    marginalise=marginalise_single_pg,
    q_aux_distribution=_q_aux_distribution,
    example_targets=real_targets,
    constants=("scale",),
)

#: this module's cases (the registry collects the ``CASES`` of every ``cases_*.py`` module)
CASES: list[LikelihoodCase] = [LOGISTIC_NOISE]
