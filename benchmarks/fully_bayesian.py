r"""Fully Bayesian non-Gaussian GPs (issue 40, item 5): our blocked Gibbs sampler with sampled hyper-parameters
(``GibbsSampler(..., sample_hyperparameters=True)``: :math:`\Omega \mid f`, then :math:`\theta \mid \Omega` with
:math:`f` integrated out by HMC, then :math:`f \mid \theta, \Omega`) against NumPyro's NUTS on
:math:`(\theta, \text{whitened } f)` with the same priors, on a binary, a Student-t, a count and a multi-class problem
at the sizes of :data:`SIZES`. Metrics: the worst of bulk / tail / sd ESS over :math:`\theta` and :math:`f` per second,
end to end and steady state, :math:`\hat R`, and the held-out NLL of the posterior predictive against the one-call
fit's MAP model. One thread each (``XLA_FLAGS``), float64. What is measured and how to read
``results/fully_bayesian.{json,md}``: ``benchmarks/README.md``.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import _report  # noqa: E402
import gpytorch  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from gpytorch_augment import (  # noqa: E402
    CAVI,
    BernoulliLogitLikelihood,
    CAVIVariationalStrategy,
    GibbsSampler,
    GPPrior,
    HMCSampler,
    LogisticSoftmaxLikelihood,
    PoissonLogitLikelihood,
    StudentTLikelihood,
)
from gpytorch_augment.inference.default_priors import LENGTHSCALE_LOG_SD, OUTPUTSCALE_GAMMA, input_width  # noqa: E402
from gpytorch_augment.inference.diagnostics import rank_normalized_rhat  # noqa: E402

#: the problems (data as ``hyperparameters.py`` loads them): binary, Student-t regression, counts, multi-class
PROBLEMS = {"pima": "binary", "boston": "student_t", "quakes": "counts", "vehicle": "multiclass"}
#: the declared grid of training-set sizes (a problem runs the sizes its training split holds); run in this order,
#: every problem at one size before the next size
SIZES = (100, 300, 1000, 2000)
QUICK_SIZES = (40,)
#: chains of every sampler
CHAINS = 4
#: warm-up and draws per chain (end to end: warm-up + draws; steady state: ``draws`` more from the last state)
FULL = {"warmup": 200, "draws": 500, "predict_draws": 200}
QUICK = {"warmup": 30, "draws": 50, "predict_draws": 40}
#: seed of the pilot runs (never a reported seed)
PILOT_SEED = 101
#: jitter added to every prior covariance (all samplers)
JITTER = 1e-6
#: Student-t degrees of freedom (``hyperparameters.py``'s)
DF = 4.0
#: the issue's targets: ours ÷ NumPyro's best, worst-ESS/s, end to end and steady state; NLL no worse than MAP at
#: N <= NLL_TARGET_MAX_N (read with the tolerance NLL_TOL)
TARGET_RATIO = 5.0
NLL_TARGET_MAX_N = 300
NLL_TOL = 0.0
#: quadrature nodes (one latent) and Monte Carlo draws (several) of the held-out predictive
GH_NODES = 32
MC_DRAWS = 256
LENGTHSCALE = "covar_module.base_kernel.lengthscale"
OUTPUTSCALE = "covar_module.outputscale"


# ---------------------------------------------------------------------------------------------------- problems
@dataclass
class Problem:
    key: str
    kind: str
    x: Tensor
    y: Tensor
    xt: Tensor
    yt: Tensor
    K: int  # classes (1 otherwise)
    T: int  # latents


def load_problem(key: str, n: int, seed: int) -> Problem:
    """Split ``seed`` of ``key`` as ``hyperparameters.py`` loads it, the first ``n`` training points (inputs
    standardised on them); ``ValueError`` when the training split holds fewer."""
    import hyperparameters as hp

    kind = PROBLEMS[key]
    data = hp.load(key, {"kind": kind, "max_train": n}, seed, False)
    if data["y"].shape[-1] < n:
        raise ValueError(f"{key}: the training split holds {data['y'].shape[-1]} < {n} points")
    return Problem(key, kind, data["x"], data["y"], data["xt"], data["yt"], data["K"],
                   data["K"] if kind == "multiclass" else 1)  # fmt: skip


def map_fit(p: Problem) -> dict[str, Any]:
    """The one-call fit (``CAVI(...).fit(x, y, learn_hyperparameters=True)``, every default: MAP under the default
    priors) of the sparse GP with Z = all training inputs (full rank), as ``hyperparameters.py`` builds it."""
    import hyperparameters as hp

    lik = hp.likelihood_for(p.kind, "ours", p.K)
    model = hp.Model(p.x, p.T, gpytorch.variational.CholeskyVariationalDistribution, CAVIVariationalStrategy).double()
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = CAVI(model, lik, num_data=p.y.shape[-1]).fit(p.x, p.y, learn_hyperparameters=True)
    wall = time.perf_counter() - t0
    model.eval()
    with torch.no_grad():
        q = model(p.xt)
        m, v = q.mean, q.variance
    m, v = (m.reshape(1, 1, -1), v.reshape(1, 1, -1)) if p.T == 1 else (m.T.unsqueeze(0), v.T.unsqueeze(0))
    constants = {}
    if p.kind == "student_t":
        constants["scale"] = float(lik.scale.detach().reshape(-1)[0])
    if p.kind == "counts":
        constants["rate_scale"] = float(lik.rate_scale.detach().reshape(-1)[0])
    mean = model.mean_module.constant.detach().reshape(-1).clone()
    return {"time": wall, "converged": bool(result.converged), "mean": mean.tolist(), "constants": constants,
            "lengthscale": model.covar_module.base_kernel.lengthscale.detach().reshape(p.T, -1).tolist(),
            "outputscale": model.covar_module.outputscale.detach().reshape(-1).tolist(),
            "nll": heldout_nll(p, likelihood(p, constants), m, v)}  # fmt: skip


def likelihood(p: Problem, constants: dict[str, float]) -> Any:
    """The sampled model's likelihood: its constants fixed at the MAP fit's values (both samplers)."""
    if p.kind == "binary":
        return BernoulliLogitLikelihood()
    if p.kind == "student_t":
        return StudentTLikelihood(df=DF, scale=constants["scale"], learn_scale=False).double()
    if p.kind == "counts":
        return PoissonLogitLikelihood(rate_scale=constants["rate_scale"]).double()
    return LogisticSoftmaxLikelihood(num_classes=p.K).double()


def prior_locations(p: Problem) -> np.ndarray:
    r"""The default lengthscale prior's location per input, :math:`\sqrt2 + \frac12\ln D + \ln w_d`
    (``default_priors``), (D,)."""
    D = p.x.shape[-1]
    return (math.sqrt(2.0) + 0.5 * math.log(D) + torch.log(input_width(p.x))).numpy()


def gp_prior(p: Problem, mean: list[float], start: dict[str, np.ndarray]) -> GPPrior:
    """ScaleKernel(RBF ARD) per latent, the constant mean fixed at ``mean`` (not sampled), the kernel's
    hyper-parameters at ``start`` and sampled under the default priors (none registered)."""
    batch = torch.Size([p.T]) if p.T > 1 else torch.Size()
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=p.x.shape[-1], batch_shape=batch),
                                          batch_shape=batch)  # fmt: skip
    prior = GPPrior(gpytorch.means.ConstantMean(batch_shape=batch), kernel).double()
    with torch.no_grad():
        constant, ls = prior.mean_module.constant, kernel.base_kernel.lengthscale
        constant.copy_(torch.tensor(mean, dtype=torch.float64).reshape(constant.shape))
        kernel.base_kernel.lengthscale = torch.as_tensor(start["lengthscale"]).reshape(ls.shape)
        kernel.outputscale = torch.as_tensor(start["outputscale"]).reshape(kernel.outputscale.shape)
    prior.mean_module.constant.requires_grad_(False)
    return prior


def start_point(p: Problem) -> dict[str, np.ndarray]:
    """Every chain's starting hyper-parameters (both samplers): the lengthscale prior's mode (the one-call fit's
    data-aware start) and outputscale 1."""
    loc = prior_locations(p)
    return {"lengthscale": np.tile(np.exp(loc - LENGTHSCALE_LOG_SD**2), (p.T, 1)), "outputscale": np.ones(p.T)}


def jax_log_lik(p: Problem, constants: dict[str, float]) -> Any:
    """The likelihood's log density of latents ``f`` (T, N) in JAX (the same as ``log_prob_at``, checked)."""
    import jax.numpy as jnp
    from jax.nn import log_sigmoid
    from jax.scipy.special import gammaln, logsumexp

    y = p.y.numpy()
    if p.kind == "binary":
        sign = jnp.asarray(2 * y - 1)
        return lambda f: -jnp.sum(jnp.logaddexp(0.0, -sign * f[0]))
    if p.kind == "student_t":
        s = constants["scale"]
        const = float(gammaln((DF + 1) / 2) - gammaln(DF / 2)) - 0.5 * math.log(math.pi * DF) - math.log(s)
        yj = jnp.asarray(y)
        return lambda f: jnp.sum(const - (DF + 1) / 2 * jnp.log1p((yj - f[0]) ** 2 / (DF * s**2)))
    if p.kind == "counts":
        xi, yj = constants["rate_scale"], jnp.asarray(y)
        lg = jnp.asarray(gammaln(y + 1.0))

        def counts(f: Any) -> Any:
            return jnp.sum(yj * (math.log(xi) + log_sigmoid(f[0])) - xi * jnp.exp(log_sigmoid(f[0])) - lg)

        return counts
    onehot = jnp.asarray(np.eye(p.K)[y.astype(int)].T)

    def softmax(f: Any) -> Any:
        logits = log_sigmoid(f)
        return jnp.sum(jnp.sum(onehot * logits, 0) - logsumexp(logits, 0))

    return softmax


