"""The public names: every ``__all__`` in the package lists importable names, once each.

Every module of ``gpytorch_augment`` is imported (found by walking the package, so a new module is checked
without editing this file), and ``from module import *`` must bind exactly the names its ``__all__`` lists.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

import gpytorch_augment


def _modules() -> list[str]:
    names = [gpytorch_augment.__name__]
    names += [info.name for info in pkgutil.walk_packages(gpytorch_augment.__path__, prefix="gpytorch_augment.")]
    return sorted(names)


MODULES = _modules()
WITH_ALL = [name for name in MODULES if hasattr(importlib.import_module(name), "__all__")]


def test_the_walk_finds_the_packages_with_public_names() -> None:
    for name in ("gpytorch_augment", "gpytorch_augment.inference", "gpytorch_augment.likelihoods",
                 "gpytorch_augment.inference.schedules"):
        assert name in WITH_ALL


@pytest.mark.parametrize("module_name", WITH_ALL)
def test_every_name_in_all_imports(module_name: str) -> None:
    module = importlib.import_module(module_name)
    names = list(module.__all__)
    assert all(isinstance(name, str) for name in names), names
    assert len(names) == len(set(names)), f"{module_name}.__all__ lists a name twice: {names}"
    missing = [name for name in names if not hasattr(module, name)]
    assert not missing, f"{module_name}.__all__ lists names it does not define: {missing}"
    namespace: dict[str, object] = {}
    exec(f"from {module_name} import *", namespace)  # noqa: S102 - the star import is what __all__ is for
    assert set(namespace) - {"__builtins__"} == set(names)


def test_inference_exports_the_schedules_and_convergence_criteria() -> None:
    from gpytorch_augment.inference import (
        CAVI,
        AdaptiveStep,
        ConstantStep,
        HeldOut,
        RelativeChange,
        RobbinsMonro,
        cavi,
        make_schedule,
        schedules,
    )

    assert (ConstantStep, RobbinsMonro, AdaptiveStep, make_schedule) == (
        schedules.ConstantStep, schedules.RobbinsMonro, schedules.AdaptiveStep, schedules.make_schedule
    )
    assert (RelativeChange, HeldOut, CAVI) == (cavi.RelativeChange, cavi.HeldOut, cavi.CAVI)
    assert isinstance(make_schedule("constant", rho=0.5), ConstantStep)


def test_the_package_root_re_exports_its_subpackages_names() -> None:
    root: ModuleType = gpytorch_augment
    for sub in ("distributions", "likelihoods"):
        assert getattr(root, sub) is importlib.import_module(f"gpytorch_augment.{sub}")
    for name in ("CAVI", "CAVITrace", "GibbsSampler", "PosteriorSamples"):
        assert getattr(root, name) is getattr(gpytorch_augment.inference, name)
