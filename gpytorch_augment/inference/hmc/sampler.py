r"""The HMC sampler: :class:`HMCSampler`, the driver :class:`~gpytorch_augment.inference.mcmc.MCMC` running the
Laplace-preconditioned transition :class:`~gpytorch_augment.inference.hmc.HMCKernel`."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from ...likelihoods.augmented_likelihood import AugmentedLikelihood
from ..mcmc.driver import MCMC
from ..mcmc.target import LINALG_DTYPE, PosteriorTarget
from .joint import HyperparameterHMCKernel
from .kernel import HMCKernel

__all__ = ["HMCSampler"]

#: options of the Gibbs sampler that HMC refuses by name (a clear error instead of an unexpected keyword)
_GIBBS_ONLY = ("overrelaxation", "f_update", "alpha")


class HMCSampler(MCMC):
    r"""Laplace-preconditioned HMC on the exact GP posterior (the maths: :mod:`gpytorch_augment.inference.hmc.kernel`).

    ``HMCSampler(...)`` only constructs: it is the driver :class:`~gpytorch_augment.inference.mcmc.MCMC` composed with
    an :class:`~gpytorch_augment.inference.hmc.HMCKernel` on a
    :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget`; a sibling of
    :class:`~gpytorch_augment.GibbsSampler`, with the same ``sample`` / ``resume`` / ``sweep`` and draws
    (:class:`~gpytorch_augment.PosteriorSamples`). The settings live on ``sampler.kernel`` (``num_steps``,
    ``target_accept``, ``initial_step_size``, ``preconditioner``, ``curvature``, ``trajectory``, the cached
    ``laplace`` preconditioner) and ``sampler.target`` (model, likelihood, data, prior).

    :param model: as for :class:`~gpytorch_augment.GibbsSampler` (``model.forward(x)`` returns the prior).
    :param likelihood: an :class:`~gpytorch_augment.likelihoods.AugmentedLikelihood` (``log_prob_grad`` and
        ``log_prob_and_grad`` are used).
    :param x: training inputs ``(N, D)``.
    :param y: training targets ``(N,)``.
    :param inducing_points: not supported (HMC samples the exact posterior); given, a ``ValueError``.
    :param jitter: :math:`\epsilon` added to the prior covariance (default as for ``GibbsSampler``).
    :param num_steps: ``(low, high)``: leapfrog steps per transition, uniform on ``low .. high`` (inclusive), drawn
        once per iteration for all chains (default ``(2, 5)``); an integer ``n`` is a fixed number, ``(n, n)``.
    :param target_accept: acceptance probability targeted by the step-size adaptation (default 0.8).
    :param initial_step_size: step size the adaptation starts from, and the step size of runs without warm-up
        before any adaptation (default 1.0: the Laplace approximation is :math:`\mathcal N(0, I)` in these
        coordinates).
    :param preconditioner: ``"laplace"`` (default) or ``"prior"`` (:math:`W = 0`, :math:`\hat v = 0`: plain
        HMC in the whitened prior coordinates; a baseline).
    :param curvature: ``"joint"`` (default: the Laplace curvature keeps the coupling of a point's latents) or
        ``"diagonal"`` (per latent: cheaper leapfrog steps when :math:`T > 1`; the same for :math:`T = 1`).
    :param trajectory: ``"random"`` (default: ``num_steps``) or ``"chees"`` (jittered integration times, their
        length adapted in warm-up by ChEES across the chains; :class:`~gpytorch_augment.inference.hmc.HMCKernel`).
    :param trajectory_length: the length ChEES starts from (default 1.0).
    :param max_leapfrog_steps: the most leapfrog steps of a ChEES transition (default 100).
    :param linalg_dtype: as for ``GibbsSampler`` (float64 by default, whatever the data's dtype).
    :param sample_hyperparameters: sample the prior's hyper-parameters too, under their registered priors or the
        one-call fit's default ones (as ``GibbsSampler(..., sample_hyperparameters=True)``), by HMC on the
        hyper-parameters and the whitened latents jointly, the likelihood's auxiliary variables integrated out
        (:class:`~gpytorch_augment.inference.hmc.HyperparameterHMCKernel`; its own step sizes, length and scale are
        adapted in warm-up, so of the options above only ``jitter``, ``max_leapfrog_steps`` and ``linalg_dtype``
        apply, and another given raises ``ValueError``). Default ``False``: they stay at the model's values.
    :param kwargs: per-datum keyword data of the likelihood, as for ``GibbsSampler``.

    A report of the latest run (a later :meth:`sample` never reads it): ``sampler.kernel.step_size`` (per chain,
    frozen after warm-up) and ``sampler.kernel.last_run`` (acceptance rate, mean leapfrog steps, step sizes, number
    of gradient evaluations).

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GPPrior, HMCSampler
        >>> x = torch.linspace(-2, 2, 10, dtype=torch.float64).unsqueeze(-1)
        >>> y = (x.squeeze(-1) > 0).double()
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel()).double()
        >>> sampler = HMCSampler(prior, BernoulliLogitLikelihood(), x, y)
        >>> samples = sampler.sample(40, warmup=40, num_chains=4, seed=0, progress=False)
        >>> samples.f.shape
        torch.Size([4, 40, 10])
        >>> sampler.resume(samples, 10, progress=False).f.shape
        torch.Size([4, 50, 10])
    """

    def __init__(
        self,
        model: Any,
        likelihood: AugmentedLikelihood,
        x: Tensor,
        y: Tensor,
        inducing_points: Tensor | None = None,
        jitter: float | None = None,
        num_steps: tuple[int, int] | int = (2, 5),
        target_accept: float = 0.8,
        initial_step_size: float = 1.0,
        preconditioner: str = "laplace",
        curvature: str = "joint",
        trajectory: str = "random",
        trajectory_length: float = 1.0,
        max_leapfrog_steps: int = 100,
        linalg_dtype: torch.dtype = LINALG_DTYPE,
        sample_hyperparameters: bool = False,
        **kwargs: Any,
    ) -> None:
        if not isinstance(sample_hyperparameters, bool):
            raise ValueError(f"sample_hyperparameters must be True or False, got {sample_hyperparameters!r}")
        if sample_hyperparameters:
            given = {"num_steps": num_steps, "target_accept": target_accept, "initial_step_size": initial_step_size,
                     "preconditioner": preconditioner, "curvature": curvature, "trajectory": trajectory,
                     "trajectory_length": trajectory_length}  # fmt: skip
            defaults = inspect.signature(HMCSampler.__init__).parameters
            for name, value in given.items():
                if value != defaults[name].default:
                    raise ValueError(
                        f"{name} is an option of HMC on the latents at fixed hyper-parameters; with "
                        "sample_hyperparameters=True the joint move adapts its own (only jitter, max_leapfrog_steps "
                        "and linalg_dtype apply): leave it at its default"
                    )
        if inducing_points is not None:
            raise ValueError("HMCSampler samples the exact posterior only; use GibbsSampler with inducing_points")
        for name in _GIBBS_ONLY:
            if name in kwargs:
                raise ValueError(f"{name} is an option of GibbsSampler; HMCSampler does not use it")
        target = PosteriorTarget(
            model, likelihood, x, y, None, jitter, linalg_dtype, caller=type(self).__name__, **kwargs
        )
        if sample_hyperparameters:
            super().__init__(HyperparameterHMCKernel(target, max_steps=max_leapfrog_steps))
            return
        kernel = HMCKernel(
            target, num_steps, target_accept, initial_step_size, preconditioner, curvature, trajectory,
            trajectory_length, max_leapfrog_steps,
        )  # fmt: skip
        super().__init__(kernel)
