"""Build the documentation site (``docs/``) with warnings as errors, and check that it is complete and stands alone.

One Sphinx build (HTML, in a temporary directory, as ``make docs`` runs it) is shared by the checks: it succeeds
with no warning, every expected page is there (the user guide, the maths pages, one page per API subpackage and one
per tutorial notebook, shown with its committed outputs), and every public name of the package is documented.
Those checks are skipped when the docs extra (``pip install gpytorch-augment[docs]``: sphinx, furo, myst-nb) is not
installed. The checks of the sources need no Sphinx: no text cites a file the repository does not hold, the Python
snippets of the pages in :data:`EXECUTED_PAGES` run, and the README's example and layout say what the code does.
"""

from __future__ import annotations

import ast
import importlib
import json
import posixpath
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest


def _require_sphinx() -> None:
    for module, package in (("sphinx", "sphinx"), ("furo", "furo"), ("myst_nb", "myst-nb")):
        pytest.importorskip(module, reason=f"the docs build needs {package} (pip install gpytorch-augment[docs])")


ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gpytorch_augment"
DOCS = ROOT / "docs"
TUTORIALS = sorted((ROOT / "tutorials").glob("*.ipynb"))
BUILD_TIMEOUT_S = 300

#: every page of the site (Sphinx document names); the tutorials are added from ``tutorials/*.ipynb``
PAGES = {
    "index",
    "guide/cavi",
    "guide/gibbs",
    "guide/scaling",
    "guide/gpu",
    "guide/choosing",
    "guide/from_gpytorch",
    "guide/writing_a_likelihood",
    "maths/index",
    "maths/engines",
    "maths/identities",
    "maths/binary",
    "maths/counts",
    "maths/robust",
    "maths/multiclass",
    "maths/ordinal",
    "maths/heteroscedastic",
    "maths/generic",
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
    "gpytorch_augment.inference.hmc",
    "gpytorch_augment.inference.mcmc",
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
    _require_sphinx()
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


@pytest.mark.slow  # the Sphinx build
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


# ============================================================================================ the sources, no Sphinx
#: the texts a user reads: the package (docstrings, comments), the docs, the tests, the tutorials, the READMEs
SOURCE_GLOBS = (
    "gpytorch_augment/**/*.py",
    "docs/**/*.md",
    "docs/**/*.rst",
    "docs/conf.py",
    "tests/**/*.py",
    "tutorials/*.ipynb",
    "README.md",
    "CHANGELOG.md",
    "benchmarks/README.md",
)
#: files whose citations their owners fix in another change (listed here so that the check runs on everything else)
PENDING_CITATIONS: set[str] = set()
#: the development notes of the project's authors: not shipped, so never to be cited
UNSHIPPED = ("augmentations.md", "gpytorch-integration.md", "design.md")
_MD_NAME = re.compile(r"[\w./-]*\w\.md\b")
#: a section sign with a number, e.g. "§12 (a)"; allowed only beside a year, i.e. in the citation of a paper
_SECTION = re.compile(r"§\s*\d")
_YEAR = re.compile(r"\b(19|20)\d\d\b")


def _source_texts() -> dict[str, str]:
    """The text of every source file (of a notebook: its cells' sources, outputs excluded), by repository path."""
    texts = {}
    for pattern in SOURCE_GLOBS:
        for path in ROOT.glob(pattern):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("docs/tutorials/") or "/_build/" in rel:
                continue  # docs/tutorials is a link to tutorials/
            text = path.read_text(encoding="utf-8")
            if path.suffix == ".ipynb":
                text = "\n".join("".join(cell["source"]) for cell in json.loads(text)["cells"])
            texts[rel] = text
    return texts


def _repository_file_names() -> set[str]:
    names = set()
    for path in ROOT.rglob("*"):
        if path.is_file() and ".git" not in path.parts:
            names.add(path.name)
    return names


def citation_problems(texts: dict[str, str], file_names: set[str]) -> list[str]:
    """Every line of ``texts`` that cites a file the repository does not hold, a section of such a file (a bare
    "§n" with no paper beside it), or a thesis without naming it."""
    problems = []
    for rel, text in sorted(texts.items()):
        if rel in PENDING_CITATIONS or rel == "tests/test_docs.py":
            continue
        names_thesis = "Galy-Fajou" in text
        for number, line in enumerate(text.splitlines(), 1):
            where = f"{rel}:{number}: {line.strip()[:120]}"
            for match in _MD_NAME.finditer(line):
                name, quoted = match.group(0), line[match.start() - 1 : match.start()] in ("'", '"')
                if name.endswith(UNSHIPPED) or (name.rsplit("/", 1)[-1] not in file_names and not quoted):
                    problems.append(f"{where}  (cites {name}, not in the repository)")
            if _SECTION.search(line) and not _YEAR.search(line):
                problems.append(f"{where}  (a section number with no paper named beside it)")
            if re.search(r"\bthesis\b", line, re.IGNORECASE) and not names_thesis:
                problems.append(f"{where}  (a thesis, unnamed: write Galy-Fajou's thesis (2023))")
    return problems


#: control characters a Python string escape leaves in a text (``"\\theta"`` written as ``"\theta"``: a tab)
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")


def test_no_page_holds_a_control_character() -> None:
    """A tab or another control character in a Markdown or reST page or a notebook cell is an escape gone wrong
    (``\\theta``)."""
    problems = [f"{rel}:{number}: {line.strip()[:80]!r}" for rel, text in _source_texts().items()
                if rel.endswith((".md", ".rst", ".ipynb")) for number, line in enumerate(text.splitlines(), 1)
                if _CONTROL.search(line)]  # fmt: skip
    assert not problems, problems


def test_no_docstring_holds_a_control_character() -> None:
    """The same for the package's docstrings (``"\\varepsilon"`` in a plain string is a vertical tab)."""
    problems = []
    for path in sorted((ROOT / "gpytorch_augment").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False) or ""
                if _CONTROL.search(doc.replace("\n", "")):
                    problems.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}")
    assert not problems, problems


