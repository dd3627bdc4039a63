r"""One entry point for the exact-posterior samplers: :func:`posterior_sampler` builds the sampler that was measured
best for the likelihood (``method="auto"``) or the one named.

The methods, all under the same ``sample`` / ``resume`` / :class:`~gpytorch_augment.PosteriorSamples` API (ArviZ export,
:math:`\hat R` / ESS, ``predict``):

* ``"gibbs"`` -- :class:`~gpytorch_augment.GibbsSampler`, the blocked sampler of the augmented model
  (:math:`\Omega \mid f`, then :math:`f \mid \Omega`, optionally over-relaxed); it also samples the likelihood's
  constants under their prior and runs the inducing-point (sparse) samplers;
* ``"hmc"`` -- :class:`~gpytorch_augment.HMCSampler`, Hamiltonian Monte Carlo on the original model in coordinates
  whitened by the Laplace approximation (exact model, constants fixed).

``"auto"`` applies one rule, with no likelihood-specific branch: the Gibbs sampler where only it applies
(``inducing_points`` given, or ``likelihood.samples_constants``), else the likelihood's declared
``preferred_sampler`` -- the sampler with the larger worst-case effective sample size per second in
``benchmarks/sampling.py`` (real posteriors) or ``benchmarks/studies/sampler_choice.py`` (synthetic ones), ``"gibbs"``
where the two split by chain count and for a likelihood not measured. With ``sample_hyperparameters=True`` (the
prior's hyper-parameters sampled too) the same rule reads ``preferred_hyper_sampler`` (and linear observations
also mean ``"gibbs"``): ``"hmc"`` moves them jointly with the whitened latents
(:class:`~gpytorch_augment.inference.hmc.HyperparameterHMCKernel`), which mixed faster only where the auxiliary
variables pin the latents (the logistic-softmax likelihood), ``"gibbs"`` everywhere else measured (figures:
``benchmarks/fully_bayesian.py``). Which to use when, with the measured figures: ``docs/guide/choosing.md``.

Example::

    >>> import gpytorch, torch
    >>> from gpytorch_augment import BernoulliLogitLikelihood, GPPrior, LaplaceLikelihood, posterior_sampler
    >>> x = torch.linspace(-2, 2, 12, dtype=torch.float64).unsqueeze(-1)
    >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel()).double()
    >>> sampler = posterior_sampler(prior, BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double())
    >>> type(sampler).__name__
    'HMCSampler'
    >>> y = x.squeeze(-1).sin()                                       # Laplace noise: Gibbs
    >>> type(posterior_sampler(prior, LaplaceLikelihood(scale=0.3), x, y)).__name__
    'GibbsSampler'
    >>> samples = sampler.sample(20, warmup=20, num_chains=2, seed=0, progress=False)
    >>> samples.f.shape
    torch.Size([2, 20, 12])
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..likelihoods.augmented_likelihood import AugmentedLikelihood
from .gibbs import GibbsSampler
from .hmc import HMCSampler
from .mcmc import MCMC

__all__ = ["METHODS", "choose_method", "posterior_sampler"]

#: the samplers :func:`posterior_sampler` builds, by method name
METHODS: dict[str, type[MCMC]] = {"gibbs": GibbsSampler, "hmc": HMCSampler}


def choose_method(
    likelihood: AugmentedLikelihood, inducing_points: Tensor | None = None, sample_hyperparameters: bool = False
) -> str:
    """The method ``"auto"`` stands for (see the module docstring): ``"gibbs"`` with ``inducing_points`` or a
    likelihood whose constants are sampled (and, sampling the hyper-parameters, with linear observations), else
    ``likelihood.preferred_sampler`` (``likelihood.preferred_hyper_sampler`` with ``sample_hyperparameters``)."""
    if inducing_points is not None or getattr(likelihood, "samples_constants", False):
        return "gibbs"
    if sample_hyperparameters and getattr(likelihood, "linear_observations", False):
        return "gibbs"
    attribute = "preferred_hyper_sampler" if sample_hyperparameters else "preferred_sampler"
    preferred = getattr(likelihood, attribute, "gibbs")
    if preferred not in METHODS:
        name = type(likelihood).__name__
        raise ValueError(f"{name}.{attribute} must be one of {tuple(METHODS)}, got {preferred!r}")
    return preferred


def posterior_sampler(
    model: Any,
    likelihood: AugmentedLikelihood,
    x: Tensor,
    y: Tensor,
    *,
    method: str = "auto",
    inducing_points: Tensor | None = None,
    sample_hyperparameters: bool = False,
    **kwargs: Any,
) -> MCMC:
    """Build the sampler of the posterior :math:`p(f \\mid y)` named by ``method``.

    :param model: the prior, as for :class:`~gpytorch_augment.GibbsSampler` (``model.forward(x)``).
    :param likelihood: an :class:`~gpytorch_augment.likelihoods.AugmentedLikelihood`.
    :param x: training inputs ``(N, D)``.
    :param y: training targets ``(N,)``.
    :param method: ``"auto"`` (default: :func:`choose_method`), ``"gibbs"`` or ``"hmc"``.
    :param inducing_points: optional inducing inputs (Gibbs only).
    :param sample_hyperparameters: sample the prior's hyper-parameters too (the samplers' ``sample_hyperparameters``:
        Gibbs moves them given the auxiliary variables with the latents integrated out, HMC moves them jointly with
        the whitened latents; ``"auto"`` then picks ``likelihood.preferred_hyper_sampler``: Gibbs but for the
        logistic-softmax likelihood).
    :param kwargs: options of the chosen sampler (e.g. ``overrelaxation`` for Gibbs, ``num_steps`` for HMC, both:
        ``jitter``) and per-datum keyword data of the likelihood.
    :return: a :class:`~gpytorch_augment.GibbsSampler` or :class:`~gpytorch_augment.HMCSampler` (both
        :class:`~gpytorch_augment.inference.mcmc.MCMC` drivers).
    :raises ValueError: on an unknown ``method`` or an option the chosen sampler rejects.
    """
    if not isinstance(method, str) or (method != "auto" and method not in METHODS):
        raise ValueError(f"method must be 'auto' or one of {tuple(METHODS)}, got {method!r}")
    if not isinstance(sample_hyperparameters, bool):
        raise ValueError(f"sample_hyperparameters must be True or False, got {sample_hyperparameters!r}")
    options: dict[str, Any] = {} if inducing_points is None else {"inducing_points": inducing_points}
    name = choose_method(likelihood, inducing_points, sample_hyperparameters) if method == "auto" else method
    if sample_hyperparameters:
        options["sample_hyperparameters"] = True
    return METHODS[name](model, likelihood, x, y, **options, **kwargs)