def check_log_lik(p: Problem, lik: Any, log_lik: Any) -> float:
    import jax.numpy as jnp

    f = np.random.default_rng(0).standard_normal((p.T, p.y.shape[-1]))
    arg = torch.as_tensor(f[0]) if p.T == 1 else torch.as_tensor(f.T)
    ref = float(lik.log_prob_at(p.y, arg).sum().detach())
    diff = abs(float(log_lik(jnp.asarray(f))) - ref)
    if diff > 1e-7 * max(1.0, abs(ref)):
        raise RuntimeError(f"{p.key}: JAX log-likelihood {diff:g} away from log_prob_at")
    return diff


# ---------------------------------------------------------------------------------------------------- prediction
def rbf(x1: Tensor, x2: Tensor, ls: Tensor, os_: Tensor) -> Tensor:
    """``os * exp(-|x1 - x2|^2 / (2 ls^2))`` batched over (B, T): ls (B, T, D), os (B, T) -> (B, T, n1, n2)."""
    a, b = x1 / ls.unsqueeze(-2), x2 / ls.unsqueeze(-2)
    d2 = (a.unsqueeze(-2) - b.unsqueeze(-3)).pow(2).sum(-1)
    return os_[..., None, None] * torch.exp(-0.5 * d2)


def conditionals(p: Problem, mean: Tensor, ls: Tensor, os_: Tensor, f: Tensor) -> tuple[Tensor, Tensor]:
    """Per draw: the GP conditional at the test inputs given f at the training inputs, means and variances
    (S, T, n*); ``ls`` (S, T, D), ``os_`` (S, T), ``f`` (S, T, N), ``mean`` (T,)."""
    ms, vs = [], []
    for s in range(0, f.shape[0], 50):
        sl = slice(s, s + 50)
        K = rbf(p.x, p.x, ls[sl], os_[sl]) + JITTER * torch.eye(p.x.shape[0], dtype=torch.float64)
        L = torch.linalg.cholesky(K)
        Ks = rbf(p.x, p.xt, ls[sl], os_[sl])
        W = torch.linalg.solve_triangular(L, Ks, upper=False)
        a = torch.cholesky_solve((f[sl] - mean[:, None]).unsqueeze(-1), L)
        ms.append(mean[:, None] + (Ks.mT @ a).squeeze(-1))
        vs.append((os_[sl][..., None] - W.pow(2).sum(-2)).clamp_min(1e-12))
    return torch.cat(ms), torch.cat(vs)


