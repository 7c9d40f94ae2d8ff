"""One block representation for every network: the toolkit's blocks and every library's are specs,
checked against the model; gates keep every original name and survive the libraries' own save, load
and trainers; every question about gates reads one lister (layers.blocks.find_branches)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from throughway import add_gates, create_model, register_block
from throughway.analysis import find_blocks, lesion, prune, removable_blocks, unremovable_blocks
from throughway.analysis.distance import block_identity_distance
from throughway.layers import (ResidualBlock, ScalarGate, VectorGate, branch_gate_values, check_blocks, dense_unit,
                               find_branches, fold_gates, gate_parameters, restore_gates)
from throughway.layers.blocks import unregister_block
from throughway.train import get_recipe, param_groups


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, atol=1e-6, rtol=1e-5)


# ---- the toolkit's blocks are specs like any other --------------------------------------------------

def test_the_toolkits_blocks_are_read_through_registered_specs():
    from throughway.layers import AugmentedLayer, HighwayLayer, PlainBlock, block_spec

    for cls in (ResidualBlock, PlainBlock, AugmentedLayer, HighwayLayer):
        assert block_spec(cls.__new__(cls)) is not None, cls
    model = create_model("mlp_gated_residual", depth=4, width=8, in_features=5, num_classes=3)
    refs = find_branches(model)
    assert list(refs) == ["blocks.0", "blocks.1"]
    assert refs["blocks.0"].gate_path == "blocks.0.gate" and isinstance(refs["blocks.0"].gate, ScalarGate)
    highway = create_model("mlp_highway", depth=3, width=8, in_features=5, num_classes=3)
    assert all(ref.gate is None and ref.spec.close == "gate" for ref in find_branches(highway).values())
    # closing a highway layer (T = 0) and an augmented layer (g = 0) leaves the identity: the check passes
    for name in ("mlp_highway", "mlp_augmented", "mlp_residual", "mlp_rezero"):
        net = create_model(name, depth=4, width=8, in_features=5, num_classes=3)
        check_blocks(net, torch.randn(6, 5))


def test_the_same_rezero_gate_reads_the_same_distance_on_every_network():
    torch.manual_seed(0)
    ours = create_model("mlp_rezero", depth=2, width=8, in_features=5, num_classes=3).blocks[0]
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True)
    add_gates(nn.Sequential(layer), "rezero")
    assert block_identity_distance(ours) == ("gated", 0.0)
    assert block_identity_distance(layer) == ("gated", 0.0)


def test_layerscale_starts_alike_both_ways_of_building_the_net():
    torch.manual_seed(0)
    built = create_model("mlp_layerscale", depth=20, width=8, in_features=5, num_classes=3)
    gated = add_gates(create_model("mlp_residual", depth=20, width=8, in_features=5, num_classes=3), "layerscale")
    assert built.blocks[0].gate.k[0].item() == gated.blocks[0].gate.k[0].item() == pytest.approx(0.1)


# ---- a spec is checked against the model -------------------------------------------------------------

class SharedEndBlock(nn.Module):
    """torchvision's Swin shape: both residual adds go through one stochastic-depth module."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), nn.Linear(dim, dim)
        self.norm2, self.mlp = nn.LayerNorm(dim), nn.Linear(dim, dim)
        self.stochastic_depth = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.stochastic_depth(self.attn(self.norm1(x)))
        return x + self.stochastic_depth(self.mlp(self.norm2(x)))


def test_two_branches_ending_at_one_module_are_refused_naming_both():
    net = nn.Sequential(SharedEndBlock(), SharedEndBlock())
    register_block(SharedEndBlock, {"attn": "stochastic_depth", "ff": "stochastic_depth"}, channel_dim=-1)
    try:
        with pytest.raises(ValueError, match=r"branches 'attn' and 'ff' both end at module 'stochastic_depth'"):
            find_branches(net)
        # the right registration: each branch ends at its own module, and the check on an example agrees
        register_block(SharedEndBlock, {"attn": "attn", "ff": "mlp"}, channel_dim=-1,
                       check=(net, torch.randn(2, 3, 8)))
        assert list(find_branches(net)) == ["0.attn", "0.ff", "1.attn", "1.ff"]
    finally:
        unregister_block(SharedEndBlock)


