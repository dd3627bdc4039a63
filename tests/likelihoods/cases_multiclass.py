r"""Registry cases of the logistic-softmax likelihood (docs/maths/multiclass.md) for the shared protocol suite.

Both links with unequal class scales :math:`\theta`, two latents each:

* over-parametrised, :math:`K = 2` classes (:math:`J = 2` latents), :math:`\theta = (0.6, 1.7)`;
* bijective, :math:`K = 3` classes (:math:`J = 2` latents, :math:`f_3 \equiv 0`), :math:`\theta = (0.7, 1.6, 1.3)`.

Multi-latent conventions as in ``toy_multilatent.py``: latents ``(N, J)``, labels ``(N,)`` (class indices),
``n`` and ``omega`` of shape ``(N, J)`` with per-latent factors declared ``Independent(..., 1)``.

* identity (c) sums the counts over the box :math:`n_j \le n_{\max}` with the likelihood's own pieces (``log_tilt`` at
  :math:`\omega = 0` and :math:`\omega = e_j`, ``aux_prior``) and integrates each :math:`\omega_j` by the Laplace
  transform of :math:`\mathrm{PG}(Y_j + n_j, 0)`. Given :math:`f`, the counts follow :math:`\mathrm{NM}(1, p')`, whose
  total :math:`T = \sum_j n_j` is geometric with success probability :math:`p'_0 = \sum_l\theta_l s_l(f)/S`, so the
  mass of :math:`T > n_{\max}` is :math:`(1 - p'_0)^{n_{\max}+1}`; the sum runs over :math:`T \le n_{\max}` (inside the
  box) with :math:`n_{\max}` chosen per datum to make that tail :math:`\le 10^{-15}`. For the bijective case
  :math:`p'_0 \ge \theta_K D / S = 0.22` and :math:`n_{\max} \le 150`
  (identity (c)); the over-parametrised link has no such floor (:math:`p'_0 = \sigma(-4)` when every latent is at
  :math:`-4`, as in the test's edge point), so there :math:`n_{\max}` reaches about 2000 for that datum.
* identity (f): :math:`E_q \log p(y \mid f)` by a 100 x 100 product Gauss--Hermite rule.
* identity (d): the law of :math:`q^*(n, \omega)` is built here from first principles (:math:`p^q_j = \theta_j
  \tilde\sigma_j / S`, :math:`p^q_0 = 1 - \sum_j p^q_j`), independently of the likelihood's closed forms.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.distributions import Independent
from torch.nn.functional import logsigmoid

from gpytorch_augment._numerics import gauss_hermite
from gpytorch_augment.distributions import PolyaGamma
from gpytorch_augment.distributions.auxiliary import AuxiliaryDistribution
from gpytorch_augment.likelihoods.logistic_softmax import LogisticSoftmaxLikelihood, NegativeMultinomial
from gpytorch_augment.testing.case import LikelihoodCase, cyclic_targets, log_pg_laplace

AuxDict = dict[str, Tensor]

THETA_OVER = (0.6, 1.7)
THETA_BIJECTIVE = (0.7, 1.6, 1.3)
#: the box of identity (c) is at least this large (the rule of identity (c) for J <= 2)
MIN_COUNT_BOX = 150
#: mass of the counts outside the box, at most
COUNT_TAIL = 1e-15
_ROW_CHUNK = 2**20


def _class_logits(theta: Tensor, f: Tensor, bijective: bool) -> Tensor:
    r""":math:`\log\theta_l s_l(f)` for every class (model definition, written out independently)."""
    theta = theta.to(f.dtype)
    latent = theta[: f.shape[-1]].log() + logsigmoid(f)
    if not bijective:
        return latent
    reference = (theta[-1] * 0.5).log().expand(*f.shape[:-1], 1)
    return torch.cat([latent, reference], -1)


def _sampler(theta: tuple[float, ...], bijective: bool):
    def sample_targets(f: Tensor, generator: torch.Generator, **kwargs: Tensor) -> Tensor:
        probs = torch.softmax(_class_logits(torch.tensor(theta), f, bijective), -1)
        draws = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator)
        return draws.reshape(probs.shape[:-1]).to(f.dtype)

    return sample_targets


def _count_box(likelihood: LogisticSoftmaxLikelihood, f: Tensor) -> int:
    """The per-datum box size :math:`n_{\\max}` for the latents ``f`` ``(J,)`` of one datum."""
    theta = likelihood.class_scales.detach().to(torch.float64)
    logits = _class_logits(theta, f.to(torch.float64), likelihood.bijective)
    log_s = (theta[: f.shape[-1]].sum() + (0.5 * theta[-1] if likelihood.bijective else 0.0)).log()  # log S
    p0 = float((torch.logsumexp(logits, -1) - log_s).exp())
    n_max = math.ceil(math.log(COUNT_TAIL) / math.log1p(-p0)) if p0 < 1 else 0
    return max(MIN_COUNT_BOX, n_max)


def marginalise_logistic_softmax(likelihood: LogisticSoftmaxLikelihood, y: Tensor, f: Tensor) -> Tensor:
    r""":math:`\log\sum_{n}\int \text{tilt}(n, \omega)\,\mu_p(n)\prod_j\mathrm{PG}(\omega_j\mid Y_j + n_j, 0)\,d\omega`
    per datum, without sampling (see the module docstring)."""
    J = likelihood.num_latents
    shape = torch.broadcast_shapes(y.shape, f.shape[:-1])
    y_flat = y.expand(shape).reshape(-1)
    f_flat = f.expand(*shape, J).reshape(-1, J)
    out = torch.empty(y_flat.shape, dtype=f.dtype)
    for i in range(y_flat.numel()):
        yi, fi = y_flat[i : i + 1], f_flat[i : i + 1]
        n_max = _count_box(likelihood, f_flat[i])
        values = torch.arange(n_max + 1, dtype=f.dtype)
        rows = max(1, _ROW_CHUNK // (n_max + 1) ** (J - 1))
        prior = likelihood.aux_prior(yi)
        parts = []
        for start in range(0, n_max + 1, rows):
            first = values[start : start + rows]
            grid = torch.cartesian_prod(first, *([values] * (J - 1))).reshape(-1, J)
            grid = grid[grid.sum(-1) <= n_max].unsqueeze(-2)  # (G, 1, J): the simplex T <= n_max
            zero = torch.zeros_like(grid)
            at_zero = likelihood.log_tilt(yi, {"n": grid, "omega": zero}, fi)
            omega_prior = prior.factors["omega"]({"n": grid})
            assert isinstance(omega_prior, Independent) and isinstance(omega_prior.base_dist, PolyaGamma)
            assert bool((omega_prior.base_dist.c == 0).all()), "expected PG(Y + n, 0) priors"
            b = omega_prior.base_dist.b
            log_terms = prior.factors["n"].log_prob(grid) + at_zero
            for j in range(J):
                unit = zero.clone()
                unit[..., j] = 1.0
                t = at_zero - likelihood.log_tilt(yi, {"n": grid, "omega": unit}, fi)
                log_terms = log_terms + log_pg_laplace(b[..., j], t)
            parts.append(torch.logsumexp(log_terms, dim=0))
        out[i] = torch.logsumexp(torch.cat(parts), 0)
    return out.reshape(shape)


def expected_log_lik_product_rule(likelihood: LogisticSoftmaxLikelihood, y: Tensor, m: Tensor, s: Tensor) -> Tensor:
    r""":math:`E_{\prod_j\mathcal N(m_j, s_j)}\log p(y\mid f)` by a product Gauss--Hermite rule (100 nodes
    per latent)."""
    J = m.shape[-1]
    nodes, weights = gauss_hermite(m, s, 100)  # (100, ..., N, J)
    total = torch.zeros(m.shape[:-1], dtype=m.dtype)
    index = torch.cartesian_prod(*([torch.arange(100)] * J)).reshape(-1, J)
    for chunk in index.split(2000):
        f = torch.stack([nodes[chunk[:, j], ..., j] for j in range(J)], -1)  # (P, ..., N, J)
        w = torch.stack([weights[chunk[:, j]] for j in range(J)], -1).prod(-1)  # (P, 1.., 1)
        total = total + (w[..., 0] * likelihood.log_prob_at(y, f)).sum(0)
    return total


def q_aux_logistic_softmax(likelihood: LogisticSoftmaxLikelihood, y: Tensor, q_aux: AuxDict) -> AuxiliaryDistribution:
    r""":math:`q(n) = \mathrm{NM}(1, p^q)`, :math:`p^q_j = \theta_j\tilde\sigma_j / S` and
    :math:`p^q_0 = 1 - \sum_j p^q_j`;
    :math:`q(\omega_j \mid n) = \mathrm{PG}(Y_j + n_j, c_j)`."""
    c, sigma_tilde = q_aux["c"], q_aux["sigma_tilde"]
    J, K = likelihood.num_latents, likelihood.num_classes
    theta = likelihood.class_scales.detach().to(c.dtype)
    S = theta[:J].sum() + (0.5 * theta[-1] if likelihood.bijective else 0.0)
    p = theta[:J] * sigma_tilde / S
    p0 = 1 - p.sum(-1)
    Y = torch.nn.functional.one_hot(y.long(), K)[..., :J].to(c.dtype)
    return AuxiliaryDistribution(
        n=NegativeMultinomial(p.log(), p0.log()),
        omega=lambda aux: Independent(PolyaGamma(Y + aux["n"], c), 1),
    )


def _case(name: str, theta: tuple[float, ...], bijective: bool, **registration: Any) -> LikelihoodCase:
    return LikelihoodCase(
        name=name,
        make=lambda: LogisticSoftmaxLikelihood(len(theta), bijective=bijective, class_scales=theta).double(),
        sample_targets=_sampler(theta, bijective),
        marginalise=marginalise_logistic_softmax,
        q_aux_distribution=q_aux_logistic_softmax,
        num_latents=len(theta) - 1 if bijective else len(theta),
        expected_log_lik=expected_log_lik_product_rule,
        # Pólya-Gamma log-densities of b = Y + n dominate the Monte-Carlo KL; same 5-SE rule
        mc_kl_samples=10_000,
        **registration,
    )


LOGISTIC_SOFTMAX = _case(
    "logistic_softmax",
    THETA_OVER,
    bijective=False,
    example_targets=cyclic_targets(3),
    constructor_kwargs={"num_classes": 3},
    constants=("class_scales",),
    constant_priors={"class_scale_prior": {"learn_class_scales": True}},
)
LOGISTIC_SOFTMAX_BIJECTIVE = _case("logistic_softmax_bijective", THETA_BIJECTIVE, bijective=True)

#: this module's cases (the registry collects the ``CASES`` of every ``cases_*.py`` module)
CASES: list[LikelihoodCase] = [LOGISTIC_SOFTMAX, LOGISTIC_SOFTMAX_BIJECTIVE]
