"""What `fit` checks before its first step (train.checks, docs/reliability.md): labels, the model's output,
dtypes, the optimizer, the user's callables, callbacks and evaluation arguments; a property test of all of
them. Where training could have started, each test asserts that nothing was trained: no optimiser step, no
epoch, the weights as they were."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from throughway.models import create_model
from throughway.train import EarlyStopping, ModelCheckpoint, fit, get_recipe


R = get_recipe("gresnet-mnist", epochs=1, batch_size=16)


def _xy(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 5)
    return x, x[:, :3].argmax(1)


class Spy:
    """Counts the optimiser steps and the finished epochs fit reports."""

    def __init__(self) -> None:
        self.steps, self.epochs = 0, 0

    def on_step_end(self, state, step, loss):
        self.steps += 1

    def on_epoch_end(self, state, record):
        self.epochs += 1


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _refused(model: nn.Module, data: Any, error: type[Exception], named: str, **kwargs: Any) -> str:
    """fit(model, data, ...) raises `error` whose message names `named`; nothing was trained. The message."""
    before, spy = _weights(model), Spy()
    callbacks = kwargs.pop("callbacks", [spy])
    with pytest.raises(error) as info:
        fit(model, data, kwargs.pop("recipe", R), callbacks, progress=False, **kwargs)
    message = str(info.value)
    assert named in message, message
    assert spy.steps == 0 and spy.epochs == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    return message


class TupleNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(5, 3)

    def forward(self, x):
        return self.linear(x), x


class DictNet(TupleNet):
    def forward(self, x):
        return {"logits": self.linear(x)}


class Misspelt:
    def on_epoch_ends(self, state, record):
        raise AssertionError("never called")


class HalfMisspelt(Spy):
    def on_fit_ends(self, state):
        raise AssertionError("never called")


class LateScheduler:
    """Attaches a StepLR (gamma 0.5 per epoch) in the first on_step_end and steps it after every epoch."""

    def __init__(self) -> None:
        self.scheduler: Any = None

    def on_step_end(self, state, step, loss):
        if self.scheduler is None:
            self.scheduler = torch.optim.lr_scheduler.StepLR(state.optimizer, step_size=1, gamma=0.5)

    def on_epoch_end(self, state, record):
        self.scheduler.step()


class ItemsDataset(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class AnyOutput(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.linear, self.kind = nn.Linear(5, 3), kind

    def forward(self, x):
        out = self.linear(x)
        return {"tuple": (out, out), "list": [out], "dict": {"out": out}, "none": None, "int": 3}.get(self.kind, out)


def _malformed(kind: str, value: Any, x: torch.Tensor, y: torch.Tensor) -> tuple[nn.Module, Any, Any, dict, str | None]:
    """(model, x, y, fit's kwargs, the argument a refusal must name, or None where fit must train)."""
    model: nn.Module = nn.Linear(5, 3)
    kwargs: dict[str, Any] = {}
    named: str | None = None
    if kind == "label_dtype":
        y, named = y.to(value), None if not (value.is_floating_point or value == torch.bool) else "data"
    elif kind == "label_shape":
        y, named = y.reshape(len(y), *value) if value else y[:, None].expand(-1, 2), "data"
    elif kind == "label_value":
        y, named = torch.where(y == 1, value, y), None if 0 <= value < 3 else "data"
    elif kind == "output":
        model, named = AnyOutput(value), "model's output"
    elif kind == "model_dtype":
        model = model.to(value)
    elif kind == "input_integer":
        x, named = (x * 10).to(value), "data"
    elif kind == "loss":
        losses = {"float": lambda o, t: 1.0, "none": nn.CrossEntropyLoss(reduction="none"),
                  "detached": lambda o, t: nn.functional.cross_entropy(o, t).detach(),
                  "int": lambda o, t: torch.tensor(1), "str": "mse"}
        kwargs["loss_fn"], named = losses[value], "loss_fn"
    elif kind == "scheduler":
        kwargs["scheduler"], named = (lambda opt: value) if value != "not callable" else value, "scheduler"
    elif kind == "callbacks":
        kwargs["callbacks"] = {"str": "abc", "object": [object()], "misspelt": [Misspelt()], "class": [Spy]}[value]
        named = "callbacks"
    elif kind == "optimizer":
        kwargs["optimizer"], named = torch.optim.SGD(nn.Linear(5, 3).parameters(), lr=0.1), "optimizer"
    elif kind == "eval_batch_size":
        kwargs["eval_batch_size"], named = value, "eval_batch_size"
    return model, x, y, kwargs, named


MALFORMED = st.one_of(
    st.tuples(st.just("label_dtype"), st.sampled_from([torch.float16, torch.float32, torch.float64, torch.bool,
                                                       torch.int8, torch.int16, torch.int32, torch.uint8])),
    st.tuples(st.just("label_shape"), st.sampled_from([(1,), (1, 1), ()])),
    st.tuples(st.just("label_value"), st.integers(-2**31, 2**31 - 1)),
    st.tuples(st.just("output"), st.sampled_from(["tuple", "list", "dict", "none", "int"])),
    st.tuples(st.just("model_dtype"), st.sampled_from([torch.float64, torch.bfloat16])),
    st.tuples(st.just("input_integer"), st.sampled_from([torch.int64, torch.int32, torch.uint8])),
    st.tuples(st.just("loss"), st.sampled_from(["float", "none", "detached", "int", "str"])),
    st.tuples(st.just("scheduler"), st.sampled_from([5, None, "step", "not callable"])),
    st.tuples(st.just("callbacks"), st.sampled_from(["str", "object", "misspelt", "class"])),
    st.tuples(st.just("optimizer"), st.none()),
    st.tuples(st.just("eval_batch_size"), st.sampled_from([0, -3, 1.5, "8", None, False])),
)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8, torch.int8])
def test_integer_labels_of_any_width_train_as_int64(dtype):
    x, y = _xy()
    torch.manual_seed(1)
    reference = fit(nn.Linear(5, 3), (x, y), R, progress=False)
    torch.manual_seed(1)
    history = fit(nn.Linear(5, 3), (x, y.to(dtype)), R, progress=False)
    assert history.epochs[0]["train_loss"] == reference.epochs[0]["train_loss"]
    assert history.epochs[0]["train_error_pct"] == reference.epochs[0]["train_error_pct"]


