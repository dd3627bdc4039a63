"""Tests for :class:`gpytorch_augment.distributions.PolyaGamma` (docs/maths/binary.md)."""

from __future__ import annotations

import math
import time
from functools import lru_cache

import mpmath
import numpy as np
import pytest
import torch
from scipy import integrate
from torch.distributions import kl_divergence

from gpytorch_augment._numerics import pg_kl, pg_mean
from gpytorch_augment._random import numpy_generator, seeded_by
from gpytorch_augment.distributions import PolyaGamma
from gpytorch_augment.distributions.polya_gamma import _kl_polyagamma_polyagamma

B_VALUES = (0.5, 1.0, 3.7, 10.0, 20.0)
C_VALUES = (0.0, 0.7, 4.0)
# Upper integration limits: the density beyond is < ~1e-7 in mass, and the series is still accurate up to there
# (see the PolyaGamma docstring: it cancels catastrophically further out, the more so the larger b).
X_HI = {0.5: 5.0, 1.0: 5.0, 3.7: 6.0, 10.0: 8.5, 20.0: 11.5}


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-7, atol: float = 1e-7) -> None:
    """``torch.testing.assert_close`` without its ~2 s first-call import cost; dtypes may differ."""
    actual, expected = torch.broadcast_tensors(actual.double(), expected.double())
    err = (actual - expected).abs()
    bad = ~(err <= atol + rtol * expected.abs())
    assert not bad.any(), f"max abs err {err.max().item():.3g}: {actual[bad].tolist()} vs {expected[bad].tolist()}"


def _pg(b: float, c: float, dtype: torch.dtype = torch.float64) -> PolyaGamma:
    return PolyaGamma(torch.tensor(b, dtype=dtype), torch.tensor(c, dtype=dtype), validate_args=False)


@lru_cache(maxsize=None)
def _log_grid(b: float, panels: int = 80, order: int = 24) -> tuple[np.ndarray, np.ndarray]:
    """Composite Gauss-Legendre nodes/weights in u = log x on [b^2/480, X_HI[b]]; weights include dx/du = x."""
    t, w = np.polynomial.legendre.leggauss(order)
    edges = np.linspace(math.log(b * b / 480), math.log(X_HI[b]), panels + 1)
    half, mid = np.diff(edges)[:, None] / 2, (edges[:-1] + edges[1:])[:, None] / 2
    x = np.exp((mid + half * t).ravel())
    return x, (half * w).ravel() * x


def _density_on_grid(b: float, c: float) -> tuple[np.ndarray, np.ndarray]:
    x, wx = _log_grid(b)
    p = _pg(b, c).log_prob(torch.from_numpy(x)).exp().numpy()
    assert np.all(np.isfinite(p))
    return x, wx * p


def _mp_log_pg(x: float, b: float, c: float) -> mpmath.mpf:
    """High-precision log PG(x | b, c) from the alternating series (docs/maths/binary.md) (terms summed until
    negligible) and the tilt."""
    x, b, c = mpmath.mpf(x), mpmath.mpf(b), mpmath.mpf(c)
    assert x > 0
    total, n, biggest = mpmath.mpf(0), 0, mpmath.mpf(0)
    while n < 100_000:
        m = 2 * n + b
        term = mpmath.exp(mpmath.loggamma(n + b) - mpmath.loggamma(n + 1) + mpmath.log(m) - m * m / (8 * x))
        total += term if n % 2 == 0 else -term
        biggest = max(biggest, term)
        if n > 3 and term < biggest * mpmath.mpf(10) ** -60:
            break
        n += 1
    log_pg0 = (b - 1) * mpmath.log(2) - mpmath.loggamma(b) - mpmath.log(2 * mpmath.pi * x**3) / 2 + mpmath.log(total)
    return log_pg0 + b * mpmath.log(mpmath.cosh(c / 2)) - c * c * x / 2


# ----------------------------------------------------------------------------------------------------------------
# density


@pytest.mark.parametrize("c", C_VALUES)
@pytest.mark.parametrize("b", B_VALUES)
def test_log_prob_normalises(b: float, c: float) -> None:
    _, wp = _density_on_grid(b, c)
    assert abs(wp.sum() - 1.0) < 1e-6


