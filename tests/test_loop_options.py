"""The loop's GPU-and-scale options on the CPU (augmentation, bf16 autocast, channels_last), the CIFAR
recipes, momentum across learning-rate steps, and a conv run through run_training."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
import torch

from throughway.data import DataSplits, Split
from throughway.models import create_model
from throughway.train import (RunConfig, fit, get_recipe, learning_rate_at, learning_rate_at_step, parameter_groups,
                              run_training)
from throughway.train.loop import set_learning_rate


def _images(n: int = 32, size: int = 8) -> DataSplits:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 3, size, size, generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    return DataSplits("toy", 4, Split(x, y), Split(x[:8], y[:8]), Split(x[:8], y[:8]))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("preact_resnet", depth=8, width=4, num_classes=4, gated=True)


def _recipe(**changes):
    return get_recipe("preact-cifar", epochs=1, batch_size=16, **changes)


def _conv_input_dtypes(model: torch.nn.Module) -> list:
    seen: list = []
    conv = model.stem
    conv.register_forward_hook(lambda m, inputs, out: seen.append((out.dtype, inputs[0].is_contiguous(
        memory_format=torch.channels_last), m.training)))
    return seen


def _training(seen: list) -> list:
    # The training forwards: fit's probe of the first batch (issue 31) and evaluation run in eval mode.
    return [entry for entry in seen if entry[2]]


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    """torch's intra-op thread count is `n` within the block (the suite's workers run on 1)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_bf16_autocast_runs_on_cpu_and_keeps_float32_parameters():
    model = _model()
    seen = _conv_input_dtypes(model)
    history = fit(model, _images(), _recipe(), progress=False, amp=True)
    assert torch.isfinite(torch.tensor(history.epochs[0]["train_loss"]))
    assert _training(seen)[0][0] == torch.bfloat16  # the training forward ran in bf16
    assert seen[-1][0] == torch.float32  # evaluation runs in float32
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_channels_last_converts_model_and_batches_and_matches_default_numerics():
    model = _model()
    seen = _conv_input_dtypes(model)
    with _threads(2):  # channels_last on one CPU thread is refused (a oneDNN bug, docs/reliability.md)
        history = fit(model, _images(), _recipe(), progress=False, channels_last=True)
    assert model.stem.weight.is_contiguous(memory_format=torch.channels_last)
    assert _training(seen)[0][1]  # a training batch arrived in NHWC
    reference = fit(_model(), _images(), _recipe(), progress=False)
    assert history.epochs[0]["train_loss"] == pytest.approx(reference.epochs[0]["train_loss"], rel=1e-4)


def test_train_transform_is_applied_to_training_batches_only():
    calls: list[int] = []

    def transform(x: torch.Tensor) -> torch.Tensor:
        calls.append(len(x))
        return torch.zeros_like(x)

    model = _model()
    fit(model, _images(), _recipe(), progress=False, train_transform=transform)
    assert calls == [16, 16]
    trained_on_zeros = fit(_model(), _images(), _recipe(), progress=False, train_transform=transform)
    plain = fit(_model(), _images(), _recipe(), progress=False)
    assert trained_on_zeros.epochs[0]["train_loss"] != plain.epochs[0]["train_loss"]


def test_learning_rate_steps_keep_the_momentum_buffers():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    model(torch.rand(4, 3, 8, 8)).sum().backward()
    optimizer.step()
    before = {id(p): optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()}
    set_learning_rate(optimizer, 0.01)
    assert all(g["lr"] == 0.01 for g in optimizer.param_groups)
    assert all(torch.equal(optimizer.state[p]["momentum_buffer"], before[id(p)]) for p in model.parameters())

    # Through fit (which sets the lr with set_learning_rate): buffers persist across a learning-rate step.
    buffers: list[torch.Tensor] = []

    class Spy:
        def on_epoch_end(self, state, record):
            p = state.model.head[-1].weight
            buffers.append(state.optimizer.state_of(p)["momentum_buffer"].clone())

    fit(_model(), _images(), get_recipe("preact-cifar", epochs=4, batch_size=32), [Spy()], progress=False)
    assert len(buffers) == 4 and all(torch.count_nonzero(b) > 0 for b in buffers)


