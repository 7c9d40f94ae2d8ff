"""Which blocks can go: block importance on any registered network, by the learned gate and by the
post-hoc layer-dropping criteria of today's literature, each giving an order of removal that
`removal.removal_curve` takes as it is.

Criteria (`CRITERIA`), each named as `importance_order(model, criterion, batches, ...)` takes it:

* "gate": ascending |g| of each block's gates, `removal.removal_order(model, "greedy")` (gated-residual-v2
  §3.1: the blocks with the smallest k go first). Reads the parameters only.
* "block_influence": ShortGPT's Block Influence (Men et al. 2024), BI = 1 − mean cosine similarity of
  a block's input and output hidden states; lowest BI first (`block_influence`).
* "angular": the angular distance of Gromov et al. 2024 between the hidden states before and after
  n consecutive blocks; the span with the smallest distance goes (`angular_distances`,
  `angular_spans`). A criterion for n blocks at once: see "Orders and spans" below.
* "lesion": the calibration loss increase when one block alone is closed (`removal.lesion`); smallest
  increase first (`lesion_scores`).
* "lesion_greedy": SLEB's iterative elimination (Song et al. 2024): remove the block whose removal
  hurts the calibration loss least, re-evaluate with it removed, repeat (`greedy_lesion_order`).
* "deepest": the deepest blocks first, the final block never (`deepest_order`; Gromov et al.'s
  simpler strategy).
* "random": a random permutation drawn from a given seed or generator (`random_order`).

**Blocks.** Blocks are those of `blocks.find_blocks`, named by qualified name ("blocks.3",
"transformer.h.3"); every order is drawn from `removal.removable_blocks(model)`, so a projection
block (a stride-2 or widening ResNet block) is never in one.

**Calibration batches.** `batches` is an iterable (a list, a generator: it is read once and kept)
of batches, each one of:

* a tensor `x`, passed as `model(x)`;
* a mapping of tensors (a Hugging Face batch: `input_ids`, `attention_mask`, ...), passed as
  `model(**batch)`;
* a pair `(inputs, targets)` whose inputs are either of the above; the hidden-state criteria ignore
  the targets, so one list serves every criterion.

"lesion" and "lesion_greedy" need pairs and `loss_fn(outputs, targets)`, which returns the batch's
loss (a one-element tensor or a number); the calibration loss is the mean of the batches' losses,
each weighted by its number of samples (the first dimension of its inputs). A Hugging Face model
that computes its own loss takes `(batch_with_labels, None)` and `loss_fn=lambda out, _: out.loss`.
Tensors are moved to the device of the model's first parameter. Every forward pass runs in eval mode
under `torch.no_grad()`; each module's train/eval mode is restored afterwards, and no parameter or
buffer is written.

**Hidden states.** A block's input is the first positional argument of its forward (or the keyword
`hidden_states`, as Hugging Face layers may receive it), its output what it returns (the first
element of a tuple, as Hugging Face layers return), both captured by hooks on the block module. What
is compared is one vector per position:

* token blocks (registered with `channel_dim=-1`: torch's and Hugging Face transformer layers, timm's
  ViT block): the feature vector of each token, (B, T, C) read as B·T vectors of C (torch's layers
  with `batch_first=False` as (T, B, C)); `token="all"` pools every token of every sequence (the
  positions where a batch's `attention_mask` is 0 are left out), `token="last"` takes the last
  token of each sequence (the last position whose `attention_mask` is 1);
* every other block (the toolkit's MLPs and conv nets, ResNet blocks): the whole hidden state of one
  sample, flattened, one vector per sample; `token` has no effect.

Averages run over all vectors of all batches alike (a batch of 64 sequences weighs twice one of 32),
and cosines are computed in float64.

**Orders and spans.** `importance_order` returns qualified names, first removed first, for
`removal_curve(model, order, metric)`; its element r is then the model with the first r blocks of
the order removed: nested removals. Gromov et al.'s criterion re-chooses the best span for every n,
so its removal curve is not nested (the two blocks removed at n = 2 need not include the one removed
at n = 1): `angular_spans` gives the span per n and `span_removal_curve` the metric per n.
`importance_order(model, "angular", ...)` is the nested order of single blocks by their n = 1
distance (Gromov et al.'s choice at n = 1 comes first; beyond it the order is not theirs).

References: Men et al. 2024, "ShortGPT: Layers in Large Language Models are More Redundant Than You
Expect" (arXiv:2403.03853); Gromov et al. 2024, "The Unreasonable Ineffectiveness of the Deeper
Layers" (arXiv:2403.17887); Song et al. 2024, "SLEB: Streamlining LLMs through Redundancy
Verification and Elimination of Transformer Blocks" (arXiv:2402.09025).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, cast

import torch
from torch import nn
from torch.nn import functional as F

from ..layers.adapters import block_spec
from ..layers.blocks import iter_blocks
from .blocks import find_blocks, no_blocks_error, resolve_blocks
from .removal import lesion, one_number, prune, removable_blocks, removal_order

__all__ = ["CRITERIA", "TOKENS", "importance_order", "gate_order", "block_influence", "angular_distances",
           "angular_spans", "lesion_scores", "greedy_lesion_order", "deepest_order", "random_order",
           "span_removal_curve"]

CRITERIA = ("gate", "block_influence", "angular", "lesion", "lesion_greedy", "deepest", "random")
# Which positions of a token block's hidden state are compared (see the module docstring).
TOKENS = ("all", "last")
# The criteria that read calibration batches, and those that need (inputs, targets) and a loss.
_NEEDS_BATCHES = ("block_influence", "angular", "lesion", "lesion_greedy")
_NEEDS_LOSS = ("lesion", "lesion_greedy")
_BATCH_FORMS = ("a tensor x (model(x)), a mapping of tensors such as a Hugging Face batch (model(**batch)), or an "
                "(inputs, targets) pair of either")

Batch = Any  # a tensor, a mapping of tensors, or an (inputs, targets) pair
LossFn = Callable[[Any, Any], Any]


# ---- checking what the caller gave -------------------------------------------------------------

def _check_token(token: object) -> str:
    if token not in TOKENS:
        raise ValueError(f"token={token!r}; accepted values: {list(TOKENS)} ('all': every token, ShortGPT's average; "
                         f"'last': the last token of each sequence, Gromov et al.'s)")
    return token


def _check_max_removed(max_removed: object) -> None:
    if max_removed is not None and (isinstance(max_removed, bool) or not isinstance(max_removed, int)
                                    or max_removed < 0):
        raise ValueError(f"max_removed={max_removed!r}: expected None (the whole order) or an integer >= 0")


def _removable(model: nn.Module) -> list[str]:
    """`removable_blocks(model)`, with ValueError naming the model when it has none."""
    if not any(True for _ in iter_blocks(model)):
        raise no_blocks_error(model)
    names = removable_blocks(model)
    if not names:
        raise ValueError(f"{type(model).__name__} has no removable block: every block changes the shape or has no "
                         f"shortcut (analysis.removal.unremovable_blocks says why for each)")
    return names


def _is_inputs(value: object) -> bool:
    return isinstance(value, (torch.Tensor, Mapping))


def _materialise(batches: Iterable[Batch] | None, criterion: str, need_targets: bool) -> list[tuple[Any, Any]]:
    """The batches as a list of (inputs, targets or None); errors naming `batches` for anything else."""
    if batches is None:
        raise ValueError(f"batches=None: criterion {criterion!r} is computed on calibration batches; give a non-empty "
                         f"iterable of batches, each {_BATCH_FORMS}")
    if _is_inputs(batches) or isinstance(batches, (str, bytes)):
        raise TypeError(f"batches is one {type(batches).__name__}; give an iterable of batches, e.g. [x] or "
                        f"[(x, y)], each {_BATCH_FORMS}")
    try:
        items = list(batches)
    except TypeError:
        raise TypeError(f"batches={batches!r:.60}: expected an iterable of batches, each {_BATCH_FORMS}") from None
    if not items:
        raise ValueError(f"batches is empty: criterion {criterion!r} needs at least one calibration batch, each "
                         f"{_BATCH_FORMS}")
    pairs = []
    for i, item in enumerate(items):
        if _is_inputs(item):
            inputs, targets = item, None
            if need_targets:
                raise ValueError(f"batches[{i}] is inputs only; criterion {criterion!r} needs (inputs, targets) pairs "
                                 f"and loss_fn(outputs, targets) (for a model that computes its own loss: "
                                 f"(batch, None) and loss_fn=lambda out, _: out.loss)")
        elif isinstance(item, (tuple, list)) and len(item) == 2 and _is_inputs(item[0]):
            inputs, targets = item
        else:
            raise TypeError(f"batches[{i}] is a {type(item).__name__}; each batch is {_BATCH_FORMS}")
        pairs.append((inputs, targets))
    return pairs


def _device(model: nn.Module) -> torch.device | None:
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return None


def _to(value: Any, device: torch.device | None) -> Any:
    if device is None:
        return value
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, Mapping):
        return {key: _to(item, device) for key, item in value.items()}
    return value


def _call(model: nn.Module, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, Mapping) else model(inputs)


def _samples(inputs: Any) -> int:
    """The batch's number of samples: the first dimension of its input tensor (of a mapping's first tensor)."""
    tensors = [inputs] if isinstance(inputs, torch.Tensor) else [v for v in inputs.values()
                                                                 if isinstance(v, torch.Tensor)]
    return int(tensors[0].shape[0]) if tensors and tensors[0].dim() > 0 else 1


@contextlib.contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode and no_grad inside; every module's own train/eval flag put back on exit (a model
    whose BatchNorm layers were frozen in eval mode stays so)."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for module, mode in modes:
            module.training = mode


# ---- hidden states at block boundaries ---------------------------------------------------------

def _layout(block: nn.Module) -> tuple[bool, int]:
    """(tokens, sequence dimension): whether the block's hidden state is one feature vector per token
    (a registered block with channel_dim=-1) and which dimension holds the sequence."""
    spec = block_spec(block)
    if spec is None or spec.channel_dim != -1:
        return False, 0
    attention = getattr(block, "self_attn", None)
    batch_first = not isinstance(attention, nn.MultiheadAttention) or attention.batch_first
    return True, 1 if batch_first else 0


def _vectors(name: str, h: torch.Tensor, tokens: bool, sequence_dim: int, token: str,
             mask: torch.Tensor | None) -> torch.Tensor:
    """The (N, D) vectors of hidden state `h` that the criteria compare (see the module docstring)."""
    if h.is_nested:
        raise ValueError(f"block {name!r} received a nested tensor (torch's encoder fast path with a padding mask); "
                         f"build the encoder with enable_nested_tensor=False")
    if h.dim() < 2:
        raise ValueError(f"block {name!r}: its hidden state has shape {tuple(h.shape)}; expected a batch "
                         f"(B, ...) of at least 2 dimensions")
    if not tokens:
        return h.reshape(h.shape[0], -1).clone()
    if h.dim() != 3:
        if token == "last" or mask is not None:
            raise ValueError(f"block {name!r}: a token hidden state of shape {tuple(h.shape)}; token='last' and an "
                             f"attention_mask need (batch, tokens, features)")
        return h.reshape(-1, h.shape[-1]).clone()
    if sequence_dim == 0:
        h = h.transpose(0, 1)  # (T, B, C) -> (B, T, C)
    if mask is not None:
        if tuple(mask.shape) != tuple(h.shape[:2]):
            raise ValueError(f"attention_mask of shape {tuple(mask.shape)} does not fit block {name!r}'s hidden state "
                             f"{tuple(h.shape)} (batch, tokens, features)")
        keep = mask.to(device=h.device) != 0
        if token == "all":
            return h[keep]
        rows = keep.any(dim=1)
        positions = torch.arange(h.shape[1], device=h.device)
        last = torch.where(keep, positions, -1).amax(dim=1)
        return h[rows, last[rows]]
    if token == "all":
        return h.reshape(-1, h.shape[-1]).clone()
    return h[:, -1].clone()


def _output_tensor(name: str, out: Any) -> torch.Tensor:
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"block {name!r} returned a {type(out).__name__}; the hidden state is a tensor or the first "
                        f"element of a tuple")
    return out


class _Boundaries:
    """Hooks that record, for one forward pass, the vectors (`_vectors`) of the input and the output
    of each named block, checking that each ran exactly once."""

    def __init__(self, model: nn.Module, names: Sequence[str], token: str) -> None:
        self.blocks = {name: model.get_submodule(name) for name in names}
        self.layouts = {name: _layout(block) for name, block in self.blocks.items()}
        self.token = token
        self.mask: torch.Tensor | None = None
        self.inputs: dict[str, torch.Tensor] = {}
        self.outputs: dict[str, torch.Tensor] = {}
        self.calls: dict[str, int] = {}

    def _before(self, name: str) -> Callable[[nn.Module, tuple, dict], None]:
        def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
            self.calls[name] = self.calls.get(name, 0) + 1
            h = args[0] if args else kwargs.get("hidden_states")
            if not isinstance(h, torch.Tensor):
                raise TypeError(f"block {name!r} was called without a tensor as its first argument or as the keyword "
                                f"hidden_states (keywords given: {sorted(kwargs)}); cannot read its input")
            self.inputs[name] = _vectors(name, h.detach(), *self.layouts[name], self.token, self.mask)
        return hook

    def _after(self, name: str) -> Callable[[nn.Module, tuple, Any], None]:
        def hook(_module: nn.Module, _args: tuple, out: Any) -> None:
            h = _output_tensor(name, out)
            self.outputs[name] = _vectors(name, h.detach(), *self.layouts[name], self.token, self.mask)
        return hook

    def run(self, model: nn.Module, inputs: Any) -> None:
        """One forward pass of `model` on `inputs`, recording every named block's input and output."""
        self.inputs, self.outputs, self.calls = {}, {}, {}
        mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
        self.mask = mask if isinstance(mask, torch.Tensor) else None
        handles = []
        try:
            for name, block in self.blocks.items():
                handles.append(block.register_forward_pre_hook(self._before(name), with_kwargs=True))
                handles.append(block.register_forward_hook(self._after(name)))
            _call(model, inputs)
        finally:
            for handle in handles:
                handle.remove()
        for name in self.blocks:
            calls = self.calls.get(name, 0)
            if calls != 1:
                raise ValueError(f"block {name!r} ran {calls} times in one forward pass; block importance compares "
                                 f"each block's input and output, so every block must run exactly once")


