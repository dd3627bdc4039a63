r"""Registry cases of the robust-regression likelihoods (Laplace, Student-t) for the shared protocol suite.

Both augmentations have one continuous auxiliary :math:`\omega > 0`, so the deterministic marginalisation
(identity (c)) is adaptive quadrature (``scipy.integrate.quad``) of the likelihood's own ``log_tilt`` and
``aux_prior`` over :math:`t = \log\omega`. The Laplace right-hand side of identity (f) is adaptive quadrature too
(Gauss--Hermite is poor at the kink of :math:`|y - f|`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import integrate
from torch import Tensor
from torch.distributions import StudentT

from gpytorch_augment._random import seeded_by
from gpytorch_augment.distributions.auxiliary import AuxiliaryDistribution
from gpytorch_augment.likelihoods import AugmentedLikelihood
from gpytorch_augment.likelihoods.laplace import LaplaceLikelihood
from gpytorch_augment.likelihoods.student_t import StudentTLikelihood
from gpytorch_augment.testing.case import LikelihoodCase, real_targets

AuxDict = dict[str, Tensor]

LAPLACE_SCALE = 0.7
STUDENT_T_DF, STUDENT_T_SCALE = 3.5, 1.7
HEAVY_T_DF, HEAVY_T_SCALE = 0.8, 0.45


def _log_quad(log_integrand, mode: float) -> float:
    r""":math:`\log\int_{\mathbb R} e^{g(t)}\,dt` by adaptive quadrature, split at (and scaled by) the mode."""
    peak = log_integrand(mode)
    total = 0.0
    for a, b in ((-np.inf, mode), (mode, np.inf)):
        integrand = lambda t: math.exp(log_integrand(t) - peak)  # noqa: E731
        total += integrate.quad(integrand, a, b, epsabs=0.0, epsrel=1e-10, limit=400)[0]
    return peak + math.log(total)


def marginalise_omega(likelihood: AugmentedLikelihood, y: Tensor, f: Tensor) -> Tensor:
    r""":math:`\log\int \text{tilt}(\omega)\,p(\omega\mid y)\,d\omega` per datum, by adaptive quadrature in
    :math:`t = \log\omega` (integrand :math:`\text{tilt}\cdot p(\omega\mid y)\cdot\omega`), no sampling."""
    y, f = torch.broadcast_tensors(y, f)
    grid = torch.linspace(-40.0, 40.0, 4001, dtype=f.dtype)
    out = torch.empty_like(f)
    t_min, t_max = math.log(torch.finfo(f.dtype).tiny), math.log(torch.finfo(f.dtype).max)
    with torch.no_grad():
        for index in np.ndindex(*f.shape):
            yi, fi = y[index].reshape(1), f[index].reshape(1)
            prior = likelihood.aux_prior(yi)

            def log_integrand_t(t: Tensor) -> Tensor:
                aux = {"omega": t.exp()}
                return likelihood.log_tilt(yi, aux, fi) + prior.log_prob(aux) + t

            values = torch.nan_to_num(log_integrand_t(grid), nan=-math.inf)
            mode = float(grid[values.argmax()])

            def scalar(t: float) -> float:  # the integrand vanishes where omega under/overflows
                if not t_min < t < t_max:
                    return -math.inf
                value = float(log_integrand_t(torch.tensor([t], dtype=f.dtype)))
                return -math.inf if math.isnan(value) else value

            out[index] = _log_quad(scalar, mode)
    return out


def laplace_expected_log_lik(likelihood: AugmentedLikelihood, y: Tensor, m: Tensor, s: Tensor) -> Tensor:
    r""":math:`E_{\mathcal N(m,s)}\log p(y\mid f)` per datum by adaptive quadrature with a breakpoint at the kink
    of :math:`\log p(y\mid f) = -\log 2\beta - |y-f|/\beta` (independent of the likelihood's closed form)."""
    dtype, beta = m.dtype, likelihood.scale.detach().expand_as(m).to(torch.float64)
    y, m, s = (t.detach().to(torch.float64) for t in torch.broadcast_tensors(y, m, s))
    out = torch.empty_like(m)
    for index in np.ndindex(*m.shape):
        yi, mi, sd, b = float(y[index]), float(m[index]), math.sqrt(float(s[index])), float(beta[index])
        if sd == 0.0:
            out[index] = -math.log(2 * b) - abs(yi - mi) / b
            continue
        integrand = lambda f: (-math.log(2 * b) - abs(yi - f) / b) * math.exp(-0.5 * ((f - mi) / sd) ** 2)  # noqa: E731
        lo, hi = mi - 12 * sd, mi + 12 * sd
        kink = min(max(yi, lo), hi)
        pieces = ((lo, kink), (kink, hi))
        value = sum(
            integrate.quad(integrand, a, c, epsabs=1e-14, epsrel=1e-13, limit=200)[0] for a, c in pieces if c > a
        )
        out[index] = value / (sd * math.sqrt(2 * math.pi))
    return out.to(dtype)


def _laplace_targets(f: Tensor, generator: torch.Generator, **kwargs: Tensor) -> Tensor:
    u = torch.rand(f.shape, generator=generator, dtype=f.dtype) - 0.5
    return f - LAPLACE_SCALE * u.sign() * torch.log1p(-2 * u.abs())


def _student_t_targets(df: float, scale: float):
    def sample(f: Tensor, generator: torch.Generator, **kwargs: Tensor) -> Tensor:
        with seeded_by(generator):
            return StudentT(torch.tensor(df, dtype=f.dtype), f, torch.tensor(scale, dtype=f.dtype)).sample()

    return sample


def _q_aux_distribution(likelihood, y: Tensor, q_aux: AuxDict) -> AuxiliaryDistribution:
    return likelihood.aux_posterior_distribution(y, q_aux)


def _expected_log_omega(likelihood, y: Tensor, q_aux: AuxDict, aux: AuxDict) -> dict[str, tuple[Tensor, Tensor]]:
    r"""identity (d) for the Student-t: :math:`E\log\omega = \psi(\alpha) - \log\delta` against its sample mean."""
    return {"E log omega": (likelihood.expected_log_omega(q_aux), aux["omega"].log())}


LAPLACE = LikelihoodCase(
    name="laplace",
    make=lambda: LaplaceLikelihood(scale=LAPLACE_SCALE).double(),
    sample_targets=_laplace_targets,
    marginalise=marginalise_omega,
    q_aux_distribution=_q_aux_distribution,
    expected_log_lik=laplace_expected_log_lik,
    marginalise_atol=1e-7,
    example_targets=real_targets,
    constants=("scale",),
)

STUDENT_T = LikelihoodCase(
    name="student_t",
    make=lambda: StudentTLikelihood(df=STUDENT_T_DF, scale=STUDENT_T_SCALE).double(),
    sample_targets=_student_t_targets(STUDENT_T_DF, STUDENT_T_SCALE),
    marginalise=marginalise_omega,
    q_aux_distribution=_q_aux_distribution,
    marginalise_atol=1e-7,
    extras={"mc_expectations": _expected_log_omega},
    example_targets=real_targets,
    constants=("scale", "df"),
)

#: heavier than Cauchy tails (nu < 1) and a small scale: the collapsed sigma update and the bounds still hold
STUDENT_T_HEAVY = LikelihoodCase(
    name="student_t_heavy",
    make=lambda: StudentTLikelihood(df=HEAVY_T_DF, scale=HEAVY_T_SCALE).double(),
    sample_targets=_student_t_targets(HEAVY_T_DF, HEAVY_T_SCALE),
    marginalise=marginalise_omega,
    q_aux_distribution=_q_aux_distribution,
    marginalise_atol=1e-7,
    extras={
        "mc_expectations": _expected_log_omega,
        "gpytorch_skip": {
            "_test_marginal": f"it compares predictive means, and with nu = {HEAVY_T_DF} <= 1 the predictive "
            "distribution has none (torch reports NaN for both)"
        },
    },
)

#: this module's cases (the registry collects the ``CASES`` of every ``cases_*.py`` module)
CASES: list[LikelihoodCase] = [LAPLACE, STUDENT_T, STUDENT_T_HEAVY]
