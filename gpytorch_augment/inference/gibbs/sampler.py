r"""The Gibbs driver: :class:`GibbsSampler` runs vectorised chains of the blocked sweep
(:class:`~gpytorch_augment.inference.gibbs.kernel.BlockedGibbsKernel`), records the draws, and resumes runs."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping
from typing import Any

import gpytorch
import numpy as np
import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor

from ..._validation import (
    check_finite,
    check_inputs_targets,
    check_nonempty,
    check_target_keywords,
    float_targets,
    squeezed_targets,
)
from ...core.distributed import all_gather_objects, is_distributed, rank, world_size
from ...core.prior import with_linalg_advice
from ...likelihoods.augmented_likelihood import AugmentedLikelihood, AuxDict, validated_latent_blocks
from ._arguments import check_alpha, check_seed, initial_state
from .kernel import LINALG_DTYPE, BlockedGibbsKernel
from .recorder import Recorder
from .samples import GibbsSamples
from .state import GibbsState

__all__ = ["GibbsSampler"]

#: the ``f_update`` options of :class:`GibbsSampler`
_F_UPDATES = ("auto", "whitened")


class GibbsSampler(BlockedGibbsKernel):
    r"""Blocked Gibbs sampler for a GP prior and an augmented likelihood.

    **Exact model** (no ``inducing_points``): the chain targets the exact posterior
    :math:`p(f \mid y) \propto \prod_i p(y_i \mid f_i)\, \mathcal N(f \mid \mu_0, K + \epsilon I)` by alternating

    .. math::
        \Omega \mid f \sim \prod_i p(\Omega_i \mid y_i, f_i), \qquad
        f \mid \Omega \sim \mathcal N\big(\mu_0 + \Sigma (h - \Lambda \mu_0),\ \Sigma\big),\quad
        \Sigma = \big((K + \epsilon I)^{-1} + \Lambda\big)^{-1}.

    The :math:`f`-draw (``f_update``, with :math:`K` standing for :math:`K + \epsilon I = LL^\top`):

    * GPML-stable pathwise draw (a prior draw corrected by one solve; :doc:`/maths/engines`), with
      :math:`B' = I + \Lambda^{1/2} K \Lambda^{1/2} = R R^\top`: :math:`f_0 = \mu_0 + L\varepsilon_1`,
      :math:`f = f_0 + K \Lambda^{1/2} B'^{-1}\big(\Lambda^{-1/2}(h - \Lambda f_0) - \varepsilon_2\big)`.
      Needs every :math:`\lambda_i > 0`; forming :math:`B'` is :math:`O(N^2)`.
    * whitened draw (method A), with :math:`B = I + L^\top \Lambda L = C^\top C`:
      :math:`v = C^{-1}(C^{-\top} L^\top (h - \Lambda\mu_0) + \varepsilon)`, :math:`f = \mu_0 + L v`. Exact for
      any :math:`\lambda_i \ge 0` (e.g. missing data); forming :math:`B` is :math:`O(N^3)`.

    ``f_update="auto"`` (default) uses the GPML-stable draw in every sweep where all :math:`\lambda_i` are positive
    normal floats and the whitened draw otherwise; ``f_update="whitened"`` always uses the whitened draw. Both
    matrices have every eigenvalue in :math:`[1, 1 + \lambda_{\max}\lVert K\rVert]`, so neither factorisation
    needs jitter, however ill-conditioned :math:`K` is.

    **Over-relaxation** (``overrelaxation=a``, :math:`-1 < a < 1`, exact model; Adler 1981, Neal 1998). With
    :math:`m` and :math:`\Sigma` the mean and covariance of :math:`f \mid \Omega`, a sweep replaces the
    current :math:`f` by

    .. math::
        f' = m + a (f - m) + \sqrt{1 - a^2}\,(\tilde f - m), \qquad \tilde f \sim \mathcal N(m, \Sigma)

    (``a = 0`` is the plain Gibbs draw). If :math:`f \sim \mathcal N(m, \Sigma)` then so is :math:`f'`
    (covariance :math:`a^2\Sigma + (1 - a^2)\Sigma`), and the move is reversible, so every sweep still leaves the
    exact joint posterior :math:`p(f, \Omega \mid y)` invariant: nothing is approximated, only the Markov kernel
    changes. A negative :math:`a` anti-correlates successive draws around the conditional mean; in a
    linear-Gaussian picture the lag-1 autocorrelation :math:`\rho` of a coordinate becomes
    :math:`\rho + a (1 - \rho)`: it raises the ESS of means more than that of variances, so choose :math:`a` on
    the worst of bulk, tail and sd ESS (measurements in ``benchmarks/README.md``; :math:`-0.5 \ldots -0.7` worked
    there). Since :math:`\tilde f` and :math:`m` are linear
    in the same right-hand side, :math:`f'` is computed as *one* pathwise draw with a modified right-hand side:
    over-relaxation costs a few elementwise operations, no extra solve. :meth:`sample_latent` (one conditional
    draw, no current state) is never over-relaxed.

    **Inducing-point model: VI-Gibbs** (``inducing_points=Z``, :math:`M` points, ``alpha`` :math:`=\alpha \in [0, 1]`;
    the variational Gibbs sampler for sparse GPs of Galy-Fajou's thesis, 2023).
    With :math:`K_{ZZ} + \epsilon I = L L^\top`, :math:`u = \mu_Z + L v`, :math:`A = L^{-1} K_{ZX}` (columns
    :math:`a_i`) and :math:`d_i = k_{ii} - a_i^\top a_i` (the variance of :math:`p(f_i \mid u)`), one sweep is

    .. math::
        \Omega \sim p(\Omega \mid f, y),\qquad v \sim q^*_\alpha(v) = \mathcal N(B^{-1} b,\ B^{-1}),\qquad
        f_i \sim p(f_i \mid u) = \mathcal N(\mu_i + a_i^\top v,\ d_i),

    .. math::
        B = I + A\tilde\Lambda A^\top,\quad b = A(\tilde h - \tilde\lambda \odot \mu_X),\quad
        \tilde\lambda_i = \frac{\lambda_i}{1 + \alpha\lambda_i d_i},\quad
        \tilde h_i = \frac{h_i}{1 + \alpha\lambda_i d_i}.

    *Derivation.* Given :math:`\Omega` the model is Gaussian, :math:`p(u, f \mid \Omega, y) \propto p(u)\prod_i
    p(f_i \mid u)\, e^{h_i f_i - \lambda_i f_i^2/2}`, and the thesis approximates it by
    :math:`q(u)\prod_i p(f_i \mid u)` minimising the Rényi/α-divergence with Power EP (Bui, Yan & Turner, 2017):
    site :math:`t_i(u)`, cavity :math:`q/t_i^\alpha`, tilted :math:`q/t_i^\alpha \cdot \int p(f_i \mid u)\,
    e^{\alpha(h_i f_i - \lambda_i f_i^2/2)}\,df_i`. The integral is Gaussian in :math:`u`,
    :math:`\propto \exp\big(\alpha(\tilde h_i m_i - \tilde\lambda_i m_i^2/2)\big)` with
    :math:`m_i = \mu_i + a_i^\top v`, so the projection is exact and the fixed point is
    :math:`t_i(u) = e^{\tilde h_i m_i - \tilde\lambda_i m_i^2/2}`: :math:`q^*_\alpha(u)` is the optimal (CAVI)
    :math:`q(u)` of the pseudo-observations :math:`(\tilde h, \tilde\lambda)`, computed on the
    Gaussian core in :math:`O(NM^2 + M^3)`. :math:`\alpha \to 0` gives Titsias's variational :math:`q(u)` (the
    CAVI :math:`q(v)` of the sampled :math:`(h, \lambda)`), :math:`\alpha = 1` the FITC posterior over :math:`u`
    (noise :math:`1/\lambda_i + d_i`). The Power-EP fixed point minimises the α-divergences *site by
    site*; it is **not** the global minimiser of :math:`D_\alpha(p(u, f \mid \Omega, y)\,\Vert\,q)` (for
    :math:`\alpha = 1` that is the exact marginal :math:`p(u \mid \Omega, y)`, which costs :math:`O(N^3)`).

    *What the draws approximate.* Every step is exact for its own distribution: :math:`\Omega` from its full
    conditional, :math:`(u, f)` from :math:`q^*_\alpha(u)\prod_i p(f_i \mid u)`. For :math:`Z \ne X` these two are
    not the conditionals of one joint distribution, so the chain's stationary law is an approximation of
    :math:`p(u, f \mid y)`, neither the exact posterior nor a named variational optimum, for every :math:`\alpha`:
    :math:`\alpha = 0` inherits the variational (under-dispersed in :math:`u`) behaviour of Titsias's bound,
    :math:`\alpha = 1` FITC's (it is not the exact Gibbs sampler of the FITC model either, which would draw
    :math:`f_i \mid u, \Omega`), :math:`0 < \alpha < 1` interpolates. With :math:`Z = X` (every :math:`d_i = 0`),
    :math:`q^*_\alpha` is the exact conditional for every :math:`\alpha` and the chain is the exact sampler. The stored
    ``f`` are draws from :math:`p(f \mid u)`, not :math:`E[f \mid u]`; predictions use :math:`f_* \mid u^{(s)}`.

    **Several latents** (``likelihood.num_latents = T > 1``): ``model.forward(x)`` must return a batch of ``T``
    independent priors (``batch_shape [T]``; an un-batched prior is shared by all latents). All latents are
    updated in one batched draw given :math:`\Omega`. A likelihood whose valid scan order needs fresh
    :math:`\Omega` between latent blocks (partially collapsed samplers) may declare ``latent_blocks`` (the
    attribute that also orders the CAVI updates), a sequence of lists of
    latent indices; :math:`\Omega` is then redrawn before each block.

    **Caching.** The prior (mean, kernel matrix, Cholesky factor) is computed once. :meth:`sample` compares the
    model's parameters and buffers with a snapshot and calls :meth:`refresh` itself when they changed in place;
    call :meth:`refresh` explicitly after any other change of the prior (e.g. a replaced module).

    :param model: a GPyTorch model or module whose ``forward(x)`` returns the prior ``MultivariateNormal``:
        preferably a :class:`~gpytorch_augment.GPPrior` (a mean and a kernel), or an ``ApproximateGP``; only
        ``model.forward`` is called, never ``model(x)``. An ``ExactGP`` works but warns: its own ``model(x)`` is a
        Gaussian-regression posterior unrelated to the draws (predict with :meth:`GibbsSamples.predict`).
    :param likelihood: an :class:`~gpytorch_augment.likelihoods.AugmentedLikelihood`.
    :param x: training inputs ``(N, D)``.
    :param y: training targets ``(N,)`` (a column ``(N, 1)`` is accepted and squeezed).
    :param inducing_points: optional ``(M, D)`` inducing inputs :math:`Z` (or ``(T, M, D)``).
    :param alpha: the Rényi/Power-EP :math:`\alpha \in [0, 1]` of the inducing-point sampler (default 0, Titsias;
        1 is FITC; see above). Needs ``inducing_points`` unless 0.
    :param jitter: :math:`\epsilon` added to the diagonal of the prior covariance before factorising
        (default ``gpytorch.settings.variational_cholesky_jitter`` for float64, ``1e-6``).
    :param f_update: ``"auto"`` or ``"whitened"`` (exact model only; see above).
    :param overrelaxation: :math:`a \in (-1, 1)` of the over-relaxed :math:`f`-update (exact model only; default
        0, the plain Gibbs draw; see above).
    :param linalg_dtype: dtype of the prior's evaluation, of every factorisation and of the chain state:
        ``torch.float64`` (default, whatever the data's dtype: the factorisations of ill-conditioned kernel matrices
        need it) or ``torch.float32`` (about twice as fast on a GPU; with a kernel matrix whose condition number
        approaches :math:`10^7` the factorisations fail with a :class:`~gpytorch_augment.core.FactorizationError`: use
        float64 then). Where it is finer than the model's or the inputs' dtype, ``model.forward`` is evaluated with
        the inputs and the model's parameters cast up (the model is not modified); the draws come back in the
        inputs' dtype.
    :param kwargs: per-datum keyword data of the likelihood (e.g. binomial ``trials``), passed to
        ``likelihood.check_targets``; the engine works with the canonical targets it returns.

    **Likelihood hyper-parameters.** After every :math:`\Omega` draw the engine calls
    ``likelihood.sample_hyperparameters(y, Ω, f, generator)`` (a no-op by default). A likelihood that implements
    it must keep one value per chain (e.g. shape ``(chains, 1)``); the draws are recorded in
    :attr:`GibbsSamples.hyper` under the parameter names (constrained values, ``raw_`` stripped). If it returns a
    new :math:`\Omega` (a dict; e.g. because :math:`\Omega \mid f` depends on the hyper-parameter just drawn), that
    draw replaces the old one for the :math:`f`-step and in the record.

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler, GPPrior
        >>> x = torch.linspace(-2, 2, 10, dtype=torch.float64).unsqueeze(-1)
        >>> y = (x.squeeze(-1) > 0).double()
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()))
        >>> sampler = GibbsSampler(prior, BernoulliLogitLikelihood(), x, y)
        >>> samples = sampler.sample(50, warmup=20, num_chains=2, seed=0, progress=False)
        >>> samples.f.shape                                  # (chains, draws, N)
        torch.Size([2, 50, 10])
        >>> bool(samples.summary().rhat.max() < 2)           # convergence check
        True
        >>> samples.predict(x[:3]).y_probs.shape             # p(y* = 1 | data)
        torch.Size([3])
        >>> sampler.resume(samples, 10, progress=False).f.shape  # continue the same chains
        torch.Size([2, 60, 10])
    """
    def __init__(
        self,
        model: Any,
        likelihood: AugmentedLikelihood,
        x: Tensor,
        y: Tensor,
        inducing_points: Tensor | None = None,
        jitter: float | None = None,
        f_update: str = "auto",
        overrelaxation: float = 0.0,
        alpha: float = 0.0,
        linalg_dtype: torch.dtype = LINALG_DTYPE,
        **kwargs: Any,
    ) -> None:
        if linalg_dtype not in (torch.float32, torch.float64):
            raise ValueError(f"linalg_dtype must be torch.float32 or torch.float64, got {linalg_dtype!r}")
        self.linalg_dtype = linalg_dtype
        if not isinstance(likelihood, AugmentedLikelihood):
            raise TypeError(f"GibbsSampler needs an AugmentedLikelihood, got {type(likelihood).__name__}")
        if not callable(getattr(model, "forward", None)):
            raise TypeError(f"model must define forward(x) returning the prior; got {type(model).__name__}")
        check_target_keywords(likelihood, kwargs, "GibbsSampler")
        y = squeezed_targets(x, y)
        check_inputs_targets(x, y)
        check_nonempty(x, "GibbsSampler")
        _warn_exact_gp(model)
        if y.dim() != 1:
            raise ValueError(f"y must have shape (N,); got shape {tuple(y.shape)}")
        if x.dim() != 2 and not (x.dim() == 3 and likelihood.num_latents > 1 and x.shape[0] == likelihood.num_latents):
            raise ValueError(f"x must have shape (N, D); got shape {tuple(x.shape)}")
        if x.is_floating_point():  # integer targets (counts) converted exactly to the data's dtype
            y = float_targets(y, kwargs, x.dtype)
        self.target_kwargs = kwargs
        self.y = likelihood.check_targets(y, **kwargs)
        if inducing_points is not None:
            check_finite("inducing_points", inducing_points)
            if inducing_points.dim() < 2 or inducing_points.shape[-1] != x.shape[-1]:
                raise ValueError(
                    f"inducing_points must have shape (M, D) with D = {x.shape[-1]} (the inputs' dimension); "
                    f"got shape {tuple(inducing_points.shape)}"
                )
        if jitter is None:
            jitter = gpytorch.settings.variational_cholesky_jitter.value(linalg_dtype)
        if not (isinstance(jitter, (int, float)) and math.isfinite(jitter) and jitter >= 0):
            raise ValueError(f"jitter must be a finite non-negative number, got {jitter!r}")
        if f_update not in _F_UPDATES:
            raise ValueError(f"f_update must be one of {_F_UPDATES}, got {f_update!r}")
        if isinstance(overrelaxation, bool) or not isinstance(overrelaxation, (int, float)) or not (
            -1.0 < overrelaxation < 1.0
        ):
            raise ValueError(f"overrelaxation must be a number in (-1, 1), got {overrelaxation!r}")
        if overrelaxation != 0.0 and inducing_points is not None:
            raise ValueError(
                "overrelaxation is implemented for the exact model only (the inducing-point chain state holds f, "
                "not the inducing values v it would need); use overrelaxation=0 with inducing_points"
            )
        self.alpha = check_alpha(alpha, inducing_points is not None)
        self.model = model
        self.likelihood = likelihood
        self.x = x
        self.inducing_points = inducing_points
        self.jitter = float(jitter)
        self.f_update = f_update
        self.overrelaxation = float(overrelaxation)
        self.num_latents = int(likelihood.num_latents)
        self.dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
        self.device = x.device
        hook = getattr(type(likelihood), "sample_hyperparameters", None)
        base_hook = getattr(AugmentedLikelihood, "sample_hyperparameters", None)
        self._samples_hyperparameters = hook is not None and hook is not base_hook
        self._blocks = validated_latent_blocks(likelihood)
        self.refresh()

    # ------------------------------------------------------------------ likelihood constants
    def _hyper_snapshot(self, constants: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The likelihood's parameters at the chains' sampled ``constants``, constrained (``raw_`` stripped), if it
        samples its constants (else empty)."""
        if not self._samples_hyperparameters:
            return {}
        out = {}
        with self._constants(dict(constants)):
            for name, param, constraint in self.likelihood.named_parameters_and_constraints():
                head, _, leaf = name.rpartition(".")
                if constraint is not None and leaf.startswith("raw_"):
                    name = (head + "." if head else "") + leaf[len("raw_") :]
                    param = constraint.transform(param)
                out[name] = param.detach().clone()
        return out

    @with_linalg_advice("sampling")
    @torch.no_grad()
    def sample_latent(
        self, h: Tensor, lam: Tensor, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        r"""One draw of the latents given potentials and precisions (the :math:`f \mid \Omega` step).

        :param h: potentials in the likelihood's layout, ``(..., N)`` (``(..., T, N)`` for ``T`` latents);
            leading dimensions are chains.
        :param lam: precisions, same shape.
        :return: ``{"f": f}`` in storage layout, plus ``{"u": u, "v": v}`` for the sparse model
            (:math:`v \sim q^*_\alpha(v)`, for ``alpha = 0`` the CAVI :math:`q(v)` of these :math:`(h,\lambda)`,
            and :math:`f_i \sim p(f_i \mid u)`).
        """
        T, N = self.num_latents, self.num_data
        batch = torch.broadcast_shapes(h.shape, lam.shape)[: -1 if T == 1 else -2]
        shape = torch.Size(batch) + (T, N)
        h_, lam_ = self._from_likelihood(h, shape), self._from_likelihood(lam, shape)
        f, v = self._latent_draw(h_, lam_, generator)
        out = {"f": self._to_storage(f).to(self.dtype)}
        if self.is_sparse:
            out["v"] = self._to_storage(v).to(self.dtype)
            out["u"] = self._to_storage(self._u_from_v(v)).to(self.dtype)
        return out
    @with_linalg_advice("sampling")
    @torch.no_grad()
    def inducing_distribution(self, h: Tensor, lam: Tensor) -> MultivariateNormal:
        r""":math:`q^*_\alpha(u)` of the inducing-point model for potentials and precisions ``h``, ``lam`` (the
        likelihood's layout, leading dimensions batch): the distribution the sparse sweep draws :math:`u` from.

        :return: a ``MultivariateNormal`` over :math:`u`, batch ``(*batch)`` / ``(*batch, T)``, in float64.
        """
        if not self.is_sparse:
            raise ValueError("inducing_distribution needs inducing_points")
        if self._params_changed():
            self.refresh()
        T, N = self.num_latents, self.num_data
        batch = torch.broadcast_shapes(h.shape, lam.shape)[: -1 if T == 1 else -2]
        shape = torch.Size(batch) + (T, N)
        q = self._q_alpha(self._terms, self._from_likelihood(h, shape), self._from_likelihood(lam, shape))
        L = self._terms.L
        root = L @ q.chol_covariance  # u = mu_Z + L v
        mean, covar = self._u_from_v(q.mean), root @ root.mT
        if T == 1:
            mean, covar = mean.squeeze(-2), covar.squeeze(-3)
        return MultivariateNormal(mean, covar)

    @with_linalg_advice("sampling")
    @torch.no_grad()
    def sweep(
        self,
        f: Tensor,
        y: Tensor | None = None,
        generator: torch.Generator | None = None,
        hyper: Mapping[str, Tensor] | None = None,
    ) -> GibbsState:
        r"""One full sweep (:math:`\Omega \mid f`, then the latents :math:`\mid \Omega`) for a batch of chains.

        A low-level building block (Geweke tests, custom schemes that also update hyper-parameters).

        :param f: current latents in storage layout, ``(chains, N)`` / ``(chains, T, N)`` (or without the chain
            dimension).
        :param y: targets to condition on (default: the training targets); may carry a chain dimension,
            ``(chains, N)``, e.g. for the successive-conditional simulator of a Geweke test.
        :param generator: a ``torch.Generator`` for reproducible draws.
        :param hyper: the chains' current values of the likelihood's sampled constants (e.g. ``state.hyper`` of the
            previous sweep; default: the likelihood's own values). The likelihood itself is never modified.
        :return: a :class:`GibbsState` (``rng_state`` is ``None``; ``hyper`` holds the constants after the sweep).
        """
        if self._params_changed():
            self.refresh()
        if y is None:
            y = self.y
        else:
            check_finite("y", y)
            if y.shape[-1] != self.num_data:
                raise ValueError(
                    f"y must have {self.num_data} points in its last dimension; got shape {tuple(y.shape)}"
                )
            y = float_targets(y, dict(self.target_kwargs), self.dtype)
            y = self.likelihood.check_targets(y, **self.target_kwargs)
        f_int = self._from_storage(f, None, name="f")
        f_int, aux, v, constants = self._sweep(f_int, y, generator, dict(hyper or {}))
        u = self._to_storage(self._u_from_v(v)).to(self.dtype) if self.is_sparse else None
        return GibbsState(
            f=self._to_storage(f_int).to(self.dtype), aux=aux, u=u, hyper=self._hyper_snapshot(constants)
        )

    # ------------------------------------------------------------------ sampling
    @staticmethod
    def _check_count(name: str, value: Any, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        return int(value)

    @with_linalg_advice("sampling")
    def sample(
        self,
        num_samples: int,
        warmup: int = 200,
        thin: int = 1,
        num_chains: int = 1,
        seed: int | None = None,
        init: GibbsState | Mapping[str, Any] | Tensor | None = None,
        progress: bool = True,
        process_group: Any = None,
    ) -> GibbsSamples:
        r"""Run ``num_chains`` vectorised chains for ``warmup + num_samples * thin`` sweeps.

        :param num_samples: draws kept per chain.
        :param warmup: sweeps discarded at the start.
        :param thin: keep every ``thin``-th sweep after warm-up.
        :param num_chains: chains, run as one batch.
        :param seed: seed of the ``torch.Generator`` driving every draw (Ω, f and the initial state). ``None``
            continues the generator state stored in ``init`` (a :class:`GibbsState`), or draws a fresh seed
            from torch's global RNG (recorded in the result).
        :param init: starting point: a :class:`GibbsState` (e.g. ``samples.last_state()``), a dict with key
            ``"f"``, or a tensor of latents, ``(N,)`` / ``(chains, N)`` (``(T, N)`` / ``(chains, T, N)``).
            Default: one prior draw per chain.
        :param progress: show a ``tqdm`` progress bar (silently none if ``tqdm`` is not installed).
        :param process_group: with ``torch.distributed`` initialised (this group, default: the default group), the
            ``num_chains`` chains are spread over the ranks (rank :math:`r` runs chains
            ``[r C / R, (r + 1) C / R)``), each rank seeded with its own seed derived from ``seed`` and its rank
            (``numpy.random.SeedSequence(seed).spawn(R)[r]``, so a run is reproducible for a given world size), and
            rank 0 returns every rank's draws joined along the chain dimension (the other ranks return their own).
        :return: :class:`GibbsSamples`.
        """
        check_seed(seed)
        if not is_distributed(process_group):
            return self._sample(num_samples, warmup, thin, num_chains, seed, init, progress)
        if seed is None or init is not None:
            raise ValueError("sampling over several processes needs an integer seed and no init")
        world, me = world_size(process_group), rank(process_group)
        bounds = [num_chains * r // world for r in range(world + 1)]
        local = bounds[me + 1] - bounds[me]
        if local < 1:
            raise ValueError(f"num_chains = {num_chains} is fewer than the {world} processes")
        local_seed = rank_seed(seed, me, world)
        samples = self._sample(num_samples, warmup, thin, local, local_seed, None, progress)
        gathered = all_gather_objects(samples.state_dict(), process_group)
        if me != 0:
            return samples
        runs = [GibbsSamples.from_state_dict(state, sampler=self) for state in gathered]
        return GibbsSamples.cat(runs, dim="chain")

    @torch.no_grad()
    def _sample(
        self,
        num_samples: int,
        warmup: int,
        thin: int,
        num_chains: int,
        seed: int | None,
        init: GibbsState | Mapping[str, Any] | Tensor | None,
        progress: bool,
    ) -> GibbsSamples:
        """:meth:`sample` in this process alone."""
        num_samples = self._check_count("num_samples", num_samples, 1)
        warmup = self._check_count("warmup", warmup, 0)
        thin = self._check_count("thin", thin, 1)
        num_chains = self._check_count("num_chains", num_chains, 1)
        check_seed(seed)
        if self._params_changed():
            self.refresh()
        state = initial_state(init)
        if state is not None:
            self._check_init_state(state, num_chains)
        generator = torch.Generator(device=self.device)
        if seed is None and state is not None and state.rng_state is not None:
            try:
                generator.set_state(state.rng_state)
            except (RuntimeError, TypeError) as err:
                raise ValueError(
                    f"init.rng_state is not a generator state of this sampler's device ({self.device}): {err}; "
                    "pass seed= to start a fresh stream"
                ) from err
        else:
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,)).item())
            generator.manual_seed(int(seed))
        f = self._from_storage(state.f, num_chains) if state is not None else self._initial_f(num_chains, generator)
        constants = self._initial_constants(state)
        aux: AuxDict = dict(state.aux) if state is not None else {}
        record = Recorder(self, num_chains, num_samples)
        start = time.perf_counter()
        f, aux, v, constants, step_size = self._run_chains(
            f, constants, generator, warmup, thin, record, progress, state
        )
        elapsed = time.perf_counter() - start

        u_last = self._to_storage(self._u_from_v(v)).to(self.dtype) if v is not None and self.is_sparse else None
        last = GibbsState(
            f=self._to_storage(f).to(self.dtype),
            aux={k: self._chain_batched(val, num_chains) for k, val in aux.items()},
            u=u_last,
            rng_state=generator.get_state(),
            num_sweeps=(state.num_sweeps if state is not None else 0) + warmup + num_samples * thin,
            hyper=self._hyper_snapshot(constants),
            step_size=step_size,
        )
        self.likelihood.aux = last.aux
        return record.samples(
            seed=seed, warmup=warmup, thin=thin, elapsed=elapsed, num_sweeps=warmup + num_samples * thin, last=last
        )

    def _check_init_state(self, state: GibbsState, num_chains: int) -> None:
        """Every field of an ``init`` state checked up front (shape, finiteness), not only ``f``: a clear
        ``ValueError`` naming the field rather than a raw error (or a silent start) later."""
        T, n, C = self.num_latents, self.num_data, num_chains
        self._from_storage(state.f, num_chains)
        if not isinstance(state.num_sweeps, int) or isinstance(state.num_sweeps, bool) or state.num_sweeps < 0:
            raise ValueError(f"init.num_sweeps must be a non-negative integer; got {state.num_sweeps!r}")
        if not isinstance(state.aux, Mapping):
            raise ValueError(f"init.aux must be a dict of tensors; got {type(state.aux).__name__}")
        for name, value in state.aux.items():
            if not isinstance(value, Tensor):
                raise ValueError(f"init.aux[{name!r}] must be a tensor; got {type(value).__name__}")
            if value.dim() < 2 or value.shape[0] not in (1, C) or value.shape[1] != n:
                raise ValueError(
                    f"init.aux[{name!r}] must have shape (chains, N, ...) with chains = 1 or {C} and N = {n}; "
                    f"got shape {tuple(value.shape)}"
                )
            if bool(torch.isnan(value).any()):
                raise ValueError(f"init.aux[{name!r}] holds NaN")
        if state.u is not None:
            if not self.is_sparse:
                raise ValueError("init.u holds inducing values but this sampler has no inducing points")
            M = int(self.inducing_points.shape[-2])
            u = torch.as_tensor(state.u)
            layout = u.unsqueeze(-2) if T == 1 and u.dim() >= 1 else u
            if layout.dim() != 3 or layout.shape[0] not in (1, C) or layout.shape[-2:] != (T, M):
                expected = f"(chains, M), M = {M}" if T == 1 else f"(chains, T, M), T = {T}, M = {M}"
                raise ValueError(f"init.u must have shape {expected}; got shape {tuple(u.shape)}")
            check_finite("init.u", u)
        if state.step_size is not None:
            step = state.step_size
            if not isinstance(step, Tensor) or step.dim() != 1 or step.shape[0] not in (1, C):
                raise ValueError(
                    f"init.step_size must be a tensor of shape (chains,) with chains = 1 or {C}; got "
                    f"{tuple(step.shape) if isinstance(step, Tensor) else type(step).__name__}"
                )
            if not bool((torch.isfinite(step) & (step > 0)).all()):
                raise ValueError("init.step_size must hold positive finite step sizes")
        if state.hyper and self._samples_hyperparameters:
            current = self._hyper_snapshot({})
            for name, value in state.hyper.items():
                value = torch.as_tensor(value)
                check_finite(f"init.hyper[{name!r}]", value)
                shape = current.get(name, value).shape
                per_chain = value.dim() >= 1 and value.shape[1:] == shape and value.shape[0] in (1, C)
                if value.shape != shape and not per_chain:
                    raise ValueError(
                        f"init.hyper[{name!r}] must have the parameter's shape {tuple(shape)} or (chains, "
                        f"*{tuple(shape)}) with chains = 1 or {C}; got shape {tuple(value.shape)}"
                    )

    def _initial_constants(self, state: GibbsState | None) -> dict[str, Tensor]:
        """The sampled constants a run starts from: those of ``init`` (validated names), else the likelihood's."""
        if state is None or not state.hyper or not self._samples_hyperparameters:
            return {}
        constants = dict(state.hyper)
        try:
            with self._constants(constants):
                pass
        except ValueError as err:
            raise ValueError(f"init holds hyper-parameters the likelihood does not have: {err}") from err
        return constants

    def _run_chains(
        self,
        f: Tensor,
        constants: dict[str, Tensor],
        generator: torch.Generator,
        warmup: int,
        thin: int,
        record: Recorder,
        progress: bool,
        init: GibbsState | None = None,
    ) -> tuple[Tensor, AuxDict, Tensor | None, dict[str, Tensor], Tensor | None]:
        """``warmup + num_samples * thin`` sweeps from the internal latents ``f`` and the chains' sampled
        likelihood ``constants``, recording every kept sweep; returns the final (f, Ω, v, constants) and the
        kernel's step sizes (``None``: the Gibbs sweep has none). Everything a run depends on comes from its
        arguments (``init``: the state it starts from, if any), never from an earlier run."""
        total = warmup + record.num_samples * thin
        v, aux = None, {}
        bar = _progress_bar(total, progress)
        try:
            for it in range(total):
                f, aux, v, constants = self._sweep(f, self.y, generator, constants)
                if it >= warmup and (it - warmup + 1) % thin == 0:
                    record.keep(f, aux, v, constants)
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        return f, aux, v, constants, None

    @staticmethod
    def _chain_batched(value: Tensor, num_chains: int) -> Tensor:
        """Give an auxiliary draw a leading chain dimension if the likelihood returned it without one."""
        if value.dim() == 0 or value.shape[0] != num_chains:
            value = value.expand((num_chains,) + value.shape)
        return value

    def resume(self, samples: GibbsSamples, num_samples: int, progress: bool = True) -> GibbsSamples:
        """Continue the chains of ``samples`` for ``num_samples`` more draws (same thinning, no warm-up).

        The random stream continues from the stored generator state, so ``sample(n1)`` followed by
        ``resume(·, n2)`` gives exactly the draws of ``sample(n1 + n2)``. Returns all draws, concatenated.
        (Runs joined with ``GibbsSamples.cat(..., dim="chain")`` have no single generator state; they continue
        with a fresh seed.)
        """
        samples._check_fits(self, "samples")
        more = self.sample(
            num_samples,
            warmup=0,
            thin=samples.thin,
            num_chains=samples.num_chains,
            init=samples.last_state(),
            progress=progress,
        )
        return GibbsSamples.cat([samples, more], dim="draw")


