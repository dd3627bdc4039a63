r"""The VI-Gibbs sampler (``GibbsSampler(..., inducing_points=Z, alpha=α)``).

* (a) the closed-form :math:`q^*_\alpha(u)` against independent formulas for a Gaussian pseudo-likelihood:
  Titsias/SGPR for :math:`\alpha \to 0`, Snelson & Ghahramani's FITC for :math:`\alpha = 1`, and a Power-EP
  site-update fixed point iterated here for :math:`\alpha = 0.5`; then the whole chain (``sample``) on a Gaussian
  tilt, where the u-draws are i.i.d. from :math:`q^*_\alpha` and :math:`f - E[f \mid u]` has variance :math:`d`;
* (b) with :math:`Z = X` every :math:`\alpha` reproduces the exact sampler's posterior within Monte-Carlo error;
* (c) :math:`\alpha = 0` is the CAVI :math:`q(v)` of the sampled statistics (the previous inducing-point u-draw);
* (d) a bad ``alpha`` raises a ``ValueError`` naming it;
* every registered likelihood (multi-latent and ``latent_blocks`` included) runs with ``alpha = 0.5`` through the
  unchanged ``PosteriorSamples`` API (u and f draws, summary, predict, ArviZ, resume).

What a test can check for :math:`\alpha > 0` and :math:`Z \ne X`: the chain targets an approximation, not a known
joint, so there is no joint-distribution (Geweke) test; every step is checked against its own closed form instead
(the Ω-step is the exact sampler's, covered by the shared suite; the (u, f)-step here), and the whole chain against
the exact one where the approximation is exact (:math:`Z = X`, also the Geweke test in ``test_geweke.py``).
"""

from __future__ import annotations

import math

import pytest
import torch

from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler
from gpytorch_augment.testing import gp_data
from tests.inference.test_gibbs import Z_TOL, PlainGP, _one_thread, tiny_problem  # noqa: F401 (autouse fixture)
from tests.likelihoods.registry import CASES
from tests.models import SVGP, make_gaussian_tilt_likelihood


