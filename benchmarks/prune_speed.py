"""Inference time of a physically pruned gated residual net relative to the full one, on the same batch.

    python benchmarks/prune_speed.py [--model RUN_DIR/model.safetensors] [--remove 0.5] [--batch 1000]
                                     [--strategy greedy|random] [--threads 1] [--gpt2]

Builds the paper's MNIST net (mlp_gated_residual, d = 100, width 50: 50 blocks) or loads a trained
one (any model that analysis.prune supports), removes a fraction of its blocks with `analysis.prune`
(smallest k first, or a random order for nets without k), and times the forward pass of both models
on the same batch in one process, interleaved, taking the median of repeated timings. Prints the
time ratio (pruned / full) beside the parameter-count ratio, and how far the pruned model's outputs
are from the full one's (0 when every removed block had k ≤ 0: gated-residual-v2 §2.2). The two
ratios differ because the stem, the classifier and per-call overhead are not removed with the blocks.

`--gpt2` does the same for another library's network: a 12-layer Hugging Face GPT-2 (random weights,
width 128, 4 heads; transformers must be installed) gated by `add_gates`, whose layers `prune` takes
out of `transformer.h`; the batch is `--batch` sequences of 64 tokens, and the pruned model is saved
and loaded again (safetensors) before it is timed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from throughway.analysis.removal import prune, removal_order
from throughway.models import create_model
from throughway.train import load_model


def _time(model: torch.nn.Module, x: torch.Tensor, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        model(x)
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a model.safetensors to prune (default: an untrained d = 100 gated net)")
    parser.add_argument("--remove", type=float, default=0.5, help="fraction of the blocks to remove (default 0.5)")
    parser.add_argument("--batch", type=int, default=1000, help="batch size (default 1000)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds (default 15)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--strategy", choices=["greedy", "random"], default="greedy",
                        help="which blocks go: smallest k first (gated nets), or a random order (seed 0)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--gpt2", action="store_true", help="prune a 12-layer Hugging Face GPT-2 instead")
    args = parser.parse_args()
    if not 0.0 < args.remove < 1.0:
        parser.error("--remove must be in (0, 1)")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.gpt2:
        _gpt2(args)
        return
    if args.model:
        full = load_model(args.model, device=args.device)
    else:
        full = create_model("mlp_gated_residual", depth=100, width=50).to(args.device).eval()
    count = len(full.blocks)
    removed = round(args.remove * count)
    try:
        order = removal_order(full, args.strategy, torch.Generator().manual_seed(0))
        pruned = prune(full, order[:removed]).eval()
    except ValueError as exc:
        parser.error(f"{exc}" + ("; use --strategy random" if args.strategy == "greedy" else ""))
    x = torch.rand(args.batch, *([full.config.get("in_features", 784)]), device=args.device)
    with torch.inference_mode():
        for model in (full, pruned):  # warm-up
            _time(model, x, 3)
        full_times, pruned_times = [], []
        for _ in range(args.rounds):
            full_times.append(_time(full, x, 5))
            pruned_times.append(_time(pruned, x, 5))
        difference = float((pruned(x) - full(x)).abs().max())
    full_s, pruned_s = statistics.median(full_times), statistics.median(pruned_times)
    full_params = sum(p.numel() for p in full.parameters())
    pruned_params = sum(p.numel() for p in pruned.parameters())
    print(f"blocks {count} -> {len(pruned.blocks)} ({removed} removed), batch {args.batch}, "
          f"{args.threads} thread(s), {args.device}")
    print(f"forward time: full {1e3 * full_s:.2f} ms, pruned {1e3 * pruned_s:.2f} ms")
    print(f"time ratio pruned/full: {pruned_s / full_s:.3f}   parameter ratio pruned/full: "
          f"{pruned_params / full_params:.3f} ({pruned_params} / {full_params})")
    print(f"max |pruned − full| over the batch's logits: {difference:.3g} ({args.strategy} removal)")


def _gpt2(args: argparse.Namespace) -> None:
    import tempfile
    from pathlib import Path

    import transformers

    from throughway import add_gates
    from throughway.analysis import find_blocks
    from throughway.train import save_model

    def build(layers: int) -> torch.nn.Module:
        config = transformers.GPT2Config(n_layer=layers, n_embd=128, n_head=4, vocab_size=1000, n_positions=64,
                                         bos_token_id=0, eos_token_id=0)
        return add_gates(transformers.GPT2Model(config)).to(args.device).eval()

    full = build(12)
    count = len(find_blocks(full))
    removed = round(args.remove * count)
    order = removal_order(full, "random", torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as folder:
        save_model(Path(folder) / "pruned.safetensors", prune(full, order[:removed]))
        pruned = load_model(Path(folder) / "pruned.safetensors", device=args.device,
                            model=build(count - removed))
    x = torch.randint(0, 1000, (args.batch, 64), device=args.device)
    with torch.inference_mode():
        for model in (full, pruned):
            model(x)
        full_times, pruned_times = [], []
        for _ in range(args.rounds):
            full_times.append(_time(full, x, 2))
            pruned_times.append(_time(pruned, x, 2))
    full_s, pruned_s = statistics.median(full_times), statistics.median(pruned_times)
    full_params = sum(p.numel() for p in full.parameters())
    pruned_params = sum(p.numel() for p in pruned.parameters())
    print(f"GPT-2 layers {count} -> {len(find_blocks(pruned))} ({removed} removed, random order, saved and loaded), "
          f"batch {args.batch} x 64 tokens, {args.threads} thread(s), {args.device}")
    print(f"forward time: full {1e3 * full_s:.2f} ms, pruned {1e3 * pruned_s:.2f} ms")
    print(f"time ratio pruned/full: {pruned_s / full_s:.3f}   parameter ratio pruned/full: "
          f"{pruned_params / full_params:.3f} ({pruned_params} / {full_params})")


if __name__ == "__main__":
    main()
