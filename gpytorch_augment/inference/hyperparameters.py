r"""One-call fits that learn the hyper-parameters: ``CAVI.fit(x, y, learn_hyperparameters=True)``.

Two protocols, chosen by :func:`choose_protocol` from the likelihood and the data size:

* ``"collapsed"`` -- block-coordinate ascent on the collapsed augmented bound
  :math:`\mathcal L^*(\theta)` of :class:`~gpytorch_augment.CollapsedAugmentedELBO`: each outer step sets
  :math:`q(\Omega)` (and :math:`q^*(u)`) in closed form, then a **fresh** L-BFGS (strong-Wolfe line search) runs
  ``lbfgs_iter`` iterations on :math:`\theta` with :math:`q(\Omega)` fixed. Both halves never decrease the bound. To
  make the early outer steps cheap, they run on a seeded random subset of the data that doubles every outer step
  (``subset`` points first) until it is all the data. Memory is :math:`O(\text{chunk}\cdot M + M^2)`. Once the
  bound is flat on all the data (or after 3 outer steps on all of it), fresh L-BFGS runs on GPyTorch's true
  ``VariationalELBO`` over :math:`\theta` and :math:`q(u)` together remove the bias of the augmented bound's
  maximiser (``polish``, default on; see :class:`CollapsedProtocol`); the rule ``convergence`` (default: relative
  change of the final phase's objective below ``tol``) decides when to stop.
* ``"stochastic"`` -- mini-batch CAVI (``batch_size``, the default Robbins-Monro step on :math:`q(u)`) with one Adam
  step (``lr``) on the CAVI's ``hyper_objective`` per CAVI step, fused with it (one kernel evaluation per batch):
  :meth:`CAVI.fit` with ``hyper_optimizer``. Used for likelihoods whose latents are updated in blocks (the
  heteroscedastic double bound, which has no closed-form collapsed bound) and above :data:`COLLAPSED_MAX_DATA`.

Every fit returns a :class:`~gpytorch_augment.inference.convergence.CAVITrace` (``elbo``: the bound per datum
entering each outer step or CAVI step; ``time``: training wall time) and leaves :math:`q(u)` at its optimum for the
final hyper-parameters.

Example::

    >>> import torch
    >>> from gpytorch_augment import CAVI, BernoulliLogitLikelihood
    >>> from gpytorch_augment.testing import SVGP
    >>> x = torch.linspace(-3, 3, 60, dtype=torch.float64).unsqueeze(-1)
    >>> y = (x.squeeze(-1).sin() > 0).double()
    >>> model = SVGP(x[::6].clone()).double()
    >>> trace = CAVI(model, BernoulliLogitLikelihood(), num_data=60).fit(x, y, learn_hyperparameters=True)
    >>> trace.elbo[-1] > trace.elbo[0]
    True
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import gpytorch
import torch
from gpytorch.variational import CholeskyVariationalDistribution
from torch import Tensor

from .._validation import check_inputs_targets
from ..likelihoods.augmented_likelihood import validated_latent_blocks
from ..mlls.collapsed_augmented_elbo import CollapsedAugmentedELBO
from ._batches import Clock, progress_bar
from .convergence import CAVITrace, Convergence, RelativeChange

__all__ = ["COLLAPSED_MAX_DATA", "CollapsedProtocol", "choose_protocol", "fit_hyperparameters", "hyperparameters_of"]

#: above this many training points the default protocol is ``"stochastic"``: a conservative threshold, not yet
#: measured (the collapsed protocol was measured up to 5,000 points, ``benchmarks/README.md``; issue 15 item 4)
COLLAPSED_MAX_DATA = 50_000

PROTOCOLS = ("auto", "collapsed", "stochastic")


def choose_protocol(likelihood: Any, num_data: int) -> str:
    """``"collapsed"`` where the likelihood has a collapsed bound (no ``latent_blocks``) and there are at most
    :data:`COLLAPSED_MAX_DATA` points, ``"stochastic"`` otherwise."""
    if validated_latent_blocks(likelihood) is not None or num_data > COLLAPSED_MAX_DATA:
        return "stochastic"
    return "collapsed"


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


def fit_hyperparameters(
    cavi: Any,
    x: Tensor,
    y: Tensor,
    *,
    protocol: str = "auto",
    max_iter: int | None = None,
    tol: float = 1e-6,
    convergence: Convergence | Callable[[CAVITrace], bool] | None = None,
    learn_inducing_locations: bool | None = None,
    subset: int = 2048,
    lbfgs_iter: int = 20,
    batch_size: int = 1024,
    lr: float = 0.05,
    num_epochs: int | None = None,
    chunk_size: int | None = None,
    polish: bool = True,
    progress: bool = False,
    callback: Callable[[int, float], Any] | None = None,
    generator: torch.Generator | None = None,
    **kwargs: Any,
) -> CAVITrace:
    r"""Learn :math:`q(u)` and the hyper-parameters together (what ``CAVI.fit(..., learn_hyperparameters=True)``
    runs); see the module docstring for the two protocols.

    :param protocol: ``"auto"`` (:func:`choose_protocol`; always ``"stochastic"`` with sharded data),
        ``"collapsed"`` (one process only) or ``"stochastic"``.
    :param max_iter: outer steps (collapsed, default 50) or CAVI steps (stochastic, default none).
    :param tol: the default rule's relative tolerance on the bound per datum.
    :param convergence: a :class:`~gpytorch_augment.inference.convergence.Convergence` or callable ``trace -> bool``
        replacing the default rule (checked after every outer or CAVI step, with the trace so far; its time is not
        counted in ``trace.time``). The default stops the collapsed protocol when the bound on all the data changes
        by less than ``tol`` relative between outer steps (``RelativeChange(tol)``; the subset steps do not count).
    :param learn_inducing_locations: see :func:`hyperparameters_of`.
    :param subset: collapsed: the points of the first outer step (doubled every step; ``>= N``: all from the start).
    :param lbfgs_iter: collapsed: L-BFGS iterations per outer step.
    :param batch_size: stochastic: the mini-batch size (default 1024, the prototype's best SVGP batch on magic).
    :param lr: stochastic: Adam's learning rate (the stochastic defaults are not tuned by a benchmark yet).
    :param num_epochs: stochastic: epochs (default 20).
    :param chunk_size: collapsed: data points per chunk of the bound.
    :param polish: collapsed: finish with L-BFGS on the true ``VariationalELBO`` (:class:`CollapsedProtocol`).
    :param progress: show a progress bar.
    :param callback: called as ``callback(t, bound)`` after every outer (or CAVI) step.
    :param generator: the random subsets and mini-batches.
    :raises ValueError: on a bad argument.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    if x is None or y is None:
        raise ValueError("learn_hyperparameters=True needs the training data x and y")
    check_inputs_targets(x, y)
    for name, value in (("subset", subset), ("lbfgs_iter", lbfgs_iter), ("batch_size", batch_size)):
        if int(value) < 1:
            raise ValueError(f"{name} must be a positive integer, got {value}")
    if max_iter is not None and int(max_iter) < 1:
        raise ValueError(f"max_iter must be a positive integer or None, got {max_iter}")
    if not (math.isfinite(float(lr)) and float(lr) > 0):
        raise ValueError(f"lr must be a finite number > 0, got {lr}")
    params = hyperparameters_of(cavi, learn_inducing_locations)
    if protocol == "auto":
        # with sharded data (torch.distributed) only the stochastic protocol reduces over the ranks
        protocol = "stochastic" if cavi.distributed else choose_protocol(cavi.likelihood, y.shape[-1])
    elif protocol == "collapsed" and cavi.distributed:
        raise ValueError(
            "protocol='collapsed' works on one process's data only; with sharded data (torch.distributed) use "
            "protocol='stochastic' (or 'auto', which chooses it)"
        )
    if protocol == "stochastic":
        optimizer = torch.optim.Adam(params, lr=float(lr))
        return cavi.fit(
            x, y, max_iter=max_iter, tol=tol, hyper_optimizer=optimizer, batch_size=int(batch_size),
            num_epochs=20 if num_epochs is None else num_epochs, convergence=convergence, progress=progress,
            callback=callback, generator=generator, **kwargs,
        )  # fmt: skip
    protocol_ = CollapsedProtocol(
        cavi, x, y, params, int(subset), int(lbfgs_iter), chunk_size, generator, polish=bool(polish), **kwargs
    )
    rule = RelativeChange(tol, window=1) if convergence is None else convergence
    return _fit_collapsed(
        protocol_, max_iter=50 if max_iter is None else int(max_iter), rule=rule, default_rule=convergence is None,
        progress=progress, callback=callback,
    )  # fmt: skip


class CollapsedProtocol:
    r"""The collapsed protocol one outer step at a time (what :func:`fit_hyperparameters` loops over; benchmarks
    drive it directly).

    **Phase 1** (collapsed): :meth:`step` sets :math:`q(\Omega)` in closed form, runs a fresh L-BFGS on
    :math:`\theta` along the collapsed bound and writes :math:`q^*(u)`, on the current subset, which then doubles.
    **Phase 2** (``polish``, from the first full-data step whose bound moved by less than ``switch_tol`` per datum,
    or after ``max_collapsed`` full-data steps): each step is a fresh L-BFGS on GPyTorch's **true**
    ``VariationalELBO`` over :math:`\theta` and :math:`q(u)` together, from the phase-1 solution. The augmented
    bound is looser than the true ELBO and its maximiser is biased (larger outputscales, different likelihood
    scales); phase 1 gets close cheaply, phase 2 removes the bias in a few iterations (measurements in
    ``benchmarks/README.md``). Phase 2 needs a ``CholeskyVariationalDistribution`` (GPyTorch's natural
    parametrisations hand NGD's gradients to autograd, which L-BFGS cannot use); with any other, ``polish`` is off
    (with a warning unless ``polish=False``) and phase 1 runs to convergence. :meth:`finish` leaves :math:`q(u)` at
    the optimum of the last phase on all the data.

    Example::

        >>> import torch, gpytorch_augment as ga, gpytorch_augment.testing as gt
        >>> x = torch.linspace(0, 6, 40, dtype=torch.float64).unsqueeze(-1)
        >>> cavi = ga.CAVI(gt.SVGP(x[::5].clone()).double(), ga.BernoulliLogitLikelihood(), num_data=40)
        >>> y = (x.squeeze(-1).cos() > 0).double()
        >>> protocol = CollapsedProtocol(cavi, x, y, hyperparameters_of(cavi))
        >>> bounds = [protocol.step() for _ in range(5)]
        >>> protocol.polishing                          # after 3 outer steps on all the data: the true ELBO
        True
        >>> protocol.finish()
    """

    def __init__(
        self,
        cavi: Any,
        x: Tensor,
        y: Tensor,
        params: list[Tensor],
        subset: int = 2048,
        lbfgs_iter: int = 20,
        chunk_size: int | None = None,
        generator: torch.Generator | None = None,
        polish: bool = True,
        switch_tol: float = 1e-3,
        max_collapsed: int = 3,
        **kwargs: Any,
    ) -> None:
        self.cavi, self.x, self.y, self.params, self.kwargs = cavi, x, y, params, kwargs
        self.num_data = y.shape[-1]
        self.order = torch.randperm(self.num_data, generator=generator).to(x.device) if subset < self.num_data else None
        #: the number of points of the next outer step
        self.size = min(int(subset), self.num_data)
        self.lbfgs_iter, self.chunk_size = int(lbfgs_iter), chunk_size
        # GPyTorch's natural parametrisations return NGD's gradients, not the ELBO's: L-BFGS needs the Cholesky one
        cholesky = isinstance(cavi.strategy._variational_distribution, CholeskyVariationalDistribution)
        if polish and not cholesky:
            warnings.warn(
                f"the true-ELBO polish phase needs a CholeskyVariationalDistribution, not "
                f"{type(cavi.strategy._variational_distribution).__name__}: skipped, so the hyper-parameters keep the "
                "augmented bound's bias (pass polish=False to silence this)",
                UserWarning,
                stacklevel=3,
            )
        self.polish = bool(polish) and cholesky
        self.switch_tol, self.max_collapsed = float(switch_tol), int(max_collapsed)
        self.mll: CollapsedAugmentedELBO | None = None
        #: whether the steps are now on the true ELBO (phase 2)
        self.polishing = False
        self._full_values: list[float] = []

    @property
    def on_all_data(self) -> bool:
        """Whether the next outer step uses all the data."""
        return self.size == self.num_data

    def step(self) -> float:
        """One outer step; returns the objective per datum entering its L-BFGS run (phase 1: the collapsed bound of
        its subset; phase 2: the true ELBO)."""
        if self.polishing:
            return self._polish_step()
        if self.mll is None or self.mll.num_data != self.size:
            self.mll = self._mll(self.size)
        on_all_data = self.on_all_data
        value = _outer_step(self.mll, self.params, self.lbfgs_iter)
        self.size = min(2 * self.size, self.num_data)
        if on_all_data and self.polish:
            last = self._full_values[-1] if self._full_values else None
            self._full_values.append(value)
            flat = last is not None and abs(value - last) <= self.switch_tol * max(1.0, abs(value))
            self.polishing = flat or len(self._full_values) >= self.max_collapsed
        return value

    def _polish_step(self) -> float:
        model, likelihood = self.cavi.model, self.cavi.likelihood
        true_elbo = gpytorch.mlls.VariationalELBO(likelihood, model, self.num_data)
        params = [*self.params, *(p for p in model.variational_parameters() if p.requires_grad)]
        optimizer = torch.optim.LBFGS(params, lr=1.0, max_iter=self.lbfgs_iter, line_search_fn="strong_wolfe")
        values: list[float] = []

        def closure() -> Tensor:
            optimizer.zero_grad()
            loss = -true_elbo(model(self.x), self.y, **self.kwargs)
            loss.backward()
            values.append(-float(loss.detach()))
            return loss

        optimizer.step(closure)
        return values[0]

    def finish(self) -> None:
        r"""Phase 1: :math:`q(\Omega)` of the final :math:`q^*(u)` on all the data, and :math:`q^*(u)` for it.
        Phase 2: nothing (:math:`q(u)` is the true ELBO's optimum)."""
        if self.polishing:
            self.cavi.likelihood.q_aux = None
            return
        if self.mll is None or self.mll.num_data != self.num_data:
            self.mll = self._mll(self.num_data)
        self.mll.update_aux(from_model=True)  # the model holds q*(u) of the last step (or the initial q(u))
        self.mll.write_optimal_q()
        self.cavi.likelihood.q_aux = self.mll.q_aux[0] if len(self.mll.q_aux) == 1 else None

    def _mll(self, size: int) -> CollapsedAugmentedELBO:
        x, y, kwargs = self.x, self.y, self.kwargs
        if self.order is not None and size < self.num_data:
            idx = self.order[:size].sort().values
            x, y = x[..., idx, :], y[..., idx]
            kwargs = {k: (v[..., idx] if _per_datum(v, self.num_data) else v) for k, v in kwargs.items()}
        return CollapsedAugmentedELBO(
            self.cavi.likelihood, self.cavi.model, size, x, y, chunk_size=self.chunk_size, **kwargs
        )


def _per_datum(value: Any, num_data: int) -> bool:
    return isinstance(value, Tensor) and value.dim() >= 1 and value.shape[-1] == num_data


def _fit_collapsed(
    protocol: CollapsedProtocol,
    *,
    max_iter: int,
    rule: Any,
    default_rule: bool,
    progress: bool,
    callback: Callable[[int, float], Any] | None,
) -> CAVITrace:
    """The loop of the collapsed protocol: outer steps until ``rule`` or ``max_iter``, then :meth:`finish`."""
    trace, clock = CAVITrace(), Clock()
    if isinstance(rule, Convergence):
        rule.reset()
    bar = progress_bar(max_iter, desc="CAVI + L-BFGS", unit="outer step") if progress else None
    full = CAVITrace()  # the outer steps of the final phase on all the data: what the default rule sees
    try:
        for t in range(max_iter):
            final_phase = protocol.polishing or (protocol.on_all_data and not protocol.polish)
            value = protocol.step()
            trace.elbo.append(value)
            trace.time.append(clock.elapsed())
            trace.epoch.append(t)
            trace.step_size.append(1.0)
            if callback is not None:
                callback(t, value)
            if not math.isfinite(value):
                raise FloatingPointError(f"the collapsed bound became {value} at outer step {t}")
            if bar is not None:
                bar.set_postfix({"bound": f"{value:.4f}", "points": protocol.mll.num_data}, refresh=False)
                bar.update(1)
            if final_phase:
                full.elbo.append(value)
                full.time.append(trace.time[-1])
            with clock.paused():  # a user's rule sees every outer step; the default only those of the final phase
                seen = full if default_rule else trace
                done = rule.check(seen, final_phase) if isinstance(rule, Convergence) else bool(rule(seen))
            if done:
                trace.converged = True
                break
        protocol.finish()
        trace.time[-1] = clock.elapsed()
    finally:
        if bar is not None:
            bar.close()
    return trace


def _outer_step(mll: CollapsedAugmentedELBO, params: list[Tensor], lbfgs_iter: int) -> float:
    """:math:`q(\\Omega)` in closed form, then a fresh L-BFGS on :math:`\\theta`; returns the bound per datum
    entering the L-BFGS run (after the :math:`q(\\Omega)` update). On entry the model holds :math:`q^*(u)` (or the
    initial :math:`q(u)`); on exit :math:`q^*(u)` for the new hyper-parameters, so predictions are current."""
    mll.update_aux(from_model=True)
    optimizer = torch.optim.LBFGS(params, lr=1.0, max_iter=lbfgs_iter, line_search_fn="strong_wolfe")
    values: list[float] = []

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = -mll()
        loss.backward()
        values.append(-float(loss.detach()))
        return loss

    optimizer.step(closure)
    mll.write_optimal_q()
    return values[0]
