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

**Inducing points** (``target.is_sparse``). The model sampled is the inducing-point prior at every :math:`\theta`:
:math:`u = \mu_Z + L_Z v`, :math:`v \sim \mathcal N(0, I)`, :math:`L_Z = \mathrm{chol}(K_{ZZ} + \epsilon I)`, and
independently :math:`f_i \mid u \sim \mathcal N(m_i, d_i)`, :math:`m_i = \mu_i + a_i^\top v`,
:math:`A = L_Z^{-1}K_{ZX}` (M x N), :math:`d_i = \max(k_{ii} - \lVert a_i\rVert^2 - \epsilon, 0)`
(:func:`~gpytorch_augment.inference.mcmc.target.conditional_variances`; FITC's prior, the one the target's
``initial_f`` draws from). The inducing inputs are fixed, not sampled. Given :math:`\Omega` both :math:`f` and
:math:`u` integrate out. Per datum, completing the square in :math:`f_i` (precision
:math:`P = 1/d_i + \lambda_i = (1 + \lambda_i d_i)/d_i`, linear coefficient :math:`m_i/d_i + h_i`):

.. math::
    \int \mathcal N(f_i \mid m_i, d_i)\, e^{h_i f_i - \frac12\lambda_i f_i^2}\, df_i
    = (d_iP)^{-\frac12} e^{\frac{(m_i/d_i + h_i)^2}{2P} - \frac{m_i^2}{2d_i}}
    = e^{c_i}\, e^{\tilde h_i m_i - \frac12\tilde\lambda_i m_i^2},

:math:`\tilde h_i = h_i/(1 + \lambda_i d_i)`, :math:`\tilde\lambda_i = \lambda_i/(1 + \lambda_i d_i)`,
:math:`c_i = \frac{h_i^2 d_i}{2(1 + \lambda_i d_i)} - \frac12\log(1 + \lambda_i d_i)` (at :math:`d_i = 0` the tilt
itself), so :math:`p(\theta \mid \Omega, y) \propto p(\theta)\, e^{\sum_i c_i}\, Z(\theta)` with :math:`Z` the
collapsed marginal above for :math:`(A, \mu_X)` and the tilts :math:`(\tilde h, \tilde\lambda)`
(:func:`~gpytorch_augment.core.collapsed_log_marginal` with ``d``; :math:`B` is M x M). :math:`c_i` depends on
:math:`\theta` through :math:`d_i`: dropping it samples a wrong :math:`\theta` (the Geweke test fails). Step 3 draws
:math:`v \sim \mathcal N(B^{-1}b, B^{-1})` from the same factorisation, then
:math:`f_i \sim p(f_i \mid u, \Omega) = \mathcal N\big(\frac{m_i + h_i d_i}{1 + \lambda_i d_i},
\frac{d_i}{1 + \lambda_i d_i}\big)` (:func:`~gpytorch_augment.core.tilted_conditional`), the full conditional. So the
chain is the exact partially collapsed Gibbs sampler of :math:`p(\theta, u, f \mid y)` in this model -- not the
fixed-:math:`\theta` inducing-point sweep, whose :math:`f_i \sim p(f_i \mid u)` ignores the tilt and whose ``alpha``
does not apply here. The chains record :math:`u = \mu_Z + L_Z v` at their own :math:`\theta` (``ChainState.u``).

**Latent blocks** (``target.blocks``, e.g. the heteroscedastic likelihoods). :math:`\Omega` is redrawn before each
block and a block's tilts depend on the other blocks' latents, so :math:`f` does not integrate out jointly. For each
block :math:`b` in turn: step 1; step 2 on

.. math::
    p(\theta \mid \Omega, f_{-b}, y) \propto p(\theta) \prod_{t \notin b}
    \mathcal N(f_t \mid \mu_{\theta,t}, K_{\theta,t} + \epsilon I)\ Z_b(\theta),

