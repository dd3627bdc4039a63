"""Pairwise preferences on linear observations g = Df: the design's algebra, CAVI against the dense fixed-point
equations and the dense augmented ELBO, exact Gibbs against a brute-force posterior, the predictive, input checks."""

from __future__ import annotations

import math

import gpytorch
import pytest
import torch

from gpytorch_augment import CAVI, AugmentedELBO, GibbsSampler, GPPrior, HMCSampler, PairwiseLogitLikelihood
from gpytorch_augment.core import LinearObservations
from gpytorch_augment.testing import make_cavi_model

PAIRS = torch.tensor([[1, 0], [2, 1], [3, 2], [0, 3], [2, 0], [1, 3], [3, 1]])
LABELS = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64)


def _dense(pairs: torch.Tensor, n: int) -> torch.Tensor:
    D = torch.zeros(len(pairs), n, dtype=torch.float64)
    D[torch.arange(len(pairs)), pairs[:, 0]] = 1.0
    D[torch.arange(len(pairs)), pairs[:, 1]] = -1.0
    return D


def _inputs(n: int = 4) -> torch.Tensor:
    return torch.linspace(-1.5, 1.5, n, dtype=torch.float64).unsqueeze(-1)


def test_design_matches_the_dense_matrix():
    generator = torch.Generator().manual_seed(0)
    design = LinearObservations.comparisons(PAIRS, 4, dtype=torch.float64)
    D = _dense(PAIRS, 4)
    K = torch.randn(2, 4, 4, generator=generator, dtype=torch.float64)
    K = K @ K.mT
    g = torch.randn(2, len(PAIRS), generator=generator, dtype=torch.float64)
    assert torch.allclose(design.apply(K), K @ D.T)
    assert torch.allclose(design.transpose_apply(g), g @ D)
    assert torch.allclose(design.quadratic_diagonal(K), torch.diagonal(D @ K @ D.T, dim1=-2, dim2=-1))


def _fitted(steps: int = 300):
    x = _inputs()
    model = make_cavi_model(1, x).double()
    with torch.no_grad():
        model.mean_module.constant.fill_(0.3)
    likelihood = PairwiseLogitLikelihood()
    cavi = CAVI(model, likelihood, num_data=len(PAIRS))
    cavi.fit(x, LABELS, comparisons=PAIRS, max_iter=steps, tol=1e-14)
    return x, model, likelihood, cavi


def _q_f(model, x):
    """Mean and covariance of q(f) at x (Z = x) from the whitened q(v), and the prior (mu, K + jitter I)."""
    strategy = model.variational_strategy
    terms = strategy.cavi_terms(x, cache=False)
    q = strategy.whitened_q(terms)
    R = q.chol_covariance
    mean = terms.mu_X + terms.A.mT @ q.mean
    cov = terms.A.mT @ R @ R.mT @ terms.A
    return mean, cov, terms.mu_X, terms.L @ terms.L.mT


def test_cavi_fixed_point_solves_the_dense_equations_with_cross_covariances():
    x, model, likelihood, cavi = _fitted()
    mean, cov, mu, K = _q_f(model, x)
    D, s = _dense(PAIRS, 4), 2 * LABELS - 1
    # the CAVI fixed point, written out densely: Λ from c^2 = E g^2 (cross-covariances included), then q(f)
    jitter = model.variational_strategy.jitter_val * torch.eye(4, dtype=torch.float64)  # in q(f)'s variances
    m_g, v_g = D @ mean, torch.diagonal(D @ (cov + jitter) @ D.T)
    c = (m_g**2 + v_g).sqrt()
    lam = torch.tanh(c / 2) / (2 * c)
    precision = torch.linalg.inv(K) + D.T @ torch.diag(lam) @ D
    expected_cov = torch.linalg.inv(precision)
    expected_mean = expected_cov @ (torch.linalg.solve(K, mu) + D.T @ (s / 2))
    # equal up to O(jitter): the strategy factorises K + jitter I and adds the jitter to the data variances
    assert torch.allclose(cov, expected_cov, rtol=0, atol=1e-5)
    assert torch.allclose(mean, expected_mean, rtol=0, atol=1e-5)
    # without the cross-covariances Cov(f_a, f_b) in E g^2 the fixed point would be far off
    c_diagonal = (m_g**2 + torch.diagonal(D @ torch.diag(torch.diagonal(cov)) @ D.T)).sqrt()
    assert float((c_diagonal - c).abs().max()) > 0.1
    # the augmented ELBO per datum: sum of the logistic bounds at the marginals of g, minus KL(q(f) || p(f))
    bound = (s * m_g / 2 - math.log(2) - torch.log(torch.cosh(c / 2))).sum()
    kl = 0.5 * (torch.trace(torch.linalg.solve(K, cov)) + (mean - mu) @ torch.linalg.solve(K, mean - mu) - 4
                + torch.logdet(K) - torch.logdet(cov))  # fmt: skip
    elbo = float(cavi.elbo(x, LABELS, comparisons=PAIRS))
    assert elbo == pytest.approx(float((bound - kl) / len(PAIRS)), rel=1e-5)


