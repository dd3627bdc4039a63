r"""Convergence diagnostics of MCMC draws: rank-normalised split-:math:`\hat R` and bulk effective sample size
(Vehtari, Gelman, Simpson, Carpenter and Bürkner, 2021).

Draws are arrays of shape ``(chains, draws, K)``; every function returns one value per coordinate ``K``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["bulk_ess", "rank_normalized_rhat"]


def _split_chains(x: np.ndarray) -> np.ndarray:
    """(chains, draws, K) -> (2 chains, draws // 2, K); the middle draw is dropped for odd lengths."""
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, x.shape[1] - half :]], axis=0)


def _z_scale(x: np.ndarray) -> np.ndarray:
    """Rank-normalise each coordinate over all chains and draws (Blom's offset 3/8)."""
    from scipy.special import ndtri
    from scipy.stats import rankdata

    C, S, K = x.shape
    ranks = rankdata(x.reshape(C * S, K), method="average", axis=0).reshape(C, S, K)
    return ndtri((ranks - 0.375) / (C * S + 0.25))


def _rhat_basic(x: np.ndarray) -> np.ndarray:
    """Classic :math:`\\hat R` of (chains, draws, K)."""
    S = x.shape[1]
    within = x.var(axis=1, ddof=1).mean(axis=0)
    between = S * x.mean(axis=1).var(axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt((between / within + S - 1) / S)


def _autocov(x: np.ndarray) -> np.ndarray:
    """Autocovariance at every lag along axis 1 (FFT), normalised by the chain length."""
    from scipy.fft import next_fast_len

    S = x.shape[1]
    x = x - x.mean(axis=1, keepdims=True)
    m = next_fast_len(2 * S)
    fx = np.fft.rfft(x, n=m, axis=1)
    return np.fft.irfft(fx * np.conjugate(fx), n=m, axis=1)[:, :S] / S


def _ess_one(acov: np.ndarray, chain_mean: np.ndarray) -> float:
    """ESS of one coordinate from its per-chain autocovariances (C, S): Geyer's initial monotone sequence."""
    C, S = acov.shape
    mean_var = acov[:, 0].mean() * S / (S - 1.0)
    var_plus = mean_var * (S - 1.0) / S
    if C > 1:
        var_plus += chain_mean.var(ddof=1)
    if not var_plus > 0:
        return float("nan")
    rho_all = 1.0 - (mean_var - acov.mean(axis=0)) / var_plus
    rho = np.zeros(S)
    rho[0], rho[1] = 1.0, rho_all[1]
    even, odd = 1.0, rho_all[1]
    t = 1
    while t < S - 3 and even + odd > 0.0:  # initial positive sequence
        even, odd = rho_all[t + 1], rho_all[t + 2]
        if even + odd >= 0:
            rho[t + 1], rho[t + 2] = even, odd
        t += 2
    max_t = t - 2
    if even > 0:
        rho[max_t + 1] = even
    t = 1
    while t <= max_t - 2:  # initial monotone sequence
        if rho[t + 1] + rho[t + 2] > rho[t - 1] + rho[t]:
            rho[t + 1] = rho[t + 2] = (rho[t - 1] + rho[t]) / 2.0
        t += 2
    n = C * S
    tau = -1.0 + 2.0 * rho[: max_t + 1].sum() + rho[max_t + 1 : max_t + 2].sum()
    return n / max(tau, 1.0 / math.log10(n))


def rank_normalized_rhat(x: np.ndarray) -> np.ndarray:
    r"""Rank-normalised split-:math:`\hat R` of draws ``x`` of shape (chains, draws, K), per coordinate.

    :math:`\max(\hat R_{\rm bulk}, \hat R_{\rm tail})`, the bulk value computed on rank-normalised split chains
    and the tail value on the rank-normalised :math:`|x - \mathrm{median}(x)|` (Vehtari, Gelman, Simpson,
    Carpenter and Bürkner, 2021). Constant coordinates give NaN.

    Example::

        >>> import numpy as np
        >>> from gpytorch_augment.inference.diagnostics import rank_normalized_rhat
        >>> draws = np.random.default_rng(0).normal(size=(4, 200, 2))
        >>> bool((rank_normalized_rhat(draws) < 1.05).all())
        True
    """
    split = _split_chains(np.asarray(x, dtype=np.float64))
    bulk = _rhat_basic(_z_scale(split))
    folded = np.abs(split - np.median(split.reshape(-1, split.shape[-1]), axis=0))
    tail = _rhat_basic(_z_scale(folded))
    out = np.maximum(bulk, tail)
    const = np.ptp(split.reshape(-1, split.shape[-1]), axis=0) == 0
    out[const] = np.nan
    return out


def bulk_ess(x: np.ndarray) -> np.ndarray:
    """Bulk effective sample size of draws ``x`` of shape (chains, draws, K), per coordinate.

    Example::

        >>> import numpy as np
        >>> from gpytorch_augment.inference.diagnostics import bulk_ess
        >>> draws = np.random.default_rng(0).normal(size=(4, 200, 2))   # independent draws: ESS near 800
        >>> bool((bulk_ess(draws) > 500).all())
        True
    """
    z = _z_scale(_split_chains(np.asarray(x, dtype=np.float64)))
    acov = _autocov(z)
    chain_mean = z.mean(axis=1)
    return np.array([_ess_one(acov[..., k], chain_mean[:, k]) for k in range(z.shape[-1])])
