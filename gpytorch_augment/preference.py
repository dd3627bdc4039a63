r"""A BoTorch preference model fitted by CAVI: :class:`PairwiseAugmentedGP`, usable where BoTorch takes its
``PairwiseGP`` (needs the ``botorch`` extra: ``pip install gpytorch-augment[botorch]``)."""

from __future__ import annotations

from typing import Any

import gpytorch
import torch
from torch import Tensor

try:
    from botorch.models.model import Model
    from botorch.posteriors.gpytorch import GPyTorchPosterior
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


def default_covar_module(dim: int) -> gpytorch.kernels.Kernel:
    r"""The default kernel, as BoTorch's ``PairwiseGP``'s: a scaled RBF kernel with one lengthscale per input
    dimension, a :math:`\mathrm{Ga}(2.4, 2.7)` prior on the lengthscales and a smoothed box prior on
    :math:`[1, 4]` on the outputscale (it keeps the utility's scale finite when the comparisons are separable)."""
    rbf = gpytorch.kernels.RBFKernel(ard_num_dims=dim, lengthscale_prior=gpytorch.priors.GammaPrior(2.4, 2.7))
    return gpytorch.kernels.ScaleKernel(rbf, outputscale_prior=gpytorch.priors.SmoothedBoxPrior(1.0, 4.0))


