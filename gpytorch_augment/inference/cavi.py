r"""Coordinate-ascent variational inference for augmented GP models, as a torch-optimizer-like driver."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from gpytorch.variational import IndependentMultitaskVariationalStrategy
from torch import Tensor

from .._validation import check_inputs_targets
from ..likelihoods.augmented_likelihood import AugmentedLikelihood
from ..mlls.augmented_elbo import AugmentedELBO
from ..variational.cavi_variational_strategy import _CAVIMixin

StepSize = float | Callable[[int], float]


@dataclass
class CAVITrace:
    """What :meth:`CAVI.fit` records: one entry per CAVI step."""

    elbo: list[float] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    converged: bool = False

    @property
    def num_steps(self) -> int:
        return len(self.elbo)


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


class CAVI:
    r"""Closed-form coordinate ascent on the augmented ELBO.

    One :meth:`step` on a batch :math:`\mathcal B` of the data

    1. computes the marginals :math:`q(f_i) = \mathcal N(m_i, s_i)` of the current :math:`q(u)`;
    2. sets every :math:`q(\Omega_i)` to its optimum (the *local* step) and stores it as ``likelihood.q_aux``;
    3. applies the likelihood's closed-form hyper-parameter updates, if any;
    4. moves :math:`q(u)` to the optimum for :math:`(\tfrac{N}{|\mathcal B|}\bar h, \tfrac{N}{|\mathcal B|}\bar\lambda)`
       by a natural-gradient step of size :math:`\rho_t` (the *global* step).

    With the full data and :math:`\rho = 1` this is exact coordinate ascent: the augmented ELBO never decreases.

    :param model: an ``ApproximateGP`` whose strategy is a :class:`~gpytorch_augment.CAVIVariationalStrategy`
        (or its unwhitened sibling, or a batched one inside ``IndependentMultitaskVariationalStrategy``).
    :param likelihood: an :class:`~gpytorch_augment.likelihoods.AugmentedLikelihood`.
    :param num_data: the total number of training points :math:`N`.
    :param step_size: :math:`\rho`, a constant in (0, 1] or a callable ``t -> rho_t`` (``t`` counts from 0).

    Example::

        >>> cavi = CAVI(model, likelihood, num_data=y.numel())
        >>> trace = cavi.fit(x, y)                 # full-batch CAVI to convergence
        >>> trace.elbo[-1]                          # augmented ELBO per datum
    """

    def __init__(self, model: Any, likelihood: AugmentedLikelihood, num_data: int, step_size: StepSize = 1.0) -> None:
        if not isinstance(likelihood, AugmentedLikelihood):
            raise TypeError(f"CAVI needs an AugmentedLikelihood, got {type(likelihood).__name__}")
        if int(num_data) <= 0:
            raise ValueError(f"num_data must be a positive integer, got {num_data}")
        self.model = model
        self.likelihood = likelihood
        self.num_data = int(num_data)
        self.step_size = step_size
        self.strategy = _cavi_strategy(model)
        self.num_steps = 0

    def _rho(self) -> float:
        rho = self.step_size(self.num_steps) if callable(self.step_size) else float(self.step_size)
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

    @torch.no_grad()
    def step(self, x: Tensor, y: Tensor, **kwargs: Any) -> Tensor:
        r"""One local + global update on the batch ``(x, y)``.

        Returns the augmented ELBO per datum, :math:`\big(\tfrac{N}{|\mathcal B|}\sum_{i\in\mathcal B}\ell_i^*
        - \mathrm{KL}(q(u)\Vert p(u))\big)/N`, of :math:`q(u)` as it was on entry (an unbiased estimate of the
        full-data value for a mini-batch; exact for the full batch).
        """
        self._check_inputs(x, y)
        y = self.likelihood.check_targets(y, **kwargs)
        strategy = self.strategy
        terms = strategy.cavi_terms(x)
        q = strategy.whitened_q(terms)
        mean, var = strategy.marginals(terms, q)
        dtype = x.dtype
        f_mean, f_var = self._to_likelihood_layout(mean).to(dtype), self._to_likelihood_layout(var).to(dtype)
        q_aux = self.likelihood.aux_posterior(y, f_mean, f_var)
        scale = self.num_data / y.shape[-1]
        elbo = (scale * self.likelihood.elbo_terms(y, q_aux, f_mean, f_var).sum(-1) - strategy.kl_whitened(q).sum().to(dtype)) / self.num_data
        self.likelihood.update_hyperparameters(y, q_aux, f_mean, f_var)
        h, lam = self.likelihood.expected_potential_and_precision(y, q_aux, f_mean, f_var)
        strategy.cavi_update(x, scale * h, scale * lam, step=self._rho(), terms=terms)
        self.likelihood.q_aux = q_aux
        self.num_steps += 1
        return elbo

    @torch.no_grad()
    def elbo(self, x: Tensor, y: Tensor, **kwargs: Any) -> Tensor:
        """The full-data augmented ELBO per datum of the current :math:`q(u)` (``x, y`` = all the data)."""
        self._check_inputs(x, y)
        y = self.likelihood.check_targets(y, **kwargs)
        terms = self.strategy.cavi_terms(x)
        q = self.strategy.whitened_q(terms)
        mean, var = self.strategy.marginals(terms, q)
        f_mean, f_var = self._to_likelihood_layout(mean).to(x.dtype), self._to_likelihood_layout(var).to(x.dtype)
        ell = self.likelihood.collapsed_bound(y, f_mean, f_var).sum(-1)
        return (ell - self.strategy.kl_whitened(q).sum().to(x.dtype)) / y.shape[-1]

    def fit(
        self,
        x: Tensor,
        y: Tensor,
        max_iter: int = 100,
        tol: float = 1e-8,
        hyper_optimizer: torch.optim.Optimizer | None = None,
        hyper_steps: int = 1,
        callback: Callable[[int, float], Any] | None = None,
        **kwargs: Any,
    ) -> CAVITrace:
        r"""Full-batch CAVI until the relative change of the augmented ELBO falls below ``tol``.

        :param hyper_optimizer: optional torch optimizer over hyper-parameters (kernel, mean, likelihood
            constants, inducing inputs); after each CAVI step it takes ``hyper_steps`` steps on
            ``-AugmentedELBO``. The variational parameters must not be in it.
        :param callback: called as ``callback(t, elbo)`` after every step.
        :returns: a :class:`CAVITrace` with the ELBO (per datum, of the state entering each step) and the
            elapsed wall time after each step.
        """
        trace = CAVITrace()
        mll = AugmentedELBO(self.likelihood, self.model, self.num_data) if hyper_optimizer is not None else None
        start = time.perf_counter()
        previous = -math.inf
        for t in range(max_iter):
            value = float(self.step(x, y, **kwargs))
            if mll is not None:
                for _ in range(hyper_steps):
                    hyper_optimizer.zero_grad()
                    loss = -mll(self.model(x), y, **kwargs)
                    loss.backward()
                    hyper_optimizer.step()
            trace.elbo.append(value)
            trace.time.append(time.perf_counter() - start)
            if callback is not None:
                callback(t, value)
            if not math.isfinite(value):
                raise FloatingPointError(f"augmented ELBO became {value} at step {t}")
            if abs(value - previous) <= tol * max(1.0, abs(value)):
                trace.converged = True
                break
            previous = value
        return trace
