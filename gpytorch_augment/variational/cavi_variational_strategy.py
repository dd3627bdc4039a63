r"""Variational strategies that accept closed-form (CAVI) updates of :math:`q(u)`.

Given expected potentials :math:`\bar h` and precisions :math:`\bar\lambda` at inputs :math:`X`, the optimal
Gaussian :math:`q(u)` of a sparse GP is available in closed form. In whitened coordinates
(:math:`u = \mu_Z + L v`, :math:`K_{ZZ} + \epsilon I = L L^\top`, :math:`A = L^{-1} K_{ZX}`):

.. math::
    q(v) = \mathcal N(B^{-1} b,\; B^{-1}),\qquad B = I + A \,\mathrm{diag}(\bar\lambda)\, A^\top,\qquad
    b = A\,(\bar h - \bar\lambda \odot \mu_X).

:math:`B` has every eigenvalue :math:`\ge 1`; it is factorised as :math:`B = C^\top C` with :math:`C` lower
triangular (the "reverse Cholesky"), so :math:`C^{-1}` is directly the Cholesky factor of the new covariance.
A damped (natural-gradient) step of size :math:`\rho` mixes natural parameters,
:math:`\theta \leftarrow (1-\rho)\theta + \rho\hat\theta`. The same algebra serves the whitened
(:class:`CAVIVariationalStrategy`) and unwhitened (:class:`UnwhitenedCAVIVariationalStrategy`) storage, and
writes into GPyTorch's ``CholeskyVariationalDistribution``, ``NaturalVariationalDistribution`` and
``TrilNaturalVariationalDistribution``. A full (non-sparse) variational GP is the special case :math:`Z = X`.

Internally :math:`q(v)` is carried as :math:`(\theta_1, C)` with :math:`\theta_1 = S_v^{-1} m_v` and
:math:`S_v^{-1} = C^\top C`. Every factorisation runs in the ``linear_operator`` Cholesky dtype (float64 by
default) and results are cast back to the parameters' dtype.

**Prior-term cache.** The prior terms :math:`(L, A, \mu_Z, \mu_X, \operatorname{diag} K_{XX}, \lVert A_i\rVert^2)`
depend only on :math:`X`, the inducing inputs and the model's hyper-parameters, which full-batch CAVI with fixed
hyper-parameters never changes. :meth:`~_CAVIMixin.cavi_terms` therefore keeps the last result it computed without
an autograd graph, keyed on a *copy of the values* of :math:`X`, of every parameter and buffer of the model except
those of :math:`q(u)`, and of the modules' train/eval flags, the jitter and the linear-algebra dtype; it re-uses it
only when all of them compare equal and no graph is needed. Any change -- an optimizer step, ``load_state_dict``,
moving inducing points, writing into ``x`` in place, ``train()``/``eval()`` -- is a cache miss. What is not seen:
plain Python attributes that change what ``model.forward`` computes without changing a tensor (call
:meth:`~_CAVIMixin.clear_cavi_cache` after such a change, or pass ``cache=False``).
"""

from __future__ import annotations

from itertools import chain
from typing import Any, NamedTuple

import torch
from gpytorch.variational import (
    CholeskyVariationalDistribution,
    NaturalVariationalDistribution,
    TrilNaturalVariationalDistribution,
    UnwhitenedVariationalStrategy,
    VariationalStrategy,
    _VariationalDistribution,
)
from linear_operator.settings import _linalg_dtype_cholesky
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from .._numerics import reverse_cholesky


class CAVITerms(NamedTuple):
    """Prior quantities at a set of inputs, in the linear-algebra dtype."""

    L: Tensor  # chol(K_ZZ + jitter I), (*b, M, M)
    A: Tensor  # L^{-1} K_ZX, (*b, M, N)
    mu_Z: Tensor  # (*b, M)
    mu_X: Tensor  # (*b, N)
    k_diag: Tensor  # diag K_XX, (*b, N)
    a_sq: Tensor  # squared column norms ||A_i||^2, i.e. diag(Q_XX), (*b, N)