def test_predictive_uses_the_joint_posterior():
    x, model, likelihood, _ = _fitted(100)
    with torch.no_grad():
        q_f = model(x)
        probs = likelihood(q_f, comparisons=PAIRS).probs
    generator = torch.Generator().manual_seed(5)
    root = torch.linalg.cholesky(q_f.covariance_matrix)
    draws = q_f.mean + torch.randn(200_000, 4, generator=generator, dtype=torch.float64) @ root.mT
    values = torch.sigmoid(draws @ _dense(PAIRS, 4).T)
    se = values.std(0) / math.sqrt(draws.shape[0])
    assert ((probs - values.mean(0)).abs() < 5 * se).all()


def test_exact_gibbs_matches_a_brute_force_posterior():
    x = _inputs(3)
    pairs, labels = torch.tensor([[1, 0], [2, 1], [2, 0], [0, 1]]), torch.tensor([1.0, 1.0, 0.0, 1.0]).double()
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    kernel.outputscale = 2.0
    prior = GPPrior(gpytorch.means.ZeroMean(), kernel)
    sampler = GibbsSampler(prior, PairwiseLogitLikelihood(), x, labels, comparisons=pairs)
    samples = sampler.sample(1, warmup=25, num_chains=4000, seed=3, progress=False)
    f = samples.f[:, -1]  # one draw per independent chain
    # brute force: importance sampling from the prior, weights prod_j sigma(s_j g_j)
    with torch.no_grad():
        K = kernel(x).to_dense() + sampler.target.jitter * torch.eye(3, dtype=torch.float64)
    generator = torch.Generator().manual_seed(4)
    prior_draws = torch.randn(400_000, 3, generator=generator, dtype=torch.float64) @ torch.linalg.cholesky(K).mT
    log_w = torch.nn.functional.logsigmoid((2 * labels - 1) * (prior_draws @ _dense(pairs, 3).T)).sum(-1)
    w = torch.softmax(log_w, 0)
    exact_mean = w @ prior_draws
    exact_sq = w @ prior_draws**2
    for values, exact in ((f, exact_mean), (f**2, exact_sq)):
        se = values.std(0) / math.sqrt(f.shape[0])  # the importance-sampling error is far smaller
        assert ((values.mean(0) - exact).abs() < 5 * se).all(), (values.mean(0), exact)


def test_more_inputs_than_comparisons():
    # each comparison of fresh points (a BO loop's usual data) leaves more inputs than observations: the number of
    # data that CAVI scales by is the number of comparisons, not of rows of x
    x = _inputs(8)
    pairs, labels = torch.tensor([[1, 0], [3, 2], [5, 4]]), torch.ones(3, dtype=torch.float64)
    model = make_cavi_model(1, x).double()
    trace = CAVI(model, PairwiseLogitLikelihood(), num_data=3).fit(x, labels, comparisons=pairs, max_iter=50)
    assert trace.elbo and all(math.isfinite(value) for value in trace.elbo)
    with torch.no_grad():
        mean = model(x).mean
    assert (mean[pairs[:, 0]] > mean[pairs[:, 1]]).all()


def test_bad_input_raises_naming_it():
    x = _inputs()
    model, likelihood = make_cavi_model(1, x).double(), PairwiseLogitLikelihood()
    cavi = CAVI(model, likelihood, num_data=len(PAIRS))
    with pytest.raises(ValueError, match="comparisons"):
        cavi.step(x, LABELS)
    with pytest.raises(ValueError, match="comparisons must index"):
        cavi.step(x, LABELS, comparisons=PAIRS + 1)
    with pytest.raises(ValueError, match="one label per comparison"):
        cavi.step(x, LABELS[:-1], comparisons=PAIRS)
    with pytest.raises(ValueError, match="two different"):
        cavi.step(x, LABELS, comparisons=torch.cat([PAIRS[:-1], torch.tensor([[2, 2]])]))
    with pytest.raises(ValueError, match="mini-batches"):
        cavi.step(x, LABELS[:3], comparisons=PAIRS[:3])
    with pytest.raises(ValueError, match="batch_size"):
        cavi.fit(x, LABELS, comparisons=PAIRS, batch_size=2)
    prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
    with pytest.raises(ValueError, match="GibbsSampler"):
        HMCSampler(prior, likelihood, x, LABELS, comparisons=PAIRS)
    with pytest.raises(ValueError, match="inducing_points"):
        GibbsSampler(prior, likelihood, x, LABELS, comparisons=PAIRS, inducing_points=x[:2])


def test_more_points_than_comparisons_is_a_full_batch():
    """``num_data`` counts the comparisons, not the points they read: 12 points and 7 comparisons fit in one batch."""
    x = _inputs(12)
    model = make_cavi_model(1, x[::3].clone()).double()
    cavi = CAVI(model, PairwiseLogitLikelihood(), num_data=len(PAIRS))
    trace = cavi.fit(x, LABELS, comparisons=PAIRS * 3, max_iter=20, tol=1e-10)
    assert math.isfinite(trace.elbo[-1]) and trace.elbo[-1] >= trace.elbo[0]


