r"""The registry of likelihoods that the shared protocol suite (``test_protocol.py``) runs against.

Every augmented likelihood registers **once**, here, and inherits every identity test of
``augmentations.md`` §12 (Ω and f full conditionals, deterministic marginalisation, Monte-Carlo checks of
the expectations, stationarity of :math:`q(\Omega)`, the two bounds, monotone CAVI, shapes and dtypes).

How a new likelihood registers
------------------------------
Append one :class:`LikelihoodCase` to :data:`CASES`::

    CASES.append(
        LikelihoodCase(
            name="poisson",
            make=lambda: PoissonLikelihood(scale=3.0).double(),           # fresh, float64
            sample_targets=lambda f, g: torch.poisson(3.0 * torch.sigmoid(f), generator=g),
            marginalise=_marginalise_poisson,                              # no sampling; see below
            q_aux_distribution=lambda lik, y, q: AuxiliaryDistribution(...), # law of q*(Ω) for Monte Carlo
        )
    )

The fields:

* ``make()`` returns a fresh likelihood in float64 (hyper-parameters set to non-default values where the
  likelihood has any, e.g. :math:`\theta\ne1`, non-integer :math:`r`, :math:`\nu\ne1`, :math:`\sigma\ne1`).
* ``sample_targets(f, generator, **kwargs)`` draws :math:`y \sim p(y\mid f)` from the model at the latent
  ``f`` (shape ``(N,)``, or ``(N, T)`` for ``T`` latents), using only ``generator`` for randomness.
* ``make_kwargs(shape, generator)`` (optional) returns the per-datum keyword data the entry points take
  (binomial ``trials``, Poisson ``exposure``…), tensors of the data shape ``(N,)``. They are passed to
  ``sample_targets``, to ``check_targets`` and to every public entry point (``expected_log_prob``,
  ``CAVI.step``, ``AugmentedELBO``…). The pure protocol members receive the canonical targets
  ``likelihood.check_targets(y, **kwargs)`` only.
* ``marginalise(likelihood, y, f)`` returns :math:`\log\int \text{tilt}\cdot p(\Omega\mid y)\,d\Omega`
  **without sampling** (§12 (c)), built from the likelihood's own pieces (``log_tilt``, ``aux_prior``) and an
  analytic integral over Ω: for Pólya-Gamma parts :math:`E_{\mathrm{PG}(b,0)} e^{-t\omega}=\cosh^{-b}\sqrt{t/2}`
  (:func:`log_pg_laplace`), for counts a truncated sum, for continuous auxiliaries adaptive quadrature
  (then set ``marginalise_atol=1e-7``).
* ``q_aux_distribution(likelihood, y, q_aux)`` returns the law of :math:`q^*(\Omega)` for the variational
  parameters ``q_aux`` as an :class:`~gpytorch_augment.distributions.auxiliary.AuxiliaryDistribution` whose
  ``sample()`` returns a dict shaped like the Gibbs draws (§12 (d) Monte Carlo; use an exact sampler).
* ``num_latents`` (``T``), ``f_bound`` (the test latents are drawn with :math:`|f|\le` ``f_bound``),
  tolerances, and ``skip``: a mapping from an identity letter of §12 (``"a"``…``"h"``) to the reason why it
  does not apply to this likelihood (e.g. ``{"b": "f is updated by a collapsed step, see §10.2"}``); use it
  sparingly, a skipped identity is an untested identity.
* ``expected_log_lik(likelihood, y, m, s)`` (optional) is the right-hand side of §12 (f),
  :math:`E_{\mathcal N(m,s)}\log p(y\mid f)` per datum. The default is 100-node Gauss--Hermite on
  ``likelihood.log_prob_at``, valid for one latent; multi-latent likelihoods must supply a product rule or a
  closed form.

Nothing else changes: the tests in ``test_protocol.py`` are parametrised over :data:`CASES`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from gpytorch_augment import BernoulliLogitLikelihood
from gpytorch_augment._numerics import gauss_hermite, log_cosh
from gpytorch_augment.distributions import PolyaGamma
from gpytorch_augment.distributions.auxiliary import AuxiliaryDistribution
from gpytorch_augment.likelihoods import AugmentedLikelihood

AuxDict = dict[str, Tensor]


def _no_kwargs(shape: torch.Size, generator: torch.Generator) -> dict[str, Tensor]:
    return {}


def gauss_hermite_expected_log_lik(likelihood: AugmentedLikelihood, y: Tensor, m: Tensor, s: Tensor) -> Tensor:
    r""":math:`E_{\mathcal N(m, s)} \log p(y\mid f)` per datum by 100-node Gauss--Hermite (one latent)."""
    nodes, weights = gauss_hermite(m, s, 100)
    return (weights * likelihood.log_prob_at(y, nodes)).sum(0)


def log_pg_laplace(b: Tensor, t: Tensor) -> Tensor:
    r""":math:`\log E_{\mathrm{PG}(b,0)} e^{-t\omega} = -b\log\cosh\sqrt{t/2}` (``augmentations.md`` §2.3), ``t >= 0``."""
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
    #: §12 (d): number of Monte-Carlo draws
    mc_samples: int = 100_000
    #: identity letter of §12 -> reason it does not apply
    skip: Mapping[str, str] = field(default_factory=dict)
    #: free-form extras a later likelihood may need in its hooks
    extras: Mapping[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:  # short ids in pytest output
        return self.name


# ---------------------------------------------------------------------------------------------- Bernoulli
def _bernoulli_targets(f: Tensor, generator: torch.Generator, **kwargs: Tensor) -> Tensor:
    return torch.bernoulli(torch.sigmoid(f), generator=generator)


def _marginalise_single_pg(likelihood: AugmentedLikelihood, y: Tensor, f: Tensor) -> Tensor:
    r""":math:`\log\int C e^{hf-\frac12\lambda f^2}\,\mathrm{PG}(\omega\mid b, 0)\,d\omega` for a tilt with
    :math:`\lambda` linear in the single Pólya-Gamma variable ``omega`` (Bernoulli, binomial).

    :math:`\log C + hf` is the log-tilt at :math:`\omega=0`; :math:`t=\frac12\lambda(1)f^2` is the drop of the
    log-tilt from :math:`\omega=0` to :math:`\omega=1`; the prior's :math:`b` comes from ``aux_prior``.
    """
    prior = likelihood.aux_prior(y).factors["omega"]
    assert isinstance(prior, PolyaGamma) and bool((prior.c == 0).all()), "expected a PG(b, 0) prior"
    at_zero = likelihood.log_tilt(y, {"omega": torch.zeros_like(f)}, f)
    t = at_zero - likelihood.log_tilt(y, {"omega": torch.ones_like(f)}, f)
    return at_zero + log_pg_laplace(prior.b, t)


def _bernoulli_q_aux(likelihood: AugmentedLikelihood, y: Tensor, q_aux: AuxDict) -> AuxiliaryDistribution:
    c = q_aux["c"]
    return AuxiliaryDistribution(omega=PolyaGamma(torch.ones_like(c), c))


BERNOULLI = LikelihoodCase(
    name="bernoulli_logit",
    make=lambda: BernoulliLogitLikelihood().double(),
    sample_targets=_bernoulli_targets,
    marginalise=_marginalise_single_pg,
    q_aux_distribution=_bernoulli_q_aux,
)

#: every registered likelihood; ``test_protocol.py`` is parametrised over this list
CASES: list[LikelihoodCase] = [BERNOULLI]
