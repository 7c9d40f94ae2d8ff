"""Figures: one save helper writes PNG, SVG or PDF (`--format`), drawing them leaves the user's matplotlib
backend alone, the TSDI figure labels its curves directly, and the conv highway figure carries the paper's
0.57% line (the highway paper's CIFAR-10 result)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest

from throughway.cli import main
from throughway.report import conv_plots, hessian_plots
from throughway.report.figures import current_figure_format, figure_format, save_figure

ROOT = Path(__file__).resolve().parents[1]
MAGIC = {"png": b"\x89PNG", "svg": b"<?xml", "pdf": b"%PDF"}


@pytest.mark.parametrize("fmt", ["png", "svg", "pdf"])
def test_save_figure_writes_the_requested_format(tmp_path: Path, fmt: str) -> None:
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    with figure_format(fmt):
        path = save_figure(fig, tmp_path / "curve.png")
    assert path == tmp_path / f"curve.{fmt}"
    assert path.read_bytes().startswith(MAGIC[fmt])
    assert current_figure_format() == "png"  # the format does not leak out of the block


def test_unknown_figure_format_is_refused() -> None:
    with pytest.raises(ValueError, match=r"figure format='eps'.*\['png', 'svg', 'pdf'\]"):
        with figure_format("eps"):
            pass


# In a fresh process: the user chose a backend ("svg", which no module of ours would pick) before importing
# throughway; every report module is imported, a figure is drawn into a PNG, and the backend is still theirs.
_BACKEND_KEPT = """
import importlib, pkgutil, sys
import matplotlib
matplotlib.use("svg")
import matplotlib.pyplot as plt
import throughway.report
for module in pkgutil.iter_modules(throughway.report.__path__):
    importlib.import_module(f"throughway.report.{module.name}")
assert matplotlib.get_backend() == "svg", f"importing throughway set the backend {matplotlib.get_backend()!r}"
from throughway.report.conv_plots import plot_error_curves
run = {"history": [{"epoch": 1, "train_error_pct": 3.0, "test_error_pct": 2.0}]}
path = plot_error_curves({"run": run}, sys.argv[1], "title")
assert path.read_bytes().startswith(b"\\x89PNG"), path
assert matplotlib.get_backend() == "svg", f"drawing a figure set the backend {matplotlib.get_backend()!r}"
assert plt.get_fignums() == [], "a figure drawn for a file was left open in pyplot"
"""


def test_importing_and_drawing_leave_the_users_matplotlib_backend(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "MPLBACKEND"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _BACKEND_KEPT, str(tmp_path / "curve.png")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "curve.png").is_file()


def test_report_command_writes_vector_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sdi"
    out.mkdir()
    shutil.copy(ROOT / "results" / "sdi" / "results.json", out / "results.json")
    assert main(["report", str(out), "--format", "svg"]) == 0
    assert (out / "tsdi_vs_width.svg").read_bytes().startswith(MAGIC["svg"])
    assert not (out / "tsdi_vs_width.png").exists()
    assert main(["report", str(out), "--format", "pdf"]) == 0
    assert (out / "tsdi_vs_width.pdf").read_bytes().startswith(MAGIC["pdf"])
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(out), "--format", "eps"])
    assert exit_info.value.code == 2
    assert "--format" in capsys.readouterr().err


def _captured(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[Any]:
    figures: list[Any] = []

    def keep(fig: Any, path: Any, **_: Any) -> Path:
        figures.append(fig)
        return Path(path)

    monkeypatch.setattr(module, "save_figure", keep)
    return figures


def test_tsdi_figure_labels_curves_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    figures = _captured(monkeypatch, hessian_plots)
    summary = json.loads((ROOT / "results" / "sdi" / "results.json").read_text())
    hessian_plots.plot_tsdi_vs_width(summary, "unused.png")
    (fig,) = figures
    for ax in fig.axes:
        assert ax.get_legend() is None
        labels = {text.get_text() for text in ax.texts}
        assert labels == {"classical", "highway = residual", "gated"}
    plt.close(fig)


def test_conv_error_figure_draws_the_papers_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    figures = _captured(monkeypatch, conv_plots)
    run = {"history": [{"epoch": 1, "train_error_pct": 3.0, "test_error_pct": 2.0},
                       {"epoch": 2, "train_error_pct": 1.0, "test_error_pct": 1.2}]}
    conv_plots.plot_error_curves({"run": run}, "unused.png", "title", reference=(0.57, "paper: 0.57%"))
    (fig,) = figures
    lines = [line for line in fig.axes[0].get_lines() if line.get_label() == "paper: 0.57%"]
    assert len(lines) == 1 and list(lines[0].get_ydata()) == [0.57, 0.57]
    assert "paper: 0.57%" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    plt.close(fig)
