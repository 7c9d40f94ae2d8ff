"""A researcher's own schedule, data and callbacks in `fit` (issue 22, items 3 to 5 and the callbacks)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from throughway.train import fit, get_recipe


def _data(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(n, 6, generator=generator), torch.randint(0, 3, (n,), generator=generator)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


RECIPE = get_recipe("gresnet-mnist", epochs=3, batch_size=16)  # NAdam, constant lr 0.002


def test_a_scheduler_given_to_fit_sets_the_recorded_lr():
    history = fit(_model(), _data(), RECIPE, progress=False,
                  scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5))
    assert [r["lr"] for r in history.epochs] == pytest.approx([0.002, 0.001, 0.0005])


def test_a_scheduler_a_callback_attaches_wins_over_the_recipes_schedule():
    class HalveEachEpoch:
        def on_fit_start(self, state):
            self.scheduler = torch.optim.lr_scheduler.StepLR(state.optimizer, 1, gamma=0.5)

        def on_epoch_end(self, state, record):
            self.scheduler.step()

    history = fit(_model(), _data(), RECIPE, [HalveEachEpoch()], progress=False)
    assert [r["lr"] for r in history.epochs] == pytest.approx([0.002, 0.001, 0.0005])


def test_the_recipes_schedule_applies_without_a_users_scheduler():
    recipe = get_recipe("highway-mnist", epochs=3, batch_size=16, lr=0.1, lr_decay=0.5)
    history = fit(_model(), _data(), recipe, progress=False)
    assert [r["lr"] for r in history.epochs] == pytest.approx([0.1, 0.05, 0.025])


def test_a_scheduler_that_is_not_callable_is_refused_naming_the_argument():
    with pytest.raises(TypeError, match="scheduler"):
        fit(_model(), _data(), RECIPE, progress=False, scheduler="step")  # type: ignore[arg-type]


def test_the_training_api_imports_where_there_is_no_fcntl():
    # Windows has no fcntl: the run directory's lock comes from filelock, imported everywhere.
    import subprocess
    import sys

    code = ("import sys; sys.modules['fcntl'] = None\n"
            "from throughway.train import fit, run_training\n"
            "import throughway.train.rundir, throughway.train.stack\n"
            "print('imported')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr


def test_early_stopping_stops_after_patience_epochs_without_improvement():
    from throughway.train import EarlyStopping

    stopper = EarlyStopping(monitor="val_loss", patience=1, min_delta=10.0)  # nothing improves by 10
    history = fit(_model(), _data(), get_recipe("gresnet-mnist", epochs=6, batch_size=16), [stopper],
                  val_data=_data(32), progress=False)
    # epoch 1 sets the best, epochs 2 and 3 do not improve by min_delta: patience 1 ends training after 3.
    assert len(history.epochs) == 3 and stopper.stopped_epoch == 3


def test_early_stopping_names_a_metric_the_records_lack():
    from throughway.train import EarlyStopping

    with pytest.raises(ValueError, match="monitor='val_loss'.*test_loss"):
        fit(_model(), _data(), RECIPE, [EarlyStopping()], eval_data=_data(32), progress=False)
    with pytest.raises(ValueError, match="mode"):
        EarlyStopping(mode="lowest")


def test_model_checkpoint_keeps_the_best_and_the_last_model(tmp_path):
    from throughway.train import ModelCheckpoint, load_model

    class Worsen:  # a monitored number that improves once, then gets worse
        def on_epoch_end(self, state, record):
            record["score"] = [1.0, 0.5, 2.0][record["epoch"] - 1]

    model = _model()  # a user's own nn.Sequential: save_model takes any module
    saved = ModelCheckpoint(tmp_path / "ckpt", monitor="score")
    snapshots = {}

    class Remember:
        def on_epoch_end(self, state, record):
            snapshots[record["epoch"]] = {k: v.clone() for k, v in state.model.state_dict().items()}

    fit(model, _data(), RECIPE, [Worsen(), saved, Remember()], progress=False)
    assert saved.best_epoch == 2 and saved.best == 0.5
    best, last = load_model(saved.best_path, model=_model()), load_model(saved.last_path, model=_model())
    assert all(torch.equal(v, snapshots[2][k]) for k, v in best.state_dict().items())
    assert all(torch.equal(v, snapshots[3][k]) for k, v in last.state_dict().items())
    assert not all(torch.equal(v, snapshots[3][k]) for k, v in best.state_dict().items())


class NoisyItems(torch.utils.data.Dataset):
    """A map-style Dataset whose items carry fresh random noise at every read (per-item augmentation)."""

    def __init__(self, n: int = 48) -> None:
        self.x, self.y = _data(n)
        self.calls = 0
        self.seen: dict[int, list[torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        self.calls += 1
        item = self.x[i] + 0.1 * torch.randn(6)
        self.seen.setdefault(i, []).append(item)
        return item, self.y[i]


def test_a_map_style_dataset_is_read_every_epoch():
    dataset = NoisyItems()
    history = fit(_model(), dataset, RECIPE, progress=False)
    assert len(history.epochs) == 3
    # one read to check the item form, then every item in every epoch (48 items, batches of 16)
    assert dataset.calls == 1 + 3 * 48
    item = dataset.seen[5]
    assert len(item) >= 3 and not torch.equal(item[-1], item[-2])  # the augmentation differs between epochs


def test_a_dataset_trains_in_the_order_and_batches_of_the_same_tensors():
    class Plain(torch.utils.data.Dataset):
        def __init__(self):
            self.x, self.y = _data(50)  # 50 = 3 batches of 16 and a last one of 2

        def __len__(self):
            return 50

        def __getitem__(self, i):
            return self.x[i], self.y[i]

    from_items = fit(_model(), Plain(), RECIPE, progress=False, seed=3)
    from_tensors = fit(_model(), _data(50), RECIPE, progress=False, seed=3)
    assert [r["train_loss"] for r in from_items.epochs] == [r["train_loss"] for r in from_tensors.epochs]


def test_validation_and_test_data_are_recorded_under_their_names():
    history = fit(_model(), _data(), RECIPE, progress=False, val_data=_data(20), test_data=_data(24))
    record = history.epochs[-1]
    assert record["val_loss"] is not None and record["test_loss"] is not None
    assert record["val_loss"] != record["test_loss"]
    old_name = fit(_model(), _data(), RECIPE, progress=False, eval_data=_data(24))  # the older name of test_data
    assert old_name.epochs[-1]["test_loss"] == pytest.approx(record["test_loss"])
    assert old_name.epochs[-1]["val_loss"] is None
    with pytest.raises(ValueError, match="eval_data and test_data"):
        fit(_model(), _data(), RECIPE, progress=False, eval_data=_data(24), test_data=_data(24))


def test_evaluate_takes_a_pair_of_tensors_as_fit_does():
    from throughway.data import Split
    from throughway.train import evaluate

    model, (x, y) = _model(), _data(40)
    assert evaluate(model, (x, y)) == evaluate(model, Split(x, y))
    with pytest.raises(TypeError, match="split"):
        evaluate(model, "data.csv")  # type: ignore[arg-type]


# -- what fit refuses or accepts at its first step ---------------------------------------------------------

def test_a_model_on_the_meta_device_is_refused_naming_the_device_before_any_step():
    with torch.device("meta"):
        model = _model()
    for data in (_data(), torch.utils.data.TensorDataset(*_data())):
        with pytest.raises(ValueError, match=r"model: its parameter '0.weight' is on the meta device.*to_empty"):
            fit(model, data, RECIPE, progress=False)
    partly = _model()
    partly.register_buffer("scale", torch.ones(3, device="meta"))  # one meta tensor is enough to fail
    with pytest.raises(ValueError, match="model: its buffer 'scale' is on the meta device"):
        fit(partly, _data(), RECIPE, progress=False)


def test_a_loss_not_computed_from_the_parameters_is_refused_naming_loss_fn_before_any_step():
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="loss_fn: returned a loss from which none of the model's 4 trainable"):
        fit(model, _data(), RECIPE, progress=False, loss_fn=lambda outputs, y: torch.tensor(1.0, requires_grad=True))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # no step was taken
    # A loss that reaches only some parameters trains those: it is not refused.
    frozen = _model()
    frozen[0].requires_grad_(False)
    fit(frozen, _data(), RECIPE, progress=False)


def test_soft_labels_train_with_the_default_loss_and_count_errors_by_their_argmax():
    x, y = _data()
    soft = torch.nn.functional.one_hot(y, 3).float() * 0.8 + 0.2 / 3  # label smoothing: probabilities, (N, 3)
    hard = fit(_model(), (x, y), RECIPE, progress=False, test_data=(x, y))
    smooth = fit(_model(), (x, soft), RECIPE, progress=False, test_data=(x, soft))
    loss = torch.nn.functional.cross_entropy
    assert smooth.epochs[-1]["train_loss"] != hard.epochs[-1]["train_loss"]  # the soft targets were used
    # the error counts rows whose argmax differs from the target's argmax: the hard labels here
    model = _model()
    fit(model, (x, soft), RECIPE, progress=False)
    from throughway.train import evaluate

    assert evaluate(model, (x, soft))[1] == pytest.approx(evaluate(model, (x, y))[1])
    with torch.no_grad():
        assert evaluate(model, (x, soft))[0] == pytest.approx(float(loss(model(x), soft)), rel=1e-5)
    assert smooth.epochs[-1]["test_error_pct"] is not None and smooth.epochs[-1]["train_error_pct"] is not None
    # each data form takes them; they must be finite and of the outputs' shape
    fit(_model(), torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, soft), batch_size=16), RECIPE,
        progress=False)
    with pytest.raises(ValueError, match="data: the soft labels .* hold NaN"):
        fit(_model(), (x, torch.where(soft > 0.5, float("nan"), soft)), RECIPE, progress=False)
    with pytest.raises(TypeError, match=r"data: the labels are torch.float32 of shape \(64, 2\)"):
        fit(_model(), (x, soft[:, :2]), RECIPE, progress=False)
