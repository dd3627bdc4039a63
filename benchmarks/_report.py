"""The one renderer of benchmark results: a JSON record and a Markdown file of tables.

A script measures; it does not interpret. Its report is a title, a settings block (what was run, on which machine)
and tables of measured values, written by :func:`write_report` as ``<name>.json`` (the whole result record, with
the rendered tables) and ``<name>.md`` (the tables). What the figures mean is written by hand, once, in
``benchmarks/README.md``.

Example::

    >>> from _report import Table, render
    >>> table = Table("Time to target", ["method", "time [s]"], [["CAVI", 0.23], ["SVGP + Adam", None]])
    >>> print(render("Binary classification", {"N": 15216, "M": 100}, [table]))  # doctest: +NORMALIZE_WHITESPACE
    # Binary classification
    <BLANKLINE>
    ## Settings
    <BLANKLINE>
    | setting | value |
    | --- | --- |
    | N | 15216 |
    | M | 100 |
    <BLANKLINE>
    ## Time to target
    <BLANKLINE>
    | method | time [s] |
    | --- | --- |
    | CAVI | 0.23 |
    | SVGP + Adam | — |
    <BLANKLINE>
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Table", "cell", "machine_settings", "render", "write_report"]

#: what an empty cell shows (a value that was not measured, e.g. a target never reached)
MISSING = "—"


@dataclass
class Table:
    """One table of a report: a title, column names and rows of cells (numbers, strings or ``None``)."""

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"table {self.title!r}: a row has {len(row)} cells for {len(self.columns)} columns")


def cell(value: Any, spec: str | None = None) -> str:
    """A table cell: ``None`` and NaN as :data:`MISSING`, booleans as yes/no, numbers by the format ``spec``
    (default: integers in full, floats to 4 significant digits), anything else as ``str``.

    >>> cell(None), cell(float("nan")), cell(0.123456), cell(15216), cell("CAVI"), cell(2.5, ".1f"), cell(True)
    ('—', '—', '0.1235', '15216', 'CAVI', '2.5', 'yes')
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return format(value, spec or "d")
    if isinstance(value, float):
        return format(value, spec or ".4g")
    return str(value)


def machine_settings(machine: Mapping[str, Any]) -> dict[str, Any]:
    """The settings rows of a machine record (``_common.close_machine_info``): date, cores, load, versions."""
    load = lambda key: ", ".join(f"{v:.1f}" for v in machine.get(key, [])) or None  # noqa: E731
    return {
        "date (UTC)": machine.get("date_utc"),
        "CPU cores (shared)": machine.get("cpu_count"),
        "torch threads": machine.get("torch_threads"),
        "load average at start (1, 5, 15 min)": load("load_average_start"),
        "load average at end (1, 5, 15 min)": load("load_average_end"),
        "torch / gpytorch": f"{machine.get('torch')} / {machine.get('gpytorch')}",
    }


def _markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render(title: str, settings: Mapping[str, Any], tables: Sequence[Table], figure: str | None = None) -> str:
    """The Markdown report: ``# title``, a settings table, each table under its ``##`` title, and the figure."""
    parts = [f"# {title}", "", "## Settings", "", _markdown_table(["setting", "value"], list(settings.items())), ""]
    for table in tables:
        parts += [f"## {table.title}", "", _markdown_table(table.columns, table.rows), ""]
    if figure is not None:
        parts += [f"![{title}]({figure})", ""]
    return "\n".join(parts)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):  # tensors, arrays, numpy scalars
        return _jsonable(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj


def write_report(
    out: Path | str,
    name: str,
    result: Mapping[str, Any],
    title: str,
    settings: Mapping[str, Any],
    tables: Sequence[Table],
    figure: Callable[[Path, Mapping[str, Any]], Any] | None = None,
    echo: bool = True,
) -> Path:
    """Write ``out/<name>.json`` (``result`` and the tables), ``out/<name>.md`` (:func:`render`) and, with a
    ``figure``, ``out/<name>.png`` (``figure(path, result)``); print the Markdown if ``echo``. Returns the .md path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    record = {**result, "report": {"title": title, "settings": settings, "tables": [asdict(t) for t in tables]}}
    (out / f"{name}.json").write_text(json.dumps(_jsonable(record), indent=1) + "\n")
    if figure is not None:
        figure(out / f"{name}.png", result)
    markdown = render(title, settings, tables, figure=f"{name}.png" if figure is not None else None)
    (out / f"{name}.md").write_text(markdown)
    if echo:
        print(markdown)
    print(f"wrote {out}/{name}.{{json,md{',png' if figure is not None else ''}}}", flush=True)
    return out / f"{name}.md"
