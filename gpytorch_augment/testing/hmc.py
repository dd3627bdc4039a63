r"""Exactness checks of :class:`~gpytorch_augment.HMCSampler` on the tiny model of :mod:`~.geweke` (explicit
prior over :math:`N = 3` points), for any likelihood whose ``log_prob_at`` is differentiable:

* :func:`hmc_geweke_z` -- the Geweke joint-distribution test (successive-conditional simulator, one HMC transition
  per sweep at a fixed step size, against the marginal-conditional reference);
* :func:`hmc_posterior_z` -- a brute-force posterior test: posterior means of :math:`f` and :math:`f^2` from HMC
  (vectorised chains, warm-up adaptation) against self-normalised importance sampling from the prior with
  :math:`4\cdot10^5` draws, :math:`z` = difference / combined standard error (across-chain spread of the chain
  means; the importance sampler's delta-method error);
* :func:`violation_log_prob_and_grad` -- ``log_prob_and_grad`` against autograd of ``log_prob_at``.

Example::

    >>> import torch
    >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
    >>> from gpytorch_augment.testing.hmc import violation_log_prob_and_grad
    >>> from gpytorch_augment.testing import worst
    >>> with torch.random.fork_rng():
    ...     _ = torch.manual_seed(0)
    ...     ratios = violation_log_prob_and_grad(BERNOULLI_CASE)
    >>> worst(ratios) <= 1
    True
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import Tensor

from gpytorch_augment.inference.hmc import HMCSampler
from gpytorch_augment.likelihoods.augmented_likelihood import AugmentedLikelihood
from gpytorch_augment.testing.case import LikelihoodCase
from gpytorch_augment.testing.geweke import NUM_POINTS, ExplicitPrior, geweke_z, tiny_prior

__all__ = ["hmc_geweke_z", "hmc_posterior_z", "violation_log_prob_and_grad"]


def hmc_geweke_z(case: LikelihoodCase, num_chains: int = 1_000, num_sweeps: int = 120, seed: int = 0,
                 sampler_cls: type[HMCSampler] = HMCSampler, **options) -> Tensor:
    """:func:`~gpytorch_augment.testing.geweke_z` with the HMC transition (``sweep``: one trajectory at
    ``initial_step_size``, preconditioner fixed at the first targets) in place of the Gibbs sweep."""
    options = {"initial_step_size": 0.7, **options}
    return geweke_z(case.make(), case.sample_targets, make_kwargs=case.make_kwargs, num_chains=num_chains,
                    num_sweeps=num_sweeps, burn_in=30, seed=seed, num_reference=100_000,
                    sampler_cls=partial(sampler_cls, **options))


def _layout(f: Tensor, T: int) -> Tensor:
    """(..., T, N) latent-major -> the likelihood's layout (..., N) / (..., N, T)."""
    return f[..., 0, :] if T == 1 else f.mT


def hmc_posterior_z(case: LikelihoodCase, num_chains: int = 64, num_samples: int = 250, warmup: int = 150,
                    num_importance: int = 400_000, seed: int = 0, likelihood: AugmentedLikelihood | None = None,
                    **options) -> Tensor:
    """z-scores of HMC's posterior means of :math:`f_{ti}` and :math:`f_{ti}^2` against importance sampling.

    :param likelihood: the likelihood HMC samples (default ``case.make()``); the reference always uses
        ``case.make()``, so a wrong likelihood here must fail.
    """
    reference = case.make()
    T = reference.num_latents
    mu, K = (t.double() for t in tiny_prior(T, seed=seed))
    mu, K = mu.reshape(T, NUM_POINTS), K.reshape(T, NUM_POINTS, NUM_POINTS)
    g = torch.Generator().manual_seed(seed)
    root = torch.linalg.cholesky(K + 1e-6 * torch.eye(NUM_POINTS, dtype=K.dtype))
    kwargs = case.make_kwargs(torch.Size([NUM_POINTS]), g)
    f0 = mu + (root @ torch.randn(T, NUM_POINTS, 1, generator=g, dtype=K.dtype)).squeeze(-1)
    y = case.sample_targets(_layout(f0, T), g, **kwargs)
    x = torch.arange(NUM_POINTS, dtype=torch.float64).unsqueeze(-1)
    model = ExplicitPrior(mu if T > 1 else mu[0], K if T > 1 else K[0])
    sampler = HMCSampler(model, likelihood or case.make(), x, y, jitter=1e-6, **options, **kwargs)
    f = sampler.sample(num_samples, warmup=warmup, num_chains=num_chains, seed=seed, progress=False).f
    f = f.reshape(num_chains, num_samples, -1)  # latent-major (T, N) flattened
    tests = torch.cat([f, f * f], -1).mean(1)  # per-chain means (C, 2 T N)
    hmc_mean, hmc_se = tests.mean(0), tests.std(0) / math.sqrt(num_chains)

    fi = mu + (root @ torch.randn(num_importance, T, NUM_POINTS, 1, generator=g, dtype=K.dtype)).squeeze(-1)
    logw = reference.log_prob_at(sampler.target.y, _layout(fi, T)).reshape(num_importance, -1).sum(-1)
    w = torch.softmax(logw, 0).unsqueeze(-1)
    fi = fi.reshape(num_importance, -1)
    h = torch.cat([fi, fi * fi], -1)
    is_mean = (w * h).sum(0)
    is_se = ((w * w) * (h - is_mean) ** 2).sum(0).sqrt()
    return (hmc_mean - is_mean) / (hmc_se**2 + is_se**2).sqrt()


def violation_log_prob_and_grad(case: LikelihoodCase, seed: int = 0, atol: float = 1e-10) -> dict[str, float]:
    """``{"value": ..., "grad": ..., "grad_only": ...}``: max |closed form - autograd| / ``atol`` of
    ``log_prob_and_grad`` at random latents (float64), and ``grad_only`` 0 where ``log_prob_grad`` returns its
    gradient to the bit (else infinite); each must be ``<= 1``."""
    likelihood = case.make()
    T = likelihood.num_latents
    g = torch.Generator().manual_seed(seed)
    f = 1.5 * torch.randn((4, 9) if T == 1 else (4, 9, T), generator=g, dtype=torch.float64)
    kwargs = case.make_kwargs(torch.Size([9]), g)
    y = likelihood.check_targets(case.sample_targets(f[0], g, **kwargs), **kwargs)
    value, grad = likelihood.log_prob_and_grad(y, f)
    ref_value, ref_grad = AugmentedLikelihood.log_prob_and_grad(likelihood, y, f)
    grad_only = likelihood.log_prob_grad(y, f)
    scale = 1.0 + float(ref_value.abs().max())
    return {"value": float((value - ref_value).abs().max()) / (atol * scale),
            "grad": float((grad - ref_grad).abs().max()) / (atol * scale),
            "grad_only": 0.0 if torch.equal(grad_only, grad) else math.inf}