class WhitenedQ(NamedTuple):
    r""":math:`q(v)` as natural vector :math:`\theta_1` and lower :math:`C` with :math:`S_v^{-1} = C^\top C`."""

    theta1: Tensor  # (*b, M)
    C: Tensor  # (*b, M, M)

    @property
    def chol_covariance(self) -> Tensor:
        """Lower Cholesky factor of :math:`S_v`, i.e. :math:`C^{-1}`."""
        eye = torch.eye(self.C.shape[-1], dtype=self.C.dtype, device=self.C.device)
        return torch.linalg.solve_triangular(self.C, eye.expand_as(self.C), upper=False)

    @property
    def mean(self) -> Tensor:
        """:math:`m_v = C^{-1} C^{-\\top} \\theta_1`."""
        t = torch.linalg.solve_triangular(self.C.mT, self.theta1.unsqueeze(-1), upper=True)
        return torch.linalg.solve_triangular(self.C, t, upper=False).squeeze(-1)


def _tri_solve(L: Tensor, rhs: Tensor, upper: bool = False, left: bool = True) -> Tensor:
    return torch.linalg.solve_triangular(L, rhs, upper=upper, left=left)


def _mv(mat: Tensor, vec: Tensor) -> Tensor:
    return (mat @ vec.unsqueeze(-1)).squeeze(-1)


#: up to this many extra kernel entries, the prior at ``cat[Z, x]`` is evaluated as one dense block (one kernel call
#: instead of two: cheaper for small batches, where the per-call overhead dominates)
_DENSE_PRIOR_ELEMENTS = 2**16


