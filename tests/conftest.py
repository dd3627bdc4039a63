"""Test-suite configuration: float64 by default (the identity tests of docs/maths/identities.md), one torch thread
(the tensors are small: intra-op threads only add contention on shared machines), and the ``--device`` option.

``--device DEVICE`` (default ``cpu``) is what the :func:`device` fixture returns: the tests that take it put their
model, data and generators there, so ``pytest --device cuda -m device`` runs that set of core tests (CAVI, the
samplers, the likelihoods' steps, the Pólya-Gamma draws) on a GPU. Every test that takes the fixture is marked
``device`` automatically; with an unavailable CUDA device they are skipped.
"""

import pytest
import torch


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        default="cpu",
        help="the torch device of the tests that take the `device` fixture (marked `device`), e.g. cuda or cuda:1",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "device" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.device)


@pytest.fixture
def device(request: pytest.FixtureRequest) -> torch.device:
    """The ``--device`` of this run (``cpu`` unless given); skips the test if it is a CUDA device and none is
    present."""
    value = request.config.getoption("--device")
    try:
        chosen = torch.device(value)
    except RuntimeError as error:
        raise pytest.UsageError(f"--device {value!r} is not a torch device: {error}") from error
    if chosen.type == "cuda" and not torch.cuda.is_available():
        pytest.skip("--device cuda: no CUDA device")
    return chosen


@pytest.fixture(autouse=True)
def _float64_single_thread():
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    yield
    torch.set_default_dtype(dtype)
    torch.set_num_threads(threads)
