"""Where the chains stand after a transition: the state a run can be continued from, whatever its kernel."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from ...likelihoods.augmented_likelihood import AuxDict

__all__ = ["ChainState"]


@dataclass
class ChainState:
    r"""Where the chains stand after a transition: enough to continue them exactly (a plain container: the driver
    :class:`~gpytorch_augment.inference.mcmc.MCMC` writes it, any kernel reads it back as ``init``).

    :ivar f: latent values, ``(chains, N)`` (``(chains, T, N)`` for ``T`` latents).
    :ivar aux: the last :math:`\Omega` draw, one tensor per auxiliary variable (empty for a kernel without one,
        e.g. HMC).
    :ivar u: inducing values ``(chains, M)`` / ``(chains, T, M)`` of the sparse model, else ``None``.
    :ivar rng_state: state of the sampler's ``torch.Generator`` after the sweep (``None`` if unknown).
    :ivar num_sweeps: transitions run so far (warm-up included).
    :ivar hyper: the likelihood's sampled hyper-parameters after the sweep (empty unless the likelihood
        implements ``sample_hyperparameters``); restored into the likelihood when the state is used as ``init``.
    :ivar step_size: the per-chain leapfrog step sizes ``(chains,)`` of an
        :class:`~gpytorch_augment.HMCSampler` run (frozen after its warm-up; ``None`` for kernels without one). A run
        started from this state continues with them; a run started without it adapts from ``initial_step_size``.
    :ivar trajectory_length: the ChEES trajectory length of an HMC run (``None`` for other trajectories/kernels).
    :ivar scale: the per-coordinate scale a kernel adapted in warm-up where it is not the step size alone (the HMC
        move of sampled hyper-parameters: ``(P,)``), else ``None``.
    :ivar coordinates: the kernel's own coordinates of the chains where they are not ``f`` itself (HMC: the
        preconditioned ``z``, ``(groups, chains, n)``), so that a continued run starts from the very same state
        rather than from ``f`` mapped back (which rounds). A kernel uses them only where they map exactly to ``f``
        under its current coordinates; otherwise (another preconditioner, an edited ``f``) it starts from ``f``.
    :ivar tuning: other settings a kernel adapted in warm-up, by name, shared by the chains (the surrogate-data move
        of sampled hyper-parameters: ``surrogate_noise`` ``(T, N)`` and ``surrogate_width`` ``()``); a kernel reads
        those it knows whose shapes fit, and adapts or recomputes the others.

    Example::

        >>> import torch
        >>> from gpytorch_augment.inference.mcmc import ChainState
        >>> state = ChainState(f=torch.zeros(2, 5), num_sweeps=10)
        >>> ChainState.from_state_dict(state.state_dict()).num_sweeps
        10
    """

    f: Tensor
    aux: AuxDict = field(default_factory=dict)
    u: Tensor | None = None
    rng_state: Tensor | None = None
    num_sweeps: int = 0
    hyper: dict[str, Tensor] = field(default_factory=dict)
    step_size: Tensor | None = None
    trajectory_length: float | None = None
    coordinates: Tensor | None = None
    scale: Tensor | None = None
    tuning: dict[str, Tensor] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        return {
            "f": self.f,
            "aux": dict(self.aux),
            "u": self.u,
            "rng_state": self.rng_state,
            "num_sweeps": self.num_sweeps,
            "hyper": dict(self.hyper),
            "step_size": self.step_size,
            "trajectory_length": self.trajectory_length,
            "coordinates": self.coordinates,
            "scale": self.scale,
            "tuning": dict(self.tuning),
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> ChainState:
        return cls(
            f=state["f"],
            aux=dict(state.get("aux") or {}),
            u=state.get("u"),
            rng_state=state.get("rng_state"),
            num_sweeps=int(state.get("num_sweeps", 0)),
            hyper=dict(state.get("hyper") or {}),
            step_size=state.get("step_size"),
            trajectory_length=state.get("trajectory_length"),
            coordinates=state.get("coordinates"),
            scale=state.get("scale"),
            tuning=dict(state.get("tuning") or {}),
        )
