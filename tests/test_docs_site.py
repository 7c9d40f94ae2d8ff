"""The documentation site as a reader meets it: it works offline (no script or stylesheet from a CDN,
code highlighted when the site is built), a wide table can be read whole, and the home page leads to
every page of the navigation."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _config() -> dict[str, Any]:
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)  # no !!python tags here


def _nav_pages(nav: Any) -> list[str]:
    """Every page file of mkdocs.yml's `nav`, at any depth."""
    if isinstance(nav, str):
        return [nav] if nav.endswith(".md") else []
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return [page for item in nav for page in _nav_pages(item)]


def test_the_theme_loads_nothing_from_a_cdn_and_highlights_at_build_time():
    config = _config()
    # the readthedocs theme loads highlight.js from cdnjs unless this is off
    assert config["theme"].get("highlightjs") in ("false", "False"), "theme.highlightjs must be false"
    extensions = [e if isinstance(e, str) else next(iter(e)) for e in config.get("markdown_extensions", [])]
    assert "pymdownx.highlight" in extensions and "pymdownx.superfences" in extensions
    for asset in config.get("extra_css", []) + config.get("extra_javascript", []):
        assert not re.match(r"(https?:)?//", asset), f"{asset}: from the network"
        assert (DOCS / asset).is_file(), f"{asset}: not in docs/"
    assert ".highlight .k " in (DOCS / "css" / "pygments.css").read_text()  # the keywords' colour


def test_a_wide_table_scrolls_with_its_first_column_kept():
    css = re.sub(r"/\*.*?\*/", "", (DOCS / "css" / "extra.css").read_text(), flags=re.S)
    rules = {selector.strip(): body for selector, body in re.findall(r"([^{}]+)\{([^}]*)\}", css)}
    box = [body for selector, body in rules.items() if selector.endswith(".wy-table-responsive")]
    assert box and "overflow-x: auto" in box[0]  # wider than the column: scrolled, not clipped
    first = [body for selector, body in rules.items() if "td:first-child" in selector and "position" in body]
    assert first and "position: sticky" in first[0] and "left: 0" in first[0]
    assert "css/extra.css" in _config()["extra_css"]


def test_the_home_page_links_every_page_of_the_navigation():
    linked = set(re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", (DOCS / "index.md").read_text()))
    missing = [page for page in _nav_pages(_config()["nav"]) if page != "index.md" and page not in linked]
    assert missing == [], "docs/index.md lists every page of mkdocs.yml's nav"


def test_the_navigation_check_sees_nested_sections():
    nav = [{"Home": "index.md"}, {"Reproductions": [{"A": "reproductions/a.md"}, {"B": [{"C": "c.md"}]}]}]
    assert _nav_pages(nav) == ["index.md", "reproductions/a.md", "c.md"]


@pytest.mark.slow
def test_the_built_site_holds_no_cdn_reference_and_highlighted_code(tmp_path: Path):
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    remote = re.compile(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=\"(?:https?:)?//[^\"]*\"")
    found = {}
    for path in site.rglob("*"):
        if path.suffix in (".html", ".js", ".css"):
            text = path.read_text(encoding="utf-8", errors="replace")
            hits = remote.findall(text) + re.findall(r"\bcdnjs\b|\bcdn\.jsdelivr\b|\bunpkg\.com\b", text)
            if hits:
                found[str(path.relative_to(site))] = hits[:3]
    assert found == {}, "the site loads these from the network"
    install = (site / "install.html").read_text()
    assert '<div class="highlight">' in install and '<span class="' in install  # highlighted at build time
