r"""The registry drives the per-likelihood matrices and tables (``tests/likelihoods/registry.py``): every exported
likelihood has a case, every primary case declares its registration fields, and the README and docs tables are
the ones the registry generates."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import gpytorch_augment.likelihoods as likelihoods_module
from gpytorch_augment.likelihoods import AugmentedLikelihood, LaplaceTransformLikelihood, PairwiseLogitLikelihood
from tests.likelihoods.registry import CASES, PRIMARY, TABLES, likelihood_table, registration_problems, table_in

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
    """A class whose first case lacks the fields, a duplicate name and a variant with a table row are reported."""
    bare = dataclasses.replace(CASES[0], example_targets=None, augmentation="", maths_page="")
    variant = dataclasses.replace(CASES[0], name="variant")
    problems = registration_problems([bare, variant, dataclasses.replace(CASES[1], name=bare.name)])
    assert any("declares no example_targets, augmentation, maths_page" in p for p in problems), problems
    assert any("further case" in p and "variant" in p for p in problems), problems
    assert any("two cases are named" in p for p in problems), problems


def test_every_exported_likelihood_is_registered():
    exported = {
        getattr(likelihoods_module, name)
        for name in likelihoods_module.__all__
        if isinstance(getattr(likelihoods_module, name), type)
        and issubclass(getattr(likelihoods_module, name), AugmentedLikelihood)
    }
    registered = {type(case.make()) for case in CASES}
    missing = sorted(cls.__name__ for cls in exported - registered - set(NOT_REGISTERED))
    assert not missing, f"no registry case for {missing}: append one to tests/likelihoods/registry.py"


@pytest.mark.parametrize("case", PRIMARY, ids=lambda case: case.name)
def test_example_targets_are_valid_targets(case):
    likelihood = case.default_likelihood().double()
    y, kwargs = case.example_targets(8, torch.float64)
    assert y.shape[-1] == 8 and y.dtype == torch.float64
    likelihood.check_targets(y, **kwargs)


@pytest.mark.parametrize("path", list(TABLES))
def test_the_likelihood_tables_are_generated_from_the_registry(path):
    expected = likelihood_table(TABLES[path][1])
    assert table_in(path) == expected, (
        f"the likelihood table of {path} is stale: run python -m tests.likelihoods.registry --write-tables"
    )
