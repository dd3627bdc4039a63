r"""The moves of the hyper-parameters in :class:`~gpytorch_augment.inference.gibbs.HyperparameterGibbsKernel`:
:class:`ThetaMoves`, step 2 of its transition, a move of :math:`\theta` that leaves :math:`p(\theta \mid \Omega,
y)` invariant (:class:`~gpytorch_augment.inference.gibbs.collapsed_density.CollapsedThetaDensity`, the latents
integrated out): Hamiltonian Monte Carlo (:mod:`~gpytorch_augment.inference.mcmc.hmc_move`; the gradient from the
adjoints of :func:`~gpytorch_augment.core.collapsed.collapsed_marginal_adjoints`) or a slice move along a random
direction (:mod:`~gpytorch_augment.inference.mcmc.slice`), and their warm-up adaptation.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...core.collapsed import collapsed_marginal_adjoints
from ...core.linalg import add_to_diagonal
from ..mcmc.adaptation import ChEESAdaptation, DualAveraging
from ..mcmc.hmc_move import HMCMove, hmc_move
from ..mcmc.slice import SliceMove, slice_move
from ..mcmc.state import ChainState
from .collapsed_density import CollapsedThetaDensity
from .hyper_state import HMC_LENGTH, HyperChains

__all__ = ["THETA_SAMPLERS", "ThetaMoves", "running_width"]

#: the slice width adapted in warm-up stays within these bounds
WIDTH_BOUNDS = (1e-3, 1e3)
#: the samplers of θ (``theta_sampler=``)
THETA_SAMPLERS = ("hmc", "slice")
#: HMC on θ: the step size a run starts from, the bounds of the ChEES length, the most leapfrog steps of a
#: trajectory, the target acceptance, and the warm-up fractions at whose ends the scale is re-estimated (from the
#: chains' draws since the previous end)
HMC_STEP, HMC_LENGTH_BOUNDS, HMC_MAX_STEPS, HMC_TARGET = 0.2, (0.1, 10.0), 32, 0.8
HMC_WINDOWS = (0.15, 0.4, 0.75)


def running_width(width: Tensor, count: int, distance: Tensor) -> Tensor:
    """A slice width adapted in warm-up: the running mean of three times the ``distance`` moved, pooled over the
    chains (the current width weighs as ``count`` earlier updates), within :data:`WIDTH_BOUNDS`; one per chain."""
    pooled = (width.mean() * count + 3.0 * distance) / (count + 1)
    return pooled.clamp(*WIDTH_BOUNDS).expand_as(width).clone()


class ThetaMoves(CollapsedThetaDensity):
    """Step 2 of :class:`~gpytorch_augment.inference.gibbs.HyperparameterGibbsKernel`'s transition and its warm-up
    adaptation. A subclass provides, beside :class:`CollapsedThetaDensity`'s attributes, ``theta_sampler``
    (:data:`THETA_SAMPLERS`), ``slice_width``, ``max_steps_out``, ``adapt_width`` and ``max_steps``; the run's
    counters (``_evaluations``, ``_divergences``, ``_accepted``) and adaptation live here
    (:meth:`_initial_tuning`)."""

    theta_sampler: str
    slice_width: float
    max_steps_out: int
    adapt_width: bool
    max_steps: int

    def _initial_tuning(
        self, theta: Tensor, state: ChainState | None, num_warmup: int
    ) -> tuple[Tensor, Tensor, float]:
        """``(width, scale, length)`` a run's moves start from (the state's where they fit: a continued run takes the
        very steps one longer run takes), with the run's counters reset and, for HMC with warm-up, its adaptation
        (dual averaging, ChEES, the scale's windows :data:`HMC_WINDOWS`) started."""
        C = theta.shape[0]
        hmc = self.theta_sampler == "hmc"
        width = torch.full((C,), HMC_STEP if hmc else self.slice_width, dtype=theta.dtype, device=theta.device)
        step = state.step_size if state is not None else None
        if isinstance(step, Tensor) and step.dim() == 1 and step.shape[0] in (1, C):
            width = step.to(width).expand(C).clone()
        scale, length = theta.new_ones(theta.shape[-1]), HMC_LENGTH
        if hmc and state is not None:
            if isinstance(state.scale, Tensor) and state.scale.shape == scale.shape:
                scale = state.scale.to(scale).clone()
            if state.trajectory_length is not None:
                length = float(state.trajectory_length)
        self._evaluations, self._divergences, self._accepted = 0, 0, 0.0
        self._num_warmup, self._window = num_warmup, []
        self._window_ends = {max(1, round(frac * num_warmup)) for frac in HMC_WINDOWS} if num_warmup >= 20 else set()
        if hmc and num_warmup > 0:
            self._dual = DualAveraging(width.clone(), HMC_TARGET)
            self._chees = ChEESAdaptation(length, num_warmup, HMC_LENGTH_BOUNDS)
        return width, scale, length

    def _adapted(self, chains: HyperChains, moves: list[HMCMove | SliceMove]) -> HyperChains:
        """The warm-up adaptation after a transition's moves (one per latent block). Slice: the width, the running
        mean of three times the distance moved (pooled over chains and blocks). HMC: the step sizes by dual averaging
        (on the smallest acceptance probability of the blocks' moves: one step size serves them all), the trajectory
        length by ChEES (from the last move), the scale from the pooled variance of the chains' draws at the ends of
        the windows :data:`HMC_WINDOWS` (Stan's regularisation towards :math:`10^{-3}`), each end restarting the dual
        averaging."""
        adapted, move = chains.adapted + 1, moves[-1]
        if isinstance(move, SliceMove):
            if not self.adapt_width:
                return chains
            distance = torch.stack([m.t.abs() for m in moves]).mean()
            return chains._replace(width=running_width(chains.width, adapted, distance), adapted=adapted)
        self._dual.update(torch.stack([m.accept_prob for m in moves]).amin(0))
        self._chees.update(move.z0[None], move.z1[None], move.p1[None], move.accept_prob, move.times)
        self._window.append(move.x)
        scale = chains.scale
        if adapted in self._window_ends:
            draws = torch.cat(self._window)
            n = draws.shape[0]
            var = draws.var(0) * n / (n + 5.0) + 1e-3 * 5.0 / (n + 5.0)
            scale, self._window = var.sqrt(), []
            self._dual = DualAveraging(self._dual.step_size.clone(), HMC_TARGET)
        last = adapted >= self._num_warmup
        width = (self._dual.final if last else self._dual.step_size).clone()
        length = self._chees.final if last else self._chees.length
        return chains._replace(width=width, adapted=adapted, scale=scale, length=length)

    def theta_move(
        self,
        chains: HyperChains,
        h: Tensor,
        lam: Tensor,
        generator: torch.Generator | None,
        block: tuple[int, ...] | None = None,
    ) -> HMCMove | SliceMove:
        r"""Step 2, the move of :math:`\theta` on :math:`p(\theta \mid \Omega, y)` (with ``block``:
        :math:`p(\theta \mid \Omega, f_{-b}, y)`) for the tilts ``h``, ``lam`` (C, T, n) (:meth:`theta_hmc` or
        :meth:`theta_slice`); its payload holds the prior and :math:`q(v)` at the new :math:`\theta`:
        ``(mean, A, log_prior, theta1, C, *extras)`` (:meth:`collapsed_density`)."""
        if self.theta_sampler == "hmc":
            return self.theta_hmc(chains, h, lam, generator, block)
        return self.theta_slice(chains, h, lam, generator, block)

    def theta_hmc(
        self,
        chains: HyperChains,
        h: Tensor,
        lam: Tensor,
        generator: torch.Generator | None,
        block: tuple[int, ...] | None = None,
    ) -> HMCMove:
        r"""Step 2 by HMC on :math:`\log p(\theta \mid \Omega, y)` for the tilts ``h``, ``lam`` (C, T, n), the
        integration time :math:`uT`, :math:`u \sim \mathcal U(0, 1)` shared by the chains; the payload as
        :meth:`theta_move`'s, computed once at the chains' new :math:`\theta`.

        Each leapfrog step evaluates the collapsed marginal and its gradient from :math:`B = I + SKS` and the adjoints
        of :math:`(\mu, K)` (:func:`~gpytorch_augment.core.collapsed.collapsed_marginal_adjoints`): one
        factorisation and one vector-Jacobian product through the prior's mean and kernel, never through a
        factorisation. With linear observations (``design``), inducing points or latent blocks autograd
        differentiates the factor form of :meth:`collapsed_density`'s density instead."""
        target, params = self.target, self.hyperparameters
        density = self._density(chains, h, lam, block)
        adjoints = target.design is None and not target.is_sparse and block is None

        def log_density(theta: Tensor, index: Tensor) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
            with torch.enable_grad():
                th = theta.detach().requires_grad_(True)
                if adjoints:
                    mean, covar, log_prior = params.evaluate(th, grad=True)
                    K = add_to_diagonal((covar + covar.mT) / 2, target.jitter)
                    out = collapsed_marginal_adjoints(K.detach(), mean.detach(), h[index], lam[index])
                    log_p = log_prior.detach() + out.log_z.sum(-1)
                    ok = out.ok.reshape(theta.shape[0], -1).all(-1) & torch.isfinite(log_p)
                    zero = ~ok
                    d_cov = torch.where(zero[:, None, None, None], 0.0, out.d_covariance)
                    d_mean = torch.where(zero[:, None, None], 0.0, out.d_mean)
                    pairs = [(o, g) for o, g in ((covar, d_cov), (mean, d_mean), (log_prior, ok.to(th.dtype)))
                             if o.requires_grad]  # fmt: skip
                    (grad,) = torch.autograd.grad([o for o, _ in pairs], th, [g for _, g in pairs])
                else:
                    log_p, _ = density(self._prior(th, grad=True), index)
                    ok = torch.isfinite(log_p)
                    (grad,) = torch.autograd.grad(torch.where(ok, log_p, torch.zeros_like(log_p)).sum(), th)
                    log_p = log_p.detach()
            return torch.where(ok, log_p, torch.full_like(log_p, -math.inf)), grad, ()

        index = torch.arange(chains.theta.shape[0], device=chains.theta.device)
        log_p0, grad0, _ = log_density(chains.theta, index)
        u = float(torch.rand((), generator=generator, dtype=chains.theta.dtype, device=chains.theta.device))
        move = hmc_move(chains.theta, log_p0, grad0, (), log_density, chains.scale, chains.width,
                        u * chains.length, generator, self.max_steps)  # fmt: skip
        prior = self._prior(move.x)
        _, q = density(prior, None)
        self._evaluations += move.evaluations + 2
        return move._replace(payload=(prior.mean, prior.A, prior.log_prior, q.theta1, q.C, *prior.extras()))

    def theta_slice(
        self,
        chains: HyperChains,
        h: Tensor,
        lam: Tensor,
        generator: torch.Generator | None,
        block: tuple[int, ...] | None = None,
    ) -> SliceMove:
        r"""Step 2 by the random-direction slice move (:mod:`~gpytorch_augment.inference.mcmc.slice`) on
        :meth:`collapsed_density`; the payload as :meth:`theta_move`'s."""
        log_p0, payload0, log_density = self.collapsed_density(chains, h, lam, block)
        move = slice_move(chains.theta, log_p0, payload0, log_density, chains.width, generator, self.max_steps_out)
        self._evaluations += move.evaluations
        return move
