r"""Hamiltonian Monte Carlo on the original GP posterior, preconditioned by its Laplace approximation:

* :mod:`~gpytorch_augment.inference.hmc.kernel` -- :class:`HMCKernel` (the transition, the maths) and
  :class:`LaplacePreconditioner`, an :class:`~gpytorch_augment.inference.mcmc.MCMCKernel`;
* :mod:`~gpytorch_augment.inference.hmc.joint` -- :class:`HyperparameterHMCKernel`, HMC on the prior's
  hyper-parameters and the whitened latents jointly (``sample_hyperparameters=True``);
* :mod:`~gpytorch_augment.inference.hmc.sampler` -- :class:`HMCSampler`, the constructor of the driver
  :class:`~gpytorch_augment.inference.mcmc.MCMC` composed with it.
"""

from .joint import HyperparameterHMCKernel
from .kernel import HMCChains, HMCKernel, LaplacePreconditioner
from .sampler import HMCSampler

__all__ = ["HMCChains", "HMCKernel", "HMCSampler", "HyperparameterHMCKernel", "LaplacePreconditioner"]
