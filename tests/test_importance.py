"""Block importance (analysis.importance): the gate order and today's layer-dropping criteria (ShortGPT's
block influence, Gromov et al.'s angular distance, lesion and SLEB's greedy lesion, deepest, random) on
the toolkit's models, torch's nn.TransformerEncoder and Hugging Face GPT-2."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from throughway import add_gates
from throughway.analysis import removal_curve
from throughway.layers import find_branches
from throughway.analysis.importance import (CRITERIA, angular_distances, angular_spans, block_influence, deepest_order,
                                            gate_order, greedy_lesion_order, importance_order, lesion_scores,
                                            random_order, span_removal_curve)
from throughway.layers import ResidualBlock
from throughway.models import create_model

IDENTITY = 2  # the block made an exact identity in the tests below (neither the first nor the last)


def _mse(outputs: object, targets: torch.Tensor) -> torch.Tensor:
    hidden = getattr(outputs, "last_hidden_state", outputs)
    return F.mse_loss(hidden, targets)


def _pairs(model: nn.Module, inputs: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Calibration pairs whose targets are the intact model's own outputs: the MSE loss is 0 for the
    intact model, so closing any block that changes the function raises it and an identity block's
    lesion scores exactly 0."""
    with torch.no_grad():
        return [(x, _mse_target(model(x))) for x in inputs]


def _mse_target(outputs: object) -> torch.Tensor:
    return getattr(outputs, "last_hidden_state", outputs).detach().clone()


# ---- the models ----------------------------------------------------------------------------------

def _mlp() -> tuple[nn.Module, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = create_model("mlp_gated_residual", depth=8, width=16, in_features=5, num_classes=3)
    with torch.no_grad():  # training-mode passes: BatchNorm running statistics that are not the defaults
        for _ in range(3):
            model(torch.randn(32, 5))
    return model.eval(), [torch.randn(12, 5), torch.randn(7, 5)]


class TokenNet(nn.Module):
    """A tiny sequence model over torch's pre-norm encoder: (B, T, 8) -> (B, T, 3)."""

    def __init__(self, layers: int = 4) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True, norm_first=True)
        self.embed = nn.Linear(8, 16)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)))


def _encoder() -> tuple[nn.Module, list[torch.Tensor]]:
    torch.manual_seed(0)
    return TokenNet().eval(), [torch.randn(3, 5, 8), torch.randn(2, 6, 8)]


def _gpt2(layers: int = 4) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=layers, n_embd=16, n_head=2, vocab_size=40, n_positions=16,
                                     attn_implementation="eager", bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2Model(config).eval()


def _gpt2_batches() -> tuple[nn.Module, list[torch.Tensor]]:
    model = _gpt2()
    return model, [torch.randint(0, 40, (3, 7)), torch.randint(0, 40, (2, 5))]


MODELS = {"mlp": (_mlp, "blocks"), "encoder": (_encoder, "encoder.layers"), "gpt2": (_gpt2_batches, "h")}


def _make_identity(model: nn.Module, kind: str, how: str, prefix: str) -> str:
    """Make block IDENTITY an exact identity: its gates closed (relu, k = -1; the toolkit's own gate,
    or gates add_gates put into every branch) or the last Linear of every branch zeroed."""
    name = f"{prefix}.{IDENTITY}"
    block = model.get_submodule(name)
    with torch.no_grad():
        if how == "closed gate":
            if kind != "mlp":
                add_gates(model, "relu")
            for branch, gate in {n: r.gate for n, r in find_branches(model).items()}.items():
                if branch == name or branch.startswith(name + "."):
                    gate.k.fill_(-1.0)
        else:
            lasts = {"encoder": ("self_attn.out_proj", "linear2"), "gpt2": ("attn.c_proj", "mlp.c_proj")}[kind]
            for path in lasts:
                last = block.get_submodule(path)
                last.weight.zero_()
                last.bias.zero_()
    return name


CASES = [("mlp", "closed gate"), ("encoder", "closed gate"), ("encoder", "zeroed branch"), ("gpt2", "closed gate"),
         ("gpt2", "zeroed branch")]


