"""fit's `loss_read="lagged"`: each step's loss read after the next step's forward pass is launched, with
"step"'s results: the same records, `on_step_end` calls, divergence step and final weights and buffers."""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
from torch.nn import functional as F

from throughway.data.augment import RandomCropFlip
from throughway.models import create_model
from throughway.train import fit, get_recipe
from throughway.train.loop import _ModuleEngine

IN, CLASSES, N = 12, 4, 48  # batch 8: 6 steps an epoch
TIMES = ("epoch_time_s", "elapsed_s")


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, IN, generator=g), torch.randint(0, CLASSES, (N,), generator=g)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights for every mode
    return create_model("mlp_gated_residual", depth=2, width=8, in_features=IN, num_classes=CLASSES)


class Steps:
    """Records every on_step_end's (step, loss) and, optionally, stops at step `stop_at`."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.seen: list[tuple[int, float]] = []
        self.stop_at = stop_at

    def on_step_end(self, state: Any, step: int, loss: float) -> None:
        self.seen.append((step, loss))
        if step == self.stop_at:
            state.stop = True


def _train(loss_read: str, recipe: Any, *, stop_at: int | None = None,
           loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> dict[str, Any]:
    model, steps = _model(), Steps(stop_at)
    x, y = _data()
    vx, vy = _data(1)
    history = fit(model, (x, y), recipe, [steps], val_data=(vx[:16], vy[:16]), loss_fn=loss_fn, progress=False,
                  loss_read=loss_read)
    return {"model": model, "history": history, "steps": steps.seen}


def _records(history: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in record.items() if k not in TIMES} for record in history.epochs]


def _assert_same(step: dict[str, Any], lagged: dict[str, Any]) -> None:
    assert _records(lagged["history"]) == _records(step["history"])
    assert lagged["history"].diverged_at == step["history"].diverged_at
    assert lagged["steps"] == step["steps"]
    a, b = step["model"].state_dict(), lagged["model"].state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("recipe", [get_recipe("gresnet-mnist", epochs=2, batch_size=8),
                                    get_recipe("vit-mnist", epochs=2, batch_size=8, warmup_steps=3)],
                         ids=["constant", "per-step-schedule"])
def test_lagged_gives_the_histories_and_weights_of_step(recipe):
    step, lagged = _train("step", recipe), _train("lagged", recipe)
    assert len(step["history"].epochs) == 2 and len(step["steps"]) == 12 and step["history"].diverged_at is None
    _assert_same(step, lagged)
    tracked = [v for k, v in step["model"].state_dict().items() if k.endswith("num_batches_tracked")]
    assert tracked and all(int(t) == 12 for t in tracked)  # BatchNorm's statistics trained, and compared above


def test_lagged_keeps_the_random_streams_of_step_for_dropout_and_augmentation():
    """A conv net with dropout trained with an on-device augmentation: every forward pass and augmentation
    draws its random numbers in "step"'s order, so the weights are equal."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(24, 3, 8, 8, generator=g), torch.randint(0, CLASSES, (24,), generator=g)
    runs = []
    for loss_read in ("step", "lagged"):
        torch.manual_seed(0)
        model = create_model("wide_resnet", depth=10, widen_factor=1, dropout=0.3, gated=True, num_classes=CLASSES)
        history = fit(model, (x, y), get_recipe("wrn-cifar", epochs=2, batch_size=8), progress=False,
                      train_transform=RandomCropFlip(), loss_read=loss_read)
        runs.append({"model": model, "history": history, "steps": []})
    _assert_same(*runs)


def test_lagged_reads_each_loss_after_the_next_forward_pass():
    """What lagged is for: on_step_end(t) runs once step t + 1's forward pass has been launched (except the
    fit's first step, read at once, and each epoch's last); "step" calls it before that forward pass."""
    def forwards_at_step_end(loss_read: str) -> list[int]:
        model, forwards, at = _model(), [0], []
        model.register_forward_hook(lambda m, i, o: forwards.__setitem__(0, forwards[0] + m.training))

        class Count:
            def on_step_end(self, state: Any, step: int, loss: float) -> None:
                at.append(forwards[0])

        fit(model, _data(), get_recipe("gresnet-mnist", epochs=2, batch_size=8), [Count()], progress=False,
            loss_read=loss_read)
        return at

    assert forwards_at_step_end("step") == list(range(1, 13))
    assert forwards_at_step_end("lagged") == [1, 3, 4, 5, 6, 6, 8, 9, 10, 11, 12, 12]


