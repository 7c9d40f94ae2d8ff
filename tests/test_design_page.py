"""docs/design.md is the map of the code: every module, path and dotted name it names exists.

The map (the fenced block under "Rooms and who may import whom") is read room by room. A room names a
module as `name.py`, as one of its list items `name (what it holds)` or a bare `name` between commas,
semicolons or colons outside parentheses, or (train/, whose header ends with a colon) in the first column
of its table. Anywhere on the page, a path such as `train/stack.py` must exist in the repository or in
src/throughway, and a dotted name such as `layers.blocks.find_branches` must import.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "design.md"
PACKAGE = "src/throughway"
# The package's rooms: a dotted name on the page that starts with one of them is looked up in the package.
ROOMS = ("layers", "models", "data", "train", "analysis", "study", "experiments", "analyze_runs", "report",
         "integrations", "cli")

_HEADER = re.compile(r"^( {0,2})([a-z_]+)/(?: +(.*))?$")  # "  train/   one training core..." or "tools/  ..."
_MODULE_FILE = re.compile(r"(?<![\w<>/.-])([a-z_][a-z0-9_]*)\.py\b")  # "blocks.py", not "<study>_report.py"
_TABLE_ROW = re.compile(r"^ {15}([a-z_][a-z0-9_]*) +\S")  # "               stack     train_stacked: ..."
_ITEM = re.compile(r"\s*([a-z_][a-z0-9_]*)(?: \(\))?\s*")  # "runner ()" once the parentheses are emptied
_PATH = re.compile(r"(?<![\w/.-])((?:[\w-]+/)+[\w-]+\.(?:py|sh))\b")
_DOTTED = re.compile(r"`((?:throughway\.)?(?:" + "|".join(ROOMS) + r")(?:\.\w+)+)[`(]")


def _map_block(page: str) -> str:
    return page.split("## Rooms", 1)[1].split("```", 2)[1]


def rooms(page: str) -> dict[str, list[str]]:
    """The map's rooms: folder (src/throughway/<room> for the package's, else as written) -> its lines, the
    header's text first, each without its "-> imports" tail."""
    out: dict[str, list[str]] = {}
    current = None
    for line in _map_block(page).splitlines():
        line = re.sub(r"\s*->.*$", "", line)
        if match := _HEADER.match(line):
            indent, name, rest = match.groups()
            current = f"{PACKAGE}/{name}" if indent else name
            out[current] = [" " * 15 + (rest or "")]
        elif current is not None and line.strip():
            out[current].append(line)
    return out


def _items(text: str) -> list[str]:
    """`text` split at the commas, semicolons and colons outside parentheses, each parenthesis emptied
    ("runner (Study: ...)" becomes "runner ()")."""
    depth, item, items = 0, [], []
    for ch in text:
        if ch == "(":
            depth += 1
            if depth == 1:
                item.append("(")
        elif ch == ")":
            depth -= 1
            if depth == 0:
                item.append(")")
        elif depth == 0:
            if ch in ",;:":
                items.append("".join(item))
                item = []
            else:
                item.append(ch)
    items.append("".join(item))
    return items


def named_modules(page: str) -> dict[str, set[str]]:
    """room folder -> the module files (paths from the repository root) the map names in it."""
    named = {}
    for room, lines in rooms(page).items():
        text = " ".join(line.strip() for line in lines)
        names = set(_MODULE_FILE.findall(text))
        if lines[0].rstrip().endswith(":"):  # a table: one module per row
            names |= {m.group(1) for line in lines[1:] if (m := _TABLE_ROW.match(line))}
        elif room.startswith(PACKAGE):
            names |= {m.group(1) for item in _items(text) if (m := _ITEM.fullmatch(item))}
        named[room] = {f"{room}/{name}.py" for name in names}
    return named