def heldout_nll(p: Problem, lik: Any, m: Tensor, v: Tensor) -> float:
    r""":math:`-\frac1{n_*}\sum_i \log \frac1S \sum_s \int p(y_i \mid f)\, \mathcal N(f \mid m_{si}, v_{si})\, df`:
    Gauss-Hermite (one latent) or fixed Monte Carlo draws (several) per draw ``s``; ``m``, ``v`` (S, T, n*). The
    same code for our draws, NumPyro's and the MAP model's predictive (S = 1)."""
    y, S = p.yt, m.shape[0]
    with torch.no_grad():
        if p.T == 1:
            t, w = np.polynomial.hermite.hermgauss(GH_NODES)
            t, logw = torch.as_tensor(t), torch.as_tensor(np.log(w / math.sqrt(math.pi)))
            f = m[:, 0] + math.sqrt(2.0) * v[:, 0].sqrt() * t[:, None, None]  # (Q, S, n*)
            lp = torch.logsumexp(lik.log_prob_at(y, f) + logw[:, None, None], 0)  # (S, n*)
        else:
            eps = torch.randn((MC_DRAWS, *m.shape), generator=torch.Generator().manual_seed(1), dtype=m.dtype)
            lp = []
            for s in range(S):
                f = (m[s] + v[s].sqrt() * eps[:, s]).mT  # (E, n*, T)
                lp.append(torch.logsumexp(lik.log_prob_at(y, f), 0) - math.log(MC_DRAWS))
            lp = torch.stack(lp)
        return float(-(torch.logsumexp(lp, 0) - math.log(S)).mean())


def draws_nll(p: Problem, lik: Any, mean: list[float], theta: np.ndarray, f: np.ndarray, count: int) -> float:
    """Held-out NLL of the posterior predictive from ``count`` draws spread evenly over the chains' draws (theta
    (C, S, T*D + T) constrained: lengthscales then outputscales; f (C, S, T*N))."""
    D, T = p.x.shape[-1], p.T
    th, ff = theta.reshape(-1, theta.shape[-1]), f.reshape(-1, f.shape[-1])
    idx = np.linspace(0, th.shape[0] - 1, min(count, th.shape[0])).round().astype(int)
    th, ff = torch.as_tensor(th[idx]), torch.as_tensor(ff[idx])
    ls, os_ = th[:, : T * D].reshape(-1, T, D), th[:, T * D :].reshape(-1, T)
    m, v = conditionals(p, torch.tensor(mean, dtype=torch.float64).reshape(T), ls, os_, ff.reshape(-1, T, p.x.shape[0]))
    return heldout_nll(p, lik, m, v)


# ---------------------------------------------------------------------------------------------------- samplers
@dataclass
class Run:
    """Draws (chains, draws, coordinates) of theta (constrained: T*D lengthscales, T outputscales) and f (T*N),
    end to end and steady state, with the wall seconds of each piece."""

    theta_e2e: np.ndarray
    f_e2e: np.ndarray
    e2e_wall: float
    theta_steady: np.ndarray
    f_steady: np.ndarray
    steady_wall: float
    extra: dict[str, Any]


def _ours_arrays(samples: Any, T: int) -> tuple[np.ndarray, np.ndarray]:
    C, S = samples.f.shape[:2]
    ls = samples.hyperparameters[LENGTHSCALE].detach().numpy().reshape(C, S, -1)
    os_ = samples.hyperparameters[OUTPUTSCALE].detach().numpy().reshape(C, S, -1)
    f = samples.f.detach().numpy().reshape(C, S, -1)  # (C, S, T, N) stored: latent-major, as NumPyro's
    return np.concatenate([ls, os_], -1), f


