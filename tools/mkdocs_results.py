"""MkDocs hook (mkdocs.yml `hooks:`): the figures a docs page shows from the repository's results/.

The pages under docs/ link their figures where they live, e.g. `../../results/mnist-depth/x.png`
from docs/reproductions/, so the link works on GitHub. MkDocs only serves files inside docs/, so
this hook adds every results/ file that a page links to the site as `results/...`, and rewrites the
page's link to that place. A link to a results/ file that does not exist is left as it is, and
`mkdocs build --strict` fails on it, naming the page and the link.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
RESULTS = REPOSITORY / "results"
# markdown links and images: ](target) or ](target "title")
LINK = re.compile(r"\]\((?P<target>[^)\s]+)(?P<rest>[^)]*)\)")


def _results_target(page_path: Path, target: str) -> Path | None:
    """The results/ file that `target`, relative to the page's source file, names (None otherwise)."""
    if re.match(r"[a-z]+:", target) or target.startswith("#"):
        return None
    resolved = (page_path.parent / target.split("#")[0]).resolve()
    return resolved if resolved.is_relative_to(RESULTS) else None


def on_files(files: Any, config: Any) -> Any:
    """Add each existing results/ file that some page links to as a site file `results/<path>`."""
    from mkdocs.structure.files import File

    docs = Path(config["docs_dir"])
    wanted: set[Path] = set()
    for page in docs.rglob("*.md"):
        for match in LINK.finditer(page.read_text(encoding="utf-8")):
            found = _results_target(page, match.group("target"))
            if found is not None and found.is_file():
                wanted.add(found)
    for path in sorted(wanted):
        files.append(File.generated(config, path.relative_to(REPOSITORY).as_posix(), abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Point the page's links into results/ at the copies `on_files` added (docs-relative paths)."""
    source = Path(page.file.abs_src_path)
    docs = Path(config["docs_dir"]).resolve()

    def rewrite(match: re.Match[str]) -> str:
        found = _results_target(source, match.group("target"))
        if found is None:
            return match.group(0)
        in_site = docs / found.relative_to(REPOSITORY)
        relative = os.path.relpath(in_site, source.parent.resolve()).replace(os.sep, "/")
        return f"]({relative}{match.group('rest')})"

    return LINK.sub(rewrite, markdown)
