"""The words of every committed findings.md and every docs page are no stronger than their statistics.

A finding may say that one thing is "better" than another, that two are "indistinguishable", that a
cause is "ruled out", that something has "no cost", or that one thing "is the one" that does something,
only beside the statistic behind it (report.stats): a comparison beside its p value and the project's
correction (Holm), an equality beside an equivalence test (TOST) and its margin. A verdict column of a
table of tests names its correction; a "significant" result says whether it is corrected; an unmeasured
cause ("bound by ...") is marked as a belief or cites its measurement. Otherwise the words are "no
difference detected; 95% CI [a, b]".

The check reads each page as units: a sentence of prose, a list item's sentence, or a table row (whose
table's header and caption count as its context). Inline code, quotations ("...") and HTML comments
are not the page's own words and are skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

REPO = Path(__file__).resolve().parents[1]


def pages() -> list[Path]:
    """README.md, every docs/**/*.md and every committed results/**/findings.md."""
    return ([REPO / "README.md"] + sorted((REPO / "docs").rglob("*.md"))
            + sorted((REPO / "results").rglob("findings.md")))


@dataclass(frozen=True)
class Unit:
    """One sentence or table row of a page, with its line and (for a row) its table's caption and header."""

    line: int
    text: str
    caption: str = ""
    header: str = ""

    @property
    def context(self) -> str:
        """A row's table: its caption and header row ("" for prose)."""
        return f"{self.caption} {self.header}".strip()


_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_CODE = re.compile(r"`[^`]*`")
_QUOTE = re.compile(r"\"[^\"\n]*\"|“[^”\n]*”")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*(\[\-—])")


def _clean(text: str) -> str:
    return _QUOTE.sub("", _CODE.sub("", text))


def units(text: str) -> Iterator[Unit]:
    """The sentences and table rows of a markdown `text` (fenced code skipped)."""
    lines = _COMMENT.sub(lambda m: "\n" * m.group().count("\n"), text).split("\n")
    fenced = False
    paragraph: list[tuple[int, str]] = []
    caption = ""
    header: str | None = None

    def flush() -> Iterator[Unit]:
        if not paragraph:
            return
        start, joined = paragraph[0][0], " ".join(t.strip() for _, t in paragraph)
        for sentence in _SENTENCE_END.split(joined):
            if sentence.strip():
                yield Unit(start, _clean(sentence))
        paragraph.clear()

    for number, raw in enumerate(lines, 1):
        line = raw.rstrip()
        if line.lstrip().startswith("```"):
            fenced = not fenced
            yield from flush()
            continue
        if fenced:
            continue
        if line.lstrip().startswith("|"):
            if header is None:
                if paragraph:
                    caption = " ".join(t for _, t in paragraph)
                yield from flush()
                header = line
            elif not re.fullmatch(r"\|[\s:|-]*\|?", line.strip()):
                yield Unit(number, _clean(line), _clean(caption), _clean(header))
            continue
        header = None
        if not line.strip() or line.lstrip().startswith("#"):
            if paragraph:
                caption = " ".join(t for _, t in paragraph)
            yield from flush()
            continue
        if re.match(r"\s*(?:[-*]|\d+\.)\s", line):  # a list item starts a paragraph of its own
            yield from flush()
        paragraph.append((number, line))
    yield from flush()


_P_VALUE = re.compile(r"\bp\s*(?:=|<|≤)\s*[\d.]|\bp \(|Holm p\b")
# "no family trains significantly better or worse", "not significant", "no significant difference": a
# statement that a test did not reject, which claims no difference (the words that would are ruled above)
_NEGATED = re.compile(r"\b(?:no|not|nor|neither|none)\b(?:\s+[\w-]+){0,4}?\s+significant(?:ly)?"
                      r"(?:\s+(?:better|worse|lower|higher)(?:\s+or\s+(?:better|worse|lower|higher))?)?", re.IGNORECASE)


def _affirmed(text: str) -> str:
    """`text` without its negated significance statements."""
    return _NEGATED.sub("", text)


def _names_correction(text: str) -> bool:
    return "Holm" in text


def _compared(unit: Unit) -> bool:
    """A comparison's statistic: a p value and the correction in the sentence, or a row of a table whose
    header or caption gives both."""
    text = unit.context + " " + unit.text
    return _names_correction(text) and bool(_P_VALUE.search(text))


def _equivalence(unit: Unit) -> bool:
    text = unit.text + " " + unit.context
    return ("TOST" in text or "equivalence test" in text) and "margin" in text


def _belief_or_measurement(unit: Unit) -> bool:
    return bool(re.search(r"\bwe believe\b|\bnot measured\b|\bnothing here measures\b|\bhypothes|results/",
                          unit.text, re.IGNORECASE))


def _corrected_or_said_uncorrected(unit: Unit) -> bool:
    text = unit.text + " " + unit.context
    return _names_correction(text) or "uncorrected" in text


def _speed_ratio(unit: Unit) -> bool:
    # a measured speed ratio ("beat X by 1.75×") is a benchmark's number, not a comparison over seeds
    return bool(re.search(r"\d×", unit.text))


