r"""Coordinate-ascent variational inference for augmented GP models, full-batch or stochastic (mini-batch).

The driver :class:`CAVI` alternates the closed-form local step (every :math:`q(\Omega_i)` of a batch at its
optimum) with a natural-gradient step on the global :math:`q(u)` (``augmentations.md`` §1.4 and §1.6), and, in
:meth:`CAVI.fit`, optionally with torch-optimizer steps on the hyper-parameters through
:class:`~gpytorch_augment.AugmentedELBO` (or another objective, e.g. GPyTorch's true ``VariationalELBO``). A step
only ever touches its batch: its cost is :math:`O(|\mathcal B| M^2 + M^3)`, independent of the number of data
:math:`N`.

Convergence criteria for :meth:`CAVI.fit` are small objects (:class:`RelativeChange`, :class:`HeldOut`) or any
callable ``trace -> bool``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from gpytorch.mlls import MarginalLogLikelihood
from gpytorch.variational import IndependentMultitaskVariationalStrategy, UnwhitenedVariationalStrategy
from linear_operator.operators import DiagLinearOperator
from torch import Tensor

from .._numerics import reverse_cholesky
from .._validation import check_inputs_targets
from ..likelihoods.augmented_likelihood import AugmentedLikelihood
from ..mlls.augmented_elbo import AugmentedELBO
from ..variational.cavi_variational_strategy import CAVITerms, WhitenedQ, _CAVIMixin
from .schedules import StepSchedule, make_schedule

StepSize = float | str | StepSchedule | Callable[[int], float] | None

#: above this many elements of the M x N cross-covariance, :meth:`CAVI.elbo` works in chunks of the data
_ELBO_CHUNK_ELEMENTS = 2**22


@dataclass
class CAVITrace:
    """What :meth:`CAVI.fit` records: one entry per CAVI step in ``elbo``, ``time``, ``epoch`` and ``step_size``,
    one per held-out evaluation in ``held_out``, ``held_out_step`` and ``held_out_time``.

    ``elbo`` is the augmented ELBO per datum of the state entering each step (exact for a full batch, an
    unbiased estimate for a mini-batch); ``time`` the training wall time in seconds after each step (held-out
    evaluations excluded); ``epoch`` the (0-based) pass over the data a step belongs to; ``step_size`` the
    :math:`\\rho_t` used.
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


# ---------------------------------------------------------------------------------------------------- convergence
class Convergence:
    """Base class of the stopping rules of :meth:`CAVI.fit`: :meth:`check` is called after every step."""

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

        >>> def test_nll():
        ...     model.eval(); likelihood.eval()
        ...     with torch.no_grad():
        ...         return -likelihood.log_marginal(y_test, model(x_test)).mean().item()
        >>> trace = cavi.fit(x, y, batch_size=256, num_epochs=50, convergence=HeldOut(test_nll, window=3, patience=5))
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


# ---------------------------------------------------------------------------------------------------- helpers
def _cavi_strategy(model: Any) -> _CAVIMixin:
    strategy = getattr(model, "variational_strategy", None)
    if isinstance(strategy, IndependentMultitaskVariationalStrategy):
        strategy = strategy.base_variational_strategy
    if not isinstance(strategy, _CAVIMixin):
        raise TypeError(
            f"CAVI needs a model whose variational_strategy is a CAVIVariationalStrategy or "
            f"UnwhitenedCAVIVariationalStrategy (possibly inside an IndependentMultitaskVariationalStrategy); "
            f"got {type(strategy).__name__}"
        )
    strategy._check_distribution()
    return strategy


def _take(t: Tensor, idx: Tensor | slice) -> Tensor:
    """The data points ``idx`` of a per-datum tensor whose last dimension indexes the data."""
    return t[..., idx]


def _per_datum(value: Any, num_data: int) -> bool:
    return isinstance(value, Tensor) and value.dim() >= 1 and value.shape[-1] == num_data


def _sub_terms(terms: CAVITerms, idx: Tensor) -> CAVITerms:
    return CAVITerms(
        L=terms.L,
        A=terms.A[..., idx],
        mu_Z=terms.mu_Z,
        mu_X=terms.mu_X[..., idx],
        k_diag=terms.k_diag[..., idx],
        a_sq=terms.a_sq[..., idx],
    )


