r"""Hamiltonian Monte Carlo on the prior's hyper-parameters and the whitened latents jointly:
:class:`HyperparameterHMCKernel` (``HMCSampler(..., sample_hyperparameters=True)``).

The target is the posterior of the hyper-parameters' coordinates :math:`\theta` and the whitened latents
:math:`v = L_\theta^{-1}(f - \mu_\theta)`, :math:`K_\theta + \epsilon I = L_\theta L_\theta^\top`, with the
likelihood itself (no auxiliary variables):

.. math::
    \log p(\theta, v \mid y) = \log p(\theta) - \tfrac12\lVert v\rVert^2
      + \sum_i \log p(y_i \mid f_i) + \text{const}, \qquad f = \mu_\theta + L_\theta v,

the non-centred parametrisation NumPyro's and Stan's users write for a latent GP. One transition is one HMC move of
:math:`x = (\theta, v)` (:func:`~gpytorch_augment.inference.mcmc.hmc_move.hmc_move`): momentum
:math:`p \sim \mathcal N(0, I)` in the coordinates :math:`x / \sigma`, :math:`\lceil uT/\varepsilon_c\rceil`
leapfrog steps (:math:`u \sim \mathcal U(0, 1)` shared by the chains), a Metropolis test. In warm-up the step sizes
(per chain) are adapted by dual averaging, the length :math:`T` by ChEES and the diagonal scale :math:`\sigma` from the
chains' draws at the ends of three windows; all are fixed afterwards and kept in the last state, so the transition
leaves :math:`p(\theta, v \mid y)` invariant and ``resume`` continues bit for bit. The gradient is one vector-Jacobian
product through the prior's mean, kernel and Cholesky factor, with the likelihood's
``log_prob_and_grad`` for :math:`\nabla_f \log p(y \mid f)`.

**When.** The blocked Gibbs sampler (:class:`~gpytorch_augment.inference.gibbs.HyperparameterGibbsKernel`) moves
:math:`\theta` with :math:`f` integrated out given :math:`\Omega`, which is far cheaper per transition and mixes
better where :math:`\Omega` leaves :math:`\theta` room. Where the auxiliary variables pin the latents (the
logistic-softmax likelihood, whose augmented counts per datum are large) :math:`\theta \mid \Omega` is as narrow as
:math:`\theta \mid f`, and a move that never conditions on :math:`\Omega` crosses faster; the measurements that
locate the two: ``benchmarks/README.md`` ("Fully Bayesian GPs"). It shares the chains' state, starts (spread by
``init_spread``), draws and ``predict`` with the Gibbs kernel, whose subclass it is; its chains record no
:math:`\Omega`.

Exact model with pointwise observations, and a likelihood whose constants are not sampled (as
:class:`~gpytorch_augment.inference.hmc.HMCKernel`): anything else raises a ``ValueError`` naming it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...core.prior import with_linalg_advice
from ..gibbs.hyper import DEFAULT_INIT_SPREAD, HyperChains, HyperparameterGibbsKernel, PriorAt
from ..gibbs.hyper_state import chain_likelihood, whitened_latents
from ..mcmc.hmc_move import LogDensityGrad, hmc_move
from ..mcmc.state import ChainState
from ..mcmc.target import PosteriorTarget

__all__ = ["HYPER_HMC_KERNEL_NAME", "JOINT_MAX_STEPS", "HyperparameterHMCKernel"]

#: the kernel's name (``PosteriorSamples.f_update`` of its draws)
HYPER_HMC_KERNEL_NAME = "hyper_hmc"
#: the most leapfrog steps of one trajectory (``HMCSampler``'s ``max_leapfrog_steps``)
JOINT_MAX_STEPS = 100


class HyperparameterHMCKernel(HyperparameterGibbsKernel):
    r"""HMC on :math:`(\theta, v)` jointly, :math:`\Omega` integrated out (module docstring).

    :param target: the :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget` (exact model, pointwise
        observations, a likelihood whose constants are not sampled).
    :param max_steps: the most leapfrog steps of one trajectory.
    :param init_spread: as :class:`~gpytorch_augment.inference.gibbs.HyperparameterGibbsKernel`'s: a fresh run moves
        each chain's starting coordinates of :math:`\theta` by :math:`\mathcal U(-s, s)`.

    :raises ValueError: with inducing points, linear observations or a likelihood that samples its constants, or for
        a parameter that requires grad without a prior.

    Attributes after a run: :attr:`last_run` (density evaluations per transition, step size, trajectory length,
    acceptance, divergences).

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GPPrior, HMCSampler
        >>> x = torch.linspace(-2, 2, 10, dtype=torch.float64).unsqueeze(-1)
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()))
        >>> sampler = HMCSampler(prior.double(), BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double(),
        ...                      sample_hyperparameters=True)
        >>> samples = sampler.sample(20, warmup=10, num_chains=2, seed=0, progress=False)
        >>> samples.hyperparameters["covar_module.outputscale"].shape   # (chains, draws)
        torch.Size([2, 20])
    """

    name = HYPER_HMC_KERNEL_NAME

    def __init__(
        self, target: PosteriorTarget, max_steps: int = JOINT_MAX_STEPS, init_spread: float = DEFAULT_INIT_SPREAD
    ) -> None:
        self._check_joint(target)
        super().__init__(target, max_steps=max_steps, init_spread=init_spread)

    @staticmethod
    def _check_joint(target: PosteriorTarget) -> None:
        if target.is_sparse or target.design is not None:
            raise ValueError(
                "HMCSampler(..., sample_hyperparameters=True) samples the exact model with pointwise observations: "
                "inducing_points and linear observations are not supported; use GibbsSampler(..., "
                "sample_hyperparameters=True)"
            )
        if target.likelihood.samples_constants:
            raise ValueError(
                f"HMCSampler(..., sample_hyperparameters=True) keeps the likelihood's constants fixed, but "
                f"{type(target.likelihood).__name__} samples them (a prior on them): use GibbsSampler(..., "
                "sample_hyperparameters=True), which samples them"
            )

    @with_linalg_advice("sampling the hyper-parameters")
    @torch.no_grad()
    def init(self, f: Tensor, y: Tensor, state: ChainState | None, num_warmup: int) -> HyperChains:
        """As the Gibbs kernel's, with the step sizes, length and scale of the joint coordinates :math:`(\\theta,
        v)` (the state's where their shapes fit)."""
        self._check_joint(self.target)
        if self.surrogate or self.latent_moves or self.theta_sampler != "hmc":
            raise ValueError(
                "surrogate, latent_moves and theta_sampler are options of the Gibbs kernel's moves; "
                "HyperparameterHMCKernel moves (θ, v) by one HMC move: leave them at False, 0 and 'hmc'"
            )
        chains = super().init(f, y, state, num_warmup)
        x = torch.cat([chains.theta, chains.f.reshape(f.shape[0], -1)], -1)  # only its shape is read
        width, scale, length = self._initial_tuning(x, state, num_warmup)
        return chains._replace(width=width, scale=scale, length=length)

    @with_linalg_advice("sampling the hyper-parameters")
    @torch.no_grad()
    def step(self, chains: HyperChains, generator: torch.Generator | None, adapt: bool) -> HyperChains:
        theta = chains.theta
        x = torch.cat([theta, whitened_latents(chains)], -1)
        log_density = self._joint_density(chains)
        index = torch.arange(x.shape[0], device=x.device)
        log_p, grad, _ = log_density(x, index)
        u = float(torch.rand((), generator=generator, dtype=x.dtype, device=x.device))
        move = hmc_move(x, log_p, grad, (chains.mean, chains.A, chains.log_prior), log_density, chains.scale,
                        chains.width, u * chains.length, generator, self.max_steps)  # fmt: skip
        mean, A, log_prior = move.payload  # the prior at the accepted θ, factorised by the move
        v = move.x[:, theta.shape[-1]:].reshape(chains.f.shape)
        f = mean + (v.unsqueeze(-2) @ A).squeeze(-2)
        chains = chains._replace(f=f, theta=move.x[:, : theta.shape[-1]], mean=mean, A=A, log_prior=log_prior)
        self._evaluations += move.evaluations + 1
        self._divergences += int(move.diverged.sum())
        self._accepted += float(move.accept_prob.mean())
        return self._adapted(chains, [move]) if adapt else chains

    def _joint_density(self, chains: HyperChains) -> LogDensityGrad:
        r"""``log_density(x, index)``: :math:`\log p(\theta, v \mid y)` (module docstring) at ``x`` ``(n, P + T·N)``
        of the chains ``index`` and its gradient, by one backward pass through the prior's mean, kernel and factor
        (a chain whose factorisation fails gets :math:`-\infty`); its payload is the prior there, ``(mean, A,
        log_prior)``."""
        target, T, N = self.target, chains.f.shape[-2], chains.f.shape[-1]
        P = chains.theta.shape[-1]

        def log_density(x: Tensor, index: Tensor) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
            with torch.enable_grad():
                x = x.detach().requires_grad_(True)
                theta, v = x[:, :P], x[:, P:].reshape(-1, T, N)
                prior: PriorAt = self._prior(theta, grad=True)
                f = prior.mean + (v.unsqueeze(-2) @ prior.A).squeeze(-2)
                y, constants = chain_likelihood(target, chains, index)
                with constants:
                    value, g = target.likelihood.log_prob_and_grad(y, target.to_likelihood(f.detach()))
                g = target.from_likelihood(g.mT if T > 1 else g, f.shape).to(f.dtype)
                log_lik = value.reshape(x.shape[0], -1).sum(-1).to(x.dtype)
                own = prior.log_prior - 0.5 * v.square().sum((-2, -1))
                (grad,) = torch.autograd.grad([own.sum(), f], x, [torch.ones_like(own.sum()), g])
            log_p = own.detach() + log_lik
            ok = prior.ok & torch.isfinite(log_p) & torch.isfinite(grad).all(-1)
            log_p = torch.where(ok, log_p, torch.full_like(log_p, -math.inf))
            payload = (prior.mean.detach(), prior.A.detach(), prior.log_prior.detach())
            return log_p, torch.where(ok[:, None], grad, torch.zeros_like(grad)), payload

        return log_density

    def finish(self, chains: HyperChains, num_kept_iterations: int) -> None:
        total = max(1, chains.adapted + num_kept_iterations)
        self.last_run = {
            "evaluations_per_step": self._evaluations / total, "step_size": float(chains.width.mean()),
            "trajectory_length": chains.length, "acceptance": self._accepted / total,
            "divergences": self._divergences,
        }  # fmt: skip
