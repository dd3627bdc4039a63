"""Import path of the two heteroscedastic likelihoods before each got its own module (kept for callers)."""

from ..distributions.noise_variance import NoiseVariance
from .heteroscedastic_gaussian import HeteroscedasticGaussianLikelihood
from .heteroscedastic_student_t import HeteroscedasticStudentTLikelihood

__all__ = ["HeteroscedasticGaussianLikelihood", "HeteroscedasticStudentTLikelihood", "NoiseVariance"]
