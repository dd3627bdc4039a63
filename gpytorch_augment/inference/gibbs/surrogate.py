r"""The surrogate-data move of the hyper-parameters and the latents together, :math:`\Omega` integrated out
(Murray & Adams 2010, *Slice sampling covariance hyperparameters of latent Gaussian models*): :func:`surrogate_move`.

Given :math:`\Omega` the blocked sampler's :math:`\theta`-move sees pseudo-observations of :math:`f` with the
augmentation's precision :math:`\lambda`. Where that exceeds the likelihood's own information (counts, several
classes) :math:`p(\theta \mid \Omega, y)` is much narrower than :math:`p(\theta \mid y)`, and :math:`\theta` creeps
from sweep to sweep however well each move mixes. This move conditions on *surrogate data* of a fixed diagonal noise
:math:`S` (``noise``, independent of the chains' state) instead:

1. :math:`g = f + S^{1/2}\varepsilon`, :math:`\varepsilon \sim \mathcal N(0, I)`;
2. with the tilts :math:`h = g/S`, :math:`\lambda = 1/S`, the whitened posterior :math:`q_\theta(v) = p(v \mid g,
   \theta)` and the collapsed marginal :math:`Z_\theta = \int \mathcal N(f \mid \mu_\theta, K_\theta)\, e^{h^\top f -
   \frac12 f^\top\Lambda f} df \propto \mathcal N(g \mid \mu_\theta, K_\theta + S)`
   (:func:`~gpytorch_augment.core.collapsed_log_marginal`), fix the standard normal :math:`\eta` whose pathwise draw
   from :math:`q_\theta` is the chains' current :math:`v = L_\theta^{-1}(f - \mu_\theta)`
   (:meth:`~gpytorch_augment.core.WhitenedGaussian.noise_of`);
3. slice-sample :math:`\theta` (:mod:`~gpytorch_augment.inference.mcmc.slice`) on

   .. math::
       \log p(\theta) + \log Z_\theta + \log p(y \mid f_\theta),\qquad
       f_\theta = \mu_\theta + L_\theta\, v_\theta,\quad v_\theta = q_\theta\text{'s draw at } \eta,

   and :math:`f` follows :math:`\theta` (:math:`f_\theta` at the new :math:`\theta`); :math:`g` is discarded.

**Why it is exact.** :math:`\mathcal N(f \mid \mu_\theta, K_\theta)\,\mathcal N(g \mid f, S) = \mathcal N(g \mid
\mu_\theta, K_\theta + S)\, p(f \mid g, \theta)`, and the map :math:`f \mapsto \eta` has a Jacobian that cancels
:math:`p(f \mid g, \theta)`'s normaliser, so :math:`p(\theta, \eta, g \mid y) \propto p(\theta)\, \mathcal N(g \mid
\mu_\theta, K_\theta + S)\, p(y \mid f_\theta)\, \mathcal N(\eta \mid 0, I)`: step 3 leaves it invariant given
:math:`(\eta, g)`, step 1 draws :math:`g` from its conditional, so the move leaves :math:`p(\theta, f \mid y)`
invariant. It ignores :math:`\Omega`: a transition must draw :math:`\Omega \mid f` afresh before anything reads
:math:`\Omega` (:class:`~gpytorch_augment.inference.gibbs.HyperparameterGibbsKernel` runs the move first). Any
:math:`S > 0` gives an exact move; one close to the inverse of the likelihood's information makes :math:`f_\theta`
nearly :math:`\theta`'s own posterior draw, and the kernel adapts it in warm-up (the expected augmented precision
:math:`E[\lambda \mid f, y]` averaged over the chains).

**Cost.** Each density evaluation is one factorisation of :math:`I + A S^{-1} A^\top` and of
:math:`K_\theta + \epsilon I` (as a collapsed :math:`\theta`-move's) and one evaluation of :math:`\log p(y \mid f)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from ...core import WhitenedGaussian
from ...core.linalg import tri_solve
from ..mcmc.slice import SliceMove, slice_move

__all__ = ["surrogate_move"]


class _Prior(Protocol):
    """The prior at a batch of coordinates (``PriorAt`` of :mod:`~gpytorch_augment.inference.gibbs.hyper_state`)."""

    mean: Tensor
    A: Tensor
    log_prior: Tensor


#: ``prior_at(theta)``: the prior at coordinates ``(n, P)``
PriorAt = Callable[[Tensor], _Prior]
#: ``collapsed(prior, h, lam)``: (:math:`\log p(\theta) + \log Z_\theta` per chain, ``-inf`` where the prior could
#: not be factorised, :math:`q_\theta(v)`)
Collapsed = Callable[[_Prior, Tensor, Tensor], tuple[Tensor, WhitenedGaussian]]
#: ``log_lik(f, index)``: :math:`\log p(y \mid f)` ``(n,)`` of the chains ``index`` at latents ``f`` ``(n, T, N)``
LogLik = Callable[[Tensor, Tensor], Tensor]


class _Surrogate:
    r"""The surrogate data of one move and the density of :math:`\theta` given them and :math:`\eta`."""

    def __init__(self, f: Tensor, prior: _Prior, noise: Tensor, prior_at: PriorAt, collapsed: Collapsed,
                 log_lik: LogLik, generator: torch.Generator | None) -> None:  # fmt: skip
        eps = torch.randn(f.shape, generator=generator, dtype=f.dtype, device=f.device)
        self.h = f / noise + eps / noise.sqrt()  # g / S with g = f + S^½ ε
        self.lam = (1.0 / noise).expand_as(f)
        self.prior_at, self.collapsed, self.log_lik = prior_at, collapsed, log_lik
        log_c0, q0 = collapsed(prior, self.h, self.lam)
        v = tri_solve(prior.A.mT, (f - prior.mean).unsqueeze(-1)).squeeze(-1)
        self.eta = q0.noise_of(v)
        index = torch.arange(f.shape[0], device=f.device)
        self.log_p0 = log_c0 + log_lik(f, index)
        self.payload0 = (f, prior.mean, prior.A, prior.log_prior)

    def __call__(self, theta: Tensor, index: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The log density at ``theta`` ``(n, P)`` of the chains ``index`` and the payload ``(f, mean, A,
        log_prior)`` there."""
        at = self.prior_at(theta)
        log_c, q = self.collapsed(at, self.h[index], self.lam[index])
        f = at.mean + (q.draw(self.eta[index]).unsqueeze(-2) @ at.A).squeeze(-2)
        log_p = log_c + self.log_lik(f, index)
        return log_p, (f, at.mean, at.A, at.log_prior)


