"""The likelihood tables of the documentation and the README, generated from the exported likelihood classes.

Every class in ``gpytorch_augment.likelihoods.__all__`` that states its
:attr:`~gpytorch_augment.likelihoods.AugmentedLikelihood.augmentation` has one row, in the order of its
``maths_page`` in the toctree of ``docs/maths/index.md`` (a class documented by its own docstring comes last), then
of its name. The documentation build (``docs/conf.py``) writes both tables; so does::

    python docs/likelihood_table.py

The docs' table is a generated file the maths index includes (``docs/maths/_likelihoods.md``, not committed); the
README's table is rewritten in place, and a test fails while it is stale.
"""

from __future__ import annotations

import re
from pathlib import Path

import gpytorch_augment.likelihoods as likelihoods

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
#: the generated file the maths index includes
DOCS_TABLE = DOCS / "maths" / "_likelihoods.md"
#: the README table's header line (the table runs from it to the first line that is not a table row)
README_HEADER = "| likelihood | augmentation | latents |"
DOCS_HEADER = "| likelihood | augmentation | latents | mathematics |"


def _maths_pages(root: Path) -> list[str]:
    """The pages of the toctree of ``docs/maths/index.md``, in order."""
    text = (root / "docs" / "maths" / "index.md").read_text(encoding="utf-8")
    block = re.search(r"```\{toctree\}\n(.*?)```", text, flags=re.S)
    lines = block.group(1).splitlines() if block else []
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith(":")]


def likelihood_classes(root: Path = ROOT) -> list[type]:
    """The exported likelihood classes that have a row, in table order."""
    classes = [getattr(likelihoods, name) for name in likelihoods.__all__]
    classes = [c for c in classes if isinstance(c, type) and issubclass(c, likelihoods.AugmentedLikelihood)]
    pages = _maths_pages(root)
    rank = {page: index for index, page in enumerate(pages)}
    rows = [c for c in classes if c.augmentation]
    return sorted(rows, key=lambda c: (rank.get(c.maths_page, len(pages)), c.__name__))


def table(style: str, root: Path = ROOT) -> list[str]:
    """The table's lines, header included, for ``style`` ``"readme"`` or ``"docs"``."""
    header = {"readme": README_HEADER, "docs": DOCS_HEADER}[style]
    lines = [header, "| --- " * header.count(" | ") + "| --- |"]
    for cls in likelihood_classes(root):
        name, latents = cls.__name__, cls.latents_label or str(cls.num_latents)
        if style == "readme":
            lines.append(f"| `{name}` | {cls.augmentation} | {latents} |")
        else:
            page = f"{{doc}}`{cls.maths_page}`" if cls.maths_page else "its docstring"
            lines.append(f"| {{class}}`~gpytorch_augment.{name}` | {cls.augmentation} | {latents} | {page} |")
    return lines


def readme_table(root: Path = ROOT) -> list[str]:
    """The table now in the README (from its header line to the first line that is not a table row)."""
    lines = (root / "README.md").read_text(encoding="utf-8").splitlines()
    start = end = lines.index(README_HEADER)
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[start:end]


def write(root: Path = ROOT) -> None:
    """Write the docs' table file and rewrite the README's table in place (untouched when already current)."""
    (root / "docs" / "maths" / DOCS_TABLE.name).write_text("\n".join(table("docs", root)) + "\n", encoding="utf-8")
    readme = root / "README.md"
    old, new = "\n".join(readme_table(root)), "\n".join(table("readme", root))
    if old != new:
        readme.write_text(readme.read_text(encoding="utf-8").replace(old, new, 1), encoding="utf-8")


if __name__ == "__main__":  # pragma: no cover - rewrites the tables
    write()
    print(f"wrote {DOCS_TABLE.relative_to(ROOT)} and the README's likelihood table")
