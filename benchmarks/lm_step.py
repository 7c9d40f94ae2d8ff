"""Training step of a causal language model: the toolkit's `fit_lm` against a hand-written nanoGPT loop.

    python benchmarks/lm_step.py [--depth 8] [--width 128] [--heads 4] [--context 128] [--batch 32]
                                 [--steps 2] [--rounds 11] [--threads 1] [--sizes 6x128,8x128,6x192]
                                 [--synthetic]

Both sides train the same model (`create_model("gpt", ...)`: torch's pre-norm encoder layers with a
causal mask, nanoGPT's initialisation, built twice from seed 0) on the same data (shakespeare-char's
training split, or `--synthetic` random tokens of its 85-symbol vocabulary, which needs no download)
with the same batch of `--batch` random-offset blocks of `--context` tokens per step:

* toolkit: `throughway.train.fit_lm` with the nanogpt-char recipe (AdamW through the toolkit's one
  update rule, `build_optimizer`: weight decay off for norms, biases and embeddings; the per-step
  warm-up and cosine learning rate; clipping at norm 1; the divergence check, which reads the loss
  every step; the next-character error count), one epoch of `--steps` steps per round;
* hand-written: the loop of nanoGPT's train.py as one writes it: `torch.randint` offsets and a stack
  of slices (get_batch), the learning rate set every step (get_lr), forward, `F.cross_entropy` of
  the flattened logits, backward, `clip_grad_norm_`, `torch.optim.AdamW` over the same two groups,
  no read of the loss.

The rounds are interleaved in one process (a toolkit epoch and the hand-written steps, run from a
callback before the toolkit's epoch in even rounds and after it in odd ones), a few steps each, so
that both sides see the same load on a shared machine and neither always runs first; each step is timed from the end of the previous one (the toolkit's evaluation
between epochs, on one block, is outside every timed step). The first round is a warm-up; the
script prints the median step time of each side over the other rounds, and the ratio hand-written /
toolkit time (the toolkit's throughput relative to the hand-written loop's; the goal is at least
0.9): the median of the rounds' own ratios, and the ratio of the two medians beside it. `--sizes DEPTHxWIDTH,...` then times the toolkit's step alone at those sizes
(heads = width / 32, same context and batch): tokens per second, to size a study.
Time it on a quiet machine: the load average is printed beside the result.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from typing import Any

import torch
from torch.nn import functional as F

from throughway.data import TextSplits, load_dataset
from throughway.data.text import UNKNOWN_CHARACTER
from throughway.models import create_model
from throughway.train import fit_lm, get_recipe, param_groups
from throughway.train.recipes import learning_rate_at_step

VOCAB = 85  # shakespeare-char's vocabulary, UNKNOWN included
SIZE_STEPS = 4  # timed steps per size of --sizes


def synthetic(tokens: int = 400_000) -> TextSplits:
    """Random tokens of an 85-symbol vocabulary (a stand-in that needs no download)."""
    g = torch.Generator().manual_seed(0)
    vocabulary = UNKNOWN_CHARACTER + "".join(chr(32 + i) for i in range(VOCAB - 1))
    draw = lambda n: torch.randint(0, VOCAB, (n,), generator=g)  # noqa: E731
    return TextSplits("synthetic", vocabulary, draw(tokens), draw(10_000), draw(10_000))


def model(depth: int, width: int, heads: int, context: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("gpt", depth=depth, width=width, heads=heads, context=context, vocab_size=VOCAB)


class HandWritten:
    """nanoGPT's train.py loop, step by step (see the module docstring)."""

    def __init__(self, net: torch.nn.Module, data: torch.Tensor, recipe: Any, context: int, total_steps: int) -> None:
        self.net, self.data, self.recipe, self.context, self.total = net.train(), data, recipe, context, total_steps
        self.optimizer = torch.optim.AdamW(param_groups(net, recipe.weight_decay), lr=recipe.lr, betas=recipe.betas)
        self.step_index = 0

    def get_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(self.data) - self.context, (self.recipe.batch_size,))
        x = torch.stack([self.data[i:i + self.context] for i in ix])
        y = torch.stack([self.data[i + 1:i + 1 + self.context] for i in ix])
        return x, y

    def step(self) -> None:
        lr = learning_rate_at_step(self.recipe, self.step_index, self.total)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        x, y = self.get_batch()
        logits = self.net(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.recipe.grad_clip)
        self.optimizer.step()
        self.step_index += 1


