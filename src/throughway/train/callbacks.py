"""Callbacks for `fit`: progress output, metrics.csv, TensorBoard, early stopping, model checkpoints.

Each is an ordinary callback (loop.Callback): `fit(progress=True)` adds `ProgressPrinter`, and
`run.run_training` writes metrics.csv beside results.json (`write_metrics_csv`) and, with
`tensorboard=True` (`throughway train --tensorboard`), adds `TensorBoardLogger`. A user's own
training script can add any of them to `fit`'s callbacks, and `EarlyStopping` (stop when a
monitored metric of the epoch record stops improving) and `ModelCheckpoint` (the best and the last
model by a monitored metric, as safetensors files `load_model` reads).

metrics.csv holds one row per epoch and every metric of the epoch record, in a stable column
order (`metrics_table`): the fixed columns `METRICS_COLUMNS` first (present even when empty), then
list-valued metrics spread over numbered columns (`k` becomes k_1 … k_n, block by block), then any
other keys in the order they first appear. It is rewritten whole and atomically from the history
after every epoch, so it always matches results.json, also after an interrupted and resumed run.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, TextIO

from .._io import atomic_write_text, json_safe
from . import distributed
from .checkpoint import save_model

if TYPE_CHECKING:
    from .state import TrainState

__all__ = ["ProgressPrinter", "MetricsCSV", "TensorBoardLogger", "EarlyStopping", "ModelCheckpoint", "METRICS_FILE", "METRICS_COLUMNS",
           "metrics_table", "write_metrics_csv", "read_metrics_csv", "require_tensorboard", "TENSORBOARD_EXTRA"]

METRICS_FILE = "metrics.csv"
METRICS_COLUMNS = ("epoch", "lr", "train_loss", "train_error_pct", "val_loss", "val_error_pct", "test_loss",
                   "test_error_pct", "k_mean", "epoch_time_s", "elapsed_s")
TENSORBOARD_EXTRA = "throughway[tensorboard]"


class ProgressPrinter:
    """One line per epoch on `stream` (default stderr), and a tqdm bar per epoch when it is a terminal.

    Every line starts with `[label] ` when a label is given, so that the lines of runs trained in
    parallel (`--jobs`) say which run they belong to. A diverged run gets a line saying so at the end.
    """

    def __init__(self, label: str | None = None, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream
        self._bar: Any = None
        self._loss_sum, self._steps = 0.0, 0

    @property
    def prefix(self) -> str:
        """What every line starts with: `[label] `, or two spaces without a label."""
        return f"[{self.label}] " if self.label else "  "

    def _out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def on_epoch_start(self, state: TrainState) -> None:
        """Start the epoch's count (its bar opens after its first step: `on_step_end`)."""
        self._loss_sum, self._steps = 0.0, 0

    def on_step_end(self, state: TrainState, step: int, loss: float) -> None:
        """Advance the bar; show the epoch's mean loss so far every 20 steps.

        The bar (only on a terminal, and only when the epoch's length is known) opens once the epoch's
        first step is done, with its clock starting then: the first step pays the warm-up (memory
        allocation, a compilation: seconds to minutes), so tqdm's time left, extrapolated from the
        steps it has timed, would otherwise promise an hour for an epoch of seconds."""
        self._loss_sum += loss
        self._steps += 1
        if self._steps == 1 and state.steps_per_epoch and self._out().isatty():
            from tqdm import tqdm

            label = f"{self.label} " if self.label else ""
            self._bar = tqdm(total=state.steps_per_epoch, initial=1, leave=False, file=self._out(),
                             desc=f"{label}epoch {state.epoch + 1}/{state.recipe.epochs}")
        elif self._bar is not None:
            self._bar.update(1)
        if self._bar is not None and self._steps % 20 == 1:
            self._bar.set_postfix(loss=f"{self._loss_sum / self._steps:.4f}")

    def on_epoch_end(self, state: TrainState, record: dict[str, Any]) -> None:
        """Print the epoch's line: training loss, validation and test error, mean k, time."""
        self._close_bar()
        val = f" val {record['val_error_pct']:.2f}%" if record.get("val_error_pct") is not None else ""
        test = f" test {record['test_error_pct']:.2f}%" if record.get("test_error_pct") is not None else ""
        # A language model's record (train.lm) holds bits per character, which say more than its error.
        if record.get("val_bpc") is not None:
            val = f" val {record['val_bpc']:.4f} bpc"
        if record.get("test_bpc") is not None:
            test = f" test {record['test_bpc']:.4f} bpc"
        kinfo = f" k̄ {record['k_mean']:.3f}" if record.get("k_mean") is not None else ""
        stopped = f", stopped after step {record['stopped_at_step']}" if "stopped_at_step" in record else ""
        print(f"{self.prefix}epoch {record['epoch']:>3}/{state.recipe.epochs} loss {record['train_loss']:.4f}"
              f"{val}{test}{kinfo} ({record['epoch_time_s']:.1f}s{stopped})", file=self._out(), flush=True)

    def on_fit_end(self, state: TrainState) -> None:
        """Close the bar; say so when the run diverged."""
        self._close_bar()
        if state.history.diverged:
            print(f"{self.prefix}diverged in epoch {(state.history.diverged_at or {}).get('epoch')} (loss "
                  f"{(state.history.diverged_at or {}).get('loss')}); run ends, history kept",
                  file=self._out(), flush=True)


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return value