class SandwichLayer(nn.Module):
    """Gemma 2's layout: the branch output is normalised before the add, so the branch ends at that norm."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.input_layernorm, self.self_attn = nn.LayerNorm(dim), nn.Linear(dim, dim)
        self.post_attention_layernorm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x)))


def test_a_branch_end_placed_before_a_normalisation_is_refused_and_the_old_spec_kept():
    torch.manual_seed(0)
    net = nn.Sequential(SandwichLayer(), SandwichLayer())
    x = torch.randn(2, 3, 8)
    register_block(SandwichLayer, "post_attention_layernorm", channel_dim=-1)
    try:
        # a gate at self_attn's output would be undone by the LayerNorm after it: the check says so
        with pytest.raises(ValueError, match=r"branch '0'.*scaling its registered end '0.self_attn' by 0.5"):
            register_block(SandwichLayer, "self_attn", channel_dim=-1, check=(net, x))
        assert find_branches(net)["0"].end == "0.post_attention_layernorm"  # the earlier registration is back
        assert check_blocks(net, x).checked == ("0", "1")
    finally:
        unregister_block(SandwichLayer)


class ScaledShortcutBlock(nn.Module):
    """Registered as if its shortcut were the identity, which it is not."""

    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x + self.f(x)


def test_a_shortcut_that_is_not_the_identity_fails_the_check_naming_the_block():
    net = nn.Sequential(ScaledShortcutBlock())
    register_block(ScaledShortcutBlock, "f")
    try:
        with pytest.raises(ValueError, match=r"block '0' \(ScaledShortcutBlock\): with every branch closed it does "
                                             r"not return its input"):
            removable_blocks(net, example_input=torch.randn(3, 4))
        with pytest.raises(ValueError, match="does not return its input"):
            find_blocks(net, example_input=torch.randn(3, 4))
        with pytest.raises(ValueError, match="does not return its input"):
            add_gates(net, example_input=torch.randn(3, 4))
        assert not hasattr(net, "gates_added")  # refused before any gate was added
    finally:
        unregister_block(ScaledShortcutBlock)


class InvertedResidual(nn.Module):
    """timm's InvertedResidual: the input is added only when the block has a skip."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.has_skip = cin == cout and stride == 1
        self.conv_pw = nn.Conv2d(cin, 2 * cin, 1)
        self.conv_dw = nn.Conv2d(2 * cin, 2 * cin, 3, stride, 1, groups=2 * cin)
        self.conv_pwl = nn.Conv2d(2 * cin, cout, 1)
        self.bn3 = nn.BatchNorm2d(cout)
        self.drop_path = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.bn3(self.conv_pwl(torch.relu(self.conv_dw(torch.relu(self.conv_pw(x))))))
        if self.has_skip:
            x = self.drop_path(x) + shortcut
        return x


def test_a_block_whose_skip_is_conditional_is_plain_where_it_has_none():
    torch.manual_seed(0)
    net = nn.Sequential(InvertedResidual(4, 8, 2), InvertedResidual(8, 8), InvertedResidual(8, 8))
    net.eval()
    x = torch.randn(2, 4, 8, 8)
    register_block(InvertedResidual, ("drop_path", "bn3"), skip=lambda block: block.has_skip, fold="bn3")
    try:
        assert removable_blocks(net, example_input=x) == ["1", "2"]
        assert "no shortcut" in unremovable_blocks(net)["0"]
        with pytest.raises(ValueError, match="'0' is a InvertedResidual without a shortcut"):
            with lesion(net, "0"):
                net(x)
        with pytest.raises(ValueError, match="has no identity shortcut"):
            prune(net, ["0"])  # not a crash inside torch: refused by name
        with pytest.raises(ValueError, match=r"block '0' .*maps \(2, 4, 8, 8\) to \(2, 8, 4, 4\)"):
            prune(net, ["0"], example_input=x)
        add_gates(net)
        assert list(find_branches(net)) == ["0", "1", "2"] and net.gates_added["branches"] == ["1", "2"]
    finally:
        unregister_block(InvertedResidual)


