r"""One-call fits that learn the hyper-parameters: ``CAVI.fit(x, y, learn_hyperparameters=True)``.

Two protocols, chosen by :func:`choose_protocol` from the data size:

* ``"nested"`` (up to :data:`NESTED_MAX_DATA` points) -- L-BFGS on the hyper-parameters :math:`\theta` alone, on
  :math:`J(\theta)`, GPyTorch's true ``VariationalELBO`` at the :math:`q(u)` that ``inner_steps`` closed-form CAVI
  steps reach from a snapshot (:mod:`~gpytorch_augment.inference.nested`). Every evaluation costs one kernel
  evaluation on all the data, a few closed-form CAVI steps and one backward pass; L-BFGS's strong-Wolfe line search
  sees a deterministic function. Stops when :math:`J` changes by less than ``tol`` (relative) between iterations
  or L-BFGS cannot move; such a stop counts as converged only where the true ELBO's gradient in :math:`\theta`, at
  the optimal :math:`q(u)`, is below :data:`NESTED_GTOL` per datum (else a warning; ``restarts`` polishes it).
* ``"stochastic"`` (above it, and with data sharded over processes) -- mini-batch CAVI (``batch_size``, the default
  Robbins-Monro step on :math:`q(u)`) with one Adam step (``lr``) on the CAVI's ``hyper_objective`` per CAVI step,
  fused with it (one kernel evaluation per batch): :meth:`CAVI.fit` with ``hyper_optimizer``. Stops when the
  epoch-averaged bound changes by less than ``tol`` (relative) or after ``num_epochs`` epochs.

Both protocols put the model and the likelihood in training mode and restore the caller's modes, validate the data
once, warn and return ``trace.converged = False`` when they stop on a cap, and leave :math:`q(u)` at its optimum for
the final hyper-parameters. The trace (:class:`~gpytorch_augment.inference.convergence.CAVITrace`) holds, per
iteration or step, the objective per datum (nested: the true ELBO entering the iteration; stochastic: the augmented
bound's mini-batch estimate) and the training wall time.

Example::

    >>> import torch
    >>> from gpytorch_augment import CAVI, BernoulliLogitLikelihood
    >>> from gpytorch_augment.testing import SVGP
    >>> x = torch.linspace(-3, 3, 60, dtype=torch.float64).unsqueeze(-1)
    >>> y = (x.squeeze(-1).sin() > 0).double()
    >>> y[::7] = 1 - y[::7]                      # noisy labels (separable ones send the outputscale to infinity)
    >>> model = SVGP(x[::6].clone()).double()
    >>> trace = CAVI(model, BernoulliLogitLikelihood(), num_data=60).fit(x, y, learn_hyperparameters=True)
    >>> trace.converged, trace.elbo[-1] > trace.elbo[0]
    (True, True)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._validation import check_integer, check_nonempty, check_real, checked_data
from ._batches import Clock, progress_bar
from ._modes import training_mode
from .convergence import CAVITrace, Convergence, RelativeChange
from .nested import NestedProtocol

__all__ = ["NESTED_MAX_DATA", "choose_protocol", "fit_hyperparameters", "hyperparameters_of"]

#: above this many training points the default protocol is ``"stochastic"`` (the nested protocol evaluates the
#: kernel on all the data at once; ``benchmarks/README.md`` has the measured crossover)
NESTED_MAX_DATA = 50_000

PROTOCOLS = ("auto", "nested", "stochastic")

#: the defaults of the caps and tolerances, per protocol
NESTED_MAX_ITER = 500
NESTED_TOL = 1e-6
#: the nested protocol's stationarity test: a stop (rule or stall) counts as converged when the true ELBO's
#: gradient per datum in the hyper-parameters, with q(u) at its optimum, is at most this in every entry (measured
#: by benchmarks/stationarity.py: stops that polishing does not move end at 1e-6 to 8.5e-3; stalls 0.2 to 0.4 nats
#: per datum below a reachable ELBO at 1.2e-2 to 2.3e-2)
NESTED_GTOL = 1e-2
#: the default of ``restarts``: restarts in polish mode (:meth:`NestedProtocol.restart`) after a stop that fails the
#: stationarity test. None: on logistic-softmax (satimage, 300 points, 36 ARD inputs) polishing to the stationary
#: point took 6 to 19 times longer and ended 0.03 to 0.09 nats worse in test NLL (benchmarks/stationarity.py)
NESTED_RESTARTS = 0
#: evaluations of J that one strong-Wolfe line search of the nested protocol may spend (torch's own default;
#: benchmarks/line_search.py measures 10: 12% fewer evaluations, the same stops, test NLL within -0.002 to +0.008)
NESTED_MAX_LINE_SEARCH = 25
STOCHASTIC_NUM_EPOCHS = 20
STOCHASTIC_TOL = 1e-4


def choose_protocol(likelihood: Any, num_data: int) -> str:
    """``"nested"`` for at most :data:`NESTED_MAX_DATA` points, ``"stochastic"`` otherwise (every likelihood: the
    nested protocol needs only closed-form CAVI steps and the true ELBO, which all of them have)."""
    return "stochastic" if num_data > NESTED_MAX_DATA else "nested"


def hyperparameters_of(cavi: Any, learn_inducing_locations: bool | None = None) -> list[Tensor]:
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


def _parameter_name(cavi: Any, tensor: Tensor) -> str:
    """``tensor``'s name as ``model.<name>`` or ``likelihood.<name>``."""
    for prefix, module in (("model", cavi.model), ("likelihood", cavi.likelihood)):
        for name, p in module.named_parameters():
            if p is tensor:
                return f"{prefix}.{name}"
    return "an unnamed parameter"


