r"""The registry drives the per-likelihood matrices and tables (``tests/likelihoods/registry.py``): every exported
likelihood has a case and states its table row, every primary case declares its registration fields, the cases are
found (not listed), and the README's table is the one the documentation build generates."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys

import pytest
import torch

import gpytorch_augment.likelihoods as likelihoods_module
from gpytorch_augment.likelihoods import AugmentedLikelihood, LaplaceTransformLikelihood, PairwiseLogitLikelihood
from tests.likelihoods.registry import CASES, HERE, PRIMARY, discover_cases, registration_problems

ROOT = HERE.parents[1]

#: exported likelihood classes that are not registered themselves, and why
NOT_REGISTERED = {
    AugmentedLikelihood: "the abstract protocol",
    LaplaceTransformLikelihood: "the generic class: its named instances are registered, and "
    "tests/likelihoods/test_laplace_transform.py checks it against the hand-written likelihoods",
    PairwiseLogitLikelihood: "linear observations (a comparison reads f_a - f_b), outside the pointwise protocol the "
    "suite runs; tests/likelihoods/test_pairwise.py checks CAVI and exact Gibbs against brute force",
}


def test_every_primary_case_declares_its_registration_fields():
    assert registration_problems(CASES) == []


def test_registration_problems_are_reported():
    """A class whose first case lacks the fields and a duplicate name are reported."""
    bare = dataclasses.replace(CASES[0], example_targets=None)
    problems = registration_problems([bare, dataclasses.replace(CASES[1], name=bare.name)])
    assert any("declares no example_targets" in p for p in problems), problems
    assert any("two cases are named" in p for p in problems), problems


def test_the_registry_is_found_not_listed(tmp_path):
    """Every ``cases_*.py`` module's CASES is collected, in module-name order; a module without CASES is an error."""
    modules = sorted(path.stem for path in HERE.glob("cases_*.py"))
    found = [case.name for module in modules for case in importlib.import_module(f"tests.likelihoods.{module}").CASES]
    assert [case.name for case in CASES] == found
    (tmp_path / "cases_empty.py").write_text("CASES = None\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(TypeError, match="cases_empty.py must define CASES"):
            discover_cases(tmp_path, package="")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("cases_empty", None)


def test_every_exported_likelihood_is_registered():
    exported = {
        getattr(likelihoods_module, name)
        for name in likelihoods_module.__all__
        if isinstance(getattr(likelihoods_module, name), type)
        and issubclass(getattr(likelihoods_module, name), AugmentedLikelihood)
    }
    registered = {type(case.make()) for case in CASES}
    missing = sorted(cls.__name__ for cls in exported - registered - set(NOT_REGISTERED))
    assert not missing, f"no registry case for {missing}: list it in the CASES of a tests/likelihoods/cases_*.py"


@pytest.mark.parametrize("case", PRIMARY, ids=lambda case: case.name)
def test_example_targets_are_valid_targets(case):
    likelihood = case.default_likelihood().double()
    y, kwargs = case.example_targets(8, torch.float64)
    assert y.shape[-1] == 8 and y.dtype == torch.float64
    likelihood.check_targets(y, **kwargs)


def _exported_likelihoods() -> list[type]:
    exported = [getattr(likelihoods_module, name) for name in likelihoods_module.__all__]
    return [c for c in exported if isinstance(c, type) and issubclass(c, AugmentedLikelihood)]


@pytest.mark.parametrize("cls", _exported_likelihoods(), ids=lambda cls: cls.__name__)
def test_every_exported_likelihood_states_its_table_row(cls):
    """A concrete exported likelihood states its augmentation (its row of the generated tables), and the docs/maths
    page it names documents it."""
    if cls in NOT_REGISTERED:
        return
    assert cls.augmentation, f"{cls.__name__} states no augmentation (its row of the likelihood tables)"
    if cls.maths_page:
        page = ROOT / "docs" / "maths" / f"{cls.maths_page}.md"
        assert page.exists() and cls.__name__ in page.read_text(encoding="utf-8"), (
            f"docs/maths/{cls.maths_page}.md does not document {cls.__name__}"
        )


def test_the_readme_table_is_generated_from_the_classes():
    spec = importlib.util.spec_from_file_location("likelihood_table", ROOT / "docs" / "likelihood_table.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert generator.readme_table(ROOT) == generator.table("readme", ROOT), (
        "the likelihood table of README.md is stale: run python docs/likelihood_table.py (make docs does too)"
    )
