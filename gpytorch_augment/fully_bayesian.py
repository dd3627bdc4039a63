r"""Fully Bayesian BoTorch models sampled by the augmented Gibbs sampler: :class:`FullyBayesianAugmentedClassifier`
(pass/fail data) and :class:`FullyBayesianPairwiseGP` (pairwise preferences), fitted by
:func:`fit_fully_bayesian_model_gibbs` (needs the ``botorch`` extra: ``pip install gpytorch-augment[botorch]``).

They expose their posterior as BoTorch's fully Bayesian models (``SaasFullyBayesianSingleTaskGP``) do: the model is a
*batch* of ``S`` models, one per kept MCMC draw (``batch_shape == torch.Size([S])``, ``_is_fully_bayesian`` and
``_is_ensemble`` set), and ``posterior(X)`` returns a ``GaussianMixturePosterior`` whose batch dimension
``MCMC_DIM = -3`` holds the ``S`` components, which BoTorch's acquisition functions average over.

**The posterior.** The Gibbs sampler with ``sample_hyperparameters=True`` draws
:math:`(\theta_s, \Omega_s, f_s) \sim p(\theta, \Omega, f \mid y)` (the prior's hyper-parameters :math:`\theta`, the
Pólya-Gamma variables :math:`\Omega` and the latent values :math:`f` at the training inputs :math:`X`). Component
:math:`s` of the posterior at new inputs :math:`X_*` is the exact GP conditional of that draw,

.. math::
    p(f_* \mid y) \approx \frac1S \sum_{s=1}^S \mathcal N\big(f_* \mid
        \mu_{\theta_s}(X_*) + K^{\theta_s}_{*X} (K^{\theta_s}_{XX} + \epsilon I)^{-1} (f_s - \mu_{\theta_s}(X)),\;
        K^{\theta_s}_{**} - K^{\theta_s}_{*X} (K^{\theta_s}_{XX} + \epsilon I)^{-1} K^{\theta_s}_{X*}\big),

because :math:`f_* \perp y \mid f, \theta` (the conditionals of :meth:`PosteriorSamples.predict
<gpytorch_augment.PosteriorSamples.predict>`, which this mixture equals in its mean and variance). It is a Monte Carlo
estimate of the exact posterior, with :math:`\theta` *and* :math:`f` integrated out; no Gaussian approximation is
made (each component is Gaussian exactly). It is differentiable in :math:`X_*`: the factors of
:math:`K^{\theta_s}_{XX}` and :math:`(K^{\theta_s}_{XX} + \epsilon I)^{-1}(f_s - \mu_s)` are computed once, when the
draws are loaded.

**The success probability.** For the classifier, :math:`P(y_* = 1 \mid y) = E[\sigma(f_*)]` under the mixture
(:meth:`FullyBayesianAugmentedClassifier.success_probability`, by Gauss-Hermite quadrature per component). In
constrained BO the classifier is the constraint model of a ``ModelList`` and :func:`success_constraint` makes
BoTorch's Monte-Carlo acquisition functions weight each posterior sample by :math:`\sigma(f_*)`, the probability of
success given :math:`f_*`: averaged over the samples, the weight is :math:`E\sigma(f_*) = P(y_* = 1 \mid y)`, so
``qLogExpectedImprovement(..., constraints=..., eta=1.0, fat=False)`` computes
:math:`\log\big(E[\mathrm{improvement}] \cdot P(\text{success})\big)` for a separate objective model (Gardner et al.,
2014) -- exactly, not through a smoothed indicator.

Example::

    >>> import torch
    >>> from gpytorch_augment.fully_bayesian import FullyBayesianAugmentedClassifier, fit_fully_bayesian_model_gibbs
    >>> X = torch.linspace(0, 1, 12, dtype=torch.float64).unsqueeze(-1)
    >>> Y = (X < 0.6).double()
    >>> model = FullyBayesianAugmentedClassifier(X, Y)
    >>> fit_fully_bayesian_model_gibbs(model, num_samples=32, warmup=32, thinning=4, num_chains=2, seed=0)
    >>> model.batch_shape                                 # 2 chains x 32 / 4 draws
    torch.Size([16])
    >>> model.posterior(X[:3]).mean.shape                 # (S, q, 1): the mixture's components
    torch.Size([16, 3, 1])
    >>> p = model.success_probability(torch.tensor([[0.1], [0.9]], dtype=torch.float64))
    >>> bool(p[0] > 0.5 > p[1])
    True
"""