def test_no_text_cites_a_file_outside_the_repository() -> None:
    problems = citation_problems(_source_texts(), _repository_file_names())
    assert not problems, "cite the maths pages (docs/maths/*.md) or the papers instead:\n" + "\n".join(problems)


def test_the_citation_check_can_fail() -> None:
    names = {"binary.md", "README.md"}
    bad = {
        "a.py": "see ``augmentations.md`` §3\n(design.md)",
        "b.md": "the rule of §12 (a) holds",
        "c.md": "as the thesis shows",
        "d.py": "see notes.md",
    }
    good = {"e.py": "see docs/maths/binary.md; Hoffman & Gelman 2014, §3.2", "f.md": "Galy-Fajou's thesis, ch. 8"}
    assert len(citation_problems(bad, names)) == 6
    assert citation_problems(good, names) == []


# ============================================================================================ snippets that run
#: pages whose every ```python block is executed, in order, in one namespace per page
EXECUTED_PAGES = ["guide/gibbs", "guide/from_gpytorch", "guide/writing_a_likelihood"]
#: shorter runs for the test (as the tutorials' fast mode): text of a snippet -> what the test runs instead
FAST_SUBSTITUTIONS = {
    "sample(100, warmup=100,": "sample(20, warmup=20,",
    "sample(200, warmup=100,": "sample(20, warmup=20,",
}
_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_snippets(page: str) -> list[str]:
    return _PYTHON_BLOCK.findall((DOCS / f"{page}.md").read_text(encoding="utf-8"))


def fast(code: str) -> str:
    for text, replacement in FAST_SUBSTITUTIONS.items():
        code = code.replace(text, replacement)
    return code


@pytest.mark.slow  # executes the guides' snippets
@pytest.mark.parametrize("page", EXECUTED_PAGES)
def test_the_snippets_of_the_page_run(page: str) -> None:
    import torch

    snippets = python_snippets(page)
    assert snippets, f"{page}: no python snippet found"
    namespace: dict[str, object] = {"__name__": f"docs_{page.replace('/', '_')}"}
    dtype = torch.get_default_dtype()
    try:
        torch.manual_seed(0)
        for number, code in enumerate(snippets, 1):
            try:
                exec(compile(fast(code), f"docs/{page}.md, snippet {number}", "exec"), namespace)  # noqa: S102
            except Exception as error:  # noqa: BLE001 -- report which snippet failed
                raise AssertionError(f"docs/{page}.md, snippet {number} failed: {error!r}\n{code}") from error
    finally:
        torch.set_default_dtype(dtype)