def _mean_over_vectors(model: nn.Module, pairs: Sequence[tuple[str, str]], batches: list[tuple[Any, Any]],
                       token: str, statistic: Callable[[torch.Tensor], torch.Tensor]) -> list[float]:
    """For each (first, last) block pair: the mean over all vectors of all batches of
    statistic(cos(input of first, output of last)), cosines in float64."""
    names = sorted({name for pair in pairs for name in pair}, key=list(find_blocks(model)).index)
    recorder = _Boundaries(model, names, token)
    sums = [0.0] * len(pairs)
    counts = [0] * len(pairs)
    device = _device(model)
    with _evaluating(model):
        for inputs, _targets in batches:
            recorder.run(model, _to(inputs, device))
            for i, (first, last) in enumerate(pairs):
                a, b = recorder.inputs[first], recorder.outputs[last]
                if a.shape != b.shape:
                    raise ValueError(f"the input of block {first!r} has shape {tuple(a.shape)} and the output of "
                                     f"block {last!r} {tuple(b.shape)}: they cannot be compared")
                if a.device.type == "mps":  # no float64 there
                    a, b = a.cpu(), b.cpu()
                cos = F.cosine_similarity(a.double(), b.double(), dim=1, eps=1e-12)
                sums[i] += float(statistic(cos).sum())
                counts[i] += a.shape[0]
    if 0 in counts:
        raise ValueError(f"batches: they hold no position to compare (every attention_mask entry is 0; "
                         f"token={token!r})")
    return [total / count for total, count in zip(sums, counts)]