def run_ours(p: Problem, lik: Any, mean: list[float], warmup: int, draws: int, seed: int,
             surrogate: bool | str = False, latent_moves: int = 0, joint: bool = False) -> Run:  # fmt: skip
    """``GibbsSampler(..., sample_hyperparameters=True)``, 4 chains (``surrogate``: with the surrogate-data move;
    ``latent_moves``: with that many HMC moves of the whitened latents per transition; ``joint``:
    ``HMCSampler(..., sample_hyperparameters=True)``, HMC on θ and the whitened latents jointly, instead);
    the end-to-end clock includes building the sampler."""
    start = start_point(p)
    t0 = time.perf_counter()
    if joint:
        sampler = HMCSampler(gp_prior(p, mean, start), lik, p.x, p.y, jitter=JITTER, sample_hyperparameters=True)
    else:
        sampler = GibbsSampler(gp_prior(p, mean, start), lik, p.x, p.y, jitter=JITTER, sample_hyperparameters=True)
        sampler.kernel.surrogate, sampler.kernel.latent_moves = surrogate, latent_moves
    sampler.kernel.init_spread = 0.0  # the protocol: every chain of both samplers starts at the same θ₀
    first = sampler.sample(draws, warmup=warmup, num_chains=CHAINS, seed=seed, progress=False)
    e2e = time.perf_counter() - t0
    t1 = time.perf_counter()
    second = sampler.sample(draws, warmup=0, num_chains=CHAINS, init=first.last_state(), progress=False)
    steady = time.perf_counter() - t1
    kernel = getattr(sampler, "kernel", None)
    extra = {"last_run": dict(getattr(kernel, "last_run", {}) or {})}
    return Run(*_ours_arrays(first, p.T), e2e, *_ours_arrays(second, p.T), steady, extra)


def numpyro_potential(p: Problem, log_lik: Any, mean: list[float]) -> tuple[Any, Any]:
    r"""The potential of NUTS on :math:`z = (\log\ell, \log\sigma^2, v)` (NumPyro's own unconstrained coordinates of
    the model ``ℓ ~ LogNormal(loc, √3)``, ``σ² ~ Gamma(2, 1/4)``, ``v ~ N(0, I)``, ``f = m + chol(σ² k_ℓ + εI) v``,
    with the log-Jacobian of the exponential), and ``to_draws(z) -> (theta, f)``."""
    import jax
    import jax.numpy as jnp
    from jax.scipy.special import gammaln

    T, D, N = p.T, p.x.shape[-1], p.x.shape[0]
    P = T * D + T
    x, loc, mu = jnp.asarray(p.x.numpy()), jnp.asarray(prior_locations(p)), jnp.asarray(np.reshape(mean, (T, 1)))
    a, b = OUTPUTSCALE_GAMMA
    sd = LENGTHSCALE_LOG_SD
    eye = jnp.eye(N)

    def latents(z: Any) -> tuple[Any, Any, Any]:
        log_ls, log_os = z[: T * D].reshape(T, D), z[T * D : P]
        v = z[P:].reshape(T, N)
        xs = x[None] / jnp.exp(log_ls)[:, None, :]  # (T, N, D)
        d2 = jnp.sum((xs[:, :, None, :] - xs[:, None, :, :]) ** 2, -1)
        K = jnp.exp(log_os)[:, None, None] * jnp.exp(-0.5 * d2) + JITTER * eye
        L = jnp.linalg.cholesky(K)
        return log_ls, log_os, mu + jnp.einsum("tij,tj->ti", L, v)

    def potential(z: Any) -> Any:
        log_ls, log_os, f = latents(z)
        v = z[P:]
        lp_ls = jnp.sum(-0.5 * ((log_ls - loc) / sd) ** 2 - math.log(sd * math.sqrt(2 * math.pi)))
        os_ = jnp.exp(log_os)
        lp_os = jnp.sum(a * math.log(b) - gammaln(a) + (a - 1) * log_os - b * os_ + log_os)  # + log-Jacobian
        return -(lp_ls + lp_os - 0.5 * jnp.sum(v * v) + log_lik(f))

    @jax.jit
    def to_draws(zs: Any) -> tuple[Any, Any]:
        def one(z: Any) -> tuple[Any, Any]:
            log_ls, log_os, f = latents(z)
            return jnp.concatenate([jnp.exp(log_ls).reshape(-1), jnp.exp(log_os)]), f.reshape(-1)

        return jax.lax.map(one, zs)

    return potential, to_draws


def numpyro_init(p: Problem, seed: int) -> np.ndarray:
    """Every chain's start: the hyper-parameters of :func:`start_point` (log) and ``v ~ N(0, I)``."""
    s = start_point(p)
    theta = np.concatenate([np.log(s["lengthscale"]).reshape(-1), np.log(s["outputscale"])])
    v = np.random.default_rng(seed).standard_normal((CHAINS, p.T * p.x.shape[0]))
    return np.concatenate([np.tile(theta, (CHAINS, 1)), v], -1)


