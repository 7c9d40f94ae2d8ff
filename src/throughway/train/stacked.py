"""N small models of one shape held as stacked tensors: `StackedModels`, the stack that
`train.stack` drives (the stacked *model*; its optimiser, `StackedOptimizer`, is here too),
and its computation: one step of every model (`StackedStep`), one epoch (`train_epoch`) and the
evaluation (`evaluate_stack`, through the loop's one evaluator `loop.evaluate_outputs`).

Activations are held feature-major, (N models, C channels, B samples), so that every Linear is one
`torch.baddbmm` and every BatchNorm one `F.batch_norm` over a (1, N·C, B) view without a copy.
Parameters live in one flat (N, P) matrix whose per-parameter views autograd fills in place.
Plain, residual and gated residual MLPs of one depth share the gated residual layout
(`canonical_name`) with a per-model shortcut and gate mask, so the gated residual paper's three
architectures of one depth train as one stack. ReZero (a scalar identity gate α) and
LayerScale (a per-channel gate λ, held (N, C)) MLPs train in stacks of their own.
On a GPU, `train.graphed.GraphedStep` runs `train_epoch`'s steps as replays of one captured CUDA
graph, with the same totals (no host synchronisation within an epoch).
"""

from __future__ import annotations

import math
import types
import warnings
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence, cast

import torch
from torch import nn
from torch.nn import functional as F

from ..layers import AugmentedLayer, HighwayLayer, PlainBlock, ResidualBlock, ScalarGate, TransformGate, VectorGate
from ..layers.blocks import find_branches
from ..layers.gates import GATE_FUNCTIONS
from ..data import Split
from ..models import create_model
from .loop import epoch_starts, evaluate_outputs
from .optim import EAGER, closure_loss, compiled_kernels, update_rows
from .recipes import Recipe, parameter_groups

__all__ = ["StackedModels", "StackedOptimizer", "backward", "canonical_name", "compiled_forward", "own_name", "stack_family",
           "SUPPORTED_MODELS", "MIXABLE_MODELS", "StackedStep", "EpochTotals", "train_epoch", "evaluate_stack",
           "EVAL_CHUNK"]

SUPPORTED_MODELS = ("mlp_plain", "mlp_residual", "mlp_gated_residual", "mlp_highway", "mlp_augmented", "mlp_rezero",
                    "mlp_layerscale")
# The gated residual paper's three MLPs of one depth share every Linear and BatchNorm shape and differ
# only in the shortcut (0 or 1) and the gate (g(k) or a fixed 1): one stack can hold all three, so
# Table 1's architectures of one depth train together. Value: (shortcut, gated) of each block u = shortcut·x + gate·f_r(x).
MIXABLE_MODELS: dict[str, tuple[bool, bool]] = {"mlp_plain": (False, False), "mlp_residual": (True, False),
                                               "mlp_gated_residual": (True, True)}
_MIXED_FAMILY = "mlp_plain|mlp_residual|mlp_gated_residual"


def stack_family(model: str) -> str:
    """The name under which models can share a stack: the model's own, or one name for the three
    MIXABLE_MODELS (plain, residual and gated residual MLPs of one depth train together)."""
    return _MIXED_FAMILY if model in MIXABLE_MODELS else model

_LAYOUT_WARNING = "grad and param do not obey the gradient layout contract"


class _Scope(NamedTuple):
    """The stacked tensors one interpretation of a module reads: parameters and BatchNorm statistics by name."""
    params: dict[str, torch.Tensor]
    running: dict[str, torch.Tensor]


