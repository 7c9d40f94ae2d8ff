"""The open training API (issue 14): fit on a user's model and data, callbacks, metrics.csv, TensorBoard,
labelled progress, and the README's example."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from throughway.cli import main
from throughway.layers import ResidualBlock, dense_unit, scalar_gate_values
from throughway.train import (METRICS_FILE, ProgressPrinter, RunConfig, TensorBoardLogger, fit, get_recipe,
                              read_metrics_csv, read_results, run_training)
from throughway.train.callbacks import METRICS_COLUMNS, metrics_table

from conftest import Crash

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny models: two threads on a shared 2-core machine only contend.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class UserNet(nn.Module):
    """A model the registry does not know: a stem, two gated residual blocks, a head."""

    def __init__(self, features: int = 8, width: int = 16, classes: int = 3) -> None:
        super().__init__()
        self.stem = dense_unit(features, width)
        self.blocks = nn.Sequential(*[ResidualBlock(dense_unit(width, width), gated=True) for _ in range(2)])
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def _tensors(n: int = 96, features: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    return x, x[:, :3].argmax(dim=1)


class RecordK:
    def __init__(self, every: int = 1) -> None:
        self.every, self.rows = every, []

    def on_step_end(self, state, step, loss):
        if step % self.every == 0:
            self.rows.append((step, loss, scalar_gate_values(state.model)))


RECIPE = get_recipe("gresnet-mnist", epochs=3, batch_size=16)


def test_a_user_model_trains_on_tensors_with_a_step_callback():
    model, spy = UserNet(), RecordK(every=1)
    x, y = _tensors()
    history = fit(model, (x, y), RECIPE, [spy], eval_data=_tensors(32, seed=1), progress=False)
    steps_per_epoch = 96 // 16
    assert [row[0] for row in spy.rows] == list(range(1, 3 * steps_per_epoch + 1))  # one record per step
    assert spy.rows[0][2] != spy.rows[-1][2] and len(spy.rows[0][2]) == 2  # k moved
    assert history.epochs[-1]["k"] == spy.rows[-1][2]
    assert history.epochs[-1]["train_loss"] < history.epochs[0]["train_loss"]
    assert history.epochs[-1]["test_error_pct"] is not None and history.epochs[-1]["val_error_pct"] is None


def test_a_dataset_is_stacked_into_the_in_memory_path():
    x, y = _tensors()

    class Items(Dataset):
        def __len__(self):
            return len(y)

        def __getitem__(self, i):
            return x[i], int(y[i])

    torch.manual_seed(0)
    from_items = fit(UserNet(), Items(), RECIPE, progress=False, seed=4)
    torch.manual_seed(0)
    from_tensors = fit(UserNet(), (x, y), RECIPE, progress=False, seed=4)
    torch.manual_seed(0)
    from_tensor_dataset = fit(UserNet(), TensorDataset(x, y), RECIPE, progress=False, seed=4)
    losses = [r["train_loss"] for r in from_tensors.epochs]
    assert [r["train_loss"] for r in from_items.epochs] == losses
    assert [r["train_loss"] for r in from_tensor_dataset.epochs] == losses


def test_a_dataloader_is_iterated_as_given_with_its_own_loss_and_optimizer():
    x, y = _tensors()
    loader = DataLoader(TensorDataset(x, y), batch_size=10, shuffle=True, generator=torch.Generator().manual_seed(0))
    model = UserNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    calls = []

    def loss_fn(outputs, targets):
        calls.append(len(targets))
        return nn.functional.cross_entropy(outputs, targets)

    spy = RecordK()
    history = fit(model, loader, RECIPE, [spy], eval_data=DataLoader(TensorDataset(*_tensors(32, seed=1)),
                                                                      batch_size=8),
                  loss_fn=loss_fn, optimizer=optimizer, progress=False)
    assert len(spy.rows) == 3 * len(loader) == 30  # the loader's batches (10 a batch), not the recipe's 16
    assert calls[:10] == [10] * 9 + [6]
    assert [r["lr"] for r in history.epochs] == [0.05] * 3  # the user's optimiser keeps its own lr
    assert history.epochs[-1]["test_loss"] is not None


def test_a_callback_stops_training_early():
    class StopAt:
        def __init__(self, step):
            self.step = step

        def on_step_end(self, state, step, loss):
            if step == self.step:
                state.stop = True

    class StopAfterEpoch:
        def on_epoch_end(self, state, record):
            state.stop = record["epoch"] == 2

    steps = RecordK()
    history = fit(UserNet(), _tensors(), RECIPE, [StopAt(8), steps], progress=False)
    assert len(history.epochs) == 2 and history.epochs[-1]["stopped_at_step"] == 2  # 6 steps, then 2 of epoch 2
    assert steps.rows[-1][0] == 8
    assert len(fit(UserNet(), _tensors(), RECIPE.replace(epochs=5), [StopAfterEpoch()], progress=False).epochs) == 2


def test_bad_inputs_name_the_argument():
    with pytest.raises(TypeError, match="data: got str; accepted"):
        fit(UserNet(), "mnist", RECIPE, progress=False)
    with pytest.raises(ValueError, match="data: x and y"):
        fit(UserNet(), (torch.zeros(4, 8), torch.zeros(3, dtype=torch.long)), RECIPE, progress=False)
    with pytest.raises(TypeError, match="optimizer: got"):
        fit(UserNet(), _tensors(), RECIPE, optimizer="adam", progress=False)
    with pytest.raises(KeyError, match="accepted values"):
        fit(UserNet(), _tensors(), "no-such-recipe", progress=False)
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter([(torch.zeros(8), 0)])

    with pytest.raises(TypeError, match="pass it inside a DataLoader"):
        fit(UserNet(), Stream(), RECIPE, progress=False)


def test_progress_lines_name_the_run(capsys):
    fit(UserNet(), _tensors(), RECIPE.replace(epochs=2), label="gated-d4-s0")
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("[gated-d4-s0] epoch") for line in lines)



def _csv_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    return rows[0], rows[1:]


def test_metrics_csv_resumes_with_the_run_each_epoch_once(tmp_path, fake_mnist_root):
    config = RunConfig(model="mlp_gated_residual", depth=4, epochs=4, limit=64, model_kwargs={"width": 8},
                       recipe_overrides={"batch_size": 32})
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_training(config, out, progress=False, callbacks=[Crash(after=2)])
    assert len(read_metrics_csv(out / METRICS_FILE)) == 2
    run_training(config, out, resume=True, progress=False)
    history = read_results(out)["history"]
    rows = read_metrics_csv(out / METRICS_FILE)
    assert [row["epoch"] for row in rows] == [1, 2, 3, 4]
    columns, _ = _csv_rows(out / METRICS_FILE)
    assert columns == [*METRICS_COLUMNS, "k_1", "k_2"]
    for row, record in zip(rows, history):
        assert {k: row[k] for k in METRICS_COLUMNS} == {k: record.get(k) for k in METRICS_COLUMNS}
        assert [row["k_1"], row["k_2"]] == record["k"]


def test_metrics_table_keeps_every_metric_in_a_stable_order():
    records = [{"epoch": 1, "lr": 0.1, "train_loss": float("nan"), "k": [1.0, 2.0], "extra": "x"},
               {"epoch": 2, "lr": 0.1, "train_loss": 0.5, "k": [1.5, 2.5], "stopped_at_step": 3}]
    columns, rows = metrics_table(records)
    assert columns == [*METRICS_COLUMNS, "k_1", "k_2", "extra", "stopped_at_step"]
    assert rows[0][columns.index("train_loss")] == "" and rows[1][columns.index("k_2")] == 2.5
    assert rows[1][columns.index("extra")] == "" and rows[1][columns.index("stopped_at_step")] == 3


def test_batched_member_runs_write_metrics_csv(tmp_path, fake_mnist_root):
    from throughway.train.stack import train_stacked

    configs = [RunConfig(model="mlp_gated_residual", depth=2, epochs=2, seed=s, limit=64, model_kwargs={"width": 8},
                         recipe_overrides={"batch_size": 32}) for s in (0, 1)]
    dirs = [tmp_path / f"s{s}" for s in (0, 1)]
    train_stacked(configs, dirs, progress=False)
    for d in dirs:
        rows = read_metrics_csv(d / METRICS_FILE)
        assert [r["test_error_pct"] for r in rows] == [r["test_error_pct"] for r in read_results(d)["history"]]


class FakeWriter:
    """Records what a SummaryWriter would write: (log_dir, purge_step) per writer, (tag, value, step) per scalar."""

    opened: list = []
    events: list = []

    def __init__(self, log_dir, purge_step=None):
        FakeWriter.opened.append((log_dir, purge_step))
        Path(log_dir, "events.out.tfevents.fake").write_text("")

    def add_scalar(self, tag, value, global_step):
        FakeWriter.events.append((tag, value, global_step))

    def flush(self):
        pass

    def close(self):
        pass


def test_tensorboard_logger_writes_no_epoch_twice_on_resume(tmp_path, fake_mnist_root, monkeypatch):
    import throughway.train.callbacks as callbacks
    import throughway.train.run as run_module

    monkeypatch.setattr(callbacks, "require_tensorboard", lambda: FakeWriter)
    monkeypatch.setattr(run_module, "require_tensorboard", lambda: FakeWriter)
    FakeWriter.opened, FakeWriter.events = [], []
    config = RunConfig(model="mlp_gated_residual", depth=2, epochs=3, limit=64, model_kwargs={"width": 8},
                       recipe_overrides={"batch_size": 32})
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_training(config, out, progress=False, tensorboard=True, callbacks=[Crash(after=2)])
    run_training(config, out, resume=True, progress=False, tensorboard=True)
    steps = [step for tag, _, step in FakeWriter.events if tag == "train_loss"]
    assert steps == [1, 2, 3]  # epochs 1-2 by the first process, 3 by the resumed one
    assert FakeWriter.opened == [(str(out), None), (str(out), 3)]  # the resumed writer hides anything ≥ 3
    assert {tag for tag, _, _ in FakeWriter.events} >= {"k/1", "k_mean", "test_error_pct", "lr"}


def test_tensorboard_event_files_resume_without_duplicates(tmp_path, fake_mnist_root):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = RunConfig(model="mlp_gated_residual", depth=2, epochs=3, limit=64, model_kwargs={"width": 8},
                       recipe_overrides={"batch_size": 32})
    out = tmp_path / "run"

    class CrashAfterLogging(TensorBoardLogger):
        # Epoch 2 reaches the event file but the process dies before its checkpoint: the resumed run
        # trains epoch 2 again, and TensorBoard must show it once (the new values).
        def on_epoch_end(self, state, record):
            super().on_epoch_end(state, record)
            if record["epoch"] == 2:
                raise KeyboardInterrupt

    import throughway.train.run as run_module

    original = run_module.TensorBoardLogger
    run_module.TensorBoardLogger = CrashAfterLogging
    try:
        with pytest.raises(KeyboardInterrupt):
            run_training(config, out, progress=False, tensorboard=True)
    finally:
        run_module.TensorBoardLogger = original
    run_training(config, out, resume=True, progress=False, tensorboard=True)
    events = EventAccumulator(str(out))
    events.Reload()
    logged = events.Scalars("train_loss")
    history = read_results(out)["history"]
    assert [e.step for e in logged] == [1, 2, 3]
    assert [e.value for e in logged] == pytest.approx([r["train_loss"] for r in history], rel=1e-6)


def test_tensorboard_missing_is_exit_2_naming_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as when not installed
    code = main(["train", "--model", "mlp_plain", "--depth", "2", "--epochs", "1", "--out", str(tmp_path / "r"),
                 "--tensorboard", "--quiet"])
    assert code == 2
    assert "throughway[tensorboard]" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_progress_printer_says_when_a_run_diverged(capsys):
    model = UserNet()
    recipe = get_recipe("highway-mnist", lr=1e12, momentum=0.9, epochs=4, batch_size=16)
    history = fit(model, _tensors(), recipe, [], label="plain", progress=True)
    assert history.diverged
    assert "[plain] diverged in epoch" in capsys.readouterr().err
    assert ProgressPrinter("x").prefix == "[x] " and ProgressPrinter().prefix == "  "


def test_the_epoch_bar_times_the_steps_after_the_first(monkeypatch):
    """The first step pays the warm-up (a minute here, as a compilation can): the bar's time left comes
    from the steps after it, 90 steps of 0.1 s, not from a pace that includes the minute."""
    import tqdm.std
    from types import SimpleNamespace

    clock = [0.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: clock[0])

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    printer = ProgressPrinter(stream=Terminal())
    state = SimpleNamespace(steps_per_epoch=100, epoch=0, recipe=SimpleNamespace(epochs=1))
    printer.on_epoch_start(state)
    clock[0] += 60.0
    printer.on_step_end(state, 0, 1.0)
    for step in range(1, 10):
        clock[0] += 0.1
        printer.on_step_end(state, step, 1.0)
    shown = printer._bar.format_dict
    left = (shown["total"] - shown["n"]) / shown["rate"]
    printer.on_fit_end(SimpleNamespace(history=SimpleNamespace(diverged=False)))
    assert left == pytest.approx(9.0, rel=0.05)


def test_the_readme_example_runs_as_written(capsys):
    text = README.read_text(encoding="utf-8")
    start = text.index("## Python")
    section = text[start:text.index("\n## ", start + 1)]  # up to the next section
    blocks = [b.split("```")[0] for b in section.split("```python\n")[1:]]
    example = [b for b in blocks if "on_step_end" in b]
    assert len(example) == 1
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(example[0], str(README), "exec"), namespace)
    assert len(namespace["k_log"].rows) == 12 and namespace["history"].last()["test_error_pct"] < 30
    assert "test error" in capsys.readouterr().out
    json.dumps(namespace["history"].to_dict())  # the history of a user's run is JSON-able too


# -- fit gives back the caller's mode ---------------------------------------------------------------

R = get_recipe("gresnet-mnist", epochs=1, batch_size=16)


def _xy(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 5)
    return x, x[:, :3].argmax(1)


def test_fit_gives_back_the_callers_mode_module_by_module():
    model = nn.Sequential(nn.Linear(5, 8), nn.Dropout(0.1), nn.Linear(8, 3))
    model.eval()
    fit(model, _xy(), R, progress=False)
    assert not any(m.training for m in model.modules())
    model.train()
    model[1].eval()
    fit(model, _xy(), R, progress=False)
    assert [m.training for m in model.modules()] == [True, True, False, True]
