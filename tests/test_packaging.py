"""Packaging: the built wheel declares torch as a lower bound, ships py.typed and the licence, and
installing it where a satisfying torch is present installs throughway alone (issue 14)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import throughway

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package built as a wheel from a copy of the checkout (so the tree itself is not touched)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "checkout"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(src)], check=True, capture_output=True, text=True)
    (built,) = out.glob("throughway-*.whl")
    return built


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(name).decode()


def test_torch_requirement_is_a_lower_bound(wheel: Path) -> None:
    requires = [Requirement(line.split(":", 1)[1].strip())
                for line in _metadata(wheel).splitlines() if line.startswith("Requires-Dist:")]
    (torch_req,) = [r for r in requires if r.name == "torch"]
    operators = {spec.operator for spec in torch_req.specifier}
    assert operators == {">="}, f"torch must be a lower bound only, got {torch_req}"
    # a user's older or CUDA build that meets the bound is accepted as it is
    for version in ("2.4.0", "2.5.1+cu121", "2.13.0+cpu", "3.0.0"):
        assert torch_req.specifier.contains(Version(version), prereleases=True), version
    assert not torch_req.specifier.contains("2.3.1")


def test_wheel_ships_type_marker_and_licence(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "throughway/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    assert (Path(throughway.__file__).parent / "py.typed").exists()


def test_wheel_does_not_ship_the_repository_tooling(wheel: Path) -> None:
    # The docs renderer (tools/readme, formerly throughway/readme.py and readme_sections/) reads a
    # checkout's results/ and docs/: tooling for this repository, not something a user imports.
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert any(n.startswith("throughway/cli/") for n in names)  # the wheel was read
    shipped = [n for n in names if "readme" in n.split("/")[-1] or "readme_sections" in n or n.startswith("tools/")]
    assert shipped == [], shipped


def test_installing_the_wheel_keeps_the_installed_torch(wheel: Path, tmp_path: Path) -> None:
    import torch

    report = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--no-index",
                    "--find-links", str(wheel.parent), "--report", str(report), str(wheel)],
                   check=True, capture_output=True, text=True)
    would_install = {item["metadata"]["name"] for item in json.loads(report.read_text())["install"]}
    assert would_install == {"throughway"}, f"installing the wheel would also install {would_install - {'throughway'}}"
    assert Version(torch.__version__.split("+")[0]) >= Version("2.4")
