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
from .likelihoods import (
    AugmentedLikelihood,
    BayesianSVMLikelihood,
    BernoulliLogitLikelihood,
    BinomialLogitLikelihood,
    HeteroscedasticGaussianLikelihood,
    HeteroscedasticStudentTLikelihood,
    LaplaceLikelihood,
    LaplaceTransformLikelihood,
    LogisticSoftmaxLikelihood,
    MaternThreeHalvesLikelihood,
    NegativeBinomialLogitLikelihood,
    OrdinalLogitLikelihood,
    PairwiseLogitLikelihood,
    PoissonLogitLikelihood,
    StudentTLikelihood,
)
from .mlls import AugmentedELBO, CollapsedAugmentedELBO
from .models import GPPrior
from .variational import CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy
from .variational.inducing_points import greedy_variance, kmeans_plus_plus

__version__ = "0.3.0"  # the one place the version is set (setup.cfg and docs/conf.py read it)

__all__ = [
    "AugmentedELBO",
    "AugmentedLikelihood",
    "BayesianSVMLikelihood",
    "BernoulliLogitLikelihood",
    "BinomialLogitLikelihood",
    "HeteroscedasticGaussianLikelihood",
    "HeteroscedasticStudentTLikelihood",
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
    "LaplaceLikelihood",
    "LaplaceTransformLikelihood",
    "LogisticSoftmaxLikelihood",
    "MaternThreeHalvesLikelihood",
    "NegativeBinomialLogitLikelihood",
    "OrdinalLogitLikelihood",
    "PairwiseLogitLikelihood",
    "PoissonLogitLikelihood",
    "PolyaGamma",
    "PosteriorSamples",
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
