r"""Registry cases of the named instances of the generic augmentation (docs/maths/generic.md): Matérn-3/2
regression and the Bayesian SVM.

Both have one continuous auxiliary :math:`\omega > 0` with an inverse-Gamma prior, so identity (c) is the adaptive
quadrature of the robust cases (:func:`~tests.likelihoods.cases_robust.marginalise_omega`). The SVM's right-hand
side of identity (f) is the closed form of :math:`E\max(X, 0)` for a normal :math:`X`, written here with SciPy.
"""

from __future__ import annotations

import torch
from scipy import stats
from torch import Tensor

from gpytorch_augment.distributions import MaternThreeHalves
from gpytorch_augment.distributions.auxiliary import AuxiliaryDistribution
from gpytorch_augment.likelihoods import AugmentedLikelihood, BayesianSVMLikelihood, MaternThreeHalvesLikelihood
from gpytorch_augment.likelihoods.bayesian_svm import svm_logits
from gpytorch_augment.testing.case import AuxDict, LikelihoodCase, cyclic_targets, real_targets
from tests.likelihoods.cases_robust import marginalise_omega

MATERN_SCALE = 0.6


def _matern_targets(f: Tensor, generator: torch.Generator, **kwargs: Tensor) -> Tensor:
    return MaternThreeHalves(f, torch.tensor(MATERN_SCALE, dtype=f.dtype)).sample(generator=generator)


def _svm_targets(f: Tensor, generator: torch.Generator, **kwargs: Tensor) -> Tensor:
    return torch.bernoulli(torch.sigmoid(svm_logits(f)), generator=generator)


def _q_aux_distribution(likelihood: AugmentedLikelihood, y: Tensor, q_aux: AuxDict) -> AuxiliaryDistribution:
    return likelihood.aux_posterior_distribution(y, q_aux)


def svm_expected_log_lik(likelihood: AugmentedLikelihood, y: Tensor, m: Tensor, s: Tensor) -> Tensor:
    r""":math:`E\log L = -2E\max(X, 0)`, :math:`X = 1 - s_y f\sim\mathcal N(d, s)`, :math:`d = 1 - s_y m`:
    :math:`E\max(X, 0) = d\,\Phi(d/\sigma) + \sigma\,\phi(d/\sigma)` (SciPy, float64)."""
    sign = torch.where(y > 0, 1.0, -1.0).to(torch.float64)
    d = (1 - sign * m.detach().to(torch.float64)).numpy()
    sigma = s.detach().to(torch.float64).sqrt().numpy()
    value = d * stats.norm.cdf(d / sigma) + sigma * stats.norm.pdf(d / sigma)
    return torch.as_tensor(-2 * value, dtype=m.dtype)


MATERN = LikelihoodCase(
    name="matern32",
    make=lambda: MaternThreeHalvesLikelihood(scale=MATERN_SCALE).double(),
    sample_targets=_matern_targets,
    marginalise=marginalise_omega,
    q_aux_distribution=_q_aux_distribution,
    marginalise_atol=1e-7,
    example_targets=real_targets,
    constants=("scale",),
)

BAYESIAN_SVM = LikelihoodCase(
    name="bayesian_svm",
    make=lambda: BayesianSVMLikelihood().double(),
    sample_targets=_svm_targets,
    marginalise=marginalise_omega,
    q_aux_distribution=_q_aux_distribution,
    expected_log_lik=svm_expected_log_lik,
    marginalise_atol=1e-7,
    example_targets=cyclic_targets(2),
    skip={
        "g": "the hinge loss is a pseudo-likelihood: the Gibbs sampler targets p(f) L(y|f), but Geweke's "
        "marginal-conditional draws take y from the normalised link, a different joint; "
        "tests/likelihoods/test_generic_likelihoods.py checks the Gibbs posterior against brute force instead",
    },
    extras={
        "gpytorch_skip": {
            "_test_log_prob": "expected_log_prob is that of the pseudo-likelihood L(y|f) (the training objective), "
            "GPyTorch's reference that of the normalised predictive link likelihood(f)",
        },
    },
)

#: this module's cases (the registry collects the ``CASES`` of every ``cases_*.py`` module)
CASES: list[LikelihoodCase] = [MATERN, BAYESIAN_SVM]
