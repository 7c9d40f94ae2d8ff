"""Many small models of one shape trained as one batched computation (`train_batched`).

The MNIST studies train many tiny networks (width 50): the gated residual paper reports means over
seeds, the highway paper's section 3.1 runs a random search of 100 trials per depth and
architecture. One such model leaves the machine idle between operations: per-operation overhead,
not arithmetic, sets its speed (docs/design.md "Speed on this platform"). `train_batched` stacks N
models of one architecture shape into tensors with a leading model dimension and trains them
together: activations are held feature-major, (N models, C channels, B samples), so that every
Linear is one `torch.baddbmm` and every BatchNorm one `F.batch_norm` over a (1, N·C, B) view
without a copy; the optimiser is a handful of elementwise operations over one flat (N, P)
parameter matrix. `BatchedStep` is one training step, `train_epoch` one epoch.

Design choices, measured by benchmarks/batched_throughput.py (its "design" lines print both for the
benchmark's N and depth; the figures here are from N = 4, depth 2, on this shared machine under
load): stacked parameters with batched matrix products ran forward + backward 2.2× faster than
torch.func.vmap over functional_call (which also cannot update BatchNorm running statistics in
place), and the flat (N, P) optimiser step 18× faster than torch's multi-tensor (foreach) NAdam
over the models' parameter tensors. Against the batch-major (N, B, C) layout that preceded it, the
feature-major layout with one-pass gate arithmetic ran a step 1.12× faster (N = 32 depth-20 gated
residual, NAdam), 1.20× (N = 16 50-layer highway, SGD) and 1.09× (N = 16 50-layer plain, SGD),
interleaved A/B timing in one process.

Per-model semantics are those of `fit` run on each model alone (tests/test_batched.py):

* initialisation: `build_model(config)` (torch.manual_seed(config.seed), then create_model), so the
  models may differ in seed and in initial values (gate bias, k_init, init scheme);
* data order: a `torch.Generator` seeded with the model's seed, one `torch.randperm` per epoch,
  batches of recipe.batch_size with a final batch of one sample folded away, as `fit` does;
* BatchNorm: batch statistics per model in training mode, running statistics per model, evaluation
  with the running statistics;
* the optimiser (SGD with momentum, NAdam, Adam) with per-model learning rate, momentum, decay
  factor and weight decay, and the per-model schedule `learning_rate_at`; the other recipe fields
  (optimiser, betas, batch size, epochs, schedule kind) must be shared;
* a model whose loss becomes NaN or infinite is marked diverged, its parameters are restored to the
  end of its last finished epoch (as `fit` does), its files are written, and it leaves the batch at
  the end of that epoch; the other models are not disturbed (their slices of every operation are
  independent).

Each model gets an ordinary run directory: results.json with the keys of `run_training`'s
(`environment` additionally holds `batched`: the batch size and what `epoch_time_s` means here) and
model.safetensors loadable by `load_model`. The batch checkpoints itself after every epoch (one
safetensors file and one JSON file, written atomically, in `state_dir`), so an interrupted batch
resumes where it stopped and ends with the same numbers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, cast

import torch
from safetensors.torch import load_file, save
from torch import nn
from torch.nn import functional as F

from .._io import atomic_write_bytes, atomic_write_json, read_json, read_json_object, sha256_file
from ..data import DataSplits, Split, load_dataset
from ..layers import AugmentedLayer, HighwayLayer, PlainBlock, ResidualBlock, ScalarGate, TransformGate
from ..layers.gates import GATE_FUNCTIONS
from ..models import create_model, with_legacy_config
from .callbacks import write_metrics_csv
from .checkpoint import MODEL_FILE, save_model
from .loop import History
from .recipes import Recipe, learning_rate_at, parameter_groups
from .rundir import BATCH_FILE, RunDir, member_file
from .runner import (RESULTS_FILE, RunConfig, RunExistsError, build_model, check_config, check_resumable,
                     final_summary, read_results, resolve_recipe, results_header)

__all__ = ["StackedModels", "BatchedOptimizer", "BatchedStep", "EpochTotals", "train_epoch", "epoch_starts",
           "train_batched", "backward", "batch_key", "SUPPORTED_MODELS", "SHARED_RECIPE_FIELDS",
           "PER_MODEL_RECIPE_FIELDS", "INIT_ONLY_KWARGS", "MIXABLE_MODELS", "batch_family"]

SUPPORTED_MODELS = ("mlp_plain", "mlp_residual", "mlp_gated_residual", "mlp_highway", "mlp_augmented")
# The gated residual paper's three MLPs of one depth share every Linear and BatchNorm shape and differ
# only in the shortcut (0 or 1) and the gate (g(k) or a fixed 1): one batch can hold all three
# (issue 16). Value: (shortcut, gated) of each block u = shortcut·x + gate·f_r(x).
MIXABLE_MODELS: dict[str, tuple[bool, bool]] = {"mlp_plain": (False, False), "mlp_residual": (True, False),
                                               "mlp_gated_residual": (True, True)}
_MIXED_FAMILY = "mlp_plain|mlp_residual|mlp_gated_residual"
# Model arguments that change only initial values, so models of one batch may differ in them.
INIT_ONLY_KWARGS = frozenset({"gate_bias", "k_init", "init"})
# Recipe fields that may differ between the models of one batch.
PER_MODEL_RECIPE_FIELDS = frozenset({"lr", "momentum", "lr_decay", "weight_decay", "milestone_factor",
                                     "name", "source", "notes"})
# Every other recipe field must be shared; these matter most (the computation's shape, the optimiser's kind).
SHARED_RECIPE_FIELDS = frozenset({"optimizer", "epochs", "batch_size", "betas", "eps", "momentum_decay",
                                  "nesterov", "k_decay", "schedule", "milestones"})
# RunConfig fields shared by a batch (one data set, one device).
_SHARED_CONFIG_FIELDS = ("model", "depth", "dataset", "train_on_full", "device", "limit", "data_dir")
_EVAL_CHUNK = 2500
_STATE_FORMAT = "throughway-batched-1"
_STATE_JSON = "batch.json"
_LAYOUT_WARNING = "grad and param do not obey the gradient layout contract"


def backward(loss: torch.Tensor) -> None:
    """`loss.backward()` without autograd's warning about the gradient layout: parameters and their
    gradients are views into the flat (N, P) matrices on purpose (see StackedModels), and autograd
    accumulates into them in place all the same."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_LAYOUT_WARNING)
        loss.backward()


def batch_family(model: str) -> str:
    """The name under which models can share a batch: the model's own, or one name for the three
    MIXABLE_MODELS (plain, residual and gated residual MLPs of one depth train together)."""
    return _MIXED_FAMILY if model in MIXABLE_MODELS else model