def _nan_at(epoch_step: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Cross-entropy whose training loss (evaluation runs under no_grad) is NaN at training call `epoch_step`."""
    calls = [0]

    def loss_fn(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(outputs, y)
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] == epoch_step:
                return loss * float("nan")  # with its gradient: lagged mode's backward pass applies it
        return loss

    return loss_fn


@pytest.mark.parametrize("call", [9, 12], ids=["within-the-epoch", "the-epoch's-last-step"])
def test_a_divergence_is_reported_at_its_step_and_rolled_back_as_in_step(call):
    recipe = get_recipe("gresnet-mnist", epochs=2, batch_size=8)
    step, lagged = _train("step", recipe, loss_fn=_nan_at(call)), _train("lagged", recipe, loss_fn=_nan_at(call))
    assert step["history"].diverged_at == {"epoch": 2, "step": call - 7, "loss": "nan"}
    assert len(step["history"].epochs) == 1 and len(step["steps"]) == call - 1
    _assert_same(step, lagged)
    assert all(torch.isfinite(t).all() for t in lagged["model"].state_dict().values() if t.is_floating_point())


@pytest.mark.parametrize("stop_at", [4, 6, 1], ids=["within-an-epoch", "at-an-epoch's-end", "at-the-first-step"])
def test_a_stop_in_on_step_end_leaves_the_weights_and_buffers_of_step(stop_at):
    """The forward pass lagged mode launched after the stopping step is discarded: BatchNorm's running
    statistics and counter are given back their values, so the state_dicts are equal."""
    recipe = get_recipe("gresnet-mnist", epochs=2, batch_size=8)
    step, lagged = _train("step", recipe, stop_at=stop_at), _train("lagged", recipe, stop_at=stop_at)
    assert [s for s, _ in step["steps"]] == list(range(1, stop_at + 1))
    _assert_same(step, lagged)


@pytest.mark.parametrize("value", ["eager", "Lagged", None, 1])
def test_a_bad_loss_read_is_refused_before_training(value):
    model, touched = _model(), []
    before = {k: v.clone() for k, v in model.state_dict().items()}

    class Watch:
        def on_fit_start(self, state: Any) -> None:
            touched.append("on_fit_start")

    with pytest.raises(ValueError, match=r"^loss_read: .*'step'.*'lagged'"):
        fit(model, _data(), get_recipe("gresnet-mnist", epochs=1, batch_size=8), [Watch()], progress=False,
            loss_read=value)
    assert touched == []
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_engine_keeps_the_setting_and_step_is_the_default():
    assert _ModuleEngine.__init__.__kwdefaults__["loss_read"] == "step"
    assert fit.__kwdefaults__["loss_read"] == "step"


# ----------------------------------------------------------------------------------------------
# On a GPU (skipped without one; scripts/device_check.sh runs them)
# ----------------------------------------------------------------------------------------------
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
def test_on_a_gpu_lagged_trains_what_step_trains():
    """The loss comes through a non-blocking copy on CUDA: the same numbers reach the records and callbacks."""
    runs = []
    for loss_read in ("step", "lagged"):
        model, steps = _model().cuda(), Steps(stop_at=9)
        x, y = _data()
        history = fit(model, (x.cuda(), y.cuda()), get_recipe("gresnet-mnist", epochs=2, batch_size=8), [steps],
                      progress=False, loss_read=loss_read)
        runs.append({"model": model, "history": history, "steps": steps.seen})
    _assert_same(*runs)


@pytest.mark.gpu
@needs_cuda
def test_on_a_gpu_lagged_does_not_synchronise_per_step():
    """With a torch optimiser (no host wait of its own), "step" waits for the device once per step and
    "lagged" a fixed number of times per fit, whatever the number of steps."""
    def synchronisations(loss_read: str, steps: int) -> int:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(8 * steps, IN, generator=g).cuda()
        y = torch.randint(0, CLASSES, (8 * steps,), generator=g).cuda()
        model = _model().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        recipe = get_recipe("gresnet-mnist", epochs=1, batch_size=8)
        fit(model, (x, y), recipe, optimizer=optimizer, progress=False, loss_read=loss_read)  # warm-up
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fit(model, (x, y), recipe, optimizer=optimizer, progress=False, loss_read=loss_read)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught)

    assert synchronisations("step", 40) >= synchronisations("step", 4) + 36  # the counter sees the per-step read
    assert synchronisations("lagged", 40) == synchronisations("lagged", 4)