def _problem(n: int = 9, m: int = 3, seed: int = 0):
    """A 1-D problem with inducing inputs inside the data range, random potentials and positive precisions."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, 1, generator=g) * 4).double()
    Z = torch.linspace(0.3, 3.7, m, dtype=torch.float64).unsqueeze(-1)
    h = torch.randn(n, generator=g, dtype=torch.float64)
    lam = 0.5 + 2 * torch.rand(n, generator=g, dtype=torch.float64)
    return x, Z, h, lam


def _blocks(model, x, Z):
    """Independent prior blocks: μ_Z, μ_X, K_ZZ, K_ZX, diag K_XX (float64, no jitter)."""
    with torch.no_grad():
        prior = model.forward(torch.cat([Z, x]))
        mu, K = prior.mean, prior.covariance_matrix
    m = Z.shape[0]
    return mu[:m], mu[m:], K[:m, :m], K[:m, m:], K[m:, m:].diagonal()


def _posterior_from_noise(model, x, Z, y, noise):
    r"""Posterior over :math:`u` of :math:`y = f + \varepsilon`, :math:`\varepsilon \sim \mathcal N(0,
    \mathrm{diag}(\text{noise}))`, with :math:`f \mid u` projected (SGPR, Titsias 2009):
    :math:`\Sigma = (K_{ZZ} + K_{ZX}N^{-1}K_{XZ})^{-1}`, :math:`m = \mu_Z + K_{ZZ}\Sigma K_{ZX}N^{-1}(y - \mu_X)`,
    :math:`S = K_{ZZ}\Sigma K_{ZZ}`. FITC (Snelson & Ghahramani 2006) is the same with
    :math:`N = \mathrm{diag}(K_{XX} - Q_{XX}) + \mathrm{diag}(\text{noise})`."""
    mu_Z, mu_X, Kzz, Kzx, _ = _blocks(model, x, Z)
    Ninv = torch.diag(1 / noise)
    Sigma = torch.linalg.inv(Kzz + Kzx @ Ninv @ Kzx.T)
    mean = mu_Z + Kzz @ Sigma @ Kzx @ Ninv @ (y - mu_X)
    return mean, Kzz @ Sigma @ Kzz


def _titsias(model, x, Z, h, lam):
    """SGPR with pseudo-observations y = h/λ and noise 1/λ."""
    return _posterior_from_noise(model, x, Z, h / lam, 1 / lam)


def _fitc(model, x, Z, h, lam):
    """FITC: noise 1/λ_i plus the Nyström residual k_ii - q_ii."""
    _, _, Kzz, Kzx, kxx = _blocks(model, x, Z)
    q_diag = (Kzx * torch.linalg.solve(Kzz, Kzx)).sum(0)
    return _posterior_from_noise(model, x, Z, h / lam, 1 / lam + (kxx - q_diag))


def _power_ep(model, x, Z, h, lam, alpha: float, sweeps: int = 50):
    r"""Power EP (Minka 2004; Bui, Yan & Turner 2017) over :math:`u` with one Gaussian site per datum, iterated here:
    cavity :math:`q / t_i^\alpha`; tilted :math:`\text{cavity}(u)\,p(f_i \mid u)\,e^{\alpha(h_i f_i - \lambda_i
    f_i^2/2)}`, moment-matched by conditioning the joint Gaussian of :math:`(u, f_i)`; new site
    :math:`(\text{proj}/\text{cavity})^{1/\alpha}`; :math:`q = p(u)\prod_i t_i`. Sites start at 1."""
    mu_Z, mu_X, Kzz, Kzx, kxx = _blocks(model, x, Z)
    W = torch.linalg.solve(Kzz, Kzx)  # f_i | u = mu_i + w_i^T (u - mu_Z), variance d_i
    d = kxx - (Kzx * W).sum(0)
    n, m = x.shape[0], Z.shape[0]
    prior_prec = torch.linalg.inv(Kzz)
    prior_shift = prior_prec @ mu_Z
    site_shift, site_prec = torch.zeros(n, m, dtype=x.dtype), torch.zeros(n, m, m, dtype=x.dtype)
    for _ in range(sweeps):
        largest = 0.0
        for i in range(n):
            prec = prior_prec + site_prec.sum(0)
            shift = prior_shift + site_shift.sum(0)
            cav_prec, cav_shift = prec - alpha * site_prec[i], shift - alpha * site_shift[i]
            S_c = torch.linalg.inv(cav_prec)
            m_c = S_c @ cav_shift
            w = W[:, i]
            m_f, v_f, c = mu_X[i] + w @ (m_c - mu_Z), w @ S_c @ w + d[i], S_c @ w
            v_new = 1 / (1 / v_f + alpha * lam[i])
            m_new = v_new * (m_f / v_f + alpha * h[i])
            m_u = m_c + c * (m_new - m_f) / v_f
            S_u = S_c - torch.outer(c, c) * (v_f - v_new) / v_f**2
            P_u = torch.linalg.inv(S_u)
            new_prec, new_shift = (P_u - cav_prec) / alpha, (P_u @ m_u - cav_shift) / alpha
            change = max(float((new_prec - site_prec[i]).abs().max()), float((new_shift - site_shift[i]).abs().max()))
            largest = max(largest, change)
            site_prec[i], site_shift[i] = new_prec, new_shift
        if largest < 1e-13:
            break
    assert largest < 1e-13, "Power EP did not converge"
    S = torch.linalg.inv(prior_prec + site_prec.sum(0))
    return S @ (prior_shift + site_shift.sum(0)), S


def _sampler(x, Z, alpha, jitter=0.0, likelihood=None, mean_constant=0.4):
    likelihood = likelihood if likelihood is not None else make_gaussian_tilt_likelihood(0.5)
    y = torch.zeros(x.shape[0], dtype=x.dtype)
    model = PlainGP(mean_constant=mean_constant).double()
    return GibbsSampler(model, likelihood, x, y, inducing_points=Z, alpha=alpha, jitter=jitter), model


# ---------------------------------------------------------------------------------------------- (a) closed form
@pytest.mark.parametrize("alpha", [0.0, 1e-9, 0.5, 1.0])
def test_q_alpha_matches_titsias_fitc_and_power_ep(alpha):
    """q*_α(u) of the sampler equals Titsias's q(u) (α → 0), FITC (α = 1) and the Power-EP fixed point (α = 0.5),
    each computed independently here (no jitter: the formulas are then exact)."""
    x, Z, h, lam = _problem()
    sampler, model = _sampler(x, Z, alpha)
    q = sampler.kernel.inducing_distribution(h, lam)
    if alpha < 1e-6:
        mean, cov = _titsias(model, x, Z, h, lam)
        tol = 1e-9 + 10 * alpha
    elif alpha == 1.0:
        mean, cov = _fitc(model, x, Z, h, lam)
        tol = 1e-9
    else:
        mean, cov = _power_ep(model, x, Z, h, lam, alpha)
        tol = 1e-9
    assert torch.allclose(q.mean, mean, rtol=tol, atol=tol), (q.mean, mean)
    assert torch.allclose(q.covariance_matrix, cov, rtol=tol, atol=tol)
    # α matters here (d_i > 0): the three solutions are distinct
    if alpha == 0.5:
        assert (mean - _titsias(model, x, Z, h, lam)[0]).abs().max() > 1e-3
        assert (mean - _fitc(model, x, Z, h, lam)[0]).abs().max() > 1e-3


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_chain_on_a_gaussian_tilt_draws_q_alpha_and_p_f_given_u(alpha):
    """With a Gaussian tilt (h, λ do not depend on Ω) the VI-Gibbs chain draws u i.i.d. from q*_α (the closed forms of
    the test above) and f_i ~ p(f_i | u): checked on ``sample`` over 2·10^4 draws, M = 3 < N = 9."""
    noise = 0.5
    x, Z, _, _ = _problem()
    sampler, model = _sampler(x, Z, alpha, jitter=1e-8, likelihood=make_gaussian_tilt_likelihood(noise))
    y = torch.sin(2 * x[:, 0]).double()
    sampler = GibbsSampler(model, sampler.target.likelihood, x, y, inducing_points=Z, alpha=alpha, jitter=1e-8)
    h, lam = y / noise, torch.full_like(y, 1 / noise)
    reference = {0.0: _titsias, 1.0: _fitc}.get(alpha)
    mean, cov = reference(model, x, Z, h, lam) if reference else _power_ep(model, x, Z, h, lam, alpha)
    samples = sampler.sample(5, warmup=1, num_chains=4000, seed=1, progress=False)
    u = samples.u.reshape(-1, Z.shape[0])
    S = u.shape[0]
    z_mean = (u.mean(0) - mean) / (cov.diagonal() / S).sqrt()
    se_cov = ((cov.diagonal()[:, None] * cov.diagonal()[None, :] + cov**2) / S).sqrt()
    z_cov = (torch.cov(u.T) - cov) / se_cov
    assert z_mean.abs().max() <= Z_TOL and z_cov.abs().max() <= Z_TOL, (z_mean, z_cov)
    # f - E[f | u] ~ N(0, d), independent of u
    terms = sampler.target.terms
    v = torch.linalg.solve_triangular(terms.L[0], (u - terms.mu_Z[0]).unsqueeze(-1), upper=False).squeeze(-1)
    r = samples.f.reshape(S, -1) - (terms.mu[0] + v @ terms.A[0])
    d = terms.d[0]
    assert d.min() > 1e-4
    z_r = r.mean(0) / (d / S).sqrt()
    z_var = (r.var(0) - d) / (d * math.sqrt(2 / S))
    assert z_r.abs().max() <= Z_TOL and z_var.abs().max() <= Z_TOL, (z_r, z_var)


# ---------------------------------------------------------------------------------------------- (b) Z = X
def test_z_equal_x_reproduces_exact_posterior_for_every_alpha():
    """Z = X: d = 0, q*_α is the exact conditional for every α; the moments of f agree with the exact sampler's."""
    model, x = tiny_problem(3, seed=1, scale=3.0)
    y = torch.tensor([1.0, 0.0, 1.0])
    likelihood = BernoulliLogitLikelihood()
    exact = GibbsSampler(model, likelihood, x, y).sample(150, warmup=20, num_chains=300, seed=4, progress=False)
    for alpha in (0.0, 0.5, 1.0):
        sparse = GibbsSampler(model, likelihood, x, y, inducing_points=x, alpha=alpha)
        assert float(sparse.target.terms.d.max()) == 0.0
        b = sparse.sample(150, warmup=20, num_chains=300, seed=5, progress=False)
        for fn in (lambda f: f, lambda f: f**2):
            ma, mb = fn(exact.f).mean(1), fn(b.f).mean(1)
            se = (ma.var(0) / ma.shape[0] + mb.var(0) / mb.shape[0]).sqrt()
            z = (ma.mean(0) - mb.mean(0)) / se
            assert z.abs().max() <= Z_TOL, (alpha, z)