@pytest.mark.parametrize("c", C_VALUES)
@pytest.mark.parametrize("b", B_VALUES)
def test_mean_variance_match_integrated_density(b: float, c: float) -> None:
    x, wp = _density_on_grid(b, c)
    d = _pg(b, c)
    mean = (wp * x).sum()
    var = (wp * x * x).sum() - mean**2
    assert mean == pytest.approx(d.mean.item(), rel=1e-6)
    assert var == pytest.approx(d.variance.item(), rel=1e-5)


@pytest.mark.parametrize(("b", "c"), [(1.0, 0.0), (10.0, 4.0)])
def test_mean_variance_scipy_quad(b: float, c: float) -> None:
    """Same check with scipy's adaptive quadrature (scalar log_prob calls) instead of the fixed grid."""
    d = _pg(b, c)

    def moments(u: float) -> np.ndarray:
        x = math.exp(u)
        p = math.exp(d.log_prob(torch.tensor(x, dtype=torch.float64)).item())
        return np.array([x * p, x * x * p, x**3 * p])  # [1, x, x^2] * p(x) * dx/du

    (m0, m1, m2), _ = integrate.quad_vec(moments, math.log(b * b / 480), math.log(X_HI[b]), epsabs=1e-10, epsrel=1e-9)
    assert m0 == pytest.approx(1.0, abs=1e-6)
    assert m1 == pytest.approx(d.mean.item(), rel=1e-6)
    assert m2 - m1**2 == pytest.approx(d.variance.item(), rel=1e-5)
    n0, _ = integrate.quad(lambda u: moments(u)[0], math.log(b * b / 480), math.log(X_HI[b]), epsabs=1e-10)
    assert n0 == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("b", B_VALUES)
def test_laplace_transform_identity(b: float) -> None:
    r""":math:`E_{\mathrm{PG}(b,0)} e^{-t\omega} = \cosh^{-b}\sqrt{t/2}` by quadrature of the density."""
    x, wp = _density_on_grid(b, 0.0)
    for t in (0.1, 1.0, 5.0, 25.0):
        expected = math.cosh(math.sqrt(t / 2)) ** (-b)
        assert (wp * np.exp(-t * x)).sum() == pytest.approx(expected, rel=1e-7)