# ---- gates keep the original names; the libraries' save, load and trainers ------------------------------

transformers_missing = pytest.mark.skipif(
    __import__("importlib").util.find_spec("transformers") is None, reason="transformers is not installed")


def _llama(layers: int = 3):
    import transformers

    config = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                                      num_attention_heads=2, num_key_value_heads=2, vocab_size=40,
                                      attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval(), torch.randint(0, 40, (2, 7))


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


@transformers_missing
def test_add_gates_renames_nothing_and_a_pretrained_checkpoint_loads_into_the_gated_model():
    model, ids = _llama()
    pretrained = {k: v.clone() for k, v in model.state_dict().items()}
    before = _logits(model, ids)
    add_gates(model, "relu")
    keys = set(model.state_dict())
    assert set(pretrained) <= keys  # mlp.down_proj.weight is still mlp.down_proj.weight
    added = sorted(keys - set(pretrained))
    assert added[:2] == ["model.layers.0.branch_gates.attn.k", "model.layers.0.branch_gates.ff.k"] and len(added) == 6
    fresh, _ = _llama()
    add_gates(fresh, "relu")
    result = fresh.load_state_dict(pretrained, strict=False)
    assert sorted(result.missing_keys) == added and not result.unexpected_keys
    assert _same(_logits(fresh, ids), before)


@transformers_missing
def test_a_gated_model_round_trips_through_save_pretrained_with_one_call(tmp_path):
    import transformers

    model, ids = _llama()
    add_gates(model, "relu")
    with torch.no_grad():
        for i, gate in enumerate(gate_parameters(model)):
            gate.fill_(0.3 + 0.2 * i)
    expected = _logits(model, ids)
    model.save_pretrained(tmp_path / "saved")
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "saved", attn_implementation="eager").eval()
    assert not _same(_logits(loaded, ids), expected)  # without its gates it is another function
    restore_gates(loaded, tmp_path / "saved")
    assert torch.equal(_logits(loaded, ids), expected)
    with pytest.raises(ValueError, match="no record of the gates"):
        restore_gates(_llama()[0], tmp_path / "saved")


@transformers_missing
@pytest.mark.parametrize("kind", ["relu", "layerscale"])
def test_fold_gates_multiplies_them_into_the_branch_and_leaves_the_original_names(kind):
    import transformers

    config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=40, n_positions=16,
                                     attn_implementation="eager")
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(config).eval()
    original = set(gpt2.state_dict())
    ids = torch.randint(0, 40, (2, 7))
    add_gates(gpt2, kind)
    with torch.no_grad():
        for gate in gate_parameters(gpt2):
            gate.copy_(torch.rand_like(gate) + 0.2)
    expected = _logits(gpt2, ids)
    fold_gates(gpt2, example_input=ids)
    assert set(gpt2.state_dict()) == original and not hasattr(gpt2, "gates_added")
    assert _same(_logits(gpt2, ids), expected)


@transformers_missing
def test_a_pruned_hugging_face_model_round_trips_with_its_config(tmp_path):
    import transformers

    model, ids = _llama(layers=4)
    pruned = prune(model, ["model.layers.1", "model.layers.2"])
    assert pruned.config.num_hidden_layers == 2 and model.config.num_hidden_layers == 4
    assert [layer.self_attn.layer_idx for layer in pruned.model.layers] == [0, 1]
    pruned.save_pretrained(tmp_path / "pruned")
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "pruned", attn_implementation="eager").eval()
    assert len(loaded.model.layers) == 2 and torch.equal(_logits(loaded, ids), _logits(pruned, ids))


@transformers_missing
def test_prune_of_a_meta_device_model_names_the_device():
    import transformers

    config = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, vocab_size=40)
    with torch.device("meta"):
        model = transformers.LlamaModel(config)
    with pytest.raises(ValueError, match="is on the meta device"):
        prune(model, [0])