@pytest.mark.parametrize("kind, how", CASES, ids=[f"{k}-{h.replace(' ', '-')}" for k, h in CASES])
def test_every_criterion_from_the_model_ranks_an_identity_block_least_important(kind, how):
    build, prefix = MODELS[kind]
    model, inputs = build()
    identity = _make_identity(model, kind, how, prefix)
    pairs = _pairs(model, inputs)
    criteria = ["block_influence", "angular", "lesion", "lesion_greedy"] + (["gate"] if how == "closed gate" else [])
    for criterion in criteria:
        order = importance_order(model, criterion, pairs, loss_fn=_mse)
        assert order[0] == identity, (criterion, order)
        assert sorted(order) == sorted(f"{prefix}.{i}" for i in range(4))
    influence = block_influence(model, inputs)
    assert abs(influence[identity]) < 1e-12 and min(v for n, v in influence.items() if n != identity) > 1e-6
    assert lesion_scores(model, pairs, _mse)[identity] == 0.0  # a lesion of an identity block changes nothing
    assert angular_spans(model, inputs, 1) == {1: [identity]}
    assert angular_distances(model, inputs, 1, token="all")[1][identity] < 1e-6


def test_gate_order_is_the_greedy_removal_order_by_k():
    model, _ = _mlp()
    with torch.no_grad():
        for gate, k in zip([r.gate for r in find_branches(model).values()], [0.9, -0.5, 0.2, 1.4]):
            gate.k.fill_(k)
    assert gate_order(model) == ["blocks.1", "blocks.2", "blocks.0", "blocks.3"]
    with pytest.raises(ValueError, match="no gate"):
        gate_order(_encoder()[0])  # ungated: add_gates puts gates in


def _features(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The MLP's hidden states at every block boundary, by hand: h_0 = stem(x), h_i+1 = block_i(h_i)."""
    with torch.no_grad():
        states = [model.stem(x)]
        for block in model.blocks:
            states.append(block(states[-1]))
    return states


def test_block_influence_and_angular_distance_are_the_papers_formulas_over_every_sample():
    model, inputs = _mlp()
    states = [_features(model, x) for x in inputs]

    def mean_over_samples(i: int, j: int, f) -> float:
        values = torch.cat([f(F.cosine_similarity(s[i].double(), s[j].double(), dim=1)) for s in states])
        return float(values.mean())  # every sample of every batch weighs alike (12 + 7 samples)

    influence = block_influence(model, inputs)
    for i in range(4):
        assert influence[f"blocks.{i}"] == pytest.approx(1 - mean_over_samples(i, i + 1, lambda c: c), abs=1e-9)
    distances = angular_distances(model, inputs)
    assert list(distances) == [1, 2, 3, 4] and list(distances[2]) == ["blocks.0", "blocks.1", "blocks.2"]
    for n, by_start in distances.items():
        for start, d in enumerate(by_start.values()):
            expected = mean_over_samples(start, start + n, lambda c: torch.arccos(c.clamp(-1, 1)) / math.pi)
            assert d == pytest.approx(expected, abs=1e-9)
    spans = angular_spans(model, inputs)
    for n, span in spans.items():
        best = min(distances[n], key=lambda name: distances[n][name])
        assert span[0] == best and span == [f"blocks.{i}" for i in range(int(best[-1]), int(best[-1]) + n)]


def test_token_choice_and_attention_mask_on_gpt2():
    model = _gpt2()
    x = torch.randint(0, 40, (2, 5))
    padded = torch.cat([x, torch.randint(0, 40, (2, 3))], dim=1)
    mask = torch.cat([torch.ones(2, 5), torch.zeros(2, 3)], dim=1).long()
    for token in ("all", "last"):
        plain = block_influence(model, [x], token=token)
        # a dict batch goes in as model(**batch): the same numbers as model(x)
        assert block_influence(model, [{"input_ids": x}], token=token) == pytest.approx(plain, abs=1e-12)
        # right padding after a causal model's last real token: the masked positions are left out
        masked = block_influence(model, [{"input_ids": padded, "attention_mask": mask}], token=token)
        assert masked == pytest.approx(plain, abs=1e-6)
        unmasked = block_influence(model, [{"input_ids": padded}], token=token)
        assert unmasked != pytest.approx(plain, abs=1e-6)  # the padding would change the mean
    assert block_influence(model, [x], token="last") != pytest.approx(block_influence(model, [x]), abs=1e-6)
    masked = angular_distances(model, [{"input_ids": padded, "attention_mask": mask}])
    assert masked[2] == pytest.approx(angular_distances(model, [x])[2], abs=1e-6)  # "last": the last real token


def test_the_last_token_follows_a_sequence_first_encoder_layout():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=False, norm_first=True)
    encoder = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False).eval()
    x = torch.randn(6, 4, 16)  # (T, B, C)
    batch_first = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True, norm_first=True), 3,
        enable_nested_tensor=False).eval()
    batch_first.load_state_dict(encoder.state_dict())
    expected = block_influence(batch_first, [x.transpose(0, 1)], token="last")
    assert block_influence(encoder, [x], token="last") == pytest.approx(expected, abs=1e-6)