def batch_key(config: RunConfig) -> tuple[Any, ...]:
    """Configs with equal keys can share one batch: same model family (`batch_family`), depth, shape
    arguments, data and device.

    Seeds, initial values (INIT_ONLY_KWARGS) and the per-model recipe fields may differ; the
    recipe's shared fields are checked by `train_batched` once the recipes are resolved.
    """
    shape = {k: v for k, v in config.model_kwargs.items() if k not in INIT_ONLY_KWARGS}
    shared = [batch_family(config.model) if f == "model" else getattr(config, f) for f in _SHARED_CONFIG_FIELDS]
    return (*shared, config.recipe, config.epochs, json.dumps(shape, sort_keys=True))


# ----------------------------------------------------------------------------------------------
# The stacked model
# ----------------------------------------------------------------------------------------------

def _structure(module: nn.Module) -> list[str]:
    """A description of the module tree that must be equal for models to be stacked."""
    out = []
    for name, m in module.named_modules():
        extra = ""
        if isinstance(m, ScalarGate):
            extra = m.function
        elif isinstance(m, nn.BatchNorm1d):
            extra = f"{m.momentum},{m.eps},{m.affine},{m.track_running_stats}"
        out.append(f"{name}:{type(m).__name__}:{extra}")
    return out


def canonical_name(kind: str, name: str) -> str:
    """The name of a plain/residual/gated MLP's tensor in a mixed batch (the gated residual layout):
    plain layer j's `blocks.j.branch.X` is `blocks.{j // 2}.branch.{j % 2}.X`; others are unchanged."""
    if kind == "mlp_plain" and name.startswith("blocks.") and ".branch." in name:
        _, layer, rest = name.split(".", 2)
        j = int(layer)
        return f"blocks.{j // 2}.branch.{j % 2}.{rest[len('branch.'):]}"
    return name


def own_name(kind: str, name: str) -> str:
    """The inverse of `canonical_name`: a mixed batch's tensor name as model kind `kind` calls it."""
    if kind == "mlp_plain" and name.startswith("blocks."):
        _, block, _branch, half, rest = name.split(".", 4)
        return f"blocks.{2 * int(block) + int(half)}.branch.{rest}"
    return name


def _config_of(model: nn.Module) -> dict[str, Any]:
    """The `model.config` that create_model attaches ({} when there is none)."""
    return cast(dict[str, Any], getattr(model, "config", {}))


def _mixed_template(models: Sequence[nn.Module]) -> nn.Module:
    # The gated residual layout: a gated model of the batch, else one built with the batch's shape.
    for m in models:
        if _config_of(m)["name"] == "mlp_gated_residual":
            return m
    config = {k: v for k, v in _config_of(models[0]).items() if k != "name"}
    if config.get("depth", 0) % 2:
        raise ValueError(f"depth={config.get('depth')}: plain nets join residual ones in a batch only at even depth")
    return create_model("mlp_gated_residual", **config)


def _leaves(model: nn.Module, kind: str) -> dict[str, str]:
    """Every leaf module (layer, norm, activation) under its canonical name, with what defines it."""
    out: dict[str, str] = {}
    for name, m in model.named_modules():
        if next(m.children(), None) is not None or not name or name.endswith((".gate", ".shortcut")):
            continue  # containers; gates and shortcuts are what the masks stand for
        extra = f"{m.momentum},{m.eps}" if isinstance(m, nn.BatchNorm1d) else ""
        if isinstance(m, nn.Linear):
            extra = f"{m.in_features},{m.out_features},{m.bias is not None}"
        out[canonical_name(kind, name)] = f"{type(m).__name__}({extra})"
    return out


def _check_mixable(template: nn.Module, model: nn.Module, i: int) -> None:
    kind = str(_config_of(model)["name"])
    want, have = _leaves(template, "mlp_gated_residual"), _leaves(model, kind)
    gates = {m.function for m in model.modules() if isinstance(m, ScalarGate)}
    template_gates = {m.function for m in template.modules() if isinstance(m, ScalarGate)}
    differing = sorted(n for n in set(want) | set(have) if want.get(n) != have.get(n))
    if differing or (gates and gates != template_gates):
        raise ValueError(f"model {i} ({kind}) does not fit the batch's gated residual layout (differs at "
                         f"{differing[:3] or sorted(gates)}); a mixed batch holds plain, residual and gated residual "
                         f"MLPs of one depth, width, norm, activation, stem and gate function")


