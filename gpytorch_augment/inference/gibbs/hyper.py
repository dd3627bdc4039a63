r"""Blocked Gibbs sampling of the latents *and* the prior's hyper-parameters: :class:`HyperparameterGibbsKernel`.

The joint target is

.. math::
    p(\theta, f, \Omega \mid y) \propto p(\theta)\, \mathcal N(f \mid \mu_\theta, K_\theta + \epsilon I)
    \prod_i p(y_i, \Omega_i \mid f_i),

:math:`\theta` the raw (unconstrained) parameters of the prior's mean and kernel that require grad
(:class:`~gpytorch_augment.inference.mcmc.prior_parameters.PriorParameters`: their priors, and the coordinates). Given
:math:`\Omega` every datum contributes the tilt :math:`e^{h_i f_i - \frac12\lambda_i f_i^2}`, with :math:`h, \lambda`
functions of :math:`(\Omega, y)` only, so :math:`f` integrates out in closed form
(:func:`~gpytorch_augment.core.collapsed_log_marginal`, with :math:`f = \mu_\theta + L_\theta v`, :math:`A = L^\top`):

.. math::
    p(\theta \mid \Omega, y) \propto p(\theta) \int \mathcal N(f \mid \mu_\theta, K_\theta) \prod_i
    e^{h_i f_i - \frac12\lambda_i f_i^2}\, df
    = p(\theta)\, \exp\Big(\sum_i \big(h_i\mu_i - \tfrac12\lambda_i\mu_i^2\big)
      + \tfrac12\lVert C^{-\top} b\rVert^2 - \textstyle\sum_j \log C_{jj}\Big),

:math:`b = A(h - \lambda\odot\mu)`, :math:`B = I + A\Lambda A^\top = C^\top C` (summed over latents; linear
observations :math:`g = Df` use :math:`(AD^\top, D\mu)`). One transition of a chain is

1. :math:`\Omega \sim p(\Omega \mid f, y)`, then the likelihood's own constants where it samples them
   (:meth:`GibbsKernel.conditional_tilts <gpytorch_augment.inference.gibbs.GibbsKernel.conditional_tilts>`);
2. :math:`\theta` by a slice-sampling move along a random direction (:mod:`~gpytorch_augment.inference.mcmc.slice`)
   that leaves :math:`p(\theta \mid \Omega, y)` invariant, :math:`f` integrated out;
3. :math:`f \sim p(f \mid \theta, \Omega, y)`: :math:`v \sim \mathcal N(B^{-1}b, B^{-1})` from the factorisation
   at the accepted :math:`\theta` (no extra factorisation), :math:`f = \mu_\theta + A^\top v`.

**Why it is exact.** Step 1 draws from a full conditional. Steps 2 and 3 together move :math:`(\theta, f)` given
:math:`\Omega`: step 2 leaves the marginal :math:`p(\theta \mid \Omega, y)` invariant and ignores the current
:math:`f`, and step 3 then draws :math:`f` from its conditional given the *new* :math:`\theta`, so the pair leaves
with law :math:`p(\theta \mid \Omega, y)\, p(f \mid \theta, \Omega, y) = p(\theta, f \mid \Omega, y)`: the block is
invariant for the joint (a partially collapsed Gibbs sampler, van Dyk & Park 2008, in a valid order). Step 3 is not
optional: after step 2 the old :math:`f` belongs to the old :math:`\theta`, and keeping it (or drawing :math:`f` before
:math:`\theta`) samples a wrong joint; the Geweke test of ``tests/inference/test_sampled_hyperparameters.py`` fails
on exactly that variant.

**Cost.** A slice move evaluates the collapsed density some 4-8 times (as one batch of the chains still in play each
time): the prior at a batch of :math:`\theta`, two Cholesky factorisations (:math:`K_\theta + \epsilon I` and
:math:`B`) and :math:`A\Lambda A^\top`, :math:`O(N^3)` each, against one factorisation for a sweep at fixed
:math:`\theta`. A proposal whose :math:`K_\theta + \epsilon I` cannot be factorised has density 0.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import torch
from torch import Tensor

from ...core import WhitenedGaussian, collapsed_log_marginal
from ...core.linalg import add_to_diagonal
from ...core.prior import FactorizationError, with_linalg_advice
from ...likelihoods.augmented_likelihood import AuxDict
from ..mcmc.kernel import MCMCKernel
from ..mcmc.prior_parameters import PriorParameters
from ..mcmc.slice import MAX_STEPS_OUT, SliceMove, slice_move
from ..mcmc.state import ChainState
from ..mcmc.target import PosteriorTarget
from .kernel import GibbsKernel

__all__ = ["DEFAULT_SLICE_WIDTH", "HYPER_KERNEL_NAME", "HyperChains", "HyperparameterGibbsKernel"]

#: the slice width a run starts from (raw coordinates, along a unit direction); warm-up adapts it
DEFAULT_SLICE_WIDTH = 1.0
#: the width adapted in warm-up stays within these bounds
WIDTH_BOUNDS = (1e-3, 1e3)
#: the kernel's name (``PosteriorSamples.f_update`` of its draws)
HYPER_KERNEL_NAME = "hyper"


class HyperChains(NamedTuple):
    """The chains of :class:`HyperparameterGibbsKernel` between transitions: latents ``f`` (C, T, N), the last
    :math:`\\Omega` draw ``aux``, the likelihood's sampled ``constants``, the targets ``y``, the coordinates
    ``theta`` (C, P) and the prior at them (``mean`` (C, T, N), ``A`` = :math:`L^\\top` (C, T, N, N),
    ``log_prior`` (C,)), the slice ``width`` (C,) and the warm-up iterations it has averaged (``adapted``)."""

    f: Tensor
    aux: AuxDict
    constants: dict[str, Tensor]
    y: Tensor
    theta: Tensor
    mean: Tensor
    A: Tensor
    log_prior: Tensor
    width: Tensor
    adapted: int


class HyperparameterGibbsKernel(MCMCKernel[HyperChains]):
    r"""Blocked Gibbs over :math:`(\Omega, \theta, f)`: :math:`\Omega \mid f` (and the likelihood's constants), then
    :math:`\theta \mid \Omega` with :math:`f` integrated out (slice sampling), then :math:`f \mid \theta, \Omega` (the
    module docstring has the maths and why the order matters).

    :param target: the :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget` (exact model; a likelihood without
        ``latent_blocks``).
    :param slice_width: the width the slice moves start from (raw coordinates, along a unit direction); a run with
        warm-up adapts it (the running mean of three times the distance moved, pooled over chains), a run without
        warm-up keeps it (or the width of its ``init`` state, ``ChainState.step_size``).
    :param max_steps_out: Neal's :math:`m`, the most steps of the stepping-out procedure.
    :param adapt_width: adapt the width in warm-up.

    :raises ValueError: with inducing points or a likelihood with ``latent_blocks`` (not supported yet), for a
        parameter that requires grad without a prior (:class:`PriorParameters`), or a non-positive width.

    Attributes after a run (a report; a later run never reads them): :attr:`last_run`, with the mean number of
    batched density evaluations per transition and the final width.

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GPPrior
        >>> from gpytorch_augment.inference.gibbs import HyperparameterGibbsKernel
        >>> from gpytorch_augment.inference.mcmc import MCMC, PosteriorTarget
        >>> x = torch.linspace(-2, 2, 10, dtype=torch.float64).unsqueeze(-1)
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()))
        >>> target = PosteriorTarget(prior.double(), BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double())
        >>> samples = MCMC(HyperparameterGibbsKernel(target)).sample(20, warmup=10, num_chains=2, seed=0,
        ...                                                          progress=False)
        >>> samples.hyperparameters["covar_module.base_kernel.lengthscale"].shape   # (chains, draws, *parameter shape)
        torch.Size([2, 20, 1, 1])
    """

    name = HYPER_KERNEL_NAME

    def __init__(
        self,
        target: PosteriorTarget,
        slice_width: float = DEFAULT_SLICE_WIDTH,
        max_steps_out: int = MAX_STEPS_OUT,
        adapt_width: bool = True,
    ) -> None:
        likelihood = type(target.likelihood).__name__
        if target.is_sparse:
            raise ValueError(
                "sample_hyperparameters=True is implemented for the exact model only: drop inducing_points (the "
                "inducing-point sampler keeps its hyper-parameters fixed)"
            )
        if target.blocks is not None:
            raise ValueError(
                f"sample_hyperparameters=True does not support {likelihood}, whose latents are drawn in blocks "
                "(latent_blocks: its tilts depend on the other block's latents, so f does not integrate out given Ω)"
            )
        if isinstance(slice_width, bool) or not isinstance(slice_width, (int, float)) or not (
            math.isfinite(slice_width) and slice_width > 0
        ):
            raise ValueError(f"slice_width must be a positive number, got {slice_width!r}")
        if isinstance(max_steps_out, bool) or not isinstance(max_steps_out, int) or max_steps_out < 1:
            raise ValueError(f"max_steps_out must be a positive integer, got {max_steps_out!r}")
        self.target = target
        self.slice_width, self.max_steps_out, self.adapt_width = float(slice_width), max_steps_out, bool(adapt_width)
        #: the Gibbs kernel whose Ω (and constants) step this kernel runs
        self.gibbs = GibbsKernel(target, f_update="whitened")
        self._hyperparameters = self._checked_parameters()
        self.last_run: dict[str, float] = {}
        self._evaluations = 0

    def _checked_parameters(self) -> PriorParameters:
        target = self.target
        params = PriorParameters(target)
        clash = sorted({p.name for p in params.parameters} & set(target.constants_snapshot({})))
        if clash:
            raise ValueError(f"the model and the likelihood both name a parameter {clash}: rename one")
        self._version = target.version
        return params

    @property
    def hyperparameters(self) -> PriorParameters:
        """The sampled hyper-parameters: coordinates, priors, the batched prior
        (:class:`~gpytorch_augment.inference.mcmc.prior_parameters.PriorParameters`), rebuilt after the target
        refreshes its prior (a changed model)."""
        if self._version != self.target.version:
            self._hyperparameters = self._checked_parameters()
        return self._hyperparameters

    @property
    def samples_constants(self) -> bool:
        """``True``: the chains carry draws of the prior's hyper-parameters (and of the likelihood's constants where
        it samples them), recorded in ``hyper``."""
        return True

    # ------------------------------------------------------------------ the prior at a batch of θ
    def _prior(self, theta: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(mean, A, log_prior, ok)`` at coordinates ``theta`` (n, P): ``A = chol(K + jitter I)ᵀ``; ``ok`` marks
        the chains whose factorisation succeeded."""
        mean, covar, log_prior = self.hyperparameters.evaluate(theta)
        K = add_to_diagonal((covar + covar.mT) / 2, self.target.jitter)
        L, info = torch.linalg.cholesky_ex(K)
        ok = (info == 0).reshape(theta.shape[0], -1).all(-1)
        return mean, L.mT, log_prior, ok

    def _collapsed(
        self, mean: Tensor, A: Tensor, log_prior: Tensor, ok: Tensor | None, h: Tensor, lam: Tensor
    ) -> tuple[Tensor, WhitenedGaussian]:
        r""":math:`\log p(\theta) + \log Z(\theta)` per chain (``-inf`` where not ``ok`` or not finite) and
        :math:`q(v)`."""
        design = self.target.design
        A_obs, mean_obs = (A, mean) if design is None else (design.apply(A), design.apply(mean))
        log_z, q = collapsed_log_marginal(A_obs, mean_obs, h, lam)
        log_p = log_prior + log_z.sum(-1)
        valid = torch.isfinite(log_p) if ok is None else torch.isfinite(log_p) & ok
        return torch.where(valid, log_p, torch.full_like(log_p, -math.inf)), q

    # ------------------------------------------------------------------ the MCMCKernel protocol
    @with_linalg_advice("sampling the hyper-parameters")
    @torch.no_grad()
    def init(self, f: Tensor, y: Tensor, state: ChainState | None, num_warmup: int) -> HyperChains:
        C, target = f.shape[0], self.target
        names = {p.name for p in self.hyperparameters.parameters}
        hyper = dict(state.hyper) if state is not None else {}
        theta_values = {k: v for k, v in hyper.items() if k in names}
        constants: dict[str, Tensor] = {}
        if self.gibbs.samples_constants and state is not None:
            lik = {k: v for k, v in hyper.items() if k not in names}
            constants = target.initial_constants(dataclasses.replace(state, hyper=lik))
        theta = self._initial_theta(theta_values, state, C)
        mean, A, log_prior, ok = self._prior(theta)
        if not bool(ok.all()):
            raise FactorizationError(
                f"the prior covariance K + jitter I at the starting hyper-parameters of chains "
                f"{torch.nonzero(~ok).flatten().tolist()} is not positive definite: raise the jitter (jitter=) or "
                "start from other hyper-parameters"
            )
        if not bool(torch.isfinite(log_prior).all()):
            raise ValueError(
                "the prior density of the starting hyper-parameters is zero (or not finite): start the model's "
                "parameters inside the support of their priors"
            )
        width = torch.full((C,), self.slice_width, dtype=theta.dtype, device=theta.device)
        step = state.step_size if state is not None else None
        if isinstance(step, Tensor) and step.dim() == 1 and step.shape[0] in (1, C):
            width = step.to(width).expand(C).clone()
        self._evaluations = 0
        return HyperChains(f, {}, constants, y, theta, mean, A, log_prior, width, 0)

    def _initial_theta(self, values: dict[str, Tensor], state: ChainState | None, num_chains: int) -> Tensor:
        """The coordinates a run starts from: the state's (its exact raw ``coordinates`` where they give its
        recorded values), else the model's values."""
        hp = self.hyperparameters
        if not values:
            return hp.initial(num_chains)
        theta = hp.from_constrained(values, num_chains)
        coords = state.coordinates if state is not None else None
        if isinstance(coords, Tensor) and coords.dim() == 3 and coords.shape[0] == 1:
            if coords.shape[1] in (1, num_chains) and coords.shape[2] == hp.size:
                exact = coords[0].to(theta).expand(num_chains, -1).clone()
                recorded = {k: torch.as_tensor(v, device=self.target.device) for k, v in values.items()}
                same = all(
                    torch.equal(
                        value.to(recorded[name]),
                        recorded[name].expand_as(value) if recorded[name].dim() == value.dim() else recorded[name],
                    )
                    for name, value in hp.constrained(exact).items()
                )
                if same:
                    return exact
        return theta

    @with_linalg_advice("sampling the hyper-parameters")
    @torch.no_grad()
    def step(self, chains: HyperChains, generator: torch.Generator | None, adapt: bool) -> HyperChains:
        aux, constants, h, lam = self.gibbs.conditional_tilts(chains.f, chains.y, generator, chains.constants)
        move = self.theta_move(chains, h, lam, generator)
        mean, A, log_prior, theta1, C = move.payload
        f = self.latent_draw(mean, A, WhitenedGaussian(theta1, C), generator)
        width, adapted = chains.width, chains.adapted
        if adapt and self.adapt_width:
            pooled = (width.mean() * (adapted + 1) + 3.0 * move.t.abs().mean()) / (adapted + 2)
            width = pooled.clamp(*WIDTH_BOUNDS).expand_as(width).clone()
            adapted += 1
        return HyperChains(f, aux, constants, chains.y, move.x, mean, A, log_prior, width, adapted)

    def theta_move(self, chains: HyperChains, h: Tensor, lam: Tensor, generator: torch.Generator | None) -> SliceMove:
        r"""Step 2: the slice move of :math:`\theta` on :math:`p(\theta \mid \Omega, y)` for the tilts ``h``,
        ``lam`` (C, T, n); its payload holds the prior and :math:`q(v)` at the new :math:`\theta`:
        ``(mean, A, log_prior, theta1, C)``."""
        log_p0, q0 = self._collapsed(chains.mean, chains.A, chains.log_prior, None, h, lam)

        def log_density(theta: Tensor, index: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
            mean, A, log_prior, ok = self._prior(theta)
            log_p, q = self._collapsed(mean, A, log_prior, ok, h[index], lam[index])
            return log_p, (mean, A, log_prior, q.theta1, q.C)

        payload0 = (chains.mean, chains.A, chains.log_prior, q0.theta1, q0.C)
        move = slice_move(chains.theta, log_p0, payload0, log_density, chains.width, generator, self.max_steps_out)
        self._evaluations += move.evaluations
        return move

    @staticmethod
    def latent_draw(mean: Tensor, A: Tensor, q: WhitenedGaussian, generator: torch.Generator | None) -> Tensor:
        r"""Step 3: :math:`f = \mu + A^\top v`, :math:`v \sim q(v) = \mathcal N(B^{-1}b, B^{-1})` (per chain)."""
        eps = torch.randn(q.theta1.shape, generator=generator, dtype=q.theta1.dtype, device=q.theta1.device)
        return mean + (q.draw(eps).unsqueeze(-2) @ A).squeeze(-2)

    def finish(self, chains: HyperChains, num_kept_iterations: int) -> None:
        total = max(1, chains.adapted + num_kept_iterations)
        self.last_run = {
            "evaluations_per_step": self._evaluations / total,
            "slice_width": float(chains.width.mean()),
        }

    def last_state(self, chains: HyperChains) -> ChainState:
        """The latents, the last Ω draw, and in ``hyper`` the likelihood's sampled constants and the prior's
        hyper-parameters (constrained, under the model's names, ``(C, *shape)``); the exact coordinates
        (``coordinates``, ``(1, C, P)``) and the slice widths (``step_size``) let a run continue bit for bit."""
        target, C = self.target, chains.f.shape[0]
        theta = {k: v.to(target.dtype) for k, v in self.hyperparameters.constrained(chains.theta).items()}
        return ChainState(
            f=target.to_storage(chains.f).to(target.dtype),
            aux={k: target.chain_batched(val, C) for k, val in chains.aux.items()},
            hyper={**self.gibbs._constants_snapshot(chains.constants), **theta},
            step_size=chains.width.clone(),
            coordinates=chains.theta.unsqueeze(0).clone(),
        )