def own_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (a function or a bound method) with a code object of its own, for torch.compile.

    Dynamo keeps compiled graphs per code object and, past `torch._dynamo.config.recompile_limit`
    (8) of them, runs the function eagerly from then on, with no error: the ninth stack of a new shape
    compiled in one process (a study's depths, each with two batch sizes) trained eagerly
    (tests/test_cuda_path.py). Each stack's step compiles a copy of its own."""
    func = getattr(fn, "__func__", fn)
    copy = types.FunctionType(func.__code__.replace(), func.__globals__, func.__name__, func.__defaults__,
                              func.__closure__)
    copy.__kwdefaults__, copy.__qualname__, copy.__doc__ = func.__kwdefaults__, func.__qualname__, func.__doc__
    owner = getattr(fn, "__self__", None)
    return types.MethodType(copy, owner) if owner is not None else copy


def _block_region(stack: "StackedModels", block: nn.Module, scope: _Scope, x: torch.Tensor) -> torch.Tensor:
    """One block of every model of `stack`: `block`'s structure over the tensors of `scope`. Compiled
    by `StackedModels.compile_blocks`, one compilation serves every block of that structure, so
    compiling a depth-d stack costs about what a depth-2 one does."""
    return stack._module(block, "", x, scope)


def backward(loss: torch.Tensor) -> None:
    """`loss.backward()` without autograd's warning about the gradient layout: parameters and their
    gradients are views into the flat (N, P) matrices on purpose (see StackedModels), and autograd
    accumulates into them in place all the same."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_LAYOUT_WARNING)
        loss.backward()

# ----------------------------------------------------------------------------------------------
# The stacked model
# ----------------------------------------------------------------------------------------------

def _structure(module: nn.Module) -> list[str]:
    """A description of the module tree that must be equal for models to be stacked."""
    out = []
    for name, m in module.named_modules():
        extra = ""
        if isinstance(m, (ScalarGate, VectorGate)):
            extra = m.function
        elif isinstance(m, nn.BatchNorm1d):
            extra = f"{m.momentum},{m.eps},{m.affine},{m.track_running_stats}"
        out.append(f"{name}:{type(m).__name__}:{extra}")
    return out


def canonical_name(kind: str, name: str) -> str:
    """The name of a plain/residual/gated MLP's tensor in a mixed stack (the gated residual layout):
    plain layer j's `blocks.j.branch.X` is `blocks.{j // 2}.branch.{j % 2}.X`; others are unchanged."""
    if kind == "mlp_plain" and name.startswith("blocks.") and ".branch." in name:
        _, layer, rest = name.split(".", 2)
        j = int(layer)
        return f"blocks.{j // 2}.branch.{j % 2}.{rest[len('branch.'):]}"
    return name


def own_name(kind: str, name: str) -> str:
    """The inverse of `canonical_name`: a mixed stack's tensor name as model kind `kind` calls it."""
    if kind == "mlp_plain" and name.startswith("blocks."):
        _, block, _branch, half, rest = name.split(".", 4)
        return f"blocks.{2 * int(block) + int(half)}.branch.{rest}"
    return name


def _config_of(model: nn.Module) -> dict[str, Any]:
    """The `model.config` that create_model attaches ({} when there is none)."""
    return cast(dict[str, Any], getattr(model, "config", {}))


def _mixed_template(models: Sequence[nn.Module]) -> nn.Module:
    # The gated residual layout: a gated model of the stack, else one built with the stack's shape.
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
        # Plain, residual and gated residual MLPs in one stack: all are held in the gated residual
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
            raise ValueError("BatchNorm without running statistics is not supported by stacked training")
        self.running: dict[str, torch.Tensor] = {}
        for n in self.bn_names:
            for key in ("running_mean", "running_var"):
                self.running[f"{n}.{key}"] = torch.stack(
                    [st[f"{n}.{key}"].detach() for st in states]).to(self.device).contiguous()
        self.steps = torch.tensor([int(st[f"{n}.num_batches_tracked"]) for st in states
                                   for n in self.bn_names[:1]] or [0] * len(models), dtype=torch.long)
        # `compile_blocks`: the MLP blocks through one compiled function (None: every block interpreted eagerly).
        self._compiled_block: Callable[..., torch.Tensor] | None = None
        self._make_masks()
        self._make_views()

    def compile_blocks(self) -> None:
        """Run each MLP block of block 0's structure through one torch.compile'd function (`_block_region`)
        instead of compiling the whole unrolled stack: compilation then costs about the same at every
        depth (tens of seconds on a GPU for the whole stack at d = 50: results/device-check), and the
        kernels of a block are fused as before. Blocks of another structure, the stem and the head run eagerly."""
        self._make_block_scopes()
        self._compiled_block = torch.compile(own_code(_block_region), dynamic=False)

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
        """Whether the model at `position` has gates of its own (records k, saves k)."""
        return bool(self.gate_names()) and (not self.mixed or MIXABLE_MODELS[self.kinds[position]][1])

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
        if self._compiled_block is not None:
            self._make_block_scopes()

    def _make_block_scopes(self) -> None:
        """Block i's tensors under its own names ("branch.0.weight") for `compile_blocks`, for a block of block
        0's structure; None for the others."""
        blocks = getattr(self.template, "blocks", None)
        self._block_scopes: list[_Scope | None] = []
        if isinstance(blocks, nn.ModuleList) and len(blocks):
            def signature(block: nn.Module, scope: _Scope) -> tuple[Any, ...]:
                # what `_module` reads of a block: its modules' types and options (`_structure`), and shapes
                return (_structure(block), sorted((k, tuple(v.shape)) for k, v in (*scope.params.items(),
                                                                                    *scope.running.items())))
            first: tuple[Any, ...] | None = None
            for i, block in enumerate(blocks):
                prefix = f"blocks.{i}."
                scope = _Scope({k[len(prefix):]: v for k, v in self.params.items() if k.startswith(prefix)},
                               {k[len(prefix):]: v for k, v in self.running.items() if k.startswith(prefix)})
                first = signature(block, scope) if first is None else first
                self._block_scopes.append(scope if signature(block, scope) == first else None)

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

    def snapshot(self) -> dict[str, torch.Tensor]:
        """Copies of every stacked tensor (parameters, running statistics, step counts)."""
        out = {"flat": self.flat.detach().clone(), "steps": self.steps.clone()}
        out.update({f"running.{k}": v.clone() for k, v in self.running.items()})
        return out

    def gate_names(self) -> list[str]:
        """Names of the gate parameters of the template's gated branches, in branch order
        (`layers.blocks.find_branches`, the one list of gates: a scalar k or a LayerScale λ each)."""
        return [f"{ref.gate_path}.k" for ref in find_branches(self.template).values()
                if ref.gate is not None and isinstance(getattr(ref.gate, "k", None), torch.Tensor)]

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

    def training_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The training step's forward of every model on its batch, `x` (N, B, features) and `y` (N, B):
        each model's mean cross-entropy (N,) and its number of errors (N,). What `StackedStep` and
        `graphed.GraphedStep` differentiate (through `compiled_forward`)."""
        logits = self.forward_logits(x, training=True)  # (N, classes, B)
        losses = F.cross_entropy(logits, y, reduction="none").mean(1)
        wrong = (logits.detach().argmax(dim=1) != y).sum(1)
        return losses, wrong

    def _linear(self, prefix: str, x: torch.Tensor, scope: _Scope) -> torch.Tensor:
        w = scope.params[f"{prefix}weight"]
        b = scope.params.get(f"{prefix}bias")
        n, out_features, in_features = w.shape
        if x.dim() == 2:  # one input batch (B, in) for every model: a single matrix product
            y = torch.mm(w.reshape(n * out_features, in_features), x.t())
            if b is not None:
                y = y + b.reshape(-1, 1)
            return y.view(n, out_features, x.shape[0])
        if b is None:
            return torch.bmm(w, x)
        return torch.baddbmm(b.unsqueeze(2), w, x)

    def _batch_norm(self, prefix: str, module: nn.BatchNorm1d, x: torch.Tensor, scope: _Scope) -> torch.Tensor:
        n, channels, batch = x.shape
        # (1, N·C, B): BatchNorm's statistics over the batch, one per model and channel.
        w = scope.params.get(f"{prefix}weight")
        b = scope.params.get(f"{prefix}bias")
        h = F.batch_norm(x.reshape(1, n * channels, batch), scope.running[f"{prefix}running_mean"].view(-1),
                         scope.running[f"{prefix}running_var"].view(-1),
                         w.reshape(-1) if w is not None else None, b.reshape(-1) if b is not None else None,
                         self._training, cast(float, module.momentum), module.eps)
        return h.view(n, channels, batch)

    def _gate(self, prefix: str, gate: ScalarGate, scope: _Scope) -> torch.Tensor:
        return GATE_FUNCTIONS[gate.function](scope.params[f"{prefix}k"]).view(-1, 1, 1)

    def _module(self, m: nn.Module, prefix: str, x: torch.Tensor, scope: _Scope | None = None) -> torch.Tensor:
        """`m`'s output for every model: its parameters and statistics are `scope`'s under `prefix` +
        their names in `m` (the stack's own, `self.params` and `self.running`, by default)."""
        if scope is None:
            scope = _Scope(self.params, self.running)
        if isinstance(m, nn.Linear):
            return self._linear(prefix, x, scope)
        if isinstance(m, nn.Sequential):
            for name, child in m.named_children():
                x = self._module(child, f"{prefix}{name}.", x, scope)
            return x
        if isinstance(m, nn.ReLU):
            return torch.relu(x)
        if isinstance(m, nn.Tanh):
            return torch.tanh(x)
        if isinstance(m, nn.Identity):
            return x
        if isinstance(m, nn.BatchNorm1d):
            return self._batch_norm(prefix, m, x, scope)
        if isinstance(m, PlainBlock):
            return self._module(m.branch, f"{prefix}branch.", x, scope)
        if isinstance(m, ResidualBlock):
            if not isinstance(m.shortcut, nn.Identity):
                raise TypeError(f"{prefix}: stacked training supports identity shortcuts only")
            out = self._module(m.branch, f"{prefix}branch.", x, scope)
            if self.mixed:  # u = s·x + g·f_r(x): s = 0 for plain nets, g = 1 for ungated ones
                g = torch.where(self.gate_mask, self._gate(f"{prefix}gate.", cast(ScalarGate, m.gate), scope), 1.0)
                return torch.addcmul(x * self.shortcut_mask, g, out)
            if isinstance(m.gate, ScalarGate):
                return torch.addcmul(x, self._gate(f"{prefix}gate.", m.gate, scope), out)  # x + g(k)·f_r(x), one pass
            if isinstance(m.gate, VectorGate):  # LayerScale, x + diag(g(λ))·f_r(x): λ is (N, C), x (N, C, B)
                g = GATE_FUNCTIONS[m.gate.function](scope.params[f"{prefix}gate.k"]).unsqueeze(2)
                return torch.addcmul(x, g, out)
            return out + x
        if isinstance(m, AugmentedLayer):
            g = self._gate(f"{prefix}gate.", m.gate, scope)
            return g * self._module(m.branch, f"{prefix}branch.", x, scope) + (1.0 - g) * x
        if isinstance(m, HighwayLayer):
            if not isinstance(m.gate, TransformGate):
                raise TypeError(f"{prefix}gate: stacked training supports TransformGate only")
            if x.dim() == 2:  # one shared input batch (B, C): every model's copy of it, feature-major
                x = x.t().unsqueeze(0).expand(self.n, *x.t().shape)
            t = torch.sigmoid(self._module(m.gate.linear, f"{prefix}gate.linear.", x, scope))
            h = self._module(m.branch, f"{prefix}branch.", x, scope)
            # Highway eq. 3, H·T + x·(1 − T), computed as x + T·(H − x): the same value up to rounding
            # in two elementwise passes instead of four (forward and backward alike).
            return torch.addcmul(x, t, h - x)
        if hasattr(m, "stem") and hasattr(m, "blocks") and hasattr(m, "head"):  # the MLP family
            h = self._module(cast(nn.Module, m.stem), "stem.", x, scope)
            blocks = cast(nn.ModuleList, m.blocks)
            for i, block in enumerate(blocks):
                if self._compiled_block is not None and self._block_scopes[i] is not None:
                    # one compiled function for every block of block 0's structure (`compile_blocks`)
                    h = self._compiled_block(self, blocks[0], cast(_Scope, self._block_scopes[i]), h)
                else:
                    h = self._module(block, f"blocks.{i}.", h, scope)
            return self._module(cast(nn.Module, m.head), "head.", h, scope)
        raise TypeError(f"{prefix or 'model'}: module {type(m).__name__} is not supported by stacked training "
                        f"(supported models: {list(SUPPORTED_MODELS)})")


# ----------------------------------------------------------------------------------------------
# The stacked step, epoch and evaluation (train_stacked's inner loop)
# ----------------------------------------------------------------------------------------------

EVAL_CHUNK = 2500


def evaluate_stack(stack: StackedModels, split: Split, chunk: int = EVAL_CHUNK) -> tuple[list[float], list[float]]:
    """Per-model mean cross-entropy and error (%) on `split` in evaluation mode: `loop.evaluate_outputs`
    (the one evaluation of every path) over the stack's outputs, in chunks of `chunk` samples."""
    outputs = ((list(stack.forward_logits(split.x[s:s + chunk].flatten(1), training=False).transpose(1, 2)),
                split.y[s:s + chunk]) for s in range(0, len(split), chunk))  # N × (B, classes) and the labels
    results = evaluate_outputs(outputs, stack.n)
    return [loss for loss, _ in results], [error if error is not None else math.nan for _, error in results]


def compiled_forward(stack: StackedModels, forward_loss: Callable[..., Any], compile: bool | str) -> Callable[..., Any]:
    """The step's forward-and-loss for `compile`: False, the function itself; True, torch.compile of the
    whole unrolled function (the fastest step; its compilation grows with depth: window
    h200-2026-11-26-b took 17-65 s per depth on an H200); "blocks", the function itself with the
    stack's MLP blocks compiled once (`StackedModels.compile_blocks`: compilation about constant in
    depth, a step somewhat slower than the whole one). ValueError for another value."""
    if compile == "blocks":
        stack.compile_blocks()
        return forward_loss
    if isinstance(compile, bool):
        return torch.compile(own_code(forward_loss)) if compile else forward_loss
    raise ValueError(f"compile={compile!r}: accepted: False, True (the whole step) or 'blocks' (one block, reused)")


class StackedStep:
    """One training step of every model of a stack: forward in training mode, per-model mean
    cross-entropy, backward into the flat gradient, and the optimiser's update with per-model
    learning rates; `fit`'s inner loop for N models at once (tests/test_batched.py).

    `compile=True` runs the forward and the loss through torch.compile (fusing BatchNorm, the
    activations and the gates' elementwise work; the backward is compiled with it) and the
    optimiser's update through its own compiled function. Compilation happens on the first call
    (tens of seconds to minutes, more with depth), and again when the number of models changes
    (a diverged model leaves the stack), so it pays only for long stacks. `compile="blocks"`
    compiles one block instead and runs every block of its structure through it (`compiled_forward`).
    """

    def __init__(self, stack: StackedModels, optimizer: StackedOptimizer, compile: bool | str = False) -> None:
        self.stack, self.optimizer = stack, optimizer
        self._forward_loss = compiled_forward(stack, stack.training_loss, compile)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Train on `x` (N, B, features), `y` (N, B) with the optimiser's current per-model learning
        rates; return each model's mean loss on the batch (N,) before the update and its number of
        errors (N,)."""
        losses, wrong = self._forward_loss(x, y)
        self.optimizer.zero_grad()
        backward(losses.sum())  # each model's loss depends on its own parameters only
        self.optimizer.step()
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

    @classmethod
    def zeros(cls, models: int, device: torch.device) -> "EpochTotals":
        """The totals before an epoch's first step: nothing seen, no step bad."""
        return cls(torch.zeros(models, dtype=torch.float64, device=device),
                   torch.zeros(models, dtype=torch.long, device=device),
                   torch.full((models,), -1, dtype=torch.long, device=device),
                   torch.zeros(models, dtype=torch.float32, device=device), 0)

    @torch.no_grad()
    def add(self, losses: torch.Tensor, wrong: torch.Tensor, step: int | torch.Tensor, size: int) -> None:
        """Count step `step` (0-based in the epoch, a number or a 0-d tensor on the device) of batches of
        `size` samples: each model's mean loss (N,) and errors (N,), in place (the tensors stay where they
        are, as a captured CUDA graph needs). A model's first non-finite loss is kept with its step; the
        samples seen are the caller's to count."""
        bad = ~torch.isfinite(losses) & (self.bad_step < 0)
        self.bad_step.copy_(torch.where(bad, step, self.bad_step))
        self.bad_loss.copy_(torch.where(bad, losses.float(), self.bad_loss))
        self.loss_sum.add_(losses.double() * size)
        self.wrong.add_(wrong)


def train_epoch(step: StackedStep, train_x: torch.Tensor, train_y: torch.Tensor, orders: torch.Tensor,
                batch_size: int) -> EpochTotals:
    """One epoch of every model of `step`'s stack: model i visits the flattened training inputs
    `train_x` (n, features) and labels `train_y` (n,) in the order `orders[i]` (a permutation of
    range(n)), in mini-batches of `batch_size` (`epoch_starts`). A model whose loss stops being
    finite keeps stepping to the epoch's end (its slices never mix with the others'); the caller
    restores and drops it (see `train_stacked`)."""
    k, n = orders.shape
    totals = EpochTotals.zeros(k, step.stack.device)
    for i, start in enumerate(epoch_starts(n, batch_size)):
        index = orders[:, start:start + batch_size]
        x, y = train_x[index], train_y[index]  # (k, B, features), (k, B)
        losses, batch_wrong = step(x, y)
        totals.add(losses, batch_wrong, i, y.shape[1])
        totals.seen += y.shape[1]
    return totals


# ----------------------------------------------------------------------------------------------
# Its optimiser: the (N, P) parameter matrix of a StackedModels (train.optim's one update rule)
# ----------------------------------------------------------------------------------------------

class StackedOptimizer(torch.optim.Optimizer):
    """SGD (with momentum, optionally Nesterov), NAdam or Adam (`update_rows`) over the flat (N, P)
    parameter matrix of a `StackedModels` (`stack.flat`, gradient `stack.grad`), with per-model
    learning rate, momentum and weight decay taken from `recipes` (one per model; the optimiser,
    betas, eps and Nesterov are the first recipe's and must be shared). Row i follows what
    `FlatOptimizer` does to model i alone, up to rounding. `compile=True` runs the elementwise update
    through torch.compile (`compiled_kernels`).

    A `torch.optim.Optimizer` with one parameter group, whose one parameter is `stack.flat`: the
    group's "lr" and "momentum" are (N, 1) tensors, one row per model, and "weight_decay" is the
    (N, P) decay of every entry (None without decay). `step()` applies the group's current rates, so
    per-model schedules set `param_groups[0]["lr"]` (as `train_stacked` does each epoch) and a
    callback reading `state.optimizer` of a stacked member finds a torch optimiser like any other.
    The state (`self.state[stack.flat]`) keeps torch's names: "step", NAdam's "mu_product",
    "momentum_buffer" or "exp_avg" / "exp_avg_sq" as (N, P) matrices."""

    def __init__(self, stack: StackedModels, recipes: Sequence[Recipe], compile: bool = False) -> None:
        first = recipes[0]
        if any(r.param_rules for r in recipes):
            raise ValueError("param_rules (per-parameter lr_mult / decay_mult) are not supported by stacked "
                             "training; train these runs one at a time (throughway train)")
        self.kernels = compiled_kernels() if compile else EAGER
        self.kind = first.optimizer
        self.stack = stack
        device, dtype = stack.device, stack.flat.dtype
        rows = {key: torch.tensor([getattr(r, key) for r in recipes], dtype=dtype, device=device).view(-1, 1)
                for key in ("lr", "momentum")}
        # Which entries are weight-decayed: the recipe's parameter groups, on the template.
        decayed = {id(p) for g in parameter_groups(stack.template, first) if g["group"] == "decay" for p in g["params"]}
        mask = torch.zeros(stack.size, dtype=dtype)
        for (name, p) in stack.template.named_parameters():
            if id(p) in decayed:
                o = stack.offsets[name]
                mask[o:o + p.numel()] = 1.0
        wd = torch.tensor([r.weight_decay for r in recipes], dtype=dtype).view(-1, 1)
        decay = (wd * mask.view(1, -1)).to(device) if bool((wd != 0).any()) else None
        super().__init__([{"params": [stack.flat], **rows, "weight_decay": decay}],
                         {"betas": first.betas, "eps": first.eps, "momentum_decay": first.momentum_decay,
                          "nesterov": first.nesterov})
        state = self.state[stack.flat]
        state["step"] = torch.zeros((), dtype=torch.float32)
        if self.kind == "nadam":
            state["mu_product"] = torch.ones((), dtype=torch.float32)
        if self.kind == "sgd":
            state["momentum_buffer"] = torch.zeros_like(stack.flat)
        else:
            state["exp_avg"] = torch.zeros_like(stack.flat)
            state["exp_avg_sq"] = torch.zeros_like(stack.flat)

    @property
    def _group(self) -> dict[str, Any]:
        return self.param_groups[0]

    @property
    def _state(self) -> dict[str, Any]:
        return self.state[self._group["params"][0]]

    @property
    def step_count(self) -> int:
        """Steps taken (continues across a resumed checkpoint)."""
        return int(self._state["step"])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the stack's flat gradient (`stack.grad`, which the stack's leaves write into; it is
        never set to None, whatever `set_to_none` says, since the leaves are views of it)."""
        self.stack.grad.zero_()

    def select(self, keep: Sequence[int]) -> None:
        """Keep the rates and the optimiser state of the models at positions `keep`, after
        `StackedModels.select` has replaced `stack.flat` by its kept rows."""
        index = torch.tensor(list(keep), dtype=torch.long, device=self.stack.device)
        group, state = self._group, self.state.pop(self._group["params"][0])
        for key in ("lr", "momentum", "weight_decay"):
            if group[key] is not None:
                group[key] = group[key].index_select(0, index)
        for name in ("momentum_buffer", "exp_avg", "exp_avg_sq"):
            if name in state:
                state[name] = state[name].index_select(0, index).contiguous()
        group["params"] = [self.stack.flat]
        self.state[self.stack.flat] = state

    # The stack checkpoint's names (train.stack) for the state's tensors.
    _CHECKPOINT_NAMES = {"momentum_buffer": "buf", "exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The optimiser's state as named tensors (for the stack's safetensors checkpoint)."""
        state = self._state
        out = {"mu_product": state.get("mu_product", torch.ones((), dtype=torch.float32)).clone()}
        for name, saved in self._CHECKPOINT_NAMES.items():
            if name in state:
                out[saved] = state[name]
        return out

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], step_count: int) -> None:
        """Restore the state written by `state_tensors` after `step_count` steps."""
        state = self._state
        state["step"] = torch.tensor(float(step_count), dtype=torch.float32)
        if "mu_product" in state:
            state["mu_product"] = tensors["mu_product"].clone()
        for name, saved in self._CHECKPOINT_NAMES.items():
            if name in state:
                state[name].copy_(tensors[saved])

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every row with the group's per-model rates (`param_groups[0]["lr"]`, (N, 1))."""
        group, state = self._group, self._state  # this optimiser's own, then train.optim's closure and update
        loss = closure_loss(closure)
        update_rows(self.kind, self.stack.flat, self.stack.grad, state, lr=group["lr"],
                    momentum=group["momentum"], weight_decay=group["weight_decay"], betas=tuple(group["betas"]),
                    eps=float(group["eps"]), momentum_decay=float(group["momentum_decay"]),
                    nesterov=bool(group["nesterov"]), kernels=self.kernels)
        return loss

    def __repr__(self) -> str:
        return f"StackedOptimizer({self.kind}, {self.stack.n} models of {self.stack.size} values)"
