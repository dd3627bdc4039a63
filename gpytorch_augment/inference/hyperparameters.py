r"""One-call fits that learn the hyper-parameters: ``CAVI.fit(x, y, learn_hyperparameters=True)``, or
:func:`fit_hyperparameters` for the full :class:`~gpytorch_augment.inference.fit_result.FitResult`.

**The model.** By default the fit is MAP: the objective is GPyTorch's true ``VariationalELBO`` plus the log densities
of the hyper-priors, per datum. Every lengthscale and outputscale without a prior of the user's gets the default
prior of :mod:`~gpytorch_augment.inference.default_priors` (dimension-scaled log-normal lengthscales, a Gamma
outputscale) for the duration of the fit, and every lengthscale still at GPyTorch's initial value starts at the
data-aware point (the mode of its default prior). ``FitOptions(priors=False)`` fits maximum likelihood (ML-II) under
the user's priors only. A fit that ends at a constant predictor (:mod:`~gpytorch_augment.inference.collapse`)
restarts from data-aware points and keeps the best objective; it is never reported as converged.

**The protocols**, chosen by :func:`choose_protocol` from the data size:

* ``"nested"`` (up to :data:`NESTED_MAX_DATA` points) -- L-BFGS (``torch`` or ``scipy``,
  :mod:`~gpytorch_augment.inference.lbfgs`) on the hyper-parameters :math:`\theta` alone, on :math:`J(\theta)`, the
  objective at the :math:`q(u)` that ``inner_steps`` closed-form CAVI steps reach from a snapshot
  (:mod:`~gpytorch_augment.inference.nested`). Stops when :math:`J` changes by less than ``tol`` (relative) between
  iterations or L-BFGS cannot move; such a stop counts as converged only where the objective's gradient in
  :math:`\theta`, at the optimal :math:`q(u)`, is at most ``gtol`` per datum in every entry.
* ``"subsample"`` (above it, on one process) -- the nested protocol on the first :math:`n` points of a random order
  of the data (an engine for :math:`n` points: the objective is that of the subsample), for
  :math:`n = n_0, 2n_0, 4n_0, \dots` (``subsample_size``; the next after one above :math:`N/4` is :math:`N`), each
  run starting where the last ended and stopping at :data:`SUBSAMPLE_TOL_FACTOR` times ``tol``, until
  :data:`SETTLED_DOUBLINGS` doublings in a row each raise the objective per datum by less than ``subsample_tol`` from
  their start (or :math:`n` reaches :math:`N`: the nested protocol on all the data).
  Then :math:`q(u)` is solved on all the data and the stationarity test runs there; only where it fails do at most
  ``polish_iter`` L-BFGS iterations on all the data follow. A hyper-parameter settles on a few thousand points where
  the data are many, so the full-data work is a few CAVI passes and one gradient instead of an L-BFGS run.
* ``"stochastic"`` (with data sharded over processes, or by choice) -- mini-batch CAVI with one Adam step (``lr``)
  on the CAVI's ``hyper_objective`` per CAVI step: the engine's inner loop
  (:meth:`CAVIEngine.run <gpytorch_augment.inference.engine.CAVIEngine.run>`) with that optimizer. Stops when the
  epoch-averaged bound changes by less than ``tol`` (relative) or after ``num_epochs`` epochs.

Both drive the engine through :class:`~gpytorch_augment.inference.engine.CAVIEngine` (never ``CAVI.fit``, which
dispatches here).

Both put the model and the likelihood in training mode and restore the caller's modes, take the data checked once at
the entry (:meth:`CAVIEngine.check_data <gpytorch_augment.inference.engine.CAVIEngine.check_data>`: an
:class:`~gpytorch_augment.core.ObservedData`, never checked again), warn when the result is not converged (naming
why), and leave :math:`q(u)` at its optimum for the final hyper-parameters.

Example::

    >>> import torch
    >>> from gpytorch_augment import CAVI, BernoulliLogitLikelihood
    >>> from gpytorch_augment.inference.hyperparameters import fit_hyperparameters
    >>> from gpytorch_augment.testing import SVGP
    >>> x = torch.linspace(-3, 3, 60, dtype=torch.float64).unsqueeze(-1)
    >>> y = (x.squeeze(-1).sin() > 0).double()
    >>> y[::7] = 1 - y[::7]                      # noisy labels (separable ones send the outputscale to infinity)
    >>> model = SVGP(x[::6].clone()).double()
    >>> result = fit_hyperparameters(CAVI(model, BernoulliLogitLikelihood(), num_data=60), x, y)
    >>> result.status.value, result.objective, sorted(result.default_priors)
    ('converged', 'MAP', ['covar_module.base_kernel.lengthscale', 'covar_module.outputscale'])
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .._validation import as_tensors
from ..core import ObservedData
from ..likelihoods.augmented_likelihood import AugmentedLikelihood
from ._batches import Clock, progress_bar
from ._fit_setup import Rule, fit_config
from ._modes import training_mode
from .collapse import SPREAD_TOL, is_constant, latent_spread
from .convergence import CAVITrace, Convergence, RelativeChange
from .default_priors import default_priors, initial_point, registered, user_priors
from .engine import CAVIEngine
from .fit_options import FitOptions
from .fit_result import FitResult, FitStatus
from .lbfgs import OPTIMIZERS
from .nested import NestedObjective, NestedProtocol

__all__ = ["NESTED_MAX_DATA", "choose_protocol", "fit_hyperparameters", "hyperparameters_of"]

#: above this many training points the default protocol is ``"subsample"`` (chosen on pilot data:
#: ``benchmarks/README.md``, ``large_fits.py``)
NESTED_MAX_DATA = 10_000

#: the CAVI steps that start an L-BFGS run of the subsample protocol from the previous subsample's q(u) (the true
#: ELBO's natural-gradient steps of :meth:`NestedProtocol.finish` complete them; on pilot data one step already
#: reached the same optimum as ten)
WARM_STEPS = 3

#: a run on a subsample stops at this multiple of ``tol``: it only has to place the hyper-parameters for the next,
#: larger subsample (on pilot data it cut the second run's iterations from 21 to 4-8 at the same test NLL)
SUBSAMPLE_TOL_FACTOR = 10.0

#: the subsamples stop growing after this many doublings in a row each gained less than ``subsample_tol`` (one
#: gain is a noisy estimate: on pilot data a doubling gained 4e-4 nats per datum and the next 2e-3)
SETTLED_DOUBLINGS = 2

#: settled gains stop the subsamples' growth only where this many standard errors of the gradient per datum on all
#: the data, estimated from the last subsample (:meth:`NestedObjective.sampling_error`), fit within ``gtol`` (so that
#: its hyper-parameters pass the stationarity test on all the data without L-BFGS iterations there), or where the
#: next subsample would be all the data (the measurements: ``benchmarks/README.md``, ``large_fits.py``)
SAMPLING_Z = 2.0

#: the lengthscales of the restarts after a collapse, as multiples of the data-aware start (the first restart
#: starts there; the second at lengthscales one prior standard deviation of log-lengthscale longer)
COLLAPSE_RESTART_SCALES = (1.0, math.exp(math.sqrt(3.0)))


def choose_protocol(likelihood: AugmentedLikelihood, num_data: int) -> str:
    """``"nested"`` for at most :data:`NESTED_MAX_DATA` points (and for a likelihood with linear observations, which
    are fitted all at once), ``"subsample"`` above (every other likelihood: both protocols need only closed-form CAVI
    steps and the true ELBO, which all of them have)."""
    return "subsample" if num_data > NESTED_MAX_DATA and not likelihood.linear_observations else "nested"


def hyperparameters_of(cavi: CAVIEngine, learn_inducing_locations: bool | None = None) -> list[Tensor]:
    """The tensors a fit learns: every parameter of the model and the likelihood that requires a gradient, except
    :math:`q(u)`'s; the inducing inputs as the model declares them (``None``), always (``True``: they must be a
    parameter, ``learn_inducing_locations=True`` in the strategy) or never (``False``)."""
    Z = cavi.strategy.inducing_points
    if learn_inducing_locations and not (isinstance(Z, torch.nn.Parameter) and Z.requires_grad):
        raise ValueError(
            "learn_inducing_locations=True needs inducing points that are a parameter: build the strategy with "
            "learn_inducing_locations=True"
        )
    variational = {id(p) for p in cavi.model.variational_parameters()}
    seen: set[int] = set()
    params = []
    for p in (*cavi.model.parameters(), *cavi.likelihood.parameters()):
        if not p.requires_grad or id(p) in variational or id(p) in seen:
            continue
        if p is Z and learn_inducing_locations is False:
            continue
        seen.add(id(p))
        params.append(p)
    return params


def _parameter_name(cavi: CAVIEngine, tensor: Tensor) -> str:
    """``tensor``'s name as ``model.<name>`` or ``likelihood.<name>``."""
    for prefix, module in (("model", cavi.model), ("likelihood", cavi.likelihood)):
        for name, p in module.named_parameters():
            if p is tensor:
                return f"{prefix}.{name}"
    return "an unnamed parameter"


