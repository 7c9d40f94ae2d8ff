"""docs/design.md: imports flow downwards only."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "throughway"

# room -> rooms of the package it may import (besides itself and the stdlib-only _io module)
ALLOWED = {
    "layers": set(),
    "models": {"layers"},
    "data": set(),
    "train": {"models", "data", "layers"},
    "analysis": {"models", "layers", "data", "train"},
    "report": set(),
    "experiments": {"layers", "models", "data", "train", "analysis", "report"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    rooms = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module.startswith("throughway."):
                rooms.add(node.module.split(".")[1])
            elif node.level >= 2 and node.module:
                rooms.add(node.module.split(".")[0])
            elif node.level >= 2:
                rooms.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("throughway."):
                    rooms.add(alias.name.split(".")[1])
    return rooms


def test_imports_flow_downwards():
    violations = []
    for room, allowed in ALLOWED.items():
        for path in (PACKAGE / room).rglob("*.py"):
            for imported in _imports(path) - {room, "_io"}:
                if imported not in allowed:
                    violations.append(f"{path.relative_to(PACKAGE)} imports {imported}")
    assert not violations, violations


def test_layering_check_sees_relative_imports():
    # The checker itself must notice a two-dot import, or the test above could never fail.
    assert "layers" in _imports(PACKAGE / "models" / "mlp.py")
    assert "models" in _imports(PACKAGE / "train" / "checkpoint.py")
