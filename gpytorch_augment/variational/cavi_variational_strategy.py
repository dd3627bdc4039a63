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

**Blocks of data points.** Where the data are many, on the CPU (:func:`~gpytorch_augment.core.linalg.block_width`:
more than two blocks of about :data:`~gpytorch_augment.core.linalg.BLOCK_ELEMENTS` entries of :math:`A`), the prior is
evaluated as ``model.forward(cat[Z, x_b])`` for consecutive blocks :math:`x_b` and whitened block by block, so no
kernel matrix larger than a block is ever held beside :math:`A`. This takes ``model.forward`` to treat the data
points independently, as every GPyTorch mean and kernel does (a feature extractor with batch statistics, e.g.
batch normalisation in training mode, does not).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from itertools import chain
from typing import Any

import torch
from gpytorch.variational import (
    CholeskyVariationalDistribution,
    IndependentMultitaskVariationalStrategy,
    NaturalVariationalDistribution,
    TrilNaturalVariationalDistribution,
    UnwhitenedVariationalStrategy,
    VariationalStrategy,
    _VariationalDistribution,
)
from linear_operator.settings import _linalg_dtype_cholesky
from torch import Tensor

from .._numerics import reverse_cholesky
from .._validation import check_finite
from ..core import NaturalParameters, PriorCache, PriorTerms, SufficientStatistics, WhitenedGaussian
from ..core.design import LinearObservations
from ..core.linalg import block_width, mv, tri_solve
from ..core.prior import split_prior, whiten_prior_blocks

#: the prior terms at a set of inputs (:class:`~gpytorch_augment.core.PriorTerms`)
CAVITerms = PriorTerms
#: a whitened :math:`q(v)` (:class:`~gpytorch_augment.core.WhitenedGaussian`)
WhitenedQ = WhitenedGaussian

__all__ = ["CAVITerms", "CAVIVariationalStrategy", "UnwhitenedCAVIVariationalStrategy", "WhitenedQ"]


