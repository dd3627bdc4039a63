"""gpytorch-augment: augmented (conditionally conjugate) likelihoods for GPyTorch, with closed-form CAVI
updates and blocked Gibbs sampling."""

from . import distributions, likelihoods
from .distributions import PolyaGamma
from .inference import CAVI, CAVITrace, GibbsSampler, GibbsSamples
from .likelihoods import (
    AugmentedLikelihood,
    BernoulliLogitLikelihood,
    BinomialLogitLikelihood,
    NegativeBinomialLogitLikelihood,
    PoissonLogitLikelihood,
)
from .mlls import AugmentedELBO
from .variational import CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy

__version__ = "0.1.0"

__all__ = [
    "AugmentedELBO",
    "AugmentedLikelihood",
    "BernoulliLogitLikelihood",
    "BinomialLogitLikelihood",
    "CAVI",
    "CAVITrace",
    "CAVIVariationalStrategy",
    "GibbsSampler",
    "GibbsSamples",
    "NegativeBinomialLogitLikelihood",
    "PoissonLogitLikelihood",
    "PolyaGamma",
    "UnwhitenedCAVIVariationalStrategy",
    "distributions",
    "likelihoods",
]
