"""The train/eval modes of the modules a fit touches."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def training_mode(*modules: torch.nn.Module) -> Iterator[None]:
    """Put ``modules`` in training mode inside, and give each back the mode it had (also on an error)."""
    modes = [m.training for m in modules]
    try:
        for m in modules:
            m.train()
        yield
    finally:
        for m, mode in zip(modules, modes):
            m.train(mode)
