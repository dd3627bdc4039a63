"""gpytorch-augment: augmented (conditionally conjugate) likelihoods for GPyTorch, with closed-form CAVI
updates and blocked Gibbs sampling."""

from . import core, distributions, likelihoods
from .distributions import PolyaGamma
from .inference import (
    CAVI,
    CAVITrace,
    Convergence,
    GibbsSampler,
    GibbsSamples,
    HeldOut,
    HMCSampler,
    RelativeChange,
    posterior_sampler,
)
from .likelihoods import (
    AugmentedLikelihood,
    BernoulliLogitLikelihood,
    BinomialLogitLikelihood,
    HeteroscedasticGaussianLikelihood,
    HeteroscedasticStudentTLikelihood,
    LaplaceLikelihood,
    LaplaceTransformLikelihood,
    LogisticSoftmaxLikelihood,
    NegativeBinomialLogitLikelihood,
    PoissonLogitLikelihood,
    StudentTLikelihood,
)
from .mlls import AugmentedELBO, CollapsedAugmentedELBO
from .models import GPPrior
from .variational import CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy
from .variational.inducing_points import greedy_variance, kmeans_plus_plus

__version__ = "0.1.0"

__all__ = [
    "AugmentedELBO",
    "AugmentedLikelihood",
    "BernoulliLogitLikelihood",
    "BinomialLogitLikelihood",
    "HeteroscedasticGaussianLikelihood",
    "HeteroscedasticStudentTLikelihood",
    "CAVI",
    "CAVITrace",
    "CollapsedAugmentedELBO",
    "CAVIVariationalStrategy",
    "Convergence",
    "GibbsSampler",
    "GibbsSamples",
    "GPPrior",
    "HMCSampler",
    "HeldOut",
    "LaplaceLikelihood",
    "LaplaceTransformLikelihood",
    "LogisticSoftmaxLikelihood",
    "NegativeBinomialLogitLikelihood",
    "PoissonLogitLikelihood",
    "PolyaGamma",
    "RelativeChange",
    "StudentTLikelihood",
    "UnwhitenedCAVIVariationalStrategy",
    "core",
    "distributions",
    "greedy_variance",
    "kmeans_plus_plus",
    "likelihoods",
    "posterior_sampler",
]
