"""The one markdown table writer (``loaderbench.platform.tables.markdown_table``): headings, the
rule with each column's alignment, a line a row padded to the column's width; cells shown as given,
their pipes escaped; what it refuses, and why."""

from __future__ import annotations

import importlib
import sys

import pytest

from loaderbench.platform.tables import markdown_table
from tests.markdown_rows import cells, unpadded


def test_a_table_is_its_headings_the_rule_and_a_line_a_row_in_columns_of_one_width() -> None:
    text = markdown_table(["loader", "images/s"], [["memmap", "10,400.0"], ["spdl", "945.2"]])
    lines = text.split("\n")
    assert lines == [
        "| loader   | images/s   |",
        "|:---------|:-----------|",
        "| memmap   | 10,400.0   |",
        "| spdl     | 945.2      |",
    ]
    assert not text.endswith("\n")
    assert (
        unpadded(text)
        == "| loader | images/s |\n|:---|:---|\n| memmap | 10,400.0 |\n| spdl | 945.2 |"
    )


def test_each_column_takes_its_alignment_or_all_take_one() -> None:
    text = markdown_table(["frame", "share %"], [["a", "1.5"], ["b", "12.0"]], ["left", "right"])
    rule, first, second = text.split("\n")[1:]
    assert rule.endswith(":|") and rule.startswith("|:")
    assert first == "| a       |       1.5 |" and second == "| b       |      12.0 |"
    centred = markdown_table(["a", "b"], [["x", "y"]], align="center").split("\n")[1]
    assert centred == "|:---:|:---:|"


def test_cells_are_shown_as_given_never_read_as_numbers() -> None:
    given = ["1,234.50", "0010", "1e5", "inf", "nan", "True", "-", "0.70x", "± 3%", ""]
    text = markdown_table(["cell"], [[cell] for cell in given])
    assert [cells(line)[0] for line in text.split("\n")[2:]] == given


def test_a_pipe_in_a_cell_is_escaped_and_a_line_break_becomes_a_space() -> None:
    text = markdown_table(["job", "error"], [["1", "a | b\nnext line"]])
    row = text.split("\n")[2]
    assert cells(row) == ["1", r"a \| b next line"]
    heading = markdown_table(["a|b"], []).split("\n")[0]
    assert cells(heading) == [r"a\|b"]


def test_no_rows_is_the_headings_and_the_rule() -> None:
    assert unpadded(markdown_table(["rank", "job"], [])) == "| rank | job |\n|---|---|"


def test_a_cell_not_formatted_is_refused_naming_its_row_and_column() -> None:
    with pytest.raises(TypeError, match=r"row 1, column 'images/s' is 945\.2 \(float\), not a str"):
        markdown_table(["job", "images/s"], [["0", "1.0"], ["1", 945.2]])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="heading 0 is None"):
        markdown_table([None], [])  # type: ignore[list-item]


def test_a_row_of_the_wrong_width_and_an_unknown_alignment_are_refused() -> None:
    with pytest.raises(ValueError, match=r"row 0 has 1 cells for 2 headings"):
        markdown_table(["a", "b"], [["x"]])
    with pytest.raises(ValueError, match="1 alignments for 2 columns"):
        markdown_table(["a", "b"], [["x", "y"]], ["left"])
    with pytest.raises(ValueError, match="alignment 'decimal' is none of"):
        markdown_table(["a"], [["1.5"]], "decimal")  # type: ignore[arg-type]


def test_the_module_imports_without_tabulate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU check imports it before its kit (tabulate among it) is installed: only writing a
    table needs tabulate."""
    import loaderbench.platform

    monkeypatch.setitem(sys.modules, "tabulate", None)  # import tabulate: ImportError
    monkeypatch.delitem(sys.modules, "loaderbench.platform.tables")  # both put back after the test
    monkeypatch.setattr(loaderbench.platform, "tables", loaderbench.platform.tables)
    tables = importlib.import_module("loaderbench.platform.tables")
    with pytest.raises(ImportError):
        tables.markdown_table(["a"], [["1"]])