@transformers_missing
def test_the_trainer_callback_keeps_gates_out_of_weight_decay_and_logs_them(tmp_path):
    import transformers
    from throughway.integrations.transformers import GateTrainerCallback

    model, _ = _llama(layers=2)
    model.train()
    add_gates(model, "relu")

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            ids = torch.arange(i, i + 6) % 40
            return {"input_ids": ids, "labels": ids}

    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                                          max_steps=2, weight_decay=0.1, logging_steps=1, report_to=[],
                                          save_strategy="no", use_cpu=True, lr_scheduler_type="cosine",
                                          warmup_steps=1)
    callback = GateTrainerCallback()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens())
    callback.attach(trainer)
    assert trainer.callback_handler.callbacks[0] is callback  # before the reporting integrations
    trainer.train()
    gates = {id(p) for p in gate_parameters(model)}
    assert callback.moved == 4
    for group in trainer.optimizer.param_groups:
        inside = sum(id(p) in gates for p in group["params"])
        assert inside == 0 or group["weight_decay"] == 0.0
    logged = [row for row in trainer.state.log_history if "gate/model.layers.0.attn" in row]
    assert len(logged) >= 2 and len(callback.history) >= 2  # each step, and the run's closing summary


def test_param_groups_honours_the_models_own_no_weight_decay_list():
    class WithTokens(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cls_token = nn.Parameter(torch.zeros(1, 1, 8))
            self.pos_embed = nn.Parameter(torch.zeros(1, 4, 8))
            self.table = nn.Parameter(torch.zeros(5, 2))
            self.proj = nn.Linear(8, 8)

        def no_weight_decay(self) -> set[str]:
            return {"cls_token", "pos_embed"}

    wrapped = nn.Sequential(WithTokens())  # a submodule's list counts too, under its prefix
    groups = {g["group"]: {id(p) for p in g["params"]} for g in param_groups(wrapped, weight_decay=0.05)}
    inner = wrapped[0]
    assert {id(inner.cls_token), id(inner.pos_embed)} <= groups["no_decay"]
    assert {id(inner.table), id(inner.proj.weight)} <= groups["decay"]
    groups = {g["group"]: {id(p) for p in g["params"]}
              for g in param_groups(wrapped, 0.05, no_weight_decay_list=["*.table"])}
    assert id(inner.table) in groups["no_decay"]


# ---- one answer from one lister --------------------------------------------------------------------------

class Temperature(nn.Module):
    """A network with a scalar logit temperature outside any block and LayerScale gates inside."""

    def __init__(self) -> None:
        super().__init__()
        self.body = create_model("mlp_layerscale", depth=4, width=8, in_features=5, num_classes=3)
        self.temperature = ScalarGate(1.0, "identity")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) / self.temperature.value()


def test_every_consumer_lists_the_same_gates():
    from throughway.train import fit

    torch.manual_seed(0)
    net = Temperature()
    branches = [ref for ref in find_branches(net).values() if ref.gate is not None]
    assert [ref.name for ref in branches] == ["body.blocks.0", "body.blocks.1"]
    assert all(isinstance(ref.gate, VectorGate) for ref in branches)
    gates = {id(p) for p in gate_parameters(net)}
    assert gates == {id(net.body.blocks[0].gate.k), id(net.body.blocks[1].gate.k)}  # not the temperature
    no_decay = {id(p) for g in param_groups(net, 0.1) if g["group"] == "no_decay" for p in g["params"]}
    assert gates <= no_decay
    x, y = torch.randn(32, 5), torch.randint(0, 3, (32,))
    history = fit(net, (x, y), get_recipe("gresnet-mnist", epochs=1, batch_size=16), progress=False)
    assert history.last()["k"] == pytest.approx(branch_gate_values(net))
    assert len(history.last()["k"]) == 2  # the two LayerScale gates (mean λ), not the temperature


def test_the_removed_gate_listers_are_gone():
    src = Path(__file__).resolve().parent.parent / "src" / "throughway"
    text = "\n".join(p.read_text() for p in src.rglob("*.py"))
    for gone in ("def scalar_gates(", "def scalar_gate_names(", "def block_scalar_gates(", "def _is_gate_k("):
        assert gone not in text, gone
    assert text.count("def gate_parameters(") == 1 and text.count("def find_branches(") == 1


