r"""The registry of this package's likelihoods: :data:`CASES`, the single list every per-likelihood test runs over.

Every augmented likelihood of ``gpytorch_augment`` registers **once**, here, and inherits every test of the shipped
suite :mod:`gpytorch_augment.testing` and every matrix and table of the package:

* ``test_protocol.py``: the identities (a)-(f), (h) of docs/maths/identities.md, shapes and dtypes, GPyTorch's
  ``BaseLikelihoodTestCase``; ``tests/inference/test_geweke.py``: the Geweke test (g) of the Gibbs sampler;
* ``tests/test_regression_pins.py``: pinned CAVI, Gibbs and HMC runs, one file per case under ``tests/data/pins/``;
* ``tests/test_fuzz.py`` (bad input at every entry point, with the case's ``example_targets``) and
  ``tests/likelihoods/test_constants.py`` (the case's ``constants`` and ``constant_priors``), over :data:`PRIMARY`;
* the likelihood tables of ``README.md`` and ``docs/maths/index.md`` (:func:`likelihood_table`; checked by
  ``test_registry.py``, rewritten by ``python -m tests.likelihoods.registry --write-tables``).

How a likelihood of this package registers
-----------------------------------------
1. Write the likelihood in its own module under ``gpytorch_augment/likelihoods/`` and export it (the ``__all__`` of
   ``gpytorch_augment.likelihoods`` and of ``gpytorch_augment``, the top-level table of ``docs/api/index.rst``).
2. Write its :class:`~gpytorch_augment.testing.LikelihoodCase` in a ``cases_<family>.py`` module (its docstring
   gives the rules for every field) and **append one line** to :data:`CASES` below. The first case of a class is
   its primary case and declares the registration fields too::

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
        augmentation="Poisson + Pólya-Gamma (rate ξσ(f))",                 # its row of the likelihood tables
        maths_page="counts",                                               # docs/maths/counts.md autoclasses it
    )

3. Add its ``autoclass`` to the ``docs/maths`` page named by ``maths_page``, then run
   ``python -m tests.likelihoods.registry --write-tables`` (README and docs tables) and
   ``python -m tests.test_regression_pins --write`` (writes the new case's pin file, never an existing one).

``test_registry.py`` fails, naming the case and the field, if a primary case lacks a registration field, if an
exported likelihood has no case, or if a table is stale. Helpers for the common pieces live in
:mod:`gpytorch_augment.testing.case` (:func:`~gpytorch_augment.testing.marginalise_single_pg` for one Pólya-Gamma
variable, :func:`~gpytorch_augment.testing.log_pg_laplace`, the default Gauss--Hermite ``expected_log_lik``,
:func:`~gpytorch_augment.testing.cyclic_targets`, :func:`~gpytorch_augment.testing.real_targets`).

How a third-party likelihood registers
--------------------------------------
A package that defines its own :class:`~gpytorch_augment.likelihoods.AugmentedLikelihood` does not edit this list:
in its own test suite it subclasses :class:`~gpytorch_augment.testing.AugmentedLikelihoodTestCase` and sets the
case, and pytest collects every test for it::

    from gpytorch_augment.testing import AugmentedLikelihoodTestCase, LikelihoodCase

    class TestMyLikelihood(AugmentedLikelihoodTestCase):
        case = LikelihoodCase(name="mine", make=..., sample_targets=..., marginalise=..., q_aux_distribution=...)

``test_protocol.py`` registers the two-latent toy of ``toy_multilatent.py`` this way
(``TestTwoBitLogitThirdParty``), as a check of that route and of the multi-latent paths.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpytorch_augment.testing import LikelihoodCase
from tests.likelihoods.cases_binary import BERNOULLI
from tests.likelihoods.cases_counts import COUNT_CASES
from tests.likelihoods.cases_generic import GENERIC_CASES
from tests.likelihoods.cases_heteroscedastic import HETEROSCEDASTIC_CASES
from tests.likelihoods.cases_multiclass import MULTICLASS_CASES
from tests.likelihoods.cases_ordinal import ORDINAL_CASES
from tests.likelihoods.cases_robust import ROBUST_CASES

#: every registered likelihood, one case per line (a new likelihood appends its case)
CASES: list[LikelihoodCase] = [
    BERNOULLI,
    *COUNT_CASES,
    *ROBUST_CASES,
    *MULTICLASS_CASES,
    *HETEROSCEDASTIC_CASES,
    *GENERIC_CASES,
    *ORDINAL_CASES,
]

ROOT = Path(__file__).resolve().parents[2]
#: the generated tables: file -> (header line, style)
TABLES: dict[str, tuple[str, str]] = {
    "README.md": ("| likelihood | augmentation | latents |", "readme"),
    "docs/maths/index.md": ("| likelihood | augmentation | latents | mathematics |", "docs"),
}
_REGISTRATION_FIELDS = ("example_targets", "augmentation", "maths_page")


def primary_cases(cases: list[LikelihoodCase]) -> list[LikelihoodCase]:
    """The first case of each likelihood class, in registry order: the one that declares the registration
    fields (the fuzz and constants matrices and the tables run over these)."""
    seen: dict[type, LikelihoodCase] = {}
    for case in cases:
        seen.setdefault(type(case.make()), case)
    return list(seen.values())


#: one case per likelihood class
PRIMARY: list[LikelihoodCase] = primary_cases(CASES)


def registration_problems(cases: list[LikelihoodCase], root: Path = ROOT) -> list[str]:
    """What is missing or inconsistent in ``cases``, one sentence each (empty when every class registers fully)."""
    problems = []
    names = [case.name for case in cases]
    problems += [f"two cases are named {name!r}" for name in sorted({n for n in names if names.count(n) > 1})]
    primary = primary_cases(cases)
    for case in cases:
        cls = type(case.make()).__name__
        if case in primary:
            missing = [name for name in _REGISTRATION_FIELDS if not getattr(case, name)]
            if missing:
                problems.append(f"case {case.name!r}, the first of {cls}, declares no {', '.join(missing)}")
            page = root / "docs" / "maths" / f"{case.maths_page}.md"
            if case.maths_page and (not page.exists() or cls not in page.read_text(encoding="utf-8")):
                problems.append(f"case {case.name!r}: docs/maths/{case.maths_page}.md does not document {cls}")
            for name in case.constants:
                if not hasattr(case.default_likelihood(), name):
                    problems.append(f"case {case.name!r}: {cls} has no constant {name!r}")
        elif case.augmentation or case.maths_page:
            problems.append(f"case {case.name!r} is a further case of {cls}: its table row belongs to the first one")
    return problems


def likelihood_table(style: str, cases: list[LikelihoodCase] | None = None) -> list[str]:
    """The likelihood table's lines (header included) for ``style`` ``"readme"`` or ``"docs"``, one row per
    class, from the primary cases."""
    header = {"readme": TABLES["README.md"][0], "docs": TABLES["docs/maths/index.md"][0]}[style]
    lines = [header, "| --- " * header.count(" | ") + "| --- |"]
    for case in primary_cases(CASES if cases is None else cases):
        cls = type(case.make()).__name__
        latents = str(case.extras.get("table_latents", case.num_latents))
        if style == "readme":
            lines.append(f"| `{cls}` | {case.augmentation} | {latents} |")
        else:
            link, page = f"{{class}}`~gpytorch_augment.{cls}`", f"{{doc}}`{case.maths_page}`"
            lines.append(f"| {link} | {case.augmentation} | {latents} | {page} |")
    return lines


def table_in(path: str) -> list[str]:
    """The table of ``path`` (relative to the repository root) that starts at its header line."""
    header = TABLES[path][0]
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    start = lines.index(header)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[start:end]


def write_tables() -> None:
    """Rewrite the generated tables of :data:`TABLES` in place."""
    for path, (header, style) in TABLES.items():
        text = (ROOT / path).read_text(encoding="utf-8")
        old = "\n".join(table_in(path))
        (ROOT / path).write_text(text.replace(old, "\n".join(likelihood_table(style)), 1), encoding="utf-8")


__all__ = ["BERNOULLI", "CASES", "PRIMARY", "LikelihoodCase", "likelihood_table", "registration_problems"]

if __name__ == "__main__":  # pragma: no cover - rewrites the tables
    if "--write-tables" not in sys.argv:
        raise SystemExit("pass --write-tables to rewrite the likelihood tables of README.md and docs/maths/index.md")
    write_tables()
    print("wrote", ", ".join(TABLES))