def _warn_exact_gp(model: Any) -> None:
    """Warn that an ``ExactGP`` only lends its prior to the sampler (its own calls give a Gaussian posterior)."""
    if isinstance(model, gpytorch.models.ExactGP):
        warnings.warn(
            f"GibbsSampler got a gpytorch ExactGP ({type(model).__name__}): only its prior, model.forward(x), is "
            "used. The ExactGP's own posterior, model(x) in eval mode and likelihood(model(x)), is a Gaussian-"
            "regression posterior that ignores this sampler's likelihood and draws. Hold the prior in "
            "gpytorch_augment.GPPrior(mean_module, covar_module) and predict with samples.predict(x_new).",
            UserWarning,
            stacklevel=3,
        )


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="Gibbs", leave=False)


def rank_seed(seed: int, rank: int, world_size: int) -> int:
    """The seed of rank ``rank`` of ``world_size`` processes sampling with ``seed``
    (``numpy.random.SeedSequence(seed).spawn(world_size)[rank]``, as a 62-bit integer).

    Example::

        >>> from gpytorch_augment.inference.gibbs.sampler import rank_seed
        >>> seeds = [rank_seed(0, r, world_size=4) for r in range(4)]
        >>> len(set(seeds)), all(0 <= s < 2**62 for s in seeds)   # distinct, 62-bit
        (4, True)
        >>> rank_seed(0, 2, world_size=4) == seeds[2]              # reproducible
        True
    """
    child = np.random.SeedSequence(int(seed)).spawn(int(world_size))[int(rank)]
    return int(child.generate_state(1, dtype=np.uint64)[0] >> np.uint64(2))
