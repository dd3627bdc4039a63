r"""The Gibbs sampler: :class:`GibbsSampler`, the driver :class:`~gpytorch_augment.inference.mcmc.MCMC` running the
blocked sweep :class:`~gpytorch_augment.inference.gibbs.GibbsKernel` on a
:class:`~gpytorch_augment.inference.mcmc.PosteriorTarget`."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ...likelihoods.augmented_likelihood import AugmentedLikelihood
from ..mcmc.driver import MCMC
from ..mcmc.target import LINALG_DTYPE, PosteriorTarget
from .hyper import HyperparameterGibbsKernel
from .kernel import GibbsKernel

__all__ = ["GibbsSampler"]


class GibbsSampler(MCMC):
    r"""Blocked Gibbs sampler for a GP prior and an augmented likelihood.

    **Exact model** (no ``inducing_points``): the chain targets the exact posterior
    :math:`p(f \mid y) \propto \prod_i p(y_i \mid f_i)\, \mathcal N(f \mid \mu_0, K + \epsilon I)` by alternating
    :math:`\Omega \mid f` and :math:`f \mid \Omega \sim \mathcal N\big(\mu_0 + \Sigma (h - \Lambda \mu_0),\
    \Sigma\big)`, :math:`\Sigma = \big((K + \epsilon I)^{-1} + \Lambda\big)^{-1}`. The forms of the
    :math:`f`-draw, of the over-relaxed update and of the inducing-point sampler, with their derivations, are in
    :doc:`/maths/engines` (its Gibbs and sparse-sampling sections). The rules:

    * ``f_update="auto"`` (default) draws :math:`f` by the GPML-stable pathwise draw in every sweep where all
      :math:`\lambda_i` are positive normal floats and by the whitened draw otherwise; ``"whitened"`` always uses the
      whitened draw (exact for any :math:`\lambda_i \ge 0`, e.g. missing data). Neither factorisation needs jitter.
    * ``overrelaxation=a`` (:math:`-1 < a < 1`, exact model) replaces the draw by
      :math:`f' = m + a(f - m) + \sqrt{1 - a^2}(\tilde f - m)`, which leaves the exact posterior invariant; ``a = 0``
      is the plain draw. Choose :math:`a` on the worst of bulk, tail and sd ESS (``benchmarks/README.md``).
    * ``inducing_points=Z`` with ``alpha`` :math:`\in [0, 1]` runs the variational Gibbs sampler of Galy-Fajou's
      thesis (2023): :math:`v` from the Power-EP optimal :math:`q^*_\alpha(v)` of the sampled pseudo-observations,
      then :math:`f_i \sim p(f_i \mid u)`. Its stationary law approximates :math:`p(u, f \mid y)` (``alpha = 0``:
      Titsias's variational behaviour; ``1``: FITC's); with :math:`Z = X` it is the exact sampler.
    * Several latents (``likelihood.num_latents = T > 1``): ``model.forward(x)`` returns a batch of ``T``
      independent priors (an un-batched prior is shared); all latents move in one batched draw, or block by block
      with a fresh :math:`\Omega` before each block where the likelihood declares ``latent_blocks``.
    * The likelihood's constants: after every :math:`\Omega` draw the kernel calls
      ``likelihood.sample_hyperparameters(y, Ω, f, generator)`` (a no-op by default); a likelihood that samples
      them keeps one value per chain, recorded in :attr:`PosteriorSamples.hyperparameters` (constrained values, ``raw_``
      stripped); a returned :math:`\Omega` replaces the old one for the :math:`f`-step and in the record.

    **Sampled hyper-parameters** (``sample_hyperparameters=True``): the chains also sample the
    prior's hyper-parameters :math:`\theta` -- every parameter of the model's mean and kernel that requires grad,
    under its registered GPyTorch prior or, for a lengthscale or outputscale without one, the one-call fit's default
    prior -- by the blocked scheme :math:`\Omega \mid f, y` (and the likelihood's constants), then
    :math:`\theta \mid \Omega, y` with :math:`f` integrated out (HMC, or a slice move, on the collapsed marginal), then
    :math:`f \mid \theta, \Omega, y`
    (:class:`~gpytorch_augment.inference.gibbs.HyperparameterGibbsKernel`, whose docstring has the maths). The draws
    of :math:`\theta` are recorded in :attr:`PosteriorSamples.hyperparameters` under the model's names of the
    constrained values (e.g. ``covar_module.base_kernel.lengthscale``, ``(chains, draws, *shape)``); ``predict``
    integrates over them. A parameter that shapes the prior and requires grad without a prior raises ``ValueError``
    naming it (register a prior, or ``requires_grad_(False)`` to keep it fixed). With ``inducing_points`` the
    chain samples the inducing-point model exactly: :math:`u \sim \mathcal N(\mu_Z, K_{ZZ} + \epsilon I)`,
    :math:`f_i \mid u \sim \mathcal N(m_i, d_i)` at every :math:`\theta`; :math:`\theta` moves with :math:`u` and
    :math:`f` integrated out, then :math:`u \mid \theta, \Omega` and :math:`f_i \mid u, \Omega` (the tilted
    conditional, not the fixed-:math:`\theta` sweep's :math:`p(f_i \mid u)`; ``alpha`` does not apply and must stay 0
    or be 1); the draws of :math:`u` (at their own :math:`\theta`) are recorded and ``predict`` conditions on them.
    With a likelihood with ``latent_blocks`` :math:`\theta` moves once per block, on its density given the other
    blocks' latents. Not with ``overrelaxation``, nor with inducing points *and* ``latent_blocks`` (``ValueError``).
    The kernel's options (``sampler.kernel``, :class:`~gpytorch_augment.inference.gibbs.HyperparameterGibbsKernel`):
    ``theta_sampler``, ``surrogate`` (a move of :math:`(\theta, f)` with :math:`\Omega` integrated out, for
    :math:`\theta` pinned by :math:`\Omega`) and ``latent_moves`` (HMC moves of :math:`f \mid \theta, y`, for
    latents pinned by :math:`\Omega`).

    **Structure.** ``GibbsSampler(...)`` only constructs: it is the driver
    :class:`~gpytorch_augment.inference.mcmc.MCMC` (``sample``, ``resume``, ``sweep``) composed with a
    :class:`~gpytorch_augment.inference.gibbs.GibbsKernel` (the sweep) on a
    :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget`. The settings live where they belong:
    ``sampler.kernel`` (``f_update``, ``overrelaxation``, ``alpha``, ``sample_latent``, ``inducing_distribution``) and
    ``sampler.target`` (``model``, ``likelihood``, ``x``, ``y``, ``jitter``, ``terms``, ``refresh()``); the draws come
    back as :class:`~gpytorch_augment.inference.mcmc.PosteriorSamples`.

    **Caching.** The prior (mean, kernel matrix, Cholesky factor) is computed once. :meth:`sample` compares the
    model's parameters and buffers with a snapshot and calls ``sampler.target.refresh()`` itself when they changed
    in place; call it explicitly after any other change of the prior (e.g. a replaced module).

    :param model: a GPyTorch model or module whose ``forward(x)`` returns the prior ``MultivariateNormal``:
        preferably a :class:`~gpytorch_augment.GPPrior` (a mean and a kernel), or an ``ApproximateGP``; only
        ``model.forward`` is called, never ``model(x)``. An ``ExactGP`` works but warns: its own ``model(x)`` is a
        Gaussian-regression posterior unrelated to the draws (predict with :meth:`PosteriorSamples.predict`).
    :param likelihood: an :class:`~gpytorch_augment.likelihoods.AugmentedLikelihood`.
    :param x: training inputs ``(N, D)``.
    :param y: training targets ``(N,)`` (a column ``(N, 1)`` is accepted and squeezed).
    :param inducing_points: optional ``(M, D)`` inducing inputs :math:`Z` (or ``(T, M, D)``).
    :param alpha: the Rényi/Power-EP :math:`\alpha \in [0, 1]` of the inducing-point sampler (default 0, Titsias;
        1 is FITC; see above). Needs ``inducing_points`` unless 0; with ``sample_hyperparameters=True`` only 0 or 1
        (the exact sampler of the inducing-point model, whatever its value).
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
    :param sample_hyperparameters: sample the prior's hyper-parameters too (see above; default ``False``: they stay
        at the model's values).
    :param kwargs: per-datum keyword data of the likelihood (e.g. binomial ``trials``), passed to
        ``likelihood.check_targets``; the engine works with the canonical targets it returns.

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
        sample_hyperparameters: bool = False,
        **kwargs: Any,
    ) -> None:
        if not isinstance(sample_hyperparameters, bool):
            raise ValueError(f"sample_hyperparameters must be True or False, got {sample_hyperparameters!r}")
        if sample_hyperparameters and inducing_points is not None and alpha not in (0, 1):
            raise ValueError(
                f"sample_hyperparameters=True with inducing_points samples the inducing-point model exactly (u and "
                f"f | u, Ω from their conditionals, the Power-EP alpha = 1 form); alpha = {alpha!r} does not apply: "
                "leave alpha at its default"
            )
        if sample_hyperparameters and overrelaxation != 0.0:
            raise ValueError(
                "sample_hyperparameters=True draws f afresh at every new θ; over-relaxation around the conditional "
                "mean needs the current f at the same θ: use overrelaxation=0"
            )
        target = PosteriorTarget(
            model, likelihood, x, y, inducing_points, jitter, linalg_dtype, caller=type(self).__name__, **kwargs
        )
        kernel = GibbsKernel(target, f_update=f_update, overrelaxation=overrelaxation, alpha=alpha)
        super().__init__(HyperparameterGibbsKernel(target) if sample_hyperparameters else kernel)
