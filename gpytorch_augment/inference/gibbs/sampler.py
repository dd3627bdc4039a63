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
from .kernel import GibbsKernel

__all__ = ["GibbsSampler"]


class GibbsSampler(MCMC):
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
    over-relaxation costs a few elementwise operations, no extra solve. :meth:`GibbsKernel.sample_latent
    <gpytorch_augment.inference.gibbs.GibbsKernel.sample_latent>` (one conditional
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
    :attr:`PosteriorSamples.hyper` under the parameter names (constrained values, ``raw_`` stripped). If it returns a
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
        target = PosteriorTarget(
            model, likelihood, x, y, inducing_points, jitter, linalg_dtype, caller=type(self).__name__, **kwargs
        )
        super().__init__(GibbsKernel(target, f_update=f_update, overrelaxation=overrelaxation, alpha=alpha))