from __future__ import annotations

from typing import Any

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DiagLinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor
from torch.func import functional_call

try:
    from botorch.models.model import Model
    from botorch.posteriors.fully_bayesian import MCMC_DIM, GaussianMixturePosterior
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "gpytorch_augment.fully_bayesian needs BoTorch: pip install 'gpytorch-augment[botorch]' "
        "(or pip install botorch)"
    ) from err

from ._validation import check_finite, check_points
from .core import LinearObservations
from .core.linalg import add_to_diagonal, tri_solve
from .inference import GibbsSampler, PosteriorSamples
from .inference.mcmc.prior_parameters import PriorParameters
from .likelihoods import BernoulliLogitLikelihood, PairwiseLogitLikelihood
from .models import GPPrior
from .preference import ComparisonSizes, default_covar_module

__all__ = [
    "FullyBayesianAugmentedClassifier",
    "FullyBayesianAugmentedModel",
    "FullyBayesianPairwiseGP",
    "default_classifier_covar_module",
    "default_classifier_mean_module",
    "fit_fully_bayesian_model_gibbs",
    "success_constraint",
]

DTYPE = torch.float64  # the dtype of the draws' factors and of every evaluation


def default_classifier_covar_module(dim: int) -> gpytorch.kernels.Kernel:
    r"""The classifier's default kernel: a scaled RBF kernel with one lengthscale per input dimension under
    :math:`\mathrm{Ga}(3, 6)` and an outputscale under :math:`\mathrm{Ga}(2, 0.15)` (BoTorch's former defaults,
    the priors of tutorial 11's CAVI classifier), both started at their prior modes (1/3 and 6.67). Inputs are meant
    to lie in :math:`[0, 1]^d` (pass ``input_transform=Normalize(d)`` otherwise). Proper priors matter here: with
    separable labels the likelihood alone keeps growing with the outputscale.

    Example::

        >>> from gpytorch_augment.fully_bayesian import default_classifier_covar_module
        >>> round(float(default_classifier_covar_module(2).outputscale.detach()), 2)
        6.67
    """
    ls_prior, os_prior = gpytorch.priors.GammaPrior(3.0, 6.0), gpytorch.priors.GammaPrior(2.0, 0.15)
    rbf = gpytorch.kernels.RBFKernel(ard_num_dims=dim, lengthscale_prior=ls_prior)
    rbf.lengthscale = (ls_prior.concentration - 1) / ls_prior.rate
    kernel = gpytorch.kernels.ScaleKernel(rbf, outputscale_prior=os_prior)
    kernel.outputscale = (os_prior.concentration - 1) / os_prior.rate
    return kernel


def default_classifier_mean_module() -> gpytorch.means.Mean:
    r"""The classifier's default mean: a constant :math:`c \sim \mathcal N(0, 2^2)` (sampled with the kernel's
    hyper-parameters; it sets the success probability far from the data).

    Example::

        >>> from gpytorch_augment.fully_bayesian import default_classifier_mean_module
        >>> float(default_classifier_mean_module().constant.detach())
        0.0
    """
    return gpytorch.means.ConstantMean(constant_prior=gpytorch.priors.NormalPrior(0.0, 2.0))


