r"""The Gaussian core shared by every engine.

Given potentials :math:`h` and precisions :math:`\lambda` of the data, everything CAVI, the Gibbs samplers and the
hyper-parameter objectives do to the latent GP happens here, once:

* :mod:`~gpytorch_augment.core.prior` -- prior terms :math:`\mu`, :math:`L`, :math:`A = L^{-1}K_{ZX}` and the one
  cache that notices a change of hyper-parameters (:class:`PriorCache`);
* :mod:`~gpytorch_augment.core.gaussian` -- the sufficient statistics of a batch (:class:`SufficientStatistics`: add,
  scale by :math:`N/|\mathcal B|`, reduce across processes), the optimal and damped :math:`q(v)`
  (:class:`NaturalParameters`, :class:`WhitenedGaussian`), marginals, KL and the pathwise draw;
* :mod:`~gpytorch_augment.core.design` -- linear observations :math:`g = Df` (:class:`LinearObservations`), whose
  prior terms the same steps run on;
* :mod:`~gpytorch_augment.core.linalg` -- the batched triangular and matrix-vector helpers;
* :mod:`~gpytorch_augment.core.data` -- the data every engine step takes, checked once at the entry point
  (:class:`ObservedData`, built by :func:`check_data`).
"""

from .data import ObservedData, check_data
from .design import LinearObservations
from .gaussian import (
    NaturalParameters,
    SufficientStatistics,
    WhitenedGaussian,
    collapsed_log_marginal,
    gaussian_log_density,
    natural_gradient,
    noisy_tilts,
    tilted_conditional,
)
from .prior import (
    FactorizationError,
    PriorCache,
    PriorFactorizationError,
    PriorTerms,
    linalg_advice,
    prior_cholesky,
    split_prior,
    whiten_prior,
    whiten_prior_blocks,
)

__all__ = [
    "FactorizationError",
    "LinearObservations",
    "NaturalParameters",
    "ObservedData",
    "PriorCache",
    "PriorFactorizationError",
    "PriorTerms",
    "SufficientStatistics",
    "WhitenedGaussian",
    "check_data",
    "collapsed_log_marginal",
    "gaussian_log_density",
    "linalg_advice",
    "natural_gradient",
    "noisy_tilts",
    "prior_cholesky",
    "split_prior",
    "tilted_conditional",
    "whiten_prior",
    "whiten_prior_blocks",
]
