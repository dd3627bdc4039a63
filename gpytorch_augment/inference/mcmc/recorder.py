"""Preallocated storage for the kept draws of a run (the driver's bookkeeping, the same for every kernel)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["Recorder"]


class Recorder:
    """Stores what a kernel hands over for each kept iteration (:meth:`MCMCKernel.kept
    <gpytorch_augment.inference.mcmc.MCMCKernel.kept>`: named tensors with a leading chain dimension) in tensors of
    shape ``(chains, num_samples, ...)``, allocated at the first kept iteration.

    Example::

        >>> import torch
        >>> from gpytorch_augment.inference.mcmc.recorder import Recorder
        >>> rec = Recorder(num_chains=2, num_samples=3)
        >>> for k in range(3):
        ...     rec.keep({"f": torch.full((2, 5), float(k))})
        >>> rec.stacked()["f"].shape, rec.stacked()["f"][0, :, 0].tolist()
        (torch.Size([2, 3, 5]), [0.0, 1.0, 2.0])
    """

    def __init__(self, num_chains: int, num_samples: int) -> None:
        self.num_chains, self.num_samples = num_chains, num_samples
        self._store: dict[str, Tensor] = {}
        self.kept = 0

    def keep(self, values: dict[str, Tensor]) -> None:
        k = self.kept
        for name, value in values.items():
            store = self._store.get(name)
            if store is None:
                shape = (self.num_chains, self.num_samples) + tuple(value.shape[1:])
                store = self._store[name] = torch.empty(shape, dtype=value.dtype, device=value.device)
            store[:, k] = value
        self.kept += 1

    def stacked(self) -> dict[str, Tensor]:
        """The kept values, ``(chains, draws, ...)`` each."""
        return dict(self._store)
