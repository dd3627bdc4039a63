r"""The optional moves of the latents in :class:`~gpytorch_augment.inference.gibbs.HyperparameterGibbsKernel`:
:class:`LatentMoves`, Hamiltonian Monte Carlo on

.. math::
    p(v \mid \theta, y) \propto \mathcal N(v \mid 0, I) \prod_i p(y_i \mid f_i),
    \qquad f = \mu_\theta + A_\theta^\top v,

the whitened latents at the chains' :math:`\theta` with :math:`\Omega` integrated out (the true likelihood, not the
augmented one), run at the start of a transition, before :math:`\Omega` is drawn.

**Why.** Given :math:`\Omega` the latents' draw is exact, but where the auxiliary variables pin the latents (many
augmented counts per datum: the logistic-softmax likelihood whose latents sit far below 0, where
:math:`\sigma(f) \approx e^f` and the likelihood depends on the classes' differences only) :math:`f \mid \Omega` and
:math:`\Omega \mid f` move each other by little, and the blocked sampler crawls along the directions the likelihood
leaves to the prior. A gradient move on :math:`p(f \mid \theta, y)` crosses them: in whitened coordinates the prior is
a unit harmonic oscillator, and a trajectory of time about :math:`\pi/2` carries a prior-dominated direction to an
independent value.

**Why it is exact.** For fixed :math:`\theta` (and the likelihood's constants) the move leaves :math:`p(f \mid
\theta, y)` invariant (:mod:`~gpytorch_augment.inference.mcmc.hmc_move`: the step sizes and the integration time do
not depend on the current latents), so it leaves :math:`p(\theta, f \mid y)` invariant; it ignores the current
:math:`\Omega`, and the transition's next step draws :math:`\Omega` from its conditional given the new :math:`f`, so
the transition leaves the joint :math:`p(\theta, f, \Omega \mid y)` invariant and records a joint draw. The step sizes
are adapted in warm-up only (dual averaging, per chain).

**Cost.** Each leapfrog step is two products with :math:`A_\theta` per latent (:math:`O(N^2)`) and the likelihood's
``log_prob_and_grad``: against the :math:`\theta` move's factorisations per step, little. Where the augmented draw
already mixes (binary, counts with moderate rates) the move is time spent for nothing, so it is off by default
(``latent_moves=0``); the measurements: ``benchmarks/README.md`` ("Fully Bayesian GPs").
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..mcmc.adaptation import DualAveraging
from ..mcmc.hmc_move import LogDensityGrad, hmc_move
from ..mcmc.target import PosteriorTarget
from .hyper_state import HyperChains, chain_likelihood, whitened_latents

__all__ = ["LATENT_MAX_STEPS", "LATENT_STEP", "LATENT_TARGET", "LatentMoves"]

#: the latent moves' step size a run starts from (whitened coordinates), their target acceptance and the most leapfrog
#: steps of one trajectory
LATENT_STEP, LATENT_TARGET, LATENT_MAX_STEPS = 0.1, 0.8, 64


class LatentMoves:
    """The latent moves of :class:`~gpytorch_augment.inference.gibbs.HyperparameterGibbsKernel` and their warm-up
    adaptation (module docstring). A subclass provides ``target`` and ``latent_moves`` (the number of moves per
    transition); :meth:`_initial_latent_step` starts a run."""

    target: PosteriorTarget
    latent_moves: int

    def _check_latent_moves(self, target: PosteriorTarget) -> None:
        moves = self.latent_moves
        if isinstance(moves, bool) or not isinstance(moves, int) or moves < 0:
            raise ValueError(f"latent_moves must be a non-negative integer, got {moves!r}")
        if moves and (target.is_sparse or target.design is not None):
            raise ValueError(
                f"latent_moves={moves} needs the exact model with pointwise observations: the latent moves are not "
                "implemented with inducing_points or linear observations; leave latent_moves=0"
            )

    def _initial_latent_step(self, f: Tensor, tuning: dict[str, Tensor], num_warmup: int) -> Tensor | None:
        """The step sizes (C,) a run's latent moves start from: the ``init`` state's (``ChainState.tuning``, where
        their shape fits and they are positive and finite), else :data:`LATENT_STEP`; with warm-up, dual averaging
        starts from them. ``None`` without latent moves."""
        self._latent_evaluations = 0
        if not self.latent_moves:
            return None
        C = f.shape[0]
        step = tuning.get("latent_step_size")
        valid = isinstance(step, Tensor) and step.dim() == 1 and step.shape[0] in (1, C)
        if valid and bool((torch.isfinite(step) & (step > 0)).all()):
            step = step.to(f).expand(C).clone()
        else:
            step = f.new_full((C,), LATENT_STEP)
        self._latent_dual = DualAveraging(step.clone(), LATENT_TARGET) if num_warmup > 0 else None
        self._latent_warmup = num_warmup
        return step

    def latent_step(self, chains: HyperChains, generator: torch.Generator | None, adapt: bool) -> HyperChains:
        r"""``latent_moves`` HMC moves of the whitened latents on :math:`p(v \mid \theta, y)` (module docstring), the
        integration time :math:`(\frac12 + u)\frac\pi2`, :math:`u \sim \mathcal U(0, 1)` shared by the chains, at most
        :data:`LATENT_MAX_STEPS` leapfrog steps; in warm-up (``adapt``) the step sizes by dual averaging (the averaged
        one from the last warm-up transition on)."""
        A, mean = chains.A, chains.mean
        C, T, N = mean.shape
        log_density = self._latent_density(chains)
        x = whitened_latents(chains)
        index = torch.arange(C, device=x.device)
        step, ones = chains.latent_step, x.new_ones(x.shape[-1])
        log_p, grad, _ = log_density(x, index)
        self._latent_evaluations += 1
        for _ in range(self.latent_moves):
            u = float(torch.rand((), generator=generator, dtype=x.dtype, device=x.device))
            move = hmc_move(x, log_p, grad, (), log_density, ones, step, (0.5 + u) * math.pi / 2, generator,
                            LATENT_MAX_STEPS)  # fmt: skip
            x, log_p, grad = move.x, move.log_p, move.grad
            self._latent_evaluations += move.evaluations
            if adapt and self._latent_dual is not None:
                self._latent_dual.update(move.accept_prob)
                last = chains.adapted + 1 >= self._latent_warmup
                step = (self._latent_dual.final if last else self._latent_dual.step_size).clone()
        f = mean + (x.reshape(C, T, N).unsqueeze(-2) @ A).squeeze(-2)
        return chains._replace(f=f, latent_step=step)

    def _latent_density(self, chains: HyperChains) -> LogDensityGrad:
        r"""``log_density(x, index)`` (:data:`~gpytorch_augment.inference.mcmc.hmc_move.LogDensityGrad`): at whitened
        latents ``x`` (n, T·N) of the chains ``index``, :math:`\log p(y \mid \mu + A^\top v) - \frac12\lVert
        v\rVert^2` under the chains' targets and constants, and its gradient :math:`A\nabla_f \log p(y \mid f) -
        v`."""
        target, A, mean = self.target, chains.A, chains.mean
        T, N = mean.shape[-2:]

        def log_density(x: Tensor, index: Tensor) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
            v, a = x.reshape(-1, T, N), A[index]
            f = mean[index] + (v.unsqueeze(-2) @ a).squeeze(-2)
            y, constants = chain_likelihood(target, chains, index)
            with constants:
                value, grad = target.likelihood.log_prob_and_grad(y, target.to_likelihood(f))
            grad = target.from_likelihood(grad.mT if T > 1 else grad, f.shape)
            grad_v = (a @ grad.unsqueeze(-1)).squeeze(-1) - v
            log_p = value.reshape(v.shape[0], -1).sum(-1).to(v.dtype) - 0.5 * v.square().sum((-2, -1))
            return log_p, grad_v.reshape(v.shape[0], -1), ()

        return log_density