# ---------------------------------------------------------------------------------------------- (c) α = 0 is CAVI
def test_alpha_zero_is_the_cavi_q_of_the_sampled_statistics():
    """α = 0: q*_0(u) is the CAVI q(v) of the same (h, λ) (``CAVIVariationalStrategy.cavi_update``), mapped to u; the
    sampler's u-draws follow it (10^5 draws), and α > 0 moves it."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(12, 1, generator=g).double() * 4
    Z = torch.linspace(0, 4, 4, dtype=torch.float64).unsqueeze(-1)
    y = (torch.rand(12, generator=g) > 0.5).double()
    model = SVGP(Z, mean_constant=0.4).double()
    likelihood = BernoulliLogitLikelihood()
    f = torch.randn(12, generator=g, dtype=torch.float64)
    h, lam = likelihood.potential_and_precision(y, likelihood.sample_aux(y, f, generator=g), f)
    q_v = model.variational_strategy.cavi_update(x, h, lam)
    sampler = GibbsSampler(model, likelihood, x, y, inducing_points=Z)
    L, mu_Z = sampler.target.terms.L[0], sampler.target.terms.mu_Z[0]
    R = L @ q_v.chol_covariance
    q = sampler.kernel.inducing_distribution(h, lam)
    assert torch.allclose(q.mean, mu_Z + L @ q_v.mean, rtol=1e-10, atol=1e-10)
    assert torch.allclose(q.covariance_matrix, R @ R.T, rtol=1e-10, atol=1e-10)
    S = 100_000
    u = sampler.kernel.sample_latent(h.expand(S, -1), lam.expand(S, -1), generator=g)["u"]
    z = (u.mean(0) - q.mean) / (q.covariance_matrix.diagonal() / S).sqrt()
    assert z.abs().max() <= Z_TOL, z
    moved = GibbsSampler(model, likelihood, x, y, inducing_points=Z, alpha=1.0).kernel.inducing_distribution(h, lam)
    assert (moved.mean - q.mean).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------- (d) bad alpha
@pytest.mark.parametrize("alpha", [-0.1, 1.5, float("nan"), float("inf"), "0.5", True, None])
def test_bad_alpha_raises(alpha):
    x, Z, _, _ = _problem()
    with pytest.raises(ValueError, match="alpha"):
        _sampler(x, Z, alpha)


def test_alpha_without_inducing_points_raises():
    x, _, _, _ = _problem()
    with pytest.raises(ValueError, match="alpha"):
        GibbsSampler(PlainGP(), make_gaussian_tilt_likelihood(0.5), x, torch.zeros(9), alpha=0.5)
    GibbsSampler(PlainGP(), make_gaussian_tilt_likelihood(0.5), x, torch.zeros(9), alpha=0.0)  # the default is fine


# ---------------------------------------------------------------------------------------------- every likelihood
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_likelihood_runs_with_alpha(case):
    """α = 0.5 with every registered likelihood: shapes, finiteness, summary, predict, resume (exact continuation),
    and per latent the u-draws of ``sample_latent`` follow ``inducing_distribution``."""
    data = gp_data(case, n=20)
    T = case.num_latents
    model = PlainGP(mean_constant=0.3, batch_shape=torch.Size([T]) if T > 1 else torch.Size()).double()
    Z = torch.linspace(-3, 3, 5, dtype=torch.float64).unsqueeze(-1)
    sampler = GibbsSampler(model, data.likelihood, data.x, data.y, inducing_points=Z, alpha=0.5, **data.kwargs)
    full = sampler.sample(8, warmup=2, num_chains=2, seed=3, progress=False)
    lat = () if T == 1 else (T,)
    assert full.f.shape == (2, 8, *lat, 20) and full.u.shape == (2, 8, *lat, 5)
    assert torch.isfinite(full.f).all() and torch.isfinite(full.u).all()
    assert full.summary("u").mean.shape == (*lat, 5)
    first = sampler.sample(3, warmup=2, num_chains=2, seed=3, progress=False)
    resumed = sampler.resume(first, 5, progress=False)
    assert torch.equal(resumed.u, full.u) and torch.equal(resumed.f, full.f)
    # (predict with per-draw logistic-softmax class scales fails for the exact sampler as well)
    if not full.hyperparameters:
        new_kwargs = {k: v.to(data.y.dtype) for k, v in case.make_kwargs(torch.Size([3]), data.generator).items()}
        pred = full.predict(torch.linspace(-2, 2, 3, dtype=torch.float64).unsqueeze(-1), **new_kwargs)
        assert torch.isfinite(pred.f_mean).all()

    g = torch.Generator().manual_seed(2)
    shape = (T, 20) if T > 1 else (20,)
    h, lam = torch.randn(shape, generator=g).double(), 0.2 + torch.rand(shape, generator=g).double()
    q = sampler.kernel.inducing_distribution(h, lam)
    S = 20_000
    u = sampler.kernel.sample_latent(h.expand(S, *shape), lam.expand(S, *shape), generator=g)["u"]
    z = (u.mean(0) - q.mean) / (q.covariance_matrix.diagonal(dim1=-1, dim2=-2) / S).sqrt()
    assert z.abs().max() <= Z_TOL, z


def test_arviz_export_of_a_sparse_run():
    pytest.importorskip("arviz")
    x, Z, _, _ = _problem()
    sampler, _ = _sampler(x, Z, 0.5, jitter=1e-8)
    idata = sampler.sample(4, warmup=1, num_chains=2, seed=0, progress=False).to_arviz()
    assert idata.posterior["u"].shape == (2, 4, 3) and idata.posterior["f"].shape == (2, 4, 9)