# ========================================================================================= the README and the API table
def _first_python_block(path: Path) -> str:
    return _PYTHON_BLOCK.findall(path.read_text(encoding="utf-8"))[0]


@pytest.mark.parametrize("path", ["README.md", "docs/index.md"])
def test_the_first_example_predicts_without_autograd_and_states_the_labels(path: str) -> None:
    import torch

    from gpytorch_augment import BernoulliLogitLikelihood

    code = _first_python_block(ROOT / path)
    assert "torch.no_grad()" in code, f"{path}: the first example's prediction carries a grad_fn"
    BernoulliLogitLikelihood().check_targets(torch.tensor([-1.0, 1.0]))  # accepted: so the example must say so
    assert "{-1, 1}" in code and "{0, 1}" in code, f"{path}: the labels comment must name both conventions"


def test_the_readme_layout_shows_every_package_folder() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    package = ROOT / "gpytorch_augment"
    folders = sorted(p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    missing = [name for name in folders if f"{name}/" not in layout]
    assert not missing, f"README's Layout lacks {missing}"


def test_the_readme_first_screen_links_the_gpytorch_guide() -> None:
    first_screen = "\n".join((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:40])
    assert "docs/guide/from_gpytorch.md" in first_screen


def test_the_api_table_lists_every_top_level_name() -> None:
    import gpytorch_augment

    table = (DOCS / "api" / "index.rst").read_text(encoding="utf-8")
    assert "``gpytorch_augment.likelihoods.__all__``" in table  # the likelihoods' export list, named once
    listed = set(gpytorch_augment.__all__) - set(gpytorch_augment.likelihoods.__all__)
    missing = [name for name in sorted(listed) if f"``{name}``" not in table]
    assert not missing, f"the top-level table of docs/api/index.rst lacks {missing}"


def test_the_gibbs_guide_uses_the_exported_prior() -> None:
    text = (DOCS / "guide" / "gibbs.md").read_text(encoding="utf-8")
    assert "class GPPrior" not in text and "GPPrior(gpytorch.means" in text
    assert "cat([samples, sampler.resume" not in text and "returns **all** draws" in text


# ============================================================================================ rules, not history
#: narration of the project's history, which belongs in CHANGELOG.md and benchmarks/README.md
_HISTORY = re.compile(r"\bissue \d+|\bprototype\b|kept for (callers|them)|former private name|^\W*Moved:", re.I | re.M)
#: files whose owners rewrite them in another change
PENDING_HISTORY: set[str] = set()


def test_the_code_states_rules_not_history() -> None:
    found = []
    for pattern in ("gpytorch_augment/**/*.py", "tests/**/*.py"):
        for path in ROOT.glob(pattern):
            rel = path.relative_to(ROOT).as_posix()
            if rel in PENDING_HISTORY or rel == "tests/test_docs.py":
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if _HISTORY.search(line):
                    found.append(f"{rel}:{number}: {line.strip()[:120]}")
    assert not found, "history in the code (move it to CHANGELOG.md):\n" + "\n".join(found)


def test_no_compatibility_shims() -> None:
    import importlib.util

    assert importlib.util.find_spec("gpytorch_augment.likelihoods.heteroscedastic") is None
    assert not (ROOT / "tests" / "likelihoods" / "case.py").exists()
    assert (ROOT / "CHANGELOG.md").is_file()
    assert not (PACKAGE / "inference" / "_deprecated.py").exists()
    modules = [p for p in PACKAGE.rglob("*.py") if re.search(r"^def __getattr__\(", p.read_text("utf-8"), re.M)]
    assert not modules, f"module __getattr__ (an alias shim) in {modules}"


#: a timing figure: a duration per unit or a speed ratio (they go stale; benchmarks/README.md keeps them)
_TIMING = re.compile(r"\d\s?(µs|ms)\b|\d(\.\d+)?\s?[x×]\s(faster|slower)|\d+\s?-\s?\d+\s?[x×]\s(faster|slower)")


def test_no_benchmark_figures_in_the_package() -> None:
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}" for p in PACKAGE.rglob("*.py")
             for n, line in enumerate(p.read_text("utf-8").splitlines(), 1) if _TIMING.search(line)]  # fmt: skip
    assert not found, "timing figures in the package (move them to benchmarks/README.md):\n" + "\n".join(found)


