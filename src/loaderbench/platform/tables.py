"""The project's one markdown table writer: summary.md, report.md, scale.md, the profiles and the
GPU check's report all write their tables through ``markdown_table``.

tabulate's ``pipe`` format (GitHub's tables, columns padded to one width, colons for each
column's alignment). The callers format every cell, numbers included, so tabulate parses none
of them (``disable_numparse``): a cell is shown exactly as given, except that a ``|`` is escaped
and a line break becomes a space, so that a cell stays one cell and a row one line. tabulate is
imported when a table is written, not with this module: the GPU check imports this module before
its kit, tabulate among it, is installed (tools/gpu_check/gpu_check.sh).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

Align = Literal["left", "right", "center"]
ALIGNS: tuple[Align, ...] = ("left", "right", "center")


def _cell(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise TypeError(
            f"markdown_table: {where} is {value!r} ({type(value).__name__}), not a str: "
            "format it first (tabulate would format it its own way)"
        )
    return value.replace("|", "\\|").replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


def _aligns(align: Align | Sequence[Align], columns: int) -> list[str]:
    aligns = [align] * columns if isinstance(align, str) else list(align)
    if len(aligns) != columns:
        raise ValueError(f"markdown_table: {len(aligns)} alignments for {columns} columns")
    wrong = [a for a in aligns if a not in ALIGNS]
    if wrong:
        raise ValueError(f"markdown_table: alignment {wrong[0]!r} is none of {ALIGNS}")
    return aligns


def markdown_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    align: Align | Sequence[Align] = "left",
) -> str:
    """A markdown table: ``headers``, then a line of ``rows`` each, without a final line break.

    ``align`` is every column's alignment, or one a column. Every cell is a str, as the caller
    formatted it; each row has a cell a heading (``TypeError``, ``ValueError`` otherwise). No
    rows: the headings and the line under them.
    """
    from tabulate import tabulate  # here: see the module's docstring

    heads = [_cell(h, f"heading {n}") for n, h in enumerate(headers)]
    cells = []
    for r, row in enumerate(rows):
        if len(row) != len(heads):
            raise ValueError(
                f"markdown_table: row {r} has {len(row)} cells for {len(heads)} headings {heads}"
            )
        cells.append([_cell(v, f"row {r}, column {heads[c]!r}") for c, v in enumerate(row)])
    return tabulate(
        cells,
        heads,
        tablefmt="pipe",
        disable_numparse=True,
        colalign=_aligns(align, len(heads)),
    )