class KeywordBlock(ResidualBlock):
    """A toolkit block whose input arrives as the keyword hidden_states, as Hugging Face layers may get it."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(hidden_states)


class KeywordNet(nn.Module):
    def __init__(self, keyword: bool) -> None:
        super().__init__()
        self.keyword = keyword
        self.blocks = nn.ModuleList(KeywordBlock(nn.Sequential(nn.Linear(6, 6), nn.Tanh()), gated=True)
                                    for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(hidden_states=x) if self.keyword else block(x)
        return x


def test_a_block_input_given_as_the_keyword_hidden_states_is_read():
    torch.manual_seed(0)
    by_keyword, by_position = KeywordNet(True), KeywordNet(False)
    by_position.load_state_dict(by_keyword.state_dict())
    x = [torch.randn(5, 6)]
    assert block_influence(by_keyword, x) == block_influence(by_position, x)
    assert angular_distances(by_keyword, x) == angular_distances(by_position, x)


class Shift(nn.Module):
    """A branch that adds a constant vector: f(x) = c."""

    def __init__(self, c: torch.Tensor) -> None:
        super().__init__()
        self.c = nn.Parameter(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c.expand_as(x)


def test_greedy_lesion_rescores_after_each_removal_as_sleb_does():
    # u = x + c - 1.1c + 0.8c. Alone, closing block 2 costs |0.8c|², block 0 |c|², block 1 |1.1c|²:
    # the one-shot order is [2, 0, 1]. With block 2 closed, closing block 0 leaves x - 1.1c (cost
    # |c + 0.8c|²) but closing block 1 leaves x + c (cost |1.1c - 0.8c|²): SLEB takes block 1 next.
    c = torch.ones(4)
    model = nn.Sequential(*(ResidualBlock(Shift(s * c), gated=True) for s in (1.0, -1.1, 0.8)))
    pairs = _pairs(model, [torch.randn(6, 4)])
    assert importance_order(model, "lesion", pairs, loss_fn=_mse) == ["2", "0", "1"]
    assert greedy_lesion_order(model, pairs, _mse) == ["2", "1", "0"]
    assert importance_order(model, "lesion_greedy", pairs, loss_fn=_mse, max_removed=2) == ["2", "1"]
    assert lesion_scores(model, pairs, _mse) == pytest.approx({"0": 1.0, "1": 1.21, "2": 0.64})


def test_deepest_keeps_the_final_block_and_random_is_fixed_by_its_seed():
    model, _ = _mlp()
    assert deepest_order(model) == ["blocks.2", "blocks.1", "blocks.0"]
    assert importance_order(model, "deepest") == deepest_order(model)
    wide = create_model("mlp_gated_residual", depth=16, width=4, in_features=5, num_classes=3)
    first = random_order(wide, seed=7)
    assert first == random_order(wide, seed=7) == importance_order(wide, "random", seed=7)
    assert first == random_order(wide, generator=torch.Generator().manual_seed(7))
    assert sorted(first) == sorted(f"blocks.{i}" for i in range(8))
    assert any(random_order(wide, seed=s) != first for s in range(8, 11))


def test_orders_plug_into_removal_curve_and_spans_into_span_removal_curve():
    model, inputs = _mlp()
    pairs = _pairs(model, inputs)
    x = inputs[0]

    def metric(m: nn.Module) -> float:
        with torch.no_grad():
            return float(m(x).sum())

    for criterion in CRITERIA:
        order = importance_order(model, criterion, pairs, loss_fn=_mse, seed=0)
        curve = removal_curve(model, order, metric)
        assert len(curve) == len(order) + 1 and curve[0] == metric(model)
    spans = angular_spans(model, inputs)
    curve = span_removal_curve(model, spans, metric)
    assert list(curve) == [0, 1, 2, 3, 4] and curve[0] == metric(model)
    assert curve[2] == removal_curve(model, spans[2], metric)[2]
    with pytest.raises(ValueError, match=r"spans\[3\] lists 2 blocks"):
        span_removal_curve(model, {3: ["blocks.0", "blocks.1"]}, metric)


def test_a_projection_block_is_never_in_an_order_and_splits_the_spans():
    # preact_resnet depth 14: blocks.2 and blocks.4 open stages 2 and 3 with a projection shortcut.
    torch.manual_seed(0)
    model = create_model("preact_resnet", depth=14, width=4, gated=True, num_classes=3).eval()
    x = [torch.randn(2, 3, 8, 8)]
    removable = ["blocks.0", "blocks.1", "blocks.3", "blocks.5"]
    assert sorted(importance_order(model, "block_influence", x)) == removable
    assert sorted(importance_order(model, "gate")) == removable
    assert list(angular_distances(model, x)) == [1, 2]  # the longest run: blocks.0, blocks.1
    assert list(angular_distances(model, x)[2]) == ["blocks.0"]
    with pytest.raises(ValueError, match=r"n=3: accepted values are integers 1 \.\. 2"):
        angular_spans(model, x, 3)


def test_the_model_is_evaluated_in_eval_mode_and_left_as_it_was():
    model, inputs = _mlp()
    model.train()
    model.blocks[1].eval()  # a module frozen in eval mode stays so
    state = {k: v.clone() for k, v in model.state_dict().items()}
    pairs = _pairs(model.eval(), inputs)
    model.train()
    model.blocks[1].eval()
    eval_influence = block_influence(model, inputs)
    for criterion in ("block_influence", "angular", "lesion", "lesion_greedy"):
        importance_order(model, criterion, pairs, loss_fn=_mse)
    assert model.training and not model.blocks[1].training and model.blocks[0].training
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())  # BatchNorm statistics unchanged
    assert all(p.grad is None for p in model.parameters())
    assert block_influence(model.eval(), inputs) == eval_influence


def test_bad_input_names_the_argument_and_the_accepted_values():
    model, inputs = _mlp()
    with pytest.raises(ValueError, match=r"criterion='shortgpt'; accepted values: \['gate', 'block_influence'"):
        importance_order(model, "shortgpt", inputs)
    with pytest.raises(ValueError, match="batches is empty"):
        importance_order(model, "block_influence", [])
    with pytest.raises(ValueError, match="batches=None"):
        importance_order(model, "angular")
    with pytest.raises(TypeError, match="batches is one Tensor"):
        block_influence(model, inputs[0])
    with pytest.raises(TypeError, match=r"batches\[1\] is a str"):
        block_influence(model, [inputs[0], "x"])
    with pytest.raises(ValueError, match=r"batches\[0\] is inputs only"):
        importance_order(model, "lesion", inputs, loss_fn=_mse)
    with pytest.raises(ValueError, match="loss_fn=None"):
        importance_order(model, "lesion_greedy", _pairs(model, inputs))
    with pytest.raises(ValueError, match=r"token='first'; accepted values: \['all', 'last'\]"):
        importance_order(model, "angular", inputs, token="first")
    with pytest.raises(ValueError, match=r"n=0: accepted values are integers 1 \.\. 4"):
        angular_spans(model, inputs, 0)
    with pytest.raises(ValueError, match=r"n=5: accepted values are integers 1 \.\. 4"):
        angular_distances(model, inputs, 5)
    with pytest.raises(ValueError, match="exactly one of seed= .* and generator="):
        importance_order(model, "random")
    with pytest.raises(ValueError, match="max_removed=-1"):
        importance_order(model, "deepest", max_removed=-1)
    for criterion in CRITERIA:
        with pytest.raises(ValueError, match="Linear has no blocks"):
            importance_order(nn.Linear(5, 5), criterion, _pairs(nn.Linear(5, 5), inputs), loss_fn=_mse, seed=0)
    with pytest.raises(TypeError, match="loss_fn returned a tensor of shape"):
        lesion_scores(model, _pairs(model, inputs), lambda out, y: (out - y) ** 2)


class Twice(nn.Module):
    """One block applied twice: its input and output are not one state pair."""

    def __init__(self) -> None:
        super().__init__()
        self.block = ResidualBlock(nn.Linear(4, 4), gated=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.block(x))


def test_a_block_that_runs_twice_in_one_pass_is_refused_by_name():
    with pytest.raises(ValueError, match="block 'block' ran 2 times in one forward pass"):
        block_influence(Twice(), [torch.randn(3, 4)])
