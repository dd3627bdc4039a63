r"""The identities every augmented likelihood must satisfy (:doc:`/maths/identities`), as checking functions.

Each identity is a function ``violation_*`` that returns ``{component: ratio}``, where ``ratio`` is the worst error
divided by its tolerance: the identity holds iff every ratio is ``<= 1`` (:func:`worst` gives the largest). They
take a likelihood and data (:func:`~gpytorch_augment.testing.data.protocol_data`,
:func:`~gpytorch_augment.testing.data.gp_data`), and, where the identity needs more than the likelihood's protocol
members, its :class:`~gpytorch_augment.testing.case.LikelihoodCase`. They do not need pytest: a likelihood author
can call them from a notebook while writing the likelihood.

(g), the Geweke test of the Gibbs sampler, is :func:`gpytorch_augment.testing.geweke.violation_geweke`.

Example::

    >>> from gpytorch_augment.testing import protocol_data, violation_aux_conditional, worst
    >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
    >>> d = protocol_data(BERNOULLI_CASE)                        # the data of a LikelihoodCase
    >>> ratios = violation_aux_conditional(d.likelihood, d.y, d.f, d.generator)
    >>> worst(ratios) <= 1
    True
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import gpytorch
import torch
from torch import Tensor

from gpytorch_augment.inference import CAVI
from gpytorch_augment.likelihoods import AugmentedLikelihood
from gpytorch_augment.testing.case import LikelihoodCase
from gpytorch_augment.testing.data import function_dist, protocol_data, to_latent_major
from gpytorch_augment.testing.models import make_cavi_model
from gpytorch_augment.variational.cavi_variational_strategy import WhitenedQ

#: ``{component: error / tolerance}``; an identity holds iff every value is ``<= 1``
Ratios = dict[str, float]


def worst(ratios: Ratios) -> float:
    """The largest ratio of a ``violation_*`` result (the identity holds iff it is ``<= 1``).

    Example::

        >>> from gpytorch_augment.testing import worst
        >>> worst({"equals log p(y|f)": 0.2, "constant across draws": 0.7})   # <= 1: the identity holds
        0.7
    """
    return max(ratios.values())


def _max(t: Tensor) -> float:
    return float(t.detach().max()) if t.numel() else 0.0


# ================================================================================================ (a)
def violation_aux_conditional(
    likelihood: AugmentedLikelihood,
    y: Tensor,
    f: Tensor,
    generator: torch.Generator,
    rtol: float = 1e-9,
    draws: int = 5,
) -> Ratios:
    r"""identity (a): :math:`\log C^{(k)} = \text{aug-loglik}(\Omega^{(k)}) - \log p(\Omega^{(k)}\mid y,f)` for draws
    :math:`\Omega^{(k)}\sim p(\Omega\mid y,f)` agree with each other and with :math:`\log p(y\mid f)`.

    Example::

        >>> from gpytorch_augment.testing import protocol_data, violation_aux_conditional, worst
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> d = protocol_data(BERNOULLI_CASE, n=5)
        >>> worst(violation_aux_conditional(d.likelihood, d.y, d.f, d.generator)) <= 1
        True
    """
    log_p = likelihood.log_prob_at(y, f)
    conditional = likelihood.aux_conditional(y, f)
    log_c = torch.stack(
        [
            likelihood.augmented_log_prob(y, aux, f) - conditional.log_prob(aux)
            for aux in (likelihood.sample_aux(y, f, generator=generator) for _ in range(draws))
        ]
    )
    tol = rtol * (1 + log_p.abs())
    return {
        "equals log p(y|f)": _max((log_c - log_p).abs() / tol),
        "constant across draws": _max((log_c - log_c[:1]).abs() / tol),
    }


# ================================================================================================ (b)
def _prior_recipe(n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    r""":math:`K = AA^\top/N + 0.1 I` and a nonzero prior mean."""
    A = torch.randn(n, n, generator=generator)
    return A @ A.mT / n + 0.1 * torch.eye(n), 0.5 + torch.randn(n, generator=generator)


def violation_f_conditional_exact(
    likelihood: AugmentedLikelihood,
    y: Tensor,
    f: Tensor,
    generator: torch.Generator,
    draws: int = 5,
    rtol: float = 1e-8,
) -> Ratios:
    r"""identity (b), exact GP: for fixed :math:`\Omega`, with :math:`\Sigma_f=(K^{-1}+\Lambda)^{-1}`,
    :math:`\mu_f=\Sigma_f(h+K^{-1}\mu_0)`, the value
    :math:`\sum_i\text{log-tilt}_i(f^{(k)})+\log\mathcal N(f^{(k)}\mid\mu_0,K)
    -\log\mathcal N(f^{(k)}\mid\mu_f,\Sigma_f)`
    is the same for every draw :math:`f^{(k)}\sim\mathcal N(\mu_f,\Sigma_f)` and equals
    :math:`\sum_i\log C_i+\frac12\mu_f^\top\Sigma_f^{-1}\mu_f-\frac12\mu_0^\top K^{-1}\mu_0
    +\frac12\log|\Sigma_f|-\frac12\log|K|`.

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing import protocol_data, violation_f_conditional_exact, worst
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> previous = torch.get_default_dtype()
        >>> torch.set_default_dtype(torch.float64)           # the recipes draw in the default dtype
        >>> d = protocol_data(BERNOULLI_CASE, n=5)
        >>> with torch.random.fork_rng():
        ...     _ = torch.manual_seed(0)
        ...     ratios = violation_f_conditional_exact(d.likelihood, d.y, d.f, d.generator)
        >>> torch.set_default_dtype(previous)
        >>> worst(ratios) <= 1
        True
    """
    n = y.shape[-1]
    K, mu0 = _prior_recipe(n, generator)
    aux = likelihood.sample_aux(y, f, generator=generator)
    h, lam = likelihood.potential_and_precision(y, aux, f)
    h, lam = h.reshape(-1, n), lam.reshape(-1, n)  # (T, n)
    K_inv = torch.linalg.inv(K)
    prior = torch.distributions.MultivariateNormal(mu0, K)
    precision = K_inv + torch.diag_embed(lam)
    Sigma = torch.linalg.inv(precision)
    Sigma = (Sigma + Sigma.mT) / 2
    mu = (Sigma @ (h + K_inv @ mu0).unsqueeze(-1)).squeeze(-1)
    posterior = torch.distributions.MultivariateNormal(mu, Sigma)
    expected = (
        likelihood.log_tilt_constant(y, aux).sum()
        + (0.5 * (mu.unsqueeze(-2) @ precision @ mu.unsqueeze(-1)).squeeze((-1, -2))
           - 0.5 * mu0 @ K_inv @ mu0
           + 0.5 * torch.logdet(Sigma)
           - 0.5 * torch.logdet(K)).sum()
    )
    values = []
    for _ in range(draws):
        fk = posterior.sample()  # (T, n), drawn with the global RNG seeded below
        fk_lik = fk.squeeze(0) if likelihood.num_latents == 1 else fk.mT
        values.append(
            likelihood.log_tilt(y, aux, fk_lik).sum() + prior.log_prob(fk).sum() - posterior.log_prob(fk).sum()
        )
    values = torch.stack(values)
    tol = rtol * (1 + expected.abs())
    return {
        "equals closed form": _max((values - expected).abs() / tol),
        "constant across draws": _max((values - values[0]).abs() / tol),
    }


def _expected_log_tilt_sigma_points(likelihood, y, aux, mean, var) -> Tensor:
    r""":math:`E_{\mathcal N(m,s)}[\text{log-tilt}]` through ``log_tilt`` itself: the log-tilt is a quadratic in
    each latent without cross terms, so the average over :math:`f=m\pm\sqrt s` is exact."""
    sd = var.clamp_min(0).sqrt()
    return 0.5 * (likelihood.log_tilt(y, aux, mean + sd) + likelihood.log_tilt(y, aux, mean - sd))


def violation_f_conditional_sparse(
    likelihood: AugmentedLikelihood,
    x: Tensor,
    y: Tensor,
    f: Tensor,
    Z: Tensor,
    generator: torch.Generator,
    perturbations: int = 30,
    atol: float = 1e-10,
) -> Ratios:
    r"""identity (b), sparse: for fixed :math:`\Omega`, the global step maximises
    :math:`E_{q(u)p(f\mid u)}[\text{log-tilt}]-\mathrm{KL}(q(u)\Vert p(u))`: no random perturbation of the
    CAVI :math:`q(u)` (its whitened mean and Cholesky factor) increases it.

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing import protocol_data, violation_f_conditional_sparse, worst
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> previous = torch.get_default_dtype()
        >>> torch.set_default_dtype(torch.float64)           # the recipes draw in the default dtype
        >>> d = protocol_data(BERNOULLI_CASE, n=5)
        >>> x, Z = torch.linspace(-3, 3, 5).unsqueeze(-1), torch.linspace(-2, 2, 3).unsqueeze(-1)
        >>> ratios = violation_f_conditional_sparse(d.likelihood, x, d.y, d.f, Z, d.generator, perturbations=5)
        >>> torch.set_default_dtype(previous)
        >>> worst(ratios) <= 1
        True
    """
    model = make_cavi_model(likelihood.num_latents, Z)
    strategy = model.variational_strategy
    strategy = getattr(strategy, "base_variational_strategy", strategy)
    aux = likelihood.sample_aux(y, f, generator=generator)
    h, lam = likelihood.potential_and_precision(y, aux, f)
    terms = strategy.cavi_terms(x)
    q_star = strategy.cavi_update(x, h, lam, terms=terms)

    @torch.no_grad()
    def objective(q: WhitenedQ) -> Tensor:
        mean, var = strategy.marginals(terms, q)
        mean, var = to_latent_major(mean, likelihood), to_latent_major(var, likelihood)
        return _expected_log_tilt_sigma_points(likelihood, y, aux, mean, var).sum() - strategy.kl_whitened(q).sum()

    best = objective(q_star)
    worst_gain = -math.inf
    m_star, R_star = q_star.mean, q_star.chol_covariance
    for k in range(perturbations):
        size = 10 ** (-3 + 2 * k / max(perturbations - 1, 1))
        dm = size * torch.randn(m_star.shape, generator=generator)
        dR = size * torch.randn(R_star.shape, generator=generator).tril()
        R = R_star + dR
        diag = R.diagonal(dim1=-1, dim2=-2)
        R = R - torch.diag_embed(diag) + torch.diag_embed(diag.abs().clamp_min(1e-3))
        C = torch.linalg.inv(R)  # S^{-1} = C^T C with C = R^{-1}
        theta1 = (C.mT @ C @ (m_star + dm).unsqueeze(-1)).squeeze(-1)
        worst_gain = max(worst_gain, float(objective(WhitenedQ(theta1, C)) - best))
    return {"no perturbation improves": max(worst_gain, 0.0) / (atol * (1 + abs(float(best))))}


# ================================================================================================ (c)
def violation_marginalisation(case: LikelihoodCase, likelihood: AugmentedLikelihood, y: Tensor, f: Tensor) -> Ratios:
    r"""identity (c): :math:`\log\int\text{tilt}\cdot p(\Omega\mid y)\,d\Omega=\log p(y\mid f)`, without sampling.

    Example::

        >>> from gpytorch_augment.testing import protocol_data, violation_marginalisation, worst
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> d = protocol_data(BERNOULLI_CASE, n=5)
        >>> worst(violation_marginalisation(BERNOULLI_CASE, d.likelihood, d.y, d.f)) <= 1
        True
    """
    marginal = case.marginalise(likelihood, y, f)
    return {"marginal = log p(y|f)": _max((marginal - likelihood.log_prob_at(y, f)).abs() / case.marginalise_atol)}


# ================================================================================================ (d)
def violation_monte_carlo(
    case: LikelihoodCase, likelihood: AugmentedLikelihood, y: Tensor, m: Tensor, s: Tensor, generator: torch.Generator
) -> Ratios:
    r"""identity (d): closed-form expected log-tilt, :math:`\bar h`, :math:`\bar\lambda` and auxiliary KL against the
    means of :math:`S` draws :math:`(f_i,\Omega_i)\sim q(f_i)q^*(\Omega_i)`; tolerance :math:`5\widehat{SE}+10^{-8}`.

    Example::

        >>> import dataclasses, torch
        >>> from gpytorch_augment.testing import protocol_data, violation_monte_carlo, worst
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> case = dataclasses.replace(BERNOULLI_CASE, mc_samples=4_000, mc_kl_samples=1_000)   # quick
        >>> d = protocol_data(case, n=3)
        >>> with torch.random.fork_rng():
        ...     _ = torch.manual_seed(0)
        ...     ratios = violation_monte_carlo(case, d.likelihood, d.y, d.m, d.s, d.generator)
        >>> worst(ratios) <= 1
        True
    """
    S = case.mc_samples
    q_aux = likelihood.aux_posterior(y, m, s)
    y_S = y.expand(S, *y.shape)
    q_aux_S = {k: v.expand(S, *v.shape) for k, v in q_aux.items()}
    q_dist = case.q_aux_distribution(likelihood, y_S, q_aux_S)
    aux = q_dist.sample(generator=generator)
    f = m + s.sqrt() * torch.randn((S, *m.shape), generator=generator, dtype=m.dtype)

    h_bar, lam_bar = likelihood.expected_potential_and_precision(y, q_aux, m, s)
    h_S, lam_S = likelihood.potential_and_precision(y_S, aux, f)
    # the KL uses the first mc_kl_samples draws only (auxiliary log-densities are expensive)
    S_kl = min(case.mc_kl_samples, S)
    aux_kl_draws = {k: v[:S_kl] for k, v in aux.items()}
    log_ratio = case.q_aux_distribution(likelihood, y_S[:S_kl], {k: v[:S_kl] for k, v in q_aux_S.items()}).log_prob(
        aux_kl_draws
    ) - likelihood.aux_prior(y_S[:S_kl]).log_prob(aux_kl_draws)
    pairs = {
        "expected log-tilt": (likelihood.expected_log_tilt(y, q_aux, m, s), likelihood.log_tilt(y_S, aux, f)),
        "h_bar": (h_bar, h_S),
        "lambda_bar": (lam_bar, lam_S),
        "aux KL": (likelihood.aux_kl(y, q_aux), log_ratio),
    }
    extra = case.extras.get("mc_expectations")
    if extra is not None:
        pairs.update(extra(likelihood, y, q_aux, aux))
    ratios = {}
    for name, (closed, samples) in pairs.items():
        se = samples.std(0) / math.sqrt(samples.shape[0])
        ratios[name] = _max((closed - samples.mean(0)).abs() / (5 * se + 1e-8))
    return ratios


# ================================================================================================ (e)
def _directions(value: Tensor, data_dims: int, generator: torch.Generator) -> list[tuple[Tensor, Tensor]]:
    """(direction, per-datum step) pairs: every coordinate of a vector parameter, plus random directions."""
    trailing = value.shape[data_dims:]
    if len(trailing) == 0:
        return [(torch.ones_like(value), 1e-4 * value.abs().clamp_min(1))]
    flat = value.reshape(*value.shape[:data_dims], -1)
    out = []
    for j in range(flat.shape[-1]):
        d = torch.zeros_like(flat)
        d[..., j] = 1
        out.append((d.reshape(value.shape), 1e-4 * flat[..., j].abs().clamp_min(1)))
    for _ in range(3):
        d = torch.randn(trailing, generator=generator, dtype=value.dtype)
        d = (d / d.norm()).expand_as(value)
        out.append((d, 1e-4 * flat.norm(dim=-1).clamp_min(1)))
    return out


def violation_stationarity(
    likelihood: AugmentedLikelihood, y: Tensor, m: Tensor, s: Tensor, generator: torch.Generator
) -> Ratios:
    r"""identity (e): :math:`q^*(\Omega)` is a stationary point (a maximum) of :math:`\ell_i`,
    :math:`\ell_i(q^*)=\ell_i^*`,
    and autograd of :math:`\ell_i^*` returns :math:`\bar\lambda=-2\partial_s\ell^*`,
    :math:`\bar h=\partial_m\ell^*+\bar\lambda m`.

    Example::

        >>> from gpytorch_augment.testing import protocol_data, violation_stationarity, worst
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> d = protocol_data(BERNOULLI_CASE, n=5)
        >>> worst(violation_stationarity(d.likelihood, d.y, d.m, d.s, d.generator)) <= 1
        True
    """
    q_star = likelihood.aux_posterior(y, m, s)
    ell_star = likelihood.elbo_terms(y, q_star, m, s)
    data_dims = m.dim() if likelihood.num_latents == 1 else m.dim() - 1
    not_higher = slope = 0.0
    for key, value in q_star.items():
        if not value.is_floating_point():
            continue
        for direction, eps in _directions(value, data_dims, generator):
            step = eps.reshape(*eps.shape, *([1] * (value.dim() - eps.dim()))) * direction
            up = likelihood.elbo_terms(y, {**q_star, key: value + step}, m, s)
            down = likelihood.elbo_terms(y, {**q_star, key: value - step}, m, s)
            not_higher = max(not_higher, _max((torch.maximum(up, down) - ell_star) / 1e-12))
            slope = max(slope, _max((up - down).abs() / (2 * eps) / 1e-6))
    collapsed = likelihood.collapsed_bound(y, m, s)

    m_ = m.clone().requires_grad_(True)
    s_ = s.clone().requires_grad_(True)
    with torch.enable_grad():
        d_m, d_s = torch.autograd.grad(likelihood.collapsed_bound(y, m_, s_).sum(), (m_, s_))
    lam_auto = -2 * d_s
    h_auto = d_m + lam_auto * m
    h_bar, lam_bar = likelihood.expected_potential_and_precision(y, q_star, m, s)
    h_auto, lam_auto = to_latent_major(h_auto, likelihood), to_latent_major(lam_auto, likelihood)
    return {
        "perturbation never increases ell": not_higher,
        "finite-difference slope vanishes": slope,
        "elbo_terms(q*) = collapsed_bound": _max((ell_star - collapsed).abs() / (1e-10 * (1 + collapsed.abs()))),
        "autograd lambda_bar": _max((lam_auto - lam_bar).abs() / (1e-8 * (1 + lam_bar.abs()))),
        "autograd h_bar": _max((h_auto - h_bar).abs() / (1e-8 * (1 + h_bar.abs()))),
    }


# ================================================================================================ (f)
def violation_bound(case: LikelihoodCase, likelihood: AugmentedLikelihood, y: Tensor, m: Tensor, s: Tensor) -> Ratios:
    r"""identity (f): :math:`\ell_i^*\le E_{q(f_i)}\log p(y_i\mid f_i)+10^{-8}` (the case's ``expected_log_lik``,
    100-node Gauss--Hermite by default), and :math:`\ell_i^*=\log p(y_i\mid m_i)` at :math:`s_i=0`.

    Example::

        >>> from gpytorch_augment.testing import protocol_data, violation_bound, worst
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> d = protocol_data(BERNOULLI_CASE, n=5)
        >>> worst(violation_bound(BERNOULLI_CASE, d.likelihood, d.y, d.m, d.s)) <= 1
        True
    """
    ell = likelihood.collapsed_bound(y, m, s)
    rhs = case.expected_log_lik(likelihood, y, m, s)
    tight = likelihood.collapsed_bound(y, m, torch.zeros_like(s))
    log_p = likelihood.log_prob_at(y, m)
    return {
        "ell* <= E log p": max(_max(ell - rhs), 0.0) / 1e-8,
        "tight at s = 0": _max((tight - log_p).abs() / 1e-10),
    }


def violation_bound_gp(likelihood: AugmentedLikelihood, data: SimpleNamespace, Z: Tensor, sweeps: int = 2) -> Ratios:
    r"""identity (f) for a whole GP: augmented ELBO :math:`\le E_q\log p(y\mid f)-\mathrm{KL}` (GPyTorch's
    ``VariationalELBO`` with the true expected log-likelihood), at the prior :math:`q(u)` and after CAVI sweeps.

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing import gp_data, violation_bound_gp, worst
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> previous = torch.get_default_dtype()
        >>> torch.set_default_dtype(torch.float64)           # the recipes draw in the default dtype
        >>> data = gp_data(BERNOULLI_CASE, n=8)
        >>> ratios = violation_bound_gp(data.likelihood, data, Z=data.x)
        >>> torch.set_default_dtype(previous)
        >>> worst(ratios) <= 1
        True
    """
    model = make_cavi_model(likelihood.num_latents, Z)
    cavi = CAVI(model, likelihood, num_data=data.y.shape[-1])
    true_elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=data.y.shape[-1])
    worst = -math.inf
    for t in range(sweeps + 1):
        if t:
            cavi.step(data.x, data.y, **data.kwargs)
        with torch.no_grad():
            augmented = float(cavi.elbo(data.x, data.y, **data.kwargs))
            model.train()
            true = float(true_elbo(model(data.x), data.y, **data.kwargs))
        worst = max(worst, augmented - true)
    return {"augmented ELBO <= true ELBO": max(worst, 0.0) / 1e-8}


# ================================================================================================ (h)
def violation_cavi_monotone(
    likelihood: AugmentedLikelihood,
    data: SimpleNamespace,
    Z: Tensor,
    sweeps: int = 50,
    rtol: float = 1e-9,
    converge_rtol: float = 1e-8,
) -> Ratios:
    r"""identity (h): over ``sweeps`` full-batch CAVI sweeps the augmented (collapsed) ELBO ``CAVI.elbo`` never
    decreases (:math:`\mathcal L_{t+1}\ge\mathcal L_t-\text{rtol}\,|\mathcal L_t|`) and converges
    (:math:`|\mathcal L_{50}-\mathcal L_{49}|\le10^{-8}|\mathcal L_{50}|`); ``CAVI.step`` returns the ELBO of the
    state on entry. Everything must stay finite.

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing import gp_data, violation_cavi_monotone, worst
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> previous = torch.get_default_dtype()
        >>> torch.set_default_dtype(torch.float64)           # the recipes draw in the default dtype
        >>> data = gp_data(BERNOULLI_CASE, n=8)
        >>> ratios = violation_cavi_monotone(data.likelihood, data, Z=data.x, sweeps=50)
        >>> torch.set_default_dtype(previous)
        >>> worst(ratios) <= 1
        True
    """
    model = make_cavi_model(likelihood.num_latents, Z).to(data.x.dtype)
    cavi = CAVI(model, likelihood, num_data=data.y.shape[-1])
    values, returned = [], []
    for t in range(sweeps + 1):
        values.append(float(cavi.elbo(data.x, data.y, **data.kwargs)))
        if t < sweeps:
            returned.append(float(cavi.step(data.x, data.y, **data.kwargs)))
    L = torch.tensor(values, dtype=torch.float64)
    R = torch.tensor(returned, dtype=torch.float64)
    if not (torch.isfinite(L).all() and torch.isfinite(R).all()):
        return {"finite": math.inf}
    drops = (L[:-1] - L[1:]) / (rtol * L[:-1].abs())
    return {
        "monotone": max(_max(drops), 0.0),
        "converged": float((L[-1] - L[-2]).abs() / (converge_rtol * L[-1].abs())),
        "step returns ELBO on entry": _max((R - L[:-1]).abs() / (rtol * L[:-1].abs())),
    }




# ================================================================================================ shapes, dtypes
def check_shapes_and_dtypes(
    case: LikelihoodCase, dtype: torch.dtype, n: int = 7, batch: tuple[int, ...] = (3,)
) -> None:
    """Every protocol member accepts a batch ``(*batch, N)``, keeps the dtype, and returns one finite value per
    datum (per latent for potentials and precisions); so do the GPyTorch-facing members on a batched (multitask)
    :math:`q(f)`. Raises ``AssertionError`` naming the first member that does not.

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing import check_shapes_and_dtypes
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> check_shapes_and_dtypes(BERNOULLI_CASE, torch.float64)   # silent: every member passes
        >>> check_shapes_and_dtypes(BERNOULLI_CASE, torch.float32, n=4, batch=(2,))
    """
    d = protocol_data(case, n=n, batch=batch, dtype=dtype)
    lik, y, f, m, s = d.likelihood, d.y, d.f, d.m, d.s
    T = case.num_latents
    per_datum = torch.Size((*batch, n))
    per_latent = per_datum if T == 1 else torch.Size((*batch, T, n))

    def check(t: Tensor, shape: torch.Size, what: str) -> None:
        assert t.shape == shape, f"{what}: shape {tuple(t.shape)}, expected {tuple(shape)}"
        assert t.dtype == dtype, f"{what}: dtype {t.dtype}, expected {dtype}"
        assert torch.isfinite(t).all(), f"{what}: not finite"

    check(lik.log_prob_at(y, f), per_datum, "log_prob_at")
    aux = lik.sample_aux(y, f, generator=d.generator)
    for k, v in aux.items():
        assert v.shape[: len(per_datum)] == per_datum and v.dtype == dtype, f"aux[{k}]"
    check(lik.aux_prior(y).log_prob(aux), per_datum, "aux_prior.log_prob")
    check(lik.aux_conditional(y, f).log_prob(aux), per_datum, "aux_conditional.log_prob")
    h, lam = lik.potential_and_precision(y, aux, f)
    check(h, per_latent, "potential")
    check(lam, per_latent, "precision")
    check(lik.log_tilt_constant(y, aux), per_datum, "log_tilt_constant")
    check(lik.log_tilt(y, aux, f), per_datum, "log_tilt")
    check(lik.augmented_log_prob(y, aux, f), per_datum, "augmented_log_prob")
    q_aux = lik.aux_posterior(y, m, s)
    for k, v in q_aux.items():
        assert v.shape[: len(per_datum)] == per_datum and v.dtype == dtype, f"q_aux[{k}]"
    h_bar, lam_bar = lik.expected_potential_and_precision(y, q_aux, m, s)
    check(h_bar, per_latent, "expected potential")
    check(lam_bar, per_latent, "expected precision")
    check(lik.expected_log_tilt_constant(y, q_aux), per_datum, "expected_log_tilt_constant")
    check(lik.expected_log_tilt(y, q_aux, m, s), per_datum, "expected_log_tilt")
    check(lik.aux_kl(y, q_aux), per_datum, "aux_kl")
    check(lik.elbo_terms(y, q_aux, m, s), per_datum, "elbo_terms")
    check(lik.collapsed_bound(y, m, s), per_datum, "collapsed_bound")
    # the GPyTorch-facing members on a batched (multitask) MVN
    q_f = function_dist(to_latent_major(m, case), torch.diag_embed(to_latent_major(s, case)), T)
    check(lik.expected_log_prob(d.y_raw, q_f, **d.kwargs), per_datum, "expected_log_prob")
    check(lik.log_marginal(d.y_raw, q_f, **d.kwargs), per_datum, "log_marginal")
    predictive = lik(q_f, **d.kwargs)
    draw = predictive.sample()
    assert draw.shape == per_datum, f"predictive sample: shape {tuple(draw.shape)}"
    check(predictive.log_prob(draw), per_datum, "predictive log_prob")