class PairwiseAugmentedGP(Model):
    r"""A Gaussian-process preference model, :math:`p(x_a \succ x_b \mid f) = \sigma(f(x_a) - f(x_b))`, fitted by
    closed-form CAVI on its Pólya-Gamma augmentation (:class:`~gpytorch_augment.PairwiseLogitLikelihood`), with a
    BoTorch ``Model`` interface: ``posterior(X)`` is the Gaussian :math:`q(f)` of the utility at ``X`` (joint over
    the ``q`` points, differentiable in ``X``), so BoTorch's preference acquisition functions
    (``AnalyticExpectedUtilityOfBestOption``, ``qExpectedUtilityOfBestOption``) and the Monte-Carlo ones on the
    utility (``qNoisyExpectedImprovement``, ``qSimpleRegret``, ...) take it where they take ``PairwiseGP``.

    The model: :math:`f \sim \mathcal{GP}(0, k)` with a learnt kernel (default :func:`default_covar_module`);
    ``comparisons[j] = (a, b)`` says that ``datapoints[a]`` was preferred to ``datapoints[b]`` (BoTorch's
    convention). :math:`q(u)` at the inducing inputs (default: the datapoints, i.e. a full variational GP) and the
    kernel hyper-parameters are learnt by ``CAVI(...).fit(..., learn_hyperparameters=True)`` (L-BFGS on the true
    ELBO with :math:`q(u)` re-solved by CAVI in each evaluation); a constant mean is not identified by comparisons
    and is fixed at 0.

    Example::

        >>> import torch
        >>> from botorch.acquisition.preference import AnalyticExpectedUtilityOfBestOption
        >>> from gpytorch_augment.preference import PairwiseAugmentedGP
        >>> X = torch.linspace(0, 1, 6, dtype=torch.float64).unsqueeze(-1)
        >>> comparisons = torch.tensor([[1, 0], [2, 1], [3, 2], [3, 4], [2, 5], [3, 0]])   # utility peaks at 0.6
        >>> model = PairwiseAugmentedGP(X, comparisons)
        >>> _ = model.fit(learn_hyperparameters=False, max_iter=50)   # q(u) only; the default also learns the kernel
        >>> eubo = AnalyticExpectedUtilityOfBestOption(pref_model=model)
        >>> eubo(torch.tensor([[[0.6], [0.0]]], dtype=torch.float64)).shape
        torch.Size([1])
        >>> mean = model.posterior(X).mean.squeeze(-1)
        >>> int(mean.argmax())
        3

    :param datapoints: the compared inputs, ``(n, d)``.
    :param comparisons: ``(m, 2)`` integer indices into ``datapoints``, winner first.
    :param covar_module: the kernel (default :func:`default_covar_module`).
    :param inducing_points: optional ``(M, d)`` inducing inputs (default: the datapoints).
    :raises ValueError: naming the argument, for datapoints that are not a finite ``(n, d)`` float tensor or
        comparisons that are not ``(m, 2)`` indices of two different datapoints.
    """

    def __init__(
        self,
        datapoints: Tensor,
        comparisons: Tensor,
        covar_module: gpytorch.kernels.Kernel | None = None,
        inducing_points: Tensor | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(datapoints, Tensor) or datapoints.dim() != 2 or not datapoints.is_floating_point():
            raise ValueError("datapoints must be a floating-point tensor of shape (n, d)")
        check_finite("datapoints", datapoints)
        comparisons = torch.as_tensor(comparisons, device=datapoints.device)
        LinearObservations.comparisons(comparisons, datapoints.shape[-2])  # raises ValueError naming comparisons
        self.datapoints, self.comparisons = datapoints, comparisons.long()
        Z = datapoints if inducing_points is None else inducing_points
        if Z.dim() != 2 or Z.shape[-1] != datapoints.shape[-1]:
            raise ValueError(f"inducing_points must have shape (M, {datapoints.shape[-1]}); got {tuple(Z.shape)}")
        covar_module = default_covar_module(datapoints.shape[-1]) if covar_module is None else covar_module
        mean_module = gpytorch.means.ZeroMean()
        self.gp = _UtilityGP(Z.detach().clone(), mean_module, covar_module).to(datapoints)
        self.likelihood = PairwiseLogitLikelihood()
        self.cavi = CAVI(self.gp, self.likelihood, num_data=int(self.comparisons.shape[0]))
        self._posterior_cache = PriorCache()

    @property
    def num_outputs(self) -> int:
        """One output: the utility."""
        return 1

    @property
    def batch_shape(self) -> torch.Size:
        """No batch dimensions."""
        return torch.Size()

    def fit(self, learn_hyperparameters: bool = True, **options: Any) -> CAVITrace:
        """Fit :math:`q(u)` by CAVI, with the kernel hyper-parameters (``learn_hyperparameters=True``, the one-call
        fit) or at fixed ones; ``options`` go to :meth:`~gpytorch_augment.CAVI.fit` (e.g. ``max_iter``, ``tol``)."""
        labels = torch.ones(self.comparisons.shape[0], dtype=self.datapoints.dtype, device=self.datapoints.device)
        trace = self.cavi.fit(
            self.datapoints, labels, comparisons=self.comparisons, learn_hyperparameters=learn_hyperparameters,
            **options,
        )  # fmt: skip
        self.eval()
        return trace

    def _whitened_posterior(self) -> tuple[Tensor, Tensor, Tensor]:
        r""":math:`(L, m_v, R_v)`: the factor of :math:`K_{ZZ} + \epsilon I`, the mean and the Cholesky factor of the
        covariance of the whitened :math:`q(v)`, without a graph; cached while the model's tensors keep their
        values."""
        strategy = self.gp.variational_strategy
        tensors = [strategy.inducing_points, *self.gp.parameters(), *self.gp.buffers()]
        hit = self._posterior_cache.get([], tensors, ())
        if hit is not None:
            return hit  # type: ignore[return-value]
        with torch.no_grad():
            terms = strategy.cavi_terms(strategy.inducing_points[..., :1, :], cache=False)
            q = strategy.whitened_q(terms)
            value = (terms.L, q.mean, q.chol_covariance)
        self._posterior_cache.put([], tensors, (), value)
        return value

    def forward(self, X: Tensor) -> gpytorch.distributions.MultivariateNormal:
        r""":math:`q(f)` at ``X`` (``(*batch, q, d)``), joint over the ``q`` points, with an autograd graph to ``X``
        only (the hyper-parameters and :math:`q(u)` are held fixed): with :math:`A = L^{-1}K_{ZX}`,
        :math:`m = A^\top m_v` and :math:`S = K_{XX} - A^\top A + A^\top S_v A` (plus the strategy's jitter), the
        factor :math:`L` and :math:`q(v)` computed once per fit rather than once per batch of candidates."""
        L, m_v, R_v = self._whitened_posterior()
        strategy = self.gp.variational_strategy
        params = [p for p in self.gp.parameters() if p.requires_grad]
        try:
            for p in params:
                p.requires_grad_(False)
            dtype = L.dtype
            kernel = self.gp.covar_module
            Z = strategy.inducing_points
            K_ZX = kernel(Z, X).to_dense().to(dtype)
            K_XX = kernel(X).to_dense().to(dtype)
            A = tri_solve(L.expand(*K_ZX.shape[:-2], *L.shape), K_ZX)
            B = R_v.mT @ A
            mean = (m_v.unsqueeze(-2) @ A).squeeze(-2) + self.gp.mean_module(X).to(dtype)
            covariance = add_to_diagonal(K_XX - A.mT @ A + B.mT @ B, float(strategy.jitter_val))
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
    ) -> Any:
        r"""The posterior of the utility at ``X`` (``batch_shape x q x d``): a ``GPyTorchPosterior`` of the joint
        Gaussian :math:`q(f)` over the ``q`` points (differentiable in ``X``). ``observation_noise`` is ignored (the
        comparisons' noise is the logistic link's, not an additive output noise).

        :raises ValueError: for ``output_indices`` other than ``None`` or ``[0]``; naming ``X`` unless it has shape
            ``(..., q, d)`` (``d`` the datapoints' dimension), the model's dtype and finite values.
        """
        if output_indices is not None and list(output_indices) != [0]:
            raise ValueError(f"output_indices must be None or [0] (one output, the utility); got {output_indices}")
        X = check_points("X", X, self.datapoints.shape[-1], self.datapoints.dtype)
        self.eval()
        posterior = GPyTorchPosterior(self.forward(X))
        return posterior if posterior_transform is None else posterior_transform(posterior)