# ---- the criteria --------------------------------------------------------------------------------

def gate_order(model: nn.Module) -> list[str]:
    """The blocks of `removable_blocks(model)` by ascending gate size: `removal_order(model, "greedy")`
    as qualified names (gated-residual-v2 §3.1, "blocks with the smallest k are removed first"; a
    block's size is its largest branch |g|, a vector gate's the mean |λ|; ties by k, then position).
    Reads the parameters only, no data. ValueError naming the branch when a removable block has no
    gate (throughway.add_gates puts one into any registered network)."""
    _removable(model)
    names = list(find_blocks(model))
    return [names[i] for i in removal_order(model, "greedy")]


def block_influence(model: nn.Module, batches: Iterable[Batch], *, token: str = "all") -> dict[str, float]:
    """ShortGPT's Block Influence of every removable block (Men et al. 2024, "ShortGPT: Layers in Large
    Language Models are More Redundant Than You Expect", the BI metric):
    BI_i = 1 − E_t[cos(x_i,t, x_i+1,t)], where x_i is block i's input hidden state and x_i+1 its
    output, cos the cosine similarity of the two feature vectors at one position t, and E_t the mean
    over every position of every calibration batch: every token for token="all" (ShortGPT's mean,
    the default), the last token of each sequence for token="last"; one flattened vector per sample
    for blocks that are not token blocks (see the module docstring). A low BI means the block
    changes its input little: ShortGPT removes the lowest-BI layers first. A block that is exactly
    the identity has BI = 0 (to float64 rounding).

    Keys: the qualified names of `removable_blocks(model)`, in block order. ValueError / TypeError
    naming `batches` or `token` for bad input, before any forward pass."""
    token = _check_token(token)
    names = _removable(model)
    pairs = _materialise(batches, "block_influence", need_targets=False)
    means = _mean_over_vectors(model, [(name, name) for name in names], pairs, token, lambda cos: cos)
    return {name: 1.0 - mean for name, mean in zip(names, means)}