def run_numpyro(p: Problem, log_lik: Any, mean: list[float], warmup: int, draws: int, seed: int,
                chain_method: str) -> Run:  # fmt: skip
    """NumPyro's NUTS with its defaults (diagonal mass adapted in windows, target acceptance 0.8, tree depth 10),
    ``MCMC.run`` end to end, then ``draws`` more per chain from the adapted state, compiled once (the steady state,
    ``_sampling_peers._numpyro_continue``)."""
    import jax
    from _sampling_peers import _numpyro_continue
    from numpyro.infer import MCMC, NUTS

    potential, to_draws = numpyro_potential(p, log_lik, mean)
    init = numpyro_init(p, seed)
    kernel = NUTS(potential_fn=potential)
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=draws, num_chains=CHAINS, chain_method=chain_method,
                progress_bar=False)  # fmt: skip
    t0 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), init_params=init, extra_fields=("num_steps", "diverging"))
    z = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
    e2e = time.perf_counter() - t0
    fields = mcmc.get_extra_fields(group_by_chain=True)
    vectorized = chain_method == "vectorized"
    if not vectorized:  # a fresh, un-vmapped kernel (see _sampling_peers.run_numpyro)
        kernel = NUTS(potential_fn=potential)
        kernel.init(jax.random.PRNGKey(seed), warmup, init_params=init[0])
    (z2, steps, div), steady = _numpyro_continue(kernel, mcmc.last_state, CHAINS, draws, vectorized)

    def split(zs: Any) -> tuple[np.ndarray, np.ndarray]:
        zs = np.asarray(zs)
        th, f = to_draws(zs.reshape(-1, zs.shape[-1]))
        return np.asarray(th).reshape(CHAINS, draws, -1), np.asarray(f).reshape(CHAINS, draws, -1)

    extra = {"chain_method": chain_method,
             "mean_leapfrog_steps_e2e": float(np.mean(np.asarray(fields["num_steps"]))),
             "mean_leapfrog_steps": float(np.mean(np.asarray(steps))),
             "divergences_e2e": int(np.sum(np.asarray(fields["diverging"]))),
             "divergences": int(np.sum(np.asarray(div)))}  # fmt: skip
    return Run(*split(z), e2e, *split(z2), steady, extra)


# ---------------------------------------------------------------------------------------------------- statistics
def ess_block(theta: np.ndarray, f: np.ndarray, wall: float) -> dict[str, Any]:
    """ArviZ bulk / tail / sd ESS per coordinate of theta and f (chains, draws, ·): the worst (min over the three
    and over the coordinates) of each and of both, per second; max R̂ of each."""
    import arviz as az

    out: dict[str, Any] = {"wall": wall}
    for name, a in (("theta", theta), ("f", f)):
        ds = az.convert_to_dataset(a)
        ess = {m: np.asarray(az.ess(ds, method=m)["x"].values) for m in ("bulk", "tail", "sd")}
        worst = np.minimum(np.minimum(ess["bulk"], ess["tail"]), ess["sd"])
        out[f"{name}_ess_worst"] = float(worst.min())
        out[f"{name}_ess_bulk_min"] = float(ess["bulk"].min())
        out[f"{name}_rhat_max"] = float(np.nanmax(rank_normalized_rhat(a)))
        if name == "theta":
            out["theta_ess_worst_each"] = worst.tolist()
    out["ess_worst"] = min(out["theta_ess_worst"], out["f_ess_worst"])
    out["ess_per_s_worst"] = out["ess_worst"] / wall
    out["rhat_max"] = max(out["theta_rhat_max"], out["f_rhat_max"])
    out["ms_per_transition"] = 1e3 * wall / theta.shape[1]
    return out


def summarise(run: Run, p: Problem, lik: Any, mean: list[float], predict_draws: int) -> dict[str, Any]:
    return {"e2e": ess_block(run.theta_e2e, run.f_e2e, run.e2e_wall),
            "steady": ess_block(run.theta_steady, run.f_steady, run.steady_wall),
            "nll": draws_nll(p, lik, mean, run.theta_steady, run.f_steady, predict_draws),
            "theta_mean": run.theta_steady.reshape(-1, run.theta_steady.shape[-1]).mean(0).tolist(),
            "extra": run.extra}  # fmt: skip


