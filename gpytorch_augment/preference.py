r"""A BoTorch preference model fitted by CAVI: :class:`PairwiseAugmentedGP`, usable where BoTorch takes its
``PairwiseGP`` (needs the ``botorch`` extra: ``pip install gpytorch-augment[botorch]``)."""

from __future__ import annotations

import math
import time
from copy import deepcopy
from typing import Any

import gpytorch
import torch
from torch import Tensor

try:
    from botorch.models.model import Model
    from botorch.posteriors.gpytorch import GPyTorchPosterior
    from gpytorch.models import GP
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "gpytorch_augment.preference needs BoTorch: pip install 'gpytorch-augment[botorch]' (or pip install botorch)"
    ) from err

from ._validation import check_finite, check_points
from .core import LinearObservations, PriorCache
from .core.linalg import add_to_diagonal, tri_solve
from .inference import CAVI, CAVITrace
from .likelihoods import PairwiseLogitLikelihood
from .variational import CAVIVariationalStrategy

__all__ = ["PairwiseAugmentedGP"]


class _UtilityGP(gpytorch.models.ApproximateGP):
    """The latent utility: a (sparse) variational GP with a CAVI strategy, inducing points fixed."""

    def __init__(
        self, inducing_points: Tensor, mean_module: gpytorch.means.Mean, covar_module: gpytorch.kernels.Kernel
    ) -> None:
        q_u = gpytorch.variational.CholeskyVariationalDistribution(inducing_points.shape[-2])
        super().__init__(CAVIVariationalStrategy(self, inducing_points, q_u, learn_inducing_locations=False))
        self.mean_module, self.covar_module = mean_module, covar_module

    def forward(self, x: Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


class ComparisonSizes:
    """The sizes of a preference model's data, named as BoTorch's ``PairwiseGP`` names them: ``dim`` (inputs),
    ``n`` (datapoints, ``(n, d)``) and ``m`` (comparisons, ``(m, 2)``)."""

    datapoints: Tensor
    comparisons: Tensor

    @property
    def dim(self) -> int:
        """The number of input dimensions ``d``."""
        return int(self.datapoints.shape[-1])

    @property
    def n(self) -> int:
        """The number of datapoints."""
        return int(self.datapoints.shape[-2])

    @property
    def m(self) -> int:
        """The number of comparisons."""
        return int(self.comparisons.shape[-2])


def default_covar_module(dim: int) -> gpytorch.kernels.Kernel:
    r"""The default kernel, BoTorch's ``PairwiseGP``'s: a scaled RBF kernel with one lengthscale per input dimension
    (initial value the prior's mode, 0.52), a :math:`\mathrm{Ga}(2.4, 2.7)` prior on the lengthscales and a
    smoothed box prior on :math:`[0.01, 100]` on the outputscale, constrained to :math:`[0.005, 200]` (it keeps the
    utility's scale finite when the comparisons are separable).

    Example::

        >>> from gpytorch_augment.preference import default_covar_module
        >>> round(float(default_covar_module(2).outputscale.detach()), 3)
        1.0
    """
    prior = gpytorch.priors.GammaPrior(2.4, 2.7)
    rbf = gpytorch.kernels.RBFKernel(ard_num_dims=dim, lengthscale_prior=prior)
    rbf.lengthscale = (prior.concentration - 1) / prior.rate
    return gpytorch.kernels.ScaleKernel(
        rbf,
        outputscale_prior=gpytorch.priors.SmoothedBoxPrior(0.01, 100.0),
        outputscale_constraint=gpytorch.constraints.Interval(0.005, 200.0, initial_value=1.0),
    )


def _mean_omega(c: Tensor) -> Tensor:
    r""":math:`E[\omega] = \tanh(c/2) / (2c)` under :math:`\mathrm{PG}(1, c)`, :math:`c \ge 0` (1/4 at 0)."""
    small = c < 1e-4
    safe = torch.where(small, torch.ones_like(c), c)
    return torch.where(small, 0.25 - c * c / 48, torch.tanh(safe / 2) / (2 * safe))


def _log_cosh_half(c: Tensor) -> Tensor:
    r""":math:`\log\cosh(c/2)` for :math:`c \ge 0`, without overflow."""
    return c / 2 + torch.nn.functional.softplus(-c) - math.log(2.0)


class _ExactState:
    r"""The exact CAVI quantities at one kernel matrix and one set of tilts :math:`c`: with :math:`K = LL^\top`,
    :math:`\Lambda = D^\top \bar\Omega D` and :math:`B = I + L^\top \Lambda L = L_B L_B^\top`,
    :math:`q(f) = N(L m_v, L B^{-1} L^\top)` with :math:`m_v = B^{-1} L^\top b`, :math:`b = D^\top \tfrac12`.

    Rule: with few comparisons (:math:`m < 1.6 n`, a BO loop's two new points per comparison) :math:`B` and the
    comparisons' variances are formed from the :math:`m` rows :math:`d_j^\top L` (:math:`O(mn^2)`), otherwise from
    :math:`\Lambda` and :math:`L_B^{-1}L^\top` (:math:`O(n^3)`)."""

    def __init__(self, K: Tensor, winners: Tensor, losers: Tensor, c: Tensor, L: Tensor | None = None) -> None:
        n = K.shape[-1]
        self.L = torch.linalg.cholesky(K) if L is None else L
        self.omega = _mean_omega(c)
        self.by_rows = winners.shape[0] < 1.6 * n
        if self.by_rows:
            LtD = self.L[winners] - self.L[losers]  # row j: (L^T d_j)^T, (m, n)
            B = (LtD * self.omega.unsqueeze(-1)).mT @ LtD
            self.Ltb = 0.5 * LtD.sum(-2)
            self.LtD = LtD
        else:
            w = self.omega
            flat = torch.cat([winners * n + winners, losers * n + losers, winners * n + losers, losers * n + winners])
            Lam = torch.zeros(n * n, dtype=K.dtype, device=K.device).index_add_(0, flat, torch.cat([w, w, -w, -w]))
            B = self.L.mT @ (Lam.view(n, n) @ self.L)
            b = torch.zeros(n, dtype=K.dtype, device=K.device)
            b.index_add_(0, winners, torch.full_like(self.omega, 0.5)).index_add_(
                0, losers, torch.full_like(self.omega, -0.5)
            )
            self.Ltb = self.L.mT @ b
        B.diagonal().add_(1.0)
        self.LB = torch.linalg.cholesky(B)
        self.z = tri_solve(self.LB, self.Ltb.unsqueeze(-1)).squeeze(-1)  # L_B^{-1} L^T b
        self.c, self.n, self.winners, self.losers = c, n, winners, losers

    def elbo(self) -> Tensor:
        r"""The augmented ELBO at the optimal :math:`q(f)` for these tilts (the Jaakkola–Jordan bound):
        :math:`\tfrac12\|L_B^{-1}L^\top b\|^2 - \log|L_B|`
        :math:`+ \sum_j [\bar\omega_j c_j^2/2 - \log\cosh(c_j/2) - \log 2]`."""
        c, omega = self.c, self.omega
        local = (omega * c * c / 2 - _log_cosh_half(c) - math.log(2.0)).sum()
        return 0.5 * (self.z * self.z).sum() - self.LB.diagonal().log().sum() + local

    def mean_v(self) -> Tensor:
        return tri_solve(self.LB.mT, self.z.unsqueeze(-1), upper=True).squeeze(-1)

    def next_tilts(self) -> Tensor:
        r"""The CAVI update :math:`c_j = \sqrt{E_q g_j^2}` of :math:`q(\omega_j) = \mathrm{PG}(1, c_j)`."""
        m_v = self.mean_v()
        if self.by_rows:
            g_mean = self.LtD @ m_v
            W = tri_solve(self.LB, self.LtD.mT)  # (n, m)
            g_var = (W * W).sum(-2)
        else:
            mu = self.L @ m_v
            g_mean = mu[self.winners] - mu[self.losers]
            C = tri_solve(self.LB, self.L.mT)
            S = (C.mT @ C).reshape(-1)  # Sigma, flattened
            n, w, lo = self.n, self.winners, self.losers
            g_var = S[w * n + w] + S[lo * n + lo] - 2 * S[w * n + lo]
        return (g_mean * g_mean + g_var).clamp_min(0.0).sqrt()

    def whitened(self) -> tuple[Tensor, Tensor, Tensor]:
        r""":math:`(L, m_v, R_v)` with :math:`R_v R_v^\top = B^{-1}`, the form :meth:`PairwiseAugmentedGP.forward`
        takes."""
        eye = torch.eye(self.n, dtype=self.LB.dtype, device=self.LB.device)
        return self.L, self.mean_v(), tri_solve(self.LB, eye).mT


class PairwiseAugmentedGP(ComparisonSizes, Model, GP):
    r"""A Gaussian-process preference model, :math:`p(x_a \succ x_b \mid f) = \sigma(f(x_a) - f(x_b))`, fitted by
    closed-form CAVI on its Pólya-Gamma augmentation (:class:`~gpytorch_augment.PairwiseLogitLikelihood`), with
    the interface of BoTorch's ``PairwiseGP``: ``input_transform=``, ``set_train_data``,
    ``condition_on_observations``, ``posterior``, ``datapoints`` / ``comparisons`` / ``dim`` / ``n`` / ``m``, and
    ``fit_gpytorch_mll(mll)`` for any ``mll`` built on it (``PairwiseLaplaceMarginalLogLikelihood(model.likelihood,
    model)`` included: the model's own fit runs, see :meth:`custom_fit`). ``posterior(X)`` is the Gaussian
    :math:`q(f)` of the utility at ``X`` (joint over the ``q`` points, differentiable in ``X``), so BoTorch's
    preference acquisition functions (``AnalyticExpectedUtilityOfBestOption``, ``qExpectedUtilityOfBestOption``)
    and the Monte-Carlo ones on the utility (``qNoisyExpectedImprovement``, ``qSimpleRegret``, ...) take it where
    they take ``PairwiseGP``.

    The model: :math:`f \sim \mathcal{GP}(0, k)` with a learnt kernel (default :func:`default_covar_module`);
    ``comparisons[j] = (a, b)`` says that ``datapoints[a]`` was preferred to ``datapoints[b]`` (BoTorch's
    convention), :math:`g_j = f_a - f_b = d_j^\top f`. With :math:`q(\omega_j) = \mathrm{PG}(1, c_j)` the
    augmented ELBO at the optimal Gaussian :math:`q(f)` is, with :math:`K = LL^\top`,
    :math:`B = I + L^\top D^\top \bar\Omega D L` and :math:`b = D^\top \tfrac12 \mathbf 1`,

    .. math::
        \mathcal L(\theta, c) = \tfrac12\, b^\top L B^{-1} L^\top b - \tfrac12 \log|B|
        + \sum_j \Big[\tfrac12 \bar\omega_j c_j^2 - \log\cosh\tfrac{c_j}{2} - \log 2\Big],
        \qquad \bar\omega_j = \frac{\tanh(c_j/2)}{2 c_j},

    maximised in :math:`c` by the CAVI update :math:`c_j^2 = E_q g_j^2` and in the kernel hyper-parameters
    :math:`\theta` (plus their log-priors) by L-BFGS, :math:`q(\omega)` re-solved by CAVI in each evaluation and
    warm-started from the last one.

    Two paths, chosen by ``inducing_points``:

    * ``None`` (the default, for the tens to a few thousand comparisons of preference learning): the exact path
      above on the (transformed) datapoints, :math:`O(n^3 + m n^2)` per CAVI step; the tilts :math:`c` and the
      kernel are kept between fits, so a BO loop that calls :meth:`set_train_data` (or
      :meth:`condition_on_observations`) and then :meth:`fit` starts from the last solution;
    * ``(M, d)`` inducing inputs (in the space the input transform maps to): a sparse variational GP fitted by
      :meth:`~gpytorch_augment.CAVI.fit` (``learn_hyperparameters=True``: the one-call fit), for many datapoints.

    A constant mean is not identified by comparisons and is fixed at 0. The input transform's parameters, if any,
    are not learnt.

    Example::

        >>> import torch
        >>> from botorch.acquisition.preference import AnalyticExpectedUtilityOfBestOption
        >>> from botorch.fit import fit_gpytorch_mll
        >>> from botorch.models.pairwise_gp import PairwiseLaplaceMarginalLogLikelihood
        >>> from botorch.models.transforms import Normalize
        >>> from gpytorch_augment.preference import PairwiseAugmentedGP
        >>> X = torch.linspace(0, 10, 6, dtype=torch.float64).unsqueeze(-1)
        >>> comparisons = torch.tensor([[1, 0], [2, 1], [3, 2], [3, 4], [2, 5], [3, 0]])   # utility peaks at 6
        >>> model = PairwiseAugmentedGP(X, comparisons, input_transform=Normalize(d=1))
        >>> _ = fit_gpytorch_mll(PairwiseLaplaceMarginalLogLikelihood(model.likelihood, model))
        >>> eubo = AnalyticExpectedUtilityOfBestOption(pref_model=model)
        >>> eubo(torch.tensor([[[6.0], [0.0]]], dtype=torch.float64)).shape
        torch.Size([1])
        >>> int(model.posterior(X).mean.squeeze(-1).argmax())
        3
        >>> model = model.condition_on_observations(X[[3, 4]], torch.tensor([[0, 1]]))   # 6 beat 8 again
        >>> model.m
        7

    :param datapoints: the compared inputs, ``(n, d)`` (untransformed, as ``PairwiseGP`` takes them).
    :param comparisons: ``(m, 2)`` integer indices into ``datapoints``, winner first.
    :param covar_module: the kernel (default :func:`default_covar_module`).
    :param input_transform: a BoTorch ``InputTransform`` applied to the datapoints and to every ``X`` of
        :meth:`posterior` (e.g. ``Normalize(d)``).
    :param inducing_points: optional ``(M, d)`` inducing inputs: the sparse path (default: the exact path).
    :param likelihood: ``None`` or a logistic ``PairwiseLogitLikelihood`` (this package's or BoTorch's, as
        ``PairwiseGP`` takes one): the link is always the logistic one.
    :param jitter: added to the kernel matrix's diagonal, relative to its mean diagonal (exact path).
    :raises ValueError: naming the argument, for datapoints that are not a finite ``(n, d)`` float tensor,
        comparisons that are not ``(m, 2)`` indices of two different datapoints, or a likelihood of another link.
    """

    def __init__(
        self,
        datapoints: Tensor,
        comparisons: Tensor,
        covar_module: gpytorch.kernels.Kernel | None = None,
        inducing_points: Tensor | None = None,
        input_transform: Any = None,
        *,
        likelihood: Any = None,
        jitter: float = 1e-6,
    ) -> None:
        super().__init__()
        if likelihood is not None and type(likelihood).__name__ != "PairwiseLogitLikelihood":
            raise ValueError(
                "likelihood must be None or a PairwiseLogitLikelihood (this package's or BoTorch's): the model's link "
                f"is the logistic one, which the Polya-Gamma augmentation makes exact; got {type(likelihood).__name__}"
            )
        datapoints, comparisons = self._checked(datapoints, comparisons)
        if input_transform is not None:
            input_transform.to(datapoints)
            self.input_transform = input_transform
        self.likelihood = PairwiseLogitLikelihood()
        self.covar_module = default_covar_module(datapoints.shape[-1]) if covar_module is None else covar_module
        self.covar_module.to(datapoints)
        self.jitter = float(jitter)
        self.sparse = inducing_points is not None
        if self.sparse:
            Z = inducing_points
            if not isinstance(Z, Tensor) or Z.dim() != 2 or Z.shape[-1] != datapoints.shape[-1]:
                shape = tuple(Z.shape) if isinstance(Z, Tensor) else type(Z).__name__
                raise ValueError(f"inducing_points must have shape (M, {datapoints.shape[-1]}); got {shape}")
            self.gp = _UtilityGP(Z.detach().clone(), gpytorch.means.ZeroMean(), self.covar_module).to(datapoints)
            self._posterior_cache = PriorCache()
        self._tilts: Tensor | None = None  # the exact path's c, one per comparison
        self._state: tuple[Any, tuple[Tensor, Tensor, Tensor, Tensor]] | None = None  # (key, (Xt, L, m_v, R_v))
        self._store_data(datapoints, comparisons)

    # ------------------------------------------------------------------------------------------------ data
    @staticmethod
    def _checked(datapoints: Tensor, comparisons: Tensor) -> tuple[Tensor, Tensor]:
        if not isinstance(datapoints, Tensor) or datapoints.dim() != 2 or not datapoints.is_floating_point():
            raise ValueError("datapoints must be a floating-point tensor of shape (n, d)")
        check_finite("datapoints", datapoints)
        comparisons = torch.as_tensor(comparisons, device=datapoints.device)
        if comparisons.dtype == torch.bool:
            raise ValueError("comparisons must hold integer indices of the datapoints, not booleans")
        LinearObservations.comparisons(comparisons, datapoints.shape[-2])  # raises ValueError naming comparisons
        return datapoints, comparisons.long()

    def _store_data(self, datapoints: Tensor, comparisons: Tensor) -> None:
        old = None if self._tilts is None else (self.comparisons, self._tilts)
        self.datapoints, self.comparisons = datapoints, comparisons
        self.train_inputs, self.train_targets = (datapoints,), comparisons  # what BoTorch's helpers read
        tilts = torch.zeros(comparisons.shape[0], dtype=datapoints.dtype, device=datapoints.device)
        if old is not None:  # warm start: keep the tilts of the comparisons that stay (the same leading rows)
            k = min(old[0].shape[0], comparisons.shape[0])
            same = (old[0][:k] == comparisons[:k]).all(-1)
            tilts[:k] = torch.where(same, old[1][:k].to(tilts), tilts[:k])
        self._tilts = tilts
        self._state = None
        if self.sparse:
            self.cavi = CAVI(self.gp, self.likelihood, num_data=max(int(comparisons.shape[0]), 1))

    @property
    def num_outputs(self) -> int:
        """One output: the utility."""
        return 1

    @property
    def batch_shape(self) -> torch.Size:
        """No batch dimensions."""
        return torch.Size()

    def set_train_data(
        self,
        datapoints: Tensor | None = None,
        comparisons: Tensor | None = None,
        strict: bool = False,
        update_model: bool = True,
    ) -> None:
        """Replace the datapoints and comparisons, as ``PairwiseGP.set_train_data``: the kernel is kept, the exact
        path keeps the tilts of the leading comparisons that did not change (a BO loop appends), and
        ``update_model=True`` re-solves :math:`q(f)` at the current kernel (call :meth:`fit` to relearn the kernel
        too). Rules: with ``datapoints`` or ``comparisons`` ``None`` nothing changes (BoTorch calls it so when it
        swaps transformed inputs); ``strict=True`` requires the shapes and dtypes of the current data.

        :raises ValueError: naming the argument, as the constructor, or for a ``strict`` mismatch.
        """
        if datapoints is None or comparisons is None:
            return
        datapoints, comparisons = self._checked(datapoints, comparisons)
        if strict:
            for name, new, cur in (
                ("datapoints", datapoints, self.datapoints),
                ("comparisons", comparisons, self.comparisons),
            ):
                if new.shape != cur.shape or new.dtype != cur.dtype:
                    raise ValueError(f"strict=True: {name} must have shape {tuple(cur.shape)} and dtype {cur.dtype}")
        self._store_data(datapoints, comparisons)
        if update_model:
            self.fit(learn_hyperparameters=False)

    def condition_on_observations(self, X: Tensor, Y: Tensor, **kwargs: Any) -> PairwiseAugmentedGP:
        r"""A copy of the model with ``X`` (``(k, d)``) appended to the datapoints and the comparisons ``Y``
        (``(j, 2)`` indices into ``X``, winner first, as ``PairwiseGP`` takes them) to the comparisons, :math:`q(f)`
        re-solved at this model's kernel (warm-started).

        :raises ValueError: for ``Y`` that are not ``(j, 2)`` integer indices into ``X`` (batched fantasies are not
            supported).
        """
        if not isinstance(Y, Tensor) or Y.dim() != 2 or Y.shape[-1] != 2 or Y.is_floating_point():
            shape = tuple(Y.shape) if isinstance(Y, Tensor) else type(Y).__name__
            raise ValueError(f"Y must be (j, 2) integer comparisons indexing X (no batch dimensions); got {shape}")
        if not isinstance(X, Tensor) or X.dim() != 2 or X.shape[-1] != self.dim:
            shape = tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__
            raise ValueError(f"X must have shape (k, {self.dim}); got {shape}")
        LinearObservations.comparisons(Y, X.shape[-2])
        new = deepcopy(self)
        datapoints = torch.cat([self.datapoints, X.to(self.datapoints)], -2)
        comparisons = torch.cat([self.comparisons, Y.long().to(self.comparisons.device) + self.n], -2)
        new.set_train_data(datapoints, comparisons, update_model=True)
        return new

    # ------------------------------------------------------------------------------------------------ fitting
    def _hyper_key(self) -> tuple[Any, ...]:
        tensors = [*self.covar_module.parameters(), *self.covar_module.buffers()]
        if hasattr(self, "input_transform"):
            tensors += [*self.input_transform.parameters(), *self.input_transform.buffers()]
        return tuple((id(t), t._version) for t in tensors) + (id(self.datapoints), id(self.comparisons))

    def _train_inputs(self) -> Tensor:
        with torch.no_grad():
            return (
                self.transform_inputs(self.datapoints).detach() if hasattr(self, "input_transform") else self.datapoints
            )

    def _kernel(self, Xt: Tensor) -> Tensor:
        K = self.covar_module(Xt).to_dense()
        return K + (self.jitter * K.diagonal().mean().detach()) * torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)

    def _solve_tilts(self, Xt: Tensor, max_iter: int, tol: float) -> tuple[_ExactState, int]:
        """CAVI in :math:`c` at the current kernel from the stored tilts, accelerated by SQUAREM (Varadhan and Roland,
        2008: two CAVI steps, an extrapolation along them, kept only where it raises the ELBO), until no tilt moves
        by more than ``tol`` relative; stores the tilts and returns their state and the number of CAVI steps."""
        winners, losers = self.comparisons[:, 0], self.comparisons[:, 1]
        with torch.no_grad():
            K = self._kernel(Xt)
            L = torch.linalg.cholesky(K)
            c0 = self._tilts
            steps = 0
            while True:
                s0 = _ExactState(K, winners, losers, c0, L)
                c1 = s0.next_tilts()
                steps += 1
                if bool(((c1 - c0).abs() <= tol * (1 + c0.abs())).all()) or steps >= max_iter:
                    c0 = c1
                    break
                s1 = _ExactState(K, winners, losers, c1, L)
                c2 = s1.next_tilts()
                steps += 1
                r, v = c1 - c0, c2 - 2 * c1 + c0
                alpha = -float(r.norm() / v.norm().clamp_min(1e-300))
                c0 = c2
                if alpha < -1:
                    c_acc = (c0 - 2 * alpha * r + alpha * alpha * v).clamp_min(0.0)
                    if float(_ExactState(K, winners, losers, c_acc, L).elbo()) >= float(s1.elbo()):
                        c0 = c_acc
            self._tilts = c0
            return _ExactState(K, winners, losers, c0, L), steps

    def _fit_exact(self, learn_hyperparameters: bool, max_iter: int, tol: float, cavi_tol: float) -> CAVITrace:
        from scipy.optimize import minimize

        if self.m == 0:
            raise ValueError("comparisons must hold at least one comparison to fit the model")
        trace = CAVITrace()
        start = time.perf_counter()
        if learn_hyperparameters:
            self.train()  # as fit_gpytorch_mll: an input transform that learns its coefficients learns them here
        Xt = self._train_inputs()
        m = self.m
        if learn_hyperparameters:
            params = [p for p in self.covar_module.parameters() if p.requires_grad]
            winners, losers = self.comparisons[:, 0], self.comparisons[:, 1]

            def set_params(x: Any) -> None:
                flat = torch.as_tensor(x, dtype=params[0].dtype, device=params[0].device)
                with torch.no_grad():
                    offset = 0
                    for p in params:
                        p.copy_(flat[offset : offset + p.numel()].view_as(p))
                        offset += p.numel()

            def objective(x: Any) -> tuple[float, Any]:
                set_params(x)
                try:
                    self._solve_tilts(Xt, 100, cavi_tol)
                    state = _ExactState(self._kernel(Xt), winners, losers, self._tilts)
                    value = state.elbo()
                    for _, module, prior, closure, _ in self.covar_module.named_priors():
                        value = value + prior.log_prob(closure(module)).sum()
                    grads = torch.autograd.grad(-value, params)
                except torch.linalg.LinAlgError:
                    return 1e300, [0.0] * len(x)
                trace.elbo.append(float(value.detach()) / m)
                trace.time.append(time.perf_counter() - start)
                flat = torch.cat([g.reshape(-1) for g in grads])
                return float(-value.detach()), flat.detach().cpu().double().numpy()

            x0 = torch.cat([p.detach().reshape(-1) for p in params]).cpu().double().numpy()
            result = minimize(objective, x0, jac=True, method="L-BFGS-B",
                              options={"maxiter": max_iter, "ftol": tol})  # fmt: skip
            best = result.x if torch.isfinite(torch.as_tensor(result.fun)) else x0
            set_params(best)
            trace.converged = bool(result.success)
        state, _ = self._solve_tilts(Xt, 1000, min(cavi_tol, 1e-7))
        with torch.no_grad():
            trace.elbo.append(float(state.elbo()) / m)
        trace.time.append(time.perf_counter() - start)
        trace.converged = trace.converged or not learn_hyperparameters
        self._state = (self._hyper_key(), (Xt, *state.whitened()))
        return trace

    def fit(self, learn_hyperparameters: bool = True, **options: Any) -> CAVITrace:
        """Fit :math:`q(f)` (exact path: the tilts; sparse path: :math:`q(u)`) with the kernel hyper-parameters
        (``learn_hyperparameters=True``) or at fixed ones, starting from the current kernel and tilts.

        Options: exact path, ``max_iter`` (L-BFGS iterations, default 200), ``tol`` (L-BFGS's relative decrease
        of the objective, default ``1e-9``) and ``cavi_tol`` (the tilts' relative change that ends CAVI, default
        ``1e-4``; the final solution is solved to ``1e-7``); sparse path, those of
        :meth:`~gpytorch_augment.CAVI.fit`. The trace's ``elbo`` is the ELBO per comparison (with the
        hyper-parameters' log-priors while they are learnt) after each evaluation.

        :raises ValueError: naming an unknown option (exact path) or for a model without comparisons.
        """
        if self.sparse:
            labels = torch.ones(self.m, dtype=self.datapoints.dtype, device=self.datapoints.device)
            trace = self.cavi.fit(
                self._train_inputs(), labels, comparisons=self.comparisons,
                learn_hyperparameters=learn_hyperparameters, **options,
            )  # fmt: skip
            self.eval()
            return trace
        unknown = set(options) - {"max_iter", "tol", "cavi_tol"}
        if unknown:
            raise ValueError(f"unknown option(s) {sorted(unknown)}; the exact path takes max_iter, tol, cavi_tol")
        trace = self._fit_exact(
            learn_hyperparameters, int(options.get("max_iter", 200)), float(options.get("tol", 1e-9)),
            float(options.get("cavi_tol", 1e-4)),
        )  # fmt: skip
        self.eval()
        return trace

    def custom_fit(self, mll: Any = None, **kwargs: Any) -> Any:
        """What BoTorch's ``fit_gpytorch_mll(mll)`` runs for this model (for any ``mll`` built on it): the
        model's own :meth:`fit` with its hyper-parameters (the closure and optimizer arguments do not apply);
        returns ``mll`` in eval mode, as ``fit_gpytorch_mll`` does."""
        self.fit(learn_hyperparameters=True)
        return mll.eval() if mll is not None else self

    # ------------------------------------------------------------------------------------------------ prediction
    def _whitened_posterior(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        r""":math:`(Z, L, m_v, R_v)`: the inputs :math:`q` is held at, the factor of their kernel matrix, the mean
        and a covariance factor of the whitened :math:`q(v)`, without a graph; recomputed when the kernel, the
        input transform or the data change."""
        if not self.sparse:
            if self._state is None or self._state[0] != self._hyper_key():
                self._fit_exact(False, 0, 0.0, 1e-7)
            assert self._state is not None
            return self._state[1]
        strategy = self.gp.variational_strategy
        tensors = [strategy.inducing_points, *self.gp.parameters(), *self.gp.buffers()]
        hit = self._posterior_cache.get([], tensors, ())
        if hit is not None:
            return hit  # type: ignore[return-value]
        with torch.no_grad():
            terms = strategy.cavi_terms(strategy.inducing_points[..., :1, :], cache=False)
            q = strategy.whitened_q(terms)
            value = (strategy.inducing_points, terms.L, q.mean, q.chol_covariance)
        self._posterior_cache.put([], tensors, (), value)
        return value

    def forward(self, X: Tensor) -> gpytorch.distributions.MultivariateNormal:
        r""":math:`q(f)` at ``X`` (``(*batch, q, d)``, in the transformed space), joint over the ``q`` points, with an
        autograd graph to ``X`` only (the hyper-parameters and :math:`q` are held fixed): with
        :math:`A = L^{-1}K_{ZX}`, :math:`m = A^\top m_v` and :math:`S = K_{XX} - A^\top A + A^\top S_v A` (plus a
        jitter), the factor :math:`L` and :math:`q(v)` computed once per fit rather than once per batch."""
        Z, L, m_v, R_v = self._whitened_posterior()
        params = [p for p in self.covar_module.parameters() if p.requires_grad]
        jitter = float(self.gp.variational_strategy.jitter_val) if self.sparse else self.jitter
        try:
            for p in params:
                p.requires_grad_(False)
            dtype = L.dtype
            kernel = self.covar_module
            Xd = X.to(dtype)
            K_ZX = kernel(Z, Xd).to_dense().to(dtype)
            K_XX = kernel(Xd).to_dense().to(dtype)
            A = tri_solve(L.expand(*K_ZX.shape[:-2], *L.shape), K_ZX)
            B = R_v.mT @ A
            mean = (m_v.unsqueeze(-2) @ A).squeeze(-2)
            covariance = add_to_diagonal(K_XX - A.mT @ A + B.mT @ B, jitter)
        finally:
            for p in params:
                p.requires_grad_(True)
        return gpytorch.distributions.MultivariateNormal(mean.to(X.dtype), covariance.to(X.dtype))

    def posterior(
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool = False,
        posterior_transform: Any = None,
        **kwargs: Any,
    ) -> Any:
        r"""The posterior of the utility at ``X`` (``batch_shape x q x d``, untransformed): a ``GPyTorchPosterior``
        of the joint Gaussian :math:`q(f)` over the ``q`` points (differentiable in ``X``). ``observation_noise`` is
        ignored (the comparisons' noise is the logistic link's, not an additive output noise).

        :raises ValueError: for ``output_indices`` other than ``None`` or ``[0]``; naming ``X`` unless it has shape
            ``(..., q, d)`` (``d`` the datapoints' dimension), the model's dtype and finite values.
        """
        if output_indices is not None and list(output_indices) != [0]:
            raise ValueError(f"output_indices must be None or [0] (one output, the utility); got {output_indices}")
        X = check_points("X", X, self.dim, self.datapoints.dtype)
        self.eval()
        posterior = GPyTorchPosterior(self.forward(self.transform_inputs(X)))
        return posterior if posterior_transform is None else posterior_transform(posterior)
