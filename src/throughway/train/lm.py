"""A causal language model through the one loop: `fit_lm(model, data, recipe, callbacks)` returns a `History`.

The model maps token ids (B, T) to next-token logits (B, T, vocab); the data is a text data set's
`TextSplits` (data.text). What the loop calls an epoch is here the `recipe.steps_per_epoch` optimiser
steps between two evaluations (nanoGPT's eval_interval; None: as many steps as one pass over the
training tokens takes), so everything the loop owns works unchanged: the hooks, divergence (the run
goes back to the last evaluated weights), checkpoints and resume of a run directory (`run.run_training`
on a text data set calls `fit_lm`), early stopping, progress, metrics.csv. What differs is the engine
(`_LMEngine`, this module's), one step of which is:

1. a batch of nanoGPT's random-offset blocks of `context + 1` tokens (`data.text.random_blocks`),
   drawn with the run's generator (a resumed run draws the same blocks);
2. the learning rate of this step (`recipes.learning_rate_at_step`: linear warm-up, cosine decay to
   `recipe.min_lr`; per-epoch schedules keep their epoch's rate);
3. the model's logits for the block's first `context` tokens, and the token-level cross-entropy
   against the block's last `context` tokens (`causal_lm_loss`): **the toolkit shifts, the model
   never sees a target**. A Hugging Face causal LM given `labels` shifts them itself, so a caller who
   shifted them first trains on the token two ahead with no error; here no labels go in (a model
   returning a ModelOutput is read through its `.logits`), and `causal_lm_loss` refuses targets whose
   length is not the logits' plus one, naming the shift;
4. the divergence check (a non-finite loss, before the backward pass), the backward pass, gradient
   clipping to `recipe.grad_clip` (the global norm; 0: none), the optimiser's step (`build_optimizer`:
   AdamW over `recipes.parameter_groups`, weight decay off for gates, norms, biases and embeddings),
   `on_step_end(state, step, loss)`.

Evaluation is deterministic: the validation and test splits' non-overlapping blocks, or a fixed,
evenly spaced `eval_blocks` of them (`data.text.evaluation_blocks`), in eval mode. Each epoch's record
holds the loss in nats per character (`train_loss`, `val_loss`, `test_loss`: the mean over every
predicted character), the next-character error (`*_error_pct`: argmax ≠ target) and bits per
character (`train_bpc`, `val_bpc`, `test_bpc` = loss / ln 2).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from ..data.text import TextSplits, evaluation_blocks, random_blocks
from ..layers import branch_gate_values, find_branches
from . import distributed
from .callbacks import ProgressPrinter
from .checks import check_callbacks, check_eval_batch_size, modes_kept
from .inputs import model_device
from .loop import EpochStats, Member, count_step, run_loop, set_learning_rate
from .optim import build_optimizer
from .recipes import STEP_SCHEDULES, Recipe, get_recipe, learning_rate_at, learning_rate_at_step
from .state import History, TrainState

__all__ = ["fit_lm", "evaluate_lm", "causal_lm_loss", "lm_logits", "bits_per_character", "lm_steps_per_epoch",
           "DEFAULT_LM_EVAL_BATCH"]

# Evaluation blocks per forward pass.
DEFAULT_LM_EVAL_BATCH = 64
_LN2 = math.log(2.0)


def bits_per_character(loss: float) -> float:
    """A loss in nats per character as bits per character: loss / ln 2."""
    return loss / _LN2


def lm_logits(output: Any) -> torch.Tensor:
    """The next-token logits of a model's output: the tensor itself, or the `.logits` of a Hugging Face
    ModelOutput. TypeError naming the model's output otherwise."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    raise TypeError(f"model's output: {type(output).__name__}; accepted: next-token logits (B, T, vocab) as a tensor, "
                    f"or an object with a .logits tensor (a Hugging Face causal LM's output)")