def success_constraint(output_index: int) -> dict[str, Any]:
    r"""The keyword arguments that make a BoTorch Monte-Carlo acquisition function (``qLogExpectedImprovement``,
    ``qLogNoisyExpectedImprovement``, ``qExpectedImprovement``, ...) weight each posterior sample by the success
    probability :math:`\sigma(f)` of a classifier's latent sample :math:`f` = ``Z[..., output_index]``:
    ``{"constraints": [lambda Z: -Z[..., output_index]], "eta": 1.0, "fat": False}``. BoTorch's smoothed
    feasibility indicator is :math:`\mathrm{sigmoid}(-c(Z)/\eta)`; with :math:`c(Z) = -f` and :math:`\eta = 1` it is
    :math:`\sigma(f)` exactly, the logistic likelihood of success, so the sample average is
    :math:`E[\text{utility} \cdot \sigma(f)]`, which is :math:`E[\text{utility}] \cdot P(\text{success})` when the
    objective and the classifier are independent models (a ``ModelList``).

    Example::

        >>> import torch
        >>> kwargs = success_constraint(1)
        >>> kwargs["constraints"][0](torch.tensor([[0.5, 2.0]])), kwargs["eta"], kwargs["fat"]
        (tensor([-2.]), 1.0, False)

    :param output_index: the classifier's output among the model list's outputs.
    :raises ValueError: naming ``output_index`` unless it is an integer.
    """
    if isinstance(output_index, bool) or not isinstance(output_index, int):
        raise ValueError(f"output_index must be an integer (the classifier's output), got {output_index!r}")

    def constraint(Z: Tensor) -> Tensor:
        return -Z[..., output_index]

    return {"constraints": [constraint], "eta": 1.0, "fat": False}


class _CrossEvaluator(torch.nn.Module):
    """``forward(x, x_train)`` -> (prior mean at ``x``, dense ``k(x, x_train)``, dense ``k(x, x)``), evaluated while
    ``functional_call`` holds a batch of hyper-parameters."""

    def __init__(self, prior: GPPrior) -> None:
        super().__init__()
        self.prior = prior

    def forward(self, x: Tensor, x_train: Tensor | None) -> tuple[Tensor, Tensor | None, Tensor]:
        with gpytorch.settings.lazily_evaluate_kernels(False):
            mean = self.prior.mean_module(x)
            k_cross = None if x_train is None else self.prior.covar_module(x, x_train).to_dense()
            k_self = self.prior.covar_module(x).to_dense()
        return mean, k_cross, k_self