def metrics_table(epochs: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """The columns and rows of metrics.csv for the epoch records `epochs` (see the module docstring).

    Values are those of results.json (non-finite numbers become empty cells, as they become null
    there); a list-valued metric `name` fills columns name_1 … name_n; a missing value is empty.
    """
    records = [json_safe(dict(r)) for r in epochs]
    columns = list(METRICS_COLUMNS)
    spread: dict[str, int] = {}
    for record in records:
        for key, value in record.items():
            if key in METRICS_COLUMNS:
                continue
            if isinstance(value, list) and all(not isinstance(v, (list, dict)) for v in value):
                spread[key] = max(spread.get(key, 0), len(value))
                if key not in columns and f"{key}_1" not in columns:
                    columns.append(key)  # a placeholder, replaced by the numbered columns below
            elif key not in columns:
                columns.append(key)
    expanded: list[str] = []
    for column in columns:
        expanded.extend([f"{column}_{i}" for i in range(1, spread[column] + 1)] if column in spread else [column])
    rows = []
    for record in records:
        row: dict[str, Any] = {}
        for key, value in record.items():
            if key in spread and isinstance(value, list):
                row.update({f"{key}_{i}": v for i, v in enumerate(value, 1)})
            else:
                row[key] = value
        rows.append([_cell(row.get(column)) for column in expanded])
    return expanded, rows


def write_metrics_csv(run_dir: str | os.PathLike[str], epochs: Sequence[dict[str, Any]]) -> Path:
    """Rewrite `run_dir`/metrics.csv atomically from the epoch records `epochs`; return its path."""
    columns, rows = metrics_table(epochs)
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    return atomic_write_text(Path(run_dir) / METRICS_FILE, text.getvalue())


def read_metrics_csv(path: str | os.PathLike[str]) -> list[dict[str, float | None]]:
    """The rows of a metrics.csv as dicts of numbers (empty cells as None); ValueError naming the file
    and the column for a cell that is not a number."""
    path = Path(path)
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    parsed = []
    for i, row in enumerate(rows, 1):
        values: dict[str, float | None] = {}
        for column, cell in row.items():
            try:
                values[str(column)] = float(cell) if cell not in ("", None) else None
            except ValueError:
                raise ValueError(f"{path}: row {i}, column {column!r} is {cell!r}; accepted: a number or "
                                 f"empty") from None
        parsed.append(values)
    return parsed


class MetricsCSV:
    """Callback: keep `run_dir`/metrics.csv equal to the history (rewritten after every epoch)."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)

    def on_fit_start(self, state: TrainState) -> None:
        """Write the file for the history so far (empty, or restored by an earlier callback)."""
        write_metrics_csv(self.run_dir, state.history.epochs)

    def on_epoch_end(self, state: TrainState, record: dict[str, Any]) -> None:
        """Rewrite the file with the new epoch."""
        write_metrics_csv(self.run_dir, state.history.epochs)


def require_tensorboard() -> Any:
    """torch.utils.tensorboard.SummaryWriter; ImportError naming the extra to install when the
    optional dependency `tensorboard` is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ImportError(f"TensorBoard logging needs the optional dependency tensorboard: "
                          f"pip install '{TENSORBOARD_EXTRA}' (or pip install tensorboard) ({exc})") from exc
    return SummaryWriter


def _scalars(record: dict[str, Any]) -> dict[str, float]:
    scalars: dict[str, float] = {}
    for key, value in record.items():
        if key == "epoch":
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            scalars[key] = float(value)
        elif isinstance(value, list):
            for i, item in enumerate(value, 1):
                if isinstance(item, (int, float)) and not isinstance(item, bool) and math.isfinite(item):
                    scalars[f"{key}/{i}"] = float(item)
    return scalars


class TensorBoardLogger:
    """Callback: every epoch record's numbers as TensorBoard scalars (global step = the epoch) in `log_dir`.

    List-valued metrics are logged per element (`k/1` … `k/n`). Each epoch is written and flushed
    in `on_epoch_end`; place this callback before the one that checkpoints, so that the events are
    never behind the checkpoint. On resume it writes no epoch twice: the first epoch a process logs
    is T (the first after the checkpoint), and when `log_dir` already holds event files the writer
    opens with `purge_step=T`, which hides any event of an epoch ≥ T that an interrupted process
    wrote after its last checkpoint (that epoch is being trained again). When it holds none (a run
    resumed with TensorBoard logging newly switched on), the epochs already in the history are
    written first. Raises ImportError naming `throughway[tensorboard]` when tensorboard is missing.
    """

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        self.log_dir = Path(log_dir)
        self._writer_class = require_tensorboard()
        self._writer: Any = None

    def _open(self, state: TrainState, first_epoch: int) -> None:
        existing = self.log_dir.is_dir() and any(self.log_dir.glob("events.out.tfevents.*"))
        self._writer = self._writer_class(log_dir=str(self.log_dir), purge_step=first_epoch if existing else None)
        if not existing:
            for record in state.history.epochs:
                if int(record["epoch"]) < first_epoch:
                    self._log(record)

    def _log(self, record: dict[str, Any]) -> None:
        for tag, value in _scalars(record).items():
            self._writer.add_scalar(tag, value, global_step=int(record["epoch"]))

    def on_epoch_end(self, state: TrainState, record: dict[str, Any]) -> None:
        """Write the epoch's scalars and flush them to disk."""
        if self._writer is None:
            self._open(state, int(record["epoch"]))
        self._log(record)
        self._writer.flush()

    def on_fit_end(self, state: TrainState) -> None:
        """Close the event file."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class _Monitor:
    """The improvement rule of EarlyStopping and ModelCheckpoint: `monitor` read from each epoch record."""

    def __init__(self, monitor: str, mode: str, min_delta: float) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"monitor={monitor!r}: accepted: the name of a metric of the epoch record, e.g. "
                             f"{', '.join(repr(c) for c in METRICS_COLUMNS if c not in ('epoch', 'lr'))}")
        if not isinstance(mode, str) or mode not in ("min", "max"):
            raise ValueError(f"mode={mode!r}: accepted values: 'min' (a loss or an error), 'max' (e.g. an accuracy)")
        if not isinstance(min_delta, (int, float)) or isinstance(min_delta, bool) or not min_delta >= 0:
            raise ValueError(f"min_delta={min_delta!r}: accepted: a number ≥ 0")
        self.monitor, self.mode, self.min_delta = monitor, mode, float(min_delta)
        self.best: float | None = None

    def value(self, record: dict[str, Any]) -> float:
        """The monitored value of `record`; ValueError naming the metric and the record's metrics when absent."""
        value = record.get(self.monitor)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            numbers = sorted(k for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
            raise ValueError(f"monitor={self.monitor!r}: the epoch record holds {value!r} for it; accepted: a metric "
                             f"with a number in every record, here {numbers} (val_* needs validation data)")
        return float(value)

    def improved(self, value: float) -> bool:
        """Whether `value` beats the best so far by more than min_delta (it then becomes the best).
        A non-finite value never improves."""
        if not math.isfinite(value):
            return False
        better = self.best is None or (value < self.best - self.min_delta if self.mode == "min"
                                       else value > self.best + self.min_delta)
        if better:
            self.best = value
        return better


class EarlyStopping:
    """Stop training when `monitor` (a metric of the epoch record, e.g. "val_loss", "val_error_pct",
    "train_loss") has not improved by more than `min_delta` for `patience` epochs in a row (Keras's
    rule: patience=0 stops after the first epoch without improvement). `mode` is "min" or "max". The
    epoch that stops is recorded (`stopped_epoch`, 1-based; None while training goes on); a NaN or
    infinite value counts as no improvement. ValueError, naming the metric, when a record lacks it."""

    def __init__(self, monitor: str = "val_loss", patience: int = 0, min_delta: float = 0.0, mode: str = "min") -> None:
        if not isinstance(patience, int) or isinstance(patience, bool) or patience < 0:
            raise ValueError(f"patience={patience!r}: accepted: an integer ≥ 0")
        self._rule = _Monitor(monitor, mode, min_delta)
        self.patience = patience
        self.wait = 0
        self.stopped_epoch: int | None = None

    @property
    def best(self) -> float | None:
        """The best monitored value so far."""
        return self._rule.best

    def on_epoch_end(self, state: TrainState, record: dict[str, Any]) -> None:
        """Count epochs without improvement; set `state.stop` when they exceed the patience."""
        if self._rule.improved(self._rule.value(record)):
            self.wait = 0
            return
        self.wait += 1
        if self.wait > self.patience:
            state.stop = True
            self.stopped_epoch = int(record["epoch"])


class ModelCheckpoint:
    """Save the model of the best epoch by `monitor` (`best.safetensors`) and of the last epoch
    (`last.safetensors`) into `directory`, each with `save_model` (written atomically; read back with
    `load_model`), after every epoch. `mode` and `min_delta` as in EarlyStopping; `save_best` /
    `save_last` switch either file off. `best_epoch` and `best` hold the best epoch (1-based) and its
    value. Under data parallelism only the main process writes."""

    def __init__(self, directory: str | os.PathLike[str], monitor: str = "val_loss", mode: str = "min",
                 min_delta: float = 0.0, save_best: bool = True, save_last: bool = True) -> None:
        for name, flag in (("save_best", save_best), ("save_last", save_last)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}={flag!r}: accepted: True or False")
        if not (save_best or save_last):
            raise ValueError("save_best and save_last are both False: ModelCheckpoint would write nothing")
        if not isinstance(directory, (str, os.PathLike)) or not str(directory):
            raise TypeError(f"directory={directory!r}: accepted: a folder path (a non-empty str or os.PathLike)")
        self.directory = Path(directory)
        self._rule = _Monitor(monitor, mode, min_delta)
        self.save_best, self.save_last = save_best, save_last
        self.best_epoch: int | None = None

    @property
    def best(self) -> float | None:
        """The best monitored value so far."""
        return self._rule.best

    @property
    def best_path(self) -> Path:
        """Where the best epoch's model is written."""
        return self.directory / "best.safetensors"

    @property
    def last_path(self) -> Path:
        """Where the last epoch's model is written."""
        return self.directory / "last.safetensors"

    def on_fit_start(self, state: TrainState) -> None:
        """Create the directory (before the first epoch, so a bad path fails at once)."""
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"ModelCheckpoint directory {self.directory}: is a file; accepted: a directory")
        self.directory.mkdir(parents=True, exist_ok=True)

    def on_epoch_end(self, state: TrainState, record: dict[str, Any]) -> None:
        """Write last.safetensors, and best.safetensors when the monitored value improved."""
        improved = self._rule.improved(self._rule.value(record))
        if improved:
            self.best_epoch = int(record["epoch"])
        if not distributed.is_main_process():
            return
        if self.save_last:
            save_model(self.last_path, state.model)
        if self.save_best and improved:
            save_model(self.best_path, state.model)
