r"""The nested protocol of the one-call fit: L-BFGS on the hyper-parameters :math:`\theta` alone, with
:math:`q(u)` re-solved inside every evaluation.

The objective is a function of :math:`\theta` only,

.. math::
    J(\theta) = -\mathcal L\big(\theta, q_\theta(u)\big) / N, \qquad
    q_\theta(u) = \mathrm{NG}^{j}_\theta\big(\mathrm{CAVI}^k_\theta(q_0(u))\big),

where :math:`\mathcal L` is GPyTorch's true ``VariationalELBO`` (with the model's and likelihood's registered priors)
and :math:`q_\theta(u)` is the result of ``inner_steps`` :math:`k` full-batch CAVI steps at :math:`\theta`, started
from a fixed *snapshot* :math:`q_0(u)`, followed by ``true_steps`` :math:`j` natural-gradient steps on :math:`\mathcal
L` itself (:meth:`NestedObjective._true_elbo_step`). CAVI converges fast but to the optimum of the *augmented*
bound; the natural-gradient steps move :math:`q(u)` on to the true ELBO's optimum, so the hyper-parameters are not
biased where the augmented bound is loose. Every evaluation restores the snapshot first, so the function L-BFGS's
line search sees is deterministic. None of the inner steps needs an autograd graph through :math:`q(u)`; the
gradient is that of :math:`\mathcal L` with :math:`q(u)` held at :math:`q_\theta(u)` (at a stationary
:math:`q_\theta(u)` this is :math:`dJ/d\theta`: the envelope theorem). After each L-BFGS iteration the snapshot moves
to :math:`q_\theta(u)` at the new :math:`\theta`, so :math:`q_0` tracks the optimum.

Likelihood constants that have a closed-form CAVI update (scales, rate scales, class scales, degrees of freedom) are
part of :math:`\theta` here: L-BFGS moves them along the true ELBO, and the inner CAVI steps hold them fixed.

Safeguards: an evaluation that fails (a kernel matrix that cannot be factorised) or is not finite counts as a very
high objective without a gradient, so the strong-Wolfe line search shortens its step; an iteration that cannot move
restarts L-BFGS with its short first step, and a second one in a row ends the run. Such a stop is certified by
:meth:`NestedProtocol.stationarity` (the true ELBO's gradient with :math:`q(u)` at its optimum); where it is not
stationary, :meth:`NestedProtocol.restart` goes on in *polish* mode: exact gradients at a held :math:`q(u)`, which is
re-solved after every iteration.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.variational import UnwhitenedVariationalStrategy
from torch import Tensor

from .._numerics import gauss_hermite
from ..core import ObservedData, PriorTerms, WhitenedGaussian
from ..likelihoods.augmented_likelihood import NUM_QUADRATURE_LOCS
from .engine import CAVIEngine, diagonal_gaussian

__all__ = ["SAMPLING_PARTS", "NestedObjective", "NestedProtocol"]

#: the parts a subsample is split into to estimate the sampling error of its gradient
#: (:meth:`NestedObjective.sampling_error`)
SAMPLING_PARTS = 16


class NestedObjective:
    r""":math:`J(\theta)` (module docstring) for a :class:`~gpytorch_augment.CAVI` and its full training data.

    :param cavi: the CAVI engine, used through :class:`~gpytorch_augment.inference.engine.CAVIEngine`.
    :param data: all the training data, checked once (``cavi.check_data(x, y, kwargs)``): every evaluation takes
        their canonical targets, never checking them again.
    :param inner_steps: :math:`k`, the CAVI steps of an evaluation.
    :param true_steps: :math:`j`, the natural-gradient steps on the true ELBO after them.

    Example::

        >>> import torch, gpytorch_augment as ga, gpytorch_augment.testing as gt
        >>> x = torch.linspace(0, 6, 40, dtype=torch.float64).unsqueeze(-1)
        >>> y = (x.squeeze(-1).cos() > 0).double()
        >>> cavi = ga.CAVI(gt.SVGP(x[::5].clone()).double(), ga.BernoulliLogitLikelihood(), num_data=40)
        >>> objective = NestedObjective(cavi, cavi.check_data(x, y))
        >>> objective.advance(10)                 # CAVI steps at the current hyper-parameters; a new snapshot
        >>> loss = objective()                    # J(theta) with its graph: loss.backward() gives dJ/dtheta
        >>> bool(loss > 0)
        True
    """

    def __init__(self, cavi: CAVIEngine, data: ObservedData, inner_steps: int = 3, true_steps: int = 3) -> None:
        self.cavi, self.data, self.x = cavi, data, data.x
        self.true_steps = int(true_steps)
        self.inner_steps = int(inner_steps)
        self.num_data = data.num_data
        self.strategy = cavi.strategy
        self._fused = not isinstance(self.strategy, UnwhitenedVariationalStrategy)
        #: whether the likelihood reads linear combinations of the inputs: the terms and marginals are then those of
        #: the observation functionals g = Df, and the true expected log-likelihood is taken at their marginals
        self._observed = bool(cavi.likelihood.linear_observations)
        if self._observed and not self._fused:
            raise ValueError(
                f"{type(cavi.likelihood).__name__} reads linear combinations of the inputs: the nested protocol needs "
                "the whitened CAVIVariationalStrategy for it"
            )
        self._true_elbo = _TrueELBO(cavi.likelihood, cavi.model, self.num_data)
        #: the number of evaluations so far
        self.num_evaluations = 0
        self._snapshot: list[Tensor] = []
        self.snapshot()

    # ------------------------------------------------------------------------------------------------ q(u)
    def snapshot(self) -> None:
        """Remember the current :math:`q(u)` as the start :math:`q_0(u)` of every evaluation."""
        self._snapshot = self.cavi.q_state()

    def restore(self) -> None:
        """Put :math:`q_0(u)` back into the model."""
        self.cavi.load_q_state(self._snapshot)

    @torch.no_grad()
    def advance(self, steps: int | None = None) -> None:
        """``steps`` (default :math:`k`) CAVI steps at the current hyper-parameters from :math:`q_0(u)`; their
        result becomes the new snapshot."""
        self.restore()
        self._cavi_steps(self.inner_steps if steps is None else int(steps), self._terms(graph=False))
        self.snapshot()

    def _terms(self, graph: bool) -> PriorTerms:
        with torch.set_grad_enabled(graph):
            return self.cavi.prior_terms(self.data, cache=not graph)

    def _expected_log_lik(self, mean: Tensor, var: Tensor) -> Tensor:
        r""":math:`\sum_i E_{q(f_i)}\log p(y_i\mid f_i)` at the latent-major marginals ``mean``, ``var`` (those of
        :math:`g = Df` for linear observations: Gauss--Hermite on the likelihood's ``log_prob_at``)."""
        likelihood = self.cavi.likelihood
        if self._observed:
            nodes, weights = gauss_hermite(mean, var, NUM_QUADRATURE_LOCS)
            return (weights * likelihood.log_prob_at(self.data.y, nodes)).sum()
        f_dist = diagonal_gaussian(likelihood, mean, var)
        return likelihood.expected_log_lik(self.data.y, f_dist, **self.data.kwargs).sum()

    @torch.no_grad()
    def _cavi_steps(self, steps: int, terms: PriorTerms, with_true_steps: bool = True) -> WhitenedGaussian | None:
        """``steps`` full-batch CAVI steps with the likelihood's constants held, then (if ``with_true_steps`` and
        ``steps``) :attr:`true_steps` conjugate-computation steps on the true ELBO; the final whitened q(v)."""
        q = None
        for _ in range(steps):
            _, q = self.cavi.update(self.data, terms, update_constants=False, with_elbo=False)
        for _ in range(self.true_steps if steps and with_true_steps else 0):
            q = self._true_elbo_step(terms, q)
        return q

    def _true_elbo_step(self, terms: PriorTerms, q: WhitenedGaussian, rho: float = 1.0) -> WhitenedGaussian:
        r"""One natural-gradient step of size 1 on the **true** ELBO (conjugate-computation VI, Khan & Lin 2017):
        the gradients of :math:`\sum_i E_{q(f_i)}\log p(y_i\mid f_i)` with respect to the marginal means
        :math:`m_i` and variances :math:`s_i` act as Gaussian pseudo-observations, precision
        :math:`\lambda_i = -2\,\partial/\partial s_i` (clamped at 0) and potential :math:`h_i = \partial/\partial m_i
        + \lambda_i m_i`, which enter the same sufficient statistics as CAVI's. It removes the augmented bound's
        bias from :math:`q(u)` where the bound is loose."""
        mean, var = q.marginals(terms)
        mean, var = mean.to(self.x.dtype).requires_grad_(True), var.to(self.x.dtype).requires_grad_(True)
        with torch.enable_grad():
            ell = self._expected_log_lik(mean, var)
            d_mean, d_var = torch.autograd.grad(ell, (mean, var))
        lam = (-2 * d_var).clamp_min(0)
        stats = self.strategy.statistics(terms, d_mean + lam * mean.detach(), lam)
        q = q.step(stats.natural(), rho)
        self.strategy.write_whitened(q, terms)
        return q

    @torch.no_grad()
    def true_elbo(self, terms: PriorTerms, q: WhitenedGaussian) -> float:
        """GPyTorch's true ELBO per datum at the whitened ``q`` (no graph)."""
        mean, var = q.marginals(terms)
        ell = self._expected_log_lik(mean.to(self.x.dtype), var.to(self.x.dtype))
        return float((ell - q.kl().sum().to(ell.dtype)) / self.num_data)

    def sampling_error(self, params: list[Tensor], population: int, parts: int = SAMPLING_PARTS) -> float:
        r"""How far the gradient per datum on a population of ``population`` points may lie from the gradient on
        these data, a uniform random sample of it: the largest standard error over the entries of
        :math:`\partial J/\partial\theta` (``params``), :math:`q(u)` held at the snapshot.

        The data split into ``parts`` equal parts :math:`P_k` of :math:`n_P` points; :math:`g_k` is the gradient of
        :math:`J` on part :math:`k` alone. The KL term and the priors enter every :math:`g_k` alike, so their spread
        is the sampling spread of the expected log-likelihood's per-datum gradient, and the standard error of the
        mean over :math:`n = K n_P` points, with the finite-population correction, is

        .. math::
            \mathrm{se}_j = \sqrt{\frac{\widehat{\mathrm{Var}}_k(g_{kj})}{K}\Big(1 - \frac{n}{N}\Big)}.

        ``0.0`` where the data are the whole population or too few to split.
        """
        n = self.num_data
        size = n // int(parts)
        if size < 1 or int(parts) < 2 or n >= population:
            return 0.0
        grads = []
        for k in range(int(parts)):
            part = NestedObjective(self.cavi, self.data.take(slice(k * size, (k + 1) * size)), 0, 0)
            part._snapshot = self._snapshot
            loss = part(solve=False)
            grad = torch.autograd.grad(loss, params, allow_unused=True)
            grads.append(torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                                    for g, p in zip(grad, params)]))  # fmt: skip
        g = torch.stack(grads).double()
        error = (g.var(0) / int(parts) * (1.0 - n / population)).sqrt()
        largest = float(error.max()) if error.numel() else 0.0
        return largest if math.isfinite(largest) else math.inf

    # ------------------------------------------------------------------------------------------------ J(theta)
    def __call__(self, solve: bool = True) -> Tensor:
        r""":math:`J(\theta)` with its autograd graph to the hyper-parameters (call ``backward()`` on it);
        ``solve=False``: the negative true ELBO per datum at the snapshot itself (no inner steps)."""
        self.num_evaluations += 1
        self.restore()
        cavi = self.cavi
        inner_steps = self.inner_steps if solve else 0
        if not self._fused:
            with torch.no_grad():
                self._cavi_steps(inner_steps, self._terms(graph=False), solve)
            with cavi.frozen_q():
                return -self._true_elbo(cavi.model(self.x), self.data)
        graph_terms = self._terms(graph=True)
        q = self._cavi_steps(inner_steps, graph_terms.detach(), solve)
        if q is None:
            q = self.strategy.whitened_q(graph_terms.detach())
        with cavi.frozen_q():  # (the marginals of g = Df, for linear observations)
            return -self._true_elbo(cavi.marginal_distribution(graph_terms, q, self.x.dtype), self.data)