# ---- saved by the toolkit, rebuilt with its gates; visible to compiled models -----------------------------

def test_save_model_after_add_gates_rebuilds_the_gated_model(tmp_path):
    from throughway.train import load_model, save_model

    torch.manual_seed(0)
    model = add_gates(create_model("mlp_residual", depth=4, width=8, in_features=5, num_classes=3), "rezero",
                      k_init=0.25)
    model.eval()
    save_model(tmp_path / "m.safetensors", model)
    loaded = load_model(tmp_path / "m.safetensors")
    x = torch.randn(4, 5)
    assert loaded.gates_added["kind"] == "rezero" and torch.equal(loaded(x), model(x).detach())


def test_lesion_and_gates_are_seen_by_a_model_compiled_before_them():
    torch.manual_seed(0)
    net = nn.Sequential(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True)).eval()
    x = torch.randn(2, 3, 8)
    compiled = torch.compile(net, backend="eager")
    with torch.no_grad():
        intact = compiled(x)
        with lesion(net, "0.ff"):
            assert not _same(compiled(x), intact)
        assert _same(compiled(x), intact)  # (the fused inference path is off from here on: rounding differs)
        add_gates(net, "relu", k_init=0.0)  # both branches closed through hooks added after compilation
        assert _same(compiled(x), x)


def test_add_gates_refuses_a_gate_value_or_depth_that_makes_no_sense():
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match="k_init="):
            add_gates(create_model("mlp_residual", depth=2, width=4, in_features=3, num_classes=2), k_init=bad)
    for depth in (0, -3):
        with pytest.raises(ValueError, match=f"depth={depth}"):
            add_gates(create_model("mlp_residual", depth=2, width=4, in_features=3, num_classes=2), "layerscale",
                      depth=depth)


def test_add_gates_gates_only_the_branches_it_is_given():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True)
    net = add_gates(nn.Sequential(copy.deepcopy(layer), copy.deepcopy(layer)), targets=["ff"])
    assert [n for n, r in find_branches(net).items() if r.gate is not None] == ["0.ff", "1.ff"]
    with pytest.raises(ValueError, match=r"targets: 'mlp' names no residual branch; .*keys \['attn', 'ff'\]"):
        add_gates(nn.Sequential(copy.deepcopy(layer)), targets=["mlp"])
    only = add_gates(nn.Sequential(copy.deepcopy(layer), copy.deepcopy(layer)),
                     targets=lambda ref: ref.block == "1")
    assert only.gates_added["branches"] == ["1.attn", "1.ff"]


def test_a_contract_block_of_a_users_own_is_one_registration():
    from throughway.layers import register_contract_block

    class Mine(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.branch, self.gate, self.shortcut = dense_unit(4, 4), ScalarGate(0.5), nn.Identity()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.gate(self.branch(x)) + self.shortcut(x)

    register_contract_block(Mine)
    try:
        net = nn.Sequential(Mine(), Mine())
        assert [ref.gate.k.item() for ref in find_branches(net).values()] == [0.5, 0.5]
        assert check_blocks(net, torch.randn(3, 4)).checked == ("0", "1")
    finally:
        unregister_block(Mine)


@transformers_missing
def test_restore_gates_reads_the_names_a_hugging_face_vit_saves_under(tmp_path):
    # transformers 5 saves some models under converted names (ViT's layers.0 as encoder.layer.0)
    import transformers

    config = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=32, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.ViTModel(config, add_pooling_layer=False).eval()
    add_gates(model, "relu")
    with torch.no_grad():
        for i, gate in enumerate(gate_parameters(model)):
            gate.fill_(0.2 + 0.1 * i)
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        expected = model(x).last_hidden_state
    model.save_pretrained(tmp_path / "vit")
    loaded = transformers.ViTModel.from_pretrained(tmp_path / "vit", add_pooling_layer=False,
                                                   attn_implementation="eager").eval()
    restore_gates(loaded, tmp_path / "vit")
    with torch.no_grad():
        assert torch.equal(loaded(x).last_hidden_state, expected)