class Interleave:
    """A fit_lm callback: times each toolkit step, and runs (and times) the hand-written steps of each
    round: before the toolkit's epoch in even rounds, after it in odd ones, so that neither side always
    runs first."""

    def __init__(self, hand: HandWritten, steps: int) -> None:
        self.hand, self.steps = hand, steps
        self.toolkit: list[list[float]] = []
        self.written: list[list[float]] = []
        self.last = 0.0

    def _hand_steps(self) -> None:
        times = []
        last = time.perf_counter()
        for _ in range(self.steps):
            self.hand.step()
            now = time.perf_counter()
            times.append(now - last)
            last = now
        self.written.append(times)

    def on_epoch_start(self, state: Any) -> None:
        if state.epoch % 2 == 0:
            self._hand_steps()
        self.toolkit.append([])
        self.last = time.perf_counter()

    def on_step_end(self, state: Any, step: int, loss: float) -> None:
        now = time.perf_counter()
        self.toolkit[-1].append(now - self.last)
        self.last = now

    def on_epoch_end(self, state: Any, record: dict[str, Any]) -> None:
        if (state.epoch - 1) % 2 == 1:  # state.epoch counts the epoch just finished
            self._hand_steps()


def compare(data: TextSplits, args: argparse.Namespace) -> None:
    recipe = get_recipe("nanogpt-char", epochs=args.rounds, steps_per_epoch=args.steps, batch_size=args.batch,
                        warmup_steps=min(100, args.steps))
    total = args.rounds * args.steps
    toolkit_net = model(args.depth, args.width, args.heads, args.context)
    hand = HandWritten(model(args.depth, args.width, args.heads, args.context), data.train, recipe, args.context, total)
    timer = Interleave(hand, args.steps)
    fit_lm(toolkit_net, data, recipe, [timer], eval_blocks=1, progress=False)
    ours = statistics.median(t for round_ in timer.toolkit[1:] for t in round_)
    theirs = statistics.median(t for round_ in timer.written[1:] for t in round_)
    paired = statistics.median(sum(w) / sum(t) for t, w in zip(timer.toolkit[1:], timer.written[1:]))
    params = sum(p.numel() for p in toolkit_net.parameters())
    tokens = args.batch * args.context
    print(f"gpt depth {args.depth}, width {args.width}, {args.heads} heads, context {args.context}, batch {args.batch} "
          f"({params / 1e6:.2f}M parameters); {args.rounds} interleaved rounds of {args.steps} steps, the first a "
          f"warm-up; median step")
    print(f"toolkit fit_lm step:           {ours * 1000:7.1f} ms  ({tokens / ours:,.0f} tokens/s)")
    print(f"hand-written nanoGPT-style loop: {theirs * 1000:5.1f} ms  ({tokens / theirs:,.0f} tokens/s)")
    # The rounds' own ratios: each compares steps run seconds apart, so a load that drifts over the run
    # (a shared machine) moves both sides of it; the ratio of the two medians is printed beside it.
    print(f"RATIO toolkit throughput / hand-written: {paired:.2f}x (median of the {args.rounds - 1} rounds' own "
          f"ratios; goal >= 0.9x); ratio of the median step times {theirs / ours:.2f}x")


def sizes(data: TextSplits, args: argparse.Namespace) -> None:
    print(f"toolkit step alone (fit_lm, nanogpt-char recipe), context {args.context}, batch {args.batch}, "
          f"{args.threads} thread(s); median of {SIZE_STEPS} steps after one warm-up step")
    for size in args.sizes.split(","):
        depth, width = (int(v) for v in size.lower().split("x"))
        recipe = get_recipe("nanogpt-char", epochs=1, steps_per_epoch=SIZE_STEPS + 1, batch_size=args.batch,
                            warmup_steps=1)
        net = model(depth, width, max(1, width // 32), args.context)
        timer = Interleave(HandWritten(net, data.train, recipe, args.context, 1), 0)
        fit_lm(net, data, recipe, [timer], eval_blocks=1, progress=False)
        step = statistics.median(timer.toolkit[0][1:])
        params = sum(p.numel() for p in net.parameters())
        tokens = args.batch * args.context
        print(f"  {depth} x {width} ({max(1, width // 32)} heads, {params / 1e6:.2f}M parameters): {step * 1000:7.1f} ms "
              f"a step, {tokens / step:,.0f} tokens/s, {3600 / step:,.0f} steps an hour")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per round (default 2)")
    parser.add_argument("--rounds", type=int, default=11, help="interleaved rounds, the first a warm-up (default 11)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--sizes", default="", help="also time the toolkit's step at DEPTHxWIDTH,... (heads width/32)")
    parser.add_argument("--synthetic", action="store_true", help="random tokens instead of shakespeare-char")
    parser.add_argument("--data-dir", default=None, help="the data root (default $THROUGHWAY_DATA or ~/.cache/throughway)")
    args = parser.parse_args()
    if args.rounds < 2 or args.steps < 1:
        parser.error("--rounds must be at least 2 (the first is a warm-up) and --steps at least 1")
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    data = synthetic() if args.synthetic else load_dataset("shakespeare-char", args.data_dir)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    print(f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} CPUs, load average {load:.2f} at the "
          f"start; data: {data.name} ({len(data.train):,} training tokens)")
    compare(data, args)
    if args.sizes:
        sizes(data, args)
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
