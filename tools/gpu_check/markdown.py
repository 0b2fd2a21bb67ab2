"""The GPU check report's cell format (its tables are written by
``loaderbench.platform.tables``)."""

from __future__ import annotations

from typing import Any


def fmt(value: Any, digits: int = 3) -> str:
    """A table cell: numbers to ``digits`` significant figures (thousands separated from 100
    up), booleans in lower case, text as it is (``markdown_table`` escapes its pipes)."""
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return str(value)


def short(text: str, limit: int = 160) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
