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
from typing import NamedTuple

import torch
from torch import Tensor

from ...core import WhitenedGaussian, collapsed_log_marginal
from ...core.collapsed import collapsed_marginal_adjoints
from ...core.linalg import add_to_diagonal
from ...core.prior import FactorizationError, with_linalg_advice
from ...likelihoods.augmented_likelihood import AuxDict
from ..hmc.adaptation import ChEESAdaptation, DualAveraging
from ..mcmc.hmc_move import HMCMove, hmc_move
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
#: the samplers of θ (``theta_sampler=``)
THETA_SAMPLERS = ("hmc", "slice")
#: HMC on θ: the step size and the trajectory length a run starts from, the bounds of the ChEES length, the most
#: leapfrog steps of a trajectory, the target acceptance, and the warm-up fractions at whose ends the scale is
#: re-estimated (from the chains' draws since the previous end)
HMC_STEP, HMC_LENGTH, HMC_LENGTH_BOUNDS, HMC_MAX_STEPS, HMC_TARGET = 0.2, 1.0, (0.1, 10.0), 32, 0.8
HMC_WINDOWS = (0.15, 0.4, 0.75)


class HyperChains(NamedTuple):
    """The chains of :class:`HyperparameterGibbsKernel` between transitions: latents ``f`` (C, T, N), the last
    :math:`\\Omega` draw ``aux``, the likelihood's sampled ``constants``, the targets ``y``, the coordinates
    ``theta`` (C, P) and the prior at them (``mean`` (C, T, N), ``A`` = :math:`L^\\top` (C, T, N, N),
    ``log_prior`` (C,)), the slice ``width`` (C,) (HMC: the step sizes), the warm-up iterations adapted so far
    (``adapted``), and HMC's ``scale`` (P,) and trajectory ``length``."""

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
    scale: Tensor | None = None
    length: float = HMC_LENGTH


