"""Tests specific to the count likelihoods (binomial, Poisson, negative binomial).

The identities of docs/maths/identities.md run in ``test_protocol.py`` through the registry cases of
``cases_counts.py``; here: the closed-form hyper-parameter updates, zero trials, large counts, bad input, CAVI
and ``AugmentedELBO`` with the ``trials`` keyword, the predictive, and drop-in use with plain GPyTorch.
"""

from __future__ import annotations

import math
import time

import gpytorch
import pytest
import torch
from scipy import optimize, special
from torch.distributions import NegativeBinomial

from gpytorch_augment import CAVI, AugmentedELBO, BernoulliLogitLikelihood
from gpytorch_augment._numerics import log_sigma_tilde
from gpytorch_augment._random import seeded_by
from gpytorch_augment.likelihoods.binomial import BinomialLogitLikelihood
from gpytorch_augment.likelihoods.negative_binomial import (
    LOG_TOTAL_COUNT_BOUNDS,
    NegativeBinomialLogitLikelihood,
    solve_total_count,
)
from gpytorch_augment.likelihoods.poisson import PoissonLogitLikelihood
from tests.likelihoods.cases_counts import CASES as COUNT_CASES
from tests.models import SVGP


def _marginals(n: int, generator: torch.Generator, batch: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    m = torch.randn(*batch, n, generator=generator)
    s = 0.1 + 0.9 * torch.rand(*batch, n, generator=generator)
    return m, s


def _toy(name: str, n: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict, object]:
    """A 1-D problem drawn from the model, with a fresh likelihood away from the truth."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    f = 0.3 + 1.5 * torch.sin(1.5 * x[:, 0])
    if name == "binomial":
        trials = torch.randint(0, 9, (n,), generator=g).double()
        return x, torch.binomial(trials, torch.sigmoid(f), generator=g), {"trials": trials}, BinomialLogitLikelihood()
    if name == "poisson":
        return x, torch.poisson(6.0 * torch.sigmoid(f), generator=g), {}, PoissonLogitLikelihood(rate_scale=2.0)
    with seeded_by(g):
        y = NegativeBinomial(total_count=3.0, logits=f).sample()
    return x, y, {}, NegativeBinomialLogitLikelihood(total_count=0.7)


NAMES = ["binomial", "poisson", "negative_binomial"]


# ================================================================================================ hyper-parameters
def test_rate_scale_update_is_the_exact_maximiser():
    g = torch.Generator().manual_seed(0)
    m, s = _marginals(25, g)
    y = torch.poisson(5.0 * torch.sigmoid(m), generator=g)
    lik = PoissonLogitLikelihood(rate_scale=1.3)
    lik.update_hyperparameters(y, lik.aux_posterior(y, m, s), m, s)
    xi = float(lik.rate_scale)
    c = (m**2 + s).sqrt()
    assert xi == pytest.approx(float(y.sum() / (1 - log_sigma_tilde(m, c).exp()).sum()), rel=1e-12)

    def total(value: float) -> float:
        probe = PoissonLogitLikelihood(rate_scale=value)
        return float(probe.collapsed_bound(y, m, s).sum())

    best = total(xi)
    for eps in (1e-6, 1e-4, 1e-2, 0.3):
        assert total(xi * (1 + eps)) < best and total(xi * (1 - eps)) < best
    slope = (total(xi * (1 + 1e-5)) - total(xi * (1 - 1e-5))) / (2e-5 * xi)
    assert abs(slope) < 1e-6


def test_rate_scale_update_skipped_when_fixed_or_without_counts():
    g = torch.Generator().manual_seed(1)
    m, s = _marginals(10, g)
    lik = PoissonLogitLikelihood(rate_scale=1.3)
    lik.update_hyperparameters(torch.zeros(10), {}, m, s)  # sum(y) = 0: the maximiser is xi -> 0; keep xi
    assert float(lik.rate_scale) == pytest.approx(1.3)
    lik.raw_rate_scale.requires_grad_(False)
    lik.update_hyperparameters(torch.ones(10), {}, m, s)
    assert float(lik.rate_scale) == pytest.approx(1.3)


@pytest.mark.parametrize("seed", range(4))
def test_total_count_update_root_accuracy(seed):
    """The r update against scipy's brentq on the same score, and a vanishing derivative of sum(ell*)."""
    g = torch.Generator().manual_seed(seed)
    r_true = [0.3, 2.6, 15.0, 80.0][seed]
    m, s = _marginals(60, g)
    f = torch.randn(60, generator=g)
    with seeded_by(g):
        y = NegativeBinomial(total_count=torch.tensor(r_true), logits=f).sample()
    lik = NegativeBinomialLogitLikelihood(total_count=1.0)
    lik.update_hyperparameters(y, lik.aux_posterior(y, m, s), m, s)
    r = float(lik.total_count)

    S = float(log_sigma_tilde(m, (m**2 + s).sqrt()).sum())
    yn = y.numpy()
    score = lambda u: float((special.digamma(yn + math.exp(u)) - special.digamma(math.exp(u))).sum()) + S  # noqa: E731
    reference = math.exp(optimize.brentq(score, *LOG_TOTAL_COUNT_BOUNDS, xtol=1e-14, rtol=1e-14))
    assert r == pytest.approx(reference, rel=1e-9)

    r_ = lik.total_count.detach().clone().requires_grad_(True)
    probe = NegativeBinomialLogitLikelihood()
    probe.raw_total_count = torch.nn.Parameter(probe.raw_total_count_constraint.inverse_transform(r_))
    (grad,) = torch.autograd.grad(probe.collapsed_bound(y, m, s).sum(), probe.raw_total_count)
    assert abs(float(grad)) < 1e-8 * len(y)


def test_total_count_solver_is_vectorised_and_clips():
    g = torch.Generator().manual_seed(3)
    y = torch.poisson(torch.full((3, 50), 4.0), generator=g)
    S = torch.tensor([[-40.0], [-2.0], [-1e-9]])  # last: Poisson-like data, the root is beyond the bound
    r = solve_total_count(y, S)
    assert r.shape == (3, 1)
    for i in range(2):
        residual = (torch.digamma(y[i] + r[i]) - torch.digamma(r[i])).sum() + S[i]
        assert abs(float(residual)) < 1e-9 * float(y[i].sum())
    assert float(r[2]) == pytest.approx(math.exp(LOG_TOTAL_COUNT_BOUNDS[1]))
    assert float(r[0]) < float(r[1])  # a more negative sum(log sigma~) means more over-dispersion


def test_rate_scale_gibbs_step():
    """xi | n, y ~ Ga(a + sum(y + n), b + N), one xi per chain; a no-op without a prior."""
    y = torch.tensor([0.0, 3.0, 1.0, 7.0])
    n = torch.tensor([[2.0, 0.0, 1.0, 4.0], [0.0, 0.0, 0.0, 1.0]])
    lik = PoissonLogitLikelihood(rate_scale=2.0)
    constants, fresh = lik.sample_hyperparameters(y, {"n": n, "omega": torch.ones_like(n)}, torch.zeros_like(n))
    assert constants == {} and fresh is None and float(lik.rate_scale) == pytest.approx(2.0)

    a, b, S = 2.0, 0.5, 20_000
    lik = PoissonLogitLikelihood(rate_scale=2.0, rate_scale_prior=(a, b))
    n = n.expand(S, *n.shape)  # S x 2 chains
    g = torch.Generator().manual_seed(0)
    constants, _ = lik.sample_hyperparameters(
        y, {"n": n, "omega": torch.ones_like(n)}, torch.zeros_like(n), generator=g
    )
    draws = constants["rate_scale"]
    assert draws.shape == (S, 2, 1) and float(lik.rate_scale) == pytest.approx(2.0)  # the likelihood is untouched
    shape, rate = a + (y + n[0]).sum(-1), b + 4
    for chain in range(2):
        xi = draws[:, chain, 0]
        se = xi.std() / math.sqrt(S)
        assert abs(float(xi.mean()) - float(shape[chain] / rate)) <= 5 * se
        assert float(xi.var()) == pytest.approx(float(shape[chain] / rate**2), rel=0.05)
    with pytest.raises(ValueError, match="rate_scale_prior"):
        PoissonLogitLikelihood(rate_scale_prior=(0.0, 1.0))


def test_hyperparameters_are_learnable_through_augmented_elbo():
    """Gradients of AugmentedELBO w.r.t. xi and r are those of the collapsed bound (envelope theorem)."""
    g = torch.Generator().manual_seed(2)
    for lik in (PoissonLogitLikelihood(rate_scale=2.5), NegativeBinomialLogitLikelihood(total_count=1.7)):
        m, s = _marginals(15, g)
        y = torch.poisson(3 * torch.sigmoid(m), generator=g)
        raw = next(lik.parameters())
        q_aux = lik.aux_posterior(y, m, s)  # detached at the optimum, as AugmentedELBO does
        (via_terms,) = torch.autograd.grad(lik.elbo_terms(y, q_aux, m, s).sum(), raw)
        (via_collapsed,) = torch.autograd.grad(lik.collapsed_bound(y, m, s).sum(), raw)
        assert torch.allclose(via_terms, via_collapsed, rtol=1e-10, atol=1e-12)
        assert float(via_collapsed.abs()) > 1e-3


# ================================================================================================ binomial specifics
def test_zero_trials_carry_no_information():
    lik = BinomialLogitLikelihood()
    y = lik.check_targets(torch.tensor([0.0, 0.0, 2.0]), trials=torch.tensor([0.0, 0.0, 3.0]))
    m = torch.tensor([0.0, 2.0, 0.5], requires_grad=True)
    s = torch.tensor([1e-3, 0.5, 0.2], requires_grad=True)
    q_aux = lik.aux_posterior(y, m, s)
    h, lam = lik.expected_potential_and_precision(y, q_aux, m, s)
    assert torch.equal(h[:2], torch.zeros(2)) and torch.equal(lam[:2], torch.zeros(2))
    assert torch.equal(lik.aux_kl(y, q_aux)[:2], torch.zeros(2))
    ell = lik.collapsed_bound(y, m, s)
    assert torch.equal(ell[:2], torch.zeros(2))
    grads = torch.autograd.grad(ell.sum() + lik.elbo_terms(y, q_aux, m, s).sum(), (m, s))
    assert all(torch.isfinite(gr).all() for gr in grads)
    aux = lik.sample_aux(y, torch.tensor([0.0, -3.0, 1.0]))
    assert torch.equal(aux["omega"][:2], torch.zeros(2)) and float(aux["omega"][2]) > 0
    q_f = gpytorch.distributions.MultivariateNormal(m.detach(), torch.diag(s.detach()))
    assert torch.equal(lik.expected_log_prob(y[0], q_f, trials=y[1])[:2], torch.zeros(2))


def test_one_trial_is_bernoulli():
    g = torch.Generator().manual_seed(4)
    m, s = _marginals(12, g)
    labels = torch.bernoulli(torch.full((12,), 0.5), generator=g)
    binomial, bernoulli = BinomialLogitLikelihood(), BernoulliLogitLikelihood()
    y = binomial.check_targets(labels, trials=1)
    assert torch.allclose(binomial.collapsed_bound(y, m, s), bernoulli.collapsed_bound(labels, m, s), rtol=1e-13)
    for a, b in zip(
        binomial.expected_potential_and_precision(y, binomial.aux_posterior(y, m, s), m, s),
        bernoulli.expected_potential_and_precision(labels, bernoulli.aux_posterior(labels, m, s), m, s),
    ):
        assert torch.allclose(a, b, rtol=1e-13)


def test_canonical_target_layout():
    """(*batch, 2, N): the last dimension indexes data, leading dimensions are batch dimensions."""
    lik = BinomialLogitLikelihood()
    y = lik.check_targets(torch.tensor([[1.0, 2.0, 0.0]]).expand(4, 3), trials=torch.tensor([3.0, 2.0, 5.0]))
    assert y.shape == (4, 2, 3)
    successes, trials = lik.split_targets(y[..., [0, 2]])
    assert torch.equal(successes[0], torch.tensor([1.0, 0.0])) and torch.equal(trials[0], torch.tensor([3.0, 5.0]))


# ============================================================================================== bad input, large counts
@pytest.mark.parametrize(
    "name, y, kwargs, match",
    [
        ("poisson", [1.0, -1.0], {}, "non-negative integer"),
        ("poisson", [1.0, 0.5], {}, "non-negative integer"),
        ("poisson", [1.0, math.nan], {}, "non-finite"),
        ("negative_binomial", [math.inf, 1.0], {}, "non-finite"),
        ("negative_binomial", [2.0, 2.5], {}, "non-negative integer"),
        ("binomial", [1.0, 2.0], {}, "trials"),
        ("binomial", [1.0, 3.0], {"trials": [2.0, 2.0]}, "exceed the number of trials"),
        ("binomial", [1.0, 1.0], {"trials": [2.0, -2.0]}, "trials must be non-negative integer"),
        ("binomial", [1.0, 1.0], {"trials": [2.0, 1.5]}, "trials must be non-negative integer"),
        ("binomial", [-1.0, 1.0], {"trials": [2.0, 2.0]}, "successes y must be non-negative integer"),
    ],
)
def test_bad_targets_raise(name, y, kwargs, match):
    classes = {"binomial": BinomialLogitLikelihood, "poisson": PoissonLogitLikelihood}
    lik = classes.get(name, NegativeBinomialLogitLikelihood)()
    kwargs = {k: torch.tensor(v) for k, v in kwargs.items()}
    q_f = gpytorch.distributions.MultivariateNormal(torch.zeros(2), torch.eye(2))
    with pytest.raises(ValueError, match=match):
        lik.check_targets(torch.tensor(y), **kwargs)
    with pytest.raises(ValueError, match=match):
        lik.expected_log_prob(torch.tensor(y), q_f, **kwargs)


def test_bad_hyperparameters_raise():
    with pytest.raises(ValueError, match="rate_scale"):
        PoissonLogitLikelihood(rate_scale=-1.0)
    with pytest.raises(ValueError, match="total_count"):
        NegativeBinomialLogitLikelihood(total_count=0.0)


def _large_and_small(name: str, count: float, n: int):
    y = torch.full((n,), count)
    if name == "binomial":
        lik = BinomialLogitLikelihood()
        return lik, lik.check_targets(torch.full((n,), count), trials=torch.full((n,), 2 * count))
    if name == "poisson":
        return PoissonLogitLikelihood(rate_scale=3 * count), y
    return NegativeBinomialLogitLikelihood(total_count=2.5), y


@pytest.mark.parametrize("name", NAMES)
def test_large_counts_are_finite_and_fast(name):
    """y = 1e4: every quantity finite; sampling Omega costs about the same as for y = 10 (no sum of y PG(1) draws)."""
    n = 1000
    g = torch.Generator().manual_seed(5)
    f = torch.randn(n, generator=g)
    m, s = _marginals(n, g)
    timings = {}
    for count in (10.0, 1e4):
        lik, y = _large_and_small(name, count, n)
        q_aux = lik.aux_posterior(y, m, s)
        for value in (
            lik.collapsed_bound(y, m, s),
            lik.elbo_terms(y, q_aux, m, s),
            *lik.expected_potential_and_precision(y, q_aux, m, s),
            lik.log_prob_at(y, f),
        ):
            assert torch.isfinite(value).all()
        lik.sample_aux(y, f, generator=g)  # warm-up
        best = math.inf
        for _ in range(3):
            start = time.perf_counter()
            aux = lik.sample_aux(y, f, generator=g)
            best = min(best, time.perf_counter() - start)
        timings[count] = best
        h, lam = lik.potential_and_precision(y, aux, f)
        assert torch.isfinite(h).all() and torch.isfinite(lam).all() and (lam > 0).all()
        assert torch.isfinite(lik.log_tilt(y, aux, f)).all()
    assert timings[1e4] <= 3 * timings[10.0] + 5e-3, timings


# ================================================================================================ CAVI, AugmentedELBO
@pytest.mark.parametrize("sparse", [False, True], ids=["exact", "sparse"])
@pytest.mark.parametrize("name", NAMES)
def test_cavi_runs_and_is_monotone(name, sparse, device):
    x, y, kwargs, lik = _toy(name)
    x, y, kwargs, lik = x.to(device), y.to(device), {k: v.to(device) for k, v in kwargs.items()}, lik.to(device)
    Z = torch.linspace(-3, 3, 10, device=device).unsqueeze(-1) if sparse else x
    model = SVGP(Z, mean_constant=0.3).to(device)
    cavi = CAVI(model, lik, num_data=len(y))
    trace = cavi.fit(x, y, max_iter=100, tol=1e-11, **kwargs)
    elbo = torch.tensor(trace.elbo)
    assert torch.isfinite(elbo).all()
    assert (elbo[1:] - elbo[:-1] >= -1e-9 * elbo[:-1].abs()).all()
    assert elbo[-1] > elbo[0] + 0.1
    final = float(cavi.elbo(x, y, **kwargs))
    mll = AugmentedELBO(lik, model, num_data=len(y))
    assert float(mll(model(x), y, **kwargs)) == pytest.approx(final, rel=1e-6)
    if name == "poisson":
        assert 3.0 < float(lik.rate_scale) < 12.0  # truth 6
    if name == "negative_binomial":
        assert 1.0 < float(lik.total_count) < 20.0  # truth 3, started at 0.7


def test_binomial_cavi_minibatch_with_trials():
    x, y, kwargs, lik = _toy("binomial", n=60)
    model = SVGP(torch.linspace(-3, 3, 8).unsqueeze(-1))
    cavi = CAVI(model, lik, num_data=60, step_size=lambda t: (t + 2.0) ** -0.7)
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        idx = torch.randperm(60, generator=g)[:20]
        cavi.step(x[idx], y[idx], trials=kwargs["trials"][idx])
    reference = SVGP(torch.linspace(-3, 3, 8).unsqueeze(-1))
    full = CAVI(reference, BinomialLogitLikelihood(), num_data=60).fit(x, y, max_iter=100, **kwargs)
    assert float(cavi.elbo(x, y, **kwargs)) == pytest.approx(full.elbo[-1], rel=2e-2)


# ================================================================================================ predictive
@pytest.mark.parametrize("name", NAMES)
def test_marginal_matches_monte_carlo(name):
    g = torch.Generator().manual_seed(6)
    m, s = _marginals(5, g)
    q_f = gpytorch.distributions.MultivariateNormal(m, torch.diag(s))
    kwargs = {"trials": torch.tensor([0.0, 1.0, 4.0, 9.0, 20.0])} if name == "binomial" else {}
    lik = {
        "binomial": BinomialLogitLikelihood(),
        "poisson": PoissonLogitLikelihood(rate_scale=7.5),
        "negative_binomial": NegativeBinomialLogitLikelihood(total_count=2.6),
    }[name]
    predictive = lik(q_f, **kwargs)
    torch.manual_seed(6)
    f = q_f.sample(torch.Size([200_000]))
    y = lik(f, **kwargs).sample()
    se = y.std(0) / math.sqrt(y.shape[0])
    assert ((predictive.mean - y.mean(0)).abs() <= 5 * se + 1e-12).all()
    top = 5000 if name == "negative_binomial" else 400  # the NB mixture has a heavy right tail
    support = torch.arange(float(top)).unsqueeze(-1).expand(top, 5)
    if name == "binomial":  # the pmf on 0..t, zero beyond
        trials = kwargs["trials"]
        pmf = torch.where(support <= trials, predictive.log_prob(torch.minimum(support, trials)).exp(), 0.0)
    else:
        pmf = predictive.log_prob(support).exp()
    assert torch.allclose(pmf.sum(0), torch.ones(5), atol=1e-9)
    empirical = (y[:, :, None] == torch.arange(3.0)).double().mean(0)  # P(y = 0, 1, 2) per datum
    assert ((empirical - pmf[:3].T).abs() <= 5 * (empirical * (1 - empirical) / y.shape[0]).sqrt() + 1e-4).all()
    assert torch.allclose(predictive.log_prob(y[0]), lik.log_marginal(y[0], q_f, **kwargs), rtol=1e-12)


# ================================================================================================ drop-in GPyTorch
class _PlainSVGP(gpytorch.models.ApproximateGP):
    def __init__(self, inducing_points):
        q_u = gpytorch.variational.CholeskyVariationalDistribution(inducing_points.size(-2))
        strategy = gpytorch.variational.VariationalStrategy(self, inducing_points, q_u, learn_inducing_locations=True)
        super().__init__(strategy)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


@pytest.mark.parametrize("name", NAMES)
def test_drop_in_plain_gpytorch_svgp(name):
    x, y, kwargs, lik = _toy(name, n=30)
    model = _PlainSVGP(x[:8].clone())
    mll = gpytorch.mlls.VariationalELBO(lik, model, num_data=len(y))
    optimizer = torch.optim.Adam([*model.parameters(), *lik.parameters()], lr=0.05)
    model.train()
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = -mll(model(x), y, **kwargs)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    assert math.isfinite(losses[-1]) and losses[-1] < losses[0]
    for p in lik.parameters():
        assert p.grad is not None and float(p.grad.abs()) > 0
    model.eval()
    with torch.no_grad():
        predictive = lik(model(x), **kwargs)
        assert predictive.mean.shape == y.shape and torch.isfinite(predictive.log_prob(y)).all()


def test_count_cases_are_registered_once():
    names = [case.name for case in COUNT_CASES]
    assert names == ["binomial_logit", "poisson_logit", "negative_binomial_logit"]


def test_samplers_refuse_counts_a_fixed_rate_scale_cannot_reach():
    """E[y | f] = xi sigma(f) < xi: counts averaging 8.4 under the default xi = 1 gave a posterior predictive mean
    of 0.98 silently; the samplers, which hold xi fixed, refuse them (beyond xi + 4 sqrt(xi / N)) and say what to
    do, and accept the same counts with xi above them or with a prior on xi."""
    from gpytorch_augment import GibbsSampler, GPPrior, HMCSampler

    g = torch.Generator().manual_seed(0)
    x = torch.linspace(-2, 2, 40, dtype=torch.float64).unsqueeze(-1)
    y = torch.poisson(torch.full((40,), 8.4, dtype=torch.float64), generator=g)
    prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel()).double()
    for sampler in (GibbsSampler, HMCSampler):
        with pytest.raises(ValueError, match=r"rate_scale = 1,.*rate_scale_prior"):
            sampler(prior, PoissonLogitLikelihood().double(), x, y)
        sampler(prior, PoissonLogitLikelihood(rate_scale=2 * float(y.mean())).double(), x, y)
    GibbsSampler(prior, PoissonLogitLikelihood(rate_scale_prior=(2.0, 0.2)).double(), x, y)
    # counts drawn from the model at its highest rate are within the bound
    at_cap = torch.poisson(torch.full((40,), 3.7, dtype=torch.float64), generator=g)
    PoissonLogitLikelihood(rate_scale=3.7).double().check_fixed_constants(at_cap)
