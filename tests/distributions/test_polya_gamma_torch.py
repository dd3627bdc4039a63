"""The torch-native Pólya-Gamma sampler (:mod:`gpytorch_augment.distributions.polya_gamma_torch`): exact moments,
the law of ``polyagamma``'s exact samplers (two-sample Kolmogorov-Smirnov) and the exact CDF (small ``b``, both
samplers), reproducibility from a generator, devices and dtypes, bad input, and :class:`PolyaGamma` without
``polyagamma`` installed.

Every check is seeded and can fail: the same moment check rejects the draws of a slightly wrong law."""

from __future__ import annotations

import math
import sys
from functools import partial

import numpy as np
import pytest
import torch
from scipy import stats

from gpytorch_augment._numerics import pg_mean, pg_variance
from gpytorch_augment.distributions import PolyaGamma
from gpytorch_augment.distributions import polya_gamma as pg_module
from gpytorch_augment.distributions.polya_gamma import _sample_numpy, uses_torch_sampler
from gpytorch_augment.distributions.polya_gamma_torch import SUM_MAX, polya_gamma_icdf, sample_pg1, sample_polya_gamma
from tests.distributions.pg_cdf import polya_gamma_cdf

# (b, c): Devroye's two proposals (c small: mostly the exponential; c large: the truncated inverse Gaussian, both of
# its branches z < 1/t and z > 1/t), far tilts, sums (integer b), the gamma series (fractional part, b > SUM_MAX)
CASES = [(1.0, 0.0), (1.0, 1.0), (1.0, 4.0), (1.0, 40.0), (1.0, 3000.0), (3.0, 0.7), (2.5, 0.3), (0.5, 20.0),
         (12.0, 2.0), (100.0, 1.0)]
N = 20_000


