"""Check the block registry (throughway.layers.known_blocks) on the real classes of timm, torchvision and
Hugging Face transformers: every model of the list below is built from a small config or with
`pretrained=False` (no weights are downloaded) and put through the any-network steps, and the results go to
<out>/report.md and <out>/report.json (the date, the package versions, one row per model).

timm and torchvision pull a torch of their own, so this runs in a separate virtual environment that
scripts/check_real_blocks.sh builds; it is never run by the tests or CI, which check faithful replicas
(tests/test_known_blocks.py, tests/test_any_network.py).

    python scripts/check_real_blocks.py [--out DIR] [--models NAME,NAME] [--update] [--list]

Each model runs in a child process of its own (the memory of one model at a time). Steps, each pass / fail
(with the error text) / n/a (with why):
  found      find_blocks finds the expected number of blocks (those of the architecture, with or without a
             shortcut in the instance: EfficientNet's stride-2 blocks have none)
  check      check_blocks(model, example) on the model as built
  strict     check_blocks on a copy whose modules that keep a closed block from the identity
             (known_blocks.CLOSED_THROUGH: act(x + f(x)) of the ResNets, the norm of a post-norm layer, RegNet's
             norm1 before the shortcut) are the identity, with those classes' entries re-registered as closing to
             the identity: every identity-shortcut branch must then be verified, not left unverified
  gates      add_gates(model, "relu") on the branches without a gate of their own; outputs unchanged
             (bit for bit) at k = 1
  lesion     lesion of one removable block changes the output (by more than 1e-4 of its largest value);
             outputs after it are bit-identical (a LayerScale γ of that block, 1e-6 at init, is set to 1 first)
  remove     removable_blocks, removal_curve of the greedy order (2 removals), prune of one block: the
             pruned model runs, keeps the output shape and has one block fewer (and its Hugging Face
             config one layer fewer)
  fold       fold_gates on a copy with the gates at k = 0.5, 0.6, ... checked against the gated outputs
  save_load  save_model of the gated model (gates at distinct k) → a fresh build, add_gates with the same
             record, load_model(path, model=fresh): outputs bit-identical
  pretrained (Hugging Face models) save_pretrained → from_pretrained → restore_gates: outputs bit-identical
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("found", "check", "strict", "gates", "lesion", "remove", "fold", "save_load", "pretrained")


# ---- the models ---------------------------------------------------------------------------------

def _image(size: int = 32) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))


def _tokens(vocab: int = 40, length: int = 6) -> torch.Tensor:
    return torch.randint(1, vocab, (2, length), generator=torch.Generator().manual_seed(1))


def _timm(name: str, **kwargs: Any) -> Callable[[], tuple[nn.Module, Any]]:
    size = kwargs.pop("input_size", 32)

    def build() -> tuple[nn.Module, Any]:
        import timm

        return timm.create_model(name, pretrained=False, **kwargs), _image(size)
    return build


def _torchvision(name: str, **kwargs: Any) -> Callable[[], tuple[nn.Module, Any]]:
    def build() -> tuple[nn.Module, Any]:
        import torchvision

        model = getattr(torchvision.models, name)(weights=None, **kwargs)
        head = getattr(getattr(model, "heads", None), "head", None)
        if isinstance(head, nn.Linear):  # torchvision's ViT starts its head at zero: every output would be 0
            nn.init.normal_(head.weight, std=0.02)
        return model, _image(32)
    return build


_DECODER = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=40, attn_implementation="eager")


def _hf(config: str, model: str, **kwargs: Any) -> Callable[[], tuple[nn.Module, Any]]:
    def build() -> tuple[nn.Module, Any]:
        import transformers

        configuration = getattr(transformers, config)(**kwargs)
        built = getattr(transformers, model)(configuration)
        if model == "ViTModel":
            return built, torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
        return built, _tokens()
    return build


class TorchEncoder(nn.Module):
    """A token classifier over torch's nn.TransformerEncoder (pre-norm)."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True, norm_first=True)
        self.embed = nn.Linear(8, 16)
        self.encoder = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)).mean(1))


def _torch_encoder() -> tuple[nn.Module, Any]:
    return TorchEncoder(), torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))


