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
    "study": {"layers", "models", "data", "train", "analysis", "report"},
    "experiments": {"layers", "models", "data", "train", "analysis", "report", "study"},
    # The `throughway analyze` command's work on finished runs (issue 33: was in study/).
    "analyze_runs": {"layers", "models", "data", "train", "analysis", "report", "study"},
    # Optional integrations with other frameworks: nothing of the package imports them.
    "integrations": {"layers", "models", "data", "train", "analysis"},
    # The command line is the top: it may use every room, and nothing imports it.
    "cli": {"layers", "models", "data", "train", "analysis", "report", "study", "experiments", "analyze_runs"},
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


def _module_imports(path: Path, *, everywhere: bool = False, name: str | None = None) -> set[str]:
    """Modules of the package that `path` imports at module level (not inside functions); with
    `everywhere`, every import in the file: also those under `if TYPE_CHECKING:` and inside functions.
    `name`: the module's dotted name, when `path` does not lie in the package (a probe)."""
    tree = ast.parse(path.read_text())
    package = tuple(name.split(".")) if name else path.relative_to(PACKAGE.parent).with_suffix("").parts
    if package[-1] == "__init__":
        package = package[:-1]
        here = package
    elif name and path.name == "__init__.py":
        here = package
    else:
        here = package[:-1]
    out = set()
    for node in (ast.walk(tree) if everywhere else tree.body):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                target = ".".join(base + tuple((node.module or "").split("."))).strip(".")
            else:
                target = node.module or ""
            if target.startswith("throughway"):
                out.add(target)
                out.update(f"{target}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("throughway"))
    return out


def test_no_module_level_import_circle():
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph = {name: {m for m in _module_imports(path) if m in modules and m != name} for name, path in modules.items()}
    # A package's __init__ importing its own submodules is how it exposes them, not a circle.
    for name in graph:
        graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, cycles


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its __init__.py)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else ""


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of `graph` with more than one module (Tarjan): each a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _static_import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of its own room that it imports anywhere: at module level, under
    `if TYPE_CHECKING:` and inside functions (a function-local import only hides a circle from
    Python, not from a reader or a type checker). A package's __init__ importing its own
    submodules is how it exposes them, not a circle, and `from . import x` names module x only."""
    graph = {}
    for name, path in modules.items():
        imported = {m for m in _module_imports(path, everywhere=True, name=name) if m in modules and m != name}
        imported = {m for m in imported if not m.startswith(name + ".")}
        # `from . import x` yields the package and the package.x: keep the submodule only.
        imported -= {m for m in imported if any(other.startswith(m + ".") for other in imported)}
        graph[name] = {m for m in imported if _room(m) == _room(name)}
    return graph


# Circles still owed, each with the reason it stays (none: the study machinery's circle with study.shards went
# when the study folder's lock moved beside the shards' locks).
CIRCLES_OWED: list[set[str]] = []


def test_no_import_circle_within_a_room_even_counting_type_checking_and_local_imports():
    # docs/design.md: within a room too, modules import downwards only, and the annotations say the same.
    circles = [sorted(c) for c in _circles(_static_import_graph(_modules())) if c not in CIRCLES_OWED]
    assert not circles, "; ".join(" ⇄ ".join(c) for c in circles)


def test_the_static_circle_check_sees_every_kind_of_import(tmp_path):
    import textwrap

    probe = tmp_path / "_circle_probe.py"  # read as if it were throughway/train/_circle_probe.py
    probe.write_text(textwrap.dedent("""
        from typing import TYPE_CHECKING
        from . import distributed
        if TYPE_CHECKING:
            from .loop import TrainState
        def f():
            from throughway.train.rundir import RunDir
    """))
    graph = _static_import_graph({**_modules(), "throughway.train._circle_probe": probe})
    assert graph["throughway.train._circle_probe"] == {
        "throughway.train.distributed", "throughway.train.loop", "throughway.train.rundir"}
    graph["throughway.train.rundir"] = graph["throughway.train.rundir"] | {"throughway.train._circle_probe"}
    assert any({"throughway.train._circle_probe", "throughway.train.rundir"} <= c for c in _circles(graph))


def test_the_model_registry_is_a_leaf():
    assert not {m for m in _module_imports(PACKAGE / "models" / "registry.py") if m.startswith("throughway.models")}
    # and the families register themselves when the package is imported
    from throughway.models import list_models

    assert {"mlp_gated_residual", "preact_resnet", "wide_resnet", "highway_conv", "shortcut_net"} <= {
        e.name for e in list_models()}


def test_the_circle_check_sees_relative_module_imports():
    # The graph above must contain real edges, or the circle test could never fail.
    assert "throughway.models.registry" in _module_imports(PACKAGE / "models" / "mlp.py")
    assert "throughway.models.base" in _module_imports(PACKAGE / "models" / "__init__.py")


def test_nothing_imports_the_command_line():
    importers = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if "cli" in _imports(p) and p.relative_to(PACKAGE).parts[0] != "cli"]
    assert importers == [] or set(importers) <= {"__main__.py"}, importers


def _other_experiments(module: str, path: Path) -> set[str]:
    """The experiment modules that experiment `module` (dotted name, at `path`) imports anywhere in its
    file, but its own `<study>_report` companion (docs/design.md: a large study's tables and findings
    beside it)."""
    experiments = {m for m in _modules() if m.startswith("throughway.experiments.")}
    return {m for m in _module_imports(path, everywhere=True, name=module)
            if m in experiments and m not in (module, f"{module}_report")}


def test_no_experiment_imports_another_experiments_helpers():
    # docs/design.md: what two studies share lives in study/ or report/, never in one experiment that the
    # other imports (the experiments' __init__ only lists them for the command line).
    importers = {str(path.relative_to(PACKAGE)): sorted(found) for module, path in _modules().items()
                 if module.startswith("throughway.experiments.") and (found := _other_experiments(module, path))}
    assert not importers, importers


def test_the_experiment_check_sees_one(tmp_path):
    import textwrap

    probe = tmp_path / "_probe.py"  # read as if it were throughway/experiments/layer_drop.py
    probe.write_text(textwrap.dedent("""
        from .layer_drop_report import table
        def f():
            from .gate_family import GATED_FAMILIES
        from throughway.experiments.mnist_depth_report import findings_markdown
    """))
    assert _other_experiments("throughway.experiments.layer_drop", probe) == {
        "throughway.experiments.gate_family", "throughway.experiments.mnist_depth_report"}


def _private_imports(path: Path) -> list[str]:
    """`from <module of the package> import _name` anywhere in `path`: another module's private name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("throughway")):
            found += [f"{node.module or '.'}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


# Rooms still importing other modules' private names (none since issue 21; a room goes here only with
# a reason beside it).
PRIVATE_IMPORTS_OWED: set[str] = set()


def test_no_module_imports_another_modules_private_names():
    violations = {str(p.relative_to(PACKAGE)): found for p in PACKAGE.rglob("*.py")
                  if p.relative_to(PACKAGE).parts[0] not in PRIVATE_IMPORTS_OWED and (found := _private_imports(p))}
    assert not violations, violations


def test_the_private_name_check_sees_one():
    import textwrap

    path = PACKAGE.parent.parent / "tests" / "_layering_probe.py"
    path.write_text(textwrap.dedent("""
        from .checkpoint import _is_int, check_history
        from throughway.train.stacked import _MIXED_FAMILY
    """))
    try:
        assert _private_imports(path) == ["checkpoint._is_int", "throughway.train.stacked._MIXED_FAMILY"]
    finally:
        path.unlink()


def test_the_package_does_not_hold_or_import_the_repository_tooling():
    # The docs renderer (tools/readme) is tooling for this checkout, not something a user imports.
    assert not (PACKAGE / "readme.py").exists() and not (PACKAGE / "readme_sections").exists()
    importers = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(n == "tools" or n.startswith("tools.") for n in names):
                importers.append(str(path.relative_to(PACKAGE)))
    assert importers == [], importers