class FullyBayesianAugmentedModel(Model):
    r"""The base of the fully Bayesian models (module docstring): the prior :math:`\mathcal{GP}(\mu_\theta,
    k_\theta)` as a :class:`~gpytorch_augment.GPPrior` (``model.prior``; its parameters are where the chains start),
    the training inputs, the loaded draws and the mixture posterior. A subclass defines the likelihood and the
    targets (``_sampler_data``); use :class:`FullyBayesianAugmentedClassifier` or :class:`FullyBayesianPairwiseGP`.

    Example::

        >>> import torch
        >>> from gpytorch_augment.fully_bayesian import FullyBayesianAugmentedModel, FullyBayesianPairwiseGP
        >>> X = torch.linspace(0, 1, 4, dtype=torch.float64).unsqueeze(-1)
        >>> isinstance(FullyBayesianPairwiseGP(X, torch.tensor([[1, 0], [2, 3]])), FullyBayesianAugmentedModel)
        True
    """

    _is_fully_bayesian = True
    _is_ensemble = True

    def __init__(
        self,
        train_inputs: Tensor,
        mean_module: gpytorch.means.Mean,
        covar_module: gpytorch.kernels.Kernel,
        input_transform: Any,
        name: str,
    ) -> None:
        super().__init__()
        if not isinstance(train_inputs, Tensor) or train_inputs.dim() != 2 or not train_inputs.is_floating_point():
            shape = tuple(train_inputs.shape) if isinstance(train_inputs, Tensor) else type(train_inputs).__name__
            raise ValueError(f"{name} must be a floating-point tensor of shape (n, d); got {shape}")
        check_finite(name, train_inputs)
        if not isinstance(mean_module, gpytorch.means.Mean):
            raise ValueError(f"mean_module must be a gpytorch.means.Mean, got {type(mean_module).__name__}")
        if not isinstance(covar_module, gpytorch.kernels.Kernel):
            raise ValueError(f"covar_module must be a gpytorch.kernels.Kernel, got {type(covar_module).__name__}")
        self._train_inputs = train_inputs
        if input_transform is not None:
            input_transform.to(train_inputs)
            self.input_transform = input_transform
        self.prior = GPPrior(mean_module, covar_module).to(dtype=DTYPE, device=train_inputs.device)
        self._evaluator = _CrossEvaluator(self.prior)
        self._draws: dict[str, Any] | None = None

    # ------------------------------------------------------------------ properties
    @property
    def mean_module(self) -> gpytorch.means.Mean:
        """The prior's mean (its parameters hold the values the chains start from, not the draws)."""
        return self.prior.mean_module

    @property
    def covar_module(self) -> gpytorch.kernels.Kernel:
        """The prior's kernel (its parameters hold the values the chains start from, not the draws)."""
        return self.prior.covar_module

    @property
    def num_outputs(self) -> int:
        """One output: the latent function."""
        return 1

    @property
    def num_mcmc_samples(self) -> int:
        """The number of loaded draws :math:`S` (``RuntimeError`` before the model is fitted)."""
        return int(self._loaded()["alpha"].shape[0])

    @property
    def batch_shape(self) -> torch.Size:
        """``torch.Size([S])``: one model per loaded draw, as BoTorch's fully Bayesian models."""
        return torch.Size([self.num_mcmc_samples])

    @property
    def samples(self) -> PosteriorSamples:
        """The loaded :class:`~gpytorch_augment.PosteriorSamples` (diagnostics: ``samples.summary(name)``)."""
        return self._loaded()["samples"]

    def _loaded(self) -> dict[str, Any]:
        if self._draws is None:
            raise RuntimeError(
                f"{type(self).__name__} has not been fitted: call fit_fully_bayesian_model_gibbs(model) (or "
                "model.load_mcmc_samples(samples))"
            )
        return self._draws

    def _set_transformed_inputs(self) -> None:
        """Nothing to do: the model applies its input transform to the training inputs itself when it samples
        (:meth:`transformed_train_inputs`), so BoTorch's ``eval()`` hook has no ``train_inputs`` to replace."""

    def _revert_to_original_inputs(self) -> None:
        """Nothing to do (see :meth:`_set_transformed_inputs`)."""

    # ------------------------------------------------------------------ sampling
    def transformed_train_inputs(self) -> Tensor:
        """The training inputs after the input transform (which learns its coefficients here, as in training)."""
        X = self._train_inputs
        transform = getattr(self, "input_transform", None)
        if transform is None:
            return X.detach()
        with torch.no_grad():
            transform.train()
            Xt = transform(X)
            transform.eval()
        return Xt.detach()

    def _sampler_data(self) -> tuple[Any, Tensor, dict[str, Tensor]]:  # pragma: no cover - abstract
        raise NotImplementedError

    def gibbs_sampler(self) -> GibbsSampler:
        """The :class:`~gpytorch_augment.GibbsSampler` (``sample_hyperparameters=True``) of this model's posterior,
        on the transformed training inputs."""
        likelihood, y, kwargs = self._sampler_data()
        x = self.transformed_train_inputs().to(DTYPE)
        return GibbsSampler(self.prior, likelihood, x, y, sample_hyperparameters=True, **kwargs)

    @torch.no_grad()
    def load_mcmc_samples(self, samples: PosteriorSamples) -> None:
        r"""Load draws of :meth:`gibbs_sampler` (every chain's kept draws, flattened chain-major) as the batch of
        models: for draw :math:`s`, :math:`\theta_s`, the Cholesky factor of :math:`K^{\theta_s}_{XX} + \epsilon I`
        and :math:`(K^{\theta_s}_{XX} + \epsilon I)^{-1}(f_s - \mu_{\theta_s}(X))`. Draws without sampled
        hyper-parameters (a sampler built without ``sample_hyperparameters``) are accepted: :math:`\theta` is then
        the model's own, the same for every draw (a degenerate batch).

        :raises ValueError: naming ``samples`` unless they are draws of one latent at this model's training inputs.
        """
        if not isinstance(samples, PosteriorSamples) or samples.target is None:
            raise ValueError("samples must be PosteriorSamples of this model's sampler (with their target)")
        x = self.transformed_train_inputs().to(DTYPE)
        target = samples.target
        if samples.f.dim() != 3 or tuple(target.x.shape) != tuple(x.shape) or not torch.equal(target.x.to(x), x):
            raise ValueError(
                "samples must be draws of one latent at this model's (transformed) training inputs, f of shape "
                f"(chains, draws, {x.shape[0]}); got f of shape {tuple(samples.f.shape)}"
            )
        S = samples.num_chains * samples.num_draws
        names = samples.prior_parameter_names()
        raw: dict[str, Tensor] = {}
        if names:
            params = PriorParameters(target, names=names)
            theta = params.from_constrained({k: samples.hyperparameters[k].flatten(0, 1) for k in names}, S)
            raw = {p: v.to(DTYPE) for p, v in params.unflatten(theta).items()}
        self._draws = {"raw": raw, "samples": samples, "jitter": float(target.jitter)}
        mean, _, K = self._evaluate(x.expand(S, *x.shape), None)
        K = add_to_diagonal((K + K.mT) / 2, self._draws["jitter"])
        L = psd_safe_cholesky(K)
        residual = samples.f.flatten(0, 1).to(DTYPE) - mean
        alpha = torch.cholesky_solve(residual.unsqueeze(-1), L).squeeze(-1)
        self._draws.update(L=L, alpha=alpha, x=x)

    def _evaluate(self, x: Tensor, x_train: Tensor | None) -> tuple[Tensor, Tensor | None, Tensor]:
        """The prior at every loaded :math:`\\theta_s` (the draws' dimension third from the right of ``x``)."""
        state = {
            "prior." + k: v.detach()
            for k, v in [*self.prior.named_parameters(), *self.prior.named_buffers()]
        }  # fmt: skip
        for path, value in self._loaded()["raw"].items():
            # (S, *shape) against inputs (..., S, q, d): GPyTorch's parameters broadcast
            state["prior." + path] = value
        return functional_call(self._evaluator, state, (x, x_train))

    # ------------------------------------------------------------------ the posterior
    def forward_mixture(self, X: Tensor) -> MultivariateNormal:
        r"""The mixture's components at transformed inputs ``X`` (``(*batch, q, d)``): a ``MultivariateNormal`` of
        batch shape ``(*batch, S)``, joint over the ``q`` points, differentiable in ``X`` (the draws held fixed)."""
        draws = self._loaded()
        L, alpha, x_train = draws["L"], draws["alpha"], draws["x"]
        S = alpha.shape[0]
        Xd = X.to(DTYPE).unsqueeze(MCMC_DIM)
        Xd = Xd.expand(*Xd.shape[:-3], S, *Xd.shape[-2:])
        x_tr = x_train.expand(*Xd.shape[:-2], *x_train.shape)
        mean, k_cross, k_self = self._evaluate(Xd, x_tr)
        mean = mean.expand(Xd.shape[:-1]) + (k_cross @ alpha.unsqueeze(-1)).squeeze(-1)
        W = tri_solve(L.expand(*k_cross.shape[:-2], *L.shape[-2:]), k_cross.mT)  # L^{-1} K_{X*}
        covariance = add_to_diagonal(k_self - W.mT @ W, draws["jitter"])
        return MultivariateNormal(mean.to(X.dtype), covariance.to(X.dtype))

    def posterior(
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: Any = None,
        **kwargs: Any,
    ) -> Any:
        r"""The posterior of the latent function at ``X`` (``batch_shape x q x d``, untransformed): a BoTorch
        ``GaussianMixturePosterior`` whose components (batch dimension ``MCMC_DIM = -3``, size :math:`S`) are the
        draws' GP conditionals (module docstring); its ``mean`` is ``batch_shape x S x q x 1``, its
        ``mixture_mean`` / ``mixture_variance`` the mixture's moments. ``observation_noise`` is ignored (the
        labels' noise is the logistic link's, not an additive output noise).

        :raises ValueError: for ``output_indices`` other than ``None`` or ``[0]``; naming ``X`` unless it has shape
            ``(..., q, d)`` with the training inputs' ``d``, their dtype and finite values.
        :raises RuntimeError: before the model is fitted.
        """
        if output_indices is not None and list(output_indices) != [0]:
            raise ValueError(f"output_indices must be None or [0] (one output, the latent); got {output_indices}")
        X = check_points("X", X, self._train_inputs.shape[-1], self._train_inputs.dtype)
        self._loaded()
        self.eval()
        posterior = GaussianMixturePosterior(distribution=self.forward_mixture(self.transform_inputs(X)))
        return posterior if posterior_transform is None else posterior_transform(posterior)