def _finite(log_p: Tensor) -> Tensor:
    return torch.where(torch.isfinite(log_p), log_p, torch.full_like(log_p, -math.inf))


def surrogate_move(
    theta: Tensor,
    f: Tensor,
    prior: _Prior,
    noise: Tensor,
    prior_at: PriorAt,
    collapsed: Collapsed,
    log_lik: LogLik,
    width: Tensor,
    generator: torch.Generator | None,
    max_steps_out: int,
    scale: Tensor | None = None,
) -> SliceMove:
    r"""One surrogate-data move of :math:`(\theta, f)` by slice sampling (the module docstring has the maths).

    :param theta: the chains' coordinates ``(C, P)``.
    :param f: their latents ``(C, T, N)``, with ``prior`` the prior at ``theta`` (``mean`` ``(C, T, N)``, ``A`` =
        :math:`L^\top` ``(C, T, N, N)``, ``log_prior`` ``(C,)``).
    :param noise: the surrogate noise :math:`S` ``(T, N)`` (positive).
    :param prior_at: see :data:`PriorAt`; ``collapsed``: :data:`Collapsed`; ``log_lik``: :data:`LogLik`.
    :param width: the slice widths ``(C,)``, in the coordinates :math:`\theta / s`.
    :param scale: :math:`s` ``(P,)``, a fixed scale of the coordinates (e.g. the posterior's standard deviations
        estimated in warm-up); the slice's random direction is uniform in :math:`\theta / s`. Default: ones.
    :return: the :class:`~gpytorch_augment.inference.mcmc.slice.SliceMove` of :math:`\theta`, its payload
        ``(f, mean, A, log_prior)`` at the new :math:`\theta`.
    """
    target = _Surrogate(f, prior, noise, prior_at, collapsed, log_lik, generator)
    s = torch.ones_like(theta[0]) if scale is None else scale.to(theta)

    def log_density(z: Tensor, index: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        log_p, payload = target(z * s, index)
        return _finite(log_p), payload

    move = slice_move(theta / s, target.log_p0, target.payload0, log_density, width, generator, max_steps_out)
    return move._replace(x=move.x * s)
