"""Fuzz round two (issue 25): defects that ended in a *finite but wrong* result, which the fuzz matrix's
finite-or-clear classification cannot see; each test compares with a reference value."""

from __future__ import annotations

import mpmath as mp
import pytest
import torch

import gpytorch_augment as ga


def _log_pg0_reference(x: float, b: float) -> float:
    r""":math:`\log\mathrm{PG}(x\mid b, 0)` by its alternating series in ``digits``-digit arithmetic."""
    digits = 100 + int(b)  # the series cancels about b decimal digits at most
    with mp.workdps(digits):
        x, b = mp.mpf(x), mp.mpf(b)
        total, peak, n = mp.mpf(0), mp.mpf(0), 0
        while True:
            term = mp.exp(mp.loggamma(n + b) - mp.loggamma(n + 1)) * (2 * n + b) * mp.exp(-((2 * n + b) ** 2) / (8 * x))
            total += (-1) ** n * term
            peak = max(peak, term)
            if n > 10 and term < peak * mp.mpf(10) ** (-digits + 10):
                break
            n += 1
        return float(mp.log(2 ** (b - 1) / mp.gamma(b) * total / mp.sqrt(2 * mp.pi * x**3)))


@pytest.mark.parametrize(
    "b, xs, tol",
    [
        (100.0, (15.0, 20.0, 25.0, 30.0, 40.0), 1e-5),
        (1000.0, (200.0, 250.0, 300.0), 1e-5),
        (30.0, (3.0, 10.0, 15.0), 1e-5),
        (10.0, (1.0, 7.0, 10.0), 1e-5),
        (1.0, (0.05, 1.0, 5.0, 8.0, 12.0), 5e-3),
        (0.5, (0.1, 1.0, 10.0), 2e-2),
    ],
)
def test_polya_gamma_log_prob_matches_high_precision_series(b, xs, tol):
    x = torch.tensor(xs, dtype=torch.float64)
    got = ga.PolyaGamma(torch.tensor(b, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)).log_prob(x)
    want = torch.tensor([_log_pg0_reference(v, b) for v in xs], dtype=torch.float64)
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() < tol, (got, want)


@pytest.mark.parametrize("b, c", [(100.0, 0.0), (100.0, 3.0), (40.0, 0.0), (300.0, 1.0)])
def test_polya_gamma_density_integrates_to_one_with_exact_moments(b, c):
    pg = ga.PolyaGamma(torch.tensor(b, dtype=torch.float64), torch.tensor(c, dtype=torch.float64))
    mean, sd = pg.mean.item(), pg.variance.sqrt().item()
    x = torch.linspace(max(mean - 12 * sd, 1e-3), mean + 16 * sd, 4001, dtype=torch.float64)
    density = pg.log_prob(x).exp()
    mass = torch.trapezoid(density, x).item()
    first = torch.trapezoid(density * x, x).item()
    second = torch.trapezoid(density * (x - mean) ** 2, x).item()
    assert mass == pytest.approx(1.0, abs=1e-5)
    assert first == pytest.approx(mean, rel=1e-5)
    assert second == pytest.approx(sd**2, rel=1e-4)