@pytest.mark.parametrize("name", ["CAVIVariationalStrategy", "UnwhitenedCAVIVariationalStrategy"])
def test_the_strategies_document_every_parameter(name: str) -> None:
    import inspect

    import gpytorch_augment

    cls = getattr(gpytorch_augment, name)
    parameters = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    missing = [p for p in parameters if f":param {p}:" not in (cls.__doc__ or "")]
    assert parameters and not missing, f"{name} does not document {missing}"


def test_the_likelihood_pages_show_the_predictive_from_phi() -> None:
    """Writing a likelihood and tutorial 10 say that a likelihood built from φ predicts without
    ``target_distribution``: class probabilities with ``num_classes``, intervals with ``real_valued_targets``."""
    page = (DOCS / "guide" / "writing_a_likelihood.md").read_text(encoding="utf-8")
    assert "likelihood.predictive_interval(model(x_new)" in "".join(python_snippets("guide/writing_a_likelihood"))
    notebook = json.loads((ROOT / "tutorials" / "10_your_own_likelihood.ipynb").read_text(encoding="utf-8"))
    tutorial = "\n".join("".join(cell["source"]) for cell in notebook["cells"])
    for text in (page, tutorial):
        assert "num_classes" in text and "predictive_interval" in text and ".probs" in text


def test_one_version_set_in_one_place() -> None:
    """``gpytorch_augment.__version__`` is the version: setup.cfg reads it, the CHANGELOG's newest entry names it,
    and no docstring calls the class it documents a deprecated alias of itself."""
    import gpytorch_augment
    from gpytorch_augment.inference.mcmc import PosteriorSamples

    setup = (ROOT / "setup.cfg").read_text(encoding="utf-8")
    assert re.search(r"^version = attr: gpytorch_augment.__version__$", setup, re.MULTILINE), setup[:200]
    newest = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.MULTILINE)
    assert newest is not None and newest.group(1) == gpytorch_augment.__version__
    assert "``PosteriorSamples`` is a deprecated alias" not in (PosteriorSamples.__doc__ or "")


def test_where_users_start_they_read_when_to_set_threads_and_the_one_way_to_class_probabilities() -> None:
    """The README and the GPyTorch guide say when to call ``torch.set_num_threads`` and name
    ``likelihood(model(x)).probs`` as the way to class probabilities, with labels as class indices, not one-hot."""
    for path in (ROOT / "README.md", DOCS / "guide" / "from_gpytorch.md"):
        text = " ".join(path.read_text(encoding="utf-8").split())
        assert "torch.set_num_threads(1)" in text and "shared with other jobs" in text, path
        assert "likelihood(model(x)).probs" in text and "the one way" in text and "one-hot" in text, path


def test_the_gpu_wording_matches_the_record() -> None:
    """The GPU guide puts the sampler speed-ups under their own problem (N = 100), says the one-call figure is the
    stochastic protocol and counts the host synchronisations of a Gibbs sweep; the README claims no round-trip-free
    sweep."""
    gpu = (DOCS / "guide" / "gpu.md").read_text(encoding="utf-8")
    cavi_table = gpu.split("| CAVI, 10⁶ points", 1)[1].split("\n\n", 1)[0]
    assert "Sampler" not in cavi_table and "stochastic protocol" in cavi_table
    assert "| samplers, N = 100, exact GP" in gpu and "about 24 host synchronisations" in gpu
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "no host round trip" not in readme and "24 times" in readme