class _CAVIMixin:
    """The CAVI update, shared by the whitened and unwhitened strategies: prior terms and statistics come from
    :mod:`gpytorch_augment.core`; the strategy only maps :math:`q(v)` to and from its variational distribution."""

    #: whether ``forward`` adds ``jitter_val`` to the data variances (whitened: yes)
    _data_jitter: bool = True

    #: dtype of every factorisation of the CAVI step (``None``: ``linear_operator``'s Cholesky dtype, float64 by
    #: default). Set ``strategy.linalg_dtype = torch.float32`` for speed on a GPU where the kernel matrices are well
    #: conditioned; float64 is the safe choice (ill-conditioned factorisations fail in float32).
    linalg_dtype: torch.dtype | None = None

    # ---------------------------------------------------------------- prior terms
    def _linalg_dtype(self) -> torch.dtype:
        return self.linalg_dtype or _linalg_dtype_cholesky.value()

    def _store(self, name: str) -> PriorCache:
        """The strategy's cache ``name``, created on first use (kept out of the module's state)."""
        cache = self.__dict__.get(name)
        if cache is None:
            cache = self.__dict__[name] = PriorCache()
        return cache

    @property
    def _prior_cache(self) -> PriorCache:
        return self._store("_cavi_prior_cache")

    @property
    def cached_cavi_terms(self) -> PriorTerms | None:
        """The prior terms :meth:`cavi_terms` last cached (``None`` if nothing is cached)."""
        entry = self._prior_cache._entry
        return None if entry is None else PriorTerms(*entry.value)

    def cavi_terms(self, x: Tensor, cache: bool = True) -> PriorTerms:
        r"""Evaluate the model's prior at ``cat[Z, x]`` exactly as ``forward`` does, and whiten it.

        With ``cache=True`` (default), a result computed without an autograd graph (under ``torch.no_grad()``, or
        when neither ``x`` nor any model tensor requires a gradient) is kept and returned again -- the same tensors,
        which must not be modified in place -- for as long as ``x``, the model's parameters and buffers other than
        :math:`q(u)`'s, its train/eval flags, ``jitter_val`` and the linear-algebra dtype all keep their values
        (see the module docstring). When a graph is needed the terms are always recomputed.
        """
        return self._cached(self._prior_cache, [x], cache, lambda: self._compute_terms(x))

    def _cached(
        self, store: PriorCache, inputs: list[Tensor], cache: bool, compute: Callable[[], PriorTerms]
    ) -> PriorTerms:
        """``compute()``, kept in ``store`` keyed on ``inputs`` and the model's prior dependencies when ``cache`` is
        set and no autograd graph is needed (the rule of :meth:`cavi_terms`)."""
        use_cache = cache and not torch.is_inference_mode_enabled()
        if use_cache:
            tensors, flags = self._prior_dependencies()
            if torch.is_grad_enabled() and (inputs[0].requires_grad or any(t.requires_grad for t in tensors)):
                use_cache = False
            else:
                hit = store.get(inputs, tensors, flags)
                if hit is not None:
                    return PriorTerms(*hit)
        terms = compute()
        if use_cache:
            store.put(inputs, tensors, flags, tuple(terms))
        return terms

    def observation_terms(self, x: Tensor, design: LinearObservations, cache: bool = True) -> PriorTerms:
        r"""The prior terms of the linear observations :math:`g = Df` of the latent values at ``x``
        (:meth:`LinearObservations.observed <gpytorch_augment.core.LinearObservations.observed>`): :meth:`cavi_terms`
        at ``x`` and the entries of :math:`K_{XX}` the observations read (the prior covariance at ``x`` is evaluated
        densely, :math:`O(N^2)` for the ``N`` points of ``x``). Cached like :meth:`cavi_terms`, keyed also on the
        design."""

        def compute() -> PriorTerms:
            terms = self.cavi_terms(x, cache=cache)
            K_XX = self.model.forward(x).lazy_covariance_matrix.to_dense()
            return design.observed(terms, K_XX, self.jitter_val if self._data_jitter else 0.0)

        return self._cached(self._observation_cache, [x, design.index, design.weight], cache, compute)

    @property
    def _observation_cache(self) -> PriorCache:
        return self._store("_cavi_observation_cache")

    def clear_cavi_cache(self) -> None:
        """Forget the cached prior terms of :meth:`cavi_terms` (only needed after a change it cannot see)."""
        self._prior_cache.clear()
        self._observation_cache.clear()

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

    def _compute_terms(self, x: Tensor) -> PriorTerms:
        Z = self.inducing_points
        if Z.shape[:-2] != x.shape[:-2]:
            x, Z = self._expand_inputs(x, Z)
        M = Z.shape[-2]

        def blocks() -> Iterator[tuple[Tensor, Tensor, Tensor, Tensor]]:  # the kernel evaluated block by block
            for x_b in x.split(block_width(x.shape[-2], M * math.prod(x.shape[:-2]), x.device), -2):
                prior = self.model.forward(torch.cat([Z, x_b], dim=-2))
                yield split_prior(prior.mean, prior.lazy_covariance_matrix, M)

        return whiten_prior_blocks(blocks(), self.jitter_val, self._linalg_dtype(), data_jitter=self._data_jitter)

    # ---------------------------------------------------------------- reading / writing q
    def check_distribution(self) -> _VariationalDistribution:
        """The variational distribution, if it can take CAVI updates (``TypeError`` otherwise)."""
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
        dist = self.check_distribution()
        dtype = self._linalg_dtype()
        if isinstance(dist, TrilNaturalVariationalDistribution):
            return dist.natural_vec.to(dtype), dist.natural_tril_mat.to(dtype).tril()
        if isinstance(dist, NaturalVariationalDistribution):
            return dist.natural_vec.to(dtype), reverse_cholesky(-2 * dist.natural_mat.to(dtype))
        R = dist.chol_variational_covar.to(dtype).tril()
        eye = torch.eye(R.shape[-1], dtype=dtype, device=R.device).expand_as(R)
        C = tri_solve(R, eye)
        return mv(C.mT @ C, dist.variational_mean.to(dtype)), C

    def _whiten(self, theta1: Tensor, C: Tensor, terms: PriorTerms) -> WhitenedGaussian:
        """Stored coordinates -> whitened coordinates (identity for the whitened strategy)."""
        return WhitenedGaussian(theta1, C)

    def _unwhiten(self, q: WhitenedGaussian, terms: PriorTerms) -> tuple[Tensor, Tensor]:
        """Whitened coordinates -> stored coordinates (identity for the whitened strategy)."""
        return q.theta1, q.C

    def whitened_q(self, terms: PriorTerms) -> WhitenedGaussian:
        """The current :math:`q(v)` in whitened coordinates, relative to ``terms.L``."""
        theta1, C = self._stored_natural()
        theta1 = theta1.expand(terms.mu_Z.shape)
        C = C.expand(terms.L.shape)
        return self._whiten(theta1, C, terms)

    @torch.no_grad()
    def write_whitened(self, q: WhitenedGaussian, terms: PriorTerms) -> None:
        """Store the whitened :math:`q(v)` (relative to ``terms.L``) in the variational distribution, whatever its
        parametrisation (Cholesky, Natural or TrilNatural)."""
        dist = self.check_distribution()
        theta1, C = self._unwhiten(q, terms)
        if isinstance(dist, TrilNaturalVariationalDistribution):
            dist.natural_vec.copy_(theta1)
            dist.natural_tril_mat.copy_(C)
        elif isinstance(dist, NaturalVariationalDistribution):
            dist.natural_vec.copy_(theta1)
            dist.natural_mat.copy_(-0.5 * C.mT @ C)
        else:
            stored = WhitenedGaussian(theta1, C)
            dist.variational_mean.copy_(stored.mean)
            dist.chol_variational_covar.copy_(stored.chol_covariance)
        self.variational_params_initialized.fill_(1)
        self._clear_cache()

    # ---------------------------------------------------------------- marginals, KL, update
    @staticmethod
    def marginals(terms: PriorTerms, q: WhitenedGaussian) -> tuple[Tensor, Tensor]:
        r"""Means and variances of :math:`q(f_i)` (:meth:`~gpytorch_augment.core.WhitenedGaussian.marginals`)."""
        return q.marginals(terms)

    @staticmethod
    def kl_whitened(q: WhitenedGaussian) -> Tensor:
        r""":math:`\mathrm{KL}(q(v)\,\Vert\,\mathcal N(0, I)) = \mathrm{KL}(q(u)\,\Vert\,p(u))`."""
        return q.kl()

    @torch.no_grad()
    def statistics(self, terms: PriorTerms, h: Tensor, lam: Tensor) -> SufficientStatistics:
        r"""The sufficient statistics :math:`(\sum_i a_i\lambda_i a_i^\top, \sum_i a_i(h_i - \lambda_i\mu_i))` of
        potentials ``h`` and precisions ``lam`` ``(*batch, N)`` (latent-major ``(T, N)`` for a batched strategy)
        at the inputs of ``terms``."""
        return SufficientStatistics.from_batch(terms.A, terms.mu_X, h, lam)

    @torch.no_grad()
    def cavi_target(
        self, x: Tensor | None, h: Tensor, lam: Tensor, terms: PriorTerms | None = None
    ) -> NaturalParameters:
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
        return self.statistics(terms, h, lam).natural()

    @torch.no_grad()
    def cavi_update(
        self, x: Tensor, h: Tensor, lam: Tensor, step: float = 1.0, terms: PriorTerms | None = None
    ) -> WhitenedGaussian:
        r"""Write the optimal (``step=1``) or damped (``step<1``) :math:`q(u)` for potentials ``h`` and
        precisions ``lam`` at ``x`` into the variational distribution; returns the new :math:`q(v)`.

        ``h`` and ``lam`` have shape ``(*batch, N)`` (latent-major ``(T, N)`` for a batched strategy); for a
        mini-batch, pass them already multiplied by ``num_data / batch_size``.
        """
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not 0.0 < step <= 1.0:
            raise ValueError(f"step must be a number in (0, 1], got {step!r}")
        self._check_update_arguments(x, h, lam)
        self.check_distribution()
        if terms is None:
            terms = self.cavi_terms(x)
        target = self.cavi_target(x, h, lam, terms)
        old = self.whitened_q(terms) if step < 1.0 else None
        q = target.factorize() if old is None else old.step(target, step)
        self.write_whitened(q, terms)
        return q

    def _check_update_arguments(self, x: Tensor, h: Tensor, lam: Tensor) -> None:
        """``ValueError`` unless ``x`` has the inducing inputs' dimension and ``h``, ``lam`` are finite, aligned with
        the ``N`` points of ``x``, and ``lam >= 0``."""
        check_finite("x", x)
        check_finite("h", h)
        check_finite("lam", lam)
        Z = self.inducing_points
        if x.dim() < 2 or x.shape[-1] != Z.shape[-1]:
            raise ValueError(
                f"x must have shape (N, D) with D = {Z.shape[-1]} (the inducing inputs'); got {tuple(x.shape)}"
            )
        n = x.shape[-2]
        if h.dim() < 1 or lam.dim() < 1 or h.shape[-1] != n or lam.shape[-1] != n:
            raise ValueError(
                f"h and lam must have the N = {n} data points of x in their last dimension; got h of shape "
                f"{tuple(h.shape)} and lam of shape {tuple(lam.shape)}"
            )
        if (lam < 0).any():
            raise ValueError(f"lam (precisions) must be non-negative; found {lam.min().item()}")


