"""README.md and docs/*.md parse as GitHub renders them (CommonMark, markdown-it-py): every fenced block
is closed where its author meant, every heading is a heading, and every link to an anchor or a file of
the repository points at something that exists (issue 22: a fence that did not close swallowed five
sections of the README and killed its Contents links)."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any
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


# --------------------------------------------------------------------------------------------
# The docs site as mkdocs renders it: Python-Markdown (not CommonMark) over every page, and over the
# docstrings mkdocstrings shows on the API pages. Python-Markdown needs a blank line before a list that
# follows a paragraph line; without it the list is the paragraph's text, with literal "- " in it.

DOCS = sorted((ROOT / "docs").rglob("*.md"))
SRC = ROOT / "src"


def site_extensions() -> list[Any]:
    """The Python-Markdown extensions of the site: mkdocs' own (toc, tables, fenced_code) and those
    mkdocs.yml lists under markdown_extensions."""
    import yaml

    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)  # no !!python tags here
    listed = config.get("markdown_extensions") or []
    names = [e if isinstance(e, str) else next(iter(e)) for e in listed]
    return ["toc", "tables", "fenced_code", *[n for n in names if n not in ("toc", "tables", "fenced_code")]]


def run_on_lists(text: str) -> list[str]:
    """The paragraphs of `text`, rendered by Python-Markdown as the site renders it, that hold a line
    starting like a list item ("- ", "* ", "+ ", "1. "): a list the renderer did not see."""
    import markdown

    html = markdown.markdown(text, extensions=site_extensions())
    bad = []
    for paragraph in re.findall(r"<p>(.*?)</p>", html, flags=re.S):
        for line in paragraph.splitlines()[1:]:
            if re.match(r"\s*(?:[-*+]|\d+\.)\s+\S", line):
                bad.append(f"{paragraph.splitlines()[0][:60]!r} ... {line.strip()[:60]!r}")
    return bad


@pytest.mark.parametrize("page", DOCS, ids=_page_id)
def test_docs_page_lists_render_as_lists_on_the_site(page: Path) -> None:
    assert run_on_lists(page.read_text()) == [], "a list needs a blank line before it (Python-Markdown)"


def _api_objects() -> list[str]:
    """The objects the API pages render (`::: throughway.x` lines of docs/api/*.md)."""
    return sorted({m for page in (ROOT / "docs" / "api").glob("*.md")
                   for m in re.findall(r"^::: (\S+)", page.read_text(), flags=re.M)})


@functools.lru_cache(maxsize=1)  # griffe reads the whole package: once for the two tests below
def shown_docstrings() -> dict[str, str]:
    """Every docstring text that mkdocstrings shows on the API pages, by the object's path: the module's,
    and those of its public members (options of mkdocs.yml: filters "!^_", no undocumented members),
    recursively into classes; Google-style sections parsed as griffe parses them (their descriptions
    are markdown too)."""
    import logging

    import griffe

    logging.getLogger("griffe").setLevel(logging.ERROR)
    loader = griffe.GriffeLoader(search_paths=[str(SRC)])
    package = loader.load("throughway")
    texts: dict[str, str] = {}

    def visit(obj: Any, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            parts = []
            for section in obj.docstring.parse("google"):
                if isinstance(section.value, str):
                    parts.append(section.value)
                elif isinstance(section.value, list):
                    parts += [str(getattr(item, "description", "") or "") for item in section.value]
            texts[obj.path] = "\n\n".join(parts)
        if obj.is_module or obj.is_class:
            for name, member in obj.members.items():
                if name.startswith("_") or member.is_alias and not obj.is_module:
                    continue
                try:
                    target = member.final_target if member.is_alias else member
                except Exception:  # an alias outside the package: not rendered by path here
                    continue
                if member.is_alias and not target.path.startswith("throughway"):
                    continue
                visit(target, seen)

    seen: set[str] = set()
    for path in _api_objects():
        visit(package[path.removeprefix("throughway.")] if path != "throughway" else package, seen)
    return texts


def test_api_docstrings_render_lists_as_lists_on_the_site() -> None:
    bad = {path: found for path, text in shown_docstrings().items() if (found := run_on_lists(text))}
    assert bad == {}, "a list needs a blank line before it (Python-Markdown)"


def test_the_list_check_catches_a_list_glued_to_its_paragraph() -> None:
    # docs/guide.md's Data section, as it was: CommonMark renders a list, Python-Markdown a paragraph
    glued = "The data sets:\n- MNIST\n- Fashion-MNIST\n"
    assert run_on_lists(glued) and not run_on_lists(glued.replace(":\n", ":\n\n"))
    assert run_on_lists("Steps:\n1. load\n2. train\n")
    assert run_on_lists("a - b\nc\n") == []  # a dash inside a line is no list


# --------------------------------------------------------------------------------------------
# No internal tracker references ("issue 24", "issue 25, finding 5") where a reader outside the project
# meets them: the docs pages (the generated blocks included), the docstrings the API pages show, the
# README and every `--help`. CHANGELOG.md keeps its own.

TRACKER = re.compile(r"\b[Ii]ssues? #?\d+")


def help_texts() -> dict[str, str]:
    """`throughway ... --help` of the program and of every sub-command, at any depth."""
    import argparse

    from throughway.cli import build_parser

    texts: dict[str, str] = {}

    def visit(parser: argparse.ArgumentParser, name: str) -> None:
        texts[name] = parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    visit(child, f"{name} {sub}")

    visit(build_parser(), "throughway")
    return texts


def test_no_tracker_reference_on_the_site_in_the_readme_or_in_help() -> None:
    found = {str(p.relative_to(ROOT)): TRACKER.findall(p.read_text()) for p in [ROOT / "README.md", *DOCS]}
    found |= {f"docstring of {path}": TRACKER.findall(text) for path, text in shown_docstrings().items()}
    found |= {f"{name} --help": TRACKER.findall(text) for name, text in help_texts().items()}
    assert {where: refs for where, refs in found.items() if refs} == {}, \
        "say what is meant instead of naming the project's tracker"
    assert TRACKER.search("the gate-family study (issue 24)") and not TRACKER.search("tissue 3D")
