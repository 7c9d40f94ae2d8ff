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