def fit_hyperparameters(
    cavi: CAVIEngine,
    x: Tensor,
    y: Tensor,
    options: FitOptions | dict[str, Any] | None = None,
    *,
    max_iter: int | None = None,
    tol: float | None = None,
    convergence: Rule | None = None,
    progress: bool = False,
    callback: Callable[[int, float], object] | None = None,
    generator: torch.Generator | None = None,
    **kwargs: Any,
) -> FitResult:
    r"""Learn :math:`q(u)` and the hyper-parameters together (what ``CAVI.fit(..., learn_hyperparameters=True)``
    runs); the module docstring says how.

    :param cavi: the engine (a :class:`~gpytorch_augment.CAVI`), used through
        :class:`~gpytorch_augment.inference.engine.CAVIEngine`.
    :param x: all the training inputs, ``(N, D)``.
    :param y: all the training targets, ``(N,)`` (one target per point, for multi-latent likelihoods too).
    :param options: a :class:`~gpytorch_augment.inference.fit_options.FitOptions` (or a dict of its fields).
    :param max_iter: overrides ``options.max_iter``.
    :param tol: overrides ``options.tol``.
    :param convergence: a :class:`~gpytorch_augment.inference.convergence.Convergence` or callable ``trace -> bool``
        replacing the default rule (checked after every iteration or step; its time is not counted); a stop by it
        is final.
    :param progress: show a progress bar with the objective.
    :param callback: called as ``callback(t, objective)`` after every iteration or step.
    :param generator: stochastic: the mini-batches.
    :param kwargs: the likelihood's per-datum keyword arguments (e.g. ``trials=``).
    :returns: a :class:`~gpytorch_augment.inference.fit_result.FitResult`.
    :raises ValueError: on a bad argument, an option that does not apply to the protocol, or bad data.
    """
    options = FitOptions.from_mapping(options, max_iter=max_iter, tol=tol)
    if x is None or y is None:
        raise ValueError("learn_hyperparameters=True needs the training data x and y")
    x, y = as_tensors(x, y, kwargs=kwargs)
    data = cavi.check_data(x, y, kwargs, where="CAVI.fit")  # the whole data, once
    protocol = options.protocol
    if protocol == "auto":
        # with sharded data (torch.distributed) only the stochastic protocol reduces over the ranks
        protocol = "stochastic" if cavi.distributed else choose_protocol(cavi.likelihood, data.num_data)
    elif protocol in ("nested", "subsample") and cavi.distributed:
        raise ValueError(
            f"protocol={protocol!r} works on one process's data only; with sharded data (torch.distributed) use "
            "protocol='stochastic' (or 'auto', which chooses it)"
        )
    if protocol in ("subsample", "stochastic") and cavi.likelihood.linear_observations:
        raise ValueError(
            f"{type(cavi.likelihood).__name__} reads linear combinations of the inputs: its hyper-parameters are "
            f"learnt by the nested protocol only (protocol={protocol!r} fits subsets of the data)"
        )
    options = options.resolved(protocol)
    params = hyperparameters_of(cavi, options.learn_inducing_locations)
    if cavi.likelihood.real_valued_targets:
        _warn_unstandardised(y)
    # a constant target (as given: the successes, not the trials) is fitted best by a constant predictor
    constant = not cavi.likelihood.linear_observations and bool((y == y.reshape(-1)[0]).all())
    run = _Run(cavi, data, params, options, convergence, progress, callback, generator, constant)
    with training_mode(cavi.model, cavi.likelihood):
        result = run.fit()
    if not result.converged:
        warnings.warn(f"the {protocol} protocol {result.message} (result.status: {result.status.value})",
                      UserWarning, stacklevel=3)  # fmt: skip
    return result