def test_cifar_recipes_hold_the_papers_settings():
    preact = get_recipe("preact-cifar")
    assert (preact.optimizer, preact.lr, preact.momentum, preact.nesterov, preact.weight_decay, preact.batch_size) \
        == ("sgd", 0.1, 0.9, True, 1e-4, 128)
    assert (preact.augment, preact.normalize) == ("crop-flip", "mean")
    assert [learning_rate_at(preact.replace(epochs=100), e) for e in (0, 49, 50, 74, 75)] == \
        pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001])
    wrn = get_recipe("wrn-cifar", epochs=100)
    assert (wrn.weight_decay, wrn.normalize, wrn.nesterov) == (5e-4, "mean-std", True)
    assert [learning_rate_at(wrn, e) for e in (0, 30, 60, 80)] == pytest.approx([0.1, 0.02, 0.004, 0.0008])
    for name in ("highway-conv-cifar", "highway-conv-mnist"):
        assert get_recipe(name).optimizer == "sgd" and get_recipe(name).momentum == 0.9
    with pytest.raises(ValueError, match="augment"):
        preact.replace(augment="mixup")


@pytest.mark.parametrize("k_decay", [False, True])
def test_k_decay_switch_moves_k_into_the_decayed_group(k_decay):
    model = _model()
    groups = parameter_groups(model, get_recipe("wrn-cifar", k_decay=k_decay))
    ks = {id(b.gate.k) for b in model.blocks}
    decayed = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    assert (ks <= decayed) == k_decay and (ks & decayed == set()) == (not k_decay)


def test_run_training_normalises_augments_and_infers_channels(tmp_path):
    data = _images(n=32)
    config = RunConfig(model="preact_resnet", depth=8, dataset="cifar10", recipe="preact-cifar", epochs=1,
                       model_kwargs={"width": 4, "gated": True}, recipe_overrides={"batch_size": 16})
    results = run_training(config, tmp_path / "run", progress=False, data=data)
    assert results["final"]["epochs_completed"] == 1
    assert results["model"]["config"]["in_channels"] == 3
    assert results["recipe"]["augment"] == "crop-flip" and results["config"]["amp"] is False
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_eval_batch_size_reaches_fit_and_does_not_change_the_numbers(tmp_path, monkeypatch):
    # One WRN-28-10 feature map of 10,000 images is 6.5 GB (float32): runs can evaluate in chunks.
    import throughway.train.run as run_module

    seen: list[int] = []
    real_fit = run_module.fit

    def spy(*args, **kwargs):
        seen.append(kwargs["eval_batch_size"])
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(run_module, "fit", spy)
    results = {}
    for chunk in (None, 3):
        config = RunConfig(model="preact_resnet", depth=8, dataset="cifar10", recipe="preact-cifar", epochs=1,
                           model_kwargs={"width": 4}, recipe_overrides={"batch_size": 16}, eval_batch_size=chunk)
        results[chunk] = run_training(config, tmp_path / f"run-{chunk}", progress=False, data=_images(n=32))
    assert seen == [10_000, 3]
    assert results[3]["final"]["test_error_pct"] == results[None]["final"]["test_error_pct"]
    assert results[3]["history"][0]["val_loss"] == pytest.approx(results[None]["history"][0]["val_loss"], rel=1e-5)


def test_gpu_options_through_run_training_checkpoint_and_resume_a_gated_wide_resnet(tmp_path):
    # The `--device cuda --amp --channels-last` path on the CPU: NHWC weights must be saved contiguous
    # (safetensors refuses strided tensors) and reload; an interrupted run (dropout, augmentation)
    # resumes from its checkpoint to the numbers of an uninterrupted one.
    config = RunConfig(model="wide_resnet", depth=10, dataset="cifar10", recipe="wrn-cifar", epochs=2,
                       model_kwargs={"widen_factor": 1, "dropout": 0.3, "gated": True},
                       recipe_overrides={"batch_size": 16}, amp=True, channels_last=True)
    with _threads(2):  # channels_last on one CPU thread is refused (a oneDNN bug, docs/reliability.md)
        _checkpoint_and_resume(config, tmp_path)


