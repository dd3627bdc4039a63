r"""Blocked Gibbs sampling for GP models with augmented likelihoods, split as NumPyro splits MCMC:

* :mod:`~gpytorch_augment.inference.gibbs.kernel` -- the sweep (:math:`\Omega \mid f`, then :math:`f \mid \Omega`);
* :mod:`~gpytorch_augment.inference.gibbs.sampler` -- the driver :class:`GibbsSampler` (``sample``, ``resume``);
* :mod:`~gpytorch_augment.inference.gibbs.state` and :mod:`~gpytorch_augment.inference.gibbs.samples` -- the
  containers (:class:`GibbsState`, :class:`GibbsSamples` with prediction and ArviZ export);
* R̂/ESS live in :mod:`gpytorch_augment.inference.diagnostics`.
"""

from .kernel import BlockedGibbsKernel
from .sampler import GibbsSampler
from .samples import GibbsPrediction, GibbsSamples, GibbsSummary
from .state import GibbsState

__all__ = ["BlockedGibbsKernel", "GibbsPrediction", "GibbsSampler", "GibbsSamples", "GibbsState", "GibbsSummary"]