class FullyBayesianAugmentedClassifier(FullyBayesianAugmentedModel):
    r"""A fully Bayesian GP classifier as a BoTorch model: :math:`p(y = 1 \mid f) = \sigma(f(x))`,
    :math:`f \sim \mathcal{GP}(\mu_\theta, k_\theta)`, with the hyper-parameters :math:`\theta` (mean and kernel)
    under their priors and sampled with :math:`f` by the Pólya-Gamma Gibbs sampler
    (:func:`fit_fully_bayesian_model_gibbs`). After fitting it is a batch of :math:`S` models, one per kept draw
    :math:`(\theta_s, f_s)`, and ``posterior(X)`` is the mixture of their GP conditionals (module docstring), as
    BoTorch's ``SaasFullyBayesianSingleTaskGP`` exposes its MCMC draws: it plugs into a ``ModelList`` as the
    constraint model of constrained BO (with :func:`success_constraint`), and :meth:`success_probability` gives
    :math:`P(y = 1 \mid \text{data}) = \frac1S\sum_s E_{\mathcal N_s}\sigma(f_*)`.

    Example::

        >>> import torch
        >>> from botorch.acquisition import qLogExpectedImprovement
        >>> from botorch.acquisition.objective import GenericMCObjective
        >>> from botorch.models import ModelList, SingleTaskGP
        >>> from gpytorch_augment.fully_bayesian import (
        ...     FullyBayesianAugmentedClassifier, fit_fully_bayesian_model_gibbs, success_constraint)
        >>> X = torch.rand(10, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> passed = X.sum(-1) < 1.2                                  # the experiment succeeds
        >>> classifier = FullyBayesianAugmentedClassifier(X, passed.double().unsqueeze(-1))
        >>> fit_fully_bayesian_model_gibbs(classifier, num_samples=16, warmup=16, thinning=4, num_chains=2, seed=0)
        >>> objective = SingleTaskGP(X[passed], X[passed].prod(-1, keepdim=True))
        >>> acqf = qLogExpectedImprovement(
        ...     ModelList(objective, classifier), best_f=X[passed].prod(-1).max(),
        ...     objective=GenericMCObjective(lambda Z, X: Z[..., 0]), **success_constraint(1))
        >>> acqf(torch.rand(5, 1, 2, dtype=torch.float64)).shape
        torch.Size([5])

    :param train_X: the inputs of every run, ``(n, d)`` floating point (untransformed).
    :param train_Y: the outcomes, 1 (success) or 0 (failure): ``(n, 1)`` or ``(n,)``.
    :param covar_module: the kernel (default :func:`default_classifier_covar_module`); every parameter that requires
        grad needs a prior (or is a lengthscale or outputscale, which gets the one-call fit's default prior).
    :param mean_module: the prior mean (default :func:`default_classifier_mean_module`).
    :param input_transform: a BoTorch ``InputTransform`` applied to ``train_X`` (its coefficients learnt there) and
        to every ``X`` of :meth:`posterior` (e.g. ``Normalize(d)``).
    :raises ValueError: naming the argument, for ``train_X`` that is not a finite ``(n, d)`` float tensor,
        ``train_Y`` whose values are not 0 or 1 or whose length is not ``n``, or modules of the wrong kind.
    """

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        covar_module: gpytorch.kernels.Kernel | None = None,
        mean_module: gpytorch.means.Mean | None = None,
        input_transform: Any = None,
    ) -> None:
        if not isinstance(train_X, Tensor) or train_X.dim() != 2:
            shape = tuple(train_X.shape) if isinstance(train_X, Tensor) else type(train_X).__name__
            raise ValueError(f"train_X must be a floating-point tensor of shape (n, d); got {shape}")
        if not isinstance(train_Y, Tensor):
            raise ValueError(f"train_Y must be a tensor of 0/1 labels, got {type(train_Y).__name__}")
        Y = train_Y.squeeze(-1) if train_Y.dim() == 2 and train_Y.shape[-1] == 1 else train_Y
        if Y.dim() != 1 or Y.shape[0] != train_X.shape[0]:
            raise ValueError(
                f"train_Y must have shape ({train_X.shape[0]}, 1) or ({train_X.shape[0]},); got {tuple(train_Y.shape)}"
            )
        Y = Y.to(DTYPE)
        if not bool(((Y == 0) | (Y == 1)).all()):
            raise ValueError("train_Y must hold 0 (failure) or 1 (success) labels only")
        super().__init__(
            train_X,
            default_classifier_mean_module() if mean_module is None else mean_module,
            default_classifier_covar_module(train_X.shape[-1]) if covar_module is None else covar_module,
            input_transform,
            "train_X",
        )
        self.train_X, self.train_Y = train_X, Y.to(train_X.device).unsqueeze(-1)

    def _sampler_data(self) -> tuple[Any, Tensor, dict[str, Tensor]]:
        return BernoulliLogitLikelihood().to(DTYPE), self.train_Y.squeeze(-1).to(DTYPE), {}

    @torch.no_grad()
    def success_probability(self, X: Tensor) -> Tensor:
        r""":math:`P(y_* = 1 \mid \text{data}) = \frac1S \sum_s E_{\mathcal N_s(f_*)}\sigma(f_*)` at ``X``
        (``(..., q, d)``, untransformed), per point, shape ``(..., q)``: each component's marginal by the
        likelihood's Gauss-Hermite quadrature, averaged over the components (no gradient: for an acquisition use
        :func:`success_constraint`).

        :raises ValueError: naming ``X``, as :meth:`posterior`.
        """
        posterior = self.posterior(X)
        mean, var = posterior.mean.squeeze(-1), posterior.variance.squeeze(-1)
        marginal = BernoulliLogitLikelihood().to(mean).marginal(MultivariateNormal(mean, DiagLinearOperator(var)))
        return marginal.probs.mean(MCMC_DIM + 1)