def _latent_blocks(likelihood: AugmentedLikelihood) -> list[list[int]] | None:
    """The likelihood's optional ``latent_blocks`` (a partition of its latents into an update order), validated;
    ``None`` (all latents at once) when absent, for one latent, or for a single block."""
    blocks = getattr(likelihood, "latent_blocks", None)
    T = int(likelihood.num_latents)
    if blocks is None or T == 1:
        return None
    blocks = [[int(i) for i in block] for block in blocks]
    if sorted(i for block in blocks for i in block) != list(range(T)):
        raise ValueError(f"likelihood.latent_blocks must partition the latents 0..{T - 1}; got {blocks}")
    return blocks if len(blocks) > 1 else None


def _progress_bar(total: int | None) -> Any:
    """A tqdm bar: the notebook widget when ipywidgets is installed, plain text otherwise (without tqdm's warning)."""
    try:
        import ipywidgets  # noqa: F401

        from tqdm.auto import tqdm
    except ImportError:
        from tqdm import tqdm
    return tqdm(total=total, desc="CAVI", unit="step", mininterval=0.5)


def _unpack(batch: Any) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """A data-loader batch as ``(x, y, kwargs)``: ``(x, y)``, ``(x, y, {name: tensor})`` or
    ``{"x": x, "y": y, name: tensor, ...}``."""
    if isinstance(batch, Mapping):
        if "x" not in batch or "y" not in batch:
            raise ValueError(f"a dict batch needs the keys 'x' and 'y', got {sorted(batch)}")
        return batch["x"], batch["y"], {k: v for k, v in batch.items() if k not in ("x", "y")}
    if isinstance(batch, (tuple, list)):
        if len(batch) == 2:
            return batch[0], batch[1], {}
        if len(batch) == 3 and isinstance(batch[2], Mapping):
            return batch[0], batch[1], dict(batch[2])
    raise ValueError(
        "the data loader must yield (x, y), (x, y, {name: per-datum tensor}) or {'x': x, 'y': y, name: tensor}; "
        f"got a {type(batch).__name__}" + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
    )


