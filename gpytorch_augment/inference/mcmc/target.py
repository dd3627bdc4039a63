r"""What every sampler of this package targets: the posterior of a GP prior under an augmented likelihood,
:math:`p(f \mid y) \propto \prod_i p(y_i \mid f_i)\,\mathcal N(f \mid \mu_0, K + \epsilon I)`, with its prior cached.

:class:`PosteriorTarget` holds the model (only ``model.forward(x)``, the prior, is called), the likelihood, the
validated data and the cached prior terms, and converts between the three layouts of the latents: the user's
(storage: ``(..., N)`` for one latent, ``(..., T, N)`` for ``T``), the likelihood's (``(..., N)`` / ``(..., N, T)``)
and the kernels' internal one (``(chains, T, N)`` in ``linalg_dtype``). Kernels
(:class:`~gpytorch_augment.inference.mcmc.MCMCKernel`) move chains on it; the draws
(:class:`~gpytorch_augment.inference.mcmc.PosteriorSamples`) predict through its public methods.

Numerics: the prior is evaluated and factorised once, in ``linalg_dtype`` (float64 unless asked otherwise, whatever
the data's dtype), and cached while the model's parameters are unchanged (:meth:`PosteriorTarget.prior_changed`).
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NamedTuple

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor

from ..._validation import (
    check_finite,
    check_inputs_targets,
    float_targets,
)
from ...core import PriorCache, check_data
from ...core.linalg import add_to_diagonal, tri_solve, vecmat
from ...core.prior import prior_cholesky, split_prior, whiten_prior, with_linalg_advice
from ...likelihoods.augmented_likelihood import AugmentedLikelihood, validated_latent_blocks
from .state import ChainState

__all__ = ["LINALG_DTYPE", "PosteriorTarget", "TargetPriorTerms", "conditional_variances"]

#: default dtype of every factorisation and of the chain state (``linalg_dtype=`` overrides it)
LINALG_DTYPE = torch.float64


class TargetPriorTerms(NamedTuple):
    r"""The cached prior, latent-major with an explicit latent dimension ``T`` (``T = 1`` for one latent).

    Exact model: ``mu`` (T, N), ``K`` = K + jitter I (T, N, N), ``L`` = chol(K) (T, N, N), ``A`` = Lᵀ
    (contiguous: ``v @ A`` is :math:`Lv` for every chain at once).
    Sparse model: ``mu`` = μ_X (T, N), ``mu_Z`` (T, M), ``L`` = chol(K_ZZ + jitter I) (T, M, M),
    ``A`` = L⁻¹ K_ZX (T, M, N) (the core's whitened prior terms), ``d`` the variances of :math:`p(f_i \mid u)`
    (T, N) (:func:`conditional_variances`); ``K`` is ``None``.

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler, GPPrior
        >>> x = torch.linspace(-2, 2, 5, dtype=torch.float64).unsqueeze(-1)
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
        >>> sampler = GibbsSampler(prior, BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double())
        >>> terms = sampler.target.terms                     # exact model, one latent: T = 1, N = 5
        >>> terms.mu.shape, terms.L.shape, terms.K.shape, terms.d is None
        (torch.Size([1, 5]), torch.Size([1, 5, 5]), torch.Size([1, 5, 5]), True)
    """

    mu: Tensor
    L: Tensor
    A: Tensor
    K: Tensor | None = None
    mu_Z: Tensor | None = None
    d: Tensor | None = None


def _coarser(t: Tensor, dtype: torch.dtype) -> bool:
    """Whether ``t`` is a floating tensor of a coarser dtype than ``dtype``."""
    return t.is_floating_point() and torch.finfo(t.dtype).eps > torch.finfo(dtype).eps


def conditional_variances(k_diag: Tensor, a_sq: Tensor, jitter: float) -> Tensor:
    r"""The variances :math:`d_i = k_{ii} - q_{ii}` of :math:`p(f_i \mid u)`, computed as
    :math:`\max(k_{ii} - \lVert a_i\rVert^2 - \epsilon, 0)`.

    Rule: factorising :math:`K_{ZZ} + \epsilon I` makes :math:`\lVert a_i\rVert^2` fall short of the Nyström diagonal
    :math:`q_{ii}` by at most :math:`\epsilon`, so the shifted value is within :math:`\epsilon` of the exact
    :math:`d_i`, never negative, and 0 where :math:`x_i` is an inducing input (:math:`d_i = 0` in exact arithmetic):
    with :math:`Z = X` the sparse sweep is the exact (whitened) sweep, draw for draw.

    Example::

        >>> import torch
        >>> from gpytorch_augment.inference.mcmc.target import conditional_variances
        >>> k_diag, a_sq = torch.tensor([1.0, 1.0, 2.0]), torch.tensor([0.5, 1.0, 2.5])
        >>> conditional_variances(k_diag, a_sq, jitter=1e-6)  # never negative
        tensor([0.5000, 0.0000, 0.0000])
    """
    return (k_diag - a_sq - jitter).clamp_min(0.0)


class PosteriorTarget:
    r"""The posterior a sampler targets: a GP prior (``model.forward(x)``), an augmented likelihood and the data,
    validated once, with the prior cached.

    :param model: a GPyTorch model or module whose ``forward(x)`` returns the prior ``MultivariateNormal``
        (``batch_shape [T]`` for a likelihood with ``T`` latents; an un-batched prior is shared by all latents).
    :param likelihood: an :class:`~gpytorch_augment.likelihoods.AugmentedLikelihood`.
    :param x: training inputs ``(N, D)``.
    :param y: training targets ``(N,)`` (a column ``(N, 1)`` is accepted and squeezed).
    :param inducing_points: optional ``(M, D)`` inducing inputs :math:`Z` (or ``(T, M, D)``).
    :param jitter: :math:`\epsilon` added to the diagonal of the prior covariance before factorising (default
        ``gpytorch.settings.variational_cholesky_jitter`` of ``linalg_dtype``).
    :param linalg_dtype: dtype of the prior's evaluation, of every factorisation and of the chain state
        (``torch.float64`` by default; see :class:`~gpytorch_augment.GibbsSampler`).
    :param caller: the name used in error messages (the public class that was called).
    :param kwargs: per-datum keyword data of the likelihood (e.g. binomial ``trials``).

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GPPrior
        >>> from gpytorch_augment.inference.mcmc import PosteriorTarget
        >>> x = torch.linspace(-2, 2, 6, dtype=torch.float64).unsqueeze(-1)
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
        >>> target = PosteriorTarget(prior, BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double())
        >>> target.num_data, target.num_latents, target.is_sparse, target.terms.L.shape
        (6, 1, False, torch.Size([1, 6, 6]))
    """

    def __init__(
        self,
        model: Any,
        likelihood: AugmentedLikelihood,
        x: Tensor,
        y: Tensor,
        inducing_points: Tensor | None = None,
        jitter: float | None = None,
        linalg_dtype: torch.dtype = LINALG_DTYPE,
        caller: str = "the sampler",
        **kwargs: Any,
    ) -> None:
        if linalg_dtype not in (torch.float32, torch.float64):
            raise ValueError(f"linalg_dtype must be torch.float32 or torch.float64, got {linalg_dtype!r}")
        if not isinstance(likelihood, AugmentedLikelihood):
            raise TypeError(f"{caller} needs an AugmentedLikelihood, got {type(likelihood).__name__}")
        if not callable(getattr(model, "forward", None)):
            raise TypeError(f"model must define forward(x) returning the prior; got {type(model).__name__}")
        def check_inputs(x: Tensor, y: Tensor) -> None:  # the exact model's data: one latent point per input
            if likelihood.linear_observations:  # one target per observation, not per input
                check_finite("x", x)
                check_finite("y", y)
            else:
                check_inputs_targets(x, y)
            if y.dim() != 1:
                raise ValueError(f"y must have shape (N,); got shape {tuple(y.shape)}")
            per_latent = x.dim() == 3 and likelihood.num_latents > 1 and x.shape[0] == likelihood.num_latents
            if x.dim() != 2 and not per_latent:
                raise ValueError(f"x must have shape (N, D); got shape {tuple(x.shape)}")

        #: the training data, checked once (:class:`~gpytorch_augment.core.ObservedData`)
        self.data = check_data(likelihood, x, y, kwargs, where=caller, check_inputs=check_inputs)
        x = self.data.x
        _warn_exact_gp(model, caller)
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
        self.model, self.likelihood, self.x, self.y = model, likelihood, x, self.data.y
        self.target_kwargs = dict(self.data.kwargs)
        if not likelihood.samples_constants:
            likelihood.check_fixed_constants(self.y)
        #: the linear observations :math:`g = Df` the targets read (:class:`~gpytorch_augment.core.LinearObservations`;
        #: ``None`` for a pointwise likelihood, whose datum :math:`i` reads :math:`f_i`)
        self.design = self.data.design
        self.inducing_points = inducing_points
        self.jitter = float(jitter)
        self.linalg_dtype = linalg_dtype
        self.num_latents = int(likelihood.num_latents)
        self.dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
        self.device = x.device
        hook = getattr(type(likelihood), "sample_hyperparameters", None)
        #: whether the likelihood draws its own constants given (Ω, f) (``sample_hyperparameters`` overridden)
        self.has_constant_sampler = hook is not None and hook is not getattr(
            AugmentedLikelihood, "sample_hyperparameters", None
        )
        #: the latent blocks between which Ω is redrawn (``None``: all latents at once)
        self.blocks = validated_latent_blocks(likelihood)
        #: incremented by every :meth:`refresh`: a kernel's caches of the prior are valid for one version
        self.version = 0
        self._prior_cache = PriorCache()
        self.refresh()

    # ------------------------------------------------------------------ sizes
    @property
    def is_sparse(self) -> bool:
        """Whether the target uses inducing points."""
        return self.inducing_points is not None

    @property
    def num_data(self) -> int:
        """The number of latent points (the inputs ``x``)."""
        return int(self.y.shape[-1]) if self.design is None else int(self.x.shape[-2])

    @property
    def num_observations(self) -> int:
        """The number of targets: :attr:`num_data` for a pointwise likelihood, else the linear observations'."""
        return int(self.y.shape[-1])

    def observed(self, f: Tensor) -> Tensor:
        r"""The latents the likelihood reads, in its layout: :math:`f` itself, or :math:`g = Df` for linear
        observations."""
        return f if self.design is None else self.design.apply(f)

    @property
    def num_inducing(self) -> int | None:
        return None if self.inducing_points is None else int(self.inducing_points.shape[-2])

    # ------------------------------------------------------------------ the prior
    def _forward(self, x: Tensor) -> Any:
        """``model.forward(x)``, evaluated in ``linalg_dtype`` where that is finer than the inputs' dtype (inputs cast
        up) or the model's (a copy of the model cast up at :meth:`refresh`; the model itself is never modified),
        because a kernel matrix rounded to float32 is often not positive definite even with jitter. A copy, not
        parameters swapped for the call: GPyTorch evaluates kernels lazily, after the call."""
        if _coarser(x, self.linalg_dtype):
            x = x.to(self.linalg_dtype)
        model = self._forward_model
        return (model if model is not None else self.model).forward(x)

    @property
    def evaluation_model(self) -> Any:
        """The module whose ``forward`` gives the prior: the model, or its copy in ``linalg_dtype`` (see
        :meth:`_forward`); what a batched evaluation at other hyper-parameters (``torch.func.functional_call``)
        runs on, so that the model itself is never touched."""
        model = self._forward_model
        return model if model is not None else self.model

    def _cast_model(self) -> Any:
        """A copy of the model in ``linalg_dtype`` if some floating parameter or buffer of it is coarser, else
        ``None`` (the model is used as it is)."""
        dt, model = self.linalg_dtype, self.model
        if not isinstance(model, torch.nn.Module) or not any(_coarser(t, dt) for t in self._model_tensors()):
            return None
        try:
            copied = copy.deepcopy(model)
        except (RuntimeError, TypeError) as err:  # e.g. non-leaf tensors cached on the model
            warnings.warn(
                f"the sampler could not copy the model to evaluate its prior in {dt} ({err}); it is evaluated in the "
                f"model's dtype instead: cast the model (model.to({dt})) if the factorisation fails",
                UserWarning,
                stacklevel=4,
            )
            return None
        return copied.to(dt)

    def prior(self, x: Tensor) -> tuple[Tensor, Any]:
        """``model.forward(x)`` as (mean (T, n), covariance operator (T, n, n)), validated."""
        prior = self._forward(x)
        if not isinstance(prior, MultivariateNormal):
            raise TypeError(f"model.forward(x) must return a MultivariateNormal, got {type(prior).__name__}")
        mean, covar = prior.mean, prior.lazy_covariance_matrix
        T, n = self.num_latents, x.shape[-2]
        if mean.shape[-1] != n:
            raise ValueError(f"model.forward(x) returned a prior over {mean.shape[-1]} points for {n} inputs")
        if T == 1:
            if mean.dim() != 1:
                raise ValueError(
                    f"the likelihood has one latent but model.forward(x) returned a batch of priors "
                    f"(mean shape {tuple(mean.shape)}); use an un-batched model"
                )
        elif mean.dim() == 1:
            mean, covar = mean.expand(T, n), covar.expand(T, n, n)
        elif tuple(mean.shape[:-1]) != (T,):
            raise ValueError(
                f"the likelihood has {T} latents: model.forward(x) must return batch_shape [{T}] "
                f"(independent latent GPs); got mean shape {tuple(mean.shape)}"
            )
        if T == 1:
            mean, covar = mean.unsqueeze(0), covar.unsqueeze(0)
        return mean, covar

    def _model_tensors(self) -> list[Tensor]:
        return list(self.model.parameters()) + list(self.model.buffers())

    def prior_changed(self) -> bool:
        """Whether the model's parameters or buffers changed since the prior was cached."""
        return not self._prior_cache.valid([], self._model_tensors())

    def ensure_fresh(self) -> None:
        """:meth:`refresh` if the model's parameters or buffers changed in place since the prior was cached."""
        if self.prior_changed():
            self.refresh()

    @with_linalg_advice("the sampler's prior")
    @torch.no_grad()
    def refresh(self) -> None:
        r"""(Re)compute and cache the prior: :math:`\mu`, :math:`K + \epsilon I` and its Cholesky factor :math:`L`
        (exact), or :math:`\mu_X`, :math:`\mu_Z`, :math:`L = \mathrm{chol}(K_{ZZ} + \epsilon I)`, :math:`A` (sparse).

        Call after changing the model's hyper-parameters; the cached factor is otherwise reused by every transition.
        """
        dt = self.linalg_dtype
        x = self.x
        self._forward_model = self._cast_model()
        if not self.is_sparse:
            mean, covar = self.prior(x)
            K = covar.to_dense().to(dt)
            K = add_to_diagonal((K + K.mT) / 2, self.jitter)  # exactly symmetric (the f-draw reads either triangle)
            L = prior_cholesky(K, "K + jitter I of the sampler", source_dtype=covar.dtype)
            self._terms = TargetPriorTerms(mu=mean.to(dt), L=L, A=L.mT.contiguous(), K=K)
        else:
            Z = self.inducing_points
            if Z.shape[:-2] != x.shape[:-2]:
                batch = torch.broadcast_shapes(Z.shape[:-2], x.shape[:-2])
                Z, x = Z.expand(*batch, *Z.shape[-2:]), x.expand(*batch, *x.shape[-2:])
            M = Z.shape[-2]
            mean, covar = self.prior(torch.cat([Z, x], dim=-2))
            terms = whiten_prior(*split_prior(mean, covar, M, dense=False), self.jitter, dt)
            d = conditional_variances(terms.k_diag, terms.a_sq, self.jitter)
            self._terms = TargetPriorTerms(mu=terms.mu_X, L=terms.L, A=terms.A, mu_Z=terms.mu_Z, d=d)
        self._prior_cache.put([], self._model_tensors(), (), ())
        self.version += 1

    @property
    def terms(self) -> TargetPriorTerms:
        """The cached prior terms (see :class:`TargetPriorTerms`)."""
        return self._terms

    @with_linalg_advice("the sampler's prior")
    @torch.no_grad()
    def conditional_terms(self, x_new: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        r"""For new inputs: prior mean :math:`\mu_*` (T, n), projection :math:`P` (T, n_cond, n) such that the
        conditional mean is :math:`\mu_* + P^\top w` (:math:`w` from :meth:`conditioning_values`), the conditional
        covariance (T, n, n) and its diagonal."""
        dt = self.linalg_dtype
        terms = self._terms
        cond_x = self.inducing_points if self.is_sparse else self.x
        if cond_x.shape[:-2] != x_new.shape[:-2]:
            batch = torch.broadcast_shapes(cond_x.shape[:-2], x_new.shape[:-2])
            cond_x, x_new = cond_x.expand(*batch, *cond_x.shape[-2:]), x_new.expand(*batch, *x_new.shape[-2:])
        n_c = cond_x.shape[-2]
        mean, covar = self.prior(torch.cat([cond_x, x_new], dim=-2))
        mu_new = mean[..., n_c:].to(dt)
        K_cn = covar[..., :n_c, n_c:].to_dense().to(dt)
        K_nn = covar[..., n_c:, n_c:].to_dense().to(dt)
        W = tri_solve(terms.L, K_cn)  # L^{-1} K_{c,new}
        cov = K_nn - W.mT @ W
        P = W if self.is_sparse else tri_solve(terms.L.mT, W, upper=True)  # sparse: A_*; exact: K^{-1} K_{X,new}
        return mu_new, P, cov, cov.diagonal(dim1=-1, dim2=-2).clamp_min(0)

    def conditioning_values(self, f: Tensor, u: Tensor | None) -> Tensor:
        r"""The values :math:`w` the prediction at new inputs conditions on, from draws in storage layout
        (``(B, N)`` / ``(B, T, N)`` and ``u`` likewise): :math:`w = f - \mu_0` (exact) or the whitened inducing
        values :math:`v = L^{-1}(u - \mu_Z)` (sparse); ``(B, T, n_cond)`` in ``linalg_dtype``."""
        dt, T, terms = self.linalg_dtype, self.num_latents, self._terms
        if self.is_sparse:
            u = u.to(dt).reshape(u.shape[0], T, -1)
            return tri_solve(terms.L, (u - terms.mu_Z).unsqueeze(-1)).squeeze(-1)
        return f.to(dt).reshape(f.shape[0], T, -1) - terms.mu

    # ------------------------------------------------------------------ layouts
    def to_likelihood(self, f: Tensor) -> Tensor:
        """internal (C, T, N) -> the likelihood's layout (C, N) / (C, N, T) in the data's dtype."""
        f = f.to(self.dtype)
        return f[..., 0, :] if self.num_latents == 1 else f.mT

    def from_likelihood(self, t: Tensor, shape: torch.Size) -> Tensor:
        """(h or λ) in the likelihood's layout (..., N) / (..., T, N) -> internal (C, T, N) in ``linalg_dtype``."""
        t = t.to(self.linalg_dtype)
        if self.num_latents == 1:
            t = t.unsqueeze(-2)
        return t.expand(shape)

    def to_storage(self, t: Tensor) -> Tensor:
        """internal (..., T, n) -> (..., n) for one latent, unchanged otherwise."""
        return t.squeeze(-2) if self.num_latents == 1 else t

    def from_storage(self, t: Tensor, num_chains: int | None, name: str = "init f") -> Tensor:
        """User/storage layout (n,), (T, n), (C, n), (C, T, n) -> internal (C, T, n) in ``linalg_dtype``."""
        T, n = self.num_latents, self.num_data
        given = tuple(torch.as_tensor(t).shape)
        t = torch.as_tensor(t).to(device=self.device, dtype=self.linalg_dtype)
        check_finite(name, t)
        if T == 1 and t.dim() >= 1:
            t = t.unsqueeze(-2)
        if t.dim() not in (2, 3) or t.shape[-2:] != (T, n):
            expected = f"(N,) or (chains, N), N = {n}" if T == 1 else f"(T, N) or (chains, T, N), T = {T}, N = {n}"
            raise ValueError(f"{name} must have shape {expected}; got shape {given}")
        if t.dim() == 2:
            t = t.unsqueeze(0)
        if num_chains is not None and t.shape[0] not in (1, num_chains):
            raise ValueError(f"{name} holds {t.shape[0]} chains but num_chains = {num_chains}")
        C = num_chains if num_chains is not None else t.shape[0]
        return t.expand(C, T, n).clone()

    def chain_batched(self, value: Tensor, num_chains: int) -> Tensor:
        """Give a draw a leading chain dimension if the likelihood returned it without one."""
        if value.dim() == 0 or value.shape[0] != num_chains:
            value = value.expand((num_chains,) + value.shape)
        return value

    def checked_targets(self, y: Tensor | None) -> Tensor:
        """``y`` (default: the training targets) validated and in canonical form; may carry a chain dimension."""
        if y is None:
            return self.y
        check_finite("y", y)
        if y.shape[-1] != self.num_observations:
            raise ValueError(
                f"y must have {self.num_observations} points in its last dimension; got shape {tuple(y.shape)}"
            )
        y = float_targets(y, dict(self.target_kwargs), self.dtype)
        return self.likelihood.check_targets(y, **self.target_kwargs)

    def u_from_v(self, v: Tensor) -> Tensor:
        r"""Inducing values :math:`u = \mu_Z + L v` from whitened ones (internal layout)."""
        return self._terms.mu_Z + vecmat(v, self._terms.L.mT)

    def initial_f(self, num_chains: int, generator: torch.Generator) -> Tensor:
        """A prior draw per chain (over-dispersed starting points for R-hat), internal layout."""
        terms = self._terms
        T, n = terms.L.shape[0], terms.L.shape[-1]
        eps = torch.randn((num_chains, T, n), generator=generator, dtype=terms.L.dtype, device=terms.L.device)
        f = terms.mu + vecmat(eps, terms.A)  # sparse: mu + A^T eps; exact: mu + L eps
        if self.is_sparse and bool((terms.d > 0).any()):  # f ~ p(f | u), u ~ p(u)
            f = f.addcmul_(terms.d.sqrt(), torch.randn(f.shape, generator=generator, dtype=f.dtype, device=f.device))
        return f

    # ------------------------------------------------------------------ the likelihood's constants
    def constants(self, values: Mapping[str, Tensor]) -> AbstractContextManager:
        """The likelihood evaluated at (per-chain) values of its constants for the ``with`` block (nothing to do
        without any); the likelihood itself is never modified."""
        return self.likelihood.constants(dict(values)) if values else nullcontext()

    def constants_snapshot(self, constants: Mapping[str, Tensor], num_chains: int | None = None) -> dict[str, Tensor]:
        """The likelihood's parameters at ``constants``, constrained (``raw_`` stripped); with ``num_chains`` the
        chains' own values (those in ``constants``) as they are and every other value repeated per chain,
        ``(num_chains, *the parameter's shape)``, so that a shared parameter whose first dimension happens to equal
        the number of chains is never read as per-chain."""
        out = {}
        with self.constants(constants):
            for name, param, constraint in self.likelihood.named_parameters_and_constraints():
                head, _, leaf = name.rpartition(".")
                if constraint is not None and leaf.startswith("raw_"):
                    name = (head + "." if head else "") + leaf[len("raw_") :]
                    param = constraint.transform(param)
                out[name] = param.detach().clone()
        if num_chains is None:
            return out
        own = {name: param.shape for name, param in self.constants_snapshot({}).items()}
        shared = {k for k, v in out.items() if k not in constants and v.shape != (num_chains,) + own[k]}
        return {k: v.expand((num_chains,) + own[k]).clone() if k in shared else v for k, v in out.items()}

    def initial_constants(self, state: ChainState | None) -> dict[str, Tensor]:
        """The sampled constants a run starts from: those of ``state`` (validated names), else none (the
        likelihood's own values)."""
        if state is None or not state.hyper:
            return {}
        constants = dict(state.hyper)
        try:
            with self.constants(constants):
                pass
        except ValueError as err:
            raise ValueError(f"init holds hyper-parameters the likelihood does not have: {err}") from err
        return constants


def _warn_exact_gp(model: Any, caller: str) -> None:
    """Warn that an ``ExactGP`` only lends its prior to the sampler (its own calls give a Gaussian posterior)."""
    if isinstance(model, gpytorch.models.ExactGP):
        warnings.warn(
            f"{caller} got a gpytorch ExactGP ({type(model).__name__}): only its prior, model.forward(x), is "
            "used. The ExactGP's own posterior, model(x) in eval mode and likelihood(model(x)), is a Gaussian-"
            "regression posterior that ignores this sampler's likelihood and draws. Hold the prior in "
            "gpytorch_augment.GPPrior(mean_module, covar_module) and predict with samples.predict(x_new).",
            UserWarning,
            stacklevel=4,
        )