def fit_hyperparameters(
    cavi: Any,
    x: Tensor,
    y: Tensor,
    *,
    protocol: str = "auto",
    max_iter: int | None = None,
    tol: float | None = None,
    convergence: Convergence | Callable[[CAVITrace], bool] | None = None,
    learn_inducing_locations: bool | None = None,
    inner_steps: int = 3,
    true_steps: int = 3,
    restarts: int = NESTED_RESTARTS,
    batch_size: int = 1024,
    lr: float = 0.05,
    num_epochs: int | None = None,
    progress: bool = False,
    callback: Callable[[int, float], Any] | None = None,
    generator: torch.Generator | None = None,
    **kwargs: Any,
) -> CAVITrace:
    r"""Learn :math:`q(u)` and the hyper-parameters together (what ``CAVI.fit(..., learn_hyperparameters=True)``
    runs); see the module docstring for the two protocols.

    :param x: all the training inputs, ``(N, D)``.
    :param y: all the training targets, ``(N,)`` (``(N, T)`` never: multi-latent likelihoods take one target per
        point too).
    :param protocol: ``"auto"`` (:func:`choose_protocol`; always ``"stochastic"`` with sharded data), ``"nested"``
        (one process only) or ``"stochastic"``.
    :param max_iter: the cap on L-BFGS iterations (nested, default 500) or on CAVI steps (stochastic, default none).
    :param tol: the default rule's relative tolerance (nested: on :math:`J` between iterations, default ``1e-6``;
        stochastic: on the epoch-averaged bound, default ``1e-4``).
    :param convergence: a :class:`~gpytorch_augment.inference.convergence.Convergence` or callable ``trace -> bool``
        replacing the default rule (checked after every iteration or step; its time is not counted).
    :param learn_inducing_locations: see :func:`hyperparameters_of`.
    :param inner_steps: nested: the CAVI steps of every evaluation of :math:`J`.
    :param true_steps: nested: natural-gradient steps of :math:`q(u)` on the true ELBO after them
        (:meth:`~gpytorch_augment.inference.nested.NestedObjective._true_elbo_step`).
    :param restarts: nested: how many times a stop that fails the stationarity test (:data:`NESTED_GTOL`) goes on
        in polish mode (:meth:`~gpytorch_augment.inference.nested.NestedProtocol.restart`: exact gradients,
        :math:`q(u)` re-solved after every iteration) before the fit gives up with a warning.
    :param batch_size: stochastic: the mini-batch size.
    :param lr: stochastic: Adam's learning rate.
    :param num_epochs: stochastic: the cap on epochs (default 20). The nested protocol has no epochs
        (``ValueError``).
    :param progress: show a progress bar with the objective.
    :param callback: called as ``callback(t, objective)`` after every iteration or step.
    :param generator: stochastic: the mini-batches.
    :raises ValueError: on a bad argument or bad data.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    if x is None or y is None:
        raise ValueError("learn_hyperparameters=True needs the training data x and y")
    _check_numbers(inner_steps=inner_steps, true_steps=true_steps, restarts=restarts, batch_size=batch_size,
                   max_iter=max_iter, lr=lr, tol=tol)  # fmt: skip
    if protocol == "auto":
        # with sharded data (torch.distributed) only the stochastic protocol reduces over the ranks
        protocol = "stochastic" if cavi.distributed else choose_protocol(cavi.likelihood, y.shape[-1])
    elif protocol == "nested" and cavi.distributed:
        raise ValueError(
            "protocol='nested' works on one process's data only; with sharded data (torch.distributed) use "
            "protocol='stochastic' (or 'auto', which chooses it)"
        )
    if protocol == "stochastic" and cavi.likelihood.linear_observations:
        raise ValueError(
            f"{type(cavi.likelihood).__name__} reads linear combinations of the inputs: its hyper-parameters are "
            f"learnt by the nested protocol only (one process, at most {NESTED_MAX_DATA} observations)"
        )
    if protocol == "nested" and num_epochs is not None:
        raise ValueError("num_epochs applies to the stochastic protocol only; the nested protocol caps max_iter")
    params = hyperparameters_of(cavi, learn_inducing_locations)
    if cavi.likelihood.real_valued_targets:
        _warn_unstandardised(y)
    with training_mode(cavi.model, cavi.likelihood):
        if protocol == "stochastic":
            trace = _fit_stochastic(
                cavi, x, y, params, max_iter=max_iter, tol=STOCHASTIC_TOL if tol is None else float(tol),
                batch_size=int(batch_size), lr=float(lr), num_epochs=num_epochs, convergence=convergence,
                progress=progress, callback=callback, generator=generator, kwargs=kwargs,
            )  # fmt: skip
            message = None if trace.converged else _cap_message(protocol, max_iter, num_epochs)
        else:
            trace, message = _fit_nested(
                cavi, x, y, params, max_iter=NESTED_MAX_ITER if max_iter is None else int(max_iter),
                tol=NESTED_TOL if tol is None else float(tol), inner_steps=int(inner_steps),
                true_steps=int(true_steps), restarts=int(restarts), convergence=convergence,
                progress=progress, callback=callback, kwargs=kwargs,
            )  # fmt: skip
    if not trace.converged:
        warnings.warn(f"the {protocol} protocol {message} (trace.converged is False)",
            UserWarning,
            stacklevel=3,
        )
    return trace


def _check_numbers(
    *, inner_steps: Any, true_steps: Any, restarts: Any, batch_size: Any, max_iter: Any, lr: Any, tol: Any
) -> None:
    """``ValueError`` naming the first numeric argument of :func:`fit_hyperparameters` out of its range."""
    for name, value, least in (("inner_steps", inner_steps, 1), ("true_steps", true_steps, 0),
                               ("restarts", restarts, 0), ("batch_size", batch_size, 1)):  # fmt: skip
        check_integer(name, value, least)
    check_integer("max_iter", max_iter, 1, optional=True)
    check_real("lr", lr, positive=True)
    check_real("tol", tol, optional=True)


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


def _cap_message(protocol: str, max_iter: int | None, num_epochs: int | None) -> str:
    return (
        f"stopped on its cap ({_cap_text(protocol, max_iter, num_epochs)}) before its convergence rule was met: "
        "raise the cap or loosen tol"
    )


def _cap_text(protocol: str, max_iter: int | None, num_epochs: int | None) -> str:
    if protocol == "nested":
        return f"max_iter={NESTED_MAX_ITER if max_iter is None else max_iter} L-BFGS iterations"
    if max_iter is not None:
        return f"max_iter={max_iter} steps or num_epochs={num_epochs or STOCHASTIC_NUM_EPOCHS}"
    return f"num_epochs={num_epochs or STOCHASTIC_NUM_EPOCHS} epochs"


def _fit_stochastic(
    cavi: Any, x: Tensor, y: Tensor, params: list[Tensor], *, batch_size: int, lr: float, num_epochs: int | None,
    kwargs: dict[str, Any], **options: Any,
) -> CAVITrace:  # fmt: skip
    """Mini-batch CAVI with fused Adam steps: :meth:`CAVI.fit` with ``hyper_optimizer`` (its cap warning is
    replaced by :func:`fit_hyperparameters`'s)."""
    optimizer = torch.optim.Adam(params, lr=lr)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="CAVI.fit stopped at max_iter")
        return cavi.fit(
            x, y, hyper_optimizer=optimizer, batch_size=batch_size,
            num_epochs=STOCHASTIC_NUM_EPOCHS if num_epochs is None else num_epochs, **options, **kwargs,
        )  # fmt: skip