def causal_lm_loss(logits: torch.Tensor, block: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Token-level cross-entropy of next-token `logits` (B, T, V) against the unshifted `block` (B, T + 1):
    the logits at position t score token block[:, t + 1] (the model was given block[:, :T]).

    The shift is done here, once: `block` is the block itself, never targets shifted by the caller. A
    `block` of T tokens (targets already shifted, or the inputs) is a ValueError saying so, as is a
    block with a token outside the vocabulary. `reduction` is F.cross_entropy's ("mean": per character)."""
    if logits.dim() != 3:
        raise ValueError(f"logits: shape {tuple(logits.shape)}; accepted: (batch, T, vocab) next-token logits")
    batch, steps, vocab = logits.shape
    if block.dim() != 2 or block.shape[0] != batch or block.shape[1] != steps + 1:
        raise ValueError(f"block: shape {tuple(block.shape)} for logits of {steps} positions; accepted: the unshifted "
                         f"block of T + 1 = {steps + 1} tokens (the model gets block[:, :-1], the targets are "
                         f"block[:, 1:]): the toolkit shifts, so pass the block, not targets shifted by one")
    if block.is_floating_point():
        raise ValueError(f"block: dtype {block.dtype}; accepted: integer token ids")
    targets = block[:, 1:]
    return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), reduction=reduction)


