"""Device placement, audited statically: every tensor the package creates with a torch factory function
(``torch.zeros``, ``torch.arange``, ``torch.randn``, ``torch.Generator``, ...) names its ``device`` (or takes it
through ``**kwargs``), unless the call site is listed below with the reason it is right without one.

A tensor made on the CPU in a fit or a sampler breaks (or silently round-trips through the host) on CUDA, and on a
CPU-only machine nothing else would notice. This test fails on a new call site without ``device=``: place the
tensor, or list the site with its reason. It also fails on a listed site that no longer exists. The behaviour on a
device is tested by the tests that take the ``device`` fixture (``pytest --device cuda -m device``)."""

from __future__ import annotations

import ast
from pathlib import Path

import gpytorch_augment

PACKAGE = Path(gpytorch_augment.__file__).parent

FACTORIES = {
    "arange", "as_tensor", "bernoulli", "empty", "eye", "full", "Generator", "linspace", "logspace", "normal",
    "ones", "rand", "randint", "randn", "randperm", "tensor", "zeros",
}  # fmt: skip

#: sub-packages whose tensors are CPU data by design (test recipes for likelihood authors)
CPU_PACKAGES = ("testing/",)

#: (file, enclosing function) -> why a factory call there needs no device
ALLOWED = {
    ("_numerics/quadrature.py", "standard_normal_rule"): "a cached quadrature rule built once, then moved with "
    ".to(device)",
    ("datasets.py", "load_keel.as_tensor"): "data sets are loaded on the host; the user moves them",
    ("demo.py", "_plot"): "the demo plots on the host",
    ("distributions/laplace_transform.py", "<module>"): "the grid log phi is checked on, a host constant",
    ("distributions/laplace_transform.py", "check_laplace_transform"): "log phi on the host check grid, at "
    "construction",
    ("distributions/laplace_transform.py", "__init__"): "as_tensor of the caller's r (a tensor keeps its device)",
    ("likelihoods/laplace_transform.py", "__init__"): "a constructor constant, registered with the module and moved "
    "with it",
    ("likelihoods/laplace_transform.py", "coefficients"): "a coefficient's value: a tensor keeps its device, a number "
    "is a 0-d tensor that combines with any device",
    ("likelihoods/mixing_laws.py", "log_mass"): "log phi(0) as a 0-d value (combines with any device)",
    ("likelihoods/ordinal.py", "__init__"): "a module parameter, moved with the module",
    ("likelihoods/ordinal.py", "cutpoints"): "the setter validates the user's values on the host, then copies them "
    "into the parameter on its device",
    ("likelihoods/pairwise.py", "_required_comparisons"): "as_tensor of the user's index pairs (a tensor keeps its "
    "device)",
    ("inference/mcmc/_arguments.py", "check_init_state"): "as_tensor of user tensors, to validate them",
    ("inference/mcmc/driver.py", "_sample"): "a fresh seed drawn on the host (a Python int)",
    ("inference/mcmc/samples.py", "summary"): "diagnostics computed on the host",
    ("inference/mcmc/target.py", "from_storage"): "as_tensor of a user tensor, then .to(device=self.device)",
    ("inference/nested.py", "_closure"): "a host scalar for SciPy's optimiser",
    ("inference/nested.py", "_closure_with_entry.closure"): "a host scalar for SciPy's optimiser",
    ("likelihoods/_constants.py", "_as_float64"): "a constructor argument; registered as a buffer/parameter, moved "
    "with the module",
    ("likelihoods/_constants.py", "register_positive_constant"): "a module parameter, moved with the module",
    ("likelihoods/_heteroscedastic.py", "predictive_cdf"): "as_tensor of the user's value (a number: a 0-d CPU "
    "tensor combines with tensors on any device)",
    ("likelihoods/_predictive.py", "check_probability"): "a user's probability level, validated on the host",
    ("likelihoods/augmented_likelihood.py", "constants"): "as_tensor(value).to(param)",
    ("likelihoods/binomial.py", "_required_trials"): "a number of trials (a 0-d CPU tensor combines with any device)",
    ("likelihoods/heteroscedastic_student_t.py", "_component_cdf"): "SciPy's Student-t CDF on the host, moved back",
    ("likelihoods/laplace.py", "predictive_cdf"): "as_tensor of the user's value",
    ("likelihoods/laplace.py", "_cdf_function"): "as_tensor of the user's value",
    ("likelihoods/student_t.py", "predictive_cdf"): "as_tensor of the user's value",
    ("likelihoods/student_t.py", "_cdf_function"): "as_tensor of the user's value",
    ("_validation.py", "as_tensors"): "as_tensor of the user's numpy arrays (numpy lives on the host)",
    ("core/design.py", "comparison_indices"): "as_tensor of the user's index pairs (a tensor keeps its device)",
    ("distributions/laplace_transform.py", "log_laplace_derivatives"): "zeros_like keeps the device; as_tensor of a "
    "value that is already a tensor or a number",
    ("likelihoods/laplace_transform.py", "log_prob"): "as_tensor of the user's value, then .to(self.f)",
    ("likelihoods/laplace_transform.py", "predictive_cdf"): "as_tensor of the user's value (a tensor keeps its device)",
    ("preference.py", "_fit_exact"): "SciPy's objective value, a host scalar",
    ("inference/lbfgs.py", "run_scipy.write"): "SciPy's host array of raw values, moved with .to(parameter)",
}


def unplaced_factory_calls(root: Path = PACKAGE) -> set[tuple[str, str]]:
    """(file relative to ``root``, enclosing function's dotted name) of each ``torch.<factory>(...)`` call without a
    ``device=`` keyword or ``**kwargs``, outside :data:`CPU_PACKAGES`."""
    found: set[tuple[str, str]] = set()
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(CPU_PACKAGES):
            continue
        scope: list[str] = []

        class Visitor(ast.NodeVisitor):
            def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
                scope.append(node.name)
                self.generic_visit(node)
                scope.pop()

            visit_AsyncFunctionDef = visit_FunctionDef

            def visit_Call(self, node: ast.Call) -> None:
                func = node.func
                is_factory = (
                    isinstance(func, ast.Attribute)
                    and isinstance(func.value, ast.Name)
                    and func.value.id == "torch"
                    and func.attr in FACTORIES
                )
                if is_factory and not any(k.arg in ("device", None) for k in node.keywords):
                    found.add((relative, ".".join(scope) or "<module>"))
                self.generic_visit(node)

        Visitor().visit(ast.parse(path.read_text(), filename=str(path)))
    return found


def test_every_factory_call_names_its_device_or_is_listed_with_a_reason():
    unlisted = unplaced_factory_calls() - set(ALLOWED)
    assert not unlisted, f"torch factory calls without device= (place them, or list them with a reason): {unlisted}"


def test_every_listed_site_still_exists():
    stale = set(ALLOWED) - unplaced_factory_calls()
    assert not stale, f"listed sites without an unplaced factory call any more (remove them): {stale}"


def test_the_audit_finds_an_unplaced_call(tmp_path):
    """The audit has the power to fail: a module with ``torch.zeros(3)`` in a function is found, placed calls and
    ``**kwargs`` calls are not."""
    (tmp_path / "module.py").write_text(
        "import torch\n"
        "def fit(x, kw):\n"
        "    a = torch.zeros(3)\n"
        "    b = torch.ones(3, device=x.device)\n"
        "    return torch.empty(2, **kw)\n"
    )
    assert unplaced_factory_calls(tmp_path) == {("module.py", "fit")}
