r"""What :meth:`CAVI.fit <gpytorch_augment.CAVI.fit>` records, and the rules that decide when it stops.

A rule is a :class:`Convergence` (or any callable ``trace -> bool``): :meth:`Convergence.check` is called after every
step with the :class:`CAVITrace` so far. :class:`RelativeChange` stops on a flat ELBO, :class:`HeldOut` on a held-out
metric that has stopped improving.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["CAVITrace", "Convergence", "HeldOut", "RelativeChange"]


@dataclass
class CAVITrace:
    """What :meth:`CAVI.fit` records: one entry per CAVI step in ``elbo``, ``time``, ``epoch`` and ``step_size``,
    one per held-out evaluation in ``held_out``, ``held_out_step`` and ``held_out_time``.

    ``elbo`` is the augmented ELBO per datum of the state entering each step (exact for a full batch, an
    unbiased estimate for a mini-batch); ``time`` the training wall time in seconds after each step (held-out
    evaluations excluded); ``epoch`` the (0-based) pass over the data a step belongs to; ``step_size`` the
    :math:`\\rho_t` used.

    Example::

        >>> from gpytorch_augment import CAVITrace
        >>> trace = CAVITrace(elbo=[-0.7, -0.6], epoch=[0, 0])
        >>> trace.num_steps, trace.num_epochs, trace.converged
        (2, 1, False)
    """

    elbo: list[float] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    converged: bool = False
    epoch: list[int] = field(default_factory=list)
    step_size: list[float] = field(default_factory=list)
    held_out: list[float] = field(default_factory=list)
    held_out_step: list[int] = field(default_factory=list)
    held_out_time: list[float] = field(default_factory=list)

    @property
    def num_steps(self) -> int:
        return len(self.elbo)

    @property
    def num_epochs(self) -> int:
        return self.epoch[-1] + 1 if self.epoch else 0


class Convergence:
    """Base class of the stopping rules of :meth:`CAVI.fit`: :meth:`check` is called after every step.

    Example::

        >>> from gpytorch_augment import CAVITrace, Convergence
        >>> class AfterTen(Convergence):
        ...     def check(self, trace, epoch_end):
        ...         return trace.num_steps >= 10
        >>> AfterTen().check(CAVITrace(elbo=[0.0] * 10), epoch_end=True)
        True
    """

    def reset(self) -> None:
        """Forget the state of a previous fit."""

    def check(self, trace: CAVITrace, epoch_end: bool) -> bool:
        """Whether to stop, given the trace so far; ``epoch_end`` tells whether the step closed an epoch."""
        raise NotImplementedError


class RelativeChange(Convergence):
    r"""Stop when the mean ELBO of the last ``window`` steps differs from that of the ``window`` steps before by
    at most ``tol`` relative: :math:`|\bar{\mathcal L}_{\rm last} - \bar{\mathcal L}_{\rm previous}|
    \le \mathrm{tol}\cdot\max(1, |\bar{\mathcal L}_{\rm last}|)`.

    ``window = 1`` is the classic full-batch rule; with mini-batches the per-step ELBOs are noisy estimates, so
    use a window of about an epoch (the default of :meth:`CAVI.fit` in mini-batch mode).

    :param tol: the relative tolerance (ELBO per datum).
    :param window: the number of steps averaged on each side.

    Example::

        >>> from gpytorch_augment import CAVITrace, RelativeChange
        >>> rule = RelativeChange(tol=1e-3)
        >>> rule.check(CAVITrace(elbo=[-0.5, -0.4]), True), rule.check(CAVITrace(elbo=[-0.5, -0.4, -0.4]), True)
        (False, True)
    """

    def __init__(self, tol: float = 1e-8, window: int = 1) -> None:
        if not (math.isfinite(float(tol)) and float(tol) >= 0):
            raise ValueError(f"tol must be a finite number >= 0, got {tol}")
        if int(window) < 1:
            raise ValueError(f"window must be a positive integer, got {window}")
        self.tol = float(tol)
        self.window = int(window)

    def check(self, trace: CAVITrace, epoch_end: bool) -> bool:
        w, values = self.window, trace.elbo
        if len(values) < 2 * w:
            return False
        last = math.fsum(values[-w:]) / w
        previous = math.fsum(values[-2 * w : -w]) / w
        return abs(last - previous) <= self.tol * max(1.0, abs(last))

    def __repr__(self) -> str:
        return f"RelativeChange(tol={self.tol}, window={self.window})"


class HeldOut(Convergence):
    r"""Early stopping on a held-out metric, as in the X-GPC paper (Wenzel et al., 2019): every ``every`` steps
    (default: at the end of every epoch) ``metric_fn()`` is evaluated and recorded in the trace; the values are
    smoothed by a moving average over the last ``window`` evaluations, and the fit stops once the smoothed value
    has not improved on its best by more than ``min_delta`` for ``patience`` consecutive evaluations.

    The evaluation time is excluded from the trace's training clock; the model and likelihood are put back into
    training mode afterwards if ``metric_fn`` switched them to eval mode.

    :param metric_fn: a callable with no arguments returning a number, e.g. the test negative log predictive density.
    :param window: moving-average window (number of evaluations).
    :param patience: number of evaluations without improvement before stopping.
    :param every: evaluate every this many steps (``None``: at the end of every epoch).
    :param mode: ``"min"`` (lower is better, e.g. NLL or error) or ``"max"`` (e.g. accuracy).
    :param min_delta: the smallest change that counts as an improvement.

    Example::

        >>> import torch
        >>> from gpytorch_augment import CAVI, BernoulliLogitLikelihood
        >>> from gpytorch_augment.testing.models import SVGP
        >>> x = torch.linspace(-2, 2, 20, dtype=torch.float64).unsqueeze(-1)
        >>> y = (x.squeeze(-1) > 0).double()
        >>> x_test, y_test = x[1::2], y[1::2]
        >>> model, likelihood = SVGP(x[::4]).double(), BernoulliLogitLikelihood()
        >>> from gpytorch_augment import HeldOut
        >>> def test_nll():
        ...     model.eval(); likelihood.eval()
        ...     with torch.no_grad():
        ...         return -likelihood.log_marginal(y_test, model(x_test)).mean().item()
        >>> cavi = CAVI(model, likelihood, num_data=20)
        >>> rule = HeldOut(test_nll, window=1, patience=2)
        >>> trace = cavi.fit(x, y, batch_size=5, num_epochs=3, convergence=rule, generator=torch.Generator())
        >>> len(trace.held_out) >= 1
        True
    """

    def __init__(
        self,
        metric_fn: Callable[[], float],
        window: int = 1,
        patience: int = 5,
        every: int | None = None,
        mode: str = "min",
        min_delta: float = 0.0,
    ) -> None:
        if not callable(metric_fn):
            raise ValueError(f"metric_fn must be callable, got {type(metric_fn).__name__}")
        if int(window) < 1 or int(patience) < 1:
            raise ValueError(f"window and patience must be positive integers, got {window} and {patience}")
        if every is not None and int(every) < 1:
            raise ValueError(f"every must be a positive integer or None, got {every}")
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        if not float(min_delta) >= 0:
            raise ValueError(f"min_delta must be >= 0, got {min_delta}")
        self.metric_fn = metric_fn
        self.window = int(window)
        self.patience = int(patience)
        self.every = None if every is None else int(every)
        self.sign = 1.0 if mode == "min" else -1.0
        self.min_delta = float(min_delta)
        self.reset()

    def reset(self) -> None:
        self.best = math.inf  # of sign * smoothed value
        self.since_best = 0
        self.best_step: int | None = None

    def check(self, trace: CAVITrace, epoch_end: bool) -> bool:
        due = epoch_end if self.every is None else trace.num_steps % self.every == 0
        if not due:
            return False
        value = float(self.metric_fn())
        trace.held_out.append(value)
        trace.held_out_step.append(trace.num_steps)
        trace.held_out_time.append(trace.time[-1] if trace.time else 0.0)
        if math.isnan(value):
            raise FloatingPointError(f"the held-out metric is NaN at step {trace.num_steps}")
        recent = trace.held_out[-self.window :]
        smoothed = self.sign * math.fsum(recent) / len(recent)
        if smoothed < self.best - self.min_delta:
            self.best, self.since_best, self.best_step = smoothed, 0, trace.num_steps
            return False
        self.since_best += 1
        return self.since_best >= self.patience

    def __repr__(self) -> str:
        return f"HeldOut(window={self.window}, patience={self.patience}, every={self.every})"
