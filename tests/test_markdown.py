"""README.md and docs/*.md parse as GitHub renders them (CommonMark, markdown-it-py): every fenced block
is closed where its author meant, every heading is a heading, and every link to an anchor or a file of
the repository points at something that exists (issue 22: a fence that did not close swallowed five
sections of the README and killed its Contents links)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable("table")


def slug(text: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of `text`'s headings as GitHub makes them (a repeated slug gets -1, -2, ...)."""
    tokens = _parser().parse(text)
    seen: dict[str, int] = {}
    out = set()
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            inline = tokens[i + 1]
            plain = "".join(c.content for c in (inline.children or []) if c.type in ("text", "code_inline"))
            base = slug(plain)
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text: str) -> list[str]:
    """Every link and image target of `text` (not inside code)."""
    out = []
    for token in _parser().parse(text):
        for child in token.children or []:
            if child.type == "link_open":
                out.append(str(child.attrs["href"]))
            elif child.type == "image":
                out.append(str(child.attrs["src"]))
    return out


def swallowing_fences(text: str) -> list[str]:
    """Fenced blocks whose content looks like markdown that was meant to be outside: a line that
    opens with a fence (a closing fence CommonMark did not accept, e.g. "``` Analyses live in") or
    a heading of level 2 or more."""
    bad = []
    for token in _parser().parse(text):
        if token.type == "fence":
            for line in token.content.splitlines():
                if re.match(r"\s{0,3}(```|~~~)", line) or re.match(r"#{2,6} \S", line):
                    bad.append(f"line {token.map[0] + 1 if token.map else '?'}: {line!r}")
    return bad


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_no_fenced_block_swallows_markdown(page: Path) -> None:
    assert swallowing_fences(page.read_text()) == []


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_anchor_and_file_link_resolves(page: Path) -> None:
    text = page.read_text()
    broken = []
    for target in links(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...: not checked here (no network)
            continue
        path_part, _, anchor = target.partition("#")
        file = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not file.exists():
            broken.append(f"{target}: {file} does not exist")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(f"{target}: no heading with anchor #{anchor} in {file.relative_to(ROOT)}")
    assert broken == []


def test_the_checks_catch_the_bug_issue_22_found() -> None:
    # The README's old Python block ended with "``` Analyses live in": not a closing fence, so the
    # block ran on and the "## Models" heading below it was code; its Contents link then died.
    text = ("## Contents\n\n[Models](#models)\n\n```python\nprint(1)\n``` Analyses live in\n`x`.\n\n"
            "## Models\n\ntext\n")
    assert swallowing_fences(text) and "models" not in anchors(text)
    fixed = text.replace("``` Analyses live in", "```\n\nAnalyses live in")
    assert swallowing_fences(fixed) == [] and "models" in anchors(fixed)
    assert slug("1. The MNIST depth study (gated-residual-v2 Tables 1 and 2, figure 4)") == \
        "1-the-mnist-depth-study-gated-residual-v2-tables-1-and-2-figure-4"
