"""gpytorch-augment: augmented (conditionally conjugate) likelihoods for GPyTorch, with closed-form CAVI
updates and blocked Gibbs sampling."""

from . import core, distributions, likelihoods
from .distributions import PolyaGamma
from .inference import (
    CAVI,
    CAVITrace,
    ChainState,
    Convergence,
    GibbsSampler,
    HeldOut,
    HMCSampler,
    PosteriorSamples,
    RelativeChange,
    posterior_sampler,
)
from .likelihoods import *  # noqa: F403  (the likelihoods' one export list, re-exported below)
from .mlls import AugmentedELBO, CollapsedAugmentedELBO
from .models import GPPrior
from .variational import CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy
from .variational.inducing_points import greedy_variance, kmeans_plus_plus

__version__ = "0.3.0"  # the one place the version is set (setup.cfg and docs/conf.py read it)

__all__ = [
    "AugmentedELBO",
    "CAVI",
    "CAVITrace",
    "CollapsedAugmentedELBO",
    "CAVIVariationalStrategy",
    "Convergence",
    "ChainState",
    "GibbsSampler",
    "GPPrior",
    "HMCSampler",
    "HeldOut",
    "PolyaGamma",
    "PosteriorSamples",
    "RelativeChange",
    "UnwhitenedCAVIVariationalStrategy",
    "core",
    "distributions",
    "greedy_variance",
    "kmeans_plus_plus",
    "likelihoods",
    "posterior_sampler",
]
__all__ += likelihoods.__all__
