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
2. :math:`\theta` by a move that leaves :math:`p(\theta \mid \Omega, y)` invariant, :math:`f` integrated out:
   Hamiltonian Monte Carlo (:mod:`~gpytorch_augment.inference.mcmc.hmc_move`; the gradient from the adjoints of
   :func:`~gpytorch_augment.core.collapsed.collapsed_marginal_adjoints`) or a slice move along a random direction
   (:mod:`~gpytorch_augment.inference.mcmc.slice`);
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

**Inducing points** (``target.is_sparse``). The model sampled is the inducing-point prior at every :math:`\theta`
(:math:`u = \mu_Z + L_Z v`, :math:`f_i \mid u \sim \mathcal N(m_i, d_i)`, FITC's prior, the inducing inputs fixed).
Given :math:`\Omega` both :math:`f` and :math:`u` integrate out: each datum's tilt becomes
:math:`e^{c_i} e^{\tilde h_i m_i - \frac12\tilde\lambda_i m_i^2}` with :math:`\tilde h_i = h_i/(1 + \lambda_i d_i)`,
:math:`\tilde\lambda_i = \lambda_i/(1 + \lambda_i d_i)` (:func:`~gpytorch_augment.core.noisy_tilts`), whose constant
:math:`c_i` depends on :math:`\theta` through :math:`d_i` and must stay in the density; step 3 draws :math:`v`, then
each :math:`f_i` from its tilted conditional (:func:`~gpytorch_augment.core.tilted_conditional`). The chains record
:math:`u` at their own :math:`\theta` (``ChainState.u``).

**Latent blocks** (``target.blocks``, e.g. the heteroscedastic likelihoods). For each block :math:`b` in turn: step 1;
step 2 on :math:`p(\theta \mid \Omega, f_{-b}, y)`, the other latents' prior density at their current values
(:func:`~gpytorch_augment.core.gaussian_log_density`) times block :math:`b`'s collapsed marginal; step 3 for
:math:`f_b` only -- a valid partially collapsed Gibbs step per block. Inducing points with latent blocks are refused
(the other blocks' density has no :math:`O(NM^2)` form there).

The derivations of both, and why each order is valid: :doc:`/maths/engines` ("Sampling the prior's
hyper-parameters"). The kernel is composed of the collapsed density of :math:`\theta`
(:mod:`~gpytorch_augment.inference.gibbs.collapsed_density`), its moves (step 2,
:mod:`~gpytorch_augment.inference.gibbs.theta_moves`), the optional surrogate-data move
(:mod:`~gpytorch_augment.inference.gibbs.surrogate`) and the optional latent moves
(:mod:`~gpytorch_augment.inference.gibbs.latent_moves`); this module holds the transition, the latents' draw (step
3), the run's state and its continuation.

**Cost.** An HMC move takes :math:`\lceil uT/\varepsilon\rceil` leapfrog steps, each one factorisation of
:math:`I + SK_\theta S` and one vector-Jacobian product through the prior's mean and kernel, then the two
factorisations (:math:`K_\theta + \epsilon I` and :math:`B`) of step 3 at the new :math:`\theta`; a slice move
evaluates the collapsed density some 4-8 times (two factorisations each), against one factorisation for a sweep at
fixed :math:`\theta`. Every :math:`O(N^3)`. A proposal whose :math:`K_\theta + \epsilon I` cannot be factorised
has density 0. **Why HMC is the default.** The slice move follows one random direction per transition, so with
:math:`P` hyper-parameters (ARD: one lengthscale per input) it needs of order :math:`P^2` transitions per
independent draw, where HMC's gradient moves all of them at once (the measurements: ``benchmarks/README.md``,
``fully_bayesian.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from torch import Tensor

from ...core import WhitenedGaussian, tilted_conditional
from ...core.prior import FactorizationError, with_linalg_advice
from ..mcmc.hmc_move import HMCMove
from ..mcmc.kernel import MCMCKernel
from ..mcmc.prior_parameters import PriorParameters
from ..mcmc.slice import MAX_STEPS_OUT, SliceMove
from ..mcmc.state import ChainState
from ..mcmc.target import PosteriorTarget
from .hyper_state import HyperChains, PriorAt, chain_likelihood
from .kernel import GibbsKernel
from .latent_moves import LatentMoves
from .surrogate import surrogate_move
from .theta_moves import HMC_MAX_STEPS, THETA_SAMPLERS, ThetaMoves, running_width

__all__ = [
    "DEFAULT_INIT_SPREAD", "DEFAULT_SLICE_WIDTH", "HYPER_KERNEL_NAME", "HyperChains", "HyperparameterGibbsKernel",
    "PriorAt",
]  # fmt: skip

#: the slice width a run starts from (raw coordinates, along a unit direction); warm-up adapts it
DEFAULT_SLICE_WIDTH = 1.0
#: a fresh run moves each chain's starting coordinates by a uniform draw within this half-width (log coordinates of
#: positive parameters: a factor within e^{±1}, as Stan's and NumPyro's uniform starts of width 2 per coordinate)
DEFAULT_INIT_SPREAD = 1.0
#: the kernel's name (``PosteriorSamples.f_update`` of its draws)
HYPER_KERNEL_NAME = "hyper"
#: the least expected augmented precision the surrogate move's noise is computed from (its noise is at most the
#: inverse)
MIN_PRECISION = 1e-6


class HyperparameterGibbsKernel(ThetaMoves, LatentMoves, MCMCKernel[HyperChains]):
    r"""Blocked Gibbs over :math:`(\Omega, \theta, f)`: :math:`\Omega \mid f` (and the likelihood's constants), then
    :math:`\theta \mid \Omega` with :math:`f` integrated out (HMC or slice sampling), then
    :math:`f \mid \theta, \Omega` (the module docstring has the maths and why the order matters).

    :param target: the :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget`: the exact model or inducing points,
        a likelihood with or without ``latent_blocks`` (not both inducing points and blocks).
    :param theta_sampler: ``"hmc"`` (default): Hamiltonian Monte Carlo on :math:`p(\theta \mid \Omega, y)`
        (:meth:`theta_hmc`), its step sizes (dual averaging), trajectory length (ChEES) and a diagonal scale of the
        coordinates adapted in warm-up; ``"slice"``: the random-direction slice move (:meth:`theta_slice`; no
        gradients, one random direction per transition).
    :param slice_width: the width the slice moves start from (coordinates of
        :class:`~gpytorch_augment.inference.mcmc.prior_parameters.PriorParameters`, along a unit direction); a run with
        warm-up adapts it (the running mean of three times the distance moved, pooled over chains), a run without
        warm-up keeps it (or the width of its ``init`` state, ``ChainState.step_size``).
    :param max_steps_out: Neal's :math:`m`, the most steps of the stepping-out procedure.
    :param adapt_width: adapt the width in warm-up.
    :param max_steps: the most leapfrog steps of one HMC trajectory.
    :param surrogate: begin every transition with the surrogate-data move of :math:`(\theta, f)`, :math:`\Omega`
        integrated out (:mod:`~gpytorch_augment.inference.gibbs.surrogate`), which lets :math:`\theta` cross
        :math:`p(\theta \mid y)` where :math:`\Omega` pins it (e.g. large counts); ``"warmup"``: in warm-up only, to
        converge. It costs some 5-7 more evaluations per transition, so it is off by default; the exact model with
        pointwise observations only.
    :param latent_moves: begin every transition with this many HMC moves of the whitened latents on
        :math:`p(f \mid \theta, y)`, :math:`\Omega` integrated out
        (:mod:`~gpytorch_augment.inference.gibbs.latent_moves`), which cross the directions where :math:`\Omega`
        pins the latents (e.g. the logistic-softmax likelihood); the exact model with pointwise observations only.
        Default 0: where the augmented draw mixes, they cost time for nothing.
    :param init_spread: a fresh run (no ``init`` state) moves each chain's starting coordinates by a uniform draw
        within :math:`\pm` this (:meth:`overdisperse`; log coordinates for positive parameters), so that
        :math:`\hat R` compares chains that did not start together; 0: every chain starts at the model's values.

    :raises ValueError: with inducing points *and* a likelihood with ``latent_blocks``, for a parameter that requires
        grad without a prior (:class:`PriorParameters`), an unknown ``theta_sampler``, a
        non-positive width, ``surrogate=True`` or ``latent_moves > 0`` with inducing points or linear observations, or
        a negative or non-integer ``latent_moves``, or a negative ``init_spread``.

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
        theta_sampler: str = "hmc",
        max_steps: int = HMC_MAX_STEPS,
        surrogate: bool | str = False,
        latent_moves: int = 0,
        init_spread: float = DEFAULT_INIT_SPREAD,
    ) -> None:
        #: run the surrogate-data move of (θ, f) first in every transition (:mod:`.surrogate`)
        self.surrogate = surrogate
        self._check_surrogate(target)
        #: HMC moves of the whitened latents on p(f | θ, y) at the start of every transition (:mod:`.latent_moves`)
        self.latent_moves = latent_moves
        self._check_latent_moves(target)
        #: a fresh run moves each chain's starting coordinates by U(-s, s) (:meth:`overdisperse`)
        self.init_spread = init_spread
        self._check_init_spread()
        if theta_sampler not in THETA_SAMPLERS:
            raise ValueError(f"theta_sampler must be one of {THETA_SAMPLERS}, got {theta_sampler!r}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
        self.theta_sampler, self.max_steps = theta_sampler, max_steps
        if target.is_sparse and target.blocks is not None:
            raise ValueError(
                f"sample_hyperparameters=True with inducing_points does not support {type(target.likelihood).__name__}"
                ", whose latents are drawn in blocks (latent_blocks): the other blocks' prior density at their "
                "current values has no O(NM^2) form in the inducing-point model; drop inducing_points"
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
        self._evaluations = self._latent_evaluations = 0

    def _check_init_spread(self) -> None:
        s = self.init_spread
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not (math.isfinite(s) and s >= 0):
            raise ValueError(f"init_spread must be a non-negative number, got {s!r}")

    def _check_surrogate(self, target: PosteriorTarget) -> None:
        if not (isinstance(self.surrogate, bool) or self.surrogate == "warmup"):
            raise ValueError(f"surrogate must be True, False or 'warmup', got {self.surrogate!r}")
        if self.surrogate and (target.is_sparse or target.design is not None):
            raise ValueError(
                f"surrogate={self.surrogate!r} needs the exact model with pointwise observations: the surrogate-data "
                "move is not implemented with inducing_points or linear observations; leave surrogate=False"
            )

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

    # ------------------------------------------------------------------ the MCMCKernel protocol
    @with_linalg_advice("sampling the hyper-parameters")
    @torch.no_grad()
    def init(self, f: Tensor, y: Tensor, state: ChainState | None, num_warmup: int) -> HyperChains:
        C, target = f.shape[0], self.target
        self._check_surrogate(target)
        self._check_latent_moves(target)
        self._check_init_spread()
        names = {p.name for p in self.hyperparameters.parameters}
        hyper = dict(state.hyper) if state is not None else {}
        theta_values = {k: v for k, v in hyper.items() if k in names}
        constants: dict[str, Tensor] = {}
        if self.gibbs.samples_constants and state is not None:
            lik = {k: v for k, v in hyper.items() if k not in names}
            constants = target.initial_constants(dataclasses.replace(state, hyper=lik))
        theta = self._initial_theta(theta_values, state, C)
        prior = self._prior(theta)
        ok, log_prior = prior.ok, prior.log_prior
        if not bool(ok.all()):
            raise FactorizationError(
                f"the prior covariance K + jitter I (K_ZZ + jitter I with inducing points) at the starting "
                f"hyper-parameters of chains "
                f"{torch.nonzero(~ok).flatten().tolist()} is not positive definite: raise the jitter (jitter=) or "
                "start from other hyper-parameters"
            )
        if not bool(torch.isfinite(log_prior).all()):
            raise ValueError(
                "the prior density of the starting hyper-parameters is zero (or not finite): start the model's "
                "parameters inside the support of their priors"
            )
        width, scale, length = self._initial_tuning(theta, state, num_warmup)
        noise, surrogate_width = self._initial_surrogate(f, y, constants, state)
        latent_step = self._initial_latent_step(f, state.tuning if state is not None else {}, num_warmup)
        self._precision_sum, self._precision_count = None, 0
        return HyperChains(
            f, {}, constants, y, theta, prior.mean, prior.A, log_prior, width, 0, scale, length, prior.d, prior.mu_Z,
            prior.L, None, noise, surrogate_width, latent_step,
        )  # fmt: skip

    @with_linalg_advice("sampling the hyper-parameters")
    @torch.no_grad()
    def overdisperse(self, chains: HyperChains, generator: torch.Generator | None) -> HyperChains:
        r"""A fresh run's starting hyper-parameters spread over the chains: each coordinate of each chain moved by
        :math:`\mathcal U(-s, s)`, :math:`s` = ``init_spread`` (0: every chain at the model's values), so that
        :math:`\hat R` can see chains that settle in different modes (an input relevant in one, not in another). A
        chain whose moved coordinates have no factorisation or zero prior density keeps the model's values."""
        if self.init_spread == 0:
            return chains
        theta = chains.theta
        u = torch.rand(theta.shape, generator=generator, dtype=theta.dtype, device=theta.device)
        moved = theta + (2.0 * u - 1.0) * self.init_spread
        prior = self._prior(moved)
        ok = prior.ok & torch.isfinite(prior.log_prior)

        def pick(new: Tensor | None, old: Tensor | None) -> Tensor | None:
            if new is None or old is None:
                return old
            return torch.where(ok.reshape((-1,) + (1,) * (new.dim() - 1)), new, old)

        return chains._replace(
            theta=pick(moved, theta), mean=pick(prior.mean, chains.mean), A=pick(prior.A, chains.A),
            log_prior=pick(prior.log_prior, chains.log_prior), d=pick(prior.d, chains.d),
            mu_Z=pick(prior.mu_Z, chains.mu_Z), L=pick(prior.L, chains.L),
        )  # fmt: skip

    def _initial_surrogate(
        self, f: Tensor, y: Tensor, constants: dict[str, Tensor], state: ChainState | None
    ) -> tuple[Tensor | None, Tensor | None]:
        r"""The surrogate move's noise :math:`S` (T, N) and width (C,) a run starts from: its ``init`` state's
        (``ChainState.tuning``, where their shapes fit and they are positive and finite), else
        :math:`1 / E[\lambda \mid f, y]` at the starting latents (averaged over the chains) and
        :data:`DEFAULT_SLICE_WIDTH`; ``(None, None)`` without the move."""
        if not self.surrogate:
            return None, None
        C = f.shape[0]
        tuning = state.tuning if state is not None else {}
        noise, width = tuning.get("surrogate_noise"), tuning.get("surrogate_width")
        fits = isinstance(noise, Tensor) and noise.shape == f.shape[1:] and isinstance(width, Tensor)
        valid = fits and width.numel() == 1 and bool((torch.isfinite(noise) & (noise > 0)).all())
        if valid and math.isfinite(float(width)) and float(width) > 0:
            return noise.to(f).clone(), width.to(f).reshape(1).expand(C).clone()
        return 1.0 / self.expected_precision(f, y, constants), f.new_full((C,), self.slice_width)

    def log_likelihood(self, chains: HyperChains) -> Callable[[Tensor, Tensor], Tensor]:
        r"""``log_lik(f, index)``: :math:`\log p(y \mid f)` ``(n,)`` of the chains ``index`` ``(n,)`` at latents
        ``f`` ``(n, T, N)``, under their targets and sampled constants."""
        target = self.target

        def log_lik(f: Tensor, index: Tensor) -> Tensor:
            y, constants = chain_likelihood(target, chains, index)
            with constants:
                value = target.likelihood.log_prob_at(y, target.to_likelihood(f))
            return value.reshape(f.shape[0], -1).sum(-1).to(f.dtype)

        return log_lik

    def expected_precision(self, f: Tensor, y: Tensor, constants: dict[str, Tensor]) -> Tensor:
        r""":math:`E[\lambda \mid f, y]`, the augmented precision's mean given the latents ``f`` (C, T, N), averaged
        over the chains and bounded below by :data:`MIN_PRECISION`: (T, N)."""
        target, likelihood = self.target, self.target.likelihood
        f_lik = target.to_likelihood(f)
        zero = torch.zeros_like(f_lik)
        with target.constants(constants):
            q_aux = likelihood.aux_posterior(y, f_lik, zero)
            _, lam = likelihood.expected_potential_and_precision(y, q_aux, f_lik, zero)
        return target.from_likelihood(lam, f.shape).mean(0).clamp_min(MIN_PRECISION)

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
        if self.surrogate is True or (self.surrogate == "warmup" and adapt):
            chains = self.surrogate_step(chains, generator, adapt)
        if self.latent_moves:
            chains = self.latent_step(chains, generator, adapt)
        moves: list[HMCMove | SliceMove] = []
        for block in self.target.blocks or [None]:
            aux, constants, h, lam = self.gibbs.conditional_tilts(chains.f, chains.y, generator, chains.constants)
            move = self.theta_move(chains, h, lam, generator, block=block)
            mean, A, log_prior, theta1, C, *extras = move.payload
            prior = PriorAt(mean, A, log_prior, None, *extras)
            q = WhitenedGaussian(theta1, C)
            if block is None:
                f, v = self._latents(prior, q, h, lam, generator)
            else:
                picked = list(block)
                f_b = self.latent_draw(mean[:, picked], A[:, picked], q, generator)
                f, v = chains.f.clone(), None
                f[:, picked] = f_b
            chains = chains._replace(
                f=f, aux=aux, constants=constants, theta=move.x, mean=mean, A=A, log_prior=log_prior,
                d=prior.d, mu_Z=prior.mu_Z, L=prior.L, v=v,
            )  # fmt: skip
            if isinstance(move, HMCMove):
                self._divergences += int(move.diverged.sum())
                self._accepted += float(move.accept_prob.mean()) / len(self.target.blocks or [None])
            moves.append(move)
        return self._adapted(chains, moves) if adapt else chains

    def surrogate_step(self, chains: HyperChains, generator: torch.Generator | None, adapt: bool) -> HyperChains:
        r"""The surrogate-data move of :math:`(\theta, f)` (:func:`~.surrogate.surrogate_move`), :math:`\Omega`
        integrated out: a slice move in the coordinates scaled by the HMC move's adapted scale (ones with
        ``theta_sampler="slice"``), whatever the kernel's ``theta_sampler`` (a slice move costs fewer evaluations, and
        HMC with autograd's gradient mixed no better per second in the pilots of ``benchmarks/README.md``). In warm-up
        (``adapt``) the width becomes the running mean of three times the distance moved (pooled over the chains, as
        the slice move's), and :math:`S` the inverse of :meth:`expected_precision` averaged over the warm-up
        iterations so far, restarted at half the warm-up; both are fixed afterwards."""
        def collapsed(prior: PriorAt, h: Tensor, lam: Tensor) -> tuple[Tensor, WhitenedGaussian]:
            return self._collapsed(prior.mean, prior.A, prior.log_prior, prior.ok, h, lam)

        move = surrogate_move(chains.theta, chains.f, chains.prior, chains.noise, self._prior, collapsed,
                              self.log_likelihood(chains), chains.surrogate_width, generator, self.max_steps_out,
                              chains.scale)  # fmt: skip
        self._evaluations += move.evaluations
        f, mean, A, log_prior = move.payload
        chains = chains._replace(theta=move.x, f=f, mean=mean, A=A, log_prior=log_prior)
        if not adapt:
            return chains
        done = chains.adapted
        if done == self._num_warmup // 2:
            self._precision_sum, self._precision_count = None, 0
        precision = self.expected_precision(f, chains.y, chains.constants)
        self._precision_sum = precision if self._precision_sum is None else self._precision_sum + precision
        self._precision_count += 1
        return chains._replace(
            surrogate_width=running_width(chains.surrogate_width, done, move.t.abs().mean()),
            noise=self._precision_count / self._precision_sum,
        )

    @staticmethod
    def latent_draw(mean: Tensor, A: Tensor, q: WhitenedGaussian, generator: torch.Generator | None) -> Tensor:
        r"""Step 3: :math:`f = \mu + A^\top v`, :math:`v \sim q(v) = \mathcal N(B^{-1}b, B^{-1})` (per chain)."""
        eps = torch.randn(q.theta1.shape, generator=generator, dtype=q.theta1.dtype, device=q.theta1.device)
        return mean + (q.draw(eps).unsqueeze(-2) @ A).squeeze(-2)

    def _latents(
        self, prior: PriorAt, q: WhitenedGaussian, h: Tensor, lam: Tensor, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor | None]:
        r"""Step 3 for all latents: ``(f, None)`` (exact, :meth:`latent_draw`), or with inducing points ``(f, v)``:
        :math:`v \sim q(v)`, then :math:`f_i \sim p(f_i \mid u, \Omega) \propto \mathcal N(f_i \mid m_i, d_i)\,
        e^{h_i f_i - \frac12\lambda_i f_i^2}`, :math:`m_i = \mu_i + a_i^\top v` (:func:`tilted_conditional
        <gpytorch_augment.core.tilted_conditional>`)."""
        if prior.d is None:
            return self.latent_draw(prior.mean, prior.A, q, generator), None
        eps = torch.randn(q.theta1.shape, generator=generator, dtype=q.theta1.dtype, device=q.theta1.device)
        v = q.draw(eps)
        m = prior.mean + (v.unsqueeze(-2) @ prior.A).squeeze(-2)
        mean, var = tilted_conditional(m, prior.d, h, lam)
        eps_f = torch.randn(m.shape, generator=generator, dtype=m.dtype, device=m.device)
        return mean + var.sqrt() * eps_f, v

    def finish(self, chains: HyperChains, num_kept_iterations: int) -> None:
        total = max(1, chains.adapted + num_kept_iterations)
        self.last_run = {"evaluations_per_step": self._evaluations / total}
        if self.latent_moves:
            self.last_run.update(latent_evaluations_per_step=self._latent_evaluations / total,
                                 latent_step_size=float(chains.latent_step.mean()))  # fmt: skip
        if self.theta_sampler == "hmc":
            self.last_run.update(step_size=float(chains.width.mean()), trajectory_length=chains.length,
                                 acceptance=self._accepted / total, divergences=self._divergences)  # fmt: skip
        else:
            self.last_run["slice_width"] = float(chains.width.mean())
        if self.surrogate:
            self.last_run["surrogate_width"] = float(chains.surrogate_width.mean())

    def last_state(self, chains: HyperChains) -> ChainState:
        """The latents, the last Ω draw, and in ``hyper`` the likelihood's sampled constants and the prior's
        hyper-parameters (constrained, under the model's names, ``(C, *shape)``); the exact coordinates
        (``coordinates``, ``(1, C, P)``) and the slice widths (``step_size``) let a run continue bit for bit."""
        target, C = self.target, chains.f.shape[0]
        theta = {k: v.to(target.dtype) for k, v in self.hyperparameters.constrained(chains.theta).items()}
        u = None
        if chains.v is not None:  # u = mu_Z + L v at the chains' own θ
            u = target.to_storage(chains.mu_Z + (chains.L @ chains.v.unsqueeze(-1)).squeeze(-1)).to(target.dtype)
        return ChainState(
            f=target.to_storage(chains.f).to(target.dtype),
            u=u,
            aux={k: target.chain_batched(val, C) for k, val in chains.aux.items()},
            hyper={**self.gibbs._constants_snapshot(chains.constants, C), **theta},
            step_size=chains.width.clone(),
            trajectory_length=chains.length if self.theta_sampler == "hmc" else None,
            scale=chains.scale.clone() if self.theta_sampler == "hmc" and chains.scale is not None else None,
            coordinates=chains.theta.unsqueeze(0).clone(),
            tuning=self._tuning(chains),
        )  # fmt: skip

    @staticmethod
    def _tuning(chains: HyperChains) -> dict[str, Tensor]:
        """What a continued run needs beside the step sizes: the surrogate move's noise and width, the latent moves'
        step sizes (per chain)."""
        tuning = {}
        if chains.noise is not None:
            tuning.update(surrogate_noise=chains.noise.clone(), surrogate_width=chains.surrogate_width.mean().clone())
        if chains.latent_step is not None:
            tuning["latent_step_size"] = chains.latent_step.clone()
        return tuning