# ---------------------------------------------------------------------------------------------------- the driver
class CAVI:
    r"""Closed-form coordinate ascent on the augmented ELBO, full-batch or stochastic.

    One :meth:`step` on a batch :math:`\mathcal B` of the data

    1. computes the marginals :math:`q(f_i) = \mathcal N(m_i, s_i)` of the current :math:`q(u)`;
    2. sets every :math:`q(\Omega_i)` to its optimum (the *local* step) and stores it as ``likelihood.q_aux``;
    3. applies the likelihood's closed-form hyper-parameter updates, if any;
    4. forms the optimal whitened natural parameters :math:`\hat\theta` for the statistics
       :math:`(\tfrac{N}{|\mathcal B|}\bar h, \tfrac{N}{|\mathcal B|}\bar\lambda)` and takes the natural-gradient step
       :math:`\theta \leftarrow (1-\rho_t)\theta + \rho_t\hat\theta` (the *global* step; ``augmentations.md`` §1.6).

    With the full data and :math:`\rho = 1` this is exact coordinate ascent: the augmented ELBO never decreases.
    With mini-batches and a Robbins–Monro schedule it is the stochastic variational inference of Hoffman et al.
    (2013), as used by Wenzel et al. (2019) for Pólya-Gamma classification. The mixing happens in natural
    parameters, so :math:`S_u` stays positive definite by construction (a convex combination of precisions
    that are :math:`\succeq I` in whitened coordinates).

    **Latent blocks.** A likelihood with several latents may declare ``latent_blocks``, a partition of its latent
    indices in update order (e.g. ``[[0], [1]]``; the same attribute orders the Gibbs sweep). Steps 1, 2 and 4 are
    then repeated per block: after the first block, the marginals and :math:`q(\Omega)` are recomputed from the
    current :math:`q(u)` and only the block's latents take the step (the hyper-parameter update and the returned
    ELBO stay those of the state on entry). Needed where a latent's optimal update depends on another latent's
    *updated* factor, e.g. the double-bound CAVI of the heteroscedastic likelihoods (``augmentations.md`` §10.3).

    :param model: an ``ApproximateGP`` whose strategy is a :class:`~gpytorch_augment.CAVIVariationalStrategy`
        (or its unwhitened sibling, or a batched one inside ``IndependentMultitaskVariationalStrategy``) with a
        Cholesky, Natural or TrilNatural variational distribution (anything else raises ``TypeError``).
    :param likelihood: an :class:`~gpytorch_augment.likelihoods.AugmentedLikelihood`.
    :param num_data: the total number of training points :math:`N`.
    :param step_size: :math:`\rho_t`: a constant in (0, 1]; a schedule name (``"constant"``,
        ``"robbins-monro"``, ``"adaptive"``, see :mod:`gpytorch_augment.inference.schedules`); a
        :class:`~gpytorch_augment.inference.schedules.StepSchedule`; a callable ``t -> rho_t`` (``t`` counts from 0);
        or ``None`` (default): :math:`\rho = 1` for steps on the full data and a default
        :class:`~gpytorch_augment.inference.schedules.RobbinsMonro` schedule for mini-batch steps.
    :param hyper_objective: the objective of the hyper-parameter steps (:meth:`hyper_step`, ``fit(...,
        hyper_optimizer=...)``), a GPyTorch ``MarginalLogLikelihood`` built on this ``model`` (normally with
        this ``likelihood``; any estimate of the same model's objective will do) and maximised with :math:`q(u)`
        fixed. Default: :class:`~gpytorch_augment.AugmentedELBO` (the bound CAVI
        itself ascends; its step re-uses the CAVI step's kernel matrices). ``gpytorch.mlls.VariationalELBO(
        likelihood, model, num_data)`` takes the hyper-parameter steps on the **true** ELBO instead (the
        likelihood's ``expected_log_prob``): a variational EM whose E-step is CAVI on the augmented bound and whose
        M-step ascends the true bound at that :math:`q(u)`. The two steps no longer ascend one common objective, so
        neither bound need rise monotonically and the alternation **need not converge**. With the whitened
        :class:`~gpytorch_augment.CAVIVariationalStrategy` it drifts: at a fixed :math:`q(v)` the
        hyper-parameters move the latent function values themselves (a mean constant shifts every :math:`f`), so
        the M-step does part of the E-step's work on the true ELBO and the CAVI step undoes it on the augmented
        one (logistic-softmax on satimage/segment: the mean constants run off to large negative values and the
        true ELBO falls after a few hundred Adam steps; ``benchmarks/multiclass.py``, tutorial 05). With
        :class:`~gpytorch_augment.UnwhitenedCAVIVariationalStrategy`, :math:`q(u)` pins the function values at
        :math:`Z` during the M-step and the same loop rose monotonically in those tests -- but it ascends the true
        ELBO only at CAVI's :math:`q(u)`, and on satimage it settled far below the true ELBO of the route that
        worked best (``benchmarks/hyper_objective.py``): choose the hyper-parameters on the true ELBO with
        :math:`q(u)` optimised for that same bound (GPyTorch's usual Adam loop on ``VariationalELBO``, which runs
        on a CAVI strategy too), freeze them, then fit :math:`q(u)` by CAVI.

    Example::

        >>> cavi = CAVI(model, likelihood, num_data=y.numel())
        >>> trace = cavi.fit(x, y)                  # full-batch CAVI to convergence
        >>> trace.elbo[-1]                          # augmented ELBO per datum
        >>> cavi = CAVI(model, likelihood, num_data=y.numel(), step_size=RobbinsMonro(tau=1.0, kappa=0.6))
        >>> hyper = torch.optim.Adam(model.hyperparameters(), lr=0.01)
        >>> trace = cavi.fit(x, y, batch_size=256, num_epochs=20, hyper_optimizer=hyper, progress=True)
        >>> true_elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=y.numel())
        >>> cavi = CAVI(model, likelihood, num_data=y.numel(), hyper_objective=true_elbo)  # M-step on the true ELBO
    """

    def __init__(
        self,
        model: Any,
        likelihood: AugmentedLikelihood,
        num_data: int,
        step_size: StepSize = None,
        hyper_objective: MarginalLogLikelihood | None = None,
    ) -> None:
        if not isinstance(likelihood, AugmentedLikelihood):
            raise TypeError(f"CAVI needs an AugmentedLikelihood, got {type(likelihood).__name__}")
        if int(num_data) <= 0:
            raise ValueError(f"num_data must be a positive integer, got {num_data}")
        if hyper_objective is not None:
            if not isinstance(hyper_objective, MarginalLogLikelihood):
                raise TypeError(
                    f"hyper_objective must be a gpytorch MarginalLogLikelihood, got {type(hyper_objective).__name__}"
                )
            if hyper_objective.model is not model:
                raise ValueError("hyper_objective must be built on the same model object as CAVI")
        self.model = model
        self.likelihood = likelihood
        self.num_data = int(num_data)
        self.step_size = None if step_size is None else make_schedule(step_size)
        self._minibatch_schedule: StepSchedule | None = None
        self.strategy = _cavi_strategy(model)
        self.num_steps = 0
        #: the step size :math:`\rho` used by the last :meth:`step`
        self.last_step_size: float | None = None
        self._mll: MarginalLogLikelihood | None = hyper_objective
        self._checked_optimizers: set[int] = set()

    # ------------------------------------------------------------------------------------------------ internals
    def _schedule(self, batch_size: int) -> Any:
        if self.step_size is not None:
            return self.step_size
        if batch_size >= self.num_data:
            return 1.0
        if self._minibatch_schedule is None:
            self._minibatch_schedule = make_schedule("robbins-monro")
        return self._minibatch_schedule

    def _rho(self, schedule: Any = None) -> float:
        schedule = self.step_size if schedule is None else schedule
        rho = float(schedule(self.num_steps)) if callable(schedule) else float(schedule)
        if not 0.0 < rho <= 1.0:
            raise ValueError(f"step size must be in (0, 1], got {rho} at step {self.num_steps}")
        return rho

    def _check_inputs(self, x: Tensor, y: Tensor) -> None:
        check_inputs_targets(x, y)
        batch_shape = self.strategy._variational_distribution.batch_shape
        try:
            ok = torch.broadcast_shapes(x.shape[:-2], batch_shape) == batch_shape
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"x has shape {tuple(x.shape)}, whose batch dimensions {tuple(x.shape[:-2])} do not fit the model's "
                f"batch shape {tuple(batch_shape)}: pass x of shape (N, D) or (*batch_shape, N, D)"
            )

    def _to_likelihood_layout(self, t: Tensor) -> Tensor:
        # the strategy is latent-major (T, N); multi-latent likelihoods take (N, T)
        return t.mT if self.likelihood.num_latents > 1 else t

    @staticmethod
    def _natural_gradient(q: WhitenedQ, b: Tensor, B: Tensor) -> Tensor:
        r""":math:`\hat\theta - \theta` in whitened natural parameters, flattened: :math:`(\hat b - \theta_1,
        -\tfrac12(\hat B - C^\top C))`."""
        return torch.cat([(b - q.theta1).reshape(-1), (-0.5 * (B - q.C.mT @ q.C)).reshape(-1)])

    def _initial_gradients(
        self, terms: CAVITerms, q: WhitenedQ, h: Tensor, lam: Tensor, num_init: int
    ) -> Tensor:
        """Noisy natural gradients from ``num_init`` disjoint sub-batches of the batch, each scaled to N."""
        n = h.shape[-1]
        chunks = torch.arange(n, device=h.device).chunk(min(num_init, n))
        samples = []
        for idx in chunks:
            scale = self.num_data / idx.numel()
            b, B = self.strategy.cavi_target(None, scale * _take(h, idx), scale * _take(lam, idx), _sub_terms(terms, idx))
            samples.append(self._natural_gradient(q, b, B))
        return torch.stack(samples)

    # ------------------------------------------------------------------------------------------------ steps
    def step(
        self, x: Tensor, y: Tensor, hyper_optimizer: torch.optim.Optimizer | None = None, **kwargs: Any
    ) -> Tensor:
        r"""One local + global update on the batch ``(x, y)`` (extra keyword arguments, e.g. ``trials=``, are
        per-datum data of the batch, passed to ``likelihood.check_targets``).

        With ``hyper_optimizer``, one step of it on :math:`-`:attr:`hyper_objective` of the same batch follows, at
        the updated :math:`q(u)` (what :meth:`fit` does); for the whitened strategy and the default AugmentedELBO it
        re-uses the prior terms of the CAVI step, so the pair costs one kernel evaluation and one Cholesky.

        Returns the augmented ELBO per datum, :math:`\big(\tfrac{N}{|\mathcal B|}\sum_{i\in\mathcal B}\ell_i^*
        - \mathrm{KL}(q(u)\Vert p(u))\big)/N`, of :math:`q(u)` as it was on entry (an unbiased estimate of the
        full-data value for a mini-batch; exact for the full batch). Cost :math:`O(|\mathcal B|M^2 + M^3)`.
        """
        return self._step(x, y, kwargs, hyper_optimizer)

    def _step(
        self, x: Tensor, y: Tensor, kwargs: dict[str, Any], hyper_optimizer: torch.optim.Optimizer | None = None
    ) -> Tensor:
        """:meth:`step`, optionally followed by one step of ``hyper_optimizer`` on the hyper objective of the same
        batch at the updated :math:`q(u)`, re-using the prior terms (one kernel evaluation and one Cholesky)."""
        self._check_inputs(x, y)
        targets = self.likelihood.check_targets(y, **kwargs)
        if hyper_optimizer is not None and id(hyper_optimizer) not in self._checked_optimizers:
            self._check_hyper_optimizer(hyper_optimizer)
            self._checked_optimizers.add(id(hyper_optimizer))
        strategy = self.strategy
        fused = hyper_optimizer is not None and self._can_fuse()
        # the prior terms of the full data are cached while the hyper-parameters stay put (a mini-batch changes
        # every step: caching it would only cost a copy)
        full_batch = targets.shape[-1] >= self.num_data
        with torch.set_grad_enabled(fused):
            graph_terms = strategy.cavi_terms(x, cache=full_batch)
        terms = CAVITerms(*(t.detach() for t in graph_terms)) if fused else graph_terms
        with torch.no_grad():
            elbo, q = self._update(x, targets, terms)
        if hyper_optimizer is not None:
            if fused:
                self._fused_hyper_step(x, y, kwargs, graph_terms, q, hyper_optimizer)
            else:
                self.hyper_step(x, y, hyper_optimizer, **kwargs)
        return elbo

    def _update(self, x: Tensor, y: Tensor, terms: CAVITerms) -> tuple[Tensor, WhitenedQ]:
        """Local step, closed-form likelihood updates and the damped global step; returns the ELBO estimate of
        the entry state and the new whitened :math:`q(v)`."""
        strategy = self.strategy
        q = strategy.whitened_q(terms)
        mean, var = strategy.marginals(terms, q)
        dtype = x.dtype
        f_mean, f_var = self._to_likelihood_layout(mean).to(dtype), self._to_likelihood_layout(var).to(dtype)
        q_aux = self.likelihood.aux_posterior(y, f_mean, f_var)
        batch_size = y.shape[-1]
        scale = self.num_data / batch_size
        ell = self.likelihood.elbo_terms(y, q_aux, f_mean, f_var).sum(-1)
        elbo = (scale * ell - strategy.kl_whitened(q).sum().to(dtype)) / self.num_data
        self.likelihood.update_hyperparameters(y, q_aux, f_mean, f_var)
        h, lam = self.likelihood.expected_potential_and_precision(y, q_aux, f_mean, f_var)
        h, lam = h.to(terms.A.dtype), lam.to(terms.A.dtype)
        b, B = strategy.cavi_target(x, scale * h, scale * lam, terms)

        schedule = self._schedule(batch_size)
        if getattr(schedule, "uses_gradient", False):
            if not schedule.initialized:
                schedule.initialize(self._initial_gradients(terms, q, h, lam, schedule.num_init))
            else:
                schedule.observe(self._natural_gradient(q, b, B))
        rho = self._rho(schedule)
        blocks = _latent_blocks(self.likelihood)
        for k, block in enumerate(blocks or [None]):
            if k > 0:  # refresh q(Ω) (and the statistics) from the latents updated by the previous blocks
                q = strategy.whitened_q(terms)
                mean, var = strategy.marginals(terms, q)
                f_mean, f_var = self._to_likelihood_layout(mean).to(dtype), self._to_likelihood_layout(var).to(dtype)
                q_aux = self.likelihood.aux_posterior(y, f_mean, f_var)
                h, lam = self.likelihood.expected_potential_and_precision(y, q_aux, f_mean, f_var)
                b, B = strategy.cavi_target(x, scale * h.to(terms.A.dtype), scale * lam.to(terms.A.dtype), terms)
            if rho < 1.0:
                B = (1 - rho) * (q.C.mT @ q.C) + rho * B
                b = (1 - rho) * q.theta1 + rho * b
            C = reverse_cholesky(B)
            if block is not None:  # only this block's latents move; the others keep their current q
                moves = torch.zeros(b.shape[-2], dtype=torch.bool, device=b.device)
                moves[block] = True
                b = torch.where(moves.unsqueeze(-1), b, q.theta1)
                C = torch.where(moves.unsqueeze(-1).unsqueeze(-1), C, q.C)
            q_new = WhitenedQ(b, C)
            strategy._write(q_new, terms)
        self.likelihood.q_aux = q_aux
        self.last_step_size = rho
        self.num_steps += 1
        return elbo, q_new

    def _can_fuse(self) -> bool:
        # GPyTorch's unwhitened KL depends on the order of calls (gpytorch-integration.md §6): take the plain path;
        # only the AugmentedELBO takes the CAVI step's KL and marginals
        return not isinstance(self.strategy, UnwhitenedVariationalStrategy) and isinstance(
            self.hyper_objective, AugmentedELBO
        )

    @property
    def hyper_objective(self) -> MarginalLogLikelihood:
        """The objective of the hyper-parameter steps (default :class:`~gpytorch_augment.AugmentedELBO`)."""
        if self._mll is None:
            self._mll = AugmentedELBO(self.likelihood, self.model, self.num_data)
        return self._mll

    def _fused_hyper_step(
        self,
        x: Tensor,
        y: Tensor,
        kwargs: dict[str, Any],
        graph_terms: CAVITerms,
        q: WhitenedQ,
        optimizer: torch.optim.Optimizer,
    ) -> None:
        r"""One optimizer step on :math:`-`AugmentedELBO of the batch, with :math:`q(f)` built from the prior terms
        of the CAVI step (still attached to the hyper-parameters) and the new, fixed whitened :math:`q(v)`: the same
        value and gradient as ``-mll(model(x), y)`` without a second kernel evaluation and Cholesky."""
        mean, var = self.strategy.marginals(graph_terms, q)
        dtype = x.dtype
        mean, var = mean.to(dtype), var.to(dtype)
        if self.likelihood.num_latents > 1:
            f_dist = MultitaskMultivariateNormal(mean.mT, DiagLinearOperator(var.mT.reshape(*var.shape[:-2], -1)))
        else:
            f_dist = MultivariateNormal(mean, DiagLinearOperator(var))
        # q(v) is fixed and p(v) = N(0, I): the whitened KL carries no gradient, so hand over its value instead of
        # letting GPyTorch rebuild q(u) from its parameters to evaluate it
        kl = self.strategy.kl_whitened(q).to(dtype)
        if isinstance(self.model.variational_strategy, IndependentMultitaskVariationalStrategy):
            kl = kl.sum(-1)  # as the wrapper's kl_divergence(): summed over the latents
        optimizer.zero_grad()
        with self._frozen_q():
            loss = -self.hyper_objective(f_dist, y, kl_divergence=kl, **kwargs).sum()
            loss.backward()
        optimizer.step()

    @contextmanager
    def _frozen_q(self) -> Iterator[None]:
        """q(u) belongs to CAVI: no gradients for its parameters while the hyper-parameter loss is back-propagated
        (GPyTorch's forward and KL term would otherwise differentiate through them, for nothing)."""
        variational = [p for p in self.model.variational_parameters() if p.requires_grad]
        try:
            for p in variational:
                p.requires_grad_(False)
            yield
        finally:
            for p in variational:
                p.requires_grad_(True)

    def hyper_step(
        self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer, steps: int = 1, **kwargs: Any
    ) -> float:
        r"""``steps`` optimizer steps on :math:`-`:attr:`hyper_objective` (default
        :class:`~gpytorch_augment.AugmentedELBO`) of the batch ``(x, y)`` (kernel, mean, likelihood constants,
        inducing inputs: whatever ``optimizer`` holds), with :math:`q(u)` fixed. Returns the last loss (the negative
        objective per datum, a mini-batch estimate)."""
        mll = self.hyper_objective
        loss = math.nan
        for _ in range(steps):
            optimizer.zero_grad()
            with self._frozen_q():
                value = -mll(self.model(x), y, **kwargs).sum()
                value.backward()
            optimizer.step()
            loss = float(value.detach())
        return loss

    @torch.no_grad()
    def elbo(self, x: Tensor, y: Tensor, chunk_size: int | None = None, **kwargs: Any) -> Tensor:
        r"""The full-data augmented ELBO per datum of the current :math:`q(u)` (``x, y`` = all the data).

        The data are processed in chunks of ``chunk_size`` points (default: as many as keep the
        :math:`M\times` chunk cross-covariance under :math:`2^{22}` elements), so that no :math:`M\times N` matrix
        is ever formed for large :math:`N`.
        """
        self._check_inputs(x, y)
        y = self.likelihood.check_targets(y, **kwargs)
        num_data = y.shape[-1]
        if chunk_size is None:
            num_inducing = self.strategy.inducing_points.shape[-2]
            chunk_size = max(1, _ELBO_CHUNK_ELEMENTS // max(num_inducing, 1))
        elif int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
        total: Tensor | float = 0.0
        kl: Tensor | None = None
        single = int(chunk_size) >= num_data  # only then are the prior terms worth caching
        for start in range(0, num_data, int(chunk_size)):
            piece = slice(start, start + int(chunk_size))
            terms = self.strategy.cavi_terms(x if single else x[..., piece, :], cache=single)
            q = self.strategy.whitened_q(terms)
            if kl is None:
                kl = self.strategy.kl_whitened(q).sum().to(x.dtype)
            mean, var = self.strategy.marginals(terms, q)
            f_mean, f_var = self._to_likelihood_layout(mean).to(x.dtype), self._to_likelihood_layout(var).to(x.dtype)
            total = total + self.likelihood.collapsed_bound(_take(y, piece), f_mean, f_var).sum(-1)
        assert kl is not None
        return (total - kl) / num_data

    # ------------------------------------------------------------------------------------------------ fit
    def _batches(
        self,
        x: Tensor | None,
        y: Tensor | None,
        batch_size: int | None,
        data_loader: Any,
        generator: torch.Generator | None,
        kwargs: dict[str, Any],
    ) -> Iterator[tuple[Tensor, Tensor, dict[str, Any], bool]]:
        """One epoch of ``(x_batch, y_batch, kwargs_batch, is_last_batch_of_the_epoch)``."""
        if data_loader is not None:
            iterator = iter(data_loader)
            batch = next(iterator, None)
            while batch is not None:
                following = next(iterator, None)
                xb, yb, kb = _unpack(batch)
                yield xb, yb, kb, following is None
                batch = following
            return
        assert x is not None and y is not None
        num_data = y.shape[-1]
        if batch_size is None or batch_size >= num_data:
            yield x, y, kwargs, True
            return
        order = torch.randperm(num_data, generator=generator, device=x.device)
        for start in range(0, num_data, batch_size):
            idx = order[start : start + batch_size]
            kb = {k: (_take(v, idx) if _per_datum(v, num_data) else v) for k, v in kwargs.items()}
            yield x[..., idx, :], _take(y, idx), kb, start + batch_size >= num_data

    def _check_hyper_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        variational = {id(p) for p in self.model.variational_parameters()}
        if any(id(p) in variational for group in optimizer.param_groups for p in group["params"]):
            raise ValueError(
                "hyper_optimizer holds variational parameters of q(u); CAVI updates those in closed form. "
                "Pass model.hyperparameters() (and the likelihood's parameters) instead."
            )

    def fit(
        self,
        x: Tensor | None = None,
        y: Tensor | None = None,
        max_iter: int | None = None,
        tol: float = 1e-8,
        hyper_optimizer: torch.optim.Optimizer | None = None,
        hyper_steps: int = 1,
        callback: Callable[[int, float], Any] | None = None,
        *,
        batch_size: int | None = None,
        data_loader: Any = None,
        num_epochs: int | None = None,
        convergence: Convergence | Callable[[CAVITrace], bool] | None = None,
        progress: bool = False,
        generator: torch.Generator | None = None,
        **kwargs: Any,
    ) -> CAVITrace:
        r"""Run CAVI steps (each followed by ``hyper_steps`` hyper-parameter steps if ``hyper_optimizer`` is
        given) until ``convergence`` says so or a cap is reached.

        **Full batch** (``x, y`` and no ``batch_size``): every step uses all the data; by default the run stops
        when the relative change of the augmented ELBO falls below ``tol`` (``RelativeChange(tol, window=1)``) or
        after ``max_iter`` steps (default 100).

        **Mini-batch**: either ``batch_size`` (with ``x, y``: each epoch visits a fresh random permutation, drawn
        from ``generator``; per-datum keyword arguments, e.g. ``trials=``, are sliced along with ``y``) or a torch
        ``data_loader`` whose batches are ``(x, y)``, ``(x, y, {name: tensor})`` or ``{"x": x, "y": y, name:
        tensor}`` (then ``x, y`` must not be given). Runs ``num_epochs`` epochs (default 10) or ``max_iter`` steps
        (default unlimited), whichever comes first, or until ``convergence`` (default ``RelativeChange(tol,
        window=steps per epoch)`` on the per-step ELBO estimates). A step touches only its batch.

        :param hyper_optimizer: optional torch optimizer over hyper-parameters (kernel, mean, likelihood constants,
            inducing inputs); after each CAVI step it takes ``hyper_steps`` steps on ``-hyper_objective`` (default
            ``AugmentedELBO``, see the class) of the same batch (:meth:`hyper_step`). It must not hold the
            variational parameters (``ValueError``).
            Closed-form likelihood updates (``likelihood.update_hyperparameters``) run inside every step anyway.
        :param callback: called as ``callback(t, elbo)`` after every step.
        :param convergence: a :class:`RelativeChange`, a :class:`HeldOut` or any callable ``trace -> bool``.
        :param progress: show a ``tqdm`` progress bar (per step, with the ELBO estimate and held-out metric).
        :returns: a :class:`CAVITrace`.
        """
        minibatch = batch_size is not None or data_loader is not None
        num_batches: int | None = 1
        if data_loader is not None:
            if x is not None or y is not None:
                raise ValueError("pass either x and y or a data_loader, not both")
            if batch_size is not None:
                raise ValueError("pass either batch_size or a data_loader (which sets its own batch size), not both")
            if kwargs:
                raise ValueError(
                    f"with a data_loader, per-datum keyword arguments ({sorted(kwargs)}) must come in its batches: "
                    "yield (x, y, {name: tensor}) or {'x': x, 'y': y, name: tensor}"
                )
            dataset = getattr(data_loader, "dataset", None)
            try:
                size = len(dataset)  # type: ignore[arg-type]
            except TypeError:
                size = None
            if size is not None and size != self.num_data:
                raise ValueError(
                    f"the data loader's dataset has {size} points but CAVI was built with num_data={self.num_data}: "
                    "the batch statistics are scaled by num_data / batch size"
                )
            try:
                num_batches = len(data_loader)
            except TypeError:
                num_batches = None
        else:
            if x is None or y is None:
                raise ValueError("fit needs the data: x and y, or a data_loader")
            self._check_inputs(x, y)
            if batch_size is not None:
                if isinstance(batch_size, bool) or int(batch_size) != batch_size or int(batch_size) < 1:
                    raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
                batch_size = int(batch_size)
                if y.shape[-1] != self.num_data:
                    raise ValueError(
                        f"y has {y.shape[-1]} data points but CAVI was built with num_data={self.num_data}"
                    )
                num_batches = math.ceil(y.shape[-1] / batch_size)
        if int(hyper_steps) < 1:
            raise ValueError(f"hyper_steps must be a positive integer, got {hyper_steps}")
        if hyper_optimizer is not None:
            self._check_hyper_optimizer(hyper_optimizer)
        if max_iter is None:
            max_iter = 100 if not minibatch else None
        if max_iter is not None and int(max_iter) < 1:
            raise ValueError(f"max_iter must be a positive integer or None, got {max_iter}")
        if num_epochs is None:
            num_epochs = 10 if minibatch else None
        if num_epochs is not None and int(num_epochs) < 1:
            raise ValueError(f"num_epochs must be a positive integer or None, got {num_epochs}")
        if convergence is None:
            convergence = RelativeChange(tol, window=1 if not minibatch else max(1, num_batches or 1))
        if isinstance(convergence, Convergence):
            convergence.reset()
            check = convergence.check
        elif callable(convergence):
            user_rule = convergence
            check = lambda trace, epoch_end: bool(user_rule(trace))  # noqa: E731
        else:
            raise ValueError(f"convergence must be a Convergence or a callable trace -> bool, got {convergence!r}")

        total = None
        if max_iter is not None:
            total = int(max_iter)
        if num_epochs is not None and num_batches is not None:
            total = num_epochs * num_batches if total is None else min(total, num_epochs * num_batches)
        bar = None
        if progress:
            bar = _progress_bar(total)

        trace = CAVITrace()
        paused = 0.0
        start = time.perf_counter()
        t = 0
        epoch = 0
        try:
            while num_epochs is None or epoch < num_epochs:
                for xb, yb, kb, epoch_end in self._batches(x, y, batch_size, data_loader, generator, kwargs):
                    value = float(self._step(xb, yb, kb, hyper_optimizer))
                    if hyper_optimizer is not None and hyper_steps > 1:
                        self.hyper_step(xb, yb, hyper_optimizer, steps=int(hyper_steps) - 1, **kb)
                    trace.elbo.append(value)
                    trace.time.append(time.perf_counter() - start - paused)
                    trace.epoch.append(epoch)
                    trace.step_size.append(float(self.last_step_size or math.nan))
                    if callback is not None:
                        callback(t, value)
                    if not math.isfinite(value):
                        raise FloatingPointError(f"augmented ELBO became {value} at step {t}")
                    modes = (self.model.training, self.likelihood.training)
                    before = time.perf_counter()
                    done = check(trace, epoch_end)
                    if (self.model.training, self.likelihood.training) != modes:
                        self.model.train(modes[0])
                        self.likelihood.train(modes[1])
                    paused += time.perf_counter() - before
                    t += 1
                    if bar is not None:
                        postfix = {"elbo": f"{value:.4f}", "epoch": epoch}
                        if trace.held_out:
                            postfix["held_out"] = f"{trace.held_out[-1]:.4f}"
                        bar.set_postfix(postfix, refresh=False)
                        bar.update(1)
                    if done:
                        trace.converged = True
                        return trace
                    if max_iter is not None and t >= max_iter:
                        return trace
                epoch += 1
            return trace
        finally:
            if bar is not None:
                bar.close()
