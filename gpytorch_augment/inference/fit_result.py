r"""What the one-call fit returns: how it stopped, why, what it optimised, and the trace.

A :class:`FitResult` is a :class:`~gpytorch_augment.inference.convergence.CAVITrace` (``elbo``, ``time``, ...) of the
run that produced the model, with the outcome beside it. Its :attr:`~FitResult.status` is one of
:class:`FitStatus`; ``converged`` is true exactly for ``"converged"`` and ``"certified"``.

Example::

    >>> from gpytorch_augment.inference.fit_result import FitResult, FitStatus
    >>> result = FitResult(status=FitStatus.CAP, message="stopped on its cap", elbo=[-0.7, -0.6])
    >>> result.converged, result.status.value
    (False, 'cap')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .convergence import CAVITrace

__all__ = ["FitResult", "FitStatus"]


class FitStatus(str, Enum):
    """How a fit ended.

    * ``CONVERGED`` -- the stopping rule was met, and (nested protocol) the objective's gradient in the
      hyper-parameters, with :math:`q(u)` at its optimum, passed the stationarity test.
    * ``CERTIFIED`` -- the optimizer could make no further progress, and the stationarity test certifies the point.
    * ``NOT_STATIONARY`` -- the stopping rule was met (or the optimizer stalled) but the gradient fails the
      stationarity test: the hyper-parameters may be short of their optimum (``restarts`` polishes them).
    * ``CAP`` -- ``max_iter`` (or ``num_epochs``) was reached before the stopping rule.
    * ``COLLAPSED`` -- the best fit found predicts the same latent value at every input (a constant predictor),
      after the restarts from data-aware points.
    """

    CONVERGED = "converged"
    CERTIFIED = "certified"
    NOT_STATIONARY = "not_stationary"
    CAP = "cap"
    COLLAPSED = "collapsed"


_CONVERGED = (FitStatus.CONVERGED, FitStatus.CERTIFIED)


@dataclass
class FitResult(CAVITrace):
    r"""The outcome of a one-call fit, with the trace of the run that produced the model.

    :ivar status: a :class:`FitStatus`.
    :ivar message: the reason, in words.
    :ivar objective: ``"MAP"`` (the true ELBO plus the log prior densities, per datum) or ``"ML-II"`` (no priors).
    :ivar priors: the hyper-priors the objective used, ``{parameter name: prior}`` (the user's and the defaults).
    :ivar default_priors: the names in :attr:`priors` that the fit added.
    :ivar protocol: ``"nested"``, ``"subsample"`` or ``"stochastic"``.
    :ivar optimizer: ``"torch"`` or ``"scipy"`` (nested, subsample), ``"adam"`` (stochastic).
    :ivar gradient: nested, subsample: the largest entry of the objective's gradient per datum on all the data at the
        end, :math:`q(u)` at its optimum (``None`` for the stochastic protocol, whose estimates are noisy).
    :ivar final_objective: the objective per datum at the end (nested, subsample: exact; stochastic: the last epoch's
        mean).
    :ivar stages: subsample: one record per run of L-BFGS, in order -- ``num_data`` (its points; the last is all the
        data), ``iterations``, ``gain`` (how much it raised the objective per datum from its start, ``None`` for
        the first), ``status``, ``sampling_error`` (the standard error of the gradient per datum on all the data
        estimated from this subsample, where the gains had settled; else ``None``; ``0.0`` on all the data) and
        ``seconds``. Empty for the other protocols.
    :ivar restarted_after_collapse: whether the model comes from a restart after a fit ended at a constant
        predictor.
    :ivar attempts: the status of every run, in order (the first run, then any restart after a collapse).
    """

    status: FitStatus = FitStatus.CAP
    message: str = ""
    objective: str = "ML-II"
    priors: dict[str, str] = field(default_factory=dict)
    default_priors: tuple[str, ...] = ()
    protocol: str = "nested"
    optimizer: str = "torch"
    gradient: float | None = None
    final_objective: float | None = None
    restarted_after_collapse: bool = False
    attempts: list[str] = field(default_factory=list)
    stages: list[dict[str, object]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.status = FitStatus(self.status)
        self.converged = self.status in _CONVERGED

    def __setattr__(self, name: str, value: object) -> None:
        super().__setattr__(name, value)
        if name == "status":
            super().__setattr__("converged", FitStatus(value) in _CONVERGED)

    def __str__(self) -> str:
        how = f"{self.objective}, {self.protocol} protocol, {self.num_steps} iterations"
        return f"{self.status.value} ({how}): {self.message}"
