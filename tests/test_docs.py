"""Build the documentation site (``docs/``) with warnings as errors, and check that it is complete.

One Sphinx build (HTML, in a temporary directory, as ``make docs`` runs it) is shared by the checks: it succeeds
with no warning, every expected page is there (the user guide, the maths pages, one page per API subpackage and one
per tutorial notebook, shown with its committed outputs), and every public name of the package is documented.
Skipped when the docs extra (``pip install gpytorch-augment[docs]``: sphinx, furo, myst-nb) is not installed.
"""

from __future__ import annotations

import importlib
import posixpath
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

for _module, _package in (("sphinx", "sphinx"), ("furo", "furo"), ("myst_nb", "myst-nb")):
    pytest.importorskip(_module, reason=f"the docs build needs {_package} (pip install gpytorch-augment[docs])")

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TUTORIALS = sorted((ROOT / "tutorials").glob("*.ipynb"))
BUILD_TIMEOUT_S = 300

#: every page of the site (Sphinx document names); the tutorials are added from ``tutorials/*.ipynb``
PAGES = {
    "index",
    "guide/cavi",
    "guide/gibbs",
    "guide/scaling",
    "guide/choosing",
    "maths/index",
    "maths/binary",
    "maths/counts",
    "maths/robust",
    "maths/multiclass",
    "maths/heteroscedastic",
    "api/index",
    "api/likelihoods",
    "api/distributions",
    "api/inference",
    "api/variational",
    "api/mlls",
    "api/core",
    "api/testing",
    "api/datasets",
}
#: the modules whose ``__all__`` the API reference must cover
PUBLIC_MODULES = [
    "gpytorch_augment",
    "gpytorch_augment.likelihoods",
    "gpytorch_augment.distributions",
    "gpytorch_augment.inference",
    "gpytorch_augment.inference.gibbs",
    "gpytorch_augment.inference.diagnostics",
    "gpytorch_augment.variational",
    "gpytorch_augment.mlls",
    "gpytorch_augment.core",
    "gpytorch_augment.core.distributed",
    "gpytorch_augment.testing",
    "gpytorch_augment.datasets",
]
#: pages Sphinx writes besides the documents
GENERATED = {"genindex", "search", "py-modindex"}


def expected_pages() -> set[str]:
    return PAGES | {f"tutorials/{path.stem}" for path in TUTORIALS}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "html"
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, f"the docs build failed (warnings are errors):\n{result.stderr[-6000:]}"
    print(f"docs built in {elapsed:.1f} s")
    return out


def built_pages(site: Path) -> set[str]:
    pages = {p.relative_to(site).with_suffix("").as_posix() for p in site.rglob("*.html")}
    return {p for p in pages if not p.startswith("_")} - GENERATED


def test_every_page_is_built(site: Path) -> None:
    assert TUTORIALS, "no tutorials found"
    pages = built_pages(site)
    expected = expected_pages()
    assert pages == expected, f"missing: {sorted(expected - pages)}, unexpected: {sorted(pages - expected)}"
    assert len(pages) == len(PAGES) + len(TUTORIALS)


@pytest.mark.parametrize("notebook", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorials_show_their_committed_outputs(site: Path, notebook: Path) -> None:
    html = (site / "tutorials" / f"{notebook.stem}.html").read_text(encoding="utf-8")
    assert "cell_output" in html, f"{notebook.name} is rendered without its outputs"


@pytest.mark.parametrize("page", sorted(PAGES))
def test_no_directive_is_left_unrendered(site: Path, page: str) -> None:
    # e.g. an autodoc directive written as MyST fences, whose reST output the Markdown parser shows as text
    html = (site / f"{page}.html").read_text(encoding="utf-8")
    for marker in (".. py:", ":no-index:", ".. math::", ".. auto"):
        assert marker not in html, f"{page}: unrendered reST ({marker!r}) in the page"


def _import(path: str) -> object | None:
    """The object named by a dotted path, or ``None``."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def test_every_public_name_is_documented(site: Path) -> None:
    from sphinx.util.inventory import InventoryFile

    with open(site / "objects.inv", "rb") as stream:
        inventory = InventoryFile.load(stream, "", posixpath.join)
    documented = {
        name for role, entries in inventory.items() if role.startswith("py:") for name in entries
    }  # fmt: skip
    objects = {id(_import(name)) for name in documented if name.startswith("gpytorch_augment")}
    missing = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, types.ModuleType):
                found = obj.__name__ in documented
            elif isinstance(obj, (type, types.FunctionType)):
                found = id(obj) in objects
            else:  # constants and type aliases: documented under this module or one of its submodules
                found = any(d.startswith(module_name + ".") and d.endswith("." + name) for d in documented)
            if not found:
                missing.append(f"{module_name}.{name}")
    assert not missing, f"public names missing from the API reference: {missing}"