class _TrueELBO(gpytorch.mlls.VariationalELBO):
    """GPyTorch's ``VariationalELBO`` (its KL, priors and added losses combined as GPyTorch does) called with the
    checked data: the expected log-likelihood is the likelihood's ``expected_log_lik`` of the canonical targets, or,
    for linear observations (called with the diagonal :math:`q(g)` of the observation functionals),
    Gauss--Hermite quadrature of its ``log_prob_at`` at the marginals of :math:`g` (no check of the targets)."""

    def _log_likelihood_term(
        self, variational_dist_f: MultivariateNormal, target: ObservedData, **kwargs: Any
    ) -> Tensor:
        if target.design is None:
            return self.likelihood.expected_log_lik(target.y, variational_dist_f, **target.kwargs).sum(-1)
        nodes, weights = gauss_hermite(variational_dist_f.mean, variational_dist_f.variance, NUM_QUADRATURE_LOCS)
        return (weights * self.likelihood.log_prob_at(target.y, nodes)).sum(0).sum(-1)


class NestedProtocol:
    r"""The nested protocol one L-BFGS iteration at a time (what the one-call fit loops over; benchmarks drive it
    directly).

    The first :meth:`step` runs ``initial_steps`` CAVI steps at the initial hyper-parameters; every step then takes
    one L-BFGS iteration (strong-Wolfe line search, ``history_size`` pairs) on :class:`NestedObjective` and moves the
    snapshot to the new hyper-parameters. Safeguards: an evaluation that fails (a kernel matrix that cannot be
    factorised) or is not finite counts as a very high objective with no gradient, so the line search backs off;
    an iteration that cannot move restarts L-BFGS from its short first step, and a second one in a row marks the
    run :attr:`stalled`. :meth:`finish` runs CAVI at the final hyper-parameters until :math:`q(u)` stops moving;
    :meth:`stationarity` then certifies the stop, and :meth:`restart` goes on in polish mode where it fails.

    Example::

        >>> import torch, gpytorch_augment as ga, gpytorch_augment.testing as gt
        >>> from gpytorch_augment.inference.hyperparameters import hyperparameters_of
        >>> x = torch.linspace(0, 6, 40, dtype=torch.float64).unsqueeze(-1)
        >>> y = (x.squeeze(-1).cos() > 0).double()
        >>> cavi = ga.CAVI(gt.SVGP(x[::5].clone()).double(), ga.BernoulliLogitLikelihood(), num_data=40)
        >>> protocol = NestedProtocol(cavi, cavi.check_data(x, y), hyperparameters_of(cavi))
        >>> elbos = [protocol.step() for _ in range(5)]   # the true ELBO per datum entering each iteration
        >>> elbos[-1] > elbos[0]
        True
        >>> protocol.finish()
    """

    def __init__(
        self,
        cavi: CAVIEngine,
        data: ObservedData,
        params: list[Tensor],
        inner_steps: int = 3,
        true_steps: int = 3,
        initial_steps: int = 10,
        history_size: int = 20,
        max_line_search: int = 25,
    ) -> None:
        self.cavi, self.params = cavi, params
        self.objective = NestedObjective(cavi, data, inner_steps, true_steps)
        self.initial_steps, self.history_size, self.max_line_search = int(initial_steps), int(history_size), int(
            max_line_search
        )
        self._optimizer: torch.optim.LBFGS | None = None
        self._started = False
        self._reference: float | None = None  # the objective entering the iteration (scales an unusable point's)
        #: whether the last two iterations could not move the hyper-parameters (L-BFGS restarted in between)
        self.stalled = False
        self._stalls = 0
        #: whether the iterations hold q(u) at the snapshot and re-solve it after each one (:meth:`restart`)
        self.polish = False
        #: the index in ``params`` of the tensor holding the largest gradient entry at the last :meth:`stationarity`
        self.largest_at: int | None = None
        #: the objective per datum (as :meth:`objective_value`) where the last :meth:`stationarity` was tested
        self.tested_value = -math.inf

    def _new_optimizer(self) -> torch.optim.LBFGS:
        return torch.optim.LBFGS(
            self.params, lr=1.0, max_iter=1, max_eval=1 + self.max_line_search, history_size=self.history_size,
            line_search_fn="strong_wolfe",
        )  # fmt: skip

    def _closure(self) -> Tensor:
        for p in self.params:
            p.grad = None
        try:
            loss = self.objective(solve=not self.polish)
            if torch.isfinite(loss):
                loss.backward()
                grads_finite = all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in self.params)
                if grads_finite:
                    return loss.detach()
        except (ValueError, RuntimeError):  # a factorisation that failed (PriorFactorizationError, NotPSDError)
            pass
        # an unusable point: a high value without a gradient, so that the line search shortens its step
        for p in self.params:
            p.grad = torch.zeros_like(p)
        if self._reference is None:
            raise FloatingPointError(
                "the true ELBO or its gradient is not finite at the initial hyper-parameters: check the data's "
                "scale (standardise regression targets) and the kernel's initial values"
            )
        return torch.tensor(self._reference + 1e3 * (1.0 + abs(self._reference)), dtype=torch.float64)

    def start(self) -> None:
        """``initial_steps`` CAVI steps at the initial hyper-parameters (once; :meth:`step` calls it)."""
        if not self._started:
            self.objective.advance(self.initial_steps)
            self._started = True

    def after_iteration(self) -> None:
        """Move the snapshot to :math:`q_\\theta(u)` at the new hyper-parameters (polish mode: :meth:`finish`)."""
        if self.polish:
            self.finish()
        else:
            self.objective.advance()

    def begin_iteration(self, value: float | None) -> None:
        """An external optimizer starts an iteration from a point of objective ``value`` (``None``: the next
        evaluation is the entry point, which must be usable); an unusable trial point counts as far above it."""
        self._reference = value

    def evaluate(self) -> tuple[float, list[Tensor]]:
        """The objective and its gradient at the current hyper-parameters (what an external optimizer calls: an
        unusable point gives a high value and a zero gradient, see :meth:`step`)."""
        value = float(self._closure())
        if self._reference is None:
            self._reference = value
        return value, [p.grad.detach().clone() for p in self.params]

    def objective_value(self) -> float:
        """The fit's objective per datum at the snapshot (the true ELBO plus the registered log prior densities;
        ``-inf`` where it cannot be evaluated)."""
        try:
            with torch.no_grad():
                value = -float(self.objective(solve=False))
        except (ValueError, RuntimeError):
            return -math.inf
        return value if math.isfinite(value) else -math.inf

    def step(self) -> float:
        """One L-BFGS iteration; returns the objective's value entering it as a true ELBO per datum."""
        self.start()
        if self._optimizer is None:
            self._optimizer = self._new_optimizer()
        before = [p.detach().clone() for p in self.params]
        self._reference = None  # the entry point was accepted: it must be usable
        value = self._reference = float(self._closure())  # handed to L-BFGS as its own first evaluation
        self._optimizer.step(self._closure_with_entry(value))
        moved = any(not torch.equal(b, p.detach()) for b, p in zip(before, self.params))
        self._stalls = 0 if moved else self._stalls + 1
        if not moved:  # forget the curvature pairs: the next iteration starts afresh with a short step
            self._optimizer = None
        self.stalled = self._stalls >= 2
        self.after_iteration()
        return -value

    def stationarity(self) -> float:
        r"""The largest absolute entry of :math:`\partial J/\partial\theta` at the snapshot, with :math:`q(u)`
        held there (after :meth:`finish`, :math:`q(u)` is at its optimum and this is the gradient of the true
        ELBO per datum, maximised over :math:`q(u)`: zero at a stationary point of the fit). Infinite where the
        true ELBO or its gradient is not finite. :attr:`largest_at` says which of ``params`` holds it."""
        for p in self.params:
            p.grad = None
        self.largest_at, self.tested_value = None, -math.inf
        try:
            loss = self.objective(solve=False)
            grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        except (ValueError, RuntimeError):  # a factorisation that failed
            return math.inf
        if math.isfinite(float(loss.detach())):
            self.tested_value = -float(loss.detach())
        entries = [float(g.abs().max()) if g is not None and g.numel() else 0.0 for g in grads]
        if entries:
            self.largest_at = max(range(len(entries)), key=lambda i: (not math.isfinite(entries[i]), entries[i]))
        largest = entries[self.largest_at] if entries else 0.0
        return largest if math.isfinite(largest) and math.isfinite(float(loss.detach())) else math.inf

    def reset(self) -> None:
        """L-BFGS afresh (its curvature pairs forgotten) and :math:`q(u)` re-solved at the current hyper-parameters:
        what the fit does when the objective itself changes (from a likelihood's bound to the exact one)."""
        self._optimizer, self._stalls, self.stalled = None, 0, False
        self.objective.advance()

    def restart(self) -> None:
        r"""Go on in *polish* mode: L-BFGS afresh, on the true ELBO with :math:`q(u)` held at the snapshot (an
        exact gradient), and :meth:`finish` after every iteration. Each iteration then raises the true ELBO
        maximised over :math:`q(u)`; it is slower than the nested objective but cannot stall where the envelope
        gradient of :math:`J` is inexact (:math:`q_\theta(u)` short of its optimum)."""
        self._optimizer, self._stalls, self.stalled, self.polish = None, 0, False, True

    def _closure_with_entry(self, value: float) -> Callable[[], Tensor]:
        """L-BFGS's closure, whose first call returns the entry evaluation just made (no repeated work)."""
        state = {"first": True}
        grads = [None if p.grad is None else p.grad.clone() for p in self.params]

        def closure() -> Tensor:
            if state["first"]:
                state["first"] = False
                for p, g in zip(self.params, grads):
                    p.grad = g
                return torch.tensor(value, dtype=torch.float64)
            return self._closure()

        return closure

    @torch.no_grad()
    def finish(self, max_steps: int = 100, tol: float = 1e-7) -> None:
        r""":math:`q(u)` at the final hyper-parameters, of the kind the objective used. Without true-ELBO steps:
        CAVI steps (the likelihood's closed-form constant updates held) until the augmented ELBO changes by less
        than ``tol`` (relative), at most ``max_steps``. With them: from the snapshot, natural-gradient steps on the
        true ELBO (a rejected step is halved) until it rises by less than ``tol`` (relative)."""
        objective = self.objective
        objective.restore()
        terms = objective._terms(graph=False)
        if not objective.true_steps:
            last = math.inf
            for _ in range(max_steps):
                value = float(self.cavi.update(objective.data, terms, update_constants=False)[0])
                if abs(value - last) <= tol * max(1.0, abs(value)):
                    break
                last = value
            objective.snapshot()
            return
        q = self.cavi.strategy.whitened_q(terms)
        best, rho = objective.true_elbo(terms, q), 1.0
        for _ in range(max_steps):  # natural-gradient ascent of the true ELBO in q(u), halving rejected steps
            trial = objective._true_elbo_step(terms, q, rho)
            value = objective.true_elbo(terms, trial)
            if value > best:
                gain, best, q = value - best, value, trial
                if gain <= tol * max(1.0, abs(best)):
                    break
                continue
            self.cavi.strategy.write_whitened(q, terms)
            rho /= 2
            if rho < 1 / 64:
                break
        objective.snapshot()