the other latents' prior density at their current values (independent latents: the prior factorises over
:math:`t`; :func:`~gpytorch_augment.core.gaussian_log_density` with the factor :math:`L_{\theta,t}` already computed
for the proposal) times block :math:`b`'s collapsed marginal with its tilts; step 3 for :math:`f_b` only. Steps 2 and
3 leave :math:`p(\theta, f_b \mid \Omega, f_{-b}, y)` invariant by the argument above with :math:`f_{-b}` fixed: a
valid partially collapsed Gibbs step per block. (A block whose tilt is collapsed over part of :math:`\Omega`, as the
heteroscedastic mean block is, samples that part too and discards it; the next block's step 1 redraws it.) Inducing
points with latent blocks are refused: the other blocks' density has no :math:`O(NM^2)` form there.

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

from ...core import WhitenedGaussian, collapsed_log_marginal, gaussian_log_density, tilted_conditional
from ...core.linalg import add_to_diagonal, tri_solve
from ...core.prior import FactorizationError, with_linalg_advice
from ...likelihoods.augmented_likelihood import AuxDict
from ..mcmc.kernel import MCMCKernel
from ..mcmc.prior_parameters import PriorParameters
from ..mcmc.slice import MAX_STEPS_OUT, LogDensity, SliceMove, slice_move
from ..mcmc.state import ChainState
from ..mcmc.target import PosteriorTarget, conditional_variances
from .kernel import GibbsKernel

__all__ = ["DEFAULT_SLICE_WIDTH", "HYPER_KERNEL_NAME", "HyperChains", "HyperparameterGibbsKernel", "PriorAt"]

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
    ``log_prior`` (C,)), the slice ``width`` (C,) and the warm-up iterations it has averaged (``adapted``).
    Inducing-point model: ``A`` = :math:`L_Z^{-1}K_{ZX}` (C, T, M, N), and at the same :math:`\\theta` the
    variances ``d`` (C, T, N) of :math:`p(f_i \\mid u)`, ``mu_Z`` (C, T, M), ``L`` = chol(K_ZZ + jitter I)
    (C, T, M, M), with the whitened inducing values ``v`` (C, T, M) of the last draw (``None`` before one)."""

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
    d: Tensor | None = None
    mu_Z: Tensor | None = None
    L: Tensor | None = None
    v: Tensor | None = None

    @property
    def prior(self) -> PriorAt:
        """The prior at the chains' :math:`\\theta` (``ok`` ``None``: it was factorised when accepted)."""
        return PriorAt(self.mean, self.A, self.log_prior, None, self.d, self.mu_Z, self.L)


class PriorAt(NamedTuple):
    """The prior at a batch of coordinates (n, P): ``mean`` :math:`\\mu_X` (n, T, N), ``A`` (exact:
    :math:`L^\\top`, (n, T, N, N); inducing points: :math:`L_Z^{-1}K_{ZX}`, (n, T, M, N)), ``log_prior`` (n,),
    ``ok`` (n,) where every factorisation succeeded (``None``: known to), and for the inducing-point model ``d``,
    ``mu_Z``, ``L`` (see :class:`HyperChains`)."""

    mean: Tensor
    A: Tensor
    log_prior: Tensor
    ok: Tensor | None
    d: Tensor | None = None
    mu_Z: Tensor | None = None
    L: Tensor | None = None

    def extras(self) -> tuple[Tensor, ...]:
        """``(d, mu_Z, L)`` of the inducing-point model, else ``()`` (the tail of a slice move's payload)."""
        return () if self.d is None else (self.d, self.mu_Z, self.L)