@pytest.mark.parametrize("b", B_VALUES)
def test_log_prob_small_x_matches_mpmath(b: float) -> None:
    mpmath.mp.dps = 50
    x = torch.tensor([1e-3, 2e-3, 5e-3, 1e-2], dtype=torch.float64)
    for c in C_VALUES:
        lp = _pg(b, c).log_prob(x)
        assert torch.isfinite(lp).all()
        ref = torch.tensor([float(_mp_log_pg(xi, b, c)) for xi in x.tolist()], dtype=torch.float64)
        _assert_close(lp, ref, rtol=1e-12, atol=1e-10)
        lp32 = _pg(b, c, torch.float32).log_prob(x.float())
        assert lp32.dtype == torch.float32 and torch.isfinite(lp32).all()
        _assert_close(lp32.double(), ref, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("b", [1.0, 3.7, 10.0, 20.0])
def test_log_prob_bulk_matches_mpmath(b: float) -> None:
    """Up to mean + 3 sd (where the float64 series is still accurate for b <= 20)."""
    mpmath.mp.dps = 60
    d = _pg(b, 0.7)
    x = (d.mean + d.variance.sqrt() * torch.tensor([-1.0, 0.0, 1.0, 3.0], dtype=torch.float64)).clamp_min(0.2 * d.mean)
    ref = torch.tensor([float(_mp_log_pg(xi, b, 0.7)) for xi in x.tolist()], dtype=torch.float64)
    _assert_close(d.log_prob(x), ref, rtol=0, atol=1e-8)


def test_log_prob_outside_support_and_tilting_identity() -> None:
    d0, d = _pg(2.5, 0.0), _pg(2.5, -3.0)
    x = torch.tensor([0.05, 0.4, 1.3], dtype=torch.float64)
    tilt = 2.5 * math.log(math.cosh(1.5)) - 4.5 * x
    _assert_close(d.log_prob(x), d0.log_prob(x) + tilt, rtol=0, atol=1e-12)
    outside = d.log_prob(torch.tensor([0.0, -1.0, math.inf], dtype=torch.float64))
    assert (outside == -math.inf).all()
    assert torch.isnan(d.log_prob(torch.tensor(math.nan, dtype=torch.float64)))
    with pytest.raises(ValueError):
        PolyaGamma(torch.tensor(1.0), torch.tensor(0.0), validate_args=True).log_prob(torch.tensor(-1.0))


# ----------------------------------------------------------------------------------------------------------------
# sampling


# One case per branch of the sampler routing (see ``_sample_numpy``), including the regions where polyagamma's default
# hybrid rule is wrong: (3.7, 0) and (0.5, 2) are biased with it, (1, 500) returns a constant.
SAMPLE_CASES = [(1.0, 0.0), (3.7, 0.0), (0.5, 2.0), (2.5, 30.0), (1.0, 500.0), (20.0, 4.0), (300.0, 50.0), (1e4, 5.0)]


def test_sample_moments_within_five_standard_errors(device: torch.device) -> None:
    """On the CPU through ``polyagamma``; on a GPU (``--device cuda``) through the torch-native sampler."""
    b = torch.tensor([bc[0] for bc in SAMPLE_CASES], dtype=torch.float64, device=device)
    c = torch.tensor([bc[1] for bc in SAMPLE_CASES], dtype=torch.float64, device=device)
    d = PolyaGamma(b, c)
    torch.manual_seed(0)
    n = 100_000
    s = d.sample((n,))
    assert s.shape == (n, len(SAMPLE_CASES)) and s.dtype == torch.float64 and (s > 0).all()
    assert s.device == b.device
    m, v = s.mean(0), s.var(0)
    m4 = ((s - m) ** 4).mean(0)
    z_mean = (m - d.mean) / (v / n).sqrt()
    z_var = (v - d.variance) / ((m4 - v**2) / n).sqrt()
    assert z_mean.abs().max() < 5, dict(zip(SAMPLE_CASES, z_mean.tolist()))
    assert z_var.abs().max() < 5, dict(zip(SAMPLE_CASES, z_var.tolist()))


def test_tiny_b_with_large_c_samples_with_the_right_moments() -> None:
    """``polyagamma``'s "alternate" method refuses b <= 1e-4 (its internal ValueError broke negative-binomial Gibbs
    with total_count=1e-4): those draws take the gamma series, whose mean and variance are exact."""
    b = torch.tensor([1e-4, 1e-5, 5e-5, 1e-4], dtype=torch.float64)
    c = torch.tensor([16.0, 20.0, 100.0, -40.0], dtype=torch.float64)
    d = PolyaGamma(b, c)
    torch.manual_seed(0)
    n = 200_000
    s = d.sample((n,))
    assert s.shape == (n, 4) and bool(torch.isfinite(s).all()) and bool((s >= 0).all())
    z_mean = (s.mean(0) - d.mean) / (d.variance / n).sqrt()
    assert z_mean.abs().max() < 5, z_mean.tolist()


def test_sample_shapes_dtype_and_no_grad() -> None:
    b = torch.tensor([1.0, 2.5], requires_grad=True)
    c = torch.tensor([[0.0], [3.0], [-3.0]], dtype=torch.float32, requires_grad=True)
    d = PolyaGamma(b, c)
    s = d.sample((4, 5))
    assert s.shape == (4, 5, 3, 2) and s.dtype == torch.float32 and not s.requires_grad
    assert d.sample().shape == (3, 2)
    assert not PolyaGamma.has_rsample
    with pytest.raises(NotImplementedError):
        d.rsample()


def test_large_b_samples_quickly() -> None:
    torch.manual_seed(1)
    d = PolyaGamma(torch.full((4,), 1e4, dtype=torch.float64), torch.tensor([0.0, 5.0, 30.0, 1e4], dtype=torch.float64))
    start = time.perf_counter()
    s = d.sample((2_500,))  # 1e4 draws in total
    assert time.perf_counter() - start < 1.0
    assert torch.isfinite(s).all() and (s > 0).all()
    z = (s.mean(0) - d.mean) / (d.variance / s.shape[0]).sqrt()
    assert z.abs().max() < 5


def test_reproducible_from_torch_seed() -> None:
    d = PolyaGamma(torch.tensor([1.0, 3.7, 20.0, 2.0]), torch.tensor([0.5, 0.5, 0.5, 50.0]))
    torch.manual_seed(3)
    first, second = d.sample((5,)), d.sample((5,))
    assert not torch.equal(first, second)
    torch.manual_seed(3)
    assert torch.equal(d.sample((5,)), first)
    assert torch.equal(d.sample((5,)), second)


def test_reproducible_from_generator_without_touching_global_rng() -> None:
    d = PolyaGamma(torch.tensor([1.0, 3.7]), torch.tensor([0.0, 1.0]))
    state = torch.get_rng_state()
    g = torch.Generator().manual_seed(11)
    a1, a2 = d.sample((6,), generator=g), d.sample((6,), generator=g)
    assert torch.equal(state, torch.get_rng_state())
    assert not torch.equal(a1, a2)
    g2 = torch.Generator().manual_seed(11)
    assert torch.equal(d.sample((6,), generator=g2), a1)
    assert torch.equal(d.sample((6,), generator=g2), a2)


def test_numpy_generator_is_persistent_per_torch_generator() -> None:
    g = torch.Generator().manual_seed(0)
    assert numpy_generator() is numpy_generator()
    assert numpy_generator(g) is numpy_generator(g)
    assert numpy_generator(g) is not numpy_generator()
    assert numpy_generator(torch.default_generator) is numpy_generator()


def test_numpy_generator_works_where_torch_generators_take_no_weak_reference(monkeypatch) -> None:
    """torch 2.11 (the GPU image's) cannot weak-reference a ``torch.Generator``: the draws stay reproducible."""
    import gpytorch_augment._random as random_module

    class NoWeakReferences(dict):
        def get(self, key, default=None):
            raise TypeError("cannot create weak reference to 'torch._C.Generator' object")

    monkeypatch.setattr(random_module, "_EXPLICIT_NP_GENERATORS", NoWeakReferences())
    a = numpy_generator(torch.Generator().manual_seed(3)).random(4)
    b = numpy_generator(torch.Generator().manual_seed(3)).random(4)
    assert a.tolist() == b.tolist()


def test_seeded_by_routes_global_rng_through_generator() -> None:
    state = torch.get_rng_state()
    with seeded_by(torch.Generator().manual_seed(5)):
        a = torch.rand(3)
    with seeded_by(torch.Generator().manual_seed(5)):
        b = torch.rand(3)
    assert torch.equal(a, b)
    assert torch.equal(state, torch.get_rng_state())


# ----------------------------------------------------------------------------------------------------------------
# KL


def test_kl_matches_monte_carlo() -> None:
    b = torch.tensor([1.0, 3.7, 12.0], dtype=torch.float64)
    c = torch.tensor([1.5, 3.0, 0.8], dtype=torch.float64)
    q, p = PolyaGamma(b, c), PolyaGamma(b, torch.zeros(3, dtype=torch.float64))
    torch.manual_seed(2)
    n = 20_000
    s = q.sample((n,))
    diff = q.log_prob(s) - p.log_prob(s)
    assert torch.isfinite(diff).all()
    se = diff.std(0) / math.sqrt(n)
    kl = kl_divergence(q, p)
    assert ((diff.mean(0) - kl).abs() < 5 * se).all()
    _assert_close(kl, pg_kl(b, c))


def test_kl_registration_and_unsupported_pairs() -> None:
    assert torch.distributions.kl._KL_REGISTRY[(PolyaGamma, PolyaGamma)] is _kl_polyagamma_polyagamma
    q = PolyaGamma(torch.tensor([2.0, 2.0]), torch.tensor([1.0, 0.0]))
    _assert_close(kl_divergence(q, PolyaGamma(2.0, torch.zeros(2))), pg_kl(torch.tensor(2.0), q.c))
    assert kl_divergence(q, PolyaGamma(2.0, torch.zeros(2)))[1] == 0
    with pytest.raises(NotImplementedError):
        kl_divergence(q, PolyaGamma(2.0, torch.ones(2)))
    with pytest.raises(NotImplementedError):
        kl_divergence(q, PolyaGamma(3.0, torch.zeros(2)))


# ----------------------------------------------------------------------------------------------------------------
# shapes, b = 0, dtypes and gradients


def test_broadcasting_and_expand() -> None:
    b = torch.tensor([[1.0], [2.0], [3.5]])
    c = torch.tensor([0.0, 0.5, 1.0, 2.0])
    d = PolyaGamma(b, c)
    assert d.batch_shape == (3, 4) and d.event_shape == ()
    assert d.mean.shape == d.variance.shape == (3, 4)
    _assert_close(d.mean, pg_mean(b, c).expand(3, 4))
    assert d.log_prob(torch.full((3, 4), 0.5)).shape == (3, 4)
    assert d.log_prob(torch.rand(7, 1, 1) + 0.1).shape == (7, 3, 4)
    assert d.sample((2,)).shape == (2, 3, 4)
    e = d.expand((5, 3, 4))
    assert isinstance(e, PolyaGamma) and e.batch_shape == (5, 3, 4) and e.sample().shape == (5, 3, 4)
    _assert_close(e.variance, d.variance.expand(5, 3, 4))
    assert kl_divergence(d, PolyaGamma(b, torch.zeros(1))).shape == (3, 4)
    assert PolyaGamma(1.0, c).batch_shape == (4,)
    counts = PolyaGamma(torch.tensor([1, 2]), 0.5)  # integer b (counts) with a float number c
    assert counts.b.dtype == counts.c.dtype == torch.get_default_dtype() and (counts.c == 0.5).all()
    assert PolyaGamma(torch.tensor([3]), torch.tensor([2.0], dtype=torch.float32)).b.dtype == torch.float32


def test_b_zero_is_point_mass_at_zero() -> None:
    d = PolyaGamma(torch.tensor([0.0, 1.0]), torch.tensor([2.0, 2.0]))
    assert d.mean[0] == 0 and d.variance[0] == 0
    assert kl_divergence(d, PolyaGamma(d.b, torch.zeros(2)))[0] == 0
    s = d.sample((100,))
    assert (s[:, 0] == 0).all() and (s[:, 1] > 0).all()
    lp = d.log_prob(torch.tensor([[0.0, 0.3], [0.3, 0.3]]))
    assert lp[0, 0] == 0 and lp[1, 0] == -math.inf and torch.isfinite(lp[:, 1]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_finite_over_c_range(dtype: torch.dtype) -> None:
    c = torch.tensor([0.0, 1e-6, 1e-3, 0.1, 1.0, 10.0, 100.0, 1e3, 1e4], dtype=dtype)
    b = torch.full_like(c, 1.5)
    d = PolyaGamma(b, c)
    for value in (d.mean, d.variance, kl_divergence(d, PolyaGamma(b, torch.zeros_like(c)))):
        assert value.dtype == dtype and torch.isfinite(value).all() and (value >= 0).all()
    lp = d.log_prob(d.mean)
    assert lp.dtype == dtype and torch.isfinite(lp).all()
    s = d.sample()
    assert s.dtype == dtype and torch.isfinite(s).all() and (s > 0).all()
    ref = PolyaGamma(b.double(), c.double())
    _assert_close(d.mean.double(), ref.mean, rtol=1e-5, atol=0)
    _assert_close(d.variance.double(), ref.variance, rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_at_c_zero(dtype: torch.dtype) -> None:
    c = torch.zeros(3, dtype=dtype, requires_grad=True)
    b = torch.tensor([0.5, 1.0, 4.0], dtype=dtype)
    d = PolyaGamma(b, c)
    (g_mean,) = torch.autograd.grad(d.mean.sum(), c)
    (g_kl,) = torch.autograd.grad(kl_divergence(d, PolyaGamma(b, torch.zeros(3, dtype=dtype))).sum(), c)
    (g_lp,) = torch.autograd.grad(d.log_prob(torch.full((3,), 0.3, dtype=dtype)).sum(), c)
    (g_var,) = torch.autograd.grad(d.variance.sum(), c)
    for g in (g_mean, g_kl, g_lp, g_var):
        assert torch.isfinite(g).all() and (g.abs() < 1e-6).all()  # all four are even in c
