"""Markdown tables of the reports and docs: a row, the header row with its |---| rule, a titled head.

Every table of table.md files, findings and the docs pages is written through these, so that a
header's rule always has one cell per column.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["table_row", "table_header", "table_head", "markdown_table"]


def table_row(cells: Sequence[Any]) -> str:
    """One markdown table row: "| a | b | … |" (each cell as str)."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table_header(columns: Sequence[str]) -> list[str]:
    """The header row of `columns` and its |---| rule (one cell per column); append one `table_row` per row."""
    return [table_row(columns), "|" + "---|" * len(columns)]


def table_head(title: str, columns: Sequence[str]) -> list[str]:
    """The first lines of a titled markdown table: `title`, a blank line, then `table_header(columns)`."""
    return [title, "", *table_header(columns)]


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A whole markdown table: the header of `columns`, then one row per entry of `rows`, newline-joined."""
    return "\n".join([*table_header(columns), *(table_row(row) for row in rows)])
