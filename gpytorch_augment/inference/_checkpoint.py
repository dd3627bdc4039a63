"""Checkpoints of :class:`~gpytorch_augment.CAVI`: its state, and where a shuffled mini-batch fit is in its data."""

from __future__ import annotations

from typing import Any

import torch

from .._validation import check_finite_state, check_state_fits, check_state_keys
from ..core.distributed import rank
from .schedules import StepSchedule, make_schedule


class CheckpointMixin:
    """``state_dict`` / ``load_state_dict`` / ``save_checkpoint`` of :class:`~gpytorch_augment.CAVI`."""

    model: Any
    likelihood: Any
    num_steps: int
    last_step_size: float | None
    step_size: Any
    _minibatch_schedule: StepSchedule | None
    _shuffle: Any
    process_group: Any
    distributed: bool

    def state_dict(self) -> dict[str, Any]:
        """Everything a fit continues from: the model's and likelihood's state, the step count, the step-size
        schedules' state and, for a shuffled mini-batch fit (``fit(x, y, batch_size=...)``), the position in the
        current epoch's permutation and the shuffling generator's state, so that the next ``fit`` after
        :meth:`load_state_dict` visits exactly the batches an uninterrupted fit would have (plain tensors and
        numbers: ``torch.load(..., weights_only=True)`` reads it). It holds no rank-specific data, so a checkpoint
        loads on any number of processes (a ``data_loader`` fit resumes with the loader's own sampler state).

        Example::

            >>> import torch
            >>> from gpytorch_augment import CAVI, BernoulliLogitLikelihood
            >>> from gpytorch_augment.testing.models import SVGP
            >>> x = torch.linspace(-2, 2, 20, dtype=torch.float64).unsqueeze(-1)
            >>> y = (x.squeeze(-1) > 0).double()
            >>> def make():
            ...     return CAVI(SVGP(x[::5]).double(), BernoulliLogitLikelihood(), num_data=20)
            >>> whole, first = make(), make()
            >>> _ = whole.fit(x, y, batch_size=8, max_iter=5, generator=torch.Generator().manual_seed(0))
            >>> _ = first.fit(x, y, batch_size=8, max_iter=2, generator=torch.Generator().manual_seed(0))
            >>> second = make()
            >>> second.load_state_dict(first.state_dict())
            >>> _ = second.fit(x, y, batch_size=8, max_iter=3, generator=torch.Generator())
            >>> all(torch.equal(a, b) for a, b in zip(whole.model.parameters(), second.model.parameters()))
            True
        """
        schedules = {}
        for name, schedule in (("step_size", self.step_size), ("minibatch_schedule", self._minibatch_schedule)):
            if isinstance(schedule, StepSchedule):
                schedules[name] = schedule.state_dict()
        return {
            "model": self.model.state_dict(),
            "likelihood": self.likelihood.state_dict(),
            "num_steps": self.num_steps,
            "last_step_size": self.last_step_size,
            "schedules": schedules,
            "shuffle": self._shuffle.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (the schedules must be of the same kinds).

        A state missing ``"model"``, ``"likelihood"`` or ``"num_steps"``, holding NaN or infinite values (a
        checkpoint of a diverged fit), or saved from a model or likelihood of another kind or size (other inducing
        points, latents, classes) raises ``ValueError`` before anything is loaded."""
        check_state_keys("state", state, ("model", "likelihood", "num_steps"))
        check_finite_state("state", {k: state[k] for k in ("model", "likelihood")})
        check_state_fits("state['model']", self.model, state["model"], "model")
        check_state_fits("state['likelihood']", self.likelihood, state["likelihood"], "likelihood")
        self.model.load_state_dict(state["model"])
        self.likelihood.load_state_dict(state["likelihood"])
        self.num_steps = int(state["num_steps"])
        self.last_step_size = state.get("last_step_size")
        if "shuffle" in state:
            self._shuffle.load_state_dict(state["shuffle"])
        for name, schedule_state in state.get("schedules", {}).items():
            if name == "minibatch_schedule" and self._minibatch_schedule is None:
                self._minibatch_schedule = make_schedule("robbins-monro")
            schedule = self.step_size if name == "step_size" else self._minibatch_schedule
            if not isinstance(schedule, StepSchedule):
                raise ValueError(f"the checkpoint holds a {name} schedule state but this CAVI has {schedule!r}")
            schedule.load_state_dict(schedule_state)

    def save_checkpoint(self, path: Any) -> None:
        """``torch.save(self.state_dict(), path)`` on rank 0 only (every rank holds the same state), followed by a
        barrier with sharded data so that no rank reads the file before it is written."""
        if rank(self.process_group) == 0:
            torch.save(self.state_dict(), path)
        if self.distributed:
            import torch.distributed as dist

            dist.barrier(group=self.process_group)