@dataclass
class _Attempt:
    """One run of a protocol from one start: its result, its final objective and the state it ended at."""

    result: FitResult
    value: float
    constant: bool
    state: tuple[list[Tensor], list[Tensor]]


class _Run:
    """One fit: the first run of the protocol, then restarts after a collapse; keeps the best attempt."""

    def __init__(
        self, cavi: CAVIEngine, data: ObservedData, params: list[Tensor], options: FitOptions,
        convergence: Rule | None, progress: bool, callback: Callable[[int, float], object] | None,
        generator: torch.Generator | None, constant_targets: bool,
    ) -> None:  # fmt: skip
        self.cavi, self.data, self.x, self.params, self.options = cavi, data, data.x, params, options
        self.convergence, self.progress, self.callback, self.generator = convergence, progress, callback, generator
        self.initial = self._state()
        self.num_latents = int(cavi.likelihood.num_latents) if not cavi.likelihood.linear_observations else 1
        #: a constant target is fitted best by a constant predictor: no collapse to restart from or warn about
        self.constant_targets = constant_targets

    def fit(self) -> FitResult:
        options = self.options
        started_at_data = initial_point(self.cavi.model, self.x) if options.initialise else []
        defaults = default_priors(self.cavi.model, self.x) if options.priors else []
        with registered(defaults):
            priors = {**user_priors(self.cavi.model), **{f"likelihood.{k}": v
                                                         for k, v in user_priors(self.cavi.likelihood).items()}}
            attempts = [self._attempt()]
            scales = COLLAPSE_RESTART_SCALES if not started_at_data else COLLAPSE_RESTART_SCALES[1:]
            for scale in scales[: options.collapse_restarts]:
                if not attempts[-1].constant:
                    break
                self._restore(self.initial)
                initial_point(self.cavi.model, self.x, force=True, scale=scale)
                attempts.append(self._attempt())
        best = max(attempts, key=lambda a: (not a.constant, a.value))
        self._restore(best.state)
        result = best.result
        result.objective = "MAP" if priors else "ML-II"
        result.priors = priors
        result.default_priors = tuple(p.name for p in defaults)
        result.attempts = [a.result.status.value if not a.constant else "collapsed" for a in attempts]
        result.restarted_after_collapse = best is not attempts[0]
        if result.restarted_after_collapse:
            result.message = "restarted from a data-aware point after a collapse: " + result.message
        if best.constant:
            spread = float(latent_spread(self.cavi.model, self.x, self.num_latents).max())
            result.status = FitStatus.COLLAPSED
            result.message = (
                f"ended at a constant predictor (the latent posterior mean varies by {spread:.2g} < {SPREAD_TOL:g} "
                f"over the training inputs) after {len(attempts) - 1} restart(s) from data-aware points: the "
                "targets show no dependence on the inputs that the kernel can represent (a constant target, or "
                "inputs unrelated to it), or the kernel's scales are far from the data's (standardise x)"
            )
        return result

    def _state(self) -> tuple[list[Tensor], list[Tensor]]:
        """Copies of the hyper-parameters and of :math:`q(u)`."""
        return [p.detach().clone() for p in self.params], self.cavi.q_state()

    def _restore(self, state: tuple[list[Tensor], list[Tensor]]) -> None:
        with torch.no_grad():
            for p, saved in zip(self.params, state[0]):
                p.copy_(saved)
        self.cavi.load_q_state(state[1])

    def _attempt(self) -> _Attempt:
        protocol = self.options.protocol
        if protocol == "stochastic":
            result, value = self._stochastic()
        else:
            result, value = self._subsample() if protocol == "subsample" else self._nested()
        constant = not self.constant_targets and is_constant(self.cavi.model, self.x, self.num_latents)
        return _Attempt(result, value, constant, self._state())

    # ---------------------------------------------------------------------------------------------- stochastic
    def _stochastic(self) -> tuple[FitResult, float]:
        """Mini-batch CAVI with fused Adam steps: the engine's inner loop with an Adam ``hyper_optimizer``."""
        o = self.options
        optimizer = torch.optim.Adam(self.params, lr=o.lr)
        config = fit_config(
            self.cavi, self.data, max_iter=o.max_iter, tol=o.tol, hyper_optimizer=optimizer, hyper_steps=1,
            batch_size=o.batch_size, data_loader=None, num_epochs=o.num_epochs, convergence=self.convergence,
            generator=self.generator,
        )  # fmt: skip
        trace = self.cavi.run(config, self.callback, self.progress)
        status = FitStatus.CONVERGED if trace.converged else FitStatus.CAP
        message = "met its stopping rule" if trace.converged else (
            f"stopped on its cap ({_stochastic_cap(o)}) before its convergence rule was met: raise the cap or "
            "loosen tol"
        )
        last = [v for v, e in zip(trace.elbo, trace.epoch) if e == trace.epoch[-1]] if trace.elbo else [-math.inf]
        value = sum(last) / len(last)
        result = FitResult(**vars(trace), status=status, message=message, protocol="stochastic", optimizer="adam",
                           final_objective=value)  # fmt: skip
        return result, value

    # -------------------------------------------------------------------------------------------------- nested
    def _nested(self) -> tuple[FitResult, float]:
        """The nested protocol on all the data: :meth:`_lbfgs` with ``max_iter`` iterations."""
        if self.data.num_data != self.cavi.num_data:
            raise ValueError(
                f"y has {self.data.num_data} data points but CAVI was built with num_data={self.cavi.num_data}"
            )
        trace, clock = CAVITrace(), Clock()
        run = self._lbfgs(self.cavi, self.data, self.options.max_iter, trace, clock)
        result = FitResult(**vars(trace), status=run.status, message=run.message, protocol="nested",
                           optimizer=self.options.optimizer, gradient=run.gradient,
                           final_objective=run.value)  # fmt: skip
        return result, run.value

    def _lbfgs(self, cavi: CAVIEngine, data: ObservedData, max_iter: int, trace: CAVITrace, clock: Clock,
               probe: bool = False, warm: bool = False, tol: float | None = None) -> _LBFGSRun:  # fmt: skip
        """L-BFGS iterations on ``data`` (``cavi`` built for them) until the rule, a stall or ``max_iter``, then
        :meth:`NestedProtocol.finish` and the stationarity test; a stop that fails it goes on in polish mode, at
        most ``restarts`` times. The iterations are appended to ``trace``. ``probe``: first test the start itself,
        and iterate only where it is not stationary. ``warm``: :math:`q(u)` already fits nearly these
        hyper-parameters (a previous subsample's), so :data:`WARM_STEPS` CAVI steps start the run instead of
        ten (:meth:`NestedProtocol.finish` completes them). ``tol`` replaces the options' ``tol``."""
        o = self.options
        rule = RelativeChange(o.tol if tol is None else tol, window=1) if self.convergence is None else self.convergence
        if isinstance(rule, Convergence):
            rule.reset()
        first = trace.num_steps
        bar = progress_bar(max_iter, desc="nested L-BFGS", unit="iteration") if self.progress else None
        state = {"since": 0, "restarted": 0, "fresh": False}  # fresh: L-BFGS restarted, on polish or a new objective

        def on_iteration(value: float) -> bool:
            trace.elbo.append(value)
            trace.time.append(clock.elapsed())
            trace.epoch.append(trace.num_steps - 1)
            trace.step_size.append(1.0)
            state["since"] += 1
            if self.callback is not None:
                self.callback(trace.num_steps - 1, value)
            if bar is not None:
                bar.set_postfix({"objective": f"{value:.5f}"}, refresh=False)
                bar.update(1)
            with clock.paused():
                done = rule.check(trace, True) if isinstance(rule, Convergence) else bool(rule(trace))
            return done and (not state["fresh"] or state["since"] >= 2)  # not right after a restart

        run_optimizer = OPTIMIZERS[o.optimizer]
        try:
            protocol = NestedProtocol(
                cavi, data, self.params, inner_steps=o.inner_steps, true_steps=o.true_steps,
                max_line_search=o.max_line_search, **({"initial_steps": WARM_STEPS} if warm else {}),
            )  # fmt: skip
            protocol.start()
            protocol.finish()  # q(u) at its optimum for the starting hyper-parameters
            if probe:
                gradient = protocol.stationarity()
                start_value = protocol.tested_value
                if gradient <= o.gtol or max_iter < 1:
                    stop = "stopped on all the data after the subsamples"
                    status, message = self._judge_gradient(gradient, stop, protocol.largest_at)
                    return _LBFGSRun(status, message, gradient, start_value, start_value)
            else:
                start_value = protocol.objective_value()
            likelihood = cavi.likelihood
            if o.elbo_bound and likelihood.has_elbo_bound and self.convergence is None:
                # first stage: the objective with the likelihood's cheaper bound, to its own stopping rule
                with likelihood.elbo_bound():
                    run_optimizer(protocol, on_iteration, max_iter - 1)
                protocol.reset()  # L-BFGS afresh on the exact objective, q(u) re-solved for it
                rule.reset()
                state["since"], state["fresh"] = 0, True
            while True:
                outcome = run_optimizer(protocol, on_iteration, max_iter - (trace.num_steps - first))
                protocol.finish()  # q(u) at its optimum for these hyper-parameters
                status, message, gradient = self._judge(protocol, outcome, max_iter)
                if status is not FitStatus.NOT_STATIONARY or state["restarted"] >= o.restarts:
                    break
                if max_iter - (trace.num_steps - first) < 1:
                    status, message = FitStatus.CAP, _nested_cap(max_iter)
                    break
                state["restarted"], state["since"], state["fresh"] = state["restarted"] + 1, 0, True
                protocol.restart()  # L-BFGS afresh, in polish mode, from the refreshed q(u)
            value = protocol.objective_value()
            if trace.time:
                trace.time[-1] = clock.elapsed()
        finally:
            if bar is not None:
                bar.close()
        if status is FitStatus.NOT_STATIONARY:
            message += f" after {state['restarted']} restart(s): the hyper-parameters may be short of their optimum " \
                       "or drifting along a ridge (check them; hyper_options={'restarts': 2} polishes them towards " \
                       "a stationary point; standardised inputs and targets, or a prior on that parameter, can help)"
        return _LBFGSRun(status, message, gradient, value, start_value)

    # ----------------------------------------------------------------------------------------------- subsample
    def _subsample(self) -> tuple[FitResult, float]:
        """The nested protocol on nested subsamples of a random order of the data, doubling from
        ``subsample_size`` until :data:`SETTLED_DOUBLINGS` doublings in a row each raise the objective per datum by
        less than ``subsample_tol`` and :data:`SAMPLING_Z` standard errors of the gradient per datum on all the data
        (estimated from the subsample) fit within ``gtol`` or the next subsample would be all the data (or the
        subsample is all the data: an L-BFGS run there); then :math:`q(u)` for all the data and the stationarity
        test there, with at most ``polish_iter`` L-BFGS iterations on all the data where it fails."""
        o, data, num_data = self.options, self.data, self.data.num_data
        if num_data != self.cavi.num_data:
            raise ValueError(f"y has {num_data} data points but CAVI was built with num_data={self.cavi.num_data}")
        # drawn on the generator's device (a CPU generator with CUDA data works), then moved to the data's
        device = torch.device(self.generator.device if self.generator is not None else data.x.device)
        order = torch.randperm(num_data, generator=self.generator, device=device).to(data.x.device)
        trace, clock = CAVITrace(), Clock()
        stages: list[dict[str, Any]] = []
        size = min(o.subsample_size, num_data)
        while size < num_data:
            began, steps = clock.elapsed(), trace.num_steps
            engine, subset = self.cavi.on_subset(size), data.take(order[:size])
            run = self._lbfgs(engine, subset, o.max_iter, trace, clock, warm=bool(stages),
                              tol=SUBSAMPLE_TOL_FACTOR * o.tol)  # fmt: skip
            gain = run.value - run.start_value if stages else None
            stages.append({"num_data": size, "iterations": trace.num_steps - steps, "gain": gain,
                           "status": run.status.value, "sampling_error": None})  # fmt: skip
            gains = [st["gain"] for st in stages[1:]]
            settled = len(gains) >= SETTLED_DOUBLINGS and max(gains[-SETTLED_DOUBLINGS:]) < o.subsample_tol
            if settled:  # and the gradient on all the data is predicted to pass the stationarity test
                error = NestedObjective(engine, subset).sampling_error(self.params, num_data)
                stages[-1]["sampling_error"] = error
                # where the next subsample would be all the data, the test there and a short polish cost less than
                # an L-BFGS run on all of them
                settled = SAMPLING_Z * error <= o.gtol or 4 * size > num_data
            stages[-1]["seconds"] = clock.elapsed() - began
            if settled:
                break
            # a subsample of more than half the data costs nearly what all of them do: go to all of them instead
            size = 2 * size if 4 * size <= num_data else num_data
        began, steps = clock.elapsed(), trace.num_steps
        if size < num_data:  # the subsamples have settled: all the data, polished only where not stationary
            run = self._lbfgs(self.cavi, data, o.polish_iter, trace, clock, probe=True, warm=True)
        else:
            run = self._lbfgs(self.cavi, data, o.max_iter, trace, clock, warm=bool(stages))
        stages.append({"num_data": num_data, "iterations": trace.num_steps - steps, "gain": run.value - run.start_value,
                       "status": run.status.value, "sampling_error": 0.0,
                       "seconds": clock.elapsed() - began})  # fmt: skip
        result = FitResult(**vars(trace), status=run.status, message=run.message, protocol="subsample",
                           optimizer=o.optimizer, gradient=run.gradient, final_objective=run.value,
                           stages=stages)  # fmt: skip
        return result, run.value

    def _judge(self, protocol: NestedProtocol, outcome: str, max_iter: int) -> tuple[FitStatus, str, float | None]:
        """How a run of the optimizer ended: the status, the reason and the final gradient."""
        if outcome == "rule" and self.convergence is not None:  # the caller's rule is final
            return FitStatus.CONVERGED, "met the caller's convergence rule", None
        gradient = protocol.stationarity()
        if outcome == "cap":
            return FitStatus.CAP, _nested_cap(max_iter), gradient
        stop = "met its stopping rule" if outcome == "rule" else "stopped where L-BFGS makes no further progress"
        status, message = self._judge_gradient(gradient, stop, protocol.largest_at)
        if status is FitStatus.CERTIFIED and outcome == "rule":
            status = FitStatus.CONVERGED
        return status, message, gradient

    def _judge_gradient(self, gradient: float, stop: str, largest_at: int | None) -> tuple[FitStatus, str]:
        """Certified where the objective's largest gradient entry per datum, ``gradient``, is at most ``gtol``, else
        not stationary; the reason names the stop (``stop``, in words) and the parameter at ``largest_at``."""
        gtol = self.options.gtol
        if gradient <= gtol:
            return FitStatus.CERTIFIED, f"{stop}{'' if stop.startswith('met') else ','} at a stationary point " \
                                        f"(gradient {gradient:.2g} <= gtol={gtol:g} per datum)"  # fmt: skip
        where = _parameter_name(self.cavi, self.params[largest_at]) if largest_at is not None else "?"
        return FitStatus.NOT_STATIONARY, (
            f"{stop}, but the objective's largest gradient in the hyper-parameters is {gradient:.2g} per datum "
            f"(> gtol={gtol:g}, in {where})"
        )