class HyperparameterGibbsKernel(MCMCKernel[HyperChains]):
    r"""Blocked Gibbs over :math:`(\Omega, \theta, f)`: :math:`\Omega \mid f` (and the likelihood's constants), then
    :math:`\theta \mid \Omega` with :math:`f` integrated out (slice sampling), then :math:`f \mid \theta, \Omega` (the
    module docstring has the maths and why the order matters).

    :param target: the :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget` (exact model; a likelihood without
        ``latent_blocks``).
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

    :raises ValueError: with inducing points or a likelihood with ``latent_blocks`` (not supported yet), for a
        parameter that requires grad without a prior (:class:`PriorParameters`), an unknown ``theta_sampler``, or a
        non-positive width.

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
    ) -> None:
        likelihood = type(target.likelihood).__name__
        if theta_sampler not in THETA_SAMPLERS:
            raise ValueError(f"theta_sampler must be one of {THETA_SAMPLERS}, got {theta_sampler!r}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
        self.theta_sampler, self.max_steps = theta_sampler, max_steps
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
        return HyperChains(f, {}, constants, y, theta, mean, A, log_prior, width, 0, scale, length)

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
        chains = chains._replace(f=f, aux=aux, constants=constants, theta=move.x, mean=mean, A=A, log_prior=log_prior)
        if isinstance(move, HMCMove):
            self._divergences += int(move.diverged.sum())
            self._accepted += float(move.accept_prob.mean())
        return self._adapted(chains, move) if adapt else chains

    def _adapted(self, chains: HyperChains, move: HMCMove | SliceMove) -> HyperChains:
        """The warm-up adaptation after a move. Slice: the width, the running mean of three times the distance moved
        (pooled over chains). HMC: the step sizes by dual averaging, the trajectory length by ChEES, the scale from
        the pooled variance of the chains' draws at the ends of the windows :data:`HMC_WINDOWS` (Stan's
        regularisation towards :math:`10^{-3}`), each end restarting the dual averaging."""
        adapted = chains.adapted + 1
        if isinstance(move, SliceMove):
            if not self.adapt_width:
                return chains
            pooled = (chains.width.mean() * adapted + 3.0 * move.t.abs().mean()) / (adapted + 1)
            return chains._replace(width=pooled.clamp(*WIDTH_BOUNDS).expand_as(chains.width).clone(), adapted=adapted)
        self._dual.update(move.accept_prob)
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
        self, chains: HyperChains, h: Tensor, lam: Tensor, generator: torch.Generator | None
    ) -> HMCMove | SliceMove:
        r"""Step 2, the move of :math:`\theta` on :math:`p(\theta \mid \Omega, y)` for the tilts ``h``, ``lam``
        (C, T, n) (:meth:`theta_hmc` or :meth:`theta_slice`); its payload holds the prior and :math:`q(v)` at the
        new :math:`\theta`: ``(mean, A, log_prior, theta1, C)``."""
        if self.theta_sampler == "hmc":
            return self.theta_hmc(chains, h, lam, generator)
        return self.theta_slice(chains, h, lam, generator)

    def theta_hmc(self, chains: HyperChains, h: Tensor, lam: Tensor, generator: torch.Generator | None) -> HMCMove:
        r"""Step 2 by HMC on :math:`\log p(\theta \mid \Omega, y)` for the tilts ``h``, ``lam`` (C, T, n), the
        integration time :math:`uT`, :math:`u \sim \mathcal U(0, 1)` shared by the chains; the payload as
        :meth:`theta_move`'s, computed once at the chains' new :math:`\theta`.

        Each leapfrog step evaluates the collapsed marginal and its gradient from :math:`B = I + SKS` and the adjoints
        of :math:`(\mu, K)` (:func:`~gpytorch_augment.core.collapsed.collapsed_marginal_adjoints`): one
        factorisation and one vector-Jacobian product through the prior's mean and kernel, never through a
        factorisation. With linear observations (``design``) autograd differentiates the factor form instead."""
        target, params = self.target, self.hyperparameters

        def log_density(theta: Tensor, index: Tensor) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
            with torch.enable_grad():
                th = theta.detach().requires_grad_(True)
                mean, covar, log_prior = params.evaluate(th, grad=True)
                if target.design is None:
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
                    K = add_to_diagonal((covar + covar.mT) / 2, target.jitter)
                    L, info = torch.linalg.cholesky_ex(K)
                    factorised = info == 0
                    L = torch.where(factorised[..., None, None], L, torch.eye(K.shape[-1], dtype=K.dtype))
                    ok = factorised.reshape(theta.shape[0], -1).all(-1)
                    log_p, _ = self._collapsed(mean, L.mT, log_prior, ok, h[index], lam[index])
                    ok = torch.isfinite(log_p)
                    (grad,) = torch.autograd.grad(torch.where(ok, log_p, torch.zeros_like(log_p)).sum(), th)
                    log_p = log_p.detach()
            return torch.where(ok, log_p, torch.full_like(log_p, -math.inf)), grad, ()

        index = torch.arange(chains.theta.shape[0], device=chains.theta.device)
        log_p0, grad0, _ = log_density(chains.theta, index)
        u = float(torch.rand((), generator=generator, dtype=chains.theta.dtype, device=chains.theta.device))
        move = hmc_move(chains.theta, log_p0, grad0, (), log_density, chains.scale, chains.width,
                        u * chains.length, generator, self.max_steps)  # fmt: skip
        mean, A, log_prior, ok = self._prior(move.x)
        _, q = self._collapsed(mean, A, log_prior, ok, h, lam)
        self._evaluations += move.evaluations + 2
        return move._replace(payload=(mean, A, log_prior, q.theta1, q.C))

    def theta_slice(self, chains: HyperChains, h: Tensor, lam: Tensor, generator: torch.Generator | None) -> SliceMove:
        r"""Step 2 by the random-direction slice move (:mod:`~gpytorch_augment.inference.mcmc.slice`); the payload as
        :meth:`theta_move`'s."""
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
        self.last_run = {"evaluations_per_step": self._evaluations / total}
        if self.theta_sampler == "hmc":
            self.last_run.update(step_size=float(chains.width.mean()), trajectory_length=chains.length,
                                 acceptance=self._accepted / total, divergences=self._divergences)  # fmt: skip
        else:
            self.last_run["slice_width"] = float(chains.width.mean())

    def last_state(self, chains: HyperChains) -> ChainState:
        """The latents, the last Ω draw, and in ``hyper`` the likelihood's sampled constants and the prior's
        hyper-parameters (constrained, under the model's names, ``(C, *shape)``); the exact coordinates
        (``coordinates``, ``(1, C, P)``) and the slice widths (``step_size``) let a run continue bit for bit."""
        target, C = self.target, chains.f.shape[0]
        theta = {k: v.to(target.dtype) for k, v in self.hyperparameters.constrained(chains.theta).items()}
        return ChainState(
            f=target.to_storage(chains.f).to(target.dtype),
            aux={k: target.chain_batched(val, C) for k, val in chains.aux.items()},
            hyper={**self.gibbs._constants_snapshot(chains.constants, C), **theta},
            step_size=chains.width.clone(),
            trajectory_length=chains.length if self.theta_sampler == "hmc" else None,
            scale=chains.scale.clone() if self.theta_sampler == "hmc" and chains.scale is not None else None,
            coordinates=chains.theta.unsqueeze(0).clone(),
        )