def run_case(key: str, n: int, seed: int, cfg: dict[str, int], peers: bool = True,
             surrogate: bool | str = False, latent_moves: int = 0, joint: bool = False) -> dict[str, Any]:  # fmt: skip
    """One problem at one size: the MAP fit, then ours, NumPyro sequential, NumPyro vectorised (interleaved in one
    process, one after the other); ``peers=False``: the MAP fit and ours only (no ratios); ``surrogate``: ours with
    the surrogate-data move too (``ours_surrogate``, after ours; the ratios stay those of ours' default);
    ``latent_moves``: ours with that many latent moves per transition too (``ours_latent``, likewise); ``joint``:
    ``HMCSampler(..., sample_hyperparameters=True)`` too (``ours_joint``, likewise)."""
    p = load_problem(key, n, seed)
    fit = map_fit(p)
    lik = likelihood(p, fit["constants"])
    log_lik = jax_log_lik(p, fit["constants"])
    check = check_log_lik(p, lik, log_lik)
    print(f"{key} N = {n} (D = {p.x.shape[-1]}, T = {p.T}, n* = {p.yt.shape[-1]}): MAP {fit['time']:.1f} s, NLL "
          f"{fit['nll']:.4f}; JAX check {check:.1e}", flush=True)  # fmt: skip
    W, S = cfg["warmup"], cfg["draws"]
    methods = {
        "ours": lambda: run_ours(p, lik, fit["mean"], W, S, seed),
        "ours_surrogate": lambda: run_ours(p, lik, fit["mean"], W, S, seed, surrogate=surrogate or True),
        "ours_latent": lambda: run_ours(p, lik, fit["mean"], W, S, seed, latent_moves=latent_moves),
        "ours_joint": lambda: run_ours(p, lik, fit["mean"], W, S, seed, joint=True),
        "numpyro_sequential": lambda: run_numpyro(p, log_lik, fit["mean"], W, S, seed, "sequential"),
        "numpyro_vectorized": lambda: run_numpyro(p, log_lik, fit["mean"], W, S, seed, "vectorized"),
    }
    if not surrogate:
        del methods["ours_surrogate"]
    if not latent_moves:
        del methods["ours_latent"]
    if not joint:
        del methods["ours_joint"]
    if not peers:
        methods = {k: v for k, v in methods.items() if k.startswith("ours")}
    runs = {}
    for name, fn in methods.items():
        runs[name] = summarise(fn(), p, lik, fit["mean"], cfg["predict_draws"])
        e, s = runs[name]["e2e"], runs[name]["steady"]
        print(f"  {name:>19}: e2e {e['wall']:.1f} s, worst ESS {e['ess_worst']:.0f} (θ {e['theta_ess_worst']:.0f}, "
              f"f {e['f_ess_worst']:.0f}), R̂ {e['rhat_max']:.3f}; steady {s['wall']:.1f} s, worst ESS "
              f"{s['ess_worst']:.0f}; NLL {runs[name]['nll']:.4f}", flush=True)  # fmt: skip
    return {"key": key, "kind": p.kind, "n": n, "warmup": W, "draws": S, "d": int(p.x.shape[-1]), "num_latents": p.T,
            "n_test": int(p.yt.shape[-1]), "seed": seed, "map": fit, "jax_check": check, "runs": runs,
            "ratios": ratios(runs) if peers else None}  # fmt: skip


PEERS = ("numpyro_sequential", "numpyro_vectorized")


