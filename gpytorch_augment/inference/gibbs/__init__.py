r"""Blocked Gibbs sampling for GP models with augmented likelihoods:

* :mod:`~gpytorch_augment.inference.gibbs.kernel` -- :class:`GibbsKernel`, the sweep (:math:`\Omega \mid f`, then
  :math:`f \mid \Omega`; exact, over-relaxed or inducing-point VI-Gibbs), an
  :class:`~gpytorch_augment.inference.mcmc.MCMCKernel`;
* :mod:`~gpytorch_augment.inference.gibbs.hyper` -- :class:`HyperparameterGibbsKernel`, the sweep that samples the
  prior's hyper-parameters too (:math:`\Omega \mid f`, :math:`\theta \mid \Omega` with :math:`f` integrated out,
  :math:`f \mid \theta, \Omega`), composed of :mod:`~gpytorch_augment.inference.gibbs.collapsed_density` (the
  prior at a batch of :math:`\theta` and :math:`p(\theta \mid \Omega, y)`),
  :mod:`~gpytorch_augment.inference.gibbs.theta_moves` (HMC and slice moves of :math:`\theta` and their adaptation),
  :mod:`~gpytorch_augment.inference.gibbs.surrogate` (the surrogate-data move of :math:`(\theta, f)`),
  :mod:`~gpytorch_augment.inference.gibbs.latent_moves` (HMC moves of the whitened latents on
  :math:`p(f \mid \theta, y)`) and
  :mod:`~gpytorch_augment.inference.gibbs.hyper_state` (the chains' state);
* :mod:`~gpytorch_augment.inference.gibbs.sampler` -- :class:`GibbsSampler`, the constructor of the driver
  :class:`~gpytorch_augment.inference.mcmc.MCMC` composed with it (``sample``, ``resume``, ``sweep``).

The draws, their state and diagnostics are the framework's: :mod:`gpytorch_augment.inference.mcmc`.
"""

from .hyper import HyperChains, HyperparameterGibbsKernel
from .kernel import GibbsChains, GibbsKernel
from .sampler import GibbsSampler

__all__ = ["GibbsChains", "GibbsKernel", "GibbsSampler", "HyperChains", "HyperparameterGibbsKernel"]