@dataclasses.dataclass(frozen=True)
class Case:
    library: str
    build: Callable[[], tuple[nn.Module, Any]]
    blocks: int  # the blocks the architecture has (what find_blocks must find), with a shortcut or not
    listed: bool = True  # one of the lists (else an extra family the registry covers)


# The ResNet-like timm models are built with zero_init_last=False: timm zeroes each block's last norm (or
# conv) at init, so every branch would output exactly 0 and neither a check nor a lesion could see it.
MODELS: dict[str, Case] = {
    "timm/resnet18": Case("timm", _timm("resnet18", zero_init_last=False), 8),
    "timm/resnet50": Case("timm", _timm("resnet50", zero_init_last=False), 16),
    "timm/seresnet50": Case("timm", _timm("seresnet50", zero_init_last=False), 16),
    "timm/vit_tiny": Case("timm", _timm("vit_tiny_patch16_224", img_size=32), 12),
    "timm/deit3_small": Case("timm", _timm("deit3_small_patch16_224", img_size=32), 12),
    "timm/convnext_atto": Case("timm", _timm("convnext_atto"), 12),
    "timm/efficientnet_b0": Case("timm", _timm("efficientnet_b0"), 16),
    "timm/regnetx_002": Case("timm", _timm("regnetx_002", zero_init_last=False), 13),
    "timm/resnetv2_50": Case("timm", _timm("resnetv2_50", zero_init_last=False), 16),
    "timm/swin_tiny": Case("timm", _timm("swin_tiny_patch4_window7_224", img_size=64, input_size=64), 12),
    "timm/mobilenetv3_small_100": Case("timm", _timm("mobilenetv3_small_100"), 12, listed=False),
    "timm/tf_efficientnetv2_b0": Case("timm", _timm("tf_efficientnetv2_b0"), 21, listed=False),
    "timm/resnetv2_50x1_bit": Case("timm", _timm("resnetv2_50x1_bit", zero_init_last=False), 16, listed=False),
    "timm/regnetv_040": Case("timm", _timm("regnetv_040", zero_init_last=False), 22, listed=False),
    "torchvision/resnet18": Case("torchvision", _torchvision("resnet18"), 8),
    "torchvision/resnet50": Case("torchvision", _torchvision("resnet50"), 16),
    "torchvision/wide_resnet50_2": Case("torchvision", _torchvision("wide_resnet50_2"), 16),
    "torchvision/vit_b_16": Case("torchvision", _torchvision("vit_b_16", image_size=32), 12),
    "torchvision/convnext_tiny": Case("torchvision", _torchvision("convnext_tiny"), 18),
    "torchvision/swin_t": Case("torchvision", _torchvision("swin_t"), 12),
    "torchvision/swin_v2_t": Case("torchvision", _torchvision("swin_v2_t"), 12, listed=False),
    "transformers/gpt2": Case("transformers", _hf("GPT2Config", "GPT2Model", n_layer=3, n_embd=16, n_head=2,
                                                  vocab_size=40, n_positions=16, attn_implementation="eager"), 3),
    "transformers/llama": Case("transformers", _hf("LlamaConfig", "LlamaModel", **_DECODER), 3),
    "transformers/bert": Case("transformers", _hf("BertConfig", "BertModel", hidden_size=16, num_hidden_layers=3,
                                                  num_attention_heads=2, intermediate_size=32, vocab_size=40,
                                                  attn_implementation="eager"), 3),
    "transformers/vit": Case("transformers", _hf("ViTConfig", "ViTModel", image_size=8, patch_size=4, hidden_size=16,
                                                 num_hidden_layers=3, num_attention_heads=2, intermediate_size=32,
                                                 attn_implementation="eager"), 3),
    "transformers/mistral": Case("transformers", _hf("MistralConfig", "MistralModel", **_DECODER), 3),
    "transformers/qwen2": Case("transformers", _hf("Qwen2Config", "Qwen2Model", **_DECODER), 3),
    "transformers/qwen3": Case("transformers", _hf("Qwen3Config", "Qwen3Model", head_dim=8, **_DECODER), 3),
    "transformers/gemma2": Case("transformers", _hf("Gemma2Config", "Gemma2Model", head_dim=8, **_DECODER), 3),
    "transformers/phi3": Case("transformers", _hf("Phi3Config", "Phi3Model", pad_token_id=0, eos_token_id=2,
                                                  bos_token_id=1, **_DECODER), 3),
    "transformers/olmo2": Case("transformers", _hf("Olmo2Config", "Olmo2Model", pad_token_id=0, eos_token_id=2,
                                                   **_DECODER), 3),
    "transformers/gpt_neox": Case("transformers", _hf("GPTNeoXConfig", "GPTNeoXModel", hidden_size=16,
                                                      intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
                                                      vocab_size=40, use_parallel_residual=True,
                                                      attn_implementation="eager"), 3),
    "transformers/opt": Case("transformers", _hf("OPTConfig", "OPTModel", hidden_size=16, ffn_dim=32,
                                                 num_hidden_layers=3, num_attention_heads=2, vocab_size=40,
                                                 word_embed_proj_dim=16, max_position_embeddings=32,
                                                 attn_implementation="eager"), 3),
    "transformers/gemma": Case("transformers", _hf("GemmaConfig", "GemmaModel", head_dim=8, **_DECODER), 3,
                               listed=False),
    "transformers/gemma3": Case("transformers", _hf("Gemma3TextConfig", "Gemma3TextModel", head_dim=8, **_DECODER), 3,
                                listed=False),
    "transformers/olmo": Case("transformers", _hf("OlmoConfig", "OlmoModel", pad_token_id=0, eos_token_id=2,
                                                  **_DECODER), 3, listed=False),
    "transformers/gpt_neox_sequential": Case("transformers", _hf("GPTNeoXConfig", "GPTNeoXModel", hidden_size=16,
                                                                 intermediate_size=32, num_hidden_layers=3,
                                                                 num_attention_heads=2, vocab_size=40,
                                                                 use_parallel_residual=False,
                                                                 attn_implementation="eager"), 3, listed=False),
    "transformers/opt_post_norm": Case("transformers", _hf("OPTConfig", "OPTModel", hidden_size=16, ffn_dim=32,
                                                           num_hidden_layers=3, num_attention_heads=2, vocab_size=40,
                                                           word_embed_proj_dim=16, max_position_embeddings=32,
                                                           do_layer_norm_before=False, attn_implementation="eager"),
                                       3, listed=False),
    "torch/transformer_encoder": Case("torch", _torch_encoder, 3),
}


