"""What every README renderer reads with: a results file as JSON or text, a line that must match.

Each raises an error naming the file or the pattern, so a README block whose source is missing or
changed fails `python -m tools.readme --check` with a message that says which.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any


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


def _match(pattern: str, text: str, source: str) -> re.Match[str]:
    found = re.search(pattern, text)
    if found is None:
        raise ValueError(f"{source}: no line matches {pattern!r}")
    return found