class HyperparameterGibbsKernel(MCMCKernel[HyperChains]):
    r"""Blocked Gibbs over :math:`(\Omega, \theta, f)`: :math:`\Omega \mid f` (and the likelihood's constants), then
    :math:`\theta \mid \Omega` with :math:`f` integrated out (slice sampling), then :math:`f \mid \theta, \Omega` (the
    module docstring has the maths and why the order matters).

    :param target: the :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget`: the exact model or inducing points,
        a likelihood with or without ``latent_blocks`` (not both inducing points and blocks).
    :param slice_width: the width the slice moves start from (raw coordinates, along a unit direction); a run with
        warm-up adapts it (the running mean of three times the distance moved, pooled over chains), a run without
        warm-up keeps it (or the width of its ``init`` state, ``ChainState.step_size``).
    :param max_steps_out: Neal's :math:`m`, the most steps of the stepping-out procedure.
    :param adapt_width: adapt the width in warm-up.

    :raises ValueError: with inducing points *and* a likelihood with ``latent_blocks``, for a parameter that requires
        grad without a prior (:class:`PriorParameters`), or a non-positive width.

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
    def _prior(self, theta: Tensor) -> PriorAt:
        r"""The prior at coordinates ``theta`` (n, P) (:class:`PriorAt`): exact, ``A = chol(K + jitter I)ᵀ``;
        inducing points, the target's whitened terms at each :math:`\theta` (:math:`L_Z`, :math:`A`, :math:`d` as
        :meth:`PosteriorTarget.refresh` computes them at the model's). ``ok`` marks the chains whose factorisation
        succeeded."""
        target = self.target
        if target.is_sparse:
            return self._sparse_prior(theta)
        mean, covar, log_prior = self.hyperparameters.evaluate(theta)
        K = add_to_diagonal((covar + covar.mT) / 2, target.jitter)
        L, info = torch.linalg.cholesky_ex(K)
        ok = (info == 0).reshape(theta.shape[0], -1).all(-1)
        return PriorAt(mean, L.mT, log_prior, ok)

    def _sparse_prior(self, theta: Tensor) -> PriorAt:
        target = self.target
        Z, x = target.inducing_points, target.x
        if Z.shape[:-2] != x.shape[:-2]:
            batch = torch.broadcast_shapes(Z.shape[:-2], x.shape[:-2])
            Z, x = Z.expand(*batch, *Z.shape[-2:]), x.expand(*batch, *x.shape[-2:])
        M = Z.shape[-2]
        mean, K_ZZ, K_ZX, k_diag, log_prior = self.hyperparameters.evaluate_blocks(
            theta, torch.cat([Z.to(x), x], dim=-2), M
        )
        L, info = torch.linalg.cholesky_ex(add_to_diagonal((K_ZZ + K_ZZ.mT) / 2, target.jitter))
        ok = (info == 0).reshape(theta.shape[0], -1).all(-1)
        A = tri_solve(L, K_ZX)
        d = conditional_variances(k_diag, A.square().sum(-2), target.jitter)
        return PriorAt(mean[..., M:], A, log_prior, ok, d, mean[..., :M], L)

    def _collapsed(
        self,
        mean: Tensor,
        A: Tensor,
        log_prior: Tensor,
        ok: Tensor | None,
        h: Tensor,
        lam: Tensor,
        d: Tensor | None = None,
        others: Tensor | None = None,
    ) -> tuple[Tensor, WhitenedGaussian]:
        r""":math:`\log p(\theta) + \log Z(\theta)` per chain (``-inf`` where not ``ok`` or not finite) and
        :math:`q(v)`, for the latents whose prior ``mean``, ``A`` (and variances ``d``, inducing points) are given;
        ``others`` adds the log prior density of the other latents at their current values (latent blocks)."""
        design = self.target.design
        A_obs, mean_obs = (A, mean) if design is None else (design.apply(A), design.apply(mean))
        log_z, q = collapsed_log_marginal(A_obs, mean_obs, h, lam, d)
        log_p = log_prior + log_z.sum(-1)
        if others is not None:
            log_p = log_p + others
        valid = torch.isfinite(log_p) if ok is None else torch.isfinite(log_p) & ok
        return torch.where(valid, log_p, torch.full_like(log_p, -math.inf)), q

    def collapsed_density(
        self, chains: HyperChains, h: Tensor, lam: Tensor, block: tuple[int, ...] | None = None
    ) -> tuple[Tensor, tuple[Tensor, ...], LogDensity]:
        r"""What the :math:`\theta` move samples: the log density of :math:`\theta` at the chains' current values,
        its payload there, and the closure ``log_density(theta, index)``
        (:data:`~gpytorch_augment.inference.mcmc.slice.LogDensity`), whose payload is
        ``(mean, A, log_prior, theta1, C, *extras)`` (:class:`PriorAt`, the block's :math:`q(v)`).

        Without ``block``: :math:`\log p(\theta) + \log Z(\theta)`, every latent integrated out with the tilts
        ``h``, ``lam`` (C, T, n) (inducing points: :math:`u` and :math:`f` integrated out, :func:`noisy_tilts
        <gpytorch_augment.core.noisy_tilts>`). With the latents ``block``: :math:`\log p(\theta) + \log
        Z_b(\theta) + \sum_{t \notin b} \log \mathcal N(f_t \mid \mu_{\theta,t}, K_{\theta,t})`, ``h``, ``lam``
        the tilts of all latents (the block's are used)."""
        picked = list(block) if block is not None else None
        rest = None
        if picked is not None:
            h, lam = h[:, picked], lam[:, picked]
            others = [t for t in range(self.target.num_latents) if t not in picked]
            rest = (others, chains.f[:, others]) if others else None

        def density(prior: PriorAt, h: Tensor, lam: Tensor, f_rest: Tensor | None) -> tuple[Tensor, WhitenedGaussian]:
            mean, A, d = prior.mean, prior.A, prior.d
            other = None
            if picked is not None:
                mean, A, d = mean[:, picked], A[:, picked], None if d is None else d[:, picked]
                if f_rest is not None:
                    idx = rest[0]
                    other = gaussian_log_density(f_rest, prior.mean[:, idx], prior.A[:, idx].mT).sum(-1)
            return self._collapsed(mean, A, prior.log_prior, prior.ok, h, lam, d, other)

        current = chains.prior
        log_p0, q0 = density(current, h, lam, None if rest is None else rest[1])
        payload0 = (current.mean, current.A, current.log_prior, q0.theta1, q0.C, *current.extras())

        def log_density(theta: Tensor, index: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
            prior = self._prior(theta)
            log_p, q = density(prior, h[index], lam[index], None if rest is None else rest[1][index])
            return log_p, (prior.mean, prior.A, prior.log_prior, q.theta1, q.C, *prior.extras())

        return log_p0, payload0, log_density

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
        width = torch.full((C,), self.slice_width, dtype=theta.dtype, device=theta.device)
        step = state.step_size if state is not None else None
        if isinstance(step, Tensor) and step.dim() == 1 and step.shape[0] in (1, C):
            width = step.to(width).expand(C).clone()
        self._evaluations = 0
        return HyperChains(
            f, {}, constants, y, theta, prior.mean, prior.A, log_prior, width, 0, prior.d, prior.mu_Z, prior.L
        )

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
        moved = []
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
            moved.append(move.t.abs())
        width, adapted = chains.width, chains.adapted
        if adapt and self.adapt_width:
            distance = torch.stack(moved).mean()
            pooled = (width.mean() * (adapted + 1) + 3.0 * distance) / (adapted + 2)
            width = pooled.clamp(*WIDTH_BOUNDS).expand_as(width).clone()
            adapted += 1
        return chains._replace(width=width, adapted=adapted)

    def theta_move(
        self,
        chains: HyperChains,
        h: Tensor,
        lam: Tensor,
        generator: torch.Generator | None,
        block: tuple[int, ...] | None = None,
    ) -> SliceMove:
        r"""Step 2: the slice move of :math:`\theta` on :math:`p(\theta \mid \Omega, y)` (with ``block``:
        :math:`p(\theta \mid \Omega, f_{-b}, y)`) for the tilts ``h``, ``lam`` (C, T, n); its payload holds the
        prior and :math:`q(v)` at the new :math:`\theta`: ``(mean, A, log_prior, theta1, C, *extras)``
        (:meth:`collapsed_density`)."""
        log_p0, payload0, log_density = self.collapsed_density(chains, h, lam, block)
        move = slice_move(chains.theta, log_p0, payload0, log_density, chains.width, generator, self.max_steps_out)
        self._evaluations += move.evaluations
        return move

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
        u = None
        if chains.v is not None:  # u = mu_Z + L v at the chains' own θ
            u = target.to_storage(chains.mu_Z + (chains.L @ chains.v.unsqueeze(-1)).squeeze(-1)).to(target.dtype)
        return ChainState(
            f=target.to_storage(chains.f).to(target.dtype),
            u=u,
            aux={k: target.chain_batched(val, C) for k, val in chains.aux.items()},
            hyper={**self.gibbs._constants_snapshot(chains.constants), **theta},
            step_size=chains.width.clone(),
            coordinates=chains.theta.unsqueeze(0).clone(),
        )