def _checkpoint_and_resume(config: RunConfig, tmp_path) -> None:
    from throughway.train.checkpoint import load_model

    whole = run_training(config, tmp_path / "whole", progress=False, data=_images(n=32))
    model = load_model(tmp_path / "whole" / "model.safetensors")
    assert sum(p.numel() for p in model.parameters()) == whole["model"]["parameters"]

    class Interrupt:
        def on_epoch_end(self, state, record):
            raise KeyboardInterrupt  # after the run's own callback has checkpointed epoch 1

    with pytest.raises(KeyboardInterrupt):
        run_training(config, tmp_path / "cut", progress=False, data=_images(n=32), callbacks=[Interrupt()])
    resumed = run_training(config, tmp_path / "cut", resume=True, progress=False, data=_images(n=32))
    assert [h["train_loss"] for h in resumed["history"]] == [h["train_loss"] for h in whole["history"]]
    assert resumed["final"]["k"] == whole["final"]["k"]


def test_channels_last_on_one_cpu_thread_is_refused_before_any_step():
    # torch 2.13's oneDNN corrupts the heap in a strided 1x1 convolution's backward pass on one CPU thread
    # (docs/reliability.md): fit refuses it by name, with the model's weights untouched.
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with _threads(1), pytest.raises(ValueError, match=r"channels_last=True on the CPU with 1 thread: .*blocks\.1\.shortcut"):
        fit(model, _images(), _recipe(), progress=False, channels_last=True)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


class _Rates:
    """Records the learning rate each optimiser step used (read after the step: the rate it was taken at)."""

    def __init__(self) -> None:
        self.rates: list[float] = []

    def on_step_end(self, state, step, loss):
        self.rates.append(state.optimizer.param_groups[0]["lr"])


def test_fit_sets_a_per_step_schedule_at_every_step():
    # warm-up and cosine decay per step (learning_rate_at_step), the language-model path's rule, in fit
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(40, 784, generator=g), torch.randint(0, 10, (40,), generator=g)
    torch.manual_seed(0)
    model = create_model("vit_patch", depth=1, width=8, heads=2)
    recipe = get_recipe("vit-mnist", epochs=3, batch_size=8, warmup_steps=4)  # 5 steps an epoch, 15 in all
    rates = _Rates()
    history = fit(model, (x, y), recipe, [rates], progress=False)
    expected = [learning_rate_at_step(recipe, s, 15) for s in range(15)]
    assert rates.rates == pytest.approx(expected, rel=1e-12)
    assert len(set(rates.rates)) == 15  # a new rate at every step: warm-up, then the cosine
    assert [r["lr"] for r in history.epochs] == pytest.approx(expected[::5])  # each epoch's first step
    assert rates.rates[3] == pytest.approx(recipe.lr * 4 / 5) and rates.rates[-1] < 0.05 * recipe.lr


def test_a_resumed_run_continues_the_per_step_schedule(tmp_path, fake_mnist_root):
    from conftest import Crash

    config = RunConfig(model="vit_patch", depth=1, recipe="vit-mnist", epochs=3, limit=64,
                       model_kwargs={"width": 8, "heads": 2}, recipe_overrides={"batch_size": 16, "warmup_steps": 3})
    whole_rates, cut_rates, resumed_rates = _Rates(), _Rates(), _Rates()
    whole = run_training(config, tmp_path / "whole", progress=False, callbacks=[whole_rates])
    with pytest.raises(KeyboardInterrupt):
        run_training(config, tmp_path / "cut", progress=False, callbacks=[cut_rates, Crash(after=1)])
    resumed = run_training(config, tmp_path / "cut", resume=True, progress=False, callbacks=[resumed_rates])
    recipe = get_recipe("vit-mnist", batch_size=16, warmup_steps=3, epochs=3)  # 4 steps an epoch of 64 images
    assert whole_rates.rates == pytest.approx([learning_rate_at_step(recipe, s, 12) for s in range(12)], rel=1e-12)
    assert cut_rates.rates + resumed_rates.rates == whole_rates.rates  # the resumed run goes on from step 4
    timing = {"epoch_time_s", "elapsed_s"}
    assert ([{k: v for k, v in r.items() if k not in timing} for r in resumed["history"]]
            == [{k: v for k, v in r.items() if k not in timing} for r in whole["history"]])


def test_a_dataloader_without_a_length_is_refused_with_a_per_step_schedule():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from ((torch.rand(784), torch.tensor(1)) for _ in range(8))

    model = create_model("vit_patch", depth=1, width=8, heads=2)
    loader = torch.utils.data.DataLoader(Stream(), batch_size=4)
    with pytest.raises(ValueError, match=r"schedule='warmup-cosine' sets the learning rate at every step .* a "
                                         r"DataLoader without a length"):
        fit(model, loader, get_recipe("vit-mnist", epochs=1), progress=False)