def ratios(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Ours ÷ NumPyro's best (of sequential and vectorised, chosen per phase) worst-ESS/s."""
    out = {}
    for phase in ("e2e", "steady"):
        peer = max(PEERS, key=lambda k: runs[k][phase]["ess_per_s_worst"])
        ours, ref = runs["ours"][phase], runs[peer][phase]
        out[phase] = {
            "peer": peer,
            "ratio": ours["ess_per_s_worst"] / ref["ess_per_s_worst"],
            "ess_ratio": ours["ess_worst"] / ref["ess_worst"],
            "wall_ratio": ref["wall"] / ours["wall"],
        }
    return out


# ---------------------------------------------------------------------------------------------------- report
LABELS = {
    "ours": "Gibbs + HMC θ (ours)",
    "ours_surrogate": "Gibbs + HMC θ + surrogate move (ours, surrogate=True or 'warmup': the run's settings)",
    "ours_latent": "Gibbs + HMC θ + latent moves (ours, latent_moves=K: the run's settings)",
    "ours_joint": "HMC on (θ, whitened f) jointly (ours, HMCSampler(sample_hyperparameters=True))",
    "numpyro_sequential": "NumPyro NUTS [sequential]",
    "numpyro_vectorized": "NumPyro NUTS [vectorized]",
}


def verdicts(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for c in cases:
        r, ours = c["ratios"], c["runs"]["ours"]
        nll_gap = ours["nll"] - c["map"]["nll"]
        schedule = f"{c['warmup']} + {c['draws']}" if "warmup" in c else None
        e2e, steady = (r["e2e"]["ratio"], r["steady"]["ratio"]) if r else (None, None)
        out.append({"problem": c["key"], "n": c["n"], "schedule": schedule, "e2e": e2e, "steady": steady,
                    "e2e_met": e2e is not None and e2e >= TARGET_RATIO,
                    "steady_met": steady is not None and steady >= TARGET_RATIO,
                    "nll_ours": ours["nll"], "nll_map": c["map"]["nll"], "nll_gap": nll_gap,
                    "nll_target": c["n"] <= NLL_TARGET_MAX_N, "nll_met": nll_gap <= NLL_TOL,
                    "rhat_ours": max(ours["e2e"]["rhat_max"], ours["steady"]["rhat_max"])})  # fmt: skip
    return out


def _verdict(met: bool, ratio: float | None) -> str:
    if ratio is None:
        return "NumPyro not run"
    return "met" if met else f"missed by {TARGET_RATIO / ratio:.1f}×" if ratio > 0 else "missed"


def report(result: dict[str, Any]) -> tuple[str, dict[str, Any], list[_report.Table]]:
    """Title, settings and tables of a result record (rendered by :func:`_report.write_report`)."""
    cfg, v = result["config"], result["versions"]
    title = "Fully Bayesian GPs: Gibbs with sampled hyper-parameters vs NumPyro NUTS" + (
        " (quick)" if cfg["quick"] else ""
    )
    settings = {
        "command": result.get("command", "python benchmarks/fully_bayesian.py"),
        "versions": f"jax {v['jax']}, numpyro {v['numpyro']}, torch {v['torch']}",
        "sizes declared": ", ".join(str(n) for n in cfg["sizes"]),
        "chains": cfg["chains"],
        "draws": f"warm-up {cfg['warmup']}, then {cfg['draws']} per chain (end to end), then {cfg['draws']} more "
        "(steady state)",
        "held-out predictive": f"{cfg['predict_draws']} steady-state draws spread over the chains; "
        f"Gauss-Hermite ({GH_NODES}) or Monte Carlo ({MC_DRAWS}) over f*",
        "threads, XLA_FLAGS": f"{cfg['threads']}, {cfg['xla_flags']}",
        "worst ESS": "min over θ and f coordinates of min(bulk, tail, sd) ArviZ ESS",
        "model": "ScaleKernel(RBF ARD) per latent; log ℓ_d ~ N(√2 + ½ ln D + ln(√12 s_d), 3), outputscale ~ "
        "Gamma(2, 1/4); constant mean and likelihood constants fixed at the MAP fit's values (both samplers)",
        **{f"not run: {k}": val for k, val in result.get("not_run", {}).items()},
        **{f"failed: {k}": val for k, val in result.get("failures", {}).items()},
        "whole script (s)": result["wall_time_total"],
        **_report.machine_settings(result["machine"]),
    }  # fmt: skip
    vrows = [[x["problem"], x["n"], x.get("schedule"), x["e2e"], _verdict(x["e2e_met"], x["e2e"]), x["steady"],
              _verdict(x["steady_met"], x["steady"]), x["rhat_ours"], x["nll_ours"], x["nll_map"], x["nll_gap"],
              ("met" if x["nll_met"] else "missed") if x["nll_target"] else "(N > 300: no target)"]
             for x in result["verdicts"]]  # fmt: skip
    rrows, erows = [], []
    for c in result["cases"]:
        for phase in ("e2e", "steady") if c["ratios"] else ():
            r = c["ratios"][phase]
            rrows.append([c["key"], c["n"], phase, LABELS[r["peer"]], r["ratio"], r["ess_ratio"], r["wall_ratio"]])
        for i, (name, run) in enumerate(c["runs"].items()):
            e, s = run["e2e"], run["steady"]
            erows.append([c["key"] if i == 0 else "", c["n"] if i == 0 else "", LABELS[name], e["wall"],
                          e["theta_ess_worst"], e["f_ess_worst"], e["ess_per_s_worst"], e["rhat_max"], s["wall"],
                          s["ms_per_transition"], s["theta_ess_worst"], s["f_ess_worst"], s["ess_per_s_worst"],
                          s["rhat_max"], run["nll"]])  # fmt: skip
        erows.append(["", "", "MAP (one-call fit)", c["map"]["time"], None, None, None, None, None, None, None, None,
                      None, None, c["map"]["nll"]])  # fmt: skip
    tables = [
        _report.Table("Targets (ours ÷ NumPyro's best of sequential and vectorised, worst-ESS/s over θ and f; "
                      "held-out NLL, ours vs the MAP model)",
                      ["problem", "N", "warm-up + draws", "end to end", "≥ 5×", "steady state", "≥ 5×", "our max R̂",
                       "NLL ours", "NLL MAP", "ours − MAP", "NLL target (N ≤ 300)"], vrows),
        _report.Table("Ratios (ours ÷ NumPyro's best per phase)",
                      ["problem", "N", "phase", "NumPyro's best", "worst-ESS/s ratio", "worst-ESS ratio",
                       "wall peer ÷ ours"], rrows),
        _report.Table("Every run", ["problem", "N", "sampler", "e2e wall [s]", "e2e worst ESS θ", "e2e worst ESS f",
                                    "e2e worst-ESS/s", "e2e max R̂", "steady wall [s]", "steady ms / transition (4 "
                                    "chains)", "steady worst ESS θ", "steady worst ESS f", "steady worst-ESS/s",
                                    "steady max R̂", "held-out NLL"], erows),
    ]  # fmt: skip
    return title, settings, [t for t in tables if t.rows]


# ---------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.run_arguments(parser, "tiny smoke run (N = 40, short chains)", threads_help="torch threads", caps=False)
    parser.add_argument("--only", choices=tuple(PROBLEMS), nargs="+", default=None)
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="sizes to run (default: SIZES)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up per chain (default: FULL's)")
    parser.add_argument("--draws", type=int, default=None, help="draws per chain and phase (default: FULL's)")
    parser.add_argument("--pilot", action="store_true", help="pilot run: PILOT_SEED, output to $TMPDIR")
    parser.add_argument("--no-peers", action="store_true",
                        help="the MAP fit and ours only (sizes where NumPyro's NUTS does not fit the time available)")
    parser.add_argument("--surrogate", nargs="?", const="on", choices=("on", "warmup"), default=None,
                        help="also run ours with the surrogate-data move (ours_surrogate): in every transition (on, "
                        "the default of the flag) or in warm-up only (warmup)")
    parser.add_argument("--latent-moves", type=int, default=0, metavar="K",
                        help="also run ours with K HMC moves of the whitened latents per transition (ours_latent)")
    parser.add_argument("--joint", action="store_true",
                        help="also run HMCSampler(sample_hyperparameters=True), HMC on θ and v jointly (ours_joint)")
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="only merge the fully_bayesian.json of these directories into one report",
    )
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.merge, common.output_dir(args.output_dir, False))
    if args.seed == PILOT_SEED and not args.pilot:
        parser.error("--seed must differ from PILOT_SEED")
    seed = PILOT_SEED if args.pilot else args.seed
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpyro

    wall = time.perf_counter()
    machine = common.start_run(args.threads, seed)
    cfg = dict(QUICK if args.quick else FULL)
    for name in ("warmup", "draws"):
        if getattr(args, name) is not None:
            cfg[name] = getattr(args, name)
    sizes = tuple(args.sizes) if args.sizes else (QUICK_SIZES if args.quick else SIZES)
    cases, failures, not_run = [], {}, {}
    for n in sizes:
        for key in args.only or list(PROBLEMS):
            try:
                surrogate = {"on": True, "warmup": "warmup"}.get(args.surrogate, False)
                cases.append(run_case(key, n, seed, cfg, peers=not args.no_peers, surrogate=surrogate,
                                      latent_moves=args.latent_moves, joint=args.joint))
                part = common.output_dir(args.output_dir, args.quick or args.pilot) / "fully_bayesian_cases"
                part.mkdir(parents=True, exist_ok=True)  # every finished case at once: a cut run keeps them
                (part / f"{key}_{n}.json").write_text(json.dumps(_report._jsonable(cases[-1])) + "\n")
            except ValueError as err:
                not_run[f"{key} N={n}"] = str(err)
                print(f"{key} N = {n}: not run ({err})", flush=True)
            except Exception as err:  # noqa: BLE001  (one failing case must not lose the others' results)
                failures[f"{key} N={n}"] = repr(err)
                print(f"{key} N = {n}: FAILED {err!r}", flush=True)
    common.close_machine_info(machine)
    result = {
        "benchmark": "fully_bayesian", "issue": "issue 40, item 5",
        "command": "python benchmarks/fully_bayesian.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": {"quick": args.quick, "pilot": args.pilot, "peers": not args.no_peers, "surrogate": args.surrogate,
                   "latent_moves": args.latent_moves, "joint": args.joint,
                   "seed": seed,
                   "pilot_seed": PILOT_SEED, "sizes": list(SIZES if not args.quick else QUICK_SIZES),
                   "sizes_run": list(sizes),
                   "chains": CHAINS, **cfg, "target_ratio": TARGET_RATIO, "nll_target_max_n": NLL_TARGET_MAX_N,
                   "jitter": JITTER, "threads": torch.get_num_threads(), "xla_flags": os.environ.get("XLA_FLAGS")},
        "versions": {"jax": jax.__version__, "numpyro": numpyro.__version__, "torch": torch.__version__},
        "machine": machine, "cases": cases, "failures": failures, "not_run": not_run, "verdicts": verdicts(cases),
        "wall_time_total": time.perf_counter() - wall,
    }  # fmt: skip
    out = common.output_dir(args.output_dir, args.quick or args.pilot)
    _report.write_report(out, "fully_bayesian", result, *report(result))
    return result