class CAVIVariationalStrategy(_CAVIMixin, VariationalStrategy):
    r"""GPyTorch's whitened ``VariationalStrategy`` plus :meth:`cavi_update`.

    :param model: the ``gpytorch.models.ApproximateGP`` that owns the strategy (pass ``self`` from its
        ``__init__``); its ``forward`` gives the prior at the inducing and data inputs.
    :param inducing_points: the inducing inputs :math:`Z`, ``(M, D)`` (``(*batch, M, D)`` for a batch of
        independent GPs), in the dtype of the model.
    :param variational_distribution: :math:`q(u)` over the :math:`M` inducing values: GPyTorch's
        ``CholeskyVariationalDistribution``, ``NaturalVariationalDistribution`` or
        ``TrilNaturalVariationalDistribution`` (``TypeError`` from a CAVI step with any other).
    :param learn_inducing_locations: whether :math:`Z` is a parameter that hyper-parameter steps move (``True``,
        the default) or a fixed buffer (e.g. :math:`Z = X` for a full variational GP).
    :param jitter_val: the jitter added to the diagonal of :math:`K_{ZZ}` (``None``: GPyTorch's default for
        the dtype).

    The linear-algebra dtype of the CAVI step is the attribute ``linalg_dtype`` (float64 by default).

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import CAVIVariationalStrategy
        >>> class SVGP(gpytorch.models.ApproximateGP):
        ...     def __init__(self, Z):
        ...         q_u = gpytorch.variational.NaturalVariationalDistribution(Z.size(0))
        ...         super().__init__(CAVIVariationalStrategy(self, Z, q_u, learn_inducing_locations=False))
        ...         self.mean_module = gpytorch.means.ConstantMean()
        ...         self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
        ...     def forward(self, x):
        ...         return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))
        >>> model = SVGP(torch.linspace(-1, 1, 4).unsqueeze(-1))
        >>> x = torch.linspace(-1, 1, 6).unsqueeze(-1)
        >>> q = model.variational_strategy.cavi_update(x, torch.zeros(6), torch.full((6,), 0.25))  # optimal q(u)
        >>> model(x).mean.shape
        torch.Size([6])
    """

    _data_jitter = True


