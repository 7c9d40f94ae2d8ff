"""Markdown tables of the reports and docs: a row, the header row with its |---| rule, a titled head.

Every table of table.md files, findings and the docs pages is written through these, so that a
header's rule always has one cell per column; a table of paired tests has the columns of
`paired_columns`, filled by `paired_cells`, so that every such table shows the interval, both p values,
the detectable difference and a verdict column that names its correction.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .stats import CONFIDENCE, CORRECTION, MIN_PAIRS_FOR_VERDICT, POWER, format_interval, format_p

__all__ = ["table_row", "table_header", "table_head", "markdown_table", "paired_columns", "paired_cells"]


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


def paired_columns(difference: str, unit: str = "pp", family: int | None = None) -> list[str]:
    """The columns of a table of paired tests after its labels (`paired_cells` fills them): the mean
    `difference`, its interval, p uncorrected and corrected, the detectable difference and the verdict."""
    return [f"{difference} ({unit})", f"{CONFIDENCE:.0%} CI", "p", f"p ({CORRECTION})",
            f"detectable at {POWER:.0%} power ({unit})", f"verdict ({CORRECTION})"]


def paired_cells(row: Mapping[str, Any], fmt: str = "+.3f", scale: float = 1.0, p_digits: int = 3) -> list[str]:
    """A judged row's cells under `paired_columns` (the row as report.stats.judge leaves it: "test", the
    fields of a PairedTest; "p_corrected"; "verdict"): mean difference, 95% CI, p, corrected p, detectable
    difference (each difference × `scale`, in `fmt`; the interval's ends in order) and the verdict; "—" where
    a value is missing, and no p, interval or detectable difference below MIN_PAIRS_FOR_VERDICT pairs (none
    is read there)."""
    test = row["test"]
    few = test["n"] < MIN_PAIRS_FOR_VERDICT

    def number(value: float | None) -> str:
        return "—" if value is None else format(scale * value, fmt)

    low, high = sorted((scale * test["ci_low"], scale * test["ci_high"])) if test.get("ci_low") is not None else (None, None)
    return [number(test["mean_difference"]),
            "—" if few else format_interval(low, high, fmt),
            "—" if few else format_p(test["p_value"], p_digits),
            "—" if few else format_p(row.get("p_corrected"), p_digits),
            "—" if few or test.get("detectable") is None else format(abs(scale) * test["detectable"], fmt.lstrip("+")),
            row["verdict"]]
