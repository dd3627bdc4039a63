r"""Hamiltonian Monte Carlo on the *original* (non-augmented) GP posterior, preconditioned by its Laplace
approximation: :class:`HMCKernel`, an :class:`~gpytorch_augment.inference.mcmc.MCMCKernel` and a sibling of the Gibbs
sweep :class:`~gpytorch_augment.inference.gibbs.GibbsKernel`; :class:`~gpytorch_augment.HMCSampler` constructs the
driver composed with one, with the same ``sample`` / ``resume`` / :class:`~gpytorch_augment.PosteriorSamples` API.

Target (exact model, :math:`T` independent latent GPs, :math:`K_t + \epsilon I = L_t L_t^\top`):

.. math::
    p(f \mid y) \propto \prod_i p(y_i \mid f_{\cdot i}) \prod_t \mathcal N(f_t \mid \mu_t, K_t + \epsilon I).

**Coordinates.** Stack the :math:`T` latents into one vector of length :math:`TN` (latent-major) and write
:math:`f = \mu + L v` with the block-diagonal :math:`L = \mathrm{diag}(L_1, \dots, L_T)` (whitened prior). The
Laplace approximation is :math:`v \approx \mathcal N(\hat v, B^{-1})`, :math:`B = I + L^\top W L = C C^\top`
(:math:`\hat v` the mode; :math:`W` the negative Hessian of :math:`\log p(y \mid f)` at :math:`\hat f`, which is
block-diagonal over the data points with one :math:`T \times T` block per point, each projected onto the positive
semi-definite cone; ``curvature="joint"`` keeps the curvature *across* the latents of a point, e.g. the softmax's
coupling of the class latents, ``"diagonal"`` keeps only its diagonal). The chain moves in :math:`z` with
:math:`v = \hat v + C^{-\top} z`, i.e. :math:`f = \hat f + A z`, :math:`A = L C^{-\top}`: one dense
:math:`TN \times TN` matrix (joint) or :math:`T` blocks of :math:`N \times N` (diagonal; :math:`T` times fewer
flops per product). In these
coordinates the Laplace approximation is :math:`\mathcal N(0, I)` and, because
:math:`C^{-1}C^{-\top} = I - A^\top W A`, the potential and its gradient are

.. math::
    U(z) = \tfrac12\lVert\hat v\rVert^2 + b^\top z + \tfrac12\lVert z\rVert^2 - \tfrac12 d^\top W d
    - \log p(y \mid \hat f + d),\qquad
    \nabla U(z) = z + b - A^\top\big(\nabla_f \log p(y \mid f) + W d\big),

with :math:`d = A z` and :math:`b = C^{-1}\hat v`: **two** dense products per leapfrog step (:math:`Az` and
:math:`A^\top r`), each one matrix-matrix product over all chains. :math:`W` and the mode only shape the
coordinates; the potential is the true one, so any :math:`W \ge 0` (and an inexact mode) gives an exact
sampler.

**Transition** (Neal 2011): momentum :math:`p \sim \mathcal N(0, I)`, :math:`n` leapfrog steps of size
:math:`\varepsilon_c` (per chain), :math:`n` drawn uniformly from ``num_steps`` each iteration (random trajectory
lengths avoid the periodicity of a fixed length, which anti-correlates some coordinates and collapses the ESS of the
posterior variance), Metropolis acceptance with probability :math:`\min(1, e^{H_0 - H_1})` (non-finite energies are
rejected). Every transition leaves :math:`p(f \mid y)` invariant. With ``trajectory="chees"`` the length is an
integration time instead: :math:`uT`, :math:`u \sim \mathcal U(0, 1)` drawn per iteration and shared by the
chains, so chain :math:`c` takes :math:`\lceil uT/\varepsilon_c\rceil` steps (a chain that has taken its steps
waits while the others go on); :math:`T` is adapted in warm-up by ChEES
(:mod:`~gpytorch_augment.inference.mcmc.adaptation`) and fixed afterwards, drawn independently of the state, so the
transition stays exact.

**Adaptation** (warm-up only): the step size of each chain by dual averaging (Hoffman & Gelman 2014, §3.2) towards
``target_accept``; after warm-up it is frozen at the averaged value and stored in the run's last state
(``ChainState.step_size``), so ``resume`` continues with it. A run adapts from
(and, without warm-up, runs at) the step sizes of its ``init`` state, or ``initial_step_size`` without one: nothing
carries over from an earlier run on the same sampler, so the same seed gives the same draws.
The preconditioner is computed once (L-BFGS to the mode of :math:`U(v)`, then the
per-point :math:`T \times T` curvature by double back-propagation) and cached with the prior; ``target.refresh()``
recomputes both.

The likelihood is used only through ``log_prob_grad(y, f)`` (the inner leapfrog steps, which need no value) and
``log_prob_and_grad(y, f)`` (the trajectory's end; closed forms where the likelihood provides them, else autograd of
``log_prob_at``): any
:class:`~gpytorch_augment.likelihoods.AugmentedLikelihood` whose :math:`\log p(y \mid f)` is differentiable in
:math:`f`, with one or several latents. The likelihood's constants (e.g. class scales, noise scales) stay fixed at
their current values: a likelihood with a prior on them (``samples_constants``) is refused (use
:class:`~gpytorch_augment.GibbsSampler` to sample them). Inducing points are not supported. Which sampler to use
when: ``benchmarks/README.md``.

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
    >>> more = sampler.resume(samples, 10, progress=False)
    >>> more.f.shape
    torch.Size([4, 50, 10])
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from ...core.linalg import add_to_diagonal, tri_solve
from ...core.prior import with_linalg_advice
from ..mcmc.adaptation import ChEESAdaptation, DualAveraging
from ..mcmc.kernel import Draws, MCMCKernel
from ..mcmc.state import ChainState
from ..mcmc.target import PosteriorTarget

__all__ = ["HMCChains", "HMCKernel", "LaplacePreconditioner"]

_PRECONDITIONERS = ("laplace", "prior")
_CURVATURES = ("joint", "diagonal")
_TRAJECTORIES = ("random", "chees")


class LaplacePreconditioner(NamedTuple):
    r"""The coordinates of :class:`HMCSampler`, in ``G`` independent groups of ``n`` coordinates (joint curvature:
    one group of :math:`TN`, latent-major; diagonal: :math:`T` groups of :math:`N`): mode ``f_hat`` (T, N),
    ``v_hat`` (T, N), per-point curvature ``W`` (N, T, T), ``A`` = :math:`L C^{-\top}` (G, n, n), ``C`` =
    chol(:math:`I + L^\top W L`) (G, n, n), ``b`` = :math:`C^{-1}\hat v` (G, 1, n), ``const`` =
    :math:`\tfrac12\lVert\hat v\rVert^2 - \tfrac12\lVert b\rVert^2`, ``At`` (:math:`A^\top`, stored
    contiguous: a product with a transposed view takes a slower BLAS path), the mode in the grouped layout ``f_rows``
    (G, 1, n), and ``w``, :math:`W` for products with grouped latents: (T, T, N) where it couples the latents of a
    point (joint curvature, several latents), else its diagonal (T, 1, N)."""

    f_hat: Tensor
    v_hat: Tensor
    W: Tensor
    A: Tensor
    C: Tensor
    b: Tensor
    const: Tensor
    At: Tensor
    f_rows: Tensor
    w: Tensor


def _matmul(z: Tensor, M: Tensor) -> Tensor:
    """Grouped ``z @ M`` ((G, C, n) @ (G, n, n)); one group as a plain matrix product (faster than ``bmm``)."""
    return (z[0] @ M[0]).unsqueeze(0) if z.shape[0] == 1 else z @ M


def _affine(x: Tensor, z: Tensor, M: Tensor, alpha: float = 1.0) -> Tensor:
    """Grouped ``x + alpha z @ M`` ((G, C, n) @ (G, n, n), ``x`` broadcast) in one fused product."""
    return torch.baddbmm(x, z, M, alpha=alpha)


class _Proposal(NamedTuple):
    """What one transition returns: the new state (z, U, ∇U), the acceptance probabilities, and the proposal with
    its momentum (the end of the trajectory, accepted or not; read by the ChEES adaptation)."""

    z: Tensor
    U: Tensor
    grad: Tensor
    accept_prob: Tensor
    z_end: Tensor
    p_end: Tensor


class HMCChains(NamedTuple):
    """The chains of an HMC run between transitions: coordinates ``z`` (G, C, n), potential ``U`` (C,) and its
    gradient at the targets ``y`` the chains condition on, the step sizes ``step_size`` (C,) (frozen ones after
    warm-up), the dual-averaging state ``adapt`` during warm-up (else ``None``), after warm-up the summed acceptance
    probabilities and (mean) leapfrog steps, and for ChEES trajectories the length :math:`T` and its adaptation
    during warm-up."""

    z: Tensor
    U: Tensor
    grad: Tensor
    y: Tensor
    step_size: Tensor
    adapt: DualAveraging | None
    accept_sum: Tensor
    steps_sum: float
    length: float = 1.0
    chees: ChEESAdaptation | None = None


class HMCKernel(MCMCKernel[HMCChains]):
    r"""Laplace-preconditioned HMC on the exact GP posterior (see the module docstring for the maths).

    :param target: the :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget` (exact model: no inducing points;
        a likelihood whose constants have a prior, ``samples_constants``, is refused).
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
    :param trajectory: ``"random"`` (default: ``num_steps`` leapfrog steps drawn per iteration) or ``"chees"``
        (jittered integration time :math:`uT`, :math:`T` adapted in warm-up by ChEES across the chains; chain
        :math:`c` takes :math:`\lceil uT/\varepsilon_c\rceil` steps;
        :mod:`~gpytorch_augment.inference.mcmc.adaptation`).
    :param trajectory_length: the length :math:`T` ChEES starts from (default 1.0), and the one used by runs
        without warm-up that do not continue a state holding one.
    :param max_leapfrog_steps: the most leapfrog steps of a ChEES transition (default 100; bounds :math:`T` too).

    Attributes after a run (a report of the latest run; a later run never reads them): :attr:`step_size` (per chain,
    frozen after warm-up) and :attr:`last_run` (acceptance rate, mean leapfrog steps, step sizes, number of gradient
    evaluations).

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GPPrior
        >>> from gpytorch_augment.inference.hmc import HMCKernel
        >>> from gpytorch_augment.inference.mcmc import PosteriorTarget
        >>> x = torch.linspace(-2, 2, 6, dtype=torch.float64).unsqueeze(-1)
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
        >>> kernel = HMCKernel(PosteriorTarget(prior, BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double()))
        >>> kernel.laplace.f_hat.shape                       # the mode the coordinates are centred on
        torch.Size([1, 6])
    """

    name = "hmc"

    def __init__(
        self,
        target: PosteriorTarget,
        num_steps: tuple[int, int] | int = (2, 5),
        target_accept: float = 0.8,
        initial_step_size: float = 1.0,
        preconditioner: str = "laplace",
        curvature: str = "joint",
        trajectory: str = "random",
        trajectory_length: float = 1.0,
        max_leapfrog_steps: int = 100,
    ) -> None:
        if target.is_sparse:
            raise ValueError("HMCSampler samples the exact posterior only; use GibbsSampler with inducing_points")
        if target.design is not None:
            raise ValueError(
                f"{type(target.likelihood).__name__} reads linear combinations of the latents, which HMCSampler does "
                "not support: use GibbsSampler"
            )
        if getattr(target.likelihood, "samples_constants", False):
            raise ValueError(
                f"{type(target.likelihood).__name__} has a prior on its constants, which HMCSampler would ignore (it "
                "keeps them fixed): use GibbsSampler to sample them too, or build the likelihood without the prior"
            )
        lo, hi = _steps_range(num_steps, "num_steps")
        if not 0.0 < target_accept < 1.0:
            raise ValueError(f"target_accept must lie in (0, 1), got {target_accept!r}")
        if not (math.isfinite(initial_step_size) and initial_step_size > 0):
            raise ValueError(f"initial_step_size must be a positive number, got {initial_step_size!r}")
        if preconditioner not in _PRECONDITIONERS:
            raise ValueError(f"preconditioner must be one of {_PRECONDITIONERS}, got {preconditioner!r}")
        if curvature not in _CURVATURES:
            raise ValueError(f"curvature must be one of {_CURVATURES}, got {curvature!r}")
        if trajectory not in _TRAJECTORIES:
            raise ValueError(f"trajectory must be one of {_TRAJECTORIES}, got {trajectory!r}")
        if isinstance(trajectory_length, bool) or not isinstance(trajectory_length, (int, float)) or not (
            math.isfinite(trajectory_length) and trajectory_length > 0
        ):
            raise ValueError(f"trajectory_length must be a positive number, got {trajectory_length!r}")
        self.max_leapfrog_steps = _steps_range(max_leapfrog_steps, "max_leapfrog_steps")[0]
        self.trajectory, self.trajectory_length = trajectory, float(trajectory_length)
        self.target = target
        self.curvature = curvature
        self.num_steps, self.target_accept = (lo, hi), float(target_accept)
        self.initial_step_size, self.preconditioner = float(initial_step_size), preconditioner
        self.step_size: Tensor | None = None
        self.last_run: dict[str, Any] = {}
        self._precond: LaplacePreconditioner | None = None
        self._version = target.version

    # ------------------------------------------------------------------ the target
    def _to_lik(self, f: Tensor) -> Tensor:
        """Grouped latents (G, C, n) -> the likelihood's layout, (C, N) for one latent, else (C, N, T)."""
        T = self.target.num_latents
        if T == 1:
            f = f[0]
        elif f.shape[0] == T:
            f = f.permute(1, 2, 0)
        else:
            f = f[0].view(f.shape[1], T, -1).transpose(1, 2)
        return f if f.dtype == self.target.dtype else f.to(self.target.dtype)

    def _from_lik(self, g: Tensor, groups: int) -> Tensor:
        """The likelihood's layout -> grouped (``groups``, C, n), in the linear-algebra dtype."""
        g = g if g.dtype == self.target.linalg_dtype else g.to(self.target.linalg_dtype)
        if g.dim() == 2:
            return g.unsqueeze(0)
        return g.permute(2, 0, 1) if groups > 1 else g.transpose(1, 2).reshape(1, g.shape[0], -1)

    def _w_times(self, d: Tensor) -> Tensor:
        """:math:`Wd` per point, grouped (G, C, n) like ``d``."""
        w = self.laplace.w
        if w.shape[1] > 1:  # joint curvature of T latents, w (T, T, N): sum over the second latent index
            C, T = d.shape[1], w.shape[0]
            return (w * d[0].view(C, 1, T, -1)).sum(2).view(1, C, -1)
        return w * d

    def _plus_w_times(self, g: Tensor, d: Tensor) -> Tensor:
        """:math:`g + Wd` (one fused operation where :math:`W` is diagonal)."""
        return torch.addcmul(g, self.laplace.w, d) if self.laplace.w.shape[1] == 1 else g + self._w_times(d)

    def _gradient(self, z: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        r""":math:`\nabla U(z) = z + b - A^\top(\nabla_f \log p(y \mid f) + Wd)` for grouped coordinates ``z``
        (G, C, n), and the latents :math:`f = \hat f + Az` (grouped): the leapfrog's inner step, which needs no value
        of the potential (two fused products and the likelihood's ``log_prob_grad``)."""
        P = self.laplace
        f = _affine(P.f_rows, z, P.At)
        g = self._from_lik(self.target.likelihood.log_prob_grad(y, self._to_lik(f)), z.shape[0])
        return _affine(z + P.b, self._plus_w_times(g, f - P.f_rows), P.A, alpha=-1.0), f

    def _potential(self, z: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        r"""(:math:`U(z)` per chain (C,), :math:`\nabla U(z)`, the latents :math:`f`) for grouped coordinates ``z``
        (G, C, n), with one call of the likelihood's ``log_prob_and_grad``; the gradient is the same to the bit as
        :meth:`_gradient`'s (``log_prob_grad`` returns ``log_prob_and_grad``'s gradient to the bit), so a resumed
        run continues exactly."""
        P = self.laplace
        f = _affine(P.f_rows, z, P.At)
        log_lik, g = self.target.likelihood.log_prob_and_grad(y, self._to_lik(f))
        d, zb = f - P.f_rows, z + P.b
        r = self._plus_w_times(self._from_lik(g, z.shape[0]), d)
        grad = _affine(zb, r, P.A, alpha=-1.0)
        return self._energy(zb, d, log_lik), grad, f

    def _value(self, z: Tensor, f: Tensor, y: Tensor) -> Tensor:
        """:math:`U(z)` per chain (C,), given the latents ``f`` (grouped) at ``z``."""
        P = self.laplace
        log_lik, _ = self.target.likelihood.log_prob_and_grad(y, self._to_lik(f))
        return self._energy(z + P.b, f - P.f_rows, log_lik)

    def _energy(self, zb: Tensor, d: Tensor, log_lik: Tensor) -> Tensor:
        r""":math:`U = \tfrac12\lVert\hat v\rVert^2 - \tfrac12\lVert b\rVert^2 + \tfrac12\lVert z + b\rVert^2 -
        \tfrac12 d^\top W d - \log p(y \mid f)` per chain, from :math:`z + b`, :math:`d = Az` and the per-datum
        log-likelihood."""
        quad = 0.5 * ((zb * zb).sum((0, 2)) - (d * self._w_times(d)).sum((0, 2)))
        log_lik = log_lik.reshape(log_lik.shape[0], -1).sum(-1).to(self.target.linalg_dtype)
        return self.laplace.const + quad - log_lik

    def _split(self, z: Tensor) -> Tensor:
        """Grouped coordinates (G, C, n) -> latent-major (T, C, N)."""
        if z.shape[0] == self.target.num_latents:
            return z
        return z[0].view(z.shape[1], self.target.num_latents, -1).transpose(0, 1)

    def _join(self, r: Tensor, groups: int) -> Tensor:
        """Latent-major (T, C, N) -> grouped (G, C, n)."""
        return r if groups == r.shape[0] else r.transpose(0, 1).reshape(1, r.shape[1], -1)

    # ------------------------------------------------------------------ preconditioner
    @property
    def laplace(self) -> LaplacePreconditioner:
        """The cached :class:`LaplacePreconditioner` (computed on first use at the training targets)."""
        if self._precond is None or self._version != self.target.version:
            self._precond, self._version = self._build_preconditioner(), self.target.version
        return self._precond

    def _mode(self, y: Tensor, max_iter: int = 500) -> Tensor:
        r"""The mode :math:`\hat v` (T, N) of :math:`\tfrac12\lVert v\rVert^2 - \log p(y \mid \mu + Lv)` by L-BFGS
        (strong Wolfe line search), from :math:`v = 0`."""
        terms = self.target.terms
        v = torch.zeros_like(terms.mu, requires_grad=True)
        opt = torch.optim.LBFGS([v], lr=1.0, max_iter=max_iter, tolerance_grad=1e-10, tolerance_change=1e-14,
                                history_size=20, line_search_fn="strong_wolfe")

        def closure() -> Tensor:
            opt.zero_grad()
            with torch.enable_grad():
                f = terms.mu + (terms.L @ v.unsqueeze(-1)).squeeze(-1)
                T = self.target.num_latents
                arg = f.unsqueeze(0).to(self.target.dtype)
                arg = arg[:, 0] if T == 1 else arg.permute(0, 2, 1)
                log_lik = self.target.likelihood.log_prob_at(y, arg).sum().to(self.target.linalg_dtype)
                loss = 0.5 * (v * v).sum() - log_lik
                loss.backward()
            return loss

        with torch.enable_grad():
            opt.step(closure)
        return v.detach()

    def _curvature(self, f: Tensor, y: Tensor) -> Tensor:
        r"""The negative Hessian of :math:`\log p(y \mid f)` (separable over the data points: one :math:`T \times
        T` block per point) by double back-propagation (one backward pass per latent), each block projected onto
        the positive semi-definite cone: (N, T, T)."""
        T = self.target.num_latents
        H = torch.zeros(f.shape[-1], T, T, dtype=f.dtype, device=f.device)
        with torch.enable_grad():
            f_ = f.unsqueeze(1).to(self.target.dtype).requires_grad_(True)  # (T, 1, N)
            arg = f_[0] if T == 1 else f_.permute(1, 2, 0)
            (g,) = torch.autograd.grad(self.target.likelihood.log_prob_at(y, arg).sum(), f_, create_graph=True)
            for t in range(T if g.requires_grad else 0):  # no graph: log p(y | f) is linear in f, no curvature
                (h,) = torch.autograd.grad(g[t].sum(), f_, retain_graph=t < T - 1, allow_unused=True)
                if h is not None:
                    H[:, t, :] = -h[:, 0].mT.to(self.target.linalg_dtype)
        H = H.nan_to_num(0.0, 0.0, 0.0)
        if T == 1:
            return H.clamp_min(0.0)
        evals, evecs = torch.linalg.eigh((H + H.mT) / 2)
        return (evecs * evals.clamp_min(0.0).unsqueeze(-2)) @ evecs.mT

    @with_linalg_advice("the HMC preconditioner (the Laplace approximation)")
    @torch.no_grad()
    def _build_preconditioner(self) -> LaplacePreconditioner:
        terms, T = self.target.terms, self.target.num_latents
        L, N = terms.L, terms.mu.shape[-1]
        if self.preconditioner == "laplace":
            v_hat = self._mode(self.target.y)
            f_hat = terms.mu + (L @ v_hat.unsqueeze(-1)).squeeze(-1)
            W = self._curvature(f_hat, self.target.y)
            if self.curvature == "diagonal":
                W = torch.diag_embed(W.diagonal(dim1=-2, dim2=-1))
        else:
            v_hat, f_hat = torch.zeros_like(terms.mu), terms.mu.clone()
            W = torch.zeros(N, T, T, dtype=terms.mu.dtype, device=terms.mu.device)
        if T == 1 or self.curvature == "diagonal":  # T groups: B_t = I + L_t^T diag(W_tt) L_t
            w = W.diagonal(dim1=-2, dim2=-1).mT.unsqueeze(1)  # (T, 1, N)
            B, root = L.mT @ (w.mT * L), L
        else:  # one group: B = I + L^T W L, block (t, s) = L_t^T diag(W[:, t, s]) L_s
            B = torch.cat([torch.cat([L[t].mT @ (W[:, t, s].unsqueeze(-1) * L[s]) for s in range(T)], -1)
                           for t in range(T)], -2).unsqueeze(0)
            root = torch.block_diag(*L.unbind(0)).unsqueeze(0)
            w = W.permute(1, 2, 0).contiguous()  # (T, T, N)
        B = add_to_diagonal(B, 1.0)
        C = torch.linalg.cholesky((B + B.mT) / 2)
        A = tri_solve(C, root.mT).mT.contiguous()  # L C^{-T}
        b = tri_solve(C, self._join(v_hat.unsqueeze(1), C.shape[0]).mT).mT
        const = 0.5 * ((v_hat * v_hat).sum() - (b * b).sum())
        f_rows = self._join(f_hat.unsqueeze(1), C.shape[0])
        return LaplacePreconditioner(f_hat, v_hat, W, A, C, b, const, A.mT.contiguous(), f_rows, w)

    def _to_z(self, f: Tensor) -> Tensor:
        """Internal chain latents (C, T, N) -> grouped coordinates z (G, C, n)."""
        P, terms = self.laplace, self.target.terms
        v = tri_solve(terms.L, (f.transpose(0, 1) - terms.mu.unsqueeze(1)).mT).mT  # (T, C, N)
        return self._join(v - P.v_hat.unsqueeze(1), P.C.shape[0]) @ P.C  # C^T (v - v_hat), row-vector form

    def _to_f(self, z: Tensor) -> Tensor:
        """Grouped coordinates z (G, C, n) -> internal chain latents (C, T, N)."""
        P = self.laplace
        return (P.f_hat.unsqueeze(1) + self._split(_matmul(z, P.At))).transpose(0, 1).contiguous()

    # ------------------------------------------------------------------ one transition
    def _transition(
        self,
        z: Tensor,
        U: Tensor,
        grad: Tensor,
        y: Tensor,
        eps: Tensor,
        steps: int | Tensor,
        generator: torch.Generator | None,
    ) -> _Proposal:
        """One Metropolis-corrected leapfrog trajectory from the state (z, U, ∇U) for all chains: ``steps`` leapfrog
        steps for every chain, or one count per chain, (C,) (a chain that has taken its steps stays where it is
        while the others go on), of size ``eps`` per chain, (C,). The inner steps evaluate only the gradient
        (:meth:`_gradient`), the end the potential too."""
        p0 = torch.randn(z.shape, generator=generator, dtype=z.dtype, device=z.device)
        e = eps.view(1, -1, 1)
        p = torch.addcmul(p0, e, grad, value=-0.5)
        z1, g1 = z, grad
        if isinstance(steps, int):
            for _ in range(steps - 1):
                z1 = torch.addcmul(z1, e, p)
                p = torch.addcmul(p, e, self._gradient(z1, y)[0], value=-1.0)
            z1 = torch.addcmul(z1, e, p)
            U1, g1, _ = self._potential(z1, y)
            p = torch.addcmul(p, e, g1, value=-0.5)
        else:  # a chain that has taken its steps moves by zero while the others go on (its gradient is recomputed
            # at the same point, so the last one computed is every chain's own)
            index = torch.arange(int(steps.max()), device=z.device).unsqueeze(-1)
            step_z = (index < steps) * eps  # (S, C)
            step_p = torch.where(index == steps - 1, 0.5, 1.0) * step_z
            for i in range(step_z.shape[0]):
                z1 = torch.addcmul(z1, step_z[i].view(1, -1, 1), p)
                g1, f1 = self._gradient(z1, y)
                p = torch.addcmul(p, step_p[i].view(1, -1, 1), g1, value=-1.0)
            U1 = self._value(z1, f1, y)
        log_ratio = (U - U1) + 0.5 * ((p0 * p0).sum((0, 2)) - (p * p).sum((0, 2)))
        log_ratio = log_ratio.nan_to_num(-math.inf, -math.inf, -math.inf)  # a non-finite energy is rejected
        u = torch.rand(log_ratio.shape, generator=generator, dtype=z.dtype, device=z.device)
        accept = u.log() < log_ratio
        keep = accept.view(1, -1, 1)
        return _Proposal(
            torch.where(keep, z1, z),
            torch.where(accept, U1, U),
            torch.where(keep, g1, grad),
            log_ratio.clamp_max(0.0).exp(),
            z1,
            p,
        )

    def _chees_steps(self, length: float, eps: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        r"""Leapfrog steps per chain for a jittered time :math:`uT` (u shared by the chains) and the chains'
        integration times :math:`n_c \varepsilon_c`."""
        u = float(torch.rand((1,), generator=generator, dtype=eps.dtype, device=eps.device))
        steps = torch.ceil(u * length / eps).clamp(1, self.max_leapfrog_steps).to(torch.int64)
        return steps, steps * eps

    def _draw_steps(self, generator: torch.Generator | None) -> int:
        lo, hi = self.num_steps
        return int(torch.randint(lo, hi + 1, (1,), generator=generator, device=self.target.device).item())

    def _chain_step_size(self, num_chains: int, step_size: Tensor | None = None) -> Tensor:
        """``step_size`` (one entry, or one per chain) for ``num_chains`` chains, else ``initial_step_size``."""
        kw = {"dtype": self.target.linalg_dtype, "device": self.target.device}
        if step_size is not None and step_size.shape[0] in (1, num_chains):
            return step_size.to(**kw).expand(num_chains).clone()
        return torch.full((num_chains,), self.initial_step_size, **kw)

    # ------------------------------------------------------------------ the MCMCKernel protocol
    def init(self, f: Tensor, y: Tensor, state: ChainState | None, num_warmup: int) -> HMCChains:
        """The chains at ``f`` (C, T, N) in the preconditioned coordinates. The step sizes (and the ChEES length)
        start from ``state``'s (a continued run), else from ``initial_step_size`` (``trajectory_length``); warm-up
        adapts them."""
        C = f.shape[0]
        z = self._start(f, state)
        U, grad, _ = self._potential(z, y)
        eps = self._chain_step_size(C, state.step_size if state is not None else None)
        adapt = DualAveraging(eps, self.target_accept) if num_warmup > 0 else None
        length = self.trajectory_length
        if state is not None and state.trajectory_length is not None:
            length = float(state.trajectory_length)
        chees = None
        if self.trajectory == "chees" and num_warmup > 0:
            bounds = (float(eps.min()) * 1e-3, self.max_leapfrog_steps * float(eps.max()))
            chees = ChEESAdaptation(length, num_warmup, bounds)
        zero = torch.zeros(C, dtype=self.target.linalg_dtype, device=self.target.device)
        return HMCChains(z, U, grad, y, eps, adapt, zero, 0.0, length, chees)

    def _start(self, f: Tensor, state: ChainState | None) -> Tensor:
        """The coordinates of ``f`` (C, T, N): the state's own ``coordinates`` where they map exactly to its ``f``
        under this preconditioner (a continued run then takes the very steps one longer run takes), else solved
        from ``f``."""
        z = state.coordinates if state is not None else None
        shape = (self.laplace.C.shape[0], f.shape[0], self.laplace.C.shape[-1])
        if isinstance(z, Tensor) and tuple(z.shape) == shape and isinstance(state.f, Tensor):
            z = z.to(device=self.target.device, dtype=self.target.linalg_dtype)
            f_of_z = self.target.to_storage(self._to_f(z)).to(self.target.dtype)
            if f_of_z.shape == state.f.shape and torch.equal(f_of_z, state.f.to(f_of_z.device)):
                return z.clone()
        return self._to_z(f)

    def step(self, chains: HMCChains, generator: torch.Generator | None, adapt: bool) -> HMCChains:
        adapting = adapt and chains.adapt is not None
        eps = chains.adapt.step_size if adapting else chains.step_size
        if self.trajectory == "chees":
            length = chains.chees.length if adapting and chains.chees is not None else chains.length
            steps, times = self._chees_steps(length, eps, generator)
        else:
            steps = self._draw_steps(generator)
        z0 = chains.z
        move = self._transition(z0, chains.U, chains.grad, chains.y, eps, steps, generator)
        chains = chains._replace(z=move.z, U=move.U, grad=move.grad)
        if adapting:
            chains.adapt.update(move.accept_prob)
            if chains.chees is not None:
                chains.chees.update(z0, move.z_end, move.p_end, move.accept_prob, times)
            return chains
        mean_steps = steps if isinstance(steps, int) else float(steps.double().mean())
        return chains._replace(
            accept_sum=chains.accept_sum + move.accept_prob, steps_sum=chains.steps_sum + mean_steps
        )

    def end_warmup(self, chains: HMCChains) -> HMCChains:
        """Freeze the step sizes at their dual-averaged values, capped by the warm-up's trials (and the ChEES length
        at its average); warn where a chain tried no step size that reached ``target_accept``."""
        if chains.adapt is None:
            return chains
        missed = ~chains.adapt.reached_target
        if bool(missed.any()):
            warnings.warn(
                f"HMC warm-up: {int(missed.sum())} of {missed.numel()} chains tried no step size reaching "
                f"target_accept={self.target_accept} in {chains.adapt.t} warm-up iterations; their step size is frozen "
                "at the smallest one tried and may reject most proposals: run a longer warmup (100 or more) or pass "
                "a smaller initial_step_size",
                RuntimeWarning,
                stacklevel=2,
            )
        length = chains.chees.final if chains.chees is not None else chains.length
        return chains._replace(step_size=chains.adapt.final, adapt=None, length=length, chees=None)

    def kept(self, chains: HMCChains) -> dict[str, Tensor]:
        """The coordinates only, ``(C, G, n)``: the latents of every kept draw are computed in one product at the
        end (:meth:`draws`)."""
        return {"z": chains.z.transpose(0, 1)}

    def draws(self, kept: dict[str, Tensor]) -> Draws:
        zs = kept["z"]  # (C, S, G, n)
        C, S, G, n = zs.shape
        f = self._to_f(zs.permute(2, 1, 0, 3).reshape(G, S * C, n))  # (S * C, T, N)
        f = f.view(S, C, *f.shape[1:]).transpose(0, 1).to(self.target.dtype).contiguous()
        return Draws(f=self.target.to_storage(f), u=None, aux={}, hyper={})

    def last_state(self, chains: HMCChains) -> ChainState:
        f = self.target.to_storage(self._to_f(chains.z)).to(self.target.dtype)
        length = chains.length if self.trajectory == "chees" else None
        return ChainState(f=f, step_size=chains.step_size, trajectory_length=length, coordinates=chains.z.clone())

    def finish(self, chains: HMCChains, num_kept_iterations: int) -> None:
        """Report the run in :attr:`step_size` and :attr:`last_run` (never read by a later run); a ChEES run also
        sets :attr:`trajectory_length` to its adapted length (where a later run without a state's length starts)."""
        kept = max(num_kept_iterations, 1)
        self.step_size = chains.step_size
        if self.trajectory == "chees":
            self.trajectory_length = chains.length
        self.last_run = {
            "step_size": chains.step_size.cpu(),
            "trajectory_length": chains.length if self.trajectory == "chees" else None,
            "acceptance_rate": float(chains.accept_sum.mean()) / kept,
            "mean_leapfrog_steps": chains.steps_sum / kept,
            "gradients_after_warmup": chains.steps_sum,
        }


def _steps_range(num_steps: Any, name: str) -> tuple[int, int]:
    """A count of leapfrog steps, ``name``, as ``(low, high)`` (an integer ``n`` is ``(n, n)``), or a
    ``ValueError`` naming it."""
    def as_int(v: Any) -> int | None:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            return None
        return int(v)

    pair = (num_steps, num_steps) if as_int(num_steps) is not None else num_steps
    try:
        lo, hi = (as_int(v) for v in pair)
    except (TypeError, ValueError):
        lo = hi = None
    if lo is None or hi is None or not 1 <= lo <= hi:
        raise ValueError(
            f"{name} must be a positive integer or a pair of integers (low, high) with 1 <= low <= high, got "
            f"{num_steps!r}"
        )
    return lo, hi
