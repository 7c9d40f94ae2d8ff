"""What every README renderer reads with: a results file as JSON or text, a study's report file, a line that
must match.

Each raises an error naming the file or the pattern, so a README block whose source is missing or
changed fails `python -m tools.readme --check` with a message that says which.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable


def _json(root: Path, relative: str) -> Any:
    """The parsed JSON file root/relative; FileNotFoundError naming it when it is missing."""
    path = Path(root) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{path}: results file not found (a generated block reads it)")
    return json.loads(path.read_text())


def _text(root: Path, relative: str) -> str:
    """The text of root/relative; FileNotFoundError naming it when it is missing."""
    path = Path(root) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{path}: results file not found (a generated block reads it)")
    return path.read_text()


def _report_file(root: Path, study: str, name: str, make: Callable[[Any], str]) -> str:
    """The text of the report file root/study/name that the study's own report wrote (`throughway report`),
    checked against `make(results.json)`, the report function that writes it: the docs place the study's
    words, never words of their own. ValueError naming the file when the two differ (the report was not
    remade since results.json changed)."""
    text = _text(root, f"{study}/{name}")
    if text != make(_json(root, f"{study}/results.json")):
        raise ValueError(f"{Path(root) / study / name} differs from what its results.json gives: remake the report "
                         f"(`throughway report {Path(root) / study}`)")
    return text


def _match(pattern: str, text: str, source: str) -> re.Match[str]:
    found = re.search(pattern, text)
    if found is None:
        raise ValueError(f"{source}: no line matches {pattern!r}")
    return found
