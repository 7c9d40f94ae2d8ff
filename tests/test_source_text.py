"""What the package's source says to its reader: a comment gives the reason, not a tracker number."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "throughway"

# Files still being rewritten elsewhere; their comments are replaced with the reasons next.
NOT_YET: set[str] = set()

# "issue 25", "issues 3-6", "Issue 31, item 10": a number the repository does not hold, which tells
# a reader nothing about why the code is as it is.
ISSUE_NUMBER = re.compile(r"\bissues? #?\d", re.IGNORECASE)


def _cited(text: str) -> list[str]:
    return [f"line {n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if ISSUE_NUMBER.search(line)]


def test_no_comment_or_docstring_cites_an_issue_number():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative not in NOT_YET and (lines := _cited(path.read_text(encoding="utf-8"))):
            found[relative] = lines
    assert not found, f"say the reason instead of the issue number: {found}"


def test_the_issue_number_check_sees_one():
    assert _cited("x = 1  # (issue 25, finding 9)\n") and _cited('"""Figures (Issue 24)."""')
    assert _cited("# before issues 3-6") and not _cited("# the issue: a BatchNorm of one sample")
