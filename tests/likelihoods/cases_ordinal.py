r"""Registry case of the cumulative-logit ordinal likelihood (docs/maths/ordinal.md) for the shared protocol suite.

:math:`K = 4` classes with unequal, non-default cut-points :math:`b = (-1.2, 0.1, 0.9)`. Two Pólya-Gamma variables
per datum, one per logistic factor; the lowest and highest classes have a single factor (the other variable is the
point mass :math:`\mathrm{PG}(0, \cdot) = \delta_0`).

* targets are drawn from class probabilities written out independently: :math:`\sigma(b_{k+1} - f) - \sigma(b_k -
  f)` with :math:`b_0 = -\infty`, :math:`b_K = +\infty`;
* identity (c): the log-tilt is linear in each variable, so the two are integrated by the Laplace transform
  :math:`-n\log\cosh\sqrt{t/2}` of :math:`\mathrm{PG}(n, 0)`, :math:`t` the drop of the log-tilt from
  :math:`\omega = 0` to :math:`\omega = 1`;
* identity (d): :math:`q^*(\omega_u, \omega_l) = \mathrm{PG}(n_u, c_u)\,\mathrm{PG}(n_l, c_l)`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gpytorch_augment.distributions import PolyaGamma
from gpytorch_augment.distributions.auxiliary import AuxiliaryDistribution
from gpytorch_augment.likelihoods import AugmentedLikelihood, OrdinalLogitLikelihood
from gpytorch_augment.testing.case import LikelihoodCase, cyclic_targets, log_pg_laplace

AuxDict = dict[str, Tensor]

CUTPOINTS = (-1.2, 0.1, 0.9)


def _ordinal_targets(f: Tensor, generator: torch.Generator, **kwargs: Tensor) -> Tensor:
    b = torch.tensor((-math.inf, *CUTPOINTS, math.inf), dtype=f.dtype)
    cdf = torch.sigmoid(b - f.unsqueeze(-1))  # P(y < k) at the K + 1 cuts
    probs = cdf[..., 1:] - cdf[..., :-1]
    return torch.multinomial(probs.reshape(-1, len(CUTPOINTS) + 1), 1, generator=generator).reshape(f.shape).to(f)


def marginalise_ordinal(likelihood: AugmentedLikelihood, y: Tensor, f: Tensor) -> Tensor:
    r""":math:`\log\iint\text{tilt}\,\mathrm{PG}(\omega_u\mid n_u, 0)\,\mathrm{PG}(\omega_l\mid n_l, 0)`, each
    variable by its Laplace transform (the log-tilt is linear in each)."""
    prior = likelihood.aux_prior(y).factors
    zero = torch.zeros_like(f)
    at_zero = likelihood.log_tilt(y, {"omega_upper": zero, "omega_lower": zero}, f)
    out = at_zero
    for name, unit in (("omega_upper", {"omega_upper": zero + 1, "omega_lower": zero}),
                       ("omega_lower", {"omega_upper": zero, "omega_lower": zero + 1})):  # fmt: skip
        pg = prior[name]
        assert isinstance(pg, PolyaGamma) and bool((pg.c == 0).all()), "expected a PG(n, 0) prior"
        out = out + log_pg_laplace(pg.b, at_zero - likelihood.log_tilt(y, unit, f))
    return out


def _ordinal_q_aux(likelihood: OrdinalLogitLikelihood, y: Tensor, q_aux: AuxDict) -> AuxiliaryDistribution:
    n_u = (y < likelihood.num_classes - 1).to(q_aux["c_upper"])
    n_l = (y > 0).to(q_aux["c_lower"])
    return AuxiliaryDistribution(
        omega_upper=PolyaGamma(n_u.expand_as(q_aux["c_upper"]), q_aux["c_upper"]),
        omega_lower=PolyaGamma(n_l.expand_as(q_aux["c_lower"]), q_aux["c_lower"]),
    )


ORDINAL = LikelihoodCase(
    name="ordinal_logit",
    make=lambda: OrdinalLogitLikelihood(num_classes=len(CUTPOINTS) + 1, cutpoints=CUTPOINTS).double(),
    sample_targets=_ordinal_targets,
    marginalise=marginalise_ordinal,
    q_aux_distribution=_ordinal_q_aux,
    example_targets=cyclic_targets(len(CUTPOINTS) + 1),
    constructor_kwargs={"num_classes": len(CUTPOINTS) + 1},
)

#: this module's cases (the registry collects the ``CASES`` of every ``cases_*.py`` module)
CASES: list[LikelihoodCase] = [ORDINAL]