def test_evaluate_takes_integer_labels_of_any_width_too():
    from throughway.train import evaluate

    model, (x, y) = nn.Linear(5, 3), _xy()
    assert evaluate(model, (x, y.int())) == evaluate(model, (x, y))
    assert evaluate(model, DataLoader(TensorDataset(x, y.to(torch.uint8)), batch_size=8)) == pytest.approx(
        evaluate(model, (x, y)))


@pytest.mark.parametrize("labels, error, named", [
    (lambda y: torch.where(y == 0, 5, y), ValueError, "data: label 5 is out of range for a model with 3 outputs"),
    (lambda y: torch.where(y == 0, -1, y), ValueError, "data: label -1 is out of range"),
    (lambda y: y.float(), TypeError, "data: the labels are torch.float32 of shape (64,); accepted: integer class indices"),
    (lambda y: y[:, None], ValueError, "data: the labels have shape (64, 1)"),
])
def test_bad_labels_are_refused_naming_data_before_any_step(labels, error, named):
    x, y = _xy()
    _refused(nn.Linear(5, 3), (x, labels(y)), error, named)


def test_bad_labels_are_refused_in_every_data_form_and_split():
    x, y = _xy()
    bad = torch.where(y == 0, 3, y)
    _refused(nn.Linear(5, 3), DataLoader(TensorDataset(x, bad), batch_size=16), ValueError, "data: label 3")
    _refused(nn.Linear(5, 3), TensorDataset(x, bad), ValueError, "data: label 3")
    _refused(nn.Linear(5, 3), (x, y), ValueError, "test_data: label 3", test_data=(x, bad))
    _refused(nn.Linear(5, 3), (x, y), ValueError, "val_data: the labels have shape", val_data=(x, y[:, None]))


