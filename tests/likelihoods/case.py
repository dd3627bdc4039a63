"""The :class:`LikelihoodCase` record of the shared protocol suite and helpers for writing cases.

See ``registry.py`` for how a likelihood registers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from gpytorch_augment._numerics import gauss_hermite, log_cosh
from gpytorch_augment.distributions import PolyaGamma
from gpytorch_augment.distributions.auxiliary import AuxiliaryDistribution
from gpytorch_augment.likelihoods import AugmentedLikelihood

AuxDict = dict[str, Tensor]


def _no_kwargs(shape: torch.Size, generator: torch.Generator) -> dict[str, Tensor]:
    return {}


def gauss_hermite_expected_log_lik(likelihood: AugmentedLikelihood, y: Tensor, m: Tensor, s: Tensor) -> Tensor:
    r""":math:`E_{\mathcal N(m, s)} \log p(y\mid f)` per datum by 100-node Gauss--Hermite (one latent)."""
    if likelihood.num_latents != 1:
        raise NotImplementedError("1-D Gauss--Hermite is for one latent: give the case its own expected_log_lik")
    nodes, weights = gauss_hermite(m, s, 100)
    return (weights * likelihood.log_prob_at(y, nodes)).sum(0)


def log_pg_laplace(b: Tensor, t: Tensor) -> Tensor:
    r""":math:`\log E_{\mathrm{PG}(b,0)} e^{-t\omega} = -b\log\cosh\sqrt{t/2}` (``augmentations.md`` §2.3),
    for ``t >= 0``."""
    return -b * log_cosh((t.clamp_min(0) / 2).sqrt())


@dataclass(frozen=True)
class LikelihoodCase:
    """One likelihood registered in the shared protocol suite (see the module docstring)."""

    name: str
    make: Callable[[], AugmentedLikelihood]
    sample_targets: Callable[..., Tensor]
    marginalise: Callable[[AugmentedLikelihood, Tensor, Tensor], Tensor]
    q_aux_distribution: Callable[[AugmentedLikelihood, Tensor, AuxDict], AuxiliaryDistribution]
    num_latents: int = 1
    make_kwargs: Callable[[torch.Size, torch.Generator], dict[str, Tensor]] = _no_kwargs
    expected_log_lik: Callable[[AugmentedLikelihood, Tensor, Tensor, Tensor], Tensor] = gauss_hermite_expected_log_lik
    #: the test latents satisfy |f| <= f_bound (§12: 4)
    f_bound: float = 4.0
    #: §12 (a): |log C^(k) - log p| <= consistency_rtol * (1 + |log p|)
    consistency_rtol: float = 1e-9
    #: §12 (c): 1e-9 for exact sums/closed forms, 1e-7 for adaptive quadrature
    marginalise_atol: float = 1e-9
    #: §12 (d): number of Monte-Carlo draws of (f, Ω)
    mc_samples: int = 100_000
    #: §12 (d): of those, how many enter the Monte-Carlo KL (log q - log p needs the auxiliary log-densities;
    #: the Pólya-Gamma series makes them the dominant cost). The 5-SE tolerance is unchanged.
    mc_kl_samples: int = 20_000
    #: §12 (h): number of full-batch CAVI sweeps before the convergence check (50; more where a closed-form
    #: hyper-parameter update trades off against the level of f and coordinate ascent is slow, e.g. Poisson ξ)
    cavi_sweeps: int = 50
    #: identity letter of §12 -> reason it does not apply
    skip: Mapping[str, str] = field(default_factory=dict)
    #: free-form extras a later likelihood may need in its hooks
    extras: Mapping[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:  # short ids in pytest output
        return self.name


def marginalise_single_pg(likelihood: AugmentedLikelihood, y: Tensor, f: Tensor) -> Tensor:
    r""":math:`\log\int C e^{hf-\frac12\lambda f^2}\,\mathrm{PG}(\omega\mid b, 0)\,d\omega` for a tilt with
    :math:`\lambda` linear in the Pólya-Gamma variable ``omega`` (Bernoulli, binomial), which is the only auxiliary.

    :math:`\log C + hf` is the log-tilt at :math:`\omega=0`; :math:`t=\frac12\lambda(1)f^2` is the drop of the
    log-tilt from :math:`\omega=0` to :math:`\omega=1`; the prior's :math:`b` comes from ``aux_prior``. With one
    ``omega`` per latent (prior ``Independent(PolyaGamma(b, 0), 1)`` with ``b`` of shape ``(N, T)``) the latents
    are integrated one at a time.
    """
    prior = likelihood.aux_prior(y).factors["omega"]
    if isinstance(prior, torch.distributions.Independent):  # one omega per latent, summed into one value per datum
        prior = prior.base_dist
    assert isinstance(prior, PolyaGamma) and bool((prior.c == 0).all()), "expected a PG(b, 0) prior"
    if likelihood.num_latents == 1:
        at_zero = likelihood.log_tilt(y, {"omega": torch.zeros_like(f)}, f)
        t = at_zero - likelihood.log_tilt(y, {"omega": torch.ones_like(f)}, f)
        return at_zero + log_pg_laplace(prior.b, t)
    zero = torch.zeros_like(f)  # (..., N, T): one omega per latent
    at_zero = likelihood.log_tilt(y, {"omega": zero}, f)
    out = at_zero
    for j in range(likelihood.num_latents):
        unit = zero.clone()
        unit[..., j] = 1.0
        t = at_zero - likelihood.log_tilt(y, {"omega": unit}, f)
        out = out + log_pg_laplace(prior.b[..., j], t)
    return out
