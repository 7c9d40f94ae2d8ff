"""Markdown tables of the experiments' table.md files: the title, the header row and its rule."""

from __future__ import annotations

from typing import Sequence

__all__ = ["table_head"]


def table_head(title: str, columns: Sequence[str]) -> list[str]:
    """The first lines of a titled markdown table: `title`, a blank line, the header row of `columns`
    and its |---| rule (one cell per column); append one "| … |" line per row."""
    return [title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