def _fit_nested(
    cavi: Any,
    x: Tensor,
    y: Tensor,
    params: list[Tensor],
    *,
    max_iter: int,
    tol: float,
    inner_steps: int,
    true_steps: int,
    restarts: int,
    convergence: Any,
    progress: bool,
    callback: Callable[[int, float], Any] | None,
    kwargs: dict[str, Any],
) -> tuple[CAVITrace, str | None]:
    """The loop of the nested protocol: L-BFGS iterations until the rule, a stall or ``max_iter``, then
    :meth:`NestedProtocol.finish`. A stop by the default rule or a stall counts as converged only if it passes the
    stationarity test (:data:`NESTED_GTOL`); one that fails it goes on in polish mode, at most ``restarts`` times.
    Returns the trace and, when it did not converge, why."""
    cavi._check_inputs(x, y)
    check_nonempty(x, "CAVI.fit")
    targets = cavi.likelihood.check_targets(y, **kwargs)  # the whole data, once; later checks skip the values
    if targets.shape[-1] != cavi.num_data:
        raise ValueError(f"y has {targets.shape[-1]} data points but CAVI was built with num_data={cavi.num_data}")
    rule = RelativeChange(tol, window=1) if convergence is None else convergence
    if isinstance(rule, Convergence):
        rule.reset()
    trace, clock = CAVITrace(), Clock()
    bar = progress_bar(max_iter, desc="nested L-BFGS", unit="iteration") if progress else None
    message, restarted, since = _cap_message("nested", max_iter, None), 0, 0
    try:
        with checked_data():
            protocol = NestedProtocol(cavi, x, y, params, inner_steps=inner_steps, true_steps=true_steps,
                                      max_line_search=NESTED_MAX_LINE_SEARCH, **kwargs)  # fmt: skip
            for t in range(max_iter):
                value = protocol.step()
                trace.elbo.append(value)
                trace.time.append(clock.elapsed())
                trace.epoch.append(t)
                trace.step_size.append(1.0)
                since += 1
                if callback is not None:
                    callback(t, value)
                if bar is not None:
                    bar.set_postfix({"ELBO": f"{value:.5f}"}, refresh=False)
                    bar.update(1)
                with clock.paused():
                    done = rule.check(trace, True) if isinstance(rule, Convergence) else bool(rule(trace))
                done = done and (not restarted or since >= 2)  # not on the first iteration after a restart
                if not (done or protocol.stalled):
                    continue
                protocol.finish()  # q(u) at its optimum for these hyper-parameters
                if done and convergence is not None:  # the caller's rule is final
                    trace.converged = True
                    break
                gradient = protocol.stationarity()
                if gradient <= NESTED_GTOL:
                    trace.converged = True
                    break
                if restarted < restarts:  # L-BFGS afresh, in polish mode, from the refreshed q(u)
                    restarted, since = restarted + 1, 0
                    protocol.restart()
                    continue
                where = _parameter_name(cavi, params[protocol.largest_at]) if protocol.largest_at is not None else "?"
                message = (
                    f"stopped where L-BFGS makes no further progress, but the true ELBO's largest gradient in the "
                    f"hyper-parameters is {gradient:.2g} per datum (> {NESTED_GTOL:g}, in {where}) after "
                    f"{restarted} restart(s): "
                    "the hyper-parameters may be short of their optimum or drifting along a ridge (check them; "
                    "hyper_options={'restarts': 2} polishes them towards a stationary point; standardised inputs "
                    "and targets, or a prior on that parameter, can help)"
                )
                break
            else:
                protocol.finish()
        trace.time[-1] = clock.elapsed()
    finally:
        if bar is not None:
            bar.close()
    return trace, None if trace.converged else message