def _five_points_three_inducing():
    x = torch.linspace(-1.0, 1.0, 5, dtype=torch.float64).unsqueeze(-1)
    pairs = torch.tensor([[1, 0], [2, 1], [3, 2], [4, 3], [4, 0], [3, 1]])
    labels = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    model = make_cavi_model(1, x[:3]).double()
    return x, pairs, labels, model


@pytest.mark.parametrize("num_comparisons", [6, 3])
def test_augmented_elbo_is_the_bound_at_the_comparisons(num_comparisons):
    """AugmentedELBO compared the number of comparisons with the number of points (an error naming the internal
    shape (3, n) unless they happened to agree) and took the bound at f, not at g = f_a - f_b. At q(f) = CAVI's, it
    is CAVI's augmented ELBO per comparison."""
    torch.manual_seed(0)
    x, pairs, labels, model = _five_points_three_inducing()
    pairs, labels = pairs[:num_comparisons], labels[:num_comparisons]
    likelihood = PairwiseLogitLikelihood()
    cavi = CAVI(model, likelihood, num_data=num_comparisons)
    cavi.fit(x, labels, comparisons=pairs, max_iter=5)
    model.eval()  # GPyTorch's training-mode q(f) keeps only the marginal variances exact, not the covariances
    bound = AugmentedELBO(likelihood, model, num_data=num_comparisons)(model(x), labels, comparisons=pairs)
    torch.testing.assert_close(bound.detach(), cavi.elbo(x, labels, comparisons=pairs), rtol=0, atol=1e-10)
    kl = model.variational_strategy.kl_divergence().detach()
    mll = AugmentedELBO(likelihood, model, num_data=num_comparisons)
    given = mll(model(x), labels, comparisons=pairs, kl_divergence=kl)
    torch.testing.assert_close(given.detach(), bound.detach())


def test_zero_comparisons_raise_naming_comparisons():
    torch.manual_seed(0)
    x, _, _, model = _five_points_three_inducing()
    likelihood, pairs, labels = PairwiseLogitLikelihood(), torch.zeros(0, 2, dtype=torch.long), torch.zeros(0)
    model.train()
    q_f = model(x)
    calls = {
        "Gibbs": lambda: GibbsSampler(model, likelihood, x, labels, comparisons=pairs),
        "expected_log_prob": lambda: likelihood.expected_log_prob(labels, q_f, comparisons=pairs),
        "VariationalELBO": lambda: gpytorch.mlls.VariationalELBO(likelihood, model, 1)(q_f, labels, comparisons=pairs),
        "AugmentedELBO": lambda: AugmentedELBO(likelihood, model, 1)(q_f, labels, comparisons=pairs),
        "CAVI.fit": lambda: CAVI(model, likelihood, num_data=1).fit(x, labels, comparisons=pairs),
        "predictive": lambda: likelihood(q_f, comparisons=pairs),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match="^comparisons holds no pairs"):
            call()
            pytest.fail(name)


def test_comparisons_are_whole_indices_at_every_entry_point_and_stored_exactly():
    x = _inputs()
    likelihood = PairwiseLogitLikelihood()
    prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
    for bad in (PAIRS.double() + 0.7 * (PAIRS == 1), PAIRS > 1):
        with pytest.raises(ValueError, match="comparisons must hold integer indices"):
            CAVI(make_cavi_model(1, x).double(), likelihood, num_data=len(PAIRS)).fit(
                x, LABELS, comparisons=bad, max_iter=1
            )
        with pytest.raises(ValueError, match="comparisons must hold integer indices"):
            GibbsSampler(prior, likelihood, x, LABELS, comparisons=bad)
    # labels in a narrow float dtype: every index is stored exactly (above 256, 2048 and 2**24 a bfloat16, float16
    # and float32 target would round an index to a neighbour)
    for dtype, index in ((torch.bfloat16, 257), (torch.float16, 2049), (torch.float32, 2**24 + 1)):
        pairs = torch.tensor([[index, 0], [1, index - 2]])
        target = likelihood.check_targets(torch.ones(2, dtype=dtype), comparisons=pairs)
        assert torch.equal(likelihood.split_targets(target)[1], pairs), dtype
        with pytest.raises(ValueError, match=f"found indices in 0..{index}"):
            likelihood.observation_design(target, 5)


def test_log_prob_grad_is_log_prob_and_grads_gradient_to_the_bit():
    """At the comparisons' values g, ``log_prob_grad`` returns the gradient of ``log_prob_and_grad`` exactly (the
    rule of every likelihood; the shared suite checks the registered ones)."""
    likelihood = PairwiseLogitLikelihood()
    y = likelihood.check_targets(LABELS, comparisons=PAIRS)
    g = torch.randn(3, len(PAIRS), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    value, grad = likelihood.log_prob_and_grad(y, g)
    assert value.shape == grad.shape == g.shape
    assert torch.equal(likelihood.log_prob_grad(y, g), grad)
    torch.testing.assert_close(grad, LABELS - torch.sigmoid(g))