# ---- the steps ------------------------------------------------------------------------------------

def _first(out: Any) -> torch.Tensor:
    for candidate in (out, getattr(out, "last_hidden_state", None), getattr(out, "logits", None)):
        if isinstance(candidate, torch.Tensor):
            return candidate
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(f"the model returned {type(out).__name__}")


def _output(model: nn.Module, x: Any) -> torch.Tensor:
    from throughway.layers.blocks import call_model

    with torch.no_grad():
        return _first(call_model(model, x)).detach().clone()


def _difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


@contextlib.contextmanager
def _closing_to_identity(classes: list[type[nn.Module]], specs: list[Any]) -> Iterator[None]:
    """Each of `classes` registered by class (which wins over a registration by name or a rule) with its
    spec, but identity_when_closed=True, meanwhile."""
    from throughway import register_block
    from throughway.layers.blocks import unregister_block

    try:
        for cls, spec in zip(classes, specs):
            fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
            register_block(cls, **{**fields, "identity_when_closed": True})
        yield
    finally:
        for cls in classes:
            with contextlib.suppress(KeyError):
                unregister_block(cls)


def _strict_check(model: nn.Module, x: Any) -> dict[str, Any]:
    from throughway.layers.blocks import block_spec, check_blocks, iter_blocks
    from throughway.layers.known_blocks import CLOSED_THROUGH

    twin = copy.deepcopy(model)
    replaced: dict[type[nn.Module], Any] = {}
    for _, block in iter_blocks(twin):
        name = f"{type(block).__module__}.{type(block).__qualname__}"
        for path in CLOSED_THROUGH.get(name, ()):
            parent_path, _, attribute = path.rpartition(".")
            parent = _submodule(block, parent_path)
            if parent is not None and isinstance(getattr(parent, attribute, None), nn.Module):
                replaced.setdefault(type(block), block_spec(block))
                setattr(parent, attribute, nn.Identity())
    with _closing_to_identity(list(replaced), list(replaced.values())):
        result = check_blocks(twin, x)
    if result.unverified:
        raise AssertionError(f"{len(result.unverified)} branches unverified: {sorted(set(result.unverified.values()))}")
    return {"checked": len(result.checked),
            "replaced_in": sorted(f"{c.__module__}.{c.__qualname__}" for c in replaced)}


