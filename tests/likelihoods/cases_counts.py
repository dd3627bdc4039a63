r"""Registry cases of the count likelihoods (binomial, Poisson, negative binomial) for the shared protocol suite.

* Binomial: per-datum ``trials`` in 0..12 (zeros included) travel as keyword data (``make_kwargs``); the
  canonical target is ``(*batch, 2, N)`` (successes, trials). One Pólya-Gamma variable: the deterministic
  marginalisation (identity (c)) is the registry's :func:`~gpytorch_augment.testing.marginalise_single_pg`.
* Poisson (:math:`\xi = 3.7`): :math:`\Omega = (n, \omega)`; identity (c) sums over :math:`n \le \xi + 12\sqrt\xi + 40`
  (a bound on the rule :math:`\mu + 12\sqrt\mu + 40` for the effective rate :math:`\mu = \xi\sigma(-f) \le \xi`) and
  integrates :math:`\omega` by the Laplace transform :math:`\cosh^{-b}(f/2)` of :math:`\mathrm{PG}(y + n, 0)`.
* Negative binomial with non-integer :math:`r = 2.6`: one Pólya-Gamma variable with a :math:`y`-dependent prior.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.distributions import NegativeBinomial, Poisson

from gpytorch_augment._random import seeded_by
from gpytorch_augment.distributions import PolyaGamma
from gpytorch_augment.distributions.auxiliary import AuxiliaryDistribution
from gpytorch_augment.likelihoods import AugmentedLikelihood
from gpytorch_augment.likelihoods.binomial import BinomialLogitLikelihood
from gpytorch_augment.likelihoods.negative_binomial import NegativeBinomialLogitLikelihood
from gpytorch_augment.likelihoods.poisson import PoissonLogitLikelihood
from gpytorch_augment.testing.case import LikelihoodCase, cyclic_targets, log_pg_laplace, marginalise_single_pg

AuxDict = dict[str, Tensor]

MAX_TRIALS = 12
RATE_SCALE = 3.7
TOTAL_COUNT = 2.6


# ---------------------------------------------------------------------------------------------- binomial
def _binomial_kwargs(shape: torch.Size, generator: torch.Generator) -> dict[str, Tensor]:
    trials = torch.randint(0, MAX_TRIALS + 1, shape, generator=generator).to(torch.get_default_dtype())
    trials[..., :2] = torch.tensor([0.0, 1.0])  # always a datum without information and a Bernoulli one
    return {"trials": trials}


def _binomial_targets(f: Tensor, generator: torch.Generator, trials: Tensor) -> Tensor:
    return torch.binomial(trials.to(f.dtype), torch.sigmoid(f), generator=generator)


def _binomial_q_aux(likelihood: BinomialLogitLikelihood, y: Tensor, q_aux: AuxDict) -> AuxiliaryDistribution:
    _, trials = likelihood.split_targets(y)
    return AuxiliaryDistribution(omega=PolyaGamma(trials, q_aux["c"]))


BINOMIAL = LikelihoodCase(
    name="binomial_logit",
    make=lambda: BinomialLogitLikelihood().double(),
    sample_targets=_binomial_targets,
    make_kwargs=_binomial_kwargs,
    marginalise=marginalise_single_pg,
    q_aux_distribution=_binomial_q_aux,
    example_targets=cyclic_targets(3, trials=3.0),
)


# ---------------------------------------------------------------------------------------------- Poisson
def _poisson_targets(f: Tensor, generator: torch.Generator, **kwargs: Tensor) -> Tensor:
    return torch.poisson(RATE_SCALE * torch.sigmoid(f), generator=generator)


def marginalise_poisson(likelihood: AugmentedLikelihood, y: Tensor, f: Tensor) -> Tensor:
    r""":math:`\log\sum_{n}\mathrm{Po}(n\mid\xi)\int\text{tilt}(n,\omega)\,\mathrm{PG}(\omega\mid y+n,0)\,d\omega`,
    the sum truncated at :math:`n_{\max} = \lceil\xi + 12\sqrt\xi + 40\rceil`, the integral by the Laplace transform."""
    prior = likelihood.aux_prior(y)
    xi = float(likelihood.rate_scale.max())
    n_max = math.ceil(xi + 12 * math.sqrt(xi) + 40)
    shape = torch.broadcast_shapes(y.shape, f.shape)
    n = torch.arange(n_max + 1, dtype=f.dtype).view(-1, *([1] * len(shape))).expand(n_max + 1, *shape)
    at_zero = likelihood.log_tilt(y, {"n": n, "omega": torch.zeros_like(n)}, f)
    t = at_zero - likelihood.log_tilt(y, {"n": n, "omega": torch.ones_like(n)}, f)
    omega_prior = prior.factors["omega"]({"n": n})
    assert isinstance(omega_prior, PolyaGamma) and bool((omega_prior.c == 0).all()), "expected a PG(y + n, 0) prior"
    log_terms = prior.factors["n"].log_prob(n) + at_zero + log_pg_laplace(omega_prior.b, t)
    return torch.logsumexp(log_terms, dim=0)


def _poisson_q_aux(likelihood: PoissonLogitLikelihood, y: Tensor, q_aux: AuxDict) -> AuxiliaryDistribution:
    c = q_aux["c"]
    return AuxiliaryDistribution(
        n=Poisson(likelihood.rate_scale * q_aux["sigma_tilde"]),
        omega=lambda aux: PolyaGamma(y + aux["n"], c),
    )


POISSON = LikelihoodCase(
    name="poisson_logit",
    make=lambda: PoissonLogitLikelihood(rate_scale=RATE_SCALE).double(),
    sample_targets=_poisson_targets,
    marginalise=marginalise_poisson,
    q_aux_distribution=_poisson_q_aux,
    cavi_sweeps=80,  # ξ and the level of f trade off: the ELBO rises monotonically but settles slowly
    example_targets=cyclic_targets(4),
    constants=("rate_scale",),
    constant_priors={"rate_scale_prior": {}},
)


# ---------------------------------------------------------------------------------------------- negative binomial
def _negative_binomial_targets(f: Tensor, generator: torch.Generator, **kwargs: Tensor) -> Tensor:
    with seeded_by(generator):
        return NegativeBinomial(total_count=torch.tensor(TOTAL_COUNT, dtype=f.dtype), logits=f).sample()


def _negative_binomial_q_aux(
    likelihood: NegativeBinomialLogitLikelihood, y: Tensor, q_aux: AuxDict
) -> AuxiliaryDistribution:
    return AuxiliaryDistribution(omega=PolyaGamma(y + likelihood.total_count, q_aux["c"]))


NEGATIVE_BINOMIAL = LikelihoodCase(
    name="negative_binomial_logit",
    make=lambda: NegativeBinomialLogitLikelihood(total_count=TOTAL_COUNT).double(),
    sample_targets=_negative_binomial_targets,
    marginalise=marginalise_single_pg,
    q_aux_distribution=_negative_binomial_q_aux,
    # the predictive mean r E e^f is lognormal in f: at GPyTorch's input variances (~6) the Monte-Carlo reference of
    # its marginal test has a relative standard error near 1; at a tenth of them it is below 1%
    extras={"gpytorch_covariance_scale": 0.1},
    example_targets=cyclic_targets(4),
    constructor_kwargs={"total_count": 2.0},
    constants=("total_count",),
)

#: this module's cases (the registry collects the ``CASES`` of every ``cases_*.py`` module)
CASES: list[LikelihoodCase] = [BINOMIAL, POISSON, NEGATIVE_BINOMIAL]
