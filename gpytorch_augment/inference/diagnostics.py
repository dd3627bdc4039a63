r"""Convergence diagnostics of MCMC draws: rank-normalised split-:math:`\hat R` and the bulk, tail and sd effective
sample sizes (Vehtari, Gelman, Simpson, Carpenter and Bürkner, 2021; the definitions of ArviZ's ``ess``).

Draws are arrays of shape ``(chains, draws, K)``; every function returns one value per coordinate ``K``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["bulk_ess", "rank_normalized_rhat", "sd_ess", "tail_ess"]


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
    return _ess(_z_scale(_split_chains(np.asarray(x, dtype=np.float64))))


def _ess(split: np.ndarray) -> np.ndarray:
    """ESS per coordinate of already split chains (chains, draws, K)."""
    acov = _autocov(split)
    chain_mean = split.mean(axis=1)
    return np.array([_ess_one(acov[..., k], chain_mean[:, k]) for k in range(split.shape[-1])])


def tail_ess(x: np.ndarray, prob: tuple[float, float] = (0.05, 0.95)) -> np.ndarray:
    r"""Tail effective sample size of draws ``x`` of shape (chains, draws, K), per coordinate: the smaller ESS of the
    indicators :math:`I(x \le q_{0.05})` and :math:`I(x \le q_{0.95})` on split chains (how well the 5 % and 95 %
    quantiles are estimated).

    Example::

        >>> import numpy as np
        >>> from gpytorch_augment.inference.diagnostics import tail_ess
        >>> draws = np.random.default_rng(0).normal(size=(4, 200, 2))   # independent draws: ESS near 800
        >>> bool((tail_ess(draws) > 500).all())
        True
    """
    split = _split_chains(np.asarray(x, dtype=np.float64))
    flat = split.reshape(-1, split.shape[-1])
    values = [_ess((split <= np.quantile(flat, p, axis=0)).astype(np.float64)) for p in prob]
    return np.minimum(*values)


def sd_ess(x: np.ndarray) -> np.ndarray:
    r"""Effective sample size of the posterior sd of draws ``x`` of shape (chains, draws, K), per coordinate: the ESS
    of :math:`(x - \bar x)^2` on split chains.

    Example::

        >>> import numpy as np
        >>> from gpytorch_augment.inference.diagnostics import sd_ess
        >>> draws = np.random.default_rng(0).normal(size=(4, 200, 2))   # independent draws: ESS near 800
        >>> bool((sd_ess(draws) > 500).all())
        True
    """
    x = np.asarray(x, dtype=np.float64)
    centred = (x - x.reshape(-1, x.shape[-1]).mean(axis=0)) ** 2
    return _ess(_split_chains(centred))