class UnwhitenedCAVIVariationalStrategy(_CAVIMixin, UnwhitenedVariationalStrategy):
    r"""GPyTorch's ``UnwhitenedVariationalStrategy`` plus :meth:`cavi_update`.

    :math:`q(u)` is stored directly; the update is computed in whitened coordinates and mapped back
    (:math:`S_u^{-1} = L^{-\top} C^\top C L^{-1}`, :math:`\theta_{1,u} = L^{-\top}\theta_{1,v} + S_u^{-1}\mu_Z`).

    :param model: the ``gpytorch.models.ApproximateGP`` that owns the strategy (pass ``self`` from its
        ``__init__``); its ``forward`` gives the prior at the inducing and data inputs.
    :param inducing_points: the inducing inputs :math:`Z`, ``(M, D)`` (``(*batch, M, D)`` for a batch of
        independent GPs), in the dtype of the model.
    :param variational_distribution: :math:`q(u)` over the :math:`M` inducing values: GPyTorch's
        ``CholeskyVariationalDistribution``, ``NaturalVariationalDistribution`` or
        ``TrilNaturalVariationalDistribution`` (``TypeError`` from a CAVI step with any other).
    :param learn_inducing_locations: whether :math:`Z` is a parameter that hyper-parameter steps move (``True``,
        the default) or a fixed buffer (e.g. :math:`Z = X` for a full variational GP).
    :param jitter_val: the jitter added to the diagonal of :math:`K_{ZZ}` (``None``: GPyTorch's default for
        the dtype).

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import UnwhitenedCAVIVariationalStrategy
        >>> class SVGP(gpytorch.models.ApproximateGP):
        ...     def __init__(self, Z):
        ...         q_u = gpytorch.variational.CholeskyVariationalDistribution(Z.size(0))
        ...         super().__init__(UnwhitenedCAVIVariationalStrategy(self, Z, q_u, learn_inducing_locations=False))
        ...         self.mean_module = gpytorch.means.ZeroMean()
        ...         self.covar_module = gpytorch.kernels.RBFKernel()
        ...     def forward(self, x):
        ...         return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))
        >>> model, x = SVGP(torch.linspace(-1, 1, 3).unsqueeze(-1)), torch.linspace(-1, 1, 5).unsqueeze(-1)
        >>> _ = model.variational_strategy.cavi_update(x, torch.ones(5), torch.full((5,), 0.25))
        >>> bool(model(x).mean.gt(0).all())      # positive potentials pull the mean up
        True
    """

    _data_jitter = False

    def _whiten(self, theta1: Tensor, C: Tensor, terms: PriorTerms) -> WhitenedGaussian:
        # P_v = L^T P_u L = (C_u L)^T (C_u L);  theta1_v = L^T (theta1_u - P_u mu_Z)
        P_u_mu = mv(C.mT, mv(C, terms.mu_Z))
        return WhitenedGaussian(mv(terms.L.mT, theta1 - P_u_mu), C @ terms.L)

    def _unwhiten(self, q: WhitenedGaussian, terms: PriorTerms) -> tuple[Tensor, Tensor]:
        C_u = tri_solve(terms.L, q.C, left=False)  # C_v L^{-1}, lower
        theta1 = tri_solve(terms.L.mT, q.theta1.unsqueeze(-1), upper=True).squeeze(-1)
        theta1 = theta1 + mv(C_u.mT, mv(C_u, terms.mu_Z))
        return theta1, C_u


def cavi_strategy_of(model: Any, needed_by: str | None = None) -> _CAVIMixin | None:
    """The model's CAVI strategy (unwrapping GPyTorch's ``IndependentMultitaskVariationalStrategy``); ``None`` for any
    other model, or, with ``needed_by`` (the caller's name), a ``TypeError`` saying what it needs.

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing import SVGP
        >>> from gpytorch_augment.variational.cavi_variational_strategy import cavi_strategy_of
        >>> type(cavi_strategy_of(SVGP(torch.zeros(3, 1)))).__name__
        'CAVIVariationalStrategy'
    """
    strategy = getattr(model, "variational_strategy", None)
    if isinstance(strategy, IndependentMultitaskVariationalStrategy):
        strategy = strategy.base_variational_strategy
    if isinstance(strategy, _CAVIMixin):
        return strategy
    if needed_by is None:
        return None
    raise TypeError(
        f"{needed_by} needs a model whose variational_strategy is a CAVIVariationalStrategy or "
        "UnwhitenedCAVIVariationalStrategy (possibly inside an IndependentMultitaskVariationalStrategy); "
        f"got {type(strategy).__name__}"
    )