@pytest.mark.parametrize("net", [TupleNet, DictNet])
def test_a_forward_returning_a_tuple_or_dict_is_refused_naming_the_models_output(net):
    message = _refused(net(), _xy(), TypeError, "model's output: forward returned")
    assert "accepted: a tensor of class scores (N, classes)" in message


def test_the_probe_leaves_batchnorm_statistics_and_every_modules_mode_alone():
    model = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    model[1].eval()  # a caller's mixed modes
    x, y = _xy()
    _refused(model, (x, y + 1), ValueError, "data: label 3")  # the probe ran; BatchNorm must not have moved
    assert torch.equal(model[1].running_mean, torch.zeros(8)) and int(model[1].num_batches_tracked) == 0
    assert model.training and model[0].training and not model[1].training


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_floating_inputs_are_cast_to_the_models_dtype(dtype):
    x, y = _xy()
    model = nn.Linear(5, 3).to(dtype)
    history = fit(model, (x, y), R, progress=False, test_data=DataLoader(TensorDataset(x, y), batch_size=16))
    assert len(history.epochs) == 1 and history.epochs[0]["test_error_pct"] is not None
    assert model.weight.dtype == dtype


def test_integer_inputs_a_float_model_cannot_take_are_refused_naming_data_and_both_dtypes():
    x, y = _xy()
    message = _refused(nn.Linear(5, 3), ((x * 10).long(), y), TypeError, "data: the model's forward failed")
    assert "torch.int64" in message and "torch.float32" in message


def test_an_optimizer_holding_none_of_the_models_parameters_is_refused():
    other = nn.Linear(5, 3)
    message = _refused(nn.Linear(5, 3), _xy(), ValueError, "optimizer: holds none of the model's 2 trainable",
                       optimizer=torch.optim.SGD(other.parameters(), lr=0.1))
    assert "accepted" in message


def test_an_optimizer_holding_some_of_the_models_parameters_warns_how_many():
    model = nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 3))
    with pytest.warns(UserWarning, match="optimizer: holds 2 of the model's 4 trainable parameters; the other 2"):
        fit(model, _xy(), R, optimizer=torch.optim.SGD(model[1].parameters(), lr=0.1), progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the recipe's optimiser and a full user optimiser: no warning
        fit(model, _xy(), R, progress=False)
        fit(model, _xy(), R, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), progress=False)


@pytest.mark.parametrize("kwargs, error, named", [
    ({"scheduler": lambda opt: 5}, TypeError, "scheduler: scheduler(optimizer) returned int 5"),
    ({"scheduler": 5}, TypeError, "scheduler: got int"),
    ({"loss_fn": nn.CrossEntropyLoss(reduction="none")}, ValueError, "loss_fn: returned a tensor of shape (16,)"),
    ({"loss_fn": lambda o, y: 1.0}, TypeError, "loss_fn: returned float 1.0"),
    ({"loss_fn": lambda o, y: nn.functional.cross_entropy(o, y).detach()}, ValueError,
     "loss_fn: returned a tensor without a gradient"),
    ({"loss_fn": "cross_entropy"}, TypeError, "loss_fn: got str"),
])
def test_scheduler_and_loss_fn_results_are_checked_before_any_step(kwargs, error, named):
    _refused(nn.Linear(5, 3), _xy(), error, named, **kwargs)


@pytest.mark.parametrize("value, error", [(0, ValueError), (-5, ValueError), (2.5, TypeError), (True, TypeError)])
def test_eval_batch_size_is_checked_with_the_other_arguments(value, error):
    _refused(nn.Linear(5, 3), _xy(), error, "eval_batch_size", eval_batch_size=value)


def test_a_single_callback_is_accepted():
    stop = EarlyStopping(monitor="train_loss", patience=0, min_delta=1e9)  # no epoch after the first improves
    history = fit(nn.Linear(5, 3), _xy(), R.replace(epochs=30), callbacks=stop, progress=False)
    assert stop.stopped_epoch == 2 and len(history.epochs) == 2


