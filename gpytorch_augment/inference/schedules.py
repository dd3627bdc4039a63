r"""Step-size schedules :math:`\rho_t` for stochastic (mini-batch) CAVI.

A stochastic CAVI step on a batch :math:`\mathcal B` forms the optimal natural parameters :math:`\hat\theta_t`
of :math:`q(u)` for the batch statistics scaled by :math:`N/|\mathcal B|` and moves the current ones part of
the way (:doc:`/maths/engines`):

.. math::
    \theta_{t+1} = (1 - \rho_t)\,\theta_t + \rho_t\,\hat\theta_t = \theta_t + \rho_t\,\hat g_t,
    \qquad \hat g_t = \hat\theta_t - \theta_t,

where :math:`\hat g_t` is an unbiased estimate of the natural gradient of the ELBO (Hoffman et al., 2013).
A schedule is any object with ``__call__(t) -> rho`` (``t`` counts steps from 0); the adaptive one also
*observes* :math:`\hat g_t` before it is asked for :math:`\rho_t`. Every schedule returns values in (0, 1].

Example::

    >>> import torch
    >>> from gpytorch_augment import CAVI, BernoulliLogitLikelihood
    >>> from gpytorch_augment.inference.schedules import RobbinsMonro
    >>> from gpytorch_augment.testing.models import SVGP
    >>> model, likelihood = SVGP(torch.zeros(3, 1)), BernoulliLogitLikelihood()
    >>> cavi = CAVI(model, likelihood, num_data=100, step_size=RobbinsMonro(tau=10.0, kappa=0.7))
    >>> cavi = CAVI(model, likelihood, num_data=100, step_size="adaptive")
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["AdaptiveStep", "ConstantStep", "RobbinsMonro", "StepSchedule", "make_schedule"]


class StepSchedule:
    """Base class of the step-size schedules: ``schedule(t)`` is :math:`\\rho_t \\in (0, 1]`.

    Subclasses that need the noisy natural gradient set :attr:`uses_gradient` and implement :meth:`observe`
    (and :meth:`initialize`); the CAVI driver then calls them with :math:`\\hat g_t` before ``schedule(t)``.

    Example::

        >>> from gpytorch_augment.inference.schedules import RobbinsMonro, StepSchedule
        >>> isinstance(RobbinsMonro(), StepSchedule), RobbinsMonro(tau=1.0, kappa=0.75).state_dict()
        (True, {'tau': 1.0, 'kappa': 0.75})
    """

    #: whether the driver must pass the natural gradient to :meth:`observe` before each ``__call__``
    uses_gradient: bool = False

    def __call__(self, t: int) -> float:
        raise NotImplementedError

    def observe(self, gradient: Tensor) -> None:
        """Record the noisy natural gradient :math:`\\hat g_t` of step ``t`` (no-op by default)."""

    def state_dict(self) -> dict[str, Any]:
        """The schedule's settings and running state (plain numbers, lists and tensors: ``torch.load``-safe)."""
        return {k: (v.clone() if isinstance(v, Tensor) else copy.deepcopy(v)) for k, v in vars(self).items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        for k, v in state.items():
            setattr(self, k, v.clone() if isinstance(v, Tensor) else copy.deepcopy(v))

    def reset(self) -> None:
        """Forget any state (no-op by default)."""


class ConstantStep(StepSchedule):
    r""":math:`\rho_t = \rho`. With the full data and :math:`\rho = 1` this is exact coordinate ascent.

    :param rho: the step size, in (0, 1].

    Example::

        >>> from gpytorch_augment.inference.schedules import ConstantStep
        >>> ConstantStep(0.5)(100)
        0.5
    """

    def __init__(self, rho: float = 1.0) -> None:
        if not 0.0 < float(rho) <= 1.0:
            raise ValueError(f"rho must be in (0, 1], got {rho}")
        self.rho = float(rho)

    def __call__(self, t: int) -> float:
        return self.rho

    def __repr__(self) -> str:
        return f"ConstantStep(rho={self.rho})"


class RobbinsMonro(StepSchedule):
    r"""The Robbins–Monro schedule :math:`\rho_t = \min\{1, (t + \tau)^{-\kappa}\}`.

    With :math:`\kappa \in (0.5, 1]` it satisfies :math:`\sum_t\rho_t = \infty` and :math:`\sum_t\rho_t^2 < \infty`,
    so stochastic CAVI converges to a local optimum of the ELBO (Hoffman et al., 2013). :math:`\tau \ge 0` delays
    the decay (down-weights the early, noisy iterates); ``t`` counts from 0 and values above 1 are clipped to 1.

    :param tau: the delay :math:`\tau \ge 0`.
    :param kappa: the forgetting rate :math:`\kappa \in (0.5, 1]`.

    Example::

        >>> from gpytorch_augment.inference.schedules import RobbinsMonro
        >>> [round(RobbinsMonro(tau=1.0, kappa=1.0)(t), 3) for t in range(3)]
        [1.0, 0.5, 0.333]
    """

    def __init__(self, tau: float = 1.0, kappa: float = 0.75) -> None:
        if not 0.5 < float(kappa) <= 1.0:
            raise ValueError(f"kappa must be in (0.5, 1], got {kappa}")
        if not (math.isfinite(float(tau)) and float(tau) >= 0.0):
            raise ValueError(f"tau must be a finite number >= 0, got {tau}")
        self.tau = float(tau)
        self.kappa = float(kappa)

    def __call__(self, t: int) -> float:
        base = t + self.tau
        return 1.0 if base <= 1.0 else base ** (-self.kappa)

    def __repr__(self) -> str:
        return f"RobbinsMonro(tau={self.tau}, kappa={self.kappa})"


class AdaptiveStep(StepSchedule):
    r"""The adaptive learning rate of Ranganath, Wang, Blei and Xing (ICML 2013) for stochastic variational inference.

    It keeps exponentially weighted running averages, over a window of :math:`\tau_t` steps, of the noisy natural
    gradient and of its squared norm,

    .. math::
        \bar g_t = (1 - \tau_t^{-1})\,\bar g_{t-1} + \tau_t^{-1}\,\hat g_t,\qquad
        \bar h_t = (1 - \tau_t^{-1})\,\bar h_{t-1} + \tau_t^{-1}\,\hat g_t^\top\hat g_t,

    takes the step that minimises the expected distance to the full-batch optimum,
    :math:`\rho_t = \bar g_t^\top\bar g_t / \bar h_t` (at most 1 by Jensen's inequality), and updates the window
    :math:`\tau_{t+1} = \tau_t\,(1 - \rho_t) + 1`. :math:`\hat g_t = \hat\theta_t - \theta_t` is the whole
    natural-parameter vector of the whitened :math:`q(v)`: :math:`(\hat b - \theta_1,\ -\tfrac12(\hat B - S_v^{-1}))`.

    **Initialisation.** The paper initialises :math:`\bar g, \bar h` with Monte Carlo estimates from a few
    samples at the initial :math:`q`. Here the first batch is split into ``num_init`` disjoint sub-batches, each
    giving a noisy gradient :math:`\hat g^{(j)}` (scaled by :math:`N/|\text{sub-batch}|`): :math:`\bar g_0` is their
    mean (the batch gradient) and :math:`\bar h_0 = \lVert\bar g_0\rVert^2 + \hat V`, where :math:`\hat V` is the
    sample variance of the :math:`\hat g^{(j)}` divided by their number, an estimate of
    :math:`E\lVert\hat g - E\hat g\rVert^2` at the batch size. No data beyond the first batch is needed.
    :math:`\tau_1` = ``tau_init`` (default: ``num_init``), as in the paper's reference implementations.

    :param num_init: number of sub-batches of the first batch used to initialise the averages (at least 2).
    :param tau_init: the initial window :math:`\tau_1 \ge 1` (default ``num_init``).
    :param min_step: lower clip of :math:`\rho_t` (it is 0 only at an exact stationary point).

    Example::

        >>> import torch
        >>> from gpytorch_augment.inference.schedules import AdaptiveStep
        >>> schedule = AdaptiveStep()
        >>> schedule.initialize(torch.ones(4, 3, dtype=torch.float64))   # identical gradient samples
        >>> schedule(0)
        1.0
    """

    uses_gradient = True

    def __init__(self, num_init: int = 10, tau_init: float | None = None, min_step: float = 1e-6) -> None:
        if int(num_init) < 2:
            raise ValueError(f"num_init must be an integer >= 2, got {num_init}")
        tau_init = float(num_init) if tau_init is None else float(tau_init)
        if not (math.isfinite(tau_init) and tau_init >= 1.0):
            raise ValueError(f"tau_init must be a finite number >= 1, got {tau_init}")
        if not 0.0 < float(min_step) <= 1.0:
            raise ValueError(f"min_step must be in (0, 1], got {min_step}")
        self.num_init = int(num_init)
        self.tau_init = tau_init
        self.min_step = float(min_step)
        self.reset()

    def reset(self) -> None:
        self.g_bar: Tensor | None = None
        self.h_bar: float = math.nan
        self.tau: float = self.tau_init
        self.rho: float | None = None
        #: the history of (rho_t, tau_t) pairs, one per observed step
        self.history: list[tuple[float, float]] = []

    @property
    def initialized(self) -> bool:
        return self.g_bar is not None

    def _take_step(self) -> None:
        assert self.g_bar is not None
        g2 = float(self.g_bar.pow(2).sum())
        rho = g2 / self.h_bar if self.h_bar > 0 else 1.0
        rho = min(1.0, max(self.min_step, rho)) if math.isfinite(rho) else 1.0
        self.history.append((rho, self.tau))
        self.rho = rho
        self.tau = self.tau * (1.0 - rho) + 1.0

    def initialize(self, samples: Tensor) -> None:
        r"""Start the running averages from ``samples`` ``(k, P)``: :math:`k` noisy gradients from disjoint
        sub-batches of one batch (see the class docstring); this counts as the first observation."""
        samples = samples.detach().to(torch.float64).reshape(samples.shape[0], -1)
        if not torch.isfinite(samples).all():
            raise FloatingPointError("the natural gradient used to initialise AdaptiveStep is not finite")
        k = samples.shape[0]
        mean = samples.mean(0)
        variance = float((samples - mean).pow(2).sum()) / (k * (k - 1)) if k > 1 else 0.0
        self.g_bar = mean
        self.h_bar = float(mean.pow(2).sum()) + variance
        self.tau = self.tau_init
        self._take_step()

    def observe(self, gradient: Tensor) -> None:
        """Update the running averages with :math:`\\hat g_t` and compute :math:`\\rho_t` and :math:`\\tau_{t+1}`."""
        g = gradient.detach().to(torch.float64).reshape(-1)
        if not torch.isfinite(g).all():
            raise FloatingPointError("the natural gradient passed to AdaptiveStep is not finite")
        if self.g_bar is None:
            self.initialize(g.unsqueeze(0))
            return
        w = 1.0 / self.tau
        self.g_bar = (1.0 - w) * self.g_bar + w * g
        self.h_bar = (1.0 - w) * self.h_bar + w * float(g.pow(2).sum())
        self._take_step()

    def __call__(self, t: int) -> float:
        if self.rho is None:
            raise RuntimeError("AdaptiveStep needs observe(gradient) (or initialize(samples)) before the first step")
        return self.rho

    def __repr__(self) -> str:
        return f"AdaptiveStep(num_init={self.num_init}, tau_init={self.tau_init})"


_NAMES: dict[str, type[StepSchedule]] = {
    "constant": ConstantStep,
    "robbins-monro": RobbinsMonro,
    "robbins_monro": RobbinsMonro,
    "adaptive": AdaptiveStep,
}


def make_schedule(spec: float | str | StepSchedule | Callable[[int], float], **kwargs: Any) -> Any:
    r"""A schedule from a name (``"constant"``, ``"robbins-monro"``, ``"adaptive"``; ``kwargs`` go to its
    constructor); a number is a constant step and is returned as a ``float`` (the driver checks it is in
    (0, 1]), a :class:`StepSchedule` or any callable ``t -> rho`` is returned unchanged.

    Example::

        >>> from gpytorch_augment.inference.schedules import make_schedule
        >>> make_schedule("robbins-monro", tau=10.0, kappa=0.7)(0)  # doctest: +ELLIPSIS
        0.1995...
    """
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key not in _NAMES:
            raise ValueError(f"unknown step-size schedule {spec!r}: use one of 'constant', 'robbins-monro', 'adaptive'")
        return _NAMES[key](**kwargs)
    if kwargs:
        raise ValueError("keyword arguments are only accepted with a schedule name")
    if isinstance(spec, bool):
        raise ValueError(f"step size must be a number in (0, 1], a schedule name or a callable, got {spec!r}")
    if isinstance(spec, (int, float)):
        # validated lazily by the driver (it reports "step size must be in (0, 1]")
        return float(spec)
    if callable(spec):
        return spec
    raise ValueError(f"step size must be a number in (0, 1], a schedule name or a callable, got {spec!r}")
