"""Convergence diagnostics (``gpytorch_augment.inference.diagnostics``): rank-normalised split-R-hat and bulk ESS."""

from __future__ import annotations

import numpy as np
import pytest

from gpytorch_augment.inference.diagnostics import bulk_ess, rank_normalized_rhat, sd_ess, tail_ess


def test_diagnostics_detect_disagreeing_chains_and_match_arviz():
    """R-hat is large for chains that disagree, and rank-normalised R-hat / bulk ESS equal ArviZ's."""
    g = np.random.default_rng(0)
    C, S, K = 4, 400, 3
    x = np.zeros((C, S, K))
    for t in range(1, S):  # AR(1) chains
        x[:, t] = 0.7 * x[:, t - 1] + g.standard_normal((C, K))
    shifted = x.copy()
    shifted[0] += 3.0
    assert rank_normalized_rhat(x).max() < 1.02
    assert rank_normalized_rhat(shifted).min() > 1.1
    ess = bulk_ess(x)
    assert ((ess > 150) & (ess < 500)).all()  # AR(1) with rho = 0.7: ESS ~ C S (1 - rho) / (1 + rho) = 282
    az = pytest.importorskip("arviz")
    for arr in (x, shifted, np.exp(x)):
        for k in range(K):
            assert abs(az.rhat(arr[..., k], method="rank") - rank_normalized_rhat(arr)[k]) < 1e-10
            assert abs(az.ess(arr[..., k], method="bulk") - bulk_ess(arr)[k]) < 1e-8


def test_tail_and_sd_ess_match_arviz():
    g = np.random.default_rng(1)
    C, S, K = 4, 300, 3
    x = np.zeros((C, S, K))
    for t in range(1, S):  # AR(1) chains
        x[:, t] = 0.5 * x[:, t - 1] + g.standard_normal((C, K))
    az = pytest.importorskip("arviz")
    for arr in (x, np.exp(x)):
        tail, sd = tail_ess(arr), sd_ess(arr)
        for k in range(K):
            assert abs(az.ess(arr[..., k], method="tail") - tail[k]) < 1e-8 * tail[k]
            assert abs(az.ess(arr[..., k], method="sd") - sd[k]) < 1e-8 * sd[k]
