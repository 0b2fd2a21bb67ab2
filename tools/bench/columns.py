"""The benchmark report's figures of a pipeline, by their names in the metric catalog
(``loaderbench.measure.metrics``): each column's title and decimals, in the pipelines table's
order, and how a figure shows as a cell. Kept here, since only the report asks it."""

from __future__ import annotations

from typing import NamedTuple

from loaderbench.measure.metrics import (
    BY_KEY,
    CEILING_FRAC,
    CPU_S_PER_1K_IMAGES,
    DATA_WAIT_FRAC,
    IMAGES_PER_S,
    TTFB_S,
)


class Column(NamedTuple):
    title: str
    decimals: int


# The rate first (the columns computed from it follow it there), then the costs.
COLUMNS: dict[str, Column] = {
    IMAGES_PER_S: Column("images/s", 1),
    CPU_S_PER_1K_IMAGES: Column("CPU s / 1k images", 2),
    DATA_WAIT_FRAC: Column("data wait", 3),
    TTFB_S: Column("ttfb s", 2),
    CEILING_FRAC: Column(CEILING_FRAC, 3),  # titled by its name
}
assert set(COLUMNS) <= set(BY_KEY), "a report column is not a metric of the catalog"


def cell(key: str, value: object) -> str:
    """``value`` as a cell of the report: its column's decimals, thousands apart."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{COLUMNS[key].decimals}f}"
    return str(value)
