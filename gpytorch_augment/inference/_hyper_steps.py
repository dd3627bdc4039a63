"""The hyper-parameter steps of :class:`~gpytorch_augment.CAVI`: torch-optimizer steps on its ``hyper_objective``
with :math:`q(u)` held fixed (fused with the CAVI step's prior terms where possible), gradients reduced across
processes when the data are sharded."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from gpytorch.mlls import MarginalLogLikelihood
from gpytorch.variational import IndependentMultitaskVariationalStrategy, UnwhitenedVariationalStrategy
from torch import Tensor

from ..core import ObservedData, PriorTerms, WhitenedGaussian
from ..core.distributed import all_reduce_gradients, all_reduce_sum
from ..mlls.augmented_elbo import AugmentedELBO


class HyperStepMixin:
    """Hyper-parameter steps of :class:`~gpytorch_augment.CAVI` (which provides ``model``, ``likelihood``,
    ``strategy``, ``num_data``, ``process_group``, ``distributed``, ``marginal_distribution``, ``_data`` and
    ``_mll``). The objective receives the batch as checked data (an :class:`~gpytorch_augment.core.ObservedData`:
    ``AugmentedELBO`` and the likelihood's ``expected_log_prob`` / ``log_marginal`` take it without checking it
    again)."""

    def _can_fuse(self) -> bool:
        # GPyTorch's unwhitened KL depends on the order of calls (it caches the prior's Cholesky factor between
        # calls): take the plain path;
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
        self, data: ObservedData, graph_terms: PriorTerms, q: WhitenedGaussian, optimizer: torch.optim.Optimizer
    ) -> None:
        r"""One optimizer step on :math:`-`AugmentedELBO of the batch, with :math:`q(f)` built from the prior terms
        of the CAVI step (still attached to the hyper-parameters) and the new, fixed whitened :math:`q(v)`: the same
        value and gradient as ``-mll(model(x), y)`` without a second kernel evaluation and Cholesky."""
        f_dist = self.marginal_distribution(graph_terms, q, data.x.dtype)
        # q(v) is fixed and p(v) = N(0, I): the whitened KL carries no gradient, so hand over its value instead of
        # letting GPyTorch rebuild q(u) from its parameters to evaluate it
        kl = q.kl().to(data.x.dtype)
        if isinstance(self.model.variational_strategy, IndependentMultitaskVariationalStrategy):
            kl = kl.sum(-1)  # as the wrapper's kl_divergence(): summed over the latents
        optimizer.zero_grad()
        with self.frozen_q():
            if data.num_data > 0:  # an empty shard contributes no gradient
                loss = -self.hyper_objective(f_dist, data, kl_divergence=kl).sum()
                loss.backward()
        self._reduce_gradients(optimizer, data.num_data, self._global_batch_size)
        optimizer.step()

    @contextmanager
    def frozen_q(self) -> Iterator[None]:
        """A context in which :math:`q(u)`'s parameters take no gradient, while a hyper-parameter loss is
        back-propagated (q(u) belongs to CAVI; GPyTorch's forward and KL term would otherwise differentiate through
        them, for nothing)."""
        variational = [p for p in self.model.variational_parameters() if p.requires_grad]
        try:
            for p in variational:
                p.requires_grad_(False)
            yield
        finally:
            for p in variational:
                p.requires_grad_(True)

    def hyper_step(
        self,
        x: Tensor | ObservedData,
        y: Tensor | None,
        optimizer: torch.optim.Optimizer,
        steps: int = 1,
        **kwargs: Any,
    ) -> float:
        r"""``steps`` optimizer steps on :math:`-`:attr:`hyper_objective` (default
        :class:`~gpytorch_augment.AugmentedELBO`) of the batch ``(x, y)`` (checked first, with the per-datum keyword
        data; or checked data from ``check_data`` with ``y=None``, not checked again) (kernel, mean, likelihood
        constants, inducing inputs: whatever ``optimizer`` holds), with :math:`q(u)` fixed. Returns the last loss
        (the negative objective per datum, a mini-batch estimate)."""
        return self._hyper_steps(self._data(x, y, kwargs, "CAVI.hyper_step"), optimizer, steps)

    def _hyper_steps(self, data: ObservedData, optimizer: torch.optim.Optimizer, steps: int = 1) -> float:
        """:meth:`hyper_step` on checked ``data``."""
        mll = self.hyper_objective
        loss = math.nan
        local = data.num_data
        total = local
        if self.distributed:
            count = torch.tensor([float(local)], dtype=torch.float64, device=data.y.device)
            total = int(all_reduce_sum([count], self.process_group)[0].item())
        for _ in range(steps):
            optimizer.zero_grad()
            with self.frozen_q():
                if local > 0:
                    value = -mll(self.model(data.x), data).sum()
                else:
                    value = torch.zeros((), device=data.y.device)
                if value.requires_grad:
                    value.backward()
            self._reduce_gradients(optimizer, local, total)
            optimizer.step()
            loss = float(value.detach())
        return loss

    def _reduce_gradients(self, optimizer: torch.optim.Optimizer, local: int, total: int | None) -> None:
        r"""With sharded data, every rank's gradient becomes :math:`\sum_r \tfrac{|\mathcal B_r|}{|\mathcal B|}g_r`,
        the gradient of the objective of the global batch (the per-datum mean of each rank's objective, weighted by
        its share of the batch)."""
        if self.distributed and total:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            all_reduce_gradients(params, local / total, self.process_group)