def merge(directories: list[Path], out: Path) -> dict[str, Any]:
    """Join the ``fully_bayesian.json`` of several runs (same settings) into one result and report."""
    parts = [json.loads((d / "fully_bayesian.json").read_text()) for d in directories
             if (d / "fully_bayesian.json").exists()]  # fmt: skip
    if not parts:
        raise ValueError("--merge needs at least one finished run (a fully_bayesian.json)")
    result = {k: v for k, v in parts[0].items() if k != "report"}
    order = {k: i for i, k in enumerate(PROBLEMS)}
    cases = {(c["key"], c["n"]): c for part in parts for c in part["cases"]}
    cut = []  # cases of a run stopped before its report (fully_bayesian_cases/)
    for d in directories:
        for path in sorted((d / "fully_bayesian_cases").glob("*.json")):
            c = json.loads(path.read_text())
            if (c["key"], c["n"]) not in cases:
                cases[c["key"], c["n"]] = c
                cut.append(str(path))
    result["cases"] = sorted(cases.values(), key=lambda c: (c["n"], order[c["key"]]))
    result["cases_of_cut_runs"] = cut
    for name in ("failures", "not_run"):
        result[name] = {k: v for part in parts for k, v in part.get(name, {}).items()}
    result["config"]["sizes_run"] = sorted({n for part in parts for n in part["config"]["sizes_run"]})
    result["verdicts"] = verdicts(result["cases"])
    result["wall_time_total"] = max(part["wall_time_total"] for part in parts)
    result["command"] = " ; ".join(part.get("command", "") for part in parts)
    result["merged_from"] = [str(d) for d in directories]
    loads = [part["machine"] for part in parts]
    result["machine"] = {**loads[0], "load_average_start": max(m["load_average_start"] for m in loads),
                         "load_average_end": max(m["load_average_end"] for m in loads)}  # fmt: skip
    _report.write_report(out, "fully_bayesian", result, *report(result))
    return result


if __name__ == "__main__":
    main()
