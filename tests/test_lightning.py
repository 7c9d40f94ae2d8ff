"""throughway.integrations.lightning on a real Lightning Trainer (lightning is in the dev extra)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pl = pytest.importorskip("lightning.pytorch")

from throughway import add_gates  # noqa: E402
from throughway.integrations.lightning import GateCallback, gate_aware_groups  # noqa: E402
from throughway.layers import ScalarGate  # noqa: E402


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(8, 3)
        add_gates(self, "relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _index: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, weight_decay=0.1)


def test_gate_callback_logs_every_gate_by_name_and_keeps_gates_undecayed(tmp_path):
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4, 8), torch.randint(0, 3, (32,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model = Net()
    callback = GateCallback()
    trainer = pl.Trainer(max_epochs=2, callbacks=[callback], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                         default_root_dir=tmp_path)
    trainer.fit(model, loader)
    assert callback.moved == 4  # two layers, two branches each
    gates = {id(m.k) for m in model.modules() if isinstance(m, ScalarGate)}
    (optimizer,) = trainer.optimizers
    for group in optimizer.param_groups:
        ids = {id(p) for p in group["params"]}
        assert ids <= gates and group["weight_decay"] == 0.0 or not ids & gates
        assert group["lr"] == 0.05
    assert len(callback.history) == 2
    names = [k for k in callback.history[-1] if k.startswith("gate/")]
    assert names == ["gate/encoder.layers.0.attn", "gate/encoder.layers.0.ff", "gate/encoder.layers.1.attn",
                     "gate/encoder.layers.1.ff"]
    assert "gate/encoder.layers.1.ff" in trainer.callback_metrics
    # The gates moved from 1 (they trained) but were not decayed towards 0 by weight_decay=0.1
    assert any(abs(v - 1.0) > 1e-6 for k, v in callback.history[-1].items() if k.startswith("gate/"))


def test_gate_aware_groups_leaves_undecayed_groups_alone():
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert gate_aware_groups(optimizer, model) == 0 and len(optimizer.param_groups) == 1
    with pytest.raises(TypeError, match="prefix"):
        GateCallback(prefix=3)  # type: ignore[arg-type]


# -- the gates' groups and the LR schedulers Lightning built before the callback split them ----------------

S = torch.optim.lr_scheduler
# Every torch LR scheduler, built over the one group Net.configure_optimizers makes (the dict: Lightning's
# scheduler config; a scheduler stepped per batch has interval "step").
SCHEDULERS = {
    "LambdaLR": lambda o: S.LambdaLR(o, lambda epoch: 0.5 ** epoch),
    "MultiplicativeLR": lambda o: S.MultiplicativeLR(o, lambda epoch: 0.5),
    "StepLR": lambda o: S.StepLR(o, 1, gamma=0.5),
    "MultiStepLR": lambda o: S.MultiStepLR(o, [1, 2], gamma=0.5),
    "ConstantLR": lambda o: S.ConstantLR(o, factor=0.5, total_iters=1),
    "LinearLR": lambda o: S.LinearLR(o, start_factor=0.5, total_iters=2),
    "ExponentialLR": lambda o: S.ExponentialLR(o, 0.5),
    "PolynomialLR": lambda o: S.PolynomialLR(o, total_iters=4),
    "CosineAnnealingLR": lambda o: S.CosineAnnealingLR(o, 4),
    "CyclicLR": lambda o: {"scheduler": S.CyclicLR(o, 0.01, 0.05, step_size_up=2), "interval": "step"},
    "OneCycleLR": lambda o: {"scheduler": S.OneCycleLR(o, 0.05, total_steps=12), "interval": "step"},
    "CosineAnnealingWarmRestarts": lambda o: S.CosineAnnealingWarmRestarts(o, 2),
    # no epoch is an improvement (threshold 10: a relative fall of 1000%), so the lr is cut at every epoch's end
    "ReduceLROnPlateau": lambda o: {"scheduler": S.ReduceLROnPlateau(o, patience=0, threshold=10.0), "monitor": "loss"},
    "SequentialLR": lambda o: S.SequentialLR(o, [S.ConstantLR(o, 0.5, 1), S.ExponentialLR(o, 0.5)], [1]),
    "ChainedScheduler": lambda o: S.ChainedScheduler([S.ConstantLR(o, 0.5, 2), S.ExponentialLR(o, 0.5)]),
}


class ScheduledNet(Net):
    def __init__(self, schedule) -> None:
        super().__init__()
        self.schedule = schedule
        self.seen_lrs: list[list[float]] = []

    def training_step(self, batch, index):
        loss = super().training_step(batch, index)
        self.log("loss", loss, on_step=False, on_epoch=True)
        self.seen_lrs.append([group["lr"] for group in self.trainer.optimizers[0].param_groups])
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=0.1)
        return {"optimizer": optimizer, "lr_scheduler": self.schedule(optimizer)}


def _fit(model: pl.LightningModule, callback: GateCallback, tmp_path, epochs: int = 2) -> pl.Trainer:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(8, 4, 8), torch.randint(0, 3, (8,)))
    trainer = pl.Trainer(max_epochs=epochs, callbacks=[callback], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                         default_root_dir=tmp_path)
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4))
    return trainer


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_every_torch_scheduler_steps_the_gates_group_split_off_after_it_was_built(tmp_path, name):
    # LambdaLR, MultiplicativeLR, CyclicLR, CosineAnnealingWarmRestarts and ReduceLROnPlateau failed after the
    # first epoch (zip() argument 2 is shorter than argument 1) when their per-group state was not extended.
    model = ScheduledNet(SCHEDULERS[name])
    callback = GateCallback()
    trainer = _fit(model, callback, tmp_path)
    assert callback.moved == 4 and trainer.current_epoch == 2
    (optimizer,) = trainer.optimizers
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.1, 0.0]
    # The gates' group follows its source group's schedule at every step, and the schedule moved the lr.
    assert all(lrs[0] == lrs[1] for lrs in model.seen_lrs), model.seen_lrs
    assert len({lrs[0] for lrs in model.seen_lrs}) > 1, model.seen_lrs
    (config,) = trainer.lr_scheduler_configs
    for scheduler in [config.scheduler, *getattr(config.scheduler, "_schedulers", [])]:
        for state in ("base_lrs", "_last_lr", "lr_lambdas", "min_lrs", "max_lrs"):
            assert len(getattr(scheduler, state, [0, 0])) == 2, (type(scheduler).__name__, state)


def test_the_gates_groups_built_in_configure_optimizers_need_no_split(tmp_path):
    from throughway.train import param_groups

    class GroupedNet(ScheduledNet):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(param_groups(self, weight_decay=0.1), lr=0.05, momentum=0.9)
            return {"optimizer": optimizer, "lr_scheduler": S.LambdaLR(optimizer, lambda epoch: 0.5 ** epoch)}

    model = GroupedNet(None)
    callback = GateCallback()
    trainer = _fit(model, callback, tmp_path)
    assert callback.moved == 0  # param_groups put every gate in the undecayed group already
    gates = {id(m.k) for m in model.modules() if isinstance(m, ScalarGate)}
    (optimizer,) = trainer.optimizers
    assert all(group["weight_decay"] == 0.0 for group in optimizer.param_groups
               if gates & {id(p) for p in group["params"]})
    assert model.seen_lrs[-1][0] == pytest.approx(0.05 * 0.5)


def test_a_scheduler_of_unknown_per_group_state_is_refused_before_anything_changes(tmp_path):
    class OwnScheduler(S.LRScheduler):
        def __init__(self, optimizer):
            self.factors = [1.0 for _ in optimizer.param_groups]  # its own state, one entry per group
            super().__init__(optimizer)

        def get_lr(self):
            return [base * f for base, f in zip(self.base_lrs, self.factors, strict=True)]

    model = ScheduledNet(OwnScheduler)
    with pytest.raises(ValueError, match=r"scheduler OwnScheduler: .*param_groups\(model, weight_decay\)"):
        _fit(model, GateCallback(), tmp_path)
    assert model.seen_lrs == []  # no step was taken
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, weight_decay=0.1)
    with pytest.raises(ValueError, match="OwnScheduler"):
        gate_aware_groups(optimizer, model, [OwnScheduler(optimizer)])
    assert len(optimizer.param_groups) == 1  # nothing was split
