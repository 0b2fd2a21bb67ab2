"""The tests' reading of the markdown tables the project writes (``loaderbench.platform.tables``):
``unpadded`` writes each table line again without tabulate's padding (``| a | b |``), so that a
test can look for a row's cells as a substring whatever the widths of the other rows."""

from __future__ import annotations

import re

PIPE = re.compile(r"(?<!\\)\|")  # a cell's own pipes are escaped ("\|")


def cells(line: str) -> list[str]:
    """A table line's cells, stripped (escaped pipes kept as written)."""
    return [cell.strip() for cell in PIPE.split(line.strip())[1:-1]]


def unpadded(text: str) -> str:
    """``text`` with every table line as ``| cell | cell |`` (the line under the headings as
    ``|---|---|``, its alignment colons kept), every other line as it is."""
    lines = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        if body.startswith("|"):
            row = cells(body)
            if row and all(re.fullmatch(r":?-+:?", cell) for cell in row):
                row = [re.sub("-+", "---", cell) for cell in row]
                body = "|" + "|".join(row) + "|"
            else:
                body = "| " + " | ".join(row) + " |"
        lines.append(body + line[len(line.rstrip("\r\n")) :])
    return "".join(lines)