def problems(page: str, root: Path = ROOT) -> list[str]:
    """What the page names that is not there, one line each (empty when the map matches the tree)."""
    found = []
    for room, files in named_modules(page).items():
        if not (root / room).is_dir():
            found.append(f"room {room}/ is not a folder")
        found += [f"{path} (named in {room}/) does not exist" for path in sorted(files) if not (root / path).is_file()]
    for path in sorted(set(_PATH.findall(page))):
        if not ((root / path).is_file() or (root / PACKAGE / path).is_file()):
            found.append(f"{path} does not exist")
    for dotted in sorted(set(_DOTTED.findall(page))):
        parts = dotted.removeprefix("throughway.").split(".")
        for k in range(len(parts), 0, -1):
            module_name = "throughway." + ".".join(parts[:k])
            if (root / PACKAGE / Path(*parts[:k])).with_suffix(".py").is_file() or \
                    (root / PACKAGE / Path(*parts[:k]) / "__init__.py").is_file():
                break
        else:
            found.append(f"{dotted}: no module of the package")
            continue
        obj = importlib.import_module(module_name)
        for attribute in parts[k:]:
            if not hasattr(obj, attribute):
                found.append(f"{dotted}: {module_name} has no {'.'.join(parts[k:])}")
                break
            obj = getattr(obj, attribute)
    return found


def test_every_module_path_and_name_the_design_page_names_exists():
    assert problems(PAGE.read_text()) == []


def test_the_map_is_read_room_by_room():
    # The check reads something in every room it can, or it could never fail: each of the package's rooms
    # names modules (experiments/ names none: one file per paper table or figure).
    named = named_modules(PAGE.read_text())
    assert {room.removeprefix(PACKAGE + "/") for room in named if room.startswith(PACKAGE)} == set(ROOMS)
    assert all(named[f"{PACKAGE}/{room}"] for room in ROOMS if room != "experiments")
    assert {f"{PACKAGE}/train/stack.py", f"{PACKAGE}/train/batched.py"} <= named[f"{PACKAGE}/train"]
    assert {f"{PACKAGE}/study/runner.py", f"{PACKAGE}/study/spec.py", f"{PACKAGE}/study/stacking.py"} <= \
        named[f"{PACKAGE}/study"]
    assert {f"{PACKAGE}/layers/known_blocks.py", f"{PACKAGE}/layers/adapters.py"} <= named[f"{PACKAGE}/layers"]
    assert f"{PACKAGE}/cli/__init__.py" in named[f"{PACKAGE}/cli"]
    assert named["tools"] == {"tools/mkdocs_results.py", "tools/trace_calls.py"}
    # a function in a module's parentheses, or a phrase, is not a module
    assert not any("add_gates" in path or "units" in path for files in named.values() for path in files)


def test_the_check_fails_when_a_named_file_is_missing():
    page = PAGE.read_text()
    edits = {
        "spec (RunSpec": "specs (RunSpec",  # a room's list item
        "               stack     train_stacked": "               stacks    train_stacked",  # train/'s table
        "adapters.py (add_gates": "adaptors.py (add_gates",  # name.py in the map
        "`train/stack.py`": "`train/stacks.py`",  # a path outside the map
        "`layers.blocks.find_branches`": "`layers.blocks.find_branch`",  # a dotted name
        "`report.figures.save_figure`": "`report.figure.save_figure`",
    }
    for old, new in edits.items():
        assert page.count(old) >= 1, old
        page = page.replace(old, new)
    assert problems(page) == [
        f"{PACKAGE}/layers/adaptors.py (named in {PACKAGE}/layers/) does not exist",
        f"{PACKAGE}/train/stacks.py (named in {PACKAGE}/train/) does not exist",
        f"{PACKAGE}/study/specs.py (named in {PACKAGE}/study/) does not exist",
        "train/stacks.py does not exist",
        "layers.blocks.find_branch: throughway.layers.blocks has no find_branch",
        "report.figure.save_figure: throughway.report has no figure.save_figure",
    ]
