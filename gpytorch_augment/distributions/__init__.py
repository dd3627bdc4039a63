"""Distributions of the augmented likelihoods (``torch.distributions`` style): the laws of the auxiliary variables
and the predictive distributions of :math:`y`."""

from .auxiliary import AuxiliaryDistribution
from .inverse_gaussian import InverseGamma, InverseGaussian
from .laplace_transform import TiltedLaplaceTransform
from .matern import MaternThreeHalves
from .negative_multinomial import NegativeMultinomial
from .noise_variance import NoiseVariance
from .normal_laplace import NormalLaplace
from .polya_gamma import PolyaGamma
from .student_t_predictive import StudentTPredictive
from .tilted_inverse_gamma import TiltedInverseGamma

__all__ = [
    "AuxiliaryDistribution",
    "InverseGamma",
    "InverseGaussian",
    "MaternThreeHalves",
    "NegativeMultinomial",
    "NoiseVariance",
    "NormalLaplace",
    "PolyaGamma",
    "StudentTPredictive",
    "TiltedInverseGamma",
    "TiltedLaplaceTransform",
]