def _submodule(block: nn.Module, path: str) -> nn.Module | None:
    try:
        return block.get_submodule(path) if path else block
    except AttributeError:  # an optional part (BERT's crossattention) absent in this instance
        return None


def _set_gates(model: nn.Module, start: float) -> None:
    from throughway.layers.blocks import find_branches

    record = getattr(model, "gates_added", None)
    names = set(record["branches"]) if isinstance(record, dict) else set()
    with torch.no_grad():
        for i, ref in enumerate(r for r in find_branches(model).values() if r.name in names):
            ref.gate.k.fill_(start + 0.1 * (i % 5))


def run_one(name: str) -> dict[str, Any]:
    """Every step on the model `name`: {"model", "library", "listed", "blocks", "steps": {step: {"status",
    "detail"}}, "seconds"}."""
    warnings.filterwarnings("ignore")
    from throughway import add_gates
    from throughway.analysis import find_blocks, find_branches, lesion, prune, removable_blocks
    from throughway.analysis.removal import removal_curve, removal_order, unremovable_blocks
    from throughway.layers.adapters import fold_gates, restore_gates
    from throughway.layers.blocks import ParameterGate, check_blocks
    from throughway.train.checkpoint import load_model, save_model

    case = MODELS[name]
    start = time.perf_counter()
    steps: dict[str, dict[str, Any]] = {}

    def step(what: str, action: Callable[[], Any]) -> Any:
        try:
            detail = action()
        except _NotApplicable as exc:
            steps[what] = {"status": "n/a", "detail": str(exc)}
            return None
        except Exception as exc:  # noqa: BLE001 - every failure is reported in its row
            steps[what] = {"status": "fail", "detail": f"{type(exc).__name__}: {exc}",
                           "trace": traceback.format_exc(limit=6)}
            return None
        steps[what] = {"status": "pass", "detail": detail}
        return detail

    torch.manual_seed(0)
    model, x = case.build()
    model.eval()
    before = _output(model, x)
    blocks = find_blocks(model)

    def found() -> dict[str, Any]:
        branches = find_branches(model)
        classes = sorted({f"{type(b).__module__}.{type(b).__qualname__}" for b in blocks.values()})
        if len(blocks) != case.blocks:
            raise AssertionError(f"found {len(blocks)} blocks, the architecture has {case.blocks} ({classes})")
        return {"blocks": len(blocks), "branches": len(branches), "classes": classes}

    def check() -> dict[str, Any]:
        result = check_blocks(model, x)
        return {"checked": len(result.checked), "unverified": len(result.unverified),
                "plain": len(result.plain), "projection": len(result.projection),
                "unverified_reasons": sorted(set(result.unverified.values()))}

    step("found", found)
    step("check", check)
    step("strict", lambda: _strict_check(model, x))

    gated = {"done": False}

    def gates() -> dict[str, Any]:
        ungated = [ref for ref in find_branches(model).values() if ref.gate is None]
        if not ungated:
            raise _NotApplicable("every branch carries a gate of its own (LayerScale / layer_scale / gamma)")
        add_gates(model, "relu", targets=lambda ref: ref.gate is None)
        gated["done"] = True
        after = _output(model, x)
        if not torch.equal(after, before):
            raise AssertionError(f"outputs differ by {_difference(after, before):.3g} at k = 1")
        return {"gated_branches": len(model.gates_added["branches"])}

    step("gates", gates)

    def pick() -> str:
        removable = removable_blocks(model)
        if not removable:
            raise AssertionError("no removable block")
        return removable[len(removable) // 2]

    def lesion_step() -> dict[str, Any]:
        chosen = pick()
        own = [ref for ref in find_branches(model).values() if ref.block == chosen and isinstance(ref.gate, ParameterGate)]
        with torch.no_grad():  # LayerScale's γ starts at 1e-6 (ConvNeXt, DeiT III): the branch would be ~0
            for ref in own:
                ref.gate.k.fill_(1.0)
        reference = _output(model, x)
        with lesion(model, chosen):
            lesioned = _output(model, x)
        after = _output(model, x)
        change = _difference(lesioned, reference)
        # relative to the output's scale: an untrained EfficientNet's logits are about 1e-6
        scale = float(reference.abs().max())
        if change <= 1e-4 * scale or change == 0.0:
            raise AssertionError(f"lesion of {chosen!r} changed the output by {change:.3g} (outputs up to "
                                 f"{scale:.3g})")
        if not torch.equal(after, reference):
            raise AssertionError(f"outputs after the lesion differ by {_difference(after, reference):.3g}")
        detail = {"block": chosen, "change": float(f"{change:.3g}"), "output_scale": float(f"{scale:.3g}")}
        if own:
            detail["own_gates_set_to_1"] = len(own)
        return detail

    step("lesion", lesion_step)

    def remove() -> dict[str, Any]:
        removable = removable_blocks(model)
        reasons = unremovable_blocks(model)
        chosen = pick()
        curve = removal_curve(model, removal_order(model, "greedy"), lambda m: float(_output(m, x).abs().mean()),
                              max_removed=2)
        pruned = prune(model, [chosen]).eval()
        out = _output(pruned, x)
        if out.shape != before.shape:
            raise AssertionError(f"the pruned model outputs {tuple(out.shape)}, not {tuple(before.shape)}")
        left = len(find_blocks(pruned))
        if left != len(blocks) - 1:
            raise AssertionError(f"the pruned model has {left} blocks, not {len(blocks) - 1}")
        detail: dict[str, Any] = {"removable": len(removable), "unremovable": len(reasons), "pruned": chosen,
                                  "curve_points": len(curve)}
        config = getattr(pruned, "config", None)
        for field in ("num_hidden_layers", "n_layer"):
            if config is not None and isinstance(getattr(config, field, None), int):
                if getattr(config, field) != len(blocks) - 1:
                    raise AssertionError(f"the pruned model's config.{field} is {getattr(config, field)}")
                detail["config"] = f"{field}={getattr(config, field)}"
        if reasons:
            detail["why_not"] = sorted({reason.split(":")[0] for reason in reasons.values()})[:3]
        return detail

    step("remove", remove)

    def fold() -> dict[str, Any]:
        if not gated["done"]:
            raise _NotApplicable("no gates were added")
        twin = copy.deepcopy(model)
        _set_gates(twin, 0.5)
        branches = {ref.name: ref for ref in find_branches(twin).values()}
        foldable = [n for n in twin.gates_added["branches"] if branches[n].key in branches[n].spec.fold]
        if not foldable:
            raise _NotApplicable("no fold path registered for these blocks")
        gated_out = _output(twin, x)
        fold_gates(twin, foldable, example_input=x)
        folded_out = _output(twin, x)
        detail = {"folded": len(foldable), "difference": float(f"{_difference(folded_out, gated_out):.3g}")}
        unfolded = len(model.gates_added["branches"]) - len(foldable)
        if unfolded:
            detail["without_fold_path"] = unfolded
        return detail

    step("fold", fold)

    def save_load() -> dict[str, Any]:
        if gated["done"]:
            _set_gates(model, 0.3)
        reference = _output(model, x)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.safetensors"
            save_model(path, model)
            torch.manual_seed(0)
            fresh, _ = case.build()
            if gated["done"]:
                record = model.gates_added
                add_gates(fresh, record["kind"], k_init=record["k_init"], depth=record["depth"],
                          targets=record["branches"])
            load_model(path, model=fresh)
            again = _output(fresh.eval(), x)
            if not torch.equal(again, reference):
                raise AssertionError(f"load_model: outputs differ by {_difference(again, reference):.3g}")
        return {"load_model": "bit-identical"}

    step("save_load", save_load)

    def pretrained() -> dict[str, Any]:
        reference = _output(model, x)
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            # the attention implementation is not saved: load with the one the model ran with
            implementation = getattr(model.config, "_attn_implementation", None)
            loaded = type(model).from_pretrained(tmp, attn_implementation=implementation).eval()
            if gated["done"]:
                restore_gates(loaded, tmp)
            again = _output(loaded, x)
        if not torch.equal(again, reference):
            raise AssertionError(f"from_pretrained: outputs differ by {_difference(again, reference):.3g}")
        return {"from_pretrained": "bit-identical"}

    if case.library == "transformers":
        step("pretrained", pretrained)
    return {"model": name, "library": case.library, "listed": case.listed, "blocks": len(blocks),
            "expected_blocks": case.blocks, "steps": steps, "seconds": round(time.perf_counter() - start, 1)}


class _NotApplicable(Exception):
    """A step that does not apply to this model (said in the report with the reason)."""


# ---- the report -----------------------------------------------------------------------------------

# Why a step fails where the cause lies outside the registry (the report keeps the step failed and says why).
KNOWN_CAUSES: dict[tuple[str, str], str] = {
    ("transformers/vit", "pretrained"):
        "transformers 5 saves ViT's weights under their legacy names (save_pretrained applies "
        "revert_weight_conversion: layers.N → encoder.layer.N), the gates' tensors included "
        "(encoder.layer.0.branch_gates.attn.k), while restore_gates looks them up under the module names "
        "(layers.0.branch_gates.attn.k); restore_gates must map its keys the way save_pretrained does",
}


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cell(row: dict[str, Any], what: str) -> str:
    entry = row["steps"].get(what)
    if entry is None:
        return "—"
    status = entry["status"]
    detail = entry["detail"]
    if status != "pass":
        return status
    if what == "found":
        return f"{detail['blocks']} ({detail['branches']} br.)"
    if what == "check":
        parts = [f"{detail['checked']} checked"]
        parts += [f"{detail[k]} {k}" for k in ("unverified", "plain", "projection") if detail[k]]
        return "pass: " + ", ".join(parts)
    if what == "strict":
        return f"pass: {detail['checked']} checked"
    if what == "gates":
        return f"pass ({detail['gated_branches']})"
    if what == "fold":
        return f"pass ({detail['folded']})"
    return "pass"


def write_report(rows: list[dict[str, Any]], out: Path, versions: dict[str, str], command: str) -> None:
    """report.json (everything) and report.md (one row per model, then the failures and n/a reasons)."""
    out.mkdir(parents=True, exist_ok=True)
    today = datetime.date.today().isoformat()
    (out / "report.json").write_text(json.dumps({"date": today, "versions": versions, "invocation": command,
                                                 "rows": rows}, indent=1) + "\n")
    lines = [f"# The block registry on the real packages ({today})", "",
             f"`{command}`", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + "; commits: "
             + ", ".join(f"{c} ({sum(r.get('commit') == c for r in rows)} of the models)"
                         for c in dict.fromkeys(r.get("commit", "unknown") for r in rows)) + ".", "",
             "Models from small configs or `pretrained=False` (no weights downloaded); each step as described in "
             "scripts/check_real_blocks.py. `check`: branches verified by check_blocks (closing every branch returns "
             "the block's input, scaling one by 0.5 halves the residual), the others unverified (blocks that do not close "
             "to their input: post-activation ResNets, post-norm layers, RegNet's PreBottleneck whose shortcut is "
             "norm1(x); `strict` checks them with those modules replaced by the identity), plain (no shortcut in "
             "this instance) or projection blocks. "
             "`pretrained`: Hugging Face models only. Rows marked * are extra families the registry "
             "covers, beyond the issue's lists.", "",
             "| model | blocks | check | strict | add_gates | lesion | remove | fold | save/load | pretrained | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        name = row["model"] + ("" if row["listed"] else " *")
        if "error" in row:
            lines.append(f"| {name} | error | | | | | | | | | |")
            continue
        cells = [_cell(row, what) for what in STEPS]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {row['seconds']} |")
    failures = [(row["model"], what, entry) for row in rows for what, entry in row.get("steps", {}).items()
                if entry["status"] != "pass"]
    errors = [row for row in rows if "error" in row]
    total = sum(len(row.get("steps", {})) for row in rows)
    passed = sum(entry["status"] == "pass" for row in rows for entry in row.get("steps", {}).values())
    lines += ["", f"{passed} of {total} steps passed on {len(rows)} models; "
              f"{sum(e['status'] == 'fail' for _, _, e in failures)} failed, "
              f"{sum(e['status'] == 'n/a' for _, _, e in failures)} not applicable, {len(errors)} models did not run.",
              ""]
    failed = [(model, what, entry) for model, what, entry in failures if entry["status"] == "fail"]
    if failed or errors:
        lines += ["## Failed", ""]
        for model, what, entry in failed:
            lines.append(f"- {model}, {what}: {entry['detail']}")
            if (model, what) in KNOWN_CAUSES:
                lines.append(f"  - why: {KNOWN_CAUSES[(model, what)]}")
        for row in errors:
            lines.append(f"- {row['model']}: did not run: {row['error']}")
        lines.append("")
    reasons: dict[str, list[str]] = {}
    for model, what, entry in failures:
        if entry["status"] == "n/a":
            reasons.setdefault(f"{what}: {entry['detail']}", []).append(model)
    if reasons:
        lines += ["## Not applicable", ""]
        lines += [f"- {reason}: {', '.join(models)}" for reason, models in reasons.items()]
        lines.append("")
    (out / "report.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for report.md and report.json (default results/real-blocks/<date>)")
    parser.add_argument("--models", default=None, help="comma-separated names (default: all; --list shows them)")
    parser.add_argument("--list", action="store_true", help="print the model names and exit")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child process: one model
    parser.add_argument("--row", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--timeout-s", type=int, default=600, help="seconds each model may take (default 600)")
    parser.add_argument("--update", action="store_true",
                        help="run only --models and replace their rows in the report already in --out (each row "
                             "records the commit it ran at)")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(MODELS))
        return 0
    if args.one is not None:
        if args.one not in MODELS or args.row is None:
            parser.error(f"--one={args.one!r}: accepted values {list(MODELS)}, with --row")
        args.row.write_text(json.dumps(run_one(args.one)))
        return 0
    names = list(MODELS) if args.models is None else [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"--models: {unknown} not known; accepted values (--list): {list(MODELS)}")
    if args.timeout_s < 1:
        parser.error(f"--timeout-s={args.timeout_s}: expected a whole number of seconds >= 1")
    if args.update and (args.models is None or args.out is None or not (args.out / "report.json").is_file()):
        parser.error("--update needs --models and an --out folder holding report.json")
    import throughway

    versions = {"python": platform.python_version(),
                **{p: _version(p) for p in ("torch", "torchvision", "timm", "transformers")},
                "throughway": f"{_version('throughway')} ({Path(throughway.__file__).parent})"}
    out = args.out or ROOT / "results" / "real-blocks" / datetime.date.today().isoformat()
    command = (os.environ.get("REAL_BLOCKS_COMMAND") or " ".join(["python scripts/check_real_blocks.py",
                                                                   *sys.argv[1:]])).strip()
    commit = _commit()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            row_path = Path(tmp) / "row.json"
            row_path.unlink(missing_ok=True)
            print(f"{name} ...", end=" ", flush=True)
            try:
                done = subprocess.run([sys.executable, __file__, "--one", name, "--row", str(row_path)],
                                      capture_output=True, text=True, timeout=args.timeout_s)
            except subprocess.TimeoutExpired:
                rows.append({"model": name, "library": MODELS[name].library, "listed": MODELS[name].listed,
                             "error": f"took over {args.timeout_s} s"})
                print("timed out", flush=True)
                continue
            if done.returncode != 0 or not row_path.is_file():
                rows.append({"model": name, "library": MODELS[name].library, "listed": MODELS[name].listed,
                             "error": f"exit {done.returncode}: {done.stderr.strip()[-800:]}"})
                print(f"error (exit {done.returncode})", flush=True)
                continue
            row = json.loads(row_path.read_text())
            row["commit"] = commit
            rows.append(row)
            print(" ".join(f"{k}={v['status']}" for k, v in row["steps"].items()), f"({row['seconds']} s)", flush=True)
    if args.update:
        earlier = json.loads((out / "report.json").read_text())
        if earlier.get("versions", {}).get("torch") != versions["torch"]:
            parser.error(f"--update: {out}/report.json was made with other package versions ({earlier.get('versions')})")
        fresh = {row["model"]: row for row in rows}
        at = re.search(r" at (\w+)", earlier.get("versions", {}).get("throughway", ""))  # reports before rows had one
        kept = {row["model"]: {"commit": at.group(1) if at else "unknown", **row} for row in earlier["rows"]}
        kept.update(fresh)
        rows = [kept[name] for name in MODELS if name in kept]
        command = f"{earlier.get('invocation', earlier.get('command'))}; then {command}"
    write_report(rows, out, versions, command)
    print(f"wrote {out / 'report.md'} and {out / 'report.json'}")
    failed = [row for row in rows if "error" in row or any(e["status"] == "fail" for e in row["steps"].values())]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