class StackedModels:
    """N models of one shape held as stacked tensors; `forward` computes all N at once.

    Parameters live in one flat matrix `flat` (N, P) (row i is model i's parameters in
    `named_parameters` order) and are seen through per-parameter leaf views (N, *shape) whose
    `.grad` are views into the flat gradient matrix `grad` (N, P), so that autograd accumulates
    straight into it and the optimiser works on two large tensors. BatchNorm running statistics are
    (N, C) tensors; `steps` counts training-mode forward passes (BatchNorm's num_batches_tracked).
    """

    def __init__(self, models: Sequence[nn.Module], device: str | torch.device = "cpu") -> None:
        if not models:
            raise ValueError("StackedModels needs at least one model")
        kinds = [str(_config_of(m).get("name")) for m in models]
        # Plain, residual and gated residual MLPs in one batch: all are held in the gated residual
        # layout (`canonical_name`), with a per-model shortcut and gate mask (module docstring).
        self.mixed = len(set(kinds)) > 1 and all(k in MIXABLE_MODELS for k in kinds)
        self.kinds = list(kinds)
        template = _mixed_template(models) if self.mixed else models[0]
        structure = _structure(template)
        for i, m in enumerate(models):
            if self.mixed:
                _check_mixable(template, m, i)
            elif i and _structure(m) != structure:
                raise ValueError(f"model {i} differs in structure from model 0; a batch holds models of one shape "
                                 f"(or plain, residual and gated residual MLPs of one shape: {list(MIXABLE_MODELS)})")
        self.template = template
        self.device = torch.device(device)
        self.names = [n for n, _ in template.named_parameters()]
        self.shapes = {n: tuple(p.shape) for n, p in template.named_parameters()}
        self.offsets: dict[str, int] = {}
        total = 0
        for n in self.names:
            self.offsets[n] = total
            total += math.prod(self.shapes[n]) if self.shapes[n] else 1
        self.size = total
        states = [self._canonical_state(i, m) for i, m in enumerate(models)]
        with torch.no_grad():
            self.flat = torch.stack([torch.cat([st[n].detach().reshape(-1) for n in self.names]) for st in states]
                                    ).to(self.device).contiguous()
        self.grad = torch.zeros_like(self.flat)
        self.bn_names = [n for n, m in template.named_modules()
                         if isinstance(m, nn.BatchNorm1d) and m.track_running_stats]
        if any(isinstance(m, nn.BatchNorm1d) and not m.track_running_stats for m in template.modules()):
            raise ValueError("BatchNorm without running statistics is not supported by batched training")
        self.running: dict[str, torch.Tensor] = {}
        for n in self.bn_names:
            for key in ("running_mean", "running_var"):
                self.running[f"{n}.{key}"] = torch.stack(
                    [st[f"{n}.{key}"].detach() for st in states]).to(self.device).contiguous()
        self.steps = torch.tensor([int(st[f"{n}.num_batches_tracked"]) for st in states
                                   for n in self.bn_names[:1]] or [0] * len(models), dtype=torch.long)
        self._make_masks()
        self._make_views()

    def _canonical_state(self, i: int, model: nn.Module) -> dict[str, torch.Tensor]:
        """Model i's parameters and buffers under the template's names (a k of 1 where it has no gate)."""
        own = dict(model.state_dict())
        if not self.mixed:
            return own
        out = {canonical_name(self.kinds[i], name): value for name, value in own.items()}
        for name in self.names:
            if name not in out:  # the k of a block without a gate: held, masked, never trained
                out[name] = torch.ones(self.shapes[name])
        return out

    def _make_masks(self) -> None:
        # (N, 1, 1): 1 where model i's blocks add their input (residual, gated), 0 for plain; True
        # where its blocks scale the branch by g(k) (gated), False where by 1.
        flags = [MIXABLE_MODELS[k] if self.mixed else (True, True) for k in self.kinds]
        self.shortcut_mask = torch.tensor([float(f[0]) for f in flags], device=self.device).view(-1, 1, 1)
        self.gate_mask = torch.tensor([f[1] for f in flags], device=self.device).view(-1, 1, 1)

    def has_gates(self, position: int) -> bool:
        """Whether the model at `position` has scalar gates k of its own (records k, saves k)."""
        return bool(self.scalar_gate_names()) and (not self.mixed or MIXABLE_MODELS[self.kinds[position]][1])

    @property
    def n(self) -> int:
        """The number of models in the stack."""
        return self.flat.shape[0]

    def _make_views(self) -> None:
        self.params: dict[str, torch.Tensor] = {}
        n = self.flat.shape[0]
        for name in self.names:
            o, shape = self.offsets[name], self.shapes[name]
            size = math.prod(shape) if shape else 1
            leaf = self.flat[:, o:o + size].view(n, *shape).detach().requires_grad_(True)
            leaf.grad = self.grad[:, o:o + size].view(n, *shape)
            self.params[name] = leaf

    def select(self, keep: Sequence[int]) -> None:
        """Keep only the models at positions `keep` (in that order); used to drop diverged models."""
        index = torch.tensor(list(keep), dtype=torch.long, device=self.device)
        self.flat = self.flat.index_select(0, index).contiguous()
        self.grad = torch.zeros_like(self.flat)
        self.running = {k: v.index_select(0, index).contiguous() for k, v in self.running.items()}
        self.steps = self.steps.index_select(0, index.cpu())
        self.kinds = [self.kinds[i] for i in keep]
        self._make_masks()
        self._make_views()

    # -- per-model state ------------------------------------------------------------------------
    def state_dict_of(self, i: int, snap: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Model i's state dict (parameters and buffers, CPU copies), loadable into the template's class;
        from `snap` (a `snapshot`) instead of the live tensors when given."""
        out: dict[str, torch.Tensor] = {}
        flat = snap["flat"] if snap is not None else self.flat
        running = {k: snap[f"running.{k}"] for k in self.running} if snap is not None else self.running
        steps = snap["steps"] if snap is not None else self.steps
        row = flat[i].detach().to("cpu")
        for name in self.names:
            o, shape = self.offsets[name], self.shapes[name]
            size = math.prod(shape) if shape else 1
            out[name] = row[o:o + size].view(shape).clone()
        for n in self.bn_names:
            out[f"{n}.running_mean"] = running[f"{n}.running_mean"][i].detach().to("cpu").clone()
            out[f"{n}.running_var"] = running[f"{n}.running_var"][i].detach().to("cpu").clone()
            out[f"{n}.num_batches_tracked"] = steps[i].clone()
        if self.mixed:  # back to the model's own names; a k it does not have is dropped
            kind = self.kinds[i]
            out = {own_name(kind, n): v for n, v in out.items()
                   if MIXABLE_MODELS[kind][1] or not n.endswith(".gate.k")}
        return out

    def load_state_of(self, i: int, state: dict[str, torch.Tensor]) -> None:
        """Overwrite model i's parameters and buffers with `state` (from `state_dict_of`)."""
        if self.mixed:
            kind = self.kinds[i]
            state = {canonical_name(kind, n): v for n, v in state.items()}
            for name in self.names:
                state.setdefault(name, torch.ones(self.shapes[name]))
        with torch.no_grad():
            for name in self.names:
                o, shape = self.offsets[name], self.shapes[name]
                size = math.prod(shape) if shape else 1
                self.flat[i, o:o + size].copy_(state[name].reshape(-1))
            for n in self.bn_names:
                self.running[f"{n}.running_mean"][i].copy_(state[f"{n}.running_mean"])
                self.running[f"{n}.running_var"][i].copy_(state[f"{n}.running_var"])
                self.steps[i] = int(state[f"{n}.num_batches_tracked"])

    def snapshot(self) -> dict[str, torch.Tensor]:
        """Copies of every stacked tensor (parameters, running statistics, step counts)."""
        out = {"flat": self.flat.detach().clone(), "steps": self.steps.clone()}
        out.update({f"running.{k}": v.clone() for k, v in self.running.items()})
        return out

    def restore(self, snap: dict[str, torch.Tensor]) -> None:
        """Load a `snapshot` (same models, same order)."""
        with torch.no_grad():
            self.flat.copy_(snap["flat"])
            self.steps.copy_(snap["steps"])
            for k, v in self.running.items():
                v.copy_(snap[f"running.{k}"])

    def scalar_gate_names(self) -> list[str]:
        """Names of the scalar gates' k parameters, in block order (as `scalar_gate_values`)."""
        return [f"{n}.k" for n, m in self.template.named_modules() if isinstance(m, ScalarGate)]

    # -- forward --------------------------------------------------------------------------------
    # Activations are held feature-major, (N, C, B): each Linear is then one baddbmm W·h (+ b) whose
    # output is already the (1, N·C, B) layout that F.batch_norm reduces over its last dimension
    # without a copy, and the (N, classes, B) logits feed F.cross_entropy directly. The batch-major
    # layout (N, B, C) needed a transposing copy around every BatchNorm, forward and backward
    # (benchmarks/batched_throughput.py measures the step).
    def forward(self, x: torch.Tensor, training: bool) -> torch.Tensor:
        """Logits (N, B, classes) of every model (a view of `forward_logits`'s result)."""
        return self.forward_logits(x, training).transpose(1, 2)

    def forward_logits(self, x: torch.Tensor, training: bool) -> torch.Tensor:
        """Logits (N, classes, B) of every model: `x` is (N, B, features) (each model its own batch)
        or (B, features) (one batch for all, as in evaluation). In training mode BatchNorm uses batch
        statistics and updates each model's running statistics, as nn.BatchNorm1d does."""
        self._training = training
        if training and self.bn_names:
            self.steps += 1
        if x.dim() == 3:
            x = x.transpose(1, 2)  # (N, features, B): a strided view that the batched product reads as is
        return self._module(self.template, "", x)

    def _linear(self, prefix: str, x: torch.Tensor) -> torch.Tensor:
        w = self.params[f"{prefix}weight"]
        b = self.params.get(f"{prefix}bias")
        n, out_features, in_features = w.shape
        if x.dim() == 2:  # one input batch (B, in) for every model: a single matrix product
            y = torch.mm(w.reshape(n * out_features, in_features), x.t())
            if b is not None:
                y = y + b.reshape(-1, 1)
            return y.view(n, out_features, x.shape[0])
        if b is None:
            return torch.bmm(w, x)
        return torch.baddbmm(b.unsqueeze(2), w, x)

    def _batch_norm(self, prefix: str, module: nn.BatchNorm1d, x: torch.Tensor) -> torch.Tensor:
        n, channels, batch = x.shape
        # (1, N·C, B): BatchNorm's statistics over the batch, one per model and channel.
        w = self.params.get(f"{prefix}weight")
        b = self.params.get(f"{prefix}bias")
        h = F.batch_norm(x.reshape(1, n * channels, batch), self.running[f"{prefix}running_mean"].view(-1),
                         self.running[f"{prefix}running_var"].view(-1),
                         w.reshape(-1) if w is not None else None, b.reshape(-1) if b is not None else None,
                         self._training, cast(float, module.momentum), module.eps)
        return h.view(n, channels, batch)

    def _gate(self, prefix: str, gate: ScalarGate) -> torch.Tensor:
        return GATE_FUNCTIONS[gate.function](self.params[f"{prefix}k"]).view(-1, 1, 1)

    def _module(self, m: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
        if isinstance(m, nn.Linear):
            return self._linear(prefix, x)
        if isinstance(m, nn.Sequential):
            for name, child in m.named_children():
                x = self._module(child, f"{prefix}{name}.", x)
            return x
        if isinstance(m, nn.ReLU):
            return torch.relu(x)
        if isinstance(m, nn.Tanh):
            return torch.tanh(x)
        if isinstance(m, nn.Identity):
            return x
        if isinstance(m, nn.BatchNorm1d):
            return self._batch_norm(prefix, m, x)
        if isinstance(m, PlainBlock):
            return self._module(m.branch, f"{prefix}branch.", x)
        if isinstance(m, ResidualBlock):
            if not isinstance(m.shortcut, nn.Identity):
                raise TypeError(f"{prefix}: batched training supports identity shortcuts only")
            out = self._module(m.branch, f"{prefix}branch.", x)
            if self.mixed:  # u = s·x + g·f_r(x): s = 0 for plain nets, g = 1 for ungated ones
                g = torch.where(self.gate_mask, self._gate(f"{prefix}gate.", cast(ScalarGate, m.gate)), 1.0)
                return torch.addcmul(x * self.shortcut_mask, g, out)
            if isinstance(m.gate, ScalarGate):
                return torch.addcmul(x, self._gate(f"{prefix}gate.", m.gate), out)  # x + g(k)·f_r(x), one pass
            return out + x
        if isinstance(m, AugmentedLayer):
            g = self._gate(f"{prefix}gate.", m.gate)
            return g * self._module(m.branch, f"{prefix}branch.", x) + (1.0 - g) * x
        if isinstance(m, HighwayLayer):
            if not isinstance(m.gate, TransformGate):
                raise TypeError(f"{prefix}gate: batched training supports TransformGate only")
            if x.dim() == 2:  # one shared input batch (B, C): every model's copy of it, feature-major
                x = x.t().unsqueeze(0).expand(self.n, *x.t().shape)
            t = torch.sigmoid(self._module(m.gate.linear, f"{prefix}gate.linear.", x))
            h = self._module(m.branch, f"{prefix}branch.", x)
            # Highway eq. 3, H·T + x·(1 − T), computed as x + T·(H − x): the same value up to rounding
            # in two elementwise passes instead of four (forward and backward alike).
            return torch.addcmul(x, t, h - x)
        if hasattr(m, "stem") and hasattr(m, "blocks") and hasattr(m, "head"):  # the MLP family
            h = self._module(cast(nn.Module, m.stem), "stem.", x)
            for i, block in enumerate(cast(nn.ModuleList, m.blocks)):
                h = self._module(block, f"blocks.{i}.", h)
            return self._module(cast(nn.Module, m.head), "head.", h)
        raise TypeError(f"{prefix or 'model'}: module {type(m).__name__} is not supported by batched training "
                        f"(supported models: {list(SUPPORTED_MODELS)})")


# ----------------------------------------------------------------------------------------------
# The optimiser
# ----------------------------------------------------------------------------------------------

class BatchedOptimizer:
    """SGD (with momentum, optionally Nesterov), NAdam or Adam over the flat (N, P) parameter matrix,
    with per-model learning rate, momentum and weight decay; the arithmetic is torch.optim's
    single-tensor implementation's (torch 2.x), so each row follows what torch's optimiser would do
    to that model alone, up to floating-point rounding. `compile=True` runs the elementwise update
    through torch.compile."""

    def __init__(self, stack: StackedModels, recipes: Sequence[Recipe], compile: bool = False) -> None:
        first = recipes[0]
        if any(r.param_rules for r in recipes):
            raise ValueError("param_rules (per-parameter lr_mult / decay_mult) are not supported by batched "
                             "training; train these runs one at a time (throughway train)")
        # compile=True fuses each optimiser's elementwise passes into one loop (torch.compile, dynamic
        # shapes): several times less memory traffic, for a compilation of about a minute.
        wrap = (lambda f: torch.compile(f, dynamic=True)) if compile else (lambda f: f)
        self._sgd, self._adam, self._nadam = wrap(_sgd_math), wrap(_adam_math), wrap(_nadam_math)
        self.kind = first.optimizer
        self.betas, self.eps, self.momentum_decay, self.nesterov = first.betas, first.eps, first.momentum_decay, first.nesterov
        self.stack = stack
        device = stack.device
        self.momentum = torch.tensor([r.momentum for r in recipes], dtype=stack.flat.dtype, device=device).view(-1, 1)
        # Which entries are weight-decayed: the recipe's parameter groups, on the template.
        decayed = {id(p) for g in parameter_groups(stack.template, first) if g["group"] == "decay" for p in g["params"]}
        mask = torch.zeros(stack.size, dtype=stack.flat.dtype)
        for (name, p) in stack.template.named_parameters():
            if id(p) in decayed:
                o = stack.offsets[name]
                mask[o:o + p.numel()] = 1.0
        wd = torch.tensor([r.weight_decay for r in recipes], dtype=stack.flat.dtype).view(-1, 1)
        self.decay = (wd * mask.view(1, -1)).to(device) if bool((wd != 0).any()) else None
        self.step_count = 0
        self.mu_product = torch.ones((), dtype=torch.float32)
        self.buf = torch.zeros_like(stack.flat) if self.kind == "sgd" else None
        self.exp_avg = torch.zeros_like(stack.flat) if self.kind in ("nadam", "adam") else None
        self.exp_avg_sq = torch.zeros_like(stack.flat) if self.kind in ("nadam", "adam") else None

    def select(self, keep: Sequence[int]) -> None:
        """Keep the optimiser state of the models at positions `keep` (after `StackedModels.select`)."""
        index = torch.tensor(list(keep), dtype=torch.long, device=self.stack.device)
        self.momentum = self.momentum.index_select(0, index)
        if self.decay is not None:
            self.decay = self.decay.index_select(0, index)
        for name in ("buf", "exp_avg", "exp_avg_sq"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.index_select(0, index).contiguous())

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The optimiser's state as named tensors (for the batch's safetensors checkpoint)."""
        out = {"mu_product": self.mu_product.clone()}
        for name in ("buf", "exp_avg", "exp_avg_sq"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], step_count: int) -> None:
        """Restore the state written by `state_tensors`."""
        self.step_count = step_count
        self.mu_product = tensors["mu_product"].clone()
        for name in ("buf", "exp_avg", "exp_avg_sq"):
            if getattr(self, name) is not None:
                getattr(self, name).copy_(tensors[name])

    @torch.no_grad()
    def step(self, lr: torch.Tensor) -> None:
        """One update with per-model learning rates `lr` (N, 1)."""
        p, g = self.stack.flat, self.stack.grad
        if self.decay is not None:
            g = g.addcmul(p, self.decay)  # L2 decay added to the gradient, as torch's weight_decay
        self.step_count += 1
        step = self.step_count
        device = p.device
        if self.kind == "sgd":
            self._sgd(p, g, self.buf, self.momentum, -lr, self.nesterov)
            return
        beta1, beta2 = self.betas
        if self.kind == "adam":
            neg_step = lr * (-1.0 / (1 - beta1 ** step))
            bc2_sqrt = torch.tensor(math.sqrt(1 - beta2 ** step), dtype=p.dtype, device=device)
            self._adam(p, g, self.exp_avg, self.exp_avg_sq, neg_step, bc2_sqrt, beta1, beta2, self.eps)
            return
        mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * self.momentum_decay)))
        mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * self.momentum_decay)))
        self.mu_product *= mu  # a float32 tensor, as torch keeps it
        mu_product = float(self.mu_product)
        mu_product_next = mu_product * mu_next
        # torch divides by √(v / bc2) + eps; dividing by √v + eps·√bc2 and scaling the coefficients by
        # √bc2 is the same quantity, without a division pass over the (N, P) matrix.
        bc2_root = math.sqrt(1 - beta2 ** step)
        c_grad = lr * (-(1.0 - mu) / (1.0 - mu_product) * bc2_root)
        c_avg = lr * (-mu_next / (1.0 - mu_product_next) * bc2_root)
        eps = torch.tensor(self.eps * bc2_root, dtype=p.dtype, device=device)
        self._nadam(p, g, self.exp_avg, self.exp_avg_sq, c_grad, c_avg, eps, beta1, beta2)


# The optimisers' elementwise arithmetic, in place, over (N, P) matrices; per-step scalars arrive as
# tensors so that a compiled version (BatchedOptimizer(compile=True)) is not recompiled every step.

def _sgd_math(p: torch.Tensor, g: torch.Tensor, buf: torch.Tensor, momentum: torch.Tensor, neg_lr: torch.Tensor,
              nesterov: bool) -> None:
    buf.mul_(momentum).add_(g)  # the first step gives buf = g, as torch's clone does
    update = g.addcmul(buf, momentum) if nesterov else buf
    p.addcmul_(update, neg_lr)


def _adam_math(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, neg_step: torch.Tensor,
               bc2_sqrt: torch.Tensor, beta1: float, beta2: float, eps: float) -> None:
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    denom = (v.sqrt() / bc2_sqrt).add_(eps)
    p.addcmul_(m / denom, neg_step)


def _nadam_math(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, c_grad: torch.Tensor,
                c_avg: torch.Tensor, eps: torch.Tensor, beta1: float, beta2: float) -> None:
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    denom = v.sqrt().add_(eps)
    # torch adds c_grad·g/denom and c_avg·m/denom in two passes; one division saves two passes over
    # the (N, P) matrices and differs only by rounding.
    p.addcdiv_(g.mul(c_grad).addcmul_(m, c_avg), denom)


# ----------------------------------------------------------------------------------------------
# The trainer
# ----------------------------------------------------------------------------------------------

@torch.no_grad()
def _evaluate(stack: StackedModels, split: Split, chunk: int = _EVAL_CHUNK) -> tuple[list[float], list[float]]:
    """Per-model mean cross-entropy and error (%) on `split` in evaluation mode (as `evaluate`)."""
    n_models, n = stack.n, len(split)
    loss = torch.zeros(n_models, dtype=torch.float64, device=stack.device)
    wrong = torch.zeros(n_models, dtype=torch.long, device=stack.device)
    for start in range(0, n, chunk):
        x, y = split.x[start:start + chunk], split.y[start:start + chunk]
        logits = stack.forward_logits(x.flatten(1), training=False)  # (N, classes, B)
        yy = y.unsqueeze(0).expand(n_models, -1)
        ce = F.cross_entropy(logits, yy, reduction="none")  # (N, B)
        loss += ce.sum(1, dtype=torch.float64)
        finite = torch.isfinite(logits).all(dim=1)
        wrong += ((logits.argmax(dim=1) != yy) | ~finite).sum(1)
    return (loss / n).tolist(), (100.0 * wrong.double() / n).tolist()


class BatchedStep:
    """One training step of every model of a stack: forward in training mode, per-model mean
    cross-entropy, backward into the flat gradient, and the optimiser's update with per-model
    learning rates; `fit`'s inner loop for N models at once (tests/test_batched.py).

    `compile=True` runs the forward and the loss through torch.compile (fusing BatchNorm, the
    activations and the gates' elementwise work; the backward is compiled with it) and the
    optimiser's update through its own compiled function. Compilation happens on the first call
    (tens of seconds to minutes, more with depth), and again when the number of models changes
    (a diverged model leaves the batch), so it pays only for long batches.
    """

    def __init__(self, stack: StackedModels, optimizer: BatchedOptimizer, compile: bool = False) -> None:
        self.stack, self.optimizer = stack, optimizer
        self._forward_loss = torch.compile(self._forward_loss_eager) if compile else self._forward_loss_eager

    def _forward_loss_eager(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.stack.forward_logits(x, training=True)  # (N, classes, B)
        losses = F.cross_entropy(logits, y, reduction="none").mean(1)
        wrong = (logits.detach().argmax(dim=1) != y).sum(1)
        return losses, wrong

    def __call__(self, x: torch.Tensor, y: torch.Tensor, lr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Train on `x` (N, B, features), `y` (N, B) with learning rates `lr` (N, 1); return each
        model's mean loss on the batch (N,) before the update and its number of errors (N,)."""
        losses, wrong = self._forward_loss(x, y)
        self.stack.grad.zero_()
        backward(losses.sum())  # each model's loss depends on its own parameters only
        self.optimizer.step(lr)
        return losses.detach(), wrong


@dataclass
class EpochTotals:
    """What `train_epoch` measured, per model of the stack: summed loss·batch size, errors, the
    first step whose loss was not finite (−1: none) and that loss, and the samples seen per model."""

    loss_sum: torch.Tensor
    wrong: torch.Tensor
    bad_step: torch.Tensor
    bad_loss: torch.Tensor
    seen: int


def epoch_starts(n: int, batch_size: int) -> list[int]:
    """The first index of each mini-batch of an epoch over n samples, as `fit` makes them: a final
    batch of one sample is folded away (it would break BatchNorm's training statistics)."""
    return [s for s in range(0, n, batch_size) if n - s > 1 or s == 0]


def train_epoch(step: BatchedStep, train_x: torch.Tensor, train_y: torch.Tensor, orders: torch.Tensor,
                batch_size: int, lr: torch.Tensor) -> EpochTotals:
    """One epoch of every model of `step`'s stack: model i visits the flattened training inputs
    `train_x` (n, features) and labels `train_y` (n,) in the order `orders[i]` (a permutation of
    range(n)), in mini-batches of `batch_size` (`epoch_starts`). A model whose loss stops being
    finite keeps stepping to the epoch's end (its slices never mix with the others'); the caller
    restores and drops it (see `train_batched`)."""
    k, n = orders.shape
    device = step.stack.device
    loss_sum = torch.zeros(k, dtype=torch.float64, device=device)
    wrong = torch.zeros(k, dtype=torch.long, device=device)
    bad_step = torch.full((k,), -1, dtype=torch.long, device=device)
    bad_loss = torch.zeros(k, dtype=torch.float32, device=device)
    seen = 0
    for i, start in enumerate(epoch_starts(n, batch_size)):
        index = orders[:, start:start + batch_size]
        x, y = train_x[index], train_y[index]  # (k, B, features), (k, B)
        losses, batch_wrong = step(x, y, lr)
        with torch.no_grad():
            bad = ~torch.isfinite(losses) & (bad_step < 0)
            bad_step = torch.where(bad, torch.full_like(bad_step, i), bad_step)
            bad_loss = torch.where(bad, losses.float(), bad_loss)
            loss_sum += losses.double() * y.shape[1]
            wrong += batch_wrong
        seen += y.shape[1]
    return EpochTotals(loss_sum, wrong, bad_step, bad_loss, seen)


def _config_hash(configs: Sequence[RunConfig], out_dirs: Sequence[Path]) -> str:
    text = json.dumps([[str(d.resolve()), c.to_dict()] for c, d in zip(configs, out_dirs)], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class _Member:
    """One model of the batch: where it writes and what it has done."""

    index: int
    config: RunConfig
    out_dir: Path
    recipe: Recipe
    results: dict[str, Any]
    model_config: dict[str, Any]
    generator: torch.Generator
    history: History = field(default_factory=History)
    elapsed_s: float = 0.0
    done: bool = False


def _check_batch(configs: Sequence[RunConfig], recipes: Sequence[Recipe]) -> None:
    for i, c in enumerate(configs):
        if c.model not in SUPPORTED_MODELS:
            raise ValueError(f"configs[{i}].model={c.model!r}: batched training supports {list(SUPPORTED_MODELS)}")
    for f in _SHARED_CONFIG_FIELDS:
        values = {json.dumps(batch_family(c.model) if f == "model" else getattr(c, f), default=str) for c in configs}
        if len(values) > 1:
            raise ValueError(f"config field {f!r} differs within the batch ({sorted(values)}); a batch shares it")
    shapes = {json.dumps({k: v for k, v in c.model_kwargs.items() if k not in INIT_ONLY_KWARGS}, sort_keys=True)
              for c in configs}
    if len(shapes) > 1:
        raise ValueError(f"model_kwargs differ in shape arguments within the batch ({sorted(shapes)}); only "
                         f"{sorted(INIT_ONLY_KWARGS)} may differ")
    for i, (c, r) in enumerate(zip(configs, recipes)):
        for option in ("amp", "channels_last", "compile"):
            if getattr(c, option, False):
                raise ValueError(f"configs[{i}].{option}=True: not supported by batched training; train it alone")
        for option in ("augment", "normalize"):
            if getattr(r, option, "none") != "none":
                raise ValueError(f"recipe {r.name!r} has {option}={getattr(r, option)!r}: batched training supports "
                                 f"only 'none' (the MNIST recipes)")
    first = recipes[0].to_dict()
    for i, r in enumerate(recipes[1:], 1):
        d = r.to_dict()
        bad = sorted(k for k in set(first) - PER_MODEL_RECIPE_FIELDS if d.get(k) != first[k])
        if bad:
            raise ValueError(f"recipe of configs[{i}] differs from configs[0] in {bad}; a batch shares every "
                             f"recipe field except {sorted(PER_MODEL_RECIPE_FIELDS)}")


def _save_state(state_dir: Path, epoch: int, stack: StackedModels, optimizer: BatchedOptimizer,
                members: Sequence[_Member], active: Sequence[int], snap: dict[str, torch.Tensor]) -> None:
    tensors: dict[str, torch.Tensor] = {"flat": stack.flat, "steps": stack.steps}
    tensors.update({f"running.{k}": v for k, v in stack.running.items()})
    tensors.update({f"optim.{k}": v for k, v in optimizer.state_tensors().items()})
    for i in active:
        tensors[f"generator.{i}"] = members[i].generator.get_state()
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    name = f"batch-e{epoch:04d}.safetensors"
    path = atomic_write_bytes(state_dir / name, save(tensors))
    try:  # the file the old batch.json names, deleted below: only a name this module writes, inside state_dir
        previous = _state_file(state_dir, read_json_object(state_dir / _STATE_JSON).get("file")).name \
            if (state_dir / _STATE_JSON).is_file() else None
    except ValueError:
        previous = None
    atomic_write_json(state_dir / _STATE_JSON, {
        "format": _STATE_FORMAT, "epoch": epoch, "file": name, "sha256": sha256_file(path),
        "active": list(active), "step_count": optimizer.step_count,
        "members": [{"history": m.history.to_dict(), "elapsed_s": m.elapsed_s, "done": m.done} for m in members],
    })
    if previous and previous != name:
        (state_dir / previous).unlink(missing_ok=True)


def _load_state(state_dir: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    meta_path = state_dir / _STATE_JSON
    if not meta_path.is_file():
        return None
    meta = read_json_object(meta_path, "a batch's state")
    if meta.get("format") != _STATE_FORMAT:
        raise ValueError(f"{meta_path}: unknown batch-state format {meta.get('format')!r}")
    path = _state_file(state_dir, meta.get("file"))
    if not path.is_file() or sha256_file(path) != meta.get("sha256"):
        raise ValueError(f"{path}: missing or damaged (checksum differs from {meta_path}); delete {state_dir} to restart the batch")
    if not (isinstance(meta.get("epoch"), int) and isinstance(meta.get("step_count"), int)
            and isinstance(meta.get("active"), list) and all(isinstance(i, int) for i in meta["active"])
            and isinstance(meta.get("members"), list) and all(isinstance(m, dict) for m in meta["members"])):
        raise ValueError(f"{meta_path}: fields 'epoch', 'step_count' (integers), 'active' (list of integers) or "
                         f"'members' (list of objects) malformed; delete {state_dir} to restart the batch")
    try:
        return meta, load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise ValueError(f"{path}: not a readable safetensors file ({exc}); delete {state_dir} to restart the batch") from exc


def _state_file(state_dir: Path, name: Any) -> Path:
    return member_file(state_dir, name, BATCH_FILE, source=state_dir / _STATE_JSON, field="file")


def _write_results(member: _Member, final: bool) -> None:
    member.results["history"] = member.history.epochs
    member.results["diverged"] = member.history.diverged
    member.results["diverged_at"] = member.history.diverged_at
    member.results["final"] = final_summary(member.history) if final else None
    atomic_write_json(member.out_dir / RESULTS_FILE, member.results)
    write_metrics_csv(member.out_dir, member.history.epochs)  # as run_training writes it


def _save_member_model(member: _Member, state: dict[str, torch.Tensor]) -> None:
    cfg = with_legacy_config(member.model_config)
    name = cfg.pop("name")
    model = create_model(name, **cfg)
    model.load_state_dict(state)
    save_model(member.out_dir / MODEL_FILE, model)


def train_batched(configs: Sequence[RunConfig], out_dirs: Sequence[str | os.PathLike[str]], *,
                  resume: bool = False, progress: bool = True, data: DataSplits | None = None,
                  state_dir: str | os.PathLike[str] | None = None, checkpoint: bool = True,
                  eval_chunk: int = _EVAL_CHUNK, compile: bool = False,
                  label: str | None = None) -> list[dict[str, Any]]:
    """Train the models of `configs` together, model i writing its run directory `out_dirs[i]`;
    return their results dicts (those of `run_training`).

    The configs must share model, depth, shape arguments, data set and device, and the recipes'
    SHARED_RECIPE_FIELDS (check with `batch_key`). `resume` continues an interrupted batch from
    `state_dir` (default: `<parent of out_dirs[0]>/.batched/<hash of configs and folders>`), and
    skips models whose results are final; without `resume` an existing results.json raises
    RunExistsError, as `run_training` does. `checkpoint=False` writes no batch state (not resumable).
    `compile=True` trains through BatchedStep(compile=True): torch.compile over the forward, loss and
    backward and over the optimiser's update (minutes of compilation per batch, again once when a
    diverged model first leaves it; worth it only for long batches: measure with
    benchmarks/batched_throughput.py --compile).
    `label` starts every progress line of the batch as `[label]` (default: the first and last run
    directories' names, `first..last`), so that batches trained in parallel can be told apart.
    """
    if len(configs) != len(out_dirs) or not configs:
        raise ValueError(f"configs ({len(configs)}) and out_dirs ({len(out_dirs)}) must be equally long and non-empty")
    dirs = [Path(d) for d in out_dirs]
    if len({d.resolve() for d in dirs}) != len(dirs):
        raise ValueError("out_dirs must be distinct")
    for c in configs:
        check_config(c)  # cheap checks first: device, recipe, model arguments
    recipes = [resolve_recipe(c) for c in configs]
    _check_batch(configs, recipes)
    state_path = Path(state_dir) if state_dir is not None else dirs[0].parent / ".batched" / _config_hash(configs, dirs)
    for d in dirs:
        RunDir(d).check_usable()
    with contextlib.ExitStack() as locks:
        # Every run directory of the batch is locked for the batch's lifetime (see rundir.RunDir).
        for d in dirs:
            locks.enter_context(RunDir(d).locked())
        RunDir(state_path).clean_tmp()
        if label is None:
            label = dirs[0].name if len(dirs) == 1 else f"{dirs[0].name}..{dirs[-1].name}"
        return _train_locked(configs, dirs, recipes, state_path, resume=resume, progress=progress, data=data,
                             checkpoint=checkpoint, eval_chunk=eval_chunk, compile=compile, label=label)


def _train_locked(configs: Sequence[RunConfig], dirs: list[Path], recipes: list[Recipe], state_path: Path, *,
                  resume: bool, progress: bool, data: DataSplits | None, checkpoint: bool, eval_chunk: int,
                  compile: bool, label: str) -> list[dict[str, Any]]:
    saved = _load_state(state_path) if (resume and checkpoint) else None

    results: list[dict[str, Any] | None] = [None] * len(configs)
    todo: list[int] = []
    for i, (c, d) in enumerate(zip(configs, dirs)):
        path = d / RESULTS_FILE
        if path.is_file():
            existing = read_results(d)
            if not resume:
                raise RunExistsError(f"{d} already holds a run ({RESULTS_FILE}); pass --resume to continue "
                                     f"or skip it, or choose another --out")
            check_resumable(existing, c, d)
            if existing.get("final") is not None and saved is None:
                results[i] = existing
                if progress:
                    print(f"  {d}: finished earlier, skipped", file=sys.stderr, flush=True)
                continue
        todo.append(i)
    if saved is None and not todo:
        return [r for r in results if r is not None]

    first = configs[0]
    if data is None:
        data = load_dataset(first.dataset, first.data_dir, train_on_full=first.train_on_full,
                            device=first.device, limit=first.limit)
    if len(data.train) < 2:
        raise ValueError("the training split needs at least 2 samples")
    models = [build_model(c, data) for c in configs]
    members = []
    for i, (c, d, r, model) in enumerate(zip(configs, dirs, recipes, models)):
        header = results_header(c, r, model, data)
        header["environment"]["batched"] = {
            "models": len(configs), "index": i,
            "note": "trained by throughway.train.batched with the other models of its batch; epoch_time_s "
                    "and elapsed_s are the whole batch's wall time"}
        members.append(_Member(i, c, d, r, header, dict(cast(dict, model.config)),
                               torch.Generator(device="cpu").manual_seed(c.seed)))

    stack = StackedModels(models, device=first.device)
    del models
    optimizer = BatchedOptimizer(stack, recipes, compile=compile)
    epoch = 0
    if saved is not None:
        meta, tensors = saved
        active = [int(i) for i in meta["active"]]
        stack.select(active)
        optimizer.select(active)
        stack.flat.copy_(tensors["flat"])
        stack.steps.copy_(tensors["steps"])
        for name, v in stack.running.items():
            v.copy_(tensors[f"running.{name}"])
        optimizer.load_state_tensors({k[len("optim."):]: v.to(stack.device) for k, v in tensors.items()
                                      if k.startswith("optim.")}, int(meta["step_count"]))
        for m, entry in zip(members, meta["members"]):
            m.history = History.from_dict(entry["history"])
            m.elapsed_s = float(entry["elapsed_s"])
            m.done = bool(entry["done"])
        for i in active:
            members[i].generator.set_state(tensors[f"generator.{i}"])
        epoch = int(meta["epoch"])
        if progress:
            print(f"[{label}] resuming batch {state_path} after epoch {epoch} ({len(active)} models active)",
                  file=sys.stderr, flush=True)
    else:
        active = list(todo)
        if len(active) < len(configs):
            stack.select(active)
            optimizer.select(active)
    for i in active:
        dirs[i].mkdir(parents=True, exist_ok=True)
        _write_results(members[i], final=False)

    recipe0 = recipes[0]
    n, batch_size, device = len(data.train), recipe0.batch_size, stack.device
    train_x, train_y = data.train.x.flatten(1), data.train.y
    step = BatchedStep(stack, optimizer, compile=compile)
    snap = stack.snapshot()
    while active and epoch < recipe0.epochs:
        lrs = [learning_rate_at(members[i].recipe, epoch) for i in active]
        lr = torch.tensor(lrs, dtype=stack.flat.dtype, device=device).view(-1, 1)
        started = time.perf_counter()
        orders = torch.stack([torch.randperm(n, generator=members[i].generator) for i in active]).to(device)
        k = len(active)
        totals = train_epoch(step, train_x, train_y, orders, batch_size, lr)
        loss_sum, wrong, bad_step, bad_loss, seen = (totals.loss_sum, totals.wrong, totals.bad_step,
                                                     totals.bad_loss, totals.seen)
        epoch_time = time.perf_counter() - started

        diverged_pos = [pos for pos in range(k) if int(bad_step[pos]) >= 0]
        for pos in diverged_pos:
            # Back to the last finished epoch (as fit does), files written, and the model leaves the
            # batch; its slices of every operation never mixed with the others'.
            m = members[active[pos]]
            m.history.diverged = True
            m.history.diverged_at = {"epoch": epoch + 1, "step": int(bad_step[pos]), "loss": str(float(bad_loss[pos]))}
            _save_member_model(m, stack.state_dict_of(pos, snap))
            m.done = True
            _write_results(m, final=True)
            if progress:
                print(f"[{label}] {m.out_dir.name}: diverged in epoch {epoch + 1} (loss {m.history.diverged_at['loss']}); "
                      f"history kept", file=sys.stderr, flush=True)
        if diverged_pos:
            keep = [pos for pos in range(k) if pos not in set(diverged_pos)]
            stack.select(keep)
            optimizer.select(keep)
            active = [active[pos] for pos in keep]
            lrs = [lrs[pos] for pos in keep]
            loss_sum, wrong = loss_sum[keep], wrong[keep]
        if active:
            val = _evaluate(stack, data.val, eval_chunk) if data.val is not None else None
            test = _evaluate(stack, data.test, eval_chunk)
            k_names = stack.scalar_gate_names()
            k_values = torch.stack([stack.params[name].detach() for name in k_names], 1).tolist() if k_names else None
            sums, wrongs = loss_sum.tolist(), wrong.tolist()
            for pos, i in enumerate(active):
                m = members[i]
                m.elapsed_s += epoch_time
                record: dict[str, Any] = {"epoch": epoch + 1, "lr": lrs[pos], "train_loss": sums[pos] / seen,
                                          "train_error_pct": 100.0 * wrongs[pos] / seen}
                record["val_loss"], record["val_error_pct"] = (val[0][pos], val[1][pos]) if val else (None, None)
                record["test_loss"], record["test_error_pct"] = test[0][pos], test[1][pos]
                if k_values is not None and stack.has_gates(pos):
                    record["k"] = k_values[pos]
                    record["k_mean"] = sum(k_values[pos]) / len(k_values[pos])
                record["epoch_time_s"] = epoch_time
                record["elapsed_s"] = m.elapsed_s
                m.history.epochs.append(record)
                _write_results(m, final=False)
            if progress:
                best = min(range(len(active)), key=lambda p: sums[p])
                print(f"[{label}] batch of {len(active)}: epoch {epoch + 1:>3}/{recipe0.epochs} train loss "
                      f"{min(sums) / seen:.4g}..{max(sums) / seen:.4g} (best {members[active[best]].out_dir.name}) "
                      f"({epoch_time:.1f}s)", file=sys.stderr, flush=True)
        epoch += 1
        snap = stack.snapshot()
        if checkpoint and active:
            _save_state(state_path, epoch, stack, optimizer, members, active, snap)
    for i in active:
        m = members[i]
        _save_member_model(m, stack.state_dict_of(active.index(i)))
        m.done = True
        _write_results(m, final=True)
    if checkpoint and state_path.is_dir():
        for f in state_path.iterdir():
            f.unlink()
        state_path.rmdir()
        if state_path.parent.name == ".batched" and not any(state_path.parent.iterdir()):
            state_path.parent.rmdir()
    for m in members:
        if results[m.index] is None:
            # A model that ended in an earlier process (diverged before an interruption) is read back.
            results[m.index] = m.results if "history" in m.results else read_json(m.out_dir / RESULTS_FILE)
    return [r for r in results if r is not None]