@dataclass
class _LBFGSRun:
    """How one L-BFGS run ended: its status, reason and final gradient, and the objective per datum at its start
    (:math:`q(u)` at its optimum) and at its end."""

    status: FitStatus
    message: str
    gradient: float | None
    value: float
    start_value: float


def _nested_cap(max_iter: int) -> str:
    return f"stopped on its cap ({max_iter} L-BFGS iterations) before its convergence rule was met: raise the cap " \
           "(max_iter; polish_iter on all the data after subsamples) or loosen tol"  # fmt: skip


def _stochastic_cap(o: FitOptions) -> str:
    if o.max_iter is not None:
        return f"max_iter={o.max_iter} steps or num_epochs={o.num_epochs}"
    return f"num_epochs={o.num_epochs} epochs"


def _warn_unstandardised(y: Tensor) -> None:
    """Warn when real-valued targets are far from standardised: the kernel's outputscale, the likelihood's scale and
    the mean start at 1 and 0, and L-BFGS in GPyTorch's raw (softplus) coordinates may stop far from the optimum."""
    if not y.is_floating_point() or y.numel() < 2:
        return
    wide = y.detach().to(torch.float64)
    location, spread = float(wide.mean()), float(wide.std())
    if spread < 1e-2 or spread > 1e2 or abs(location) > 10 * spread + 10:
        warnings.warn(
            f"the targets have mean {location:.3g} and standard deviation {spread:.3g}, far from standardised: every "
            "scale of the model starts at 1 and its mean at 0, so the fit may stop far from the optimum. Standardise "
            "y first ((y - y.mean()) / y.std()) and transform the predictions back",
            UserWarning,
            stacklevel=4,
        )
