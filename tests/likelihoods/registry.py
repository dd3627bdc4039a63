r"""The registry of this package's likelihoods: :data:`CASES`, every per-likelihood test runs over it.

The registry is found, not written: it collects the ``CASES`` list of every module ``tests/likelihoods/cases_*.py``
(in the order of the modules' names, then of each list). A likelihood of this package is two files, its module
under ``gpytorch_augment/likelihoods/`` and its case module here, plus its name in the one export list
(the ``__all__`` of ``gpytorch_augment.likelihoods``, which the top level re-exports). Every case inherits:

* ``test_protocol.py``: the identities (a)-(f), (h) of docs/maths/identities.md, shapes and dtypes, GPyTorch's
  ``BaseLikelihoodTestCase``; ``tests/inference/test_geweke.py``: the Geweke test (g) of the Gibbs sampler;
* ``tests/test_regression_pins.py``: pinned CAVI, Gibbs and HMC runs, one file per case under ``tests/data/pins/``,
  created under a flag (``python -m tests.test_regression_pins --write`` writes the missing files only);
* ``tests/test_fuzz.py`` (bad input at every entry point, with the case's ``example_targets``) and
  ``tests/likelihoods/test_constants.py`` (the case's ``constants`` and ``constant_priors``), over :data:`PRIMARY`.

The likelihood tables of ``README.md`` and ``docs/maths/index.md`` are not the registry's: the documentation build
generates them from the exported classes' :attr:`~gpytorch_augment.likelihoods.AugmentedLikelihood.augmentation`
(``docs/likelihood_table.py``).

How a likelihood of this package registers
-----------------------------------------
Write a module ``cases_<name>.py`` here whose ``CASES`` lists its :class:`~gpytorch_augment.testing.LikelihoodCase`
(the dataclass's docstring gives the rules for every field). The first case of a class is its *primary* case and
declares the registration fields too::

    POISSON = LikelihoodCase(
        name="poisson_logit",
        make=lambda: PoissonLogitLikelihood(rate_scale=3.7).double(),      # fresh, float64, non-default constants
        sample_targets=lambda f, generator, **kwargs: torch.poisson(3.7 * torch.sigmoid(f), generator=generator),
        marginalise=marginalise_poisson,                                   # log ∫ tilt p(Ω|y) dΩ, no sampling
        q_aux_distribution=_poisson_q_aux,                                 # the law of q*(Ω), for Monte Carlo
        cavi_sweeps=80,                                                    # why, in a comment
        example_targets=cyclic_targets(4),                                 # fuzz targets: y_i = i mod 4
        constants=("rate_scale",),                                         # must reject 0, -1, inf, nan...
        constant_priors={"rate_scale_prior": {}},
    )
    CASES: list[LikelihoodCase] = [POISSON]

``test_registry.py`` fails, naming the case and the field, if a primary case lacks a registration field or if an
exported likelihood has no case. Helpers for the common pieces live in :mod:`gpytorch_augment.testing.case`
(:func:`~gpytorch_augment.testing.marginalise_single_pg` for one Pólya-Gamma variable,
:func:`~gpytorch_augment.testing.log_pg_laplace`, the default Gauss--Hermite ``expected_log_lik``,
:func:`~gpytorch_augment.testing.cyclic_targets`, :func:`~gpytorch_augment.testing.real_targets`).

How a third-party likelihood registers
--------------------------------------
A package that defines its own :class:`~gpytorch_augment.likelihoods.AugmentedLikelihood` subclasses
:class:`~gpytorch_augment.testing.AugmentedLikelihoodTestCase` in its own test suite and sets the case, and pytest
collects every test for it::

    from gpytorch_augment.testing import AugmentedLikelihoodTestCase, LikelihoodCase

    class TestMyLikelihood(AugmentedLikelihoodTestCase):
        case = LikelihoodCase(name="mine", make=..., sample_targets=..., marginalise=..., q_aux_distribution=...)

``test_protocol.py`` registers the two-latent toy of ``toy_multilatent.py`` this way
(``TestTwoBitLogitThirdParty``), as a check of that route and of the multi-latent paths.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from gpytorch_augment.testing import LikelihoodCase

HERE = Path(__file__).resolve().parent
_REGISTRATION_FIELDS = ("example_targets",)


def discover_cases(directory: Path = HERE, package: str = "tests.likelihoods") -> list[LikelihoodCase]:
    """The ``CASES`` of every module ``cases_*.py`` of ``directory`` (imported as ``package.cases_*``, or as a
    top-level module when ``package`` is empty), in the order of the modules' names.

    Raises ``TypeError`` naming a module whose ``CASES`` is missing or holds something other than cases."""
    cases: list[LikelihoodCase] = []
    for path in sorted(directory.glob("cases_*.py")):
        module = importlib.import_module(f"{package}.{path.stem}" if package else path.stem)
        found = getattr(module, "CASES", None)
        if not isinstance(found, list) or not all(isinstance(case, LikelihoodCase) for case in found):
            raise TypeError(f"{path.name} must define CASES, a list of LikelihoodCase (the registry collects it)")
        cases += found
    return cases


#: every registered likelihood case, from the ``cases_*.py`` modules
CASES: list[LikelihoodCase] = discover_cases()
BERNOULLI: LikelihoodCase = next(case for case in CASES if case.name == "bernoulli_logit")


def primary_cases(cases: list[LikelihoodCase]) -> list[LikelihoodCase]:
    """The first case of each likelihood class, in registry order: the one that declares the registration
    fields (the fuzz and constants matrices run over these)."""
    seen: dict[type, LikelihoodCase] = {}
    for case in cases:
        seen.setdefault(type(case.make()), case)
    return list(seen.values())


#: one case per likelihood class
PRIMARY: list[LikelihoodCase] = primary_cases(CASES)


def registration_problems(cases: list[LikelihoodCase]) -> list[str]:
    """What is missing or inconsistent in ``cases``, one sentence each (empty when every class registers fully)."""
    problems = []
    names = [case.name for case in cases]
    problems += [f"two cases are named {name!r}" for name in sorted({n for n in names if names.count(n) > 1})]
    for case in primary_cases(cases):
        cls = type(case.make()).__name__
        missing = [name for name in _REGISTRATION_FIELDS if not getattr(case, name)]
        if missing:
            problems.append(f"case {case.name!r}, the first of {cls}, declares no {', '.join(missing)}")
        for name in case.constants:
            if not hasattr(case.default_likelihood(), name):
                problems.append(f"case {case.name!r}: {cls} has no constant {name!r}")
    return problems


__all__ = ["BERNOULLI", "CASES", "PRIMARY", "LikelihoodCase", "discover_cases", "registration_problems"]
