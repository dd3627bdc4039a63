r"""Coordinate-ascent variational inference for augmented GP models, full-batch or stochastic (mini-batch).

The driver :class:`CAVI` alternates the closed-form local step (every :math:`q(\Omega_i)` of a batch at its
optimum) with a natural-gradient step on the global :math:`q(u)` (the maths page :doc:`/maths/engines`), and, in
:meth:`CAVI.fit`, optionally with torch-optimizer steps on the hyper-parameters through
:class:`~gpytorch_augment.AugmentedELBO` (or another objective, e.g. GPyTorch's true ``VariationalELBO``). A step
only ever touches its batch: its cost is :math:`O(|\mathcal B| M^2 + M^3)`, independent of the number of data
:math:`N`. The Gaussian algebra lives in :mod:`gpytorch_augment.core`; stopping rules in
:mod:`~gpytorch_augment.inference.convergence`.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.mlls import MarginalLogLikelihood
from torch import Tensor

from .._validation import check_latents
from ..core import ObservedData, PriorTerms, WhitenedGaussian, check_data, natural_gradient
from ..core.distributed import (
    all_gather_objects,
    all_reduce_sum,
    broadcast_flag,
    is_distributed,
)
from ..likelihoods.augmented_likelihood import AugmentedLikelihood, AuxDict, validated_latent_blocks
from ..variational.cavi_variational_strategy import _CAVIMixin, cavi_strategy_of
from . import hyperparameters
from ._batches import Clock, ShuffleCursor, progress_bar, show_progress, take
from ._checkpoint import CheckpointMixin
from ._checks import check_batch_size, check_model_inputs
from ._fit_config import FitConfig
from ._fit_setup import check_minibatches, fit_config, fit_data
from ._hyper_steps import HyperStepMixin
from ._modes import training_mode
from .convergence import CAVITrace, Convergence, HeldOut, RelativeChange
from .engine import diagonal_gaussian
from .fit_options import FitOptions
from .schedules import StepSchedule, make_schedule

__all__ = ["CAVI", "CAVITrace", "Convergence", "HeldOut", "RelativeChange"]

StepSize = float | str | StepSchedule | Callable[[int], float] | None

#: above this many elements of the M x N cross-covariance, :meth:`CAVI.elbo` works in chunks of the data
_ELBO_CHUNK_ELEMENTS = 2**22


def _cavi_strategy(model: Any) -> _CAVIMixin:
    strategy = cavi_strategy_of(model, needed_by="CAVI")
    strategy.check_distribution()
    return strategy


class CAVI(HyperStepMixin, CheckpointMixin):
    r"""Closed-form coordinate ascent on the augmented ELBO, full-batch or stochastic.

    One :meth:`step` on a batch :math:`\mathcal B` of the data

    1. computes the marginals :math:`q(f_i) = \mathcal N(m_i, s_i)` of the current :math:`q(u)`;
    2. sets every :math:`q(\Omega_i)` to its optimum (the *local* step), kept as the engine's :attr:`q_aux`;
    3. applies the likelihood's closed-form hyper-parameter updates, if any;
    4. forms the batch's sufficient statistics (:class:`~gpytorch_augment.core.SufficientStatistics`) of the expected
       potentials and precisions, scaled by :math:`N/|\mathcal B|`, and from them the optimal whitened natural
       parameters :math:`\hat\theta`, and takes the natural-gradient step
       :math:`\theta \leftarrow (1-\rho_t)\theta + \rho_t\hat\theta` (the *global* step; :doc:`/maths/engines`).

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
    *updated* factor, e.g. the double-bound CAVI of the heteroscedastic likelihoods (:doc:`/maths/heteroscedastic`).

    **The engine's interface.** The one-call fit's protocols use CAVI through
    :class:`~gpytorch_augment.inference.engine.CAVIEngine` (:meth:`prior_terms`, :meth:`update`,
    :meth:`marginal_distribution`, :meth:`frozen_q`, :meth:`q_state`, :meth:`run`, ...), which it implements;
    :meth:`fit` dispatches to them or runs :meth:`run` itself.

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
        hyper_optimizer=...)``), a GPyTorch ``MarginalLogLikelihood`` built on this ``model`` and maximised with
        :math:`q(u)` fixed. Default: :class:`~gpytorch_augment.AugmentedELBO` (the bound CAVI itself ascends; its step
        re-uses the CAVI step's kernel matrices). ``gpytorch.mlls.VariationalELBO(likelihood, model, num_data)``
        takes the hyper-parameter steps on the **true** ELBO instead: a variational EM whose E-step (CAVI) and M-step
        ascend different bounds, so neither need rise monotonically and the alternation need not converge; with the
        whitened strategy it can drift (measurements in ``benchmarks/README.md``). Recommended where the augmented
        bound is loose (e.g. the logistic-softmax link): choose the hyper-parameters with GPyTorch's usual loop on
        ``VariationalELBO``, freeze them, then fit :math:`q(u)` by CAVI.

    Example::

        >>> import torch
        >>> from gpytorch_augment import CAVI, BernoulliLogitLikelihood
        >>> from gpytorch_augment.testing.models import SVGP
        >>> x = torch.linspace(-2, 2, 20, dtype=torch.float64).unsqueeze(-1)
        >>> y = (x.squeeze(-1) > 0).double()
        >>> model, likelihood = SVGP(x[::4]).double(), BernoulliLogitLikelihood()
        >>> cavi = CAVI(model, likelihood, num_data=y.numel())
        >>> trace = cavi.fit(x, y)                  # full-batch CAVI to convergence
        >>> trace.converged, trace.elbo[-1] < 0     # augmented ELBO per datum
        (True, True)
        >>> from gpytorch_augment.inference.schedules import RobbinsMonro
        >>> cavi = CAVI(model, likelihood, num_data=y.numel(), step_size=RobbinsMonro(tau=1.0, kappa=0.6))
        >>> hyper = torch.optim.Adam(model.hyperparameters(), lr=0.01)
        >>> trace = cavi.fit(x, y, batch_size=8, num_epochs=2, hyper_optimizer=hyper, generator=torch.Generator())
        >>> import gpytorch
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
        process_group: Any = None,
    ) -> None:
        if not isinstance(likelihood, AugmentedLikelihood):
            raise TypeError(f"CAVI needs an AugmentedLikelihood, got {type(likelihood).__name__}")
        if isinstance(num_data, bool) or not isinstance(num_data, (int, np.integer)) or int(num_data) <= 0:
            raise ValueError(f"num_data must be a positive integer, got {num_data!r}")
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
        check_latents(model, self.strategy, likelihood)
        self.num_steps = 0
        #: the step size :math:`\rho` used by the last :meth:`step`
        self.last_step_size: float | None = None
        #: the variational parameters of :math:`q(\Omega)` set by the last :meth:`step`, on its batch (``None``
        #: before the first): the engine's state, never the likelihood's
        self.q_aux: AuxDict | None = None
        self._mll: MarginalLogLikelihood | None = hyper_objective
        self._checked_optimizers: set[int] = set()
        #: the ``torch.distributed`` process group the data are sharded over (``None``: the default group, used
        #: only when ``torch.distributed`` is initialised with more than one process)
        self.process_group = process_group
        self._last_x: Tensor | None = None
        self._global_batch_size: int | None = None
        self._shuffle = ShuffleCursor()  # where a shuffled mini-batch fit is in its epoch (checkpointed)

    @property
    def distributed(self) -> bool:
        """Whether steps reduce their statistics over several processes (``torch.distributed``)."""
        return is_distributed(self.process_group)

    @property
    def shuffle_cursor(self) -> ShuffleCursor:
        """Where a shuffled mini-batch fit is in its epoch (the next fit on tensors continues there; checkpointed)."""
        return self._shuffle

    def on_subset(self, num_data: int) -> CAVI:
        """An engine for a subset of ``num_data`` of the training points: the same model, likelihood and
        :math:`q(u)` (what the subsample protocol fits on), with its own step count and caches."""
        if isinstance(num_data, bool) or not isinstance(num_data, (int, np.integer)) or int(num_data) <= 0:
            raise ValueError(f"num_data must be a positive integer, got {num_data!r}")
        engine = copy.copy(self)
        engine.num_data, engine.num_steps, engine.last_step_size, engine.q_aux = int(num_data), 0, None, None
        engine._minibatch_schedule, engine._last_x, engine._global_batch_size = None, None, None
        engine._checked_optimizers, engine._shuffle = set(), ShuffleCursor()
        return engine

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

    def check_data(
        self, x: Tensor, y: Tensor, kwargs: Mapping[str, Any] | None = None, *, where: str = "CAVI.check_data"
    ) -> ObservedData:
        """The data ``(x, y)`` with the per-datum keyword data ``kwargs`` (e.g. ``{"trials": t}``), checked once:
        the checks of :func:`~gpytorch_augment.core.check_data` with the model's batch shape, input dimension and
        dtype (:meth:`check_inputs`); at least one data point unless the data are sharded (a rank may hold none).
        Every entry point (:meth:`fit`, :meth:`step`, :meth:`elbo`, :meth:`hyper_step`) runs it once; :meth:`step`
        and :meth:`elbo` also take its value, and then check nothing.

        :param where: the entry point the errors name.
        :raises ValueError: naming the offending argument; ``TypeError`` for a keyword the likelihood does not take.
        """
        return check_data(
            self.likelihood, x, y, kwargs, where=where, check_inputs=self.check_inputs, allow_empty=self.distributed
        )

    def _data(self, x: Tensor | ObservedData, y: Tensor | None, kwargs: dict[str, Any], where: str) -> ObservedData:
        """``x`` itself where it is checked data (then no ``y`` and no keyword data), else :meth:`check_data`."""
        if not isinstance(x, ObservedData):
            return self.check_data(x, y, kwargs, where=where)
        if y is not None or kwargs:
            raise TypeError(f"{where} takes either checked data (an ObservedData) alone, or x, y and keyword data")
        return x

    def check_inputs(self, x: Tensor, y: Tensor) -> None:
        """Raise ``ValueError`` unless ``x, y`` are finite data of the model's batch shape, input dimension and
        dtype (for linear observations: ``x`` of shape ``(N, D)``, ``y`` one target per observation)."""
        check_model_inputs(self.strategy, self.likelihood, x, y)

    def prior_terms(self, data: ObservedData, cache: bool) -> PriorTerms:
        """The prior terms the CAVI step works on: those of the points ``data.x`` for a pointwise likelihood, those of
        the observation functionals :math:`g = Df` of ``data.design`` for one with linear observations
        (:mod:`gpytorch_augment.core.design`); ``cache``: kept while the hyper-parameters stay put (the strategy's
        ``cavi_terms`` rule)."""
        if data.design is None:
            return self.strategy.cavi_terms(data.x, cache=cache)
        return self.strategy.observation_terms(data.x, data.design, cache=cache)

    def _refuse_partial_observations(self, num: int, what: str) -> None:
        """Linear observations are fitted on all the observations at once (per process): ``ValueError`` otherwise."""
        if self.likelihood.linear_observations and not self.distributed and num < self.num_data:
            raise ValueError(
                f"{type(self.likelihood).__name__} reads linear combinations of the inputs: {what} needs all "
                f"num_data = {self.num_data} observations at once (mini-batches are not supported); got {num}"
            )

    def _to_likelihood_layout(self, t: Tensor) -> Tensor:
        # the strategy is latent-major (T, N); multi-latent likelihoods take (N, T)
        return t.mT if self.likelihood.num_latents > 1 else t

    def _marginals(self, terms: PriorTerms, q: WhitenedGaussian, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The marginals of :math:`q(f)` in the likelihood's layout and the data's dtype."""
        mean, var = q.marginals(terms)
        return self._to_likelihood_layout(mean).to(dtype), self._to_likelihood_layout(var).to(dtype)

    def marginal_distribution(self, terms: PriorTerms, q: WhitenedGaussian, dtype: torch.dtype) -> MultivariateNormal:
        r"""The diagonal :math:`q(f)` of the whitened ``q`` at the inputs of ``terms``, in GPyTorch's layout for the
        likelihood and in ``dtype`` (with a graph to the hyper-parameters where ``terms`` has one)."""
        mean, var = q.marginals(terms)
        return diagonal_gaussian(self.likelihood, mean.to(dtype), var.to(dtype))

    # ------------------------------------------------------------------------------------------------ q(u)
    def q_state(self) -> list[Tensor]:
        """A detached copy of :math:`q(u)`'s parameters (those of the strategy's variational distribution)."""
        return [p.detach().clone() for p in self.strategy.check_distribution().parameters()]

    @torch.no_grad()
    def load_q_state(self, state: list[Tensor]) -> None:
        """Put a :meth:`q_state` back into the model (in place, without a graph); the strategy forgets what it
        memoised of the previous :math:`q(u)`."""
        for p, saved in zip(self.strategy.check_distribution().parameters(), state):
            p.copy_(saved)
        self.strategy._clear_cache()

    def _local_step(
        self, terms: PriorTerms, q: WhitenedGaussian, y: Tensor, dtype: torch.dtype
    ) -> tuple[AuxDict, Tensor, Tensor, Tensor, Tensor]:
        r"""The optimal :math:`q(\Omega)` of the batch and the marginals and expected ``(h, lam)`` it implies:
        ``(q_aux, f_mean, f_var, h, lam)``."""
        f_mean, f_var = self._marginals(terms, q, dtype)
        q_aux = self.likelihood.aux_posterior(y, f_mean, f_var)
        h, lam = self.likelihood.expected_potential_and_precision(y, q_aux, f_mean, f_var)
        return q_aux, f_mean, f_var, h, lam

    def _initial_gradients(
        self, terms: PriorTerms, q: WhitenedGaussian, h: Tensor, lam: Tensor, num_init: int
    ) -> Tensor:
        """Noisy natural gradients from ``num_init`` disjoint sub-batches of the batch, each scaled to N."""
        n = h.shape[-1]
        index = torch.arange(n, device=h.device)
        # with sharded data every rank needs the same number of chunks (some may be empty)
        chunks = index.tensor_split(num_init) if self.distributed else index.chunk(min(num_init, n))
        samples = []
        for idx in chunks:
            stats = self.strategy.statistics(terms.take(idx), take(h, idx), take(lam, idx))
            stats = stats.all_reduce(self.process_group)[0]  # with sharded data: chunk k of every rank
            samples.append(natural_gradient(q, stats.scale(self.num_data / max(stats.count, 1)).natural()))
        return torch.stack(samples)

    # ------------------------------------------------------------------------------------------------ steps
    def step(
        self,
        x: Tensor | ObservedData,
        y: Tensor | None = None,
        hyper_optimizer: torch.optim.Optimizer | None = None,
        **kwargs: Any,
    ) -> Tensor:
        r"""One local + global update on the batch ``(x, y)`` (extra keyword arguments, e.g. ``trials=``, are
        per-datum data of the batch), checked first (:meth:`check_data`); or on checked data, ``step(data)`` with
        ``data`` from :meth:`check_data` (or a :meth:`~gpytorch_augment.core.ObservedData.take` of it), which checks
        nothing: on an accelerator such a step reads nothing back from the device but what the kernel factorisation
        needs.

        With ``hyper_optimizer``, one step of it on :math:`-`:attr:`hyper_objective` of the same batch follows, at
        the updated :math:`q(u)` (what :meth:`fit` does); for the whitened strategy and the default AugmentedELBO it
        re-uses the prior terms of the CAVI step, so the pair costs one kernel evaluation and one Cholesky.

        Returns the augmented ELBO per datum, :math:`\big(\tfrac{N}{|\mathcal B|}\sum_{i\in\mathcal B}\ell_i^*
        - \mathrm{KL}(q(u)\Vert p(u))\big)/N`, of :math:`q(u)` as it was on entry (an unbiased estimate of the
        full-data value for a mini-batch; exact for the full batch). Cost :math:`O(|\mathcal B|M^2 + M^3)`.
        """
        return self._step(self._data(x, y, kwargs, "CAVI.step"), hyper_optimizer)

    def _step(self, data: ObservedData, hyper_optimizer: torch.optim.Optimizer | None = None) -> Tensor:
        """:meth:`step` on checked ``data`` (no check of its values), optionally followed by one step of
        ``hyper_optimizer`` on the hyper objective of the same batch at the updated :math:`q(u)`, re-using the prior
        terms (one kernel evaluation and one Cholesky)."""
        if not self.distributed:  # num_data counts observations: the points, or the linear observations of them
            check_batch_size(data.num_data, self.num_data, "CAVI.step")
        if self.likelihood.linear_observations:
            self._refuse_partial_observations(data.num_data, "CAVI.step")
            if hyper_optimizer is not None:
                raise ValueError(
                    f"{type(self.likelihood).__name__} reads linear combinations of the inputs: learn the "
                    "hyper-parameters with fit(x, y, learn_hyperparameters=True, ...), not a hyper_optimizer"
                )
        if hyper_optimizer is not None and id(hyper_optimizer) not in self._checked_optimizers:
            self.check_hyper_optimizer(hyper_optimizer)
            self._checked_optimizers.add(id(hyper_optimizer))
        fused = hyper_optimizer is not None and self._can_fuse()
        # the prior terms of the full data are cached while the hyper-parameters stay put (a mini-batch changes
        # every step: caching it would only cost a copy)
        # (with sharded data: the same local inputs as the last step)
        full_batch = data.num_data >= self.num_data or data.x is self._last_x
        self._last_x = data.x
        with torch.set_grad_enabled(fused):
            graph_terms = self.prior_terms(data, cache=full_batch)
        terms = graph_terms.detach() if fused else graph_terms
        with torch.no_grad():
            elbo, q = self.update(data, terms)
        if hyper_optimizer is not None:
            if fused:
                self._fused_hyper_step(data, graph_terms, q, hyper_optimizer)
            else:
                self._hyper_steps(data, hyper_optimizer)
        return elbo

    def update(
        self, data: ObservedData, terms: PriorTerms, update_constants: bool = True, with_elbo: bool = True
    ) -> tuple[Tensor, WhitenedGaussian]:
        r"""One closed-form CAVI update on the checked ``data`` at ``terms``, without checks (what :meth:`step`
        runs on its batch): the local step, the closed-form likelihood updates (unless ``update_constants`` is off:
        the nested protocol learns the constants by L-BFGS) and the damped global step, written into the model.
        Returns the ELBO estimate of the entry state (NaN without ``with_elbo``) and the new whitened
        :math:`q(v)`."""
        strategy, likelihood = self.strategy, self.likelihood
        targets, dtype = data.y, data.x.dtype
        q = strategy.whitened_q(terms)
        f_mean, f_var = self._marginals(terms, q, dtype)
        q_aux = likelihood.aux_posterior(targets, f_mean, f_var)
        ell = likelihood.elbo_terms(targets, q_aux, f_mean, f_var).sum(-1) if with_elbo else f_mean.new_zeros(())
        if update_constants:
            self._update_constants(targets, q_aux, f_mean, f_var)
        h, lam = likelihood.expected_potential_and_precision(targets, q_aux, f_mean, f_var)
        stats, (ell,) = strategy.statistics(terms, h, lam).all_reduce(self.process_group, [ell])
        self._global_batch_size = stats.count
        scale = self.num_data / stats.count
        kl = q.kl().sum().to(dtype) if with_elbo else f_mean.new_full((), math.nan)
        elbo = (scale * ell - kl) / self.num_data
        target = stats.scale(scale).natural()

        schedule = self._schedule(stats.count)
        if getattr(schedule, "uses_gradient", False):
            if not schedule.initialized:
                schedule.initialize(self._initial_gradients(terms, q, h, lam, schedule.num_init))
            else:
                schedule.observe(natural_gradient(q, target))
        rho = self._rho(schedule)
        blocks = validated_latent_blocks(likelihood)
        for k, block in enumerate(blocks or [None]):
            if k > 0:  # refresh q(Ω) (and the statistics) from the latents updated by the previous blocks
                q = strategy.whitened_q(terms)
                q_aux, f_mean, f_var, h, lam = self._local_step(terms, q, targets, dtype)
                target = strategy.statistics(terms, h, lam).all_reduce(self.process_group)[0].scale(scale).natural()
            q_new = q.step(target, rho)
            if block is not None:  # only this block's latents move; the others keep their current q
                moves = torch.zeros(q.theta1.shape[-2], dtype=torch.bool, device=q.theta1.device)
                moves[block] = True
                q_new = q_new.where(moves, q)
            strategy.write_whitened(q_new, terms)
        self.q_aux = q_aux
        self.last_step_size = rho
        self.num_steps += 1
        return elbo, q_new

    def _update_constants(self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor) -> None:
        """The likelihood's closed-form constant updates; with sharded data, on every rank's data at once (the
        per-datum moments are gathered: the updates are sums over all the data)."""
        likelihood = self.likelihood
        overridden = type(likelihood).update_hyperparameters is not AugmentedLikelihood.update_hyperparameters
        if not (overridden and self.distributed):
            likelihood.update_hyperparameters(y, q_aux, f_mean, f_var)
            return
        data_dim = -1 if likelihood.num_latents == 1 else -2
        parts = all_gather_objects((y.cpu(), f_mean.cpu(), f_var.cpu()), self.process_group)
        y_all = torch.cat([p[0] for p in parts], dim=-1).to(y.device)
        m_all, v_all = (torch.cat([p[i] for p in parts], dim=data_dim).to(f_mean.device) for i in (1, 2))
        likelihood.update_hyperparameters(y_all, likelihood.aux_posterior(y_all, m_all, v_all), m_all, v_all)

    @torch.no_grad()
    def elbo(
        self, x: Tensor | ObservedData, y: Tensor | None = None, chunk_size: int | None = None, **kwargs: Any
    ) -> Tensor:
        r"""The full-data augmented ELBO per datum of the current :math:`q(u)` (``x, y`` = all the data, checked
        first; or ``elbo(data)`` on data from :meth:`check_data`, not checked again).

        The data are processed in chunks of ``chunk_size`` points (default: as many as keep the
        :math:`M\times` chunk cross-covariance under :math:`2^{22}` elements), so that no :math:`M\times N` matrix
        is ever formed for large :math:`N`.
        """
        data = self._data(x, y, kwargs, "CAVI.elbo")
        x, num_data = data.x, data.num_data
        if self.likelihood.linear_observations:  # one chunk: the observations read points anywhere in x
            self._refuse_partial_observations(num_data, "CAVI.elbo")
            chunk_size = num_data
        if chunk_size is None:
            num_inducing = self.strategy.inducing_points.shape[-2]
            chunk_size = max(1, _ELBO_CHUNK_ELEMENTS // max(num_inducing, 1))
        elif int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
        total: Tensor | float = 0.0
        kl: Tensor | None = None
        single = int(chunk_size) >= num_data  # only then are the prior terms worth caching
        for start in range(0, num_data, int(chunk_size)):
            chunk = data if single else data.take(slice(start, start + int(chunk_size)))
            terms = self.prior_terms(chunk, cache=single)
            q = self.strategy.whitened_q(terms)
            if kl is None:
                kl = q.kl().sum().to(x.dtype)
            f_mean, f_var = self._marginals(terms, q, x.dtype)
            total = total + self.likelihood.collapsed_bound(chunk.y, f_mean, f_var).sum(-1)
        if kl is None:  # no local data (an empty shard)
            kl = self.strategy.whitened_q(self.strategy.cavi_terms(x, cache=False)).kl().sum().to(x.dtype)
        total = torch.as_tensor(total, dtype=x.dtype, device=x.device)
        if self.distributed:
            count = torch.tensor([float(num_data)], dtype=x.dtype, device=x.device)
            summed, count = all_reduce_sum([total.reshape(-1), count], self.process_group)
            total, num_data = summed.reshape(total.shape), int(round(float(count.item())))
        return (total - kl) / num_data

    # ------------------------------------------------------------------------------------------------ fit
    def check_hyper_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Raise ``ValueError`` if ``optimizer`` holds :math:`q(u)`'s parameters (CAVI updates those)."""
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
        tol: float | None = None,
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
        learn_hyperparameters: bool = False,
        hyper_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> CAVITrace:
        r"""Run CAVI steps (each followed by ``hyper_steps`` hyper-parameter steps if ``hyper_optimizer`` is
        given) until ``convergence`` says so or a cap is reached; or, with ``learn_hyperparameters=True``, learn the
        hyper-parameters and :math:`q(u)` together by the package's one-call protocol.

        The data: ``x`` of shape ``(N, D)`` (or ``(*batch_shape, N, D)`` for a batched model) and ``y`` of shape
        ``(N,)`` (one target per point, also for multi-latent likelihoods; ``(N, 1)`` is accepted and squeezed).
        The model and the likelihood are put in training mode for the fit; their modes are restored afterwards.

        **Full batch** (``x, y`` and no ``batch_size``): every step uses all the data; the run stops when the
        relative change of the augmented ELBO falls below ``tol`` (default ``1e-8``)
        (``RelativeChange(tol, window=1)``) or after ``max_iter`` steps (default 100).

        **Mini-batch**: either ``batch_size`` (with ``x, y``: each epoch visits a fresh random permutation, drawn
        from ``generator``; per-datum keyword arguments, e.g. ``trials=``, are sliced along with ``y``) or a torch
        ``data_loader`` whose batches are ``(x, y)``, ``(x, y, {name: tensor})`` or ``{"x": x, "y": y, name:
        tensor}`` (then ``x, y`` must not be given). Runs ``num_epochs`` epochs (default 10) or ``max_iter`` steps
        (default unlimited), whichever comes first, or until ``convergence`` (default ``RelativeChange(tol,
        window=steps per epoch)`` on the per-step ELBO estimates). A step touches only its batch.

        **Learning the hyper-parameters** (``learn_hyperparameters=True``; needs ``x, y``, no ``hyper_optimizer``
        and no ``data_loader``): :func:`~gpytorch_augment.inference.hyperparameters.fit_hyperparameters`. The fit is
        MAP under default hyper-priors for every lengthscale and outputscale without one of yours
        (``hyper_options={"priors": False}``: maximum likelihood), starts every lengthscale still at GPyTorch's
        initial value at a data-aware point, and restarts a fit that ends at a constant predictor. Up to
        :data:`~gpytorch_augment.inference.hyperparameters.NESTED_MAX_DATA` points the *nested* protocol runs
        L-BFGS on the hyper-parameters, with :math:`q(u)` re-solved by CAVI inside every evaluation of the true
        ELBO; there ``max_iter`` caps L-BFGS iterations (default 500), ``tol`` is the relative change of the
        objective that stops it (default ``1e-6``) and ``num_epochs``/``batch_size`` do not apply. Above it the
        *subsample* protocol runs the nested one on doubling random subsamples until the hyper-parameters settle,
        then solves :math:`q(u)` on all the data and tests stationarity there. With data sharded over processes
        the *stochastic* protocol runs mini-batch CAVI with fused Adam steps: ``batch_size`` (default 1024),
        ``num_epochs`` (default 20), ``max_iter`` (CAVI steps, default none) and ``tol`` (default ``1e-4``, on the
        epoch-averaged bound). Each warns when it stops on a cap.

        :param hyper_optimizer: optional torch optimizer over hyper-parameters (kernel, mean, likelihood constants,
            inducing inputs); after each CAVI step it takes ``hyper_steps`` steps on ``-hyper_objective`` (default
            ``AugmentedELBO``, see the class) of the same batch (:meth:`hyper_step`). It must not hold the
            variational parameters (``ValueError``).
            Closed-form likelihood updates (``likelihood.update_hyperparameters``) run inside every step anyway.
        :param callback: called as ``callback(t, elbo)`` after every step (or L-BFGS iteration).
        :param convergence: a :class:`RelativeChange`, a :class:`HeldOut` or any callable ``trace -> bool``.
        :param progress: show a ``tqdm`` progress bar (per step, with the ELBO estimate and held-out metric).
        :param learn_hyperparameters: learn the hyper-parameters too (above).
        :param hyper_options: the one-call fit's options: a
            :class:`~gpytorch_augment.inference.fit_options.FitOptions` or a dict of its fields (``priors``,
            ``protocol``, ``optimizer``, ``restarts``, ``lr``, ...); an option that does not apply to the protocol
            that runs is a ``ValueError``.
        :returns: a :class:`CAVITrace`; with ``learn_hyperparameters=True`` a
            :class:`~gpytorch_augment.inference.fit_result.FitResult` (a trace with the status, the reason, the
            objective and the priors used).
        """
        check_minibatches(self.likelihood, batch_size, data_loader)
        if learn_hyperparameters or hyper_options is not None:  # the one-call protocol (its own defaults)
            if not learn_hyperparameters:
                raise ValueError("hyper_options are only used with learn_hyperparameters=True")
            if hyper_optimizer is not None:
                raise ValueError("pass either hyper_optimizer (your own loop) or learn_hyperparameters=True, not both")
            if data_loader is not None:
                raise ValueError("learn_hyperparameters=True needs the data as tensors x, y, not a data_loader")
            options = FitOptions.from_mapping(hyper_options, batch_size=batch_size, num_epochs=num_epochs)
            return hyperparameters.fit_hyperparameters(
                self, x, y, options, max_iter=max_iter, tol=tol, convergence=convergence, progress=progress,
                callback=callback, generator=generator, **kwargs,
            )  # fmt: skip
        config = fit_config(
            self, fit_data(self, x, y, kwargs, batch_size, data_loader), max_iter=max_iter,
            tol=1e-8 if tol is None else tol, hyper_optimizer=hyper_optimizer, hyper_steps=hyper_steps,
            batch_size=batch_size, data_loader=data_loader, num_epochs=num_epochs, convergence=convergence,
            generator=generator,
        )  # fmt: skip
        trace = self.run(config, callback, progress)
        if not trace.converged and config.max_iter is not None and trace.num_steps >= config.max_iter:
            warnings.warn(
                f"CAVI.fit stopped at max_iter={config.max_iter} steps before the convergence rule was met "
                "(trace.converged is False): raise max_iter or loosen the rule",
                UserWarning,
                stacklevel=2,
            )
        return trace

    def run(
        self, config: FitConfig, callback: Callable[[int, float], object] | None = None, progress: bool = False
    ) -> CAVITrace:
        """CAVI steps over the batches of ``config`` (each followed by its hyper-parameter steps) until its stopping
        rule or a cap, the model and the likelihood in training mode (their modes restored afterwards):
        :meth:`fit` without learning the hyper-parameters, and the stochastic protocol's inner loop. A stop on a cap
        leaves ``trace.converged`` False (no warning: the caller says what it means).

        :param config: the fit's settings, built and checked by
            :func:`~gpytorch_augment.inference._fit_setup.fit_config`.
        :param callback: called as ``callback(t, elbo)`` after every step.
        :param progress: show a ``tqdm`` progress bar.
        """
        bar = progress_bar(config.total_steps) if progress else None
        try:
            with training_mode(self.model, self.likelihood):
                return self._run(config, callback, bar)
        finally:
            if bar is not None:
                bar.close()

    def _run(self, config: FitConfig, callback: Callable[[int, float], object] | None, bar: Any) -> CAVITrace:
        """The loop of :meth:`run`: steps, hyper-parameter steps, the trace, the stopping rule and the caps."""
        trace = CAVITrace()
        clock = Clock()
        epoch = 0
        while config.num_epochs is None or epoch < config.num_epochs:
            for batch, epoch_end in config.epoch():  # checked data: no step checks them again
                loss = self._step(batch, config.hyper_optimizer)
                if config.hyper_optimizer is not None and config.hyper_steps > 1:
                    self._hyper_steps(batch, config.hyper_optimizer, steps=config.hyper_steps - 1)
                value = float(loss)  # the step's one host synchronisation: the trace and the stopping rule need it
                t = trace.num_steps
                trace.elbo.append(value)
                trace.time.append(clock.elapsed())
                trace.epoch.append(epoch)
                trace.step_size.append(float(self.last_step_size or math.nan))
                if callback is not None:
                    callback(t, value)
                if not math.isfinite(value):
                    raise FloatingPointError(f"augmented ELBO became {value} at step {t}")
                with clock.paused():
                    done = self._check_convergence(config, trace, epoch_end)
                if bar is not None:
                    show_progress(bar, trace)
                if done:
                    trace.converged = True
                    return trace
                if config.max_iter is not None and trace.num_steps >= config.max_iter:
                    return trace
            epoch += 1
        return trace

    def _check_convergence(self, config: FitConfig, trace: CAVITrace, epoch_end: bool) -> bool:
        """The stopping rule, with the model's and likelihood's train/eval modes restored afterwards (a held-out
        metric may switch them)."""
        modes = (self.model.training, self.likelihood.training)
        done = config.check(trace, epoch_end)
        if (self.model.training, self.likelihood.training) != modes:
            self.model.train(modes[0])
            self.likelihood.train(modes[1])
        return broadcast_flag(done, self.process_group)  # with sharded data: rank 0 decides for every rank