class FullyBayesianPairwiseGP(ComparisonSizes, FullyBayesianAugmentedModel):
    r"""A fully Bayesian GP preference model as a BoTorch model: :math:`p(x_a \succ x_b \mid f) =
    \sigma(f(x_a) - f(x_b))`, :math:`f \sim \mathcal{GP}(0, k_\theta)` with the kernel's hyper-parameters
    :math:`\theta` under their priors and sampled with :math:`f` by the Pólya-Gamma Gibbs sampler (comparisons are
    linear observations; :func:`fit_fully_bayesian_model_gibbs`). The fully Bayesian counterpart of
    :class:`~gpytorch_augment.preference.PairwiseAugmentedGP` (same data convention and default kernel,
    :func:`~gpytorch_augment.preference.default_covar_module`): a batch of :math:`S` models whose ``posterior(X)``
    is the mixture of the draws' GP conditionals of the utility, which BoTorch's preference acquisition functions
    (``AnalyticExpectedUtilityOfBestOption``, ``qExpectedUtilityOfBestOption``) average over.

    Example::

        >>> import torch
        >>> from botorch.acquisition.preference import AnalyticExpectedUtilityOfBestOption
        >>> from gpytorch_augment.fully_bayesian import FullyBayesianPairwiseGP, fit_fully_bayesian_model_gibbs
        >>> X = torch.linspace(0, 1, 6, dtype=torch.float64).unsqueeze(-1)
        >>> comparisons = torch.tensor([[1, 0], [2, 1], [3, 2], [3, 4], [2, 5], [3, 0]])   # utility peaks at 0.6
        >>> model = FullyBayesianPairwiseGP(X, comparisons)
        >>> fit_fully_bayesian_model_gibbs(model, num_samples=32, warmup=32, thinning=4, num_chains=2, seed=0)
        >>> eubo = AnalyticExpectedUtilityOfBestOption(pref_model=model)
        >>> eubo(torch.tensor([[[0.6], [0.0]]], dtype=torch.float64)).shape
        torch.Size([1])
        >>> int(model.posterior(X).mixture_mean.squeeze(-1).argmax())
        3

    :param datapoints: the compared inputs, ``(n, d)`` floating point (untransformed).
    :param comparisons: ``(m, 2)`` integer indices into ``datapoints``, winner first (BoTorch's ``PairwiseGP``
        convention).
    :param covar_module: the kernel (default :func:`~gpytorch_augment.preference.default_covar_module`).
    :param input_transform: a BoTorch ``InputTransform`` (e.g. ``Normalize(d)``).
    :raises ValueError: naming the argument, for datapoints that are not a finite ``(n, d)`` float tensor or
        comparisons that are not ``(m, 2)`` indices of two different datapoints.
    """

    def __init__(
        self,
        datapoints: Tensor,
        comparisons: Tensor,
        covar_module: gpytorch.kernels.Kernel | None = None,
        input_transform: Any = None,
    ) -> None:
        if not isinstance(datapoints, Tensor) or datapoints.dim() != 2:
            shape = tuple(datapoints.shape) if isinstance(datapoints, Tensor) else type(datapoints).__name__
            raise ValueError(f"datapoints must be a floating-point tensor of shape (n, d); got {shape}")
        comparisons = torch.as_tensor(comparisons, device=datapoints.device)
        if comparisons.dtype == torch.bool or comparisons.is_floating_point():
            raise ValueError("comparisons must hold integer indices of the datapoints")
        LinearObservations.comparisons(comparisons, datapoints.shape[-2])  # raises ValueError naming comparisons
        if comparisons.shape[0] == 0:
            raise ValueError("comparisons must hold at least one comparison")
        super().__init__(
            datapoints,
            gpytorch.means.ZeroMean(),
            default_covar_module(datapoints.shape[-1]) if covar_module is None else covar_module,
            input_transform,
            "datapoints",
        )
        self.datapoints, self.comparisons = datapoints, comparisons.long()

    def _sampler_data(self) -> tuple[Any, Tensor, dict[str, Tensor]]:
        ones = torch.ones(self.m, dtype=DTYPE, device=self.datapoints.device)  # the winner comes first
        return PairwiseLogitLikelihood().to(DTYPE), ones, {"comparisons": self.comparisons}


