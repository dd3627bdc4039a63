"""Execute every tutorial notebook in fast mode; any cell error fails the test.

Each ``tutorials/*.ipynb`` is picked up automatically. The kernel runs with ``GPYTORCH_AUGMENT_FAST=1``
(tiny data and few iterations) and ``MPLBACKEND=Agg``, in the ``tutorials/`` directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

#: the slow tier (executes every notebook): `pytest -m "not slow"` leaves it out
pytestmark = pytest.mark.slow

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")  # provides the python3 kernel

TUTORIALS = Path(__file__).resolve().parent.parent / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("*.ipynb"))
TIMEOUT = 300  # seconds per cell


def test_tutorials_exist() -> None:
    assert NOTEBOOKS, f"no notebooks found in {TUTORIALS}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_tutorial_executes(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the kernel is a subprocess: it inherits this process's environment
    monkeypatch.setenv("GPYTORCH_AUGMENT_FAST", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=TIMEOUT,
        kernel_name="python3",
        allow_errors=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    executed = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert executed and all(cell.get("execution_count") for cell in executed), "some code cells did not run"