def _runs(model: nn.Module) -> list[list[str]]:
    """The maximal runs of consecutive blocks (find_blocks order) that are all removable."""
    removable = set(_removable(model))
    runs: list[list[str]] = [[]]
    for name in find_blocks(model):
        if name in removable:
            runs[-1].append(name)
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]


def _check_n(n: object, longest: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= longest:
        raise ValueError(f"n={n!r}: accepted values are integers 1 .. {longest} (the number of consecutive removable "
                         f"blocks a span can cover)")


def angular_distances(model: nn.Module, batches: Iterable[Batch], n: int | None = None, *,
                      token: str = "last") -> dict[int, dict[str, float]]:
    """Gromov et al.'s angular distance for every span of n consecutive removable blocks (Gromov et al.
    2024, "The Unreasonable Ineffectiveness of the Deeper Layers", their layer-pruning algorithm):
    d(x_l, x_l+n) = (1/π)·arccos(cos(x_l,t, x_l+n,t)), averaged over the calibration batches, where
    x_l is the input hidden state of block l (the span's first) and x_l+n the output of block
    l + n − 1 (its last), compared at one position t at a time. token="last" (the default) compares
    the last token of each sequence, as the paper does: in a causal language model it is the one
    position whose state has read the whole sequence. token="all" averages over every token, for
    encoders and vision transformers, whose last position is not special. Blocks that are not token
    blocks compare one flattened vector per sample. The mean is of d, not the arccos of a mean cosine.

    Spans run over consecutive blocks in `find_blocks` order (the order a stack of layers runs in)
    that are all removable; a projection block splits them. Returns {n: {first block of the span:
    mean d}} for every n from 1 to the longest run, or for the given `n` only; the keys of each inner
    dict are in block order. ValueError naming `n` with the accepted range, `batches` or `token` for
    bad input, before any forward pass."""
    token = _check_token(token)
    runs = _runs(model)
    longest = max(len(run) for run in runs)
    if n is not None:
        _check_n(n, longest)
    pairs = _materialise(batches, "angular", need_targets=False)
    sizes = [n] if n is not None else list(range(1, longest + 1))
    spans = [(size, run[start], run[start + size - 1]) for size in sizes for run in runs
             for start in range(len(run) - size + 1)]
    means = _mean_over_vectors(model, [(first, last) for _, first, last in spans], pairs, token,
                               lambda cos: torch.arccos(cos.clamp(-1.0, 1.0)) / math.pi)
    distances: dict[int, dict[str, float]] = {size: {} for size in sizes}
    for (size, first, _last), mean in zip(spans, means):
        distances[size][first] = mean
    return distances


def angular_spans(model: nn.Module, batches: Iterable[Batch], n: int | None = None, *,
                  token: str = "last") -> dict[int, list[str]]:
    """The n blocks Gromov et al. remove for each n (Gromov et al. 2024's layer-pruning algorithm): the
    start l* that minimises the mean angular distance d(x_l, x_l+n) of `angular_distances` (ties: the
    shallowest start), and the blocks l*, ..., l* + n − 1 as qualified names. {n: blocks} for every n from 1 to
    the longest run of consecutive removable blocks, or for the given `n` only.

    The spans are chosen afresh for each n, so they are not nested: the blocks removed at n = 2 need
    not include the block removed at n = 1. `span_removal_curve(model, angular_spans(...), metric)`
    gives the metric after removing each n's span (what the paper plots against the fraction of layers
    dropped). Errors as `angular_distances`."""
    distances = angular_distances(model, batches, n, token=token)
    runs = _runs(model)
    spans = {}
    for size, by_start in distances.items():
        first = min(by_start, key=lambda name: by_start[name])  # the first of equal minima: block order
        run = next(run for run in runs if first in run)
        start = run.index(first)
        spans[size] = run[start:start + size]
    return spans


def _calibration_loss(model: nn.Module, batches: list[tuple[Any, Any]], loss_fn: LossFn, closed: str) -> float:
    """The mean of the batches' losses weighted by their samples (see the module docstring)."""
    total, samples = 0.0, 0
    device = _device(model)
    for inputs, targets in batches:
        value = one_number(loss_fn(_call(model, _to(inputs, device)), _to(targets, device)), "loss_fn",
                           "it must return the batch's loss as one number (a one-element tensor or a float)")
        if math.isnan(value):
            raise ValueError(f"loss_fn returned NaN with {closed}; the blocks cannot be ranked on it")
        weight = _samples(inputs)
        total += float(value) * weight
        samples += weight
    return total / samples


def _check_loss_fn(loss_fn: object) -> LossFn:
    if not callable(loss_fn):
        raise ValueError(f"loss_fn={loss_fn!r}: the lesion criteria need a callable loss_fn(outputs, targets) that "
                         f"returns the batch's loss as one number")
    return cast(LossFn, loss_fn)


def _closing(model: nn.Module, names: Sequence[str]) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    try:
        for name in names:
            stack.enter_context(lesion(model, name))
    except BaseException:
        stack.close()
        raise
    return stack


def _describe(names: Sequence[str]) -> str:
    return f"blocks {list(names)} closed" if names else "no block closed"


def lesion_scores(model: nn.Module, batches: Iterable[Batch], loss_fn: LossFn) -> dict[str, float]:
    """For every removable block, the calibration loss with that block alone closed minus the intact
    model's: the loss increase of lesioning it (the highway paper's lesion study, §4.2, figure 4; the
    one-shot form of SLEB's test, Song et al. 2024). The block is closed by `removal.lesion`, which
    makes every branch of it contribute nothing: exactly its removal for the toolkit's blocks and
    pre-norm transformer layers (u = x), LayerNorm(x) for a post-norm layer such as BERT's. The
    calibration loss is the sample-weighted mean of `loss_fn(outputs, targets)` over `batches`, which
    must be (inputs, targets) pairs (module docstring). Smallest increase first is the order of
    removal; an increase can be negative (closing the block helps). An exact identity block scores 0.

    Keys: the qualified names of `removable_blocks(model)`, in block order. ValueError / TypeError
    naming `batches` or `loss_fn` for bad input, before any forward pass."""
    loss_fn = _check_loss_fn(loss_fn)
    names = _removable(model)
    pairs = _materialise(batches, "lesion", need_targets=True)
    scores = {}
    with _evaluating(model):
        intact = _calibration_loss(model, pairs, loss_fn, _describe([]))
        for name in names:
            with lesion(model, name):
                scores[name] = _calibration_loss(model, pairs, loss_fn, _describe([name])) - intact
    return scores


def greedy_lesion_order(model: nn.Module, batches: Iterable[Batch], loss_fn: LossFn,
                        max_removed: int | None = None) -> list[str]:
    """SLEB's iterative block elimination (Song et al. 2024, "SLEB: Streamlining LLMs through Redundancy
    Verification and Elimination of Transformer Blocks"): with the blocks chosen so far closed, close
    each remaining removable block in turn, measure the calibration loss, choose the block whose
    closing gives the lowest loss (ties: the shallowest), and repeat. SLEB's metric is the
    language-modelling loss of calibration sequences; here it is the sample-weighted mean of
    `loss_fn(outputs, targets)` over `batches` ((inputs, targets) pairs, module docstring). Blocks are
    closed by `removal.lesion` (as in `lesion_scores`: removal for the toolkit's blocks and pre-norm
    layers). Unlike `lesion_scores`' one-shot order, each choice is scored given the earlier ones.

    Returns qualified names, first removed first: all removable blocks, or the first `max_removed`
    (the search costs about L²/2 passes over the batches for L blocks; stopping early saves the
    rest). ValueError / TypeError naming `batches`, `loss_fn` or `max_removed`, before any forward pass."""
    loss_fn = _check_loss_fn(loss_fn)
    _check_max_removed(max_removed)
    remaining = _removable(model)
    pairs = _materialise(batches, "lesion_greedy", need_targets=True)
    limit = len(remaining) if max_removed is None else min(max_removed, len(remaining))
    order: list[str] = []
    with _evaluating(model):
        while len(order) < limit:
            if len(remaining) == 1:
                order.append(remaining.pop())
                break
            losses = {}
            for name in remaining:
                with _closing(model, [*order, name]):
                    losses[name] = _calibration_loss(model, pairs, loss_fn, _describe([*order, name]))
            chosen = min(remaining, key=lambda name: losses[name])  # the first of equal minima: block order
            order.append(chosen)
            remaining.remove(chosen)
    return order


def deepest_order(model: nn.Module) -> list[str]:
    """The removable blocks from the deepest to the shallowest, the final block never: Gromov et al.
    2024's simpler pruning heuristic (remove layers beginning at the penultimate one, from deep to
    shallow), which keeps the final layer, after their observation that the final layer matters. "The
    final block" is the last of `find_blocks(model)`; it is left
    out of the order, so a removal curve over this order stops at L − 1 blocks removed. Reads no data."""
    names = _removable(model)
    final = list(find_blocks(model))[-1]
    return [name for name in reversed(names) if name != final]


def random_order(model: nn.Module, seed: int | None = None, generator: torch.Generator | None = None) -> list[str]:
    """A random permutation of `removable_blocks(model)`, `removal_order(model, "random", generator)` as
    qualified names: the baseline every criterion must beat. Exactly one of `seed` (a
    torch.Generator seeded with it is used) and `generator` must be given, so the order is
    reproducible; the same seed gives the same order. Reads no data."""
    if (seed is None) == (generator is None):
        raise ValueError(f"random order: give exactly one of seed= (an int) and generator= (a torch.Generator); got "
                         f"seed={seed!r}, generator={generator!r}")
    if generator is None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed={seed!r}: expected an integer")
        generator = torch.Generator().manual_seed(seed)
    elif not isinstance(generator, torch.Generator):
        raise ValueError(f"generator={generator!r}: expected a torch.Generator")
    _removable(model)
    names = list(find_blocks(model))
    return [names[i] for i in removal_order(model, "random", generator=generator)]


def _ascending(scores: Mapping[str, float]) -> list[str]:
    # sorted is stable: equal scores keep block order (the shallower block first)
    return sorted(scores, key=lambda name: scores[name])


def importance_order(model: nn.Module, criterion: str, batches: Iterable[Batch] | None = None, *,
                     loss_fn: LossFn | None = None, token: str | None = None, seed: int | None = None,
                     generator: torch.Generator | None = None, max_removed: int | None = None) -> list[str]:
    """The removable blocks of `model` in the order `criterion` removes them, least important first, as
    qualified names that `removal.removal_curve(model, order, metric)` and `removal.prune` take.

    criterion (one of CRITERIA; the module docstring has each paper):

    - "gate": `gate_order` (ascending |g|; no data);
    - "block_influence": ascending `block_influence` (ShortGPT; `token` default "all");
    - "angular": ascending n = 1 angular distance of `angular_distances` (Gromov et al.; `token`
      default "last"): a nested order of single blocks. Gromov et al. choose the best span afresh
      for each n, which no single order holds: use `angular_spans` and `span_removal_curve` for that;
    - "lesion": ascending `lesion_scores` (needs `loss_fn` and (inputs, targets) batches);
    - "lesion_greedy": `greedy_lesion_order` (SLEB; needs `loss_fn`; stops at `max_removed`);
    - "deepest": `deepest_order` (the final block never; no data);
    - "random": `random_order` (needs `seed` or `generator`; no data).

    Ties go to the shallower block. `batches`: calibration batches as the module docstring describes
    (ignored by "gate", "deepest" and "random"). `max_removed`: only the first so many of the order.
    Bad input (an unknown criterion, missing or empty batches, a missing loss_fn, seed or token, a
    model without blocks) is a ValueError or TypeError naming the argument and the accepted values,
    raised before any forward pass."""
    if criterion not in CRITERIA:
        raise ValueError(f"criterion={criterion!r}; accepted values: {list(CRITERIA)}")
    _check_max_removed(max_removed)
    if token is not None:
        _check_token(token)
    if criterion in _NEEDS_LOSS:
        _check_loss_fn(loss_fn)
    if criterion in _NEEDS_BATCHES:
        batches = _materialise(batches, criterion, need_targets=criterion in _NEEDS_LOSS)
    if criterion == "gate":
        order = gate_order(model)
    elif criterion == "block_influence":
        order = _ascending(block_influence(model, cast(list, batches), token=token or "all"))
    elif criterion == "angular":
        order = _ascending(angular_distances(model, cast(list, batches), 1, token=token or "last")[1])
    elif criterion == "lesion":
        order = _ascending(lesion_scores(model, cast(list, batches), cast(LossFn, loss_fn)))
    elif criterion == "lesion_greedy":
        order = greedy_lesion_order(model, cast(list, batches), cast(LossFn, loss_fn), max_removed)
    elif criterion == "deepest":
        order = deepest_order(model)
    else:
        order = random_order(model, seed, generator)
    return order if max_removed is None else order[:max_removed]


def span_removal_curve(model: nn.Module, spans: Mapping[int, Sequence[int | str]], metric: Callable[[nn.Module], float],
                       example_input: torch.Tensor | None = None) -> dict[int, float]:
    """`metric` of the model with each span's blocks physically removed (`removal.prune`,
    `example_input` passed on), keyed by the number of blocks removed, 0 (the intact model) included:
    the removal curve of a criterion that chooses its blocks afresh for every n, such as Gromov et
    al.'s `angular_spans`, whose removals are not nested (contrast `removal.removal_curve`, where
    element r removes the first r blocks of one order). `spans`: {n: the n blocks to remove}, as
    `angular_spans` returns; every span's blocks are resolved (names or positions from 0) before the
    first metric is computed. ValueError naming `spans` when a key is not the length of its span;
    TypeError naming `metric` when it is not callable or returns anything but one number."""
    if not callable(metric):
        raise TypeError(f"metric={metric!r}: expected a callable model -> number")
    if not isinstance(spans, Mapping):
        raise TypeError(f"spans={spans!r:.60}: expected a mapping {{n: the n blocks to remove}}, as angular_spans "
                        f"returns")
    resolved = {}
    for n, blocks in spans.items():
        names = resolve_blocks(model, blocks)
        if isinstance(n, bool) or not isinstance(n, int) or n != len(names):
            raise ValueError(f"spans[{n!r}] lists {len(names)} blocks; each key of spans is the number of blocks its "
                             f"span removes")
        resolved[n] = names
    curve = {}
    for n in [0, *sorted(resolved)]:
        curve[n] = one_number(metric(prune(model, resolved[n], example_input) if n else model), "metric",
                              "span_removal_curve needs one number per model")
    return curve
