r"""The four posteriors of ``sampling.py``, each with the augmented likelihood (ours) and the same log-likelihood
written in JAX (NumPyro), checked against each other.

(a) **heart**: Bernoulli-logit on KEEL ``heart`` (216 training points, 13 standardised features);
(b) **Boston**: Student-t regression on MASS ``Boston`` (405 training points), :math:`\nu, \sigma` of ``regression.py``;
(c) **mcycle**: heteroscedastic Gaussian on MASS ``mcycle`` (133 points, two latent GPs :math:`f, g`,
    :math:`y \sim \mathcal N(f, (\xi\sigma(g))^{-1})`);
(d) **vehicle**: logistic-softmax (4 classes) on 200 training points of KEEL ``vehicle`` (four latent GPs).

Kernel hyper-parameters are fixed by a declared rule per problem (short SVGP fits for heart and Boston, as before;
fixed values on standardised data for mcycle and vehicle), never tuned on the sampler comparison.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import _common as common
import gpytorch
import numpy as np
import regression
import torch
from torch import Tensor

from gpytorch_augment import (
    BernoulliLogitLikelihood,
    GPPrior,
    HeteroscedasticGaussianLikelihood,
    LogisticSoftmaxLikelihood,
    StudentTLikelihood,
)
from gpytorch_augment.datasets import load_keel, load_rdataset
from gpytorch_augment.likelihoods.augmented_likelihood import AugmentedLikelihood

#: jitter added to every prior covariance (all samplers)
JITTER = 1e-6


@dataclass
class Problem:
    """One posterior: data, the fixed prior (``forward(x)``), the augmented likelihood and the JAX log-likelihood
    ``jax_log_lik(f)`` of latents ``f`` (T, N) (the same function as ``likelihood.log_prob_at``, summed)."""

    key: str
    title: str
    x: Tensor
    y: Tensor
    prior: Any
    likelihood: AugmentedLikelihood
    jax_log_lik: Callable[[Any], Any]
    hypers: dict[str, Any]
    data_note: str

    @property
    def num_latents(self) -> int:
        return int(self.likelihood.num_latents)


def BatchPrior(means: list[float], outputscales: list[float], lengthscales: list[float]) -> GPPrior:
    """``T`` independent GP priors (constant mean, scaled isotropic RBF) with fixed values, ``batch_shape [T]``."""
    T = torch.Size([len(means)])
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=T), batch_shape=T)
    prior = GPPrior(gpytorch.means.ConstantMean(batch_shape=T), kernel)
    with torch.no_grad():
        prior.mean_module.constant.copy_(torch.tensor(means))
        kernel.outputscale = torch.tensor(outputscales)
        kernel.base_kernel.lengthscale = torch.tensor(lengthscales).view(-1, 1, 1)
    return prior.requires_grad_(False)


def heart_problem(seed: int, quick: bool) -> Problem:
    import jax.numpy as jnp

    data = load_keel("heart", test_fraction=0.2, seed=seed, max_train=60 if quick else None)
    x, y = data.x_train, data.y_train
    model = common.SparseGP(x)
    model.covar_module.base_kernel.lengthscale = math.sqrt(x.size(-1))
    iterations = 30 if quick else 300
    final, seconds = common.train_svgp(model, BernoulliLogitLikelihood(), x, y, iterations, 0.05)
    hypers = {**common.hyperparameter_values(model), "fit_seconds": seconds, "procedure": (
        f"GPyTorch SVGP with Z = all training inputs, Adam lr 0.05 on q(u) and all hyper-parameters for {iterations} "
        "steps from lengthscales sqrt(D), outputscale 1, mean 0; then frozen")}
    sign = jnp.asarray(2 * y.numpy() - 1)

    def log_lik(f: Any) -> Any:
        return -jnp.sum(jnp.logaddexp(0.0, -sign * f[0]))

    return Problem("heart", "heart, Bernoulli-logit", x, y, regression.gp_prior(hypers), BernoulliLogitLikelihood(),
                   log_lik, hypers, f"KEEL heart training split (seed {seed}): {x.shape[0]} points, {x.shape[1]} "
                   "standardised features, labels {0, 1}")


def boston_problem(seed: int, quick: bool) -> Problem:
    import jax.numpy as jnp
    from jax.scipy.special import gammaln

    data = regression.load_boston(test_fraction=0.2, seed=seed, max_train=60 if quick else None)
    Z = common.kmeans_inducing_points(data.x_train, 30 if quick else 100, seed=seed)
    hypers = regression.choose_hyperparameters(data, Z, iterations=30 if quick else 200,
                                               scale_iterations=60 if quick else 400)
    x, y = data.x_train, data.y_train
    df, scale = float(hypers["df"]), float(hypers["scale"])
    const = gammaln((df + 1) / 2) - gammaln(df / 2) - 0.5 * math.log(math.pi * df) - math.log(scale)
    yj = jnp.asarray(y.numpy())

    def log_lik(f: Any) -> Any:
        r = yj - f[0]
        return jnp.sum(const - (df + 1) / 2 * jnp.log1p(r * r / (df * scale**2)))

    likelihood = StudentTLikelihood(df=df, scale=scale, learn_scale=False)
    return Problem("boston", f"Boston, Student-t (ν={df:g}, σ={scale:.3f})", x, y, regression.gp_prior(hypers),
                   likelihood, log_lik, hypers, f"MASS Boston training split ({data.split}): {x.shape[0]} points, "
                   f"{x.shape[1]} features; nu = {df:g}, sigma = {scale:.4f} fixed (regression.py's procedure)")


#: mcycle's fixed hyper-parameters (standardised times and accelerations): f and g GPs, max precision xi
MCYCLE_HYPERS = {"means": [0.0, 0.0], "outputscales": [1.0, 4.0], "lengthscales": [0.25, 0.5], "xi": 50.0}


def mcycle_problem(seed: int, quick: bool) -> Problem:
    import jax.numpy as jnp
    from jax.nn import log_sigmoid

    frame = load_rdataset("MASS", "mcycle")
    t, a = (torch.tensor(frame[c].to_numpy(), dtype=torch.float64) for c in ("times", "accel"))
    if quick:
        t, a = t[::3], a[::3]
    x, y = ((t - t.mean()) / t.std()).unsqueeze(-1), (a - a.mean()) / a.std()
    h = MCYCLE_HYPERS
    prior = BatchPrior(h["means"], h["outputscales"], h["lengthscales"])
    likelihood = HeteroscedasticGaussianLikelihood(max_precision=h["xi"], learn_max_precision=False)
    yj, log_xi = jnp.asarray(y.numpy()), math.log(h["xi"])

    def log_lik(f: Any) -> Any:
        log_prec = log_xi + log_sigmoid(f[1])
        return jnp.sum(0.5 * (log_prec - math.log(2 * math.pi)) - 0.5 * jnp.exp(log_prec) * (yj - f[0]) ** 2)

    return Problem("mcycle", "mcycle, heteroscedastic Gaussian (2 GPs)", x, y, prior, likelihood, log_lik,
                   {**h, "procedure": "fixed values on standardised data (declared in MCYCLE_HYPERS)"},
                   f"MASS mcycle: {x.shape[0]} points, standardised times and accelerations; y ~ N(f, 1/(xi sigma(g)))")


#: vehicle's fixed hyper-parameters (standardised features): per class mean 0, outputscale 4, lengthscale sqrt(D)
VEHICLE_POINTS = 200


def vehicle_problem(seed: int, quick: bool) -> Problem:
    import jax.numpy as jnp
    from jax.nn import log_sigmoid
    from jax.scipy.special import logsumexp

    data = load_keel("vehicle", test_fraction=0.2, seed=seed, max_train=60 if quick else VEHICLE_POINTS)
    x, y = data.x_train, data.y_train
    K = int(data.y_train.max()) + 1
    ell = math.sqrt(x.shape[-1])
    prior = BatchPrior([0.0] * K, [4.0] * K, [ell] * K)
    likelihood = LogisticSoftmaxLikelihood(num_classes=K)
    onehot = jnp.asarray(np.eye(K)[y.long().numpy()].T)  # (K, N)

    def log_lik(f: Any) -> Any:
        logits = log_sigmoid(f)
        return jnp.sum(jnp.sum(onehot * logits, 0) - logsumexp(logits, 0))

    return Problem("vehicle", f"vehicle, logistic-softmax ({K} classes)", x, y, prior, likelihood, log_lik,
                   {"means": 0.0, "outputscales": 4.0, "lengthscale": ell, "procedure": "fixed: outputscale 4, "
                    "isotropic lengthscale sqrt(D), mean 0 for every class (declared)"},
                   f"KEEL vehicle training split (seed {seed}), first {x.shape[0]} points, {x.shape[1]} standardised "
                   f"features, {K} classes")


BUILDERS = {"heart": heart_problem, "boston": boston_problem, "mcycle": mcycle_problem, "vehicle": vehicle_problem}


def check_jax_log_lik(problem: Problem, mu: np.ndarray, L: np.ndarray, seed: int = 0) -> float:
    """|JAX log-likelihood - ``likelihood.log_prob_at``| at a prior draw of f; raises if it is not ~0 (every sampler
    must target the same posterior)."""
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    f = mu + np.einsum("tij,tj->ti", L, rng.standard_normal(mu.shape))
    f_t = torch.as_tensor(f)
    arg = f_t[0] if problem.num_latents == 1 else f_t.T
    ref = float(problem.likelihood.log_prob_at(problem.y, arg).sum())
    diff = abs(float(problem.jax_log_lik(jnp.asarray(f))) - ref)
    if diff > 1e-7 * max(1.0, abs(ref)):
        raise RuntimeError(f"{problem.key}: JAX log-likelihood {diff:g} away from log_prob_at")
    return diff