def fit_fully_bayesian_model_gibbs(
    model: FullyBayesianAugmentedModel,
    num_samples: int = 256,
    warmup: int = 256,
    thinning: int = 16,
    num_chains: int = 4,
    seed: int | None = None,
    progress: bool = False,
) -> None:
    r"""Fit a fully Bayesian augmented model, as BoTorch's ``fit_fully_bayesian_model_nuts`` fits its models: run
    the model's Gibbs sampler with sampled hyper-parameters (:meth:`FullyBayesianAugmentedModel.gibbs_sampler`:
    :math:`\Omega \mid f, y`, then :math:`\theta \mid \Omega, y` with :math:`f` integrated out, then
    :math:`f \mid \theta, \Omega, y`) for ``warmup`` transitions and ``num_samples`` more per chain, keep every
    ``thinning``-th, and load the kept draws of all chains, :math:`S = \text{num\_chains} \times
    \lfloor\text{num\_samples}/\text{thinning}\rfloor`, as the model's batch (``model.load_mcmc_samples``). The
    model is left in eval mode; ``model.samples`` holds the draws (``model.samples.summary(name)`` for R̂ and ESS).

    Example::

        >>> import torch
        >>> from gpytorch_augment.fully_bayesian import FullyBayesianAugmentedClassifier
        >>> X = torch.linspace(0, 1, 8, dtype=torch.float64).unsqueeze(-1)
        >>> model = FullyBayesianAugmentedClassifier(X, (X > 0.5).double())
        >>> fit_fully_bayesian_model_gibbs(model, num_samples=8, warmup=8, thinning=2, num_chains=3, seed=0)
        >>> model.num_mcmc_samples
        12

    :raises ValueError: naming the argument, for a model of another kind or counts that are not positive integers
        (``num_samples`` at least ``thinning``; ``warmup`` may be 0).
    """
    if not isinstance(model, FullyBayesianAugmentedModel):
        raise ValueError(
            f"model must be a FullyBayesianAugmentedClassifier or FullyBayesianPairwiseGP, got {type(model).__name__}"
        )
    for name, value, low in (("num_samples", num_samples, 1), ("warmup", warmup, 0), ("thinning", thinning, 1),
                             ("num_chains", num_chains, 1)):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if num_samples < thinning:
        raise ValueError(f"num_samples ({num_samples}) must be at least thinning ({thinning}): nothing would be kept")
    sampler = model.gibbs_sampler()
    samples = sampler.sample(
        num_samples // thinning, warmup=warmup, thin=thinning, num_chains=num_chains, seed=seed, progress=progress
    )
    model.load_mcmc_samples(samples)
    model.eval()
