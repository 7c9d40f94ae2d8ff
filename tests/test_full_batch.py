"""train.full_batch: StackedGD keeps every tensor it creates on its device, and the three full-batch
studies (hessian_dynamics, shortcut_lr, weight_norms) give it theirs (issue 23: `--device cuda`
crashed them with data on the GPU and weights, learning rates or the active mask on the CPU).

No GPU is needed: the meta device stands in for it (tensors with shapes and no data). A study run
with device "meta" must build its trainer with every tensor there (its data went there before); the
trainer then stops the run, since meta tensors have no values to report.
"""

from __future__ import annotations

import pytest
import torch

from throughway.study.shortcut import network_kwargs
from throughway.train.full_batch import StackedGD


def test_stacked_gd_creates_every_tensor_on_its_device():
    gd = StackedGD(network_kwargs("shortcut2-zero", 2), [0, 1], [0.1, 0.2], device="meta")
    assert {t.device.type for t in (gd.weights, gd.lrs, gd.active)} == {"meta"}
    assert {p.device.type for p in gd.model_at(1).parameters()} == {"meta"}


class _Reached(Exception):
    """Raised by the checked trainer once it has seen where the study put its tensors."""


def _checked_trainer(monkeypatch, module, seen: list[set[str]]) -> None:
    class Checked(StackedGD):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append({t.device.type for t in (self.weights, self.lrs, self.active)})
            raise _Reached

    monkeypatch.setattr(module, "StackedGD", Checked)


@pytest.mark.parametrize("study", ["hessian_dynamics", "shortcut_lr", "weight_norms"])
def test_each_full_batch_study_puts_data_and_trainer_on_the_device(study, fake_mnist_root, tmp_path, monkeypatch):
    from throughway import experiments

    module = getattr(experiments, study)
    root = str(fake_mnist_root)
    config = {
        "hessian_dynamics": lambda: module.Config(depth=2, networks=("shortcut2-zero",), seeds=(0,), epochs=2,
                                                  hessian_points=2, data_dir=root, device="meta"),
        "shortcut_lr": lambda: module.Config(depths=(2,), networks=("shortcut2-zero",), lr_exponents=(-2.0,), epochs=2,
                                             data_dir=root, device="meta"),
        "weight_norms": lambda: module.Config(depths=(2,), epochs=2, relu_epochs=2, relu_subset=50, data_dir=root,
                                              device="meta"),
    }[study]()
    seen: list[set[str]] = []
    _checked_trainer(monkeypatch, module, seen)
    with pytest.raises(_Reached):
        module.run(config, tmp_path / study, progress=False)
    assert seen == [{"meta"}]


def test_full_batch_studies_train_through_the_one_loop_and_its_divergence_rule():
    from throughway.train.full_batch import train_full_batch

    kwargs = network_kwargs("shortcut2-zero", 2, width=4)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=generator, dtype=torch.float64)
    y = torch.randn(32, 4, generator=generator, dtype=torch.float64)
    reference = StackedGD(kwargs, [0, 1], [0.05, 60.0])  # the second learning rate diverges
    steps = [reference.step(x, y)[0].tolist() for _ in range(6)]

    class Seen:
        def __init__(self):
            self.epochs, self.ends = [], 0

        def on_epoch_end(self, state, record):
            self.epochs.append(record["epoch"])

        def on_fit_end(self, state):
            self.ends += 1

    seen = [Seen(), Seen()]
    gd = StackedGD(kwargs, [0, 1], [0.05, 60.0])
    histories = train_full_batch(gd, x, y, 6, [[seen[0]], [seen[1]]])
    # network 0: six epochs, each record the loss before its step, as StackedGD.step returns it
    assert [r["train_loss"] for r in histories[0].epochs] == [s[0] for s in steps]
    assert seen[0].epochs == [1, 2, 3, 4, 5, 6] and seen[0].ends == 1
    # network 1 diverged: the loop's rule ended it once, with its history marked and its weights frozen
    bad = reference.diverged_at[1]
    assert bad is not None and gd.diverged_at[1] == bad and not bool(gd.active[1])
    assert histories[1].diverged and histories[1].diverged_at["epoch"] == bad + 1
    assert len(histories[1].epochs) == bad and seen[1].ends == 1
    assert bool(torch.isfinite(gd.weights[1]).all())
