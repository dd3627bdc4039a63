"""Test-suite configuration: float64 by default (the identity tests of augmentations.md §12)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)
