r"""The Geweke joint-distribution test of the Gibbs sampler (identity (g) of :doc:`/maths/identities`).

Two simulators of the joint :math:`p(f, y)` of a tiny model (an explicit prior over :math:`N = 3` points):

* **marginal-conditional** (the reference): :math:`f \sim p(f)`, :math:`y \sim p(y \mid f)`;
* **successive-conditional**: from a prior draw, repeat "one full sampler sweep given the current :math:`y`, then
  :math:`y \sim p(y \mid f)`" in :math:`C` independent vectorised chains, dropping a burn-in.

If the sampler leaves :math:`p(f \mid y)` invariant, both simulate the same joint. The per-chain means of the test
functions :math:`f_i, f_i^2, y_i, f_i y_i` are compared with the reference by
:math:`z = \text{difference} / \text{combined standard error}` (from the across-chain spread); the sampler passes
if every :math:`|z| \le 4.5` (:data:`Z_TOL`).

The simulator reads only the public sampler API: ``GibbsSampler(model, likelihood, x, y, inducing_points=...,
**kwargs)``, its ``jitter`` and ``sweep(f, y=..., generator=...)``. :func:`geweke_z_hyperparameters` is the same test
for a kernel that samples the prior's hyper-parameters :math:`\theta` too (the reference draws :math:`\theta` from
its prior; the test functions add :math:`\theta` and its products with :math:`f`); it runs the kernel protocol
(``init`` / ``step``) directly.

Example::

    >>> import torch
    >>> from gpytorch_augment.testing import geweke_z
    >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE as case
    >>> with torch.random.fork_rng():
    ...     _ = torch.manual_seed(0)
    ...     z = geweke_z(case.make(), case.sample_targets, num_chains=400, num_sweeps=60, burn_in=10,
    ...                  num_reference=20_000)
    >>> bool(z.abs().max() <= 4.5)
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import gpytorch
import torch
from linear_operator import to_linear_operator
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from gpytorch_augment.inference import GibbsSampler
from gpytorch_augment.inference.gibbs import HyperparameterGibbsKernel
from gpytorch_augment.inference.mcmc import ChainState, MCMCKernel, PosteriorTarget
from gpytorch_augment.inference.mcmc.prior_parameters import PriorParameters
from gpytorch_augment.inference.mcmc.target import conditional_variances
from gpytorch_augment.likelihoods import AugmentedLikelihood
from gpytorch_augment.models import GPPrior
from gpytorch_augment.testing.case import LikelihoodCase

#: the threshold on every :math:`|z|`
Z_TOL = 4.5
#: data points of the tiny model
NUM_POINTS = 3
#: marginal-conditional reference draws (identity (g) asks for 1e6; its standard error enters the combined SE, and at
#: 2.5e5 it is already ~8x smaller than the simulator's)
NUM_REFERENCE = 250_000


class ExplicitPrior(gpytorch.Module):
    r"""A GP prior with an explicit mean and covariance over points labelled ``0 .. n-1``.

    ``forward(x)`` returns :math:`\mathcal N(\mu_{idx}, K_{idx,idx})` with ``idx = x[:, 0]`` (repeated points are
    allowed).

    :param mu: ``(n,)``, or ``(T, n)`` for a batch of ``T`` latent priors.
    :param K: ``(n, n)``, or ``(T, n, n)``.

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing import ExplicitPrior, tiny_prior
        >>> mu, K = tiny_prior(1)
        >>> p = ExplicitPrior(mu, K)(torch.tensor([[0.0], [2.0], [2.0]]))   # points 0, 2, 2
        >>> p.mean.shape, torch.equal(p.mean, mu[[0, 2, 2]])
        (torch.Size([3]), True)
    """

    def __init__(self, mu: Tensor, K: Tensor) -> None:
        super().__init__()
        self.register_buffer("mu", mu)
        self.register_buffer("K", K)

    def forward(self, x: Tensor) -> gpytorch.distributions.MultivariateNormal:
        idx = x[..., 0].long()
        return gpytorch.distributions.MultivariateNormal(
            self.mu[..., idx], to_linear_operator(self.K[..., idx[:, None], idx])
        )


def tiny_prior(num_latents: int, seed: int = 0, num_points: int = NUM_POINTS) -> tuple[Tensor, Tensor]:
    """An explicit, well-conditioned prior (mean, covariance) with a non-zero mean, one per latent for ``T > 1``.

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing import tiny_prior
        >>> mu, K = tiny_prior(2)
        >>> mu.shape, K.shape, bool((torch.linalg.eigvalsh(K) > 0).all())
        (torch.Size([2, 3]), torch.Size([2, 3, 3]), True)
    """
    g = torch.Generator().manual_seed(seed)
    shape = (num_latents,) if num_latents > 1 else ()
    A = torch.randn(shape + (num_points, num_points), generator=g)
    K = 1.5 * (A @ A.mT / num_points + 0.3 * torch.eye(num_points))
    mu = 0.5 * torch.randn(shape + (num_points,), generator=g)
    return mu, K


def _to_likelihood_layout(f: Tensor, num_latents: int) -> Tensor:
    """Storage layout (C, N) / (C, T, N) -> likelihood layout (C, N) / (C, N, T)."""
    return f if num_latents == 1 else f.mT


def _test_functions(f: Tensor, y: Tensor, num_latents: int) -> Tensor:
    """f, f^2, y and f*y for every point (and latent), flattened along the last dimension."""
    f = _to_likelihood_layout(f, num_latents)  # (C, N) or (C, N, T)
    y = y.to(f.dtype)
    if num_latents == 1:
        return torch.cat([f, f**2, y, f * y], -1)
    batch = f.shape[:-2]
    parts = [f, f**2, f * y.unsqueeze(-1), y]
    return torch.cat([p.reshape(*batch, -1) for p in parts], -1)


def _prior_root(mu: Tensor, K: Tensor, jitter: float, num_inducing: int | None) -> tuple[Tensor, Tensor]:
    r"""``(mean, root)`` with :math:`f = \text{mean} + \text{root}\,\varepsilon` a draw of the prior the sampler
    targets: exact :math:`\mathcal N(\mu, K + \epsilon I)`; with the first ``num_inducing`` points as inducing
    inputs, the projected process :math:`f = \mu + A^\top\varepsilon`, :math:`A = L^{-1}K_{ZX}`,
    :math:`L = \mathrm{chol}(K_{ZZ} + \epsilon I)`. Latent-major, ``(T, N)`` and ``(T, N, ·)``."""
    mu, K = mu.reshape(-1, mu.shape[-1]), K.reshape(-1, *K.shape[-2:])
    eye = torch.eye(K.shape[-1], dtype=K.dtype)
    if num_inducing is None:
        return mu, psd_safe_cholesky((K + K.mT) / 2 + jitter * eye)
    M = num_inducing
    L = psd_safe_cholesky(K[..., :M, :M] + jitter * eye[:M, :M])
    return mu, torch.linalg.solve_triangular(L, K[..., :M, :], upper=False).mT


def geweke_z(
    likelihood: AugmentedLikelihood,
    sample_targets: Callable[..., Tensor],
    inducing: bool = False,
    make_kwargs: Callable[[torch.Size, torch.Generator], dict[str, Tensor]] | None = None,
    num_chains: int = 4_000,
    num_sweeps: int = 300,
    burn_in: int = 50,
    seed: int = 0,
    num_reference: int = NUM_REFERENCE,
    sampler_cls: Callable[..., GibbsSampler] = GibbsSampler,
    num_inducing: int = NUM_POINTS,
) -> Tensor:
    """z-scores of the successive-conditional simulator against the marginal-conditional reference.

    :param likelihood: the likelihood whose Gibbs sampler is tested (float64).
    :param sample_targets: ``sample_targets(f, generator, **kwargs)`` draws :math:`y \\sim p(y \\mid f)` (as
        :attr:`LikelihoodCase.sample_targets`).
    :param inducing: test the inducing-point sampler, with the first ``num_inducing`` points as inducing inputs
        (default all of them, Z = X: the only configuration in which that sampler is exact for every ``alpha``).
    :param make_kwargs: per-datum keyword data (as :attr:`LikelihoodCase.make_kwargs`).
    :param num_chains: chains of the successive-conditional simulator (identity (g) asks for 2e4; 4000 keeps it fast).
    :param num_sweeps: sweeps per chain, of which the first ``burn_in`` are dropped.
    :param seed: seeds the prior and every draw.
    :param num_reference: draws of the marginal-conditional reference.
    :param sampler_cls: builds the sampler (e.g. ``functools.partial(GibbsSampler, overrelaxation=-0.7)``).
    :param num_inducing: see ``inducing``.
    :return: one z-score per test function; a test function constant in both simulators (e.g. :math:`y_i` with
        zero binomial trials) has :math:`z = 0`.

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing import geweke_z
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> with torch.random.fork_rng():
        ...     _ = torch.manual_seed(0)
        ...     z = geweke_z(BERNOULLI_CASE.make(), BERNOULLI_CASE.sample_targets, num_chains=200, num_sweeps=30,
        ...                  burn_in=5, num_reference=5_000)
        >>> z.shape, bool(z.abs().max() <= 4.5)              # f, f^2, y, f*y at 3 points
        (torch.Size([12]), True)
    """
    T = likelihood.num_latents
    mu, K = tiny_prior(T, seed=seed)
    model = ExplicitPrior(mu, K)
    x = torch.arange(NUM_POINTS, dtype=torch.float64).unsqueeze(-1)
    g = torch.Generator().manual_seed(seed)

    Z = x[:num_inducing] if inducing else None
    kwargs = make_kwargs(torch.Size([NUM_POINTS]), g) if make_kwargs is not None else {}

    def targets(f_storage: Tensor) -> Tensor:
        batch = f_storage.shape[:1]
        expanded = {k: v.expand(batch + v.shape) for k, v in kwargs.items()}
        return sample_targets(_to_likelihood_layout(f_storage, T), g, **expanded)

    probe_y = targets(mu.unsqueeze(0))[0]
    sampler = sampler_cls(model, likelihood, x, probe_y, inducing_points=Z, **kwargs)
    mean, root = _prior_root(mu.double(), K.double(), float(sampler.target.jitter), None if Z is None else Z.shape[0])

    def prior_draws(n: int) -> Tensor:
        eps = torch.randn((n,) + root.shape[:-2] + (root.shape[-1],), generator=g, dtype=root.dtype)
        f = mean + (root @ eps.unsqueeze(-1)).squeeze(-1)  # (n, T, N)
        return f[:, 0] if T == 1 else f

    # marginal-conditional reference
    f_ref = prior_draws(num_reference)
    ref = _test_functions(f_ref, targets(f_ref), T)

    # successive-conditional simulator, chains vectorised
    f = prior_draws(num_chains)
    y = targets(f)
    total = torch.zeros_like(ref[0].expand(num_chains, -1))
    for sweep in range(num_sweeps):
        f = sampler.sweep(f, y=y, generator=g).f
        y = targets(f)
        if sweep >= burn_in:
            total += _test_functions(f, y, T)
    return _z_scores(ref, total / (num_sweeps - burn_in))


def violation_geweke(case: LikelihoodCase, z_tol: float = Z_TOL, **kwargs) -> dict[str, float]:
    """identity (g) as a ``violation_*`` check: ``{"max |z|": max |z| / z_tol}`` for :func:`geweke_z` on ``case``
    (``kwargs`` go to :func:`geweke_z`).

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing import violation_geweke
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> with torch.random.fork_rng():
        ...     _ = torch.manual_seed(0)
        ...     ratios = violation_geweke(BERNOULLI_CASE, num_chains=200, num_sweeps=30, burn_in=5, num_reference=5_000)
        >>> list(ratios), ratios["max |z|"] <= 1
        (['max |z|'], True)
    """
    z = geweke_z(case.make(), case.sample_targets, make_kwargs=case.make_kwargs, **kwargs)
    return {"max |z|": float(z.abs().max()) / z_tol}


#: inputs of the tiny model whose hyper-parameters are sampled (:func:`geweke_z_hyperparameters`)
HYPER_INPUTS = (0.0, 0.5, 1.2)
#: its priors: ``{constrained name: (kind, loc, scale)}``, ``"normal"`` on the value or ``"lognormal"``
HYPER_PRIORS: dict[str, tuple[str, float, float]] = {
    "mean_module.constant": ("normal", 0.0, 1.0),
    "covar_module.outputscale": ("lognormal", 0.0, 0.5),
    "covar_module.base_kernel.lengthscale": ("lognormal", 0.0, 0.5),
}


def hyper_prior_model(
    priors: dict[str, tuple[str, float, float]] | None = None, batch_shape: torch.Size = torch.Size()
) -> GPPrior:
    """The tiny model of :func:`geweke_z_hyperparameters`: a constant mean and a scaled RBF kernel, each parameter
    under the prior of :data:`HYPER_PRIORS` (float64); ``batch_shape`` ``[T]`` gives ``T`` independent latent priors,
    each with its own parameters under the same priors.

    Example::

        >>> from gpytorch_augment.testing.geweke import hyper_prior_model
        >>> sorted(name for name, *_ in hyper_prior_model().named_priors())
        ['covar_module.base_kernel.lengthscale_prior', 'covar_module.outputscale_prior', 'mean_module.mean_prior']
    """
    priors = HYPER_PRIORS if priors is None else priors

    def make(name: str) -> gpytorch.priors.Prior:
        kind, loc, scale = priors[name]
        cls = gpytorch.priors.NormalPrior if kind == "normal" else gpytorch.priors.LogNormalPrior
        return cls(loc, scale)

    mean = gpytorch.means.ConstantMean(constant_prior=make("mean_module.constant"), batch_shape=batch_shape)
    base = gpytorch.kernels.RBFKernel(
        lengthscale_prior=make("covar_module.base_kernel.lengthscale"), batch_shape=batch_shape
    )
    kernel = gpytorch.kernels.ScaleKernel(
        base, outputscale_prior=make("covar_module.outputscale"), batch_shape=batch_shape
    )
    return GPPrior(mean, kernel).double()


def _prior_draws(
    n: int, generator: torch.Generator, priors: dict[str, tuple[str, float, float]], shapes: dict[str, torch.Size]
) -> dict[str, Tensor]:
    out = {}
    for name, (kind, loc, scale) in priors.items():
        z = loc + scale * torch.randn((n,) + tuple(shapes[name]), generator=generator, dtype=torch.float64)
        out[name] = z if kind == "normal" else z.exp()
    return out


def _latent_prior_draws(
    params: PriorParameters, theta: Tensor, x: Tensor, Z: Tensor | None, jitter: float, g: torch.Generator
) -> Tensor:
    r"""One draw of the latents ``(n, T, N)`` at each of the ``n`` raw hyper-parameter vectors ``theta``: from the
    exact prior :math:`\mathcal N(\mu_\theta, K_\theta + \epsilon I)`, or (inducing inputs ``Z``) from the
    inducing-point prior of :func:`geweke_z_hyperparameters`."""
    if Z is None:
        mean, covar, _ = params.evaluate(theta, log_prior=False)
        eye = torch.eye(covar.shape[-1], dtype=covar.dtype)
        L = torch.linalg.cholesky((covar + covar.mT) / 2 + jitter * eye)
        eps = torch.randn(mean.shape, generator=g, dtype=mean.dtype)
        return mean + (L @ eps.unsqueeze(-1)).squeeze(-1)
    M = Z.shape[-2]
    mean, covar, _ = params.evaluate(theta, torch.cat([Z, x]), log_prior=False)
    eye = torch.eye(M, dtype=covar.dtype)
    L = torch.linalg.cholesky((covar[..., :M, :M] + covar[..., :M, :M].mT) / 2 + jitter * eye)
    A = torch.linalg.solve_triangular(L, covar[..., :M, M:], upper=False)
    d = conditional_variances(covar[..., M:, M:].diagonal(dim1=-2, dim2=-1), A.square().sum(-2), jitter)
    v = torch.randn(mean[..., :M].shape, generator=g, dtype=mean.dtype)
    eps = torch.randn(mean[..., M:].shape, generator=g, dtype=mean.dtype)
    return mean[..., M:] + (v.unsqueeze(-2) @ A).squeeze(-2) + d.sqrt() * eps


def _z_scores(reference: Tensor, chain_means: Tensor) -> Tensor:
    """Geweke's z per test function: the successive-conditional chains' mean (``chain_means``, one row per chain)
    against the marginal-conditional draws' (``reference``, one row per draw), over their combined standard
    error; 0 where both agree exactly and infinite where only the standard error vanishes."""
    ref_mean, ref_se = reference.mean(0), reference.std(0) / math.sqrt(reference.shape[0])
    sc_mean, sc_se = chain_means.mean(0), chain_means.std(0) / math.sqrt(chain_means.shape[0])
    diff, se = sc_mean - ref_mean, (sc_se**2 + ref_se**2).sqrt()
    return torch.where(se > 0, diff / se, torch.where(diff == 0, 0.0, math.inf))


def geweke_z_hyperparameters(
    likelihood: AugmentedLikelihood,
    sample_targets: Callable[..., Tensor],
    kernel_cls: Callable[[PosteriorTarget], MCMCKernel] = HyperparameterGibbsKernel,
    num_chains: int = 4_000,
    num_sweeps: int = 300,
    burn_in: int = 50,
    seed: int = 0,
    num_reference: int = NUM_REFERENCE,
    inducing_points: Sequence[float] | None = None,
) -> Tensor:
    r"""Geweke's joint test of a kernel that samples the prior's hyper-parameters :math:`\theta` too
    (:class:`~gpytorch_augment.inference.gibbs.HyperparameterGibbsKernel`), on the tiny model
    :func:`hyper_prior_model` at :data:`HYPER_INPUTS` (:math:`N = 3`; a likelihood with ``T`` latents gets ``T``
    independent priors, each with its own :math:`\theta`).

    * marginal-conditional (the reference): :math:`\theta \sim p(\theta)` (:data:`HYPER_PRIORS`),
      :math:`f \sim \mathcal N(\mu_\theta, K_\theta + \epsilon I)`, :math:`y \sim p(y \mid f)`; with
      ``inducing_points`` :math:`Z` the inducing-point prior instead: :math:`u = \mu_Z + L_Z v`,
      :math:`v \sim \mathcal N(0, I)`, :math:`f_i = \mu_i + a_i^\top v + \sqrt{d_i}\,\varepsilon_i`
      (:math:`L_Z = \mathrm{chol}(K_{ZZ} + \epsilon I)`, :math:`A = L_Z^{-1}K_{ZX}`, :math:`d` as the target computes
      it, :func:`~gpytorch_augment.inference.mcmc.target.conditional_variances`), all at :math:`\theta`;
    * successive-conditional: from reference draws, repeat "one transition of the kernel given the current
      :math:`y`, then :math:`y \sim p(y \mid f)`" in ``num_chains`` vectorised chains (the kernel's ``init`` /
      ``step`` protocol, no warm-up: nothing adapts), dropping ``burn_in`` transitions.

    The test functions are :math:`f_i, f_i^2, y_i, f_i y_i` and, for every raw coordinate :math:`\theta_j`,
    :math:`\theta_j, \theta_j^2, \theta_j f_i` (the last tie :math:`\theta` to the latents: a kernel that leaves the
    old :math:`f` with a new :math:`\theta` fails on them); :math:`f_i` runs over every latent.

    :param kernel_cls: builds the kernel from the :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget` (e.g. a
        deliberately broken subclass).
    :param inducing_points: the 1-D inducing inputs :math:`Z` (``None``: the exact model).
    :return: one z-score per test function (as :func:`geweke_z`).

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing.geweke import geweke_z_hyperparameters
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE as case
        >>> z = geweke_z_hyperparameters(case.make(), case.sample_targets, num_chains=200, num_sweeps=20,
        ...                              burn_in=5, num_reference=5_000)
        >>> z.shape, bool(z.abs().max() <= 4.5)           # 12 for f, y; 3 x (2 + 3) for theta
        (torch.Size([27]), True)
    """
    T = int(likelihood.num_latents)
    g = torch.Generator().manual_seed(seed)
    x = torch.tensor(HYPER_INPUTS, dtype=torch.float64).unsqueeze(-1)
    Z = None if inducing_points is None else torch.tensor(inducing_points, dtype=torch.float64).unsqueeze(-1)

    def targets(f: Tensor) -> Tensor:  # storage layout (n, N) / (n, T, N) -> the likelihood's
        return sample_targets(f if T == 1 else f.mT, g)

    model = hyper_prior_model(batch_shape=torch.Size([T]) if T > 1 else torch.Size())
    probe_y = targets(torch.zeros((1, T, x.shape[0]) if T > 1 else (1, x.shape[0]), dtype=torch.float64))[0]
    target = PosteriorTarget(model, likelihood, x, probe_y, inducing_points=Z, caller="geweke_z_hyperparameters")
    kernel = kernel_cls(target)
    params = kernel.hyperparameters
    jitter = target.jitter
    shapes = {p.name: p.shape for p in params.parameters}

    def joint_draws(n: int) -> tuple[Tensor, Tensor, Tensor]:
        theta = params.from_constrained(_prior_draws(n, g, HYPER_PRIORS, shapes), n)
        f = _latent_prior_draws(params, theta, x, Z, jitter, g)  # (n, T, N)
        f = f[:, 0] if T == 1 else f  # storage layout
        return theta, f, targets(f)

    def test_functions(theta: Tensor, f: Tensor, y: Tensor) -> Tensor:
        y, f = y.to(f.dtype), f.reshape(f.shape[0], -1)
        fy = f * y.repeat(1, T)
        cross = (theta.unsqueeze(-1) * f.unsqueeze(-2)).flatten(-2)
        return torch.cat([f, f**2, y, fy, theta, theta**2, cross], -1)

    theta, f, y = joint_draws(num_reference)
    ref = test_functions(theta, f, y)

    theta, f, y = joint_draws(num_chains)
    state = ChainState(f=f, hyper=params.constrained(theta), coordinates=theta.unsqueeze(0))
    chains = kernel.end_warmup(kernel.init(target.from_storage(f, None), target.checked_targets(y), state, 0))
    total = torch.zeros_like(ref[0].expand(num_chains, -1))
    for sweep in range(num_sweeps):
        chains = kernel.step(chains, g, adapt=False)
        f = target.to_storage(chains.f)
        y = targets(f)
        chains = chains._replace(y=target.checked_targets(y))
        if sweep >= burn_in:
            total += test_functions(chains.theta, f, y)
    return _z_scores(ref, total / (num_sweeps - burn_in))
