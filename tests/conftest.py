"""Test-suite configuration: float64 by default (the identity tests of docs/maths/identities.md), one torch thread
(the tensors are small: intra-op threads only add contention on shared machines)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _float64_single_thread():
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    yield
    torch.set_default_dtype(dtype)
    torch.set_num_threads(threads)