def lm_steps_per_epoch(recipe: Recipe, train_tokens: int, context: int) -> int:
    """The optimiser steps of one epoch: `recipe.steps_per_epoch`, else one pass over the training tokens,
    train_tokens // (batch_size · context) (at least 1)."""
    if recipe.steps_per_epoch is not None:
        return recipe.steps_per_epoch
    return max(1, train_tokens // (recipe.batch_size * context))


def _check_logits(logits: torch.Tensor, batch: int, steps: int, vocab: int) -> None:
    if logits.dim() != 3 or tuple(logits.shape[:2]) != (batch, steps) or logits.shape[2] < vocab \
            or not logits.is_floating_point():
        raise ValueError(f"model's output: logits of shape {tuple(logits.shape)} {logits.dtype} for {batch} blocks of "
                         f"{steps} tokens; accepted: floating next-token logits ({batch}, {steps}, V) with V ≥ the "
                         f"vocabulary's {vocab} ids (build the model with vocab_size={vocab})")


@torch.no_grad()
def _evaluate_blocks(model: nn.Module, blocks: torch.Tensor, batch_size: int, vocab: int) -> tuple[float, float]:
    loss = torch.zeros((), dtype=torch.float64, device=blocks.device)
    wrong = torch.zeros((), dtype=torch.int64, device=blocks.device)
    for start in range(0, len(blocks), batch_size):
        block = blocks[start:start + batch_size]
        logits = lm_logits(model(block[:, :-1]))
        _check_logits(logits, len(block), block.shape[1] - 1, vocab)
        loss += causal_lm_loss(logits.float(), block, reduction="sum").double()
        # A non-finite row counts as wrong, as fit's evaluation counts it.
        finite = torch.isfinite(logits).all(dim=-1)
        wrong += ((logits.argmax(dim=-1) != block[:, 1:]) | ~finite).sum()
    count = blocks.shape[0] * (blocks.shape[1] - 1)
    return float(loss) / count, 100.0 * int(wrong) / count


def evaluate_lm(model: nn.Module, tokens: torch.Tensor, context: int, *, blocks: int | None = None,
                batch_size: int = DEFAULT_LM_EVAL_BATCH, vocab_size: int | None = None) -> tuple[float, float]:
    """(loss in nats per character, next-character error %) of `model` on a split's `tokens`, in eval mode
    (its modes are given back): the mean over every target of the split's non-overlapping blocks of
    `context` (`data.text.evaluation_blocks`), or of `blocks` of them evenly spaced. The same number on
    every call. Bits per character: `bits_per_character(loss)`. `vocab_size` (default: the logits' width)
    is checked against the model's logits."""
    check_eval_batch_size(batch_size)
    chosen = evaluation_blocks(tokens, context, blocks)
    with modes_kept(model):
        model.eval()
        return _evaluate_blocks(model, chosen, batch_size, 1 if vocab_size is None else vocab_size)


class _LMEngine:
    """`fit_lm`'s engine (train.loop.Engine) for one causal language model: the member at position 0."""

    def __init__(self, state: TrainState, optimizer: torch.optim.Optimizer, data: TextSplits, context: int,
                 steps_per_epoch: int, evals: dict[str, torch.Tensor | None], *, eval_batch_size: int, amp: bool,
                 compile_model: bool, device: torch.device) -> None:
        self.state, self.optimizer, self.data, self.context = state, optimizer, data, context
        self.steps_per_epoch, self.evals, self.eval_batch_size = steps_per_epoch, evals, eval_batch_size
        self.amp, self.compile_model, self.device = amp, compile_model, device
        self.total_steps = state.recipe.epochs * steps_per_epoch
        self.per_step = state.recipe.schedule in STEP_SCHEDULES
        self.train_model: Any = state.model
        self.params = [p for p in state.model.parameters() if p.requires_grad]
        # the gates the L1 pressure acts on (recipe.gate_penalty), from the one list of branches
        self.gates = [ref.gate for ref in find_branches(state.model).values() if ref.gate is not None]
        if state.recipe.gate_penalty and not self.gates:
            raise ValueError(f"recipe {state.recipe.name!r}: gate_penalty={state.recipe.gate_penalty} presses on the "
                             f"gates, but {type(state.model).__name__} has no gated branch (add_gates puts gates in)")
        self.snapshot: dict[str, torch.Tensor] = {}
        self.first_step = True
        # The epoch record's extra numbers; evaluate() adds val_bpc / test_bpc to it, which run_loop merges
        # into the record after evaluating (its documented order).
        self.extra: dict[str, Any] = {}

    def begin(self) -> None:
        """After on_fit_start (a restored checkpoint included): the step count, torch.compile, the snapshot."""
        state = self.state
        if state.step == 0 and state.epoch > 0:
            state.step = state.epoch * self.steps_per_epoch  # a restored run continues its step count
        if self.compile_model:
            self.train_model = torch.compile(state.model)
        self.end_epoch()

    def _lr(self, step: int, epoch: int) -> float:
        recipe = self.state.recipe
        return learning_rate_at_step(recipe, step, self.total_steps) if self.per_step else learning_rate_at(recipe, epoch)

    def set_learning_rates(self, epoch: int) -> list[float]:
        """The rate of the epoch's first step (recorded as the epoch's `lr`); a per-step schedule moves it
        at every step of the epoch."""
        lr = self._lr(epoch * self.steps_per_epoch, epoch)
        set_learning_rate(self.optimizer, lr)
        return [lr]

    def train_epoch(self, epoch: int, states: Sequence[TrainState], callbacks: Sequence[Sequence[Any]]) -> EpochStats:
        """`steps_per_epoch` steps: blocks, lr, forward, loss, divergence check, backward, clip, step, on_step_end."""
        state, optimizer, recipe = self.state, self.optimizer, self.state.recipe
        state.model.train()
        stats = EpochStats([0.0], [0], 0, 0)
        wrong = torch.zeros((), dtype=torch.int64, device=self.device)
        for i in range(self.steps_per_epoch):
            block = random_blocks(self.data.train, self.context, recipe.batch_size, state.generator)  # (B, T + 1)
            if self.per_step:
                set_learning_rate(optimizer, self._lr(state.step, epoch))
            inputs = block[:, :-1]
            if self.amp:
                with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
                    logits = lm_logits(self.train_model(inputs))
            else:
                logits = lm_logits(self.train_model(inputs))
            if self.first_step:  # the model's output, checked before the first backward pass
                _check_logits(logits, block.shape[0], self.context, self.data.vocab_size)
                self.first_step = False
            loss = causal_lm_loss(logits.float() if self.amp else logits, block)
            loss_value = float(loss.detach())
            # Divergence check: before the backward pass, so that no non-finite update is applied.
            if not math.isfinite(loss_value):
                stats.diverged[0] = {"step": i, "loss": str(loss_value)}
                break
            optimizer.zero_grad(set_to_none=True)
            if recipe.gate_penalty:
                # L1 on g (not on k): a relu gate at k ≤ 0 gets no gradient from it, so a closed gate stays closed
                pressure = sum(gate.value().abs().mean() for gate in self.gates)
                (loss + recipe.gate_penalty * pressure).backward()
            else:
                loss.backward()
            if recipe.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.params, recipe.grad_clip)
            optimizer.step()
            wrong += (logits.detach().argmax(dim=-1) != block[:, 1:]).sum()
            if count_step(stats, state, callbacks[0], loss_value, block.shape[0] * self.context):
                break
        stats.wrong = [int(wrong)]
        self.extra = {"train_bpc": bits_per_character(stats.loss_sum[0] / stats.seen) if stats.seen else None}
        stats.extra = [self.extra]
        return stats

    def evaluate(self, which: str) -> list[tuple[float | None, float | None]] | None:
        """Loss and next-character error on the val or test blocks; their bits per character go into the record."""
        blocks = self.evals[which]
        if blocks is None:
            return None
        model = self.state.model
        model.eval()
        try:
            loss, error = _evaluate_blocks(model, blocks, self.eval_batch_size, self.data.vocab_size)
        finally:
            model.train()
        self.extra[f"{which}_bpc"] = bits_per_character(loss)
        return [(loss, error)]

    def gate_values(self) -> list[list[float]]:
        """The model's gates, one number per gated branch (layers.branch_gate_values: k, or a vector gate's
        mean λ), as `fit` records them."""
        return [branch_gate_values(self.state.model)]

    def end_epoch(self) -> None:
        """Copy the weights a divergence in the next epoch goes back to."""
        self.snapshot = {k: v.detach().clone() for k, v in self.state.model.state_dict().items()}

    def roll_back(self, position: int, state: TrainState) -> None:
        """Back to the last finished epoch's weights."""
        self.state.model.load_state_dict(self.snapshot)

    def sync(self, position: int, state: TrainState) -> None:
        """Nothing to do: the state's model is the one trained."""

    def keep(self, positions: Sequence[int]) -> None:
        """Nothing to do: the one member has ended when it is dropped."""