# (what the words claim, the words, what must stand beside them)
RULES: list[tuple[str, re.Pattern[str], Callable[[Unit], bool]]] = [
    ("a comparison needs its p value and the correction (Holm)",
     re.compile(r"\b(?:better|worse|outperforms?)\b", re.IGNORECASE), _compared),
    ("\"beats\" needs a paired test with its p value and the correction, or a measured ratio",
     re.compile(r"\bbeats?\b", re.IGNORECASE), lambda u: _compared(u) or _speed_ratio(u)),
    ("an equality or an excluded cause needs an equivalence test (TOST) against a stated margin",
     re.compile(r"\b(?:indistinguishable|equivalent|ruled out|rules out|no (?:measurable )?cost|no larger than)\b",
                re.IGNORECASE), _equivalence),
    ("\"is the one\" is a claim about all the others: their tests, corrected",
     re.compile(r"\b(?:is|are|was|were) the one\b", re.IGNORECASE),
     lambda u: _names_correction(u.text) and bool(_P_VALUE.search(u.text))),
    ("a significant result says whether it is corrected",
     re.compile(r"\bsignificant(?:ly)?\b", re.IGNORECASE), _corrected_or_said_uncorrected),
    ("an unmeasured cause is said as a belief, or cites its measurement",
     re.compile(r"\bbound by\b", re.IGNORECASE), _belief_or_measurement),
]


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def _verdict_cell(unit: Unit) -> tuple[str, str] | None:
    """(the verdict column's header with the table's caption, the row's verdict cell), for a row of a table
    with a column headed "verdict ..."; None otherwise."""
    if not unit.header:
        return None
    columns = _cells(unit.header)
    index = next((i for i, c in enumerate(columns) if c.lower().startswith("verdict")), None)
    cells = _cells(unit.text)
    if index is None or index >= len(cells):
        return None
    return f"{unit.caption} {columns[index]}", cells[index]


def faults(text: str) -> list[tuple[int, str, str]]:
    """Every (line, rule, unit) of `text` whose words are stronger than what stands beside them, and every
    table whose verdict column judges a difference without naming the correction."""
    found = []
    for unit in units(text):
        for rule, words, backed in RULES:
            if words.search(_affirmed(unit.text)) and not backed(unit):
                found.append((unit.line, rule, unit.text.strip()[:160]))
        verdict = _verdict_cell(unit)
        if verdict is not None and re.search(r"\b(?:better|worse|difference|significant)\b", verdict[1]) and \
                not _names_correction(verdict[0]):
            found.append((unit.line, "a verdict column names its correction", unit.text.strip()[:160]))
    return found


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_page_says_no_more_than_its_statistics(page):
    found = faults(page.read_text())
    assert not found, "\n".join(f"{page.relative_to(REPO)}:{line}: {rule}: {text}" for line, rule, text in found)


# The sentences the review found on the pages (before they were rewritten): each is a fault the check sees.
QUOTED = [
    "Residual and gated are above Table 1 at every depth from d = 10 on, and gated and residual are "
    "indistinguishable over 5 seeds at every depth (the paired tests above), where the paper finds gated ahead.",
    "Neither the error nor k moves, so BatchNorm's constants are ruled out as the cause.",
    "The relu gate is the one whose trained values say which blocks can go.",
    "In 4 of 5 seeds the removed half also takes live blocks, those of smallest k, at no measurable cost either.",
    "It keeps 95.0% of its accuracy, and removing the blocks of smallest k first beats random removal (+1.44 "
    "points over the first half).",
    "The stacks are bound by kernel launches, not arithmetic.",
    "- **d = 2, gated − residual** over 5 seeds: last epoch -0.242 points (p = 0.021: gated better).",
    "Paired t-test (two-sided) over seeds; a verdict only at p < 0.05 with n ≥ 3\n\n"
    "| d | family | n | gate order − random (pp) | p | verdict |\n|---|---|---|---|---|---|\n"
    "| 20 | gated | 5 | +1.77 | 0.0081 | gate order better |",
    "Removal (where significant at p < 0.05): gated at d = 20 (p = 0.0081).",
]


@pytest.mark.parametrize("text", QUOTED)
def test_the_sentences_the_review_quoted_are_faults(text):
    assert faults(text), text


# What the pages say instead: the same findings with their statistics.
BACKED = [
    "Gated − residual: no difference detected (95% CI [-0.08, +0.27] points; Holm p = 1).",
    "Against a margin of each cell's gap to Table 1, an equivalence test (TOST) shows the change smaller than the "
    "gap in 4 of 6 cells, so BatchNorm's constants are ruled out as the whole cause there.",
    "gated better than residual-nf at d = 100 (gated − residual-nf -0.89 points, p = 0.00057, Holm p = 0.017).",
    "Caption, p uncorrected and Holm-corrected\n\n| d | p | p (Holm) | verdict (Holm) |\n|---|---|---|---|\n"
    "| 20 | 0.0081 | 0.11 | no difference detected |\n| 50 | 6.6e-05 | 0.0013 | gate order better |",
    "We believe the stacks are bound by kernel launches rather than arithmetic; nothing here measures it.",
    "No family trains significantly better or worse than the 2017 gate, even before correction.",
    "Stacked batched products beat `torch.func.vmap` by 1.75×.",
    "The paper: \"slightly better\".",
]


@pytest.mark.parametrize("text", BACKED)
def test_the_same_findings_with_their_statistics_pass(text):
    assert not faults(text), faults(text)