def _same(a: Tensor, b: Tensor) -> bool:
    """Equal shape, dtype, device and values (NaN never equals)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)


class _PriorCacheEntry(NamedTuple):
    """The last prior terms computed without a graph, and a copy of everything they were computed from."""

    x: Tensor  # a copy of the inputs
    tensors: list[Tensor]  # the model's tensors the prior may depend on (references)
    values: list[Tensor]  # copies of their values
    flags: tuple[Any, ...]  # train/eval flags, jitter, linear-algebra dtype
    terms: CAVITerms
    versions: tuple[int, ...]  # of the cached terms (an in-place write into them invalidates the entry)


class _CAVIMixin:
    """The CAVI update, shared by the whitened and unwhitened strategies."""

    #: whether ``forward`` adds ``jitter_val`` to the data variances (whitened: yes)
    _data_jitter: bool = True

    # ---------------------------------------------------------------- prior terms
    def _linalg_dtype(self) -> torch.dtype:
        return _linalg_dtype_cholesky.value()

    def cavi_terms(self, x: Tensor, cache: bool = True) -> CAVITerms:
        r"""Evaluate the model's prior at ``cat[Z, x]`` exactly as ``forward`` does, and whiten it.

        With ``cache=True`` (default), a result computed without an autograd graph (under ``torch.no_grad()``, or
        when neither ``x`` nor any model tensor requires a gradient) is kept and returned again -- the same tensors,
        which must not be modified in place -- for as long as ``x``, the model's parameters and buffers other than
        :math:`q(u)`'s, its train/eval flags, ``jitter_val`` and the linear-algebra dtype all keep their values
        (see the module docstring). When a graph is needed the terms are always recomputed.
        """
        use_cache = cache and not torch.is_inference_mode_enabled()
        if use_cache:
            tensors, flags = self._prior_dependencies()
            if torch.is_grad_enabled() and (x.requires_grad or any(t.requires_grad for t in tensors)):
                use_cache = False
            else:
                hit = self._cache_lookup(x, tensors, flags)
                if hit is not None:
                    return hit
        terms = self._compute_terms(x)
        if use_cache:
            with torch.no_grad():
                self._cavi_cache = _PriorCacheEntry(
                    x=x.detach().clone(),
                    tensors=tensors,
                    values=[t.detach().clone() for t in tensors],
                    flags=flags,
                    terms=terms,
                    versions=tuple(t._version for t in terms),
                )
        return terms

    def clear_cavi_cache(self) -> None:
        """Forget the cached prior terms of :meth:`cavi_terms` (only needed after a change it cannot see)."""
        self._cavi_cache = None

    def __getstate__(self) -> dict[str, Any]:
        # neither pickled nor deep-copied: a copy starts without cache
        state = super().__getstate__()
        state.pop("_cavi_cache", None)
        return state

    def _prior_dependencies(self) -> tuple[list[Tensor], tuple[Any, ...]]:
        """Every tensor the prior at ``cat[Z, x]`` may depend on -- the parameters and buffers of all the model's
        modules except the variational distributions and the initialisation flags -- and the non-tensor state: the
        modules' training flags, the jitter and the linear-algebra dtype."""
        tensors: list[Tensor] = [self.inducing_points]
        flags: list[Any] = [float(self.jitter_val), self._linalg_dtype()]
        for module in self.model.modules():
            flags.append(module.training)
            if isinstance(module, _VariationalDistribution):
                continue
            named = chain(module.named_parameters(recurse=False), module.named_buffers(recurse=False))
            tensors.extend(t for name, t in named if t is not None and name != "variational_params_initialized")
        return tensors, tuple(flags)

    def _cache_lookup(self, x: Tensor, tensors: list[Tensor], flags: tuple[Any, ...]) -> CAVITerms | None:
        entry: _PriorCacheEntry | None = getattr(self, "_cavi_cache", None)
        if (
            entry is None
            or entry.flags != flags
            or len(entry.tensors) != len(tensors)
            or any(a is not b for a, b in zip(entry.tensors, tensors))
            or entry.versions != tuple(t._version for t in entry.terms)
            or not _same(entry.x, x)
            or not all(_same(value, t) for value, t in zip(entry.values, tensors))
        ):
            return None
        return entry.terms

    def _prior_blocks(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(mean at cat[Z, x], K_ZZ, K_ZX, diag K_XX)`` of ``model.forward(cat[Z, x])``, in the model's dtype.

        The kernel is evaluated once for the rows of ``Z`` (``K(Z, [Z; x])``) plus the diagonal at ``x``, or, for a
        small batch, as one dense block."""
        Z = self.inducing_points
        if Z.shape[:-2] != x.shape[:-2]:
            x, Z = self._expand_inputs(x, Z)
        M, N = Z.shape[-2], x.shape[-2]
        prior = self.model.forward(torch.cat([Z, x], dim=-2))
        covar = prior.lazy_covariance_matrix
        if N * (M + N) <= _DENSE_PRIOR_ELEMENTS:
            dense = covar.to_dense()
            rows, k_diag = dense[..., :M, :], dense[..., M:, M:].diagonal(dim1=-1, dim2=-2)
        else:
            rows, k_diag = covar[..., :M, :].to_dense(), covar[..., M:, M:].diagonal(dim1=-1, dim2=-2)
        return prior.mean, rows[..., :M], rows[..., M:], k_diag

    def _compute_terms(self, x: Tensor) -> CAVITerms:
        dtype = self._linalg_dtype()
        mean, K_ZZ, K_ZX, k_diag = (t.to(dtype) for t in self._prior_blocks(x))
        M = K_ZZ.shape[-1]
        eye = torch.eye(M, dtype=dtype, device=K_ZZ.device)
        L = psd_safe_cholesky(K_ZZ + self.jitter_val * eye)
        A = _tri_solve(L, K_ZX)
        if self._data_jitter:
            k_diag = k_diag + self.jitter_val
        return CAVITerms(
            L=L, A=A, mu_Z=mean[..., :M], mu_X=mean[..., M:], k_diag=k_diag, a_sq=A.pow(2).sum(-2)
        )

    # ---------------------------------------------------------------- reading / writing q
    def _check_distribution(self) -> _VariationalDistribution:
        dist = self._variational_distribution
        if not isinstance(
            dist, (CholeskyVariationalDistribution, NaturalVariationalDistribution, TrilNaturalVariationalDistribution)
        ):
            raise TypeError(
                f"{type(dist).__name__} cannot take CAVI updates: the optimal q(u) has a full covariance. Use "
                "CholeskyVariationalDistribution, NaturalVariationalDistribution or TrilNaturalVariationalDistribution."
            )
        return dist

    def _stored_natural(self) -> tuple[Tensor, Tensor]:
        r"""Current :math:`q` in the *stored* coordinates as :math:`(\theta_1, C)`, :math:`S^{-1} = C^\top C`."""
        dist = self._check_distribution()
        dtype = self._linalg_dtype()
        if isinstance(dist, TrilNaturalVariationalDistribution):
            return dist.natural_vec.to(dtype), dist.natural_tril_mat.to(dtype).tril()
        if isinstance(dist, NaturalVariationalDistribution):
            return dist.natural_vec.to(dtype), reverse_cholesky(-2 * dist.natural_mat.to(dtype))
        R = dist.chol_variational_covar.to(dtype).tril()
        eye = torch.eye(R.shape[-1], dtype=dtype, device=R.device).expand_as(R)
        C = _tri_solve(R, eye)
        return _mv(C.mT @ C, dist.variational_mean.to(dtype)), C

    def _whiten(self, theta1: Tensor, C: Tensor, terms: CAVITerms) -> WhitenedQ:
        """Stored coordinates -> whitened coordinates (identity for the whitened strategy)."""
        return WhitenedQ(theta1, C)

    def _unwhiten(self, q: WhitenedQ, terms: CAVITerms) -> tuple[Tensor, Tensor]:
        """Whitened coordinates -> stored coordinates (identity for the whitened strategy)."""
        return q.theta1, q.C

    def whitened_q(self, terms: CAVITerms) -> WhitenedQ:
        """The current :math:`q(v)` in whitened coordinates, relative to ``terms.L``."""
        theta1, C = self._stored_natural()
        theta1 = theta1.expand(terms.mu_Z.shape)
        C = C.expand(terms.L.shape)
        return self._whiten(theta1, C, terms)

    @torch.no_grad()
    def _write(self, q: WhitenedQ, terms: CAVITerms) -> None:
        dist = self._variational_distribution
        theta1, C = self._unwhiten(q, terms)
        if isinstance(dist, TrilNaturalVariationalDistribution):
            dist.natural_vec.copy_(theta1)
            dist.natural_tril_mat.copy_(C)
        elif isinstance(dist, NaturalVariationalDistribution):
            dist.natural_vec.copy_(theta1)
            dist.natural_mat.copy_(-0.5 * C.mT @ C)
        else:
            stored = WhitenedQ(theta1, C)
            dist.variational_mean.copy_(stored.mean)
            dist.chol_variational_covar.copy_(stored.chol_covariance)
        self.variational_params_initialized.fill_(1)
        self._clear_cache()

    # ---------------------------------------------------------------- marginals, KL, update
    @staticmethod
    def marginals(terms: CAVITerms, q: WhitenedQ) -> tuple[Tensor, Tensor]:
        r"""Means and variances of :math:`q(f_i)`: :math:`m = \mu_X + A^\top m_v`,
        :math:`s = k_{ii} - \lVert A_i\rVert^2 + \lVert C^{-\top} A_i\rVert^2`."""
        mean = terms.mu_X + (q.mean.unsqueeze(-2) @ terms.A).squeeze(-2)  # m_v^T A: faster than A^T m_v batched
        CA = _tri_solve(q.C.mT, terms.A, upper=True)
        CA_sq = CA.square() if CA.requires_grad else CA.square_()  # CA is ours: square in place unless differentiated
        var = terms.k_diag - terms.a_sq + CA_sq.sum(-2)
        return mean, var.clamp_min(0)

    @staticmethod
    def kl_whitened(q: WhitenedQ) -> Tensor:
        r""":math:`\mathrm{KL}(q(v)\,\Vert\,\mathcal N(0, I)) = \mathrm{KL}(q(u)\,\Vert\,p(u))`."""
        M = q.C.shape[-1]
        R = q.chol_covariance
        m = q.mean
        logdet_prec = 2 * q.C.diagonal(dim1=-1, dim2=-2).abs().log().sum(-1)
        return 0.5 * (R.pow(2).sum((-1, -2)) + m.pow(2).sum(-1) - M + logdet_prec)

    @torch.no_grad()
    def cavi_target(
        self, x: Tensor, h: Tensor, lam: Tensor, terms: CAVITerms | None = None
    ) -> tuple[Tensor, Tensor]:
        r"""The natural parameters of the optimal whitened :math:`q(v)` for potentials ``h`` and precisions
        ``lam`` at ``x``, without writing anything: :math:`(b, B)` with

        .. math::
            B = I + A\,\mathrm{diag}(\bar\lambda)\,A^\top,\qquad b = A\,(\bar h - \bar\lambda\odot\mu_X),

        i.e. :math:`\hat\theta_1 = b` and :math:`\hat\theta_2 = -\tfrac12 B` (``(*batch, M)`` and
        ``(*batch, M, M)``, in the linear-algebra dtype). The natural gradient of the ELBO in whitened natural
        parameters is :math:`\hat\theta - \theta`.
        """
        if terms is None:
            terms = self.cavi_terms(x)
        dtype = terms.A.dtype
        h, lam = h.to(dtype), lam.to(dtype)
        A = terms.A
        B = (A * lam.unsqueeze(-2)) @ A.mT
        B.diagonal(dim1=-1, dim2=-2).add_(1.0)
        b = _mv(A, h - lam * terms.mu_X)
        return b, B

    @torch.no_grad()
    def cavi_update(
        self, x: Tensor, h: Tensor, lam: Tensor, step: float = 1.0, terms: CAVITerms | None = None
    ) -> WhitenedQ:
        r"""Write the optimal (``step=1``) or damped (``step<1``) :math:`q(u)` for potentials ``h`` and
        precisions ``lam`` at ``x`` into the variational distribution; returns the new :math:`q(v)`.

        ``h`` and ``lam`` have shape ``(*batch, N)`` (latent-major ``(T, N)`` for a batched strategy); for a
        mini-batch, pass them already multiplied by ``num_data / batch_size``.
        """
        if not 0.0 < step <= 1.0:
            raise ValueError(f"step must be in (0, 1], got {step}")
        self._check_distribution()
        if terms is None:
            terms = self.cavi_terms(x)
        b, B = self.cavi_target(x, h, lam, terms)
        if step < 1.0:
            old = self.whitened_q(terms)
            B = (1 - step) * (old.C.mT @ old.C) + step * B
            b = (1 - step) * old.theta1 + step * b
        q = WhitenedQ(b, reverse_cholesky(B))
        self._write(q, terms)
        return q


class CAVIVariationalStrategy(_CAVIMixin, VariationalStrategy):
    r"""GPyTorch's whitened ``VariationalStrategy`` plus :meth:`cavi_update`.

    Example::

        >>> class SVGP(gpytorch.models.ApproximateGP):
        ...     def __init__(self, Z):
        ...         q_u = gpytorch.variational.NaturalVariationalDistribution(Z.size(0))
        ...         super().__init__(CAVIVariationalStrategy(self, Z, q_u, learn_inducing_locations=False))
        ...         self.mean_module = gpytorch.means.ConstantMean()
        ...         self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
        ...     def forward(self, x):
        ...         return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))
    """

    _data_jitter = True


class UnwhitenedCAVIVariationalStrategy(_CAVIMixin, UnwhitenedVariationalStrategy):
    r"""GPyTorch's ``UnwhitenedVariationalStrategy`` plus :meth:`cavi_update`.

    :math:`q(u)` is stored directly; the update is computed in whitened coordinates and mapped back
    (:math:`S_u^{-1} = L^{-\top} C^\top C L^{-1}`, :math:`\theta_{1,u} = L^{-\top}\theta_{1,v} + S_u^{-1}\mu_Z`).
    """

    _data_jitter = False

    def _whiten(self, theta1: Tensor, C: Tensor, terms: CAVITerms) -> WhitenedQ:
        # P_v = L^T P_u L = (C_u L)^T (C_u L);  theta1_v = L^T (theta1_u - P_u mu_Z)
        P_u_mu = _mv(C.mT, _mv(C, terms.mu_Z))
        return WhitenedQ(_mv(terms.L.mT, theta1 - P_u_mu), C @ terms.L)

    def _unwhiten(self, q: WhitenedQ, terms: CAVITerms) -> tuple[Tensor, Tensor]:
        C_u = _tri_solve(terms.L, q.C, left=False)  # C_v L^{-1}, lower
        theta1 = _tri_solve(terms.L.mT, q.theta1.unsqueeze(-1), upper=True).squeeze(-1)
        theta1 = theta1 + _mv(C_u.mT, _mv(C_u, terms.mu_Z))
        return theta1, C_u