def _model_vocab(model: nn.Module) -> int | None:
    """The vocabulary a model was built for, when it says: the registry's config, or a Hugging Face config."""
    config = getattr(model, "config", None)
    vocab = config.get("vocab_size") if isinstance(config, dict) else getattr(config, "vocab_size", None)
    return vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None


def _model_context(model: nn.Module) -> int | None:
    context = getattr(model, "context", None)
    if isinstance(context, int) and not isinstance(context, bool):
        return context
    config = getattr(model, "config", None)
    positions = getattr(config, "n_positions", None)  # a Hugging Face GPT-2's own config
    return positions if isinstance(positions, int) else None


def fit_lm(model: nn.Module, data: TextSplits, recipe: Recipe | str, callbacks: Sequence[Any] = (), *,
           context: int | None = None, eval_blocks: int | None = None, seed: int = 0, progress: bool = True,
           label: str | None = None, eval_batch_size: int = DEFAULT_LM_EVAL_BATCH, amp: bool = False,
           compile_model: bool = False) -> History:
    """Train the causal language model `model` on `data` for `recipe.epochs` epochs of
    `lm_steps_per_epoch` steps; return the History (the module docstring says what a step and an
    evaluation do, and what each record holds).

    `model` maps token ids (B, T) to logits (B, T, V ≥ data.vocab_size), or to an object with `.logits`
    (a Hugging Face causal LM, which is never given labels); it must be on the data's device. `context`
    is the block length (default: the model's `context` attribute, or a Hugging Face config's
    n_positions). `eval_blocks` evaluates that many evenly spaced blocks of each of val and test instead
    of all of them. `recipe`: a Recipe or a registered name (e.g. "nanogpt-char"); its optimiser is built
    by `build_optimizer` (AdamW for nanogpt-char). `seed` seeds the blocks' generator only (seed the
    model's initialisation before building it). Callbacks, `progress`, `label` and `amp` (bf16 autocast
    of the forward pass), `compile_model` as for `fit`. Checked before the first step, each a
    TypeError / ValueError naming the argument: the model, data, recipe (images' augment and normalize
    refused), context (at most the model's), splits of at least context + 1 tokens, callbacks, the
    model's vocabulary and its logits on the first batch. Not data-parallel: under torchrun with more
    than one rank it refuses. The model leaves in the mode it came in.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: got {type(model).__name__}; accepted: a torch.nn.Module")
    if distributed.rank_and_world()[1] > 1:
        # Each process would train its own copy on its own blocks, with no gradient averaged: refused.
        raise ValueError("fit_lm trains in one process; under torchrun (a process group of several ranks) it is not "
                         "data-parallel: run it without torchrun")
    if not isinstance(data, TextSplits):
        raise TypeError(f"data: got {type(data).__name__}; accepted: TextSplits (load_dataset('shakespeare-char'))")
    if isinstance(recipe, str):
        recipe = get_recipe(recipe)
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe: got {type(recipe).__name__}; accepted: a Recipe or a registered recipe's name")
    for option in ("augment", "normalize"):
        if getattr(recipe, option) != "none":
            raise ValueError(f"recipe {recipe.name!r}: {option}={getattr(recipe, option)!r} applies to images; accepted "
                             f"for text: 'none'")
    check_eval_batch_size(eval_batch_size)
    callbacks = check_callbacks(callbacks)
    largest = _model_context(model)
    if context is None:
        context = largest
        if context is None:
            raise ValueError("context: the model has no `context` attribute to take it from; give context=... (the "
                             "number of input tokens of a block)")
    if isinstance(context, bool) or not isinstance(context, int) or context < 1 \
            or (largest is not None and context > largest):
        raise ValueError(f"context={context!r}: accepted: an integer from 1 to the model's context ({largest})")
    for split in ("train", "val", "test"):
        tokens = getattr(data, split)
        if len(tokens) < context + 1:
            raise ValueError(f"data ({split} split): {len(tokens)} tokens; a block of context {context} needs at least "
                             f"{context + 1}")
    vocab = _model_vocab(model)
    if vocab is not None and vocab < data.vocab_size:
        raise ValueError(f"model: built for vocab_size={vocab}, but {data.name}'s vocabulary has {data.vocab_size} ids; "
                         f"build the model with vocab_size={data.vocab_size}")
    device = model_device(model)
    if data.train.device != device:
        raise ValueError(f"model is on {device} but the data on {data.train.device}; move one")
    evals = {split: evaluation_blocks(getattr(data, split), context, eval_blocks) for split in ("val", "test")}
    optimizer = build_optimizer(model, recipe)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    steps_per_epoch = lm_steps_per_epoch(recipe, len(data.train), context)
    state = TrainState(model, optimizer, recipe, None, generator, History(), steps_per_epoch=steps_per_epoch)
    if progress:
        callbacks = [*callbacks, ProgressPrinter(label=label)]
    engine = _LMEngine(state, optimizer, data, context, steps_per_epoch, dict(evals), eval_batch_size=eval_batch_size,
                       amp=amp, compile_model=compile_model, device=device)
    with modes_kept(model):
        run_loop(engine, [Member(state, callbacks)], recipe.epochs)
    return state.history