def _z_scores(draws: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """z-scores of the sample mean and variance (columns) against the exact ones."""
    n = draws.shape[0]
    m, v = draws.mean(0), draws.var(0)
    m4 = ((draws - m) ** 4).mean(0)
    return (m - pg_mean(b, c)) / (v / n).sqrt(), (v - pg_variance(b, c)) / ((m4 - v * v) / n).sqrt()


def _draws(cases: list[tuple[float, float]], seed: int, device: torch.device | str = "cpu"):
    b = torch.tensor([bc[0] for bc in cases], dtype=torch.float64, device=device)
    c = torch.tensor([bc[1] for bc in cases], dtype=torch.float64, device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    return sample_polya_gamma(b.expand(N, -1), c.expand(N, -1), generator=g), b, c


def test_moments_are_exact_within_five_standard_errors(device: torch.device) -> None:
    draws, b, c = _draws(CASES, seed=0, device=device)
    assert draws.device == b.device and draws.dtype == torch.float64 and bool((draws > 0).all())
    z_mean, z_var = _z_scores(draws, b, c)
    assert z_mean.abs().max() < 5, dict(zip(CASES, z_mean.tolist()))
    assert z_var.abs().max() < 5, dict(zip(CASES, z_var.tolist()))


def test_the_moment_check_rejects_a_slightly_wrong_law() -> None:
    """Draws of PG(b, 1.5 c) and of PG(b + 1/4, c) fail the check of PG(b, c) (it has the power to fail)."""
    cases = [(1.0, 1.0), (3.0, 2.0)]
    draws, b, c = _draws([(bb, 1.5 * cc) for bb, cc in cases], seed=1)
    assert _z_scores(draws, b, c / 1.5)[0].abs().min() > 5
    draws, b, c = _draws([(bb + 0.25, cc) for bb, cc in cases], seed=2)
    assert _z_scores(draws, b - 0.25, c)[0].abs().min() > 5


@pytest.mark.parametrize("b, c", [(1.0, 0.0), (1.0, 2.0), (1.0, 30.0), (4.0, 1.0), (2.5, 0.5), (40.0, 3.0)])
def test_same_law_as_polyagamma_by_kolmogorov_smirnov(b: float, c: float) -> None:
    """Two-sample KS against ``polyagamma``'s exact samplers as the package routes them (``_sample_numpy``; the
    fractional part of 2.5 and b = 40 > SUM_MAX are the gamma series on both sides)."""
    g = torch.Generator().manual_seed(3)
    ours = sample_polya_gamma(torch.full((N,), b), torch.full((N,), c), generator=g).numpy()
    theirs = _sample_numpy(np.full(N, b), np.full(N, c), np.random.default_rng(4))
    assert stats.ks_2samp(ours, theirs).pvalue > 1e-3


def test_kolmogorov_smirnov_detects_a_wrong_tilt() -> None:
    g = torch.Generator().manual_seed(5)
    ours = sample_pg1(torch.full((N,), 1.6), generator=g).numpy()
    theirs = _sample_numpy(np.ones(N), np.ones(N), np.random.default_rng(6))
    assert stats.ks_2samp(ours, theirs).pvalue < 1e-6


def test_reproducible_from_a_generator_and_independent_of_the_global_rng(device: torch.device) -> None:
    b = torch.tensor([0.0, 1.0, 2.5, 3.0, 50.0], device=device)
    c = torch.tensor([1.0, -2.0, 0.0, 5.0, 1.0], device=device)
    state = torch.get_rng_state()
    first = sample_polya_gamma(b, c, torch.Generator(device=device).manual_seed(7))
    again = sample_polya_gamma(b, c, torch.Generator(device=device).manual_seed(7))
    other = sample_polya_gamma(b, c, torch.Generator(device=device).manual_seed(8))
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert torch.equal(state, torch.get_rng_state())
    assert first[0] == 0 and bool((first[1:] > 0).all())


def test_a_cpu_generator_with_device_parameters_and_dtypes(device: torch.device) -> None:
    """The work runs on the generator's device and the draws land on the parameters' device and dtype; a CPU
    generator gives the same draws for parameters on any device."""
    c32 = torch.linspace(-3, 3, 7, dtype=torch.float32, device=device)
    draws = sample_polya_gamma(torch.ones(7, device=device), c32, torch.Generator().manual_seed(0))
    assert draws.dtype == torch.float32 and draws.device == c32.device
    on_cpu = sample_polya_gamma(torch.ones(7), c32.cpu(), torch.Generator().manual_seed(0))
    assert torch.equal(draws.cpu(), on_cpu)
    ints = sample_polya_gamma(torch.tensor([2, 3], device=device), torch.tensor([0.5, 0.5], device=device))
    assert ints.dtype == torch.float64


def test_distribution_draws_on_the_generators_device(device: torch.device) -> None:
    """``PolyaGamma.sample`` with a generator on ``device``: the torch-native sampler off the CPU."""
    q = PolyaGamma(torch.full((3,), 2.0, device=device), torch.tensor([0.0, 1.0, 9.0], device=device))
    draws = q.sample((4000,), generator=torch.Generator(device=device).manual_seed(0))
    assert draws.shape == (4000, 3) and draws.device == q.c.device
    assert uses_torch_sampler(device) or device.type == "cpu"
    assert bool(((draws.mean(0) - q.mean).abs() < 5 * (q.variance / 4000).sqrt()).all())


def test_without_polyagamma_the_distribution_uses_the_torch_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "polyagamma", None)  # `import polyagamma` raises ImportError
    monkeypatch.setattr(pg_module, "_has_polyagamma", lambda: False)
    assert uses_torch_sampler(torch.device("cpu"))
    q = PolyaGamma(torch.tensor([1.0, 3.0]), torch.tensor([0.5, 2.0]))
    draws = q.sample((N,), generator=torch.Generator().manual_seed(9))
    z = (draws.mean(0) - q.mean) / (draws.var(0) / N).sqrt()
    assert z.abs().max() < 5


def test_large_integer_b_switches_to_the_gamma_series_with_exact_moments() -> None:
    b = torch.tensor([float(SUM_MAX), float(SUM_MAX + 1)])
    draws = sample_polya_gamma(b.expand(N, -1), torch.full((N, 2), 0.5), torch.Generator().manual_seed(10))
    z_mean, z_var = _z_scores(draws, b, torch.full((2,), 0.5))
    assert z_mean.abs().max() < 5 and z_var.abs().max() < 5


@pytest.mark.parametrize(
    "b, c, match",
    [(-1.0, 0.0, "b must be finite and >= 0"), (float("inf"), 0.0, "b must be finite"),
     (1.0, float("nan"), "c must be finite")],
)
def test_bad_input_raises(b: float, c: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sample_polya_gamma(torch.tensor([b]), torch.tensor([c]))


def test_pg1_rejects_non_finite_tilts() -> None:
    with pytest.raises(ValueError, match="c must be finite"):
        sample_pg1(torch.tensor([float("inf")]))


def test_integer_tilts_give_float_draws_and_huge_tilts_the_mean() -> None:
    # integer c returned integer zeros; tilts >~ 1e155 gave zeros or half the mean (z^2 and w^2 overflowed)
    g = torch.Generator().manual_seed(7)
    draws = sample_pg1(torch.tensor([0, 1, 3]), generator=g)
    assert draws.dtype == torch.get_default_dtype() and bool((draws > 0).all())
    c = torch.tensor([1e30, 1e100, 1e155, 1e200, 1e300], dtype=torch.float64)
    for b in (1.0, 3.0, 2.5, 20.0, 100.5):
        ratio = sample_polya_gamma(torch.full_like(c, b), c, generator=g) / pg_mean(b, c)
        # relative spread sqrt(2 / (b c)) <= 3e-15 at c = 1e30: every draw is the mean to a few ulps
        torch.testing.assert_close(ratio, torch.ones_like(c), rtol=1e-13, atol=0.0)


#: the Kolmogorov distribution's 0.999 quantile: sqrt(n) * KS exceeds it with probability 1e-3 under the true law
_KS_999 = 1.9495


def _ks_to_exact_cdf(draws: torch.Tensor, b: float, c: float) -> float:
    """The Kolmogorov-Smirnov distance of ``draws`` to the exact PG(b, c) CDF."""
    x = draws.to(torch.float64).sort().values
    n = x.numel()
    F = polya_gamma_cdf(x.clamp_min(1e-300), b, c)
    i = torch.arange(1, n + 1, dtype=torch.float64)
    return float(torch.maximum(i / n - F, F - (i - 1) / n).max())


#: small b (b <= 0.05 was wrong for every tilt: KS 0.99 at 1e-5, 0.45 at 0.003, 0.18 at 0.01, 0.04 at 0.03), a
#: fraction beside exact PG(1) draws (2.3), and moderate b
EXACT_CDF_CASES = [(1e-5, 0.0), (1e-4, 1.0), (0.003, 0.0), (0.003, 2.0), (0.01, 20.0), (0.03, 2.0), (0.1, 0.0),
                   (0.7, 2.0), (2.3, 1.0)]


@pytest.mark.parametrize("b, c", EXACT_CDF_CASES)
def test_draws_follow_the_exact_cdf(b: float, c: float) -> None:
    """The torch sampler's draws against the exact PG(b, c) CDF (series in log space) by the Kolmogorov-Smirnov
    distance, below its 0.999 quantile for the sample size. Moments cannot show a wrong law here: a truncated gamma
    series with a moment-matched gamma tail has the right mean and variance but puts mass near 0, where the law has
    F(x) ~ exp(-b^2 / (8x))."""
    n = 20000
    g = torch.Generator().manual_seed(0)
    full = partial(torch.full, (n,), dtype=torch.float64)
    assert _ks_to_exact_cdf(sample_polya_gamma(full(b), full(c), generator=g), b, c) <= _KS_999 / math.sqrt(n)


@pytest.mark.parametrize("b, c", [(1e-5, 0.0), (1e-5, 20.0), (1e-4, 1.0), (1e-4, 20.0), (0.01, 0.0), (0.05, 1.0)])
def test_host_draws_follow_the_exact_cdf(b: float, c: float) -> None:
    """``PolyaGamma.sample`` on the CPU (``polyagamma``'s routing, :func:`_sample_numpy`) against the exact CDF:
    the gamma series it used for ``b < 1`` at ``|c| < 8`` and for ``b <= 1e-4`` (which the package refuses) was
    wrong (KS 0.99 at b = 1e-5, 0.94 at 1e-4, 0.18 at 0.01, 0.015 at 0.05)."""
    pytest.importorskip("polyagamma")
    n = 20000
    draws = PolyaGamma(torch.tensor(b), torch.tensor(c)).sample((n,), generator=torch.Generator().manual_seed(0))
    assert _ks_to_exact_cdf(draws, b, c) <= _KS_999 / math.sqrt(n)


@pytest.mark.parametrize("b", [1e-6, 0.02, 0.5, 1.0])
@pytest.mark.parametrize("c", [0.0, 3.0, 40.0])
def test_icdf_inverts_the_exact_cdf(b: float, c: float) -> None:
    """F(polya_gamma_icdf(u)) = u, from 2^-54 to 1 - 2^-54 (both tails), against the reference series."""
    u = torch.tensor([2.0**-54, 1e-10, 1e-3, 0.2, 0.5, 0.8, 0.999, 1 - 1e-9, 1 - 2.0**-54], dtype=torch.float64)
    x = polya_gamma_icdf(u, torch.tensor(b, dtype=torch.float64), torch.tensor(c, dtype=torch.float64))
    assert bool((x > 0).all()) and bool((x.diff() > 0).all())
    F = polya_gamma_cdf(x, b, c)
    torch.testing.assert_close(F, u, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("b", [0.05, 0.5, 0.9])
def test_icdf_converges_in_a_few_newton_steps(b: float, monkeypatch) -> None:
    """The inversion's Newton iteration ends within 12 steps for 20,000 uniforms (tilts in [0, 3]): capped there, it
    returns the uncapped quantiles to within 1e-13. A Newton step that converged onto the bracket's end used to be
    refused and replaced by bisection from the bracket's midpoint (~40 more steps; capped at 12, off by up to 6 %)."""
    g = torch.Generator().manual_seed(0)
    u = torch.rand(20_000, generator=g, dtype=torch.float64)
    c = 3 * torch.rand(20_000, generator=g, dtype=torch.float64)
    bb = torch.full_like(u, b)
    x = polya_gamma_icdf(u, bb, c)
    monkeypatch.setattr("gpytorch_augment.distributions.polya_gamma_torch._ICDF_MAX_ITER", 12)
    torch.testing.assert_close(polya_gamma_icdf(u, bb, c), x, rtol=1e-13, atol=0)


@pytest.mark.parametrize(
    "u, b, c, match",
    [(0.5, 0.0, 0.0, "b must be in"), (0.5, 1.5, 0.0, "b must be in"), (0.0, 0.5, 0.0, "u must be in"),
     (1.5, 0.5, 0.0, "u must be in"), (0.5, 0.5, math.inf, "c must be finite")],
)
def test_icdf_bad_input_raises(u: float, b: float, c: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        polya_gamma_icdf(torch.tensor(u), torch.tensor(b), torch.tensor(c))
