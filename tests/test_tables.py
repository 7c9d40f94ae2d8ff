"""report.tables: the one way a markdown table's header, rule and rows are written (issue 33)."""

from __future__ import annotations

from throughway.report.tables import markdown_table, table_head, table_header, table_row


def test_header_rule_has_one_cell_per_column():
    assert table_header(["d", "gated", "residual"]) == ["| d | gated | residual |", "|---|---|---|"]
    assert table_row([2, "1.50 ± 0.04", None]) == "| 2 | 1.50 ± 0.04 | None |"


def test_titled_head_and_whole_table():
    assert table_head("Test error (%)", ["d", "gated"]) == ["Test error (%)", "", "| d | gated |", "|---|---|"]
    assert markdown_table(["a", "b"], [[1, 2], ["x", "y"]]) == "| a | b |\n|---|---|\n| 1 | 2 |\n| x | y |"
