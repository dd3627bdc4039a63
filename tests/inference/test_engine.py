"""The CAVI engine behind its interface: ``CAVI`` implements :class:`CAVIEngine`; the protocols of the one-call fit use
the engine through it only (no private member) and never call back into ``CAVI.fit``."""

from __future__ import annotations

import ast
import inspect
import warnings
from pathlib import Path

import pytest
import torch

import gpytorch_augment as ga
from gpytorch_augment.inference import cavi as cavi_module
from gpytorch_augment.inference.engine import CAVIEngine
from gpytorch_augment.testing import SVGP

INFERENCE = Path(cavi_module.__file__).parent
#: the modules that drive the engine (cavi.py and its mixins are the engine itself)
DRIVERS = ("nested.py", "hyperparameters.py", "_fit_setup.py", "_fit_config.py")


def _members() -> list[str]:
    return [name for name in vars(CAVIEngine) if not name.startswith("_")]


def _cavi(n: int = 40) -> tuple[ga.CAVI, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.linspace(-3, 3, n, dtype=torch.float64).unsqueeze(-1)
    y = (x.squeeze(-1).sin() + 0.5 * torch.randn(n, dtype=torch.float64) > 0).double()
    return ga.CAVI(SVGP(x[::5].clone()).double(), ga.BernoulliLogitLikelihood(), num_data=n), x, y


def test_cavi_implements_the_interface_with_its_signatures() -> None:
    cavi, _, _ = _cavi()
    assert isinstance(cavi, CAVIEngine)
    for name in _members():
        declared = inspect.getattr_static(CAVIEngine, name)
        if isinstance(declared, property):
            continue
        ours = list(inspect.signature(getattr(ga.CAVI, name)).parameters)
        assert ours == list(inspect.signature(declared).parameters), name


def test_every_member_of_the_interface_says_what_it_does() -> None:
    assert {"prior_terms", "update", "frozen_q", "marginal_distribution", "run"} <= set(_members())
    assert all(inspect.getdoc(getattr(CAVIEngine, name)) for name in _members())


@pytest.mark.parametrize("module", DRIVERS)
def test_the_drivers_use_no_private_member_of_the_engine(module: str) -> None:
    """``cavi._x`` / ``self.cavi._x`` / ``cavi.strategy._x`` outside the engine, and a ``cavi`` typed ``Any``."""
    tree = ast.parse((INFERENCE / module).read_text(encoding="utf-8"))
    private = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = ast.unparse(node.value)
            if owner.split(".")[-1] in ("cavi", "strategy"):
                private.append(f"{owner}.{node.attr} (line {node.lineno})")
        if isinstance(node, ast.arg) and node.arg == "cavi":
            assert node.annotation is not None and ast.unparse(node.annotation) == "CAVIEngine", node.lineno
    assert private == []


def test_the_one_call_fit_does_not_call_back_into_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    fit = ga.CAVI.fit

    def counted(self: ga.CAVI, *args: object, **kwargs: object) -> object:
        calls.append(kwargs.get("learn_hyperparameters"))
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(ga.CAVI, "fit", counted)
    for protocol in ("nested", "stochastic"):
        cavi, x, y = _cavi()
        calls.clear()
        options = {"protocol": protocol, "max_iter": 3, "collapse_restarts": 0}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = cavi.fit(x, y, learn_hyperparameters=True, hyper_options=options)
        assert calls == [True] and result.protocol == protocol


def test_run_is_the_loop_of_fit() -> None:
    """``fit`` without hyper-parameter learning is ``run`` on the checked settings, plus the warning on a cap."""
    from gpytorch_augment.inference._fit_setup import fit_config

    first, x, y = _cavi()
    second, _, _ = _cavi()
    with pytest.warns(UserWarning, match="stopped at max_iter=3"):
        trace = first.fit(x, y, max_iter=3)
    config = fit_config(second, second.check_data(x, y), max_iter=3, tol=1e-8, hyper_optimizer=None, hyper_steps=1,
                        batch_size=None, data_loader=None, num_epochs=None, convergence=None,
                        generator=None)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = second.run(config)
    assert again.elbo == trace.elbo and not again.converged
    assert all(torch.equal(a, b) for a, b in zip(first.q_state(), second.q_state()))
