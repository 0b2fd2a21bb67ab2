"""The GPU check report's one markdown table writer and its cell format."""

from __future__ import annotations

from typing import Any


def fmt(value: Any, digits: int = 3) -> str:
    """A table cell: numbers to ``digits`` significant figures (thousands separated from 100
    up), booleans in lower case, pipes and newlines escaped so the row stays one row."""
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def short(text: str, limit: int = 160) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table's lines; the cells are written as given (format them with ``fmt``)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return lines