@pytest.mark.parametrize("callbacks, error, named", [
    ("abc", TypeError, "callbacks: got a string 'abc'"),
    ([object()], TypeError, "callbacks[0] (object): has none of the hooks fit calls"),
    (object(), TypeError, "callbacks[0] (object): has none of the hooks"),
    ([Misspelt()], ValueError, "'on_epoch_ends' that fit never calls; did you mean 'on_epoch_end'?"),
    ([Spy], TypeError, "callbacks[0] (type): is a class; accepted: an instance, e.g. Spy(...)"),
])
def test_a_callback_fit_would_never_call_is_refused_naming_the_nearest_hook(callbacks, error, named):
    _refused(nn.Linear(5, 3), _xy(), error, named, callbacks=callbacks)


def test_a_near_miss_beside_real_hooks_is_a_warning_naming_the_hook():
    callback = HalfMisspelt()
    with pytest.warns(UserWarning, match="callbacks\\[0\\] \\(HalfMisspelt\\): has a method 'on_fit_ends' that fit "
                                         "never calls; did you mean 'on_fit_end'"):
        fit(nn.Linear(5, 3), _xy(), R, callback, progress=False)
    assert callback.epochs == 1


@pytest.mark.parametrize("build, error, named", [
    (lambda: EarlyStopping(monitor=None), ValueError, "monitor=None: accepted: the name of a metric"),
    (lambda: EarlyStopping(monitor=""), ValueError, "monitor='': accepted"),
    (lambda: ModelCheckpoint("out", monitor=3), ValueError, "monitor=3"),
    (lambda: ModelCheckpoint("out", save_best="yes"), TypeError, "save_best='yes': accepted: True or False"),
    (lambda: ModelCheckpoint(None), TypeError, "directory=None"),
    (lambda: EarlyStopping(mode=None), ValueError, "mode=None"),
])
def test_early_stopping_and_checkpoint_arguments_are_checked_when_built(build, error, named):
    with pytest.raises(error, match=None) as info:
        build()
    assert named in str(info.value)


def test_a_scheduler_attached_after_fit_started_rules_the_learning_rate():
    model = nn.Linear(5, 3)
    history = fit(model, _xy(), R.replace(epochs=3), [LateScheduler()], progress=False)
    assert [r["lr"] for r in history.epochs] == pytest.approx([0.002, 0.001, 0.0005])


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(malformed=MALFORMED, form=st.sampled_from(["tensors", "tensor_dataset", "items", "loader"]))
def test_property_every_malformed_input_is_refused_naming_it_before_the_first_step(malformed, form):
    x, y = _xy(48)
    model, x, y, kwargs, named = _malformed(*malformed, x, y)
    if kwargs.get("eval_batch_size", 1) is None:
        named = "eval_batch_size"
    data = {"tensors": (x, y), "tensor_dataset": TensorDataset(x, y), "items": ItemsDataset(x, y),
            "loader": DataLoader(TensorDataset(x, y), batch_size=16)}[form]
    before, spy = _weights(model), Spy()
    callbacks = kwargs.pop("callbacks", [spy])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            history = fit(model, data, R, callbacks, progress=False, test_data=(x, y) if form == "loader" else None,
                          **kwargs)
    except (ValueError, TypeError) as exc:
        assert named is not None, f"refused a well-formed input {malformed}: {exc}"
        assert str(exc).startswith(named) or f"{named}[" in str(exc) or f"{named}'s" in str(exc) \
            or str(exc).startswith(f"{named}="), (malformed, str(exc))
        assert spy.steps == 0 and spy.epochs == 0
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
        return
    assert named is None, f"trained on {malformed}"
    assert len(history.epochs) == 1


def test_nan_inputs_are_named_as_the_data_not_a_divergence():
    from throughway.train import fit

    x = torch.rand(16, 1, 28, 28)
    x[5, 0, 3, 3] = float("nan")
    y = torch.randint(0, 10, (16,))
    model = create_model("mlp_plain", depth=2, width=8)
    with pytest.raises(ValueError, match=r"^data: the inputs hold NaN or infinite values in 1 sample\(s\) "
                                         r"\(the first: index 5\)"):
        fit(model, (x, y), "gresnet-mnist", progress=False)
