r"""Warm-up adaptation of :class:`~gpytorch_augment.inference.hmc.HMCKernel`: the step size of each chain by dual
averaging, and the trajectory length shared by the chains by ChEES.

**Step size** (Hoffman & Gelman 2014, §3.2, eq. 6; :math:`\gamma = 0.05`, :math:`t_0 = 10`, :math:`\kappa = 0.75`,
shrinkage point :math:`\log(10\varepsilon_0)`): per chain, towards the target acceptance probability; frozen when
warm-up ends at the averaged value, capped by the largest step size tried in warm-up whose transition reached the
target acceptance (by the smallest one tried where none did). The early iterates probe steps up to ten times
:math:`\varepsilon_0` and more, and after a warm-up of one or two iterations the average is such an untried probe
(3--14 times too large, every proposal rejected); after a long warm-up the cap does not bind.

**Trajectory length** (ChEES; Hoffman, Radul & Sountsov 2021, "An adaptive MCMC scheme for setting trajectory
lengths in Hamiltonian Monte Carlo"). Each transition integrates for a jittered time :math:`t = uT`,
:math:`u \sim \mathcal U(0, 1)`, shared by the chains, so chain :math:`c` takes
:math:`\lceil t / \varepsilon_c \rceil` leapfrog steps. Warm-up maximises the expected change in the squared
distance of the state from the chains' centre,

.. math::
    \mathrm{ChEES}(T) = \tfrac14\,\mathbb E\Big[\big(\lVert z' - \bar z\rVert^2 - \lVert z - \bar z\rVert^2\big)^2\Big],

by Adam ascent on :math:`\log T` (:math:`\beta_1 = 0`, :math:`\beta_2 = 0.95`, rate 0.025) with the
acceptance-weighted gradient estimate over the chains

.. math::
    \hat g = \sum_c w_c\, t_c\,\big(\lVert z'_c - \bar z'\rVert^2 - \lVert z_c - \bar z\rVert^2\big)\,
    (z'_c - \bar z')^\top p'_c, \qquad w_c = \alpha_c / \textstyle\sum_{c'} \alpha_{c'},

(:math:`z'`, :math:`p'` the proposal and its momentum, :math:`\alpha_c` the acceptance probability,
:math:`\bar z` the chains' mean, :math:`\bar z'` the acceptance-weighted mean of the proposals). With one chain
there is no cross-chain centre (both deviations would be 0 and :math:`T` would never move): :math:`\bar z` and
:math:`\bar z'` are then the running mean of the chain's states over the warm-up so far (including the current
one), an estimate of the posterior mean, and :math:`w = \alpha` (normalising one weight would count a rejected
proposal in full). One chain adapts more slowly and more noisily than many. The length used
after warm-up is :math:`\exp` of the mean of :math:`\log T` over the second half of warm-up. Adaptation uses the
chains' history during warm-up only; afterwards :math:`T` is fixed and the jitter is drawn independently of the
state, so every transition leaves the posterior invariant.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["ChEESAdaptation", "DualAveraging"]


class DualAveraging:
    """Per-chain dual averaging of :math:`\\log\\varepsilon` (see the module docstring).

    Example::

        >>> import torch
        >>> from gpytorch_augment.inference.mcmc.adaptation import DualAveraging
        >>> da = DualAveraging(torch.ones(2), target=0.8)
        >>> for _ in range(50):
        ...     da.update(torch.tensor([1.0, 0.2]))      # chain 0 accepts everything, chain 1 rarely
        >>> bool(da.final[0] > da.final[1])                # the step grows where it is too cautious
        True
    """

    def __init__(self, eps0: Tensor, target: float, gamma: float = 0.05, t0: float = 10.0, kappa: float = 0.75):
        self.mu = torch.log(10 * eps0)
        self.log_eps = eps0.log()
        self.log_eps_bar = torch.zeros_like(eps0)
        self.h_bar = torch.zeros_like(eps0)
        self.target, self.gamma, self.t0, self.kappa, self.t = target, gamma, t0, kappa, 0
        self.largest_good = torch.zeros_like(eps0)  # the largest step tried that reached the target (0: none)
        self.smallest_tried = torch.full_like(eps0, math.inf)

    def update(self, accept_prob: Tensor) -> None:
        tried = self.log_eps.exp()
        good = accept_prob >= self.target
        self.largest_good = torch.where(good, torch.maximum(self.largest_good, tried), self.largest_good)
        self.smallest_tried = torch.minimum(self.smallest_tried, tried)
        self.t += 1
        eta = 1.0 / (self.t + self.t0)
        self.h_bar = (1 - eta) * self.h_bar + eta * (self.target - accept_prob)
        self.log_eps = self.mu - math.sqrt(self.t) / self.gamma * self.h_bar
        w = self.t ** (-self.kappa)
        self.log_eps_bar = w * self.log_eps + (1 - w) * self.log_eps_bar

    @property
    def step_size(self) -> Tensor:
        return self.log_eps.exp()

    @property
    def reached_target(self) -> Tensor:
        """Per chain, whether some step size tried in warm-up reached the target acceptance."""
        return self.largest_good > 0

    @property
    def final(self) -> Tensor:
        """The averaged step size, capped by the largest tried step that reached the target acceptance (by the
        smallest tried where none did; the averaged one before any update)."""
        if self.t == 0:
            return self.log_eps_bar.exp()
        cap = torch.where(self.reached_target, self.largest_good, self.smallest_tried)
        return torch.minimum(self.log_eps_bar.exp(), cap)


class ChEESAdaptation:
    """Adam ascent on :math:`\\log T` of the ChEES criterion over the chains (see the module docstring).

    :param length: the trajectory length :math:`T` to start from.
    :param num_warmup: warm-up iterations (the final length averages :math:`\\log T` over their second half).
    :param bounds: ``(shortest, longest)`` length allowed.

    Example (exact Hamiltonian flow on :math:`\\mathcal N(0, I)`: :math:`z' = z\\cos t + p\\sin t`; ChEES grows
    with :math:`t` up to :math:`\\pi/2`, so a short start lengthens)::

        >>> import math, torch
        >>> from gpytorch_augment.inference.mcmc.adaptation import ChEESAdaptation
        >>> g = torch.Generator().manual_seed(0)
        >>> adapt = ChEESAdaptation(length=0.2, num_warmup=200, bounds=(0.01, 10.0))
        >>> z = torch.randn(1, 64, 5, generator=g, dtype=torch.float64)
        >>> for _ in range(200):
        ...     p, u = torch.randn(z.shape, generator=g, dtype=z.dtype), float(torch.rand(1, generator=g))
        ...     t = u * adapt.length
        ...     z1, p1 = z * math.cos(t) + p * math.sin(t), p * math.cos(t) - z * math.sin(t)
        ...     adapt.update(z, z1, p1, torch.ones(64, dtype=z.dtype), torch.full((64,), t, dtype=z.dtype))
        ...     z = z1
        >>> 1.0 < adapt.final < 4.0
        True
    """

    def __init__(self, length: float, num_warmup: int, bounds: tuple[float, float], rate: float = 0.025,
                 beta2: float = 0.95) -> None:  # fmt: skip
        self.log_length, self.bounds, self.rate, self.beta2 = math.log(length), bounds, rate, beta2
        self.num_warmup, self.t, self.v = num_warmup, 0, 0.0
        self.log_sum, self.count = 0.0, 0
        self.state_sum: Tensor | None = None  # one chain: the sum of its warm-up states (the centre's numerator)

    @property
    def length(self) -> float:
        return math.exp(self.log_length)

    def update(self, z: Tensor, z1: Tensor, p1: Tensor, accept_prob: Tensor, times: Tensor) -> None:
        """One Adam step from a transition: states ``z`` and proposals ``z1`` with their momenta ``p1`` (G, C, n),
        acceptance probabilities (C,) and the integration times of the chains (C,)."""
        self.t += 1
        total = float(accept_prob.sum())
        if total > 0 and bool(torch.isfinite(z1).all()) and bool(torch.isfinite(p1).all()):
            w = (accept_prob / total).view(1, -1, 1) if z.shape[1] > 1 else accept_prob.view(1, -1, 1)
            if z.shape[1] > 1:
                x0 = z - z.mean(1, keepdim=True)
                x1 = z1 - (w * z1).sum(1, keepdim=True)
            else:  # one chain: centre on the running mean of its states
                self.state_sum = z.clone() if self.state_sum is None else self.state_sum + z
                centre = self.state_sum / self.t
                x0, x1 = z - centre, z1 - centre
            change = (x1 * x1).sum((0, 2)) - (x0 * x0).sum((0, 2))
            grad = float((w.view(-1) * times * change * (x1 * p1).sum((0, 2))).sum())
            if math.isfinite(grad):
                self.v = self.beta2 * self.v + (1 - self.beta2) * grad * grad
                scale = math.sqrt(self.v / (1 - self.beta2**self.t)) + 1e-12
                lo, hi = self.bounds
                self.log_length = min(max(self.log_length + self.rate * grad / scale, math.log(lo)), math.log(hi))
        if self.t > self.num_warmup // 2:
            self.log_sum, self.count = self.log_sum + self.log_length, self.count + 1

    @property
    def final(self) -> float:
        """The length after warm-up: :math:`\\exp` of the mean :math:`\\log T` over the second half of warm-up."""
        return math.exp(self.log_sum / self.count) if self.count else self.length
