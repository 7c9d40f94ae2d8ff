"""The parts of one GPU window (issue 35), each a sub-command writing its file under OUT; run by
scripts/device_check.sh, which gives each part its own time limit.

    python scripts/device_check.py device   --out OUT              # OUT/device.json
    python scripts/device_check.py protocol --out OUT [--epochs 3] # OUT/protocol.json
    python scripts/device_check.py wrn      --out OUT [--steps 150] # OUT/wrn.json
    python scripts/device_check.py highway  --out OUT --budget-s S # OUT/highway_shard.json, OUT/highway_runs.tar.gz
    python scripts/device_check.py summary  --out OUT              # OUT/summary.md

* protocol: the gated residual paper's Table 1 protocol (plain, residual and gated MLPs, width 50,
  d in {2, 10, 20, 50, 100}, 5 seeds, 100 epochs of 60,000 MNIST images, batch 128, NAdam, one
  evaluation of the 10,000 test images per epoch) timed per depth through the stacked CUDA path
  (`train.graphed.GraphedStep`, one stack of 3 × seeds models per depth, on random data of MNIST's
  shape), a few epochs each, projected to the whole protocol (`project_protocol`).
* wrn: a WRN-28-10 gated training step (bf16 autocast, channels_last, the wrn-cifar recipe's SGD) by
  the toolkit's `fit` against a hand-written loop over the same resident data and augmentation; the
  ratio of their images per second and the share of the GPU's dense bf16 peak (`PEAK_BF16`) each
  reaches, FLOPs counted by torch's FlopCounterMode.
* highway: the next unfinished shard of the highway paper's Table 1 conv nets (the authors' net
  `highway_conv` d = 10 and solver `highway-conv-mnist`, widths 16 and 32, 5 runs each, 300 epochs;
  `TABLE`): `next_shard` reads which runs are committed under results/highway-conv-table1 (finished,
  or resumable from a committed checkpoint) and picks the first `--parallel` unfinished ones, trained
  at once, one process each, resumed where a window stopped them; each stops at an epoch's end
  before its deadline (`Deadline`), its checkpoint written, so the next window resumes it.

`--dry-run` runs every part with tiny sizes on the CPU in seconds (fake MNIST, small nets): what
tests/test_device_check.py checks. At most 8 files come back from a device window, so OUT holds
exactly `OUTPUT_FILES`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

REPOSITORY = Path(__file__).resolve().parents[1]
if str(REPOSITORY / "src") not in sys.path:
    sys.path.insert(0, str(REPOSITORY / "src"))

from throughway.data import DataSplits, Split  # noqa: E402

# What a device window brings back (at most 8 files, no sub-folders): the device, the GPU tests'
# output, the three measurements, the highway shard's bookkeeping and runs, and a summary.
OUTPUT_FILES = ("device.json", "device_check.log", "protocol.json", "wrn.json", "highway_shard.json",
                "highway_runs.tar.gz", "summary.md", "profile.json", "conv.json", "studies.tar.gz")

# Each part's files; a window runs a selection of parts (device_check.sh --parts) whose files together
# must fit what a window brings back (at most 8).
PART_FILES: dict[str, tuple[str, ...]] = {
    "device": ("device.json", "device_check.log"), "gpu-tests": (), "wrn": ("wrn.json",),
    "protocol": ("protocol.json",), "highway": ("highway_shard.json", "highway_runs.tar.gz"),
    "profile": ("profile.json",), "conv": ("conv.json",), "studies": ("studies.tar.gz",),
    "summary": ("summary.md",),
}
DEFAULT_PARTS = ("device", "gpu-tests", "wrn", "protocol", "highway", "summary")

# Dense bf16 peak FLOP/s by device name (the vendors' datasheets, without sparsity); the first key
# contained in torch.cuda.get_device_name() wins, so the specific names come first.
PEAK_BF16: dict[str, float] = {
    "H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "H200": 989e12, "GH200": 989e12, "H800": 989e12,
    "B200": 2250e12, "A100": 312e12, "A800": 312e12, "L40S": 362e12, "L4": 121e12, "A10G": 70e12, "A10": 125e12,
    "RTX 4090": 165e12, "RTX 3090": 71e12,
}

# The Table 1 protocol (gated-residual-v2 §3.1): depths, architectures, its data and epochs.
PROTOCOL_DEPTHS = (2, 10, 20, 50, 100)
PROTOCOL_ARCHS = ("mlp_plain", "mlp_residual", "mlp_gated_residual")
PROTOCOL_TRAIN, PROTOCOL_TEST, PROTOCOL_EPOCHS, PROTOCOL_SEEDS = 60_000, 10_000, 100, 5

# The highway paper's Table 1 conv nets: (width, seed) in the order the shards take them.
TABLE = tuple((width, seed) for width in (16, 32) for seed in range(5))
HIGHWAY_RESULTS = Path("results") / "highway-conv-table1"
HIGHWAY_EPOCHS = 300


def peak_bf16(name: str) -> float | None:
    """The dense bf16 peak FLOP/s of the device called `name` (`PEAK_BF16`), None when unknown."""
    for key, peak in PEAK_BF16.items():
        if key.lower() in name.lower():
            return peak
    return None


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------------------------
# device.json
# ----------------------------------------------------------------------------------------------

def _command(args: Sequence[str]) -> str | None:
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


# What decides what a window runs: its sources are compared with a commit's (`sources_digest`).
SOURCE_PATHS = ("src", "scripts", "tests", "pyproject.toml")


def _git(repo: Path, *args: str) -> bytes | None:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _blob_id(data: bytes) -> str:
    """git's object id of a file holding `data` (what `git hash-object` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def working_sources(repo: Path) -> dict[str, str] | None:
    """{path: git blob id} of the files under SOURCE_PATHS as they are on disk: those git tracks and the
    untracked ones it does not ignore (None without git)."""
    listed = _git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *SOURCE_PATHS)
    if listed is None:
        return None
    files = {}
    for name in sorted(set(filter(None, listed.decode().split("\0")))):
        path = repo / name
        if path.is_symlink():
            files[name] = _blob_id(os.readlink(path).encode())
        elif path.is_file():  # a tracked file deleted on disk is not part of what ran
            files[name] = _blob_id(path.read_bytes())
    return files


def committed_sources(repo: Path, commit: str) -> dict[str, str] | None:
    """{path: git blob id} of the files under SOURCE_PATHS in `commit` (None when git cannot read it)."""
    listed = _git(repo, "ls-tree", "-r", "-z", commit, "--", *SOURCE_PATHS)
    if listed is None:
        return None
    files = {}
    for entry in filter(None, listed.decode().split("\0")):
        meta, name = entry.split("\t", 1)
        files[name] = meta.split()[2]
    return files


def sources_digest(files: dict[str, str]) -> str:
    """One SHA-256 over every (path, blob id) of `files`: equal for a working tree and a commit exactly when
    their sources hold the same files with the same contents (file modes aside, which a copy may lose)."""
    return hashlib.sha256("".join(f"{name} {blob}\n" for name, blob in sorted(files.items())).encode()).hexdigest()


def source_record(repo: Path = REPOSITORY) -> dict[str, Any]:
    """What ran, as far as this checkout can tell: its HEAD (`git_revision`), the digest of its sources as
    they are on disk (`sources_sha256`) and whether they differ from HEAD's (`git_dirty`; None without
    git). A checkout whose .git is stale or whose files were edited is dirty: the commit that ran is then
    the one whose sources have that digest (`commits_of`, run where the history is: `which-commit`)."""
    head = _git(repo, "rev-parse", "HEAD")
    revision = head.decode().strip() if head else None
    working = working_sources(repo)
    digest = sources_digest(working) if working is not None else None
    committed = committed_sources(repo, revision) if revision else None
    dirty = None if digest is None or committed is None else digest != sources_digest(committed)
    return {"git_revision": revision, "git_dirty": dirty, "sources_sha256": digest}


def commits_of(digest: str, repo: Path = REPOSITORY, limit: int = 2000) -> list[str]:
    """The commits among the last `limit` (every branch, newest first) whose sources have `digest`: the
    commit that ran, and any later one that changed nothing under SOURCE_PATHS (a results commit)."""
    listed = _git(repo, "rev-list", f"--max-count={limit}", "--all")
    found = []
    for commit in (listed or b"").decode().split():
        files = committed_sources(repo, commit)
        if files is not None and sources_digest(files) == digest:
            found.append(commit)
    return found


def device_info() -> dict[str, Any]:
    """The machine a window ran on: GPU model, driver, torch, CUDA, cuDNN, Python, and what ran
    (`source_record`: the git revision, whether the tree was dirty, the sources' digest)."""
    info: dict[str, Any] = {
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "cuda_available": torch.cuda.is_available(),
        **source_record(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update({"gpu": torch.cuda.get_device_name(0), "gpu_count": torch.cuda.device_count(),
                     "capability": f"{props.major}.{props.minor}", "multiprocessors": props.multi_processor_count,
                     "memory_gib": round(props.total_memory / 2 ** 30, 1),
                     "cudnn": torch.backends.cudnn.version(), "peak_bf16_flops": peak_bf16(torch.cuda.get_device_name(0))})
        info["driver"] = _command(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return info


# ----------------------------------------------------------------------------------------------
# protocol: Table 1 through the stacked CUDA path, projected
# ----------------------------------------------------------------------------------------------

def project_protocol(per_depth: dict[int, dict[str, float]], epochs: int = PROTOCOL_EPOCHS) -> dict[str, Any]:
    """The whole protocol's seconds from each depth's measured stack: `first_epoch_s` (the first
    training epoch, capture included), `epoch_s` (a later training epoch) and `eval_s` (one
    evaluation of the test images), all at the protocol's sizes. A depth's stack trains `epochs`
    epochs with an evaluation after each: first_epoch_s + (epochs − 1)·epoch_s + epochs·eval_s; the
    depths' stacks run one after another on one GPU."""
    if epochs < 1:
        raise ValueError(f"epochs={epochs}: must be at least 1")
    seconds = {d: m["first_epoch_s"] + (epochs - 1) * m["epoch_s"] + epochs * m["eval_s"]
               for d, m in sorted(per_depth.items())}
    total = sum(seconds.values())
    return {"epochs": epochs, "per_depth_s": {str(d): s for d, s in seconds.items()}, "total_s": total,
            "total_min": total / 60}


def protocol_stack(depth: int, seeds: int, device: torch.device, width: int = 50, batch_size: int = 128,
                   compile: str | None = None) -> tuple[Any, Any, list[torch.Generator]]:
    """The Table 1 protocol's stack of one depth: 3·seeds models (plain, residual, gated residual) in one
    StackedModels, its NAdam, the GraphedStep that trains it (compiled when `compile` is "whole" or
    "blocks") and one shuffling generator per model."""
    from throughway.models import create_model
    from throughway.train import get_recipe
    from throughway.train.stack import order_generator
    from throughway.train.graphed import GraphedStep
    from throughway.train.stacked import StackedModels, StackedOptimizer

    recipe = get_recipe("gresnet-mnist", batch_size=batch_size)
    models = []
    for name in PROTOCOL_ARCHS:
        for seed in range(seeds):
            torch.manual_seed(seed)
            models.append(create_model(name, depth=depth, width=width))
    stack = StackedModels(models, device=device)
    optimizer = StackedOptimizer(stack, [recipe] * len(models))
    optimizer.param_groups[0]["lr"] = torch.full((len(models), 1), recipe.lr, device=device)
    step = GraphedStep(stack, optimizer, compile={None: False, "whole": True, "blocks": "blocks"}[compile])
    generators = [order_generator(device).manual_seed(i) for i in range(len(models))]
    return stack, step, generators


def _protocol_epoch(step: Any, x: torch.Tensor, y: torch.Tensor, generators: list[torch.Generator],
                    batch_size: int) -> None:
    """One training epoch of a protocol stack, ended by its one read, as the trainer does."""
    orders = torch.stack([torch.randperm(len(x), generator=g, device=g.device) for g in generators])
    totals = step.epoch(x, y, orders, batch_size)
    totals.loss_sum.tolist()


def time_protocol_depth(depth: int, seeds: int, data: DataSplits, epochs: int, batch_size: int,
                        device: torch.device, width: int = 50, compile: str | None = None,
                        keep: dict[int, Any] | None = None) -> dict[str, float]:
    """Seconds of the first and later training epochs and of one evaluation of a stack of 3·seeds
    models (plain, residual, gated residual) of `depth`, through GraphedStep on `device` (compiled by
    torch.compile when `compile` is "whole" or "blocks": the first epoch then includes the compilation).
    With `keep`, keep[depth] = (step, generators): the captured stack, for `concurrent_rounds`."""
    from throughway.train.stacked import evaluate_stack

    stack, step, generators = protocol_stack(depth, seeds, device, width, batch_size, compile)
    if keep is not None:
        keep[depth] = (step, generators)
    x, y = data.train.x.flatten(1), data.train.y
    times = []
    for _ in range(epochs):
        _sync(device)
        start = time.perf_counter()
        _protocol_epoch(step, x, y, generators, batch_size)
        _sync(device)
        times.append(time.perf_counter() - start)
    evaluate_stack(stack, data.test)  # warm-up
    _sync(device)
    start = time.perf_counter()
    evaluate_stack(stack, data.test)
    _sync(device)
    eval_s = time.perf_counter() - start
    later = times[1:] or times
    return {"first_epoch_s": times[0], "epoch_s": statistics.median(later), "eval_s": eval_s,
            "models": 3 * seeds, "captures": step.captures, "epochs_timed": len(times)}


def _stream(device: torch.device) -> Any:
    """A context that runs the enclosed work on a fresh CUDA stream of `device` (nothing on a CPU)."""
    return torch.cuda.stream(torch.cuda.Stream(device)) if device.type == "cuda" else contextlib.nullcontext()


def concurrent_rounds(stacks: dict[int, Any], x: torch.Tensor, y: torch.Tensor, batch_size: int,
                      device: torch.device, rounds: int) -> list[float]:
    """Wall seconds of `rounds` rounds in which every depth's captured stack (`stacks`: depth → (step,
    generators), already captured) trains one epoch at the same time as the others: one thread per
    depth, each launching its epoch's graph replays on a CUDA stream of its own and ending with its
    epoch's one read, so that the small kernels of different depths can run side by side on the GPU.
    The profile (one captured d = 100 epoch: thousands of kernels a step of about 2 us each) says a
    stack alone leaves most of the GPU's units idle; this measures what running the depths together
    gains. On a CPU the threads share the cores (the dry run checks the bookkeeping, not the speed)."""
    if rounds < 1:
        raise ValueError(f"rounds={rounds}: must be at least 1")

    def one_epoch(depth: int) -> None:
        step, generators = stacks[depth]
        with _stream(device):
            _protocol_epoch(step, x, y, generators, batch_size)

    return [_at_once(one_epoch, list(stacks), device, "concurrent round, d =") for _ in range(rounds)]


def _at_once(work: Callable[[Any], None], items: Sequence[Any], device: torch.device, name: str) -> float:
    """Wall seconds of `work(item)` for every item at once, one thread each, from a synchronised device to
    every thread joined and the device synchronised again; the first failure is raised afterwards as a
    RuntimeError naming its item (`name` and the item: "concurrent round, d = 4: ...")."""
    errors: list[BaseException] = []

    def run(item: Any) -> None:
        try:
            work(item)
        except BaseException as error:  # re-raised in the launching thread, which names the item
            errors.append(RuntimeError(f"{name} {item}: {error!r}"))

    _sync(device)
    start = time.perf_counter()
    threads = [threading.Thread(target=run, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _sync(device)
    seconds = time.perf_counter() - start
    if errors:
        raise errors[0]
    return seconds


def random_mnist(train: int, test: int, device: torch.device) -> DataSplits:
    """Random images of MNIST's shape on `device` (a step's speed does not depend on the values)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (train + test, 1, 28, 28), generator=g, dtype=torch.uint8).to(device)
    labels = torch.randint(0, 10, (train + test,), generator=g).to(device)
    images = x.float().div_(255.0)  # resident uint8 normalised once, on the device
    return DataSplits("random", 10, Split(images[:train], labels[:train]), None, Split(images[train:], labels[train:]))


def _protocol_result(args: argparse.Namespace, device: torch.device, per_depth: dict[int, Any],
                     scaled: dict[int, Any], projection: dict[str, Any] | None) -> dict[str, Any]:
    return {"device": str(device), "seeds": args.seeds, "models": 3 * args.seeds * len(args.depths),
            "samples_timed": args.samples, "test_timed": args.test, "batch_size": args.batch_size,
            "width": args.width, "compile": args.compile, "depths": list(args.depths),
            "complete": projection is not None, "measured": {str(d): m for d, m in per_depth.items()},
            "at_protocol_size": {str(d): m for d, m in scaled.items()}, "projection": projection, "goal_min": 5.0}


def protocol(args: argparse.Namespace, out: Path | None = None) -> dict[str, Any]:
    """Time each depth's stack and project the protocol; with `out`, OUT/protocol.json is written after
    each depth (`complete` false and no projection until every depth is measured), so a part stopped at
    its time limit still brings back the depths it measured."""
    device = torch.device(args.device)
    data = random_mnist(args.samples, args.test, device)
    per_depth, scaled = {}, {}
    stacks: dict[int, Any] | None = {} if args.concurrent else None
    for depth in args.depths:
        measured = time_protocol_depth(depth, args.seeds, data, args.epochs, args.batch_size, device, args.width,
                                       compile=args.compile, keep=stacks)
        per_depth[depth] = measured
        # at the protocol's sizes: the epoch scales with the training images, evaluation with the test images
        train_scale, test_scale = PROTOCOL_TRAIN / args.samples, PROTOCOL_TEST / args.test
        scaled[depth] = {"first_epoch_s": measured["first_epoch_s"] - measured["epoch_s"]
                         + measured["epoch_s"] * train_scale,
                         "epoch_s": measured["epoch_s"] * train_scale, "eval_s": measured["eval_s"] * test_scale}
        print(f"protocol d = {depth}: {measured['models']} models, first epoch {measured['first_epoch_s']:.2f} s, "
              f"epoch {measured['epoch_s']:.3f} s, evaluation {measured['eval_s']:.3f} s "
              f"({args.samples} / {args.test} images)", flush=True)
        if out is not None and len(per_depth) < len(args.depths):
            _write_json(out / "protocol.json", _protocol_result(args, device, per_depth, scaled, None))
    result = _protocol_result(args, device, per_depth, scaled, project_protocol(scaled, PROTOCOL_EPOCHS))
    projection = result["projection"]
    print(f"projected protocol ({result['models']} models x {PROTOCOL_EPOCHS} epochs): "
          f"{projection['total_min']:.2f} min", flush=True)
    if stacks is not None:
        if out is not None:  # the sequential projection is kept if the rounds do not finish
            _write_json(out / "protocol.json", result)
        x, y = data.train.x.flatten(1), data.train.y
        times = concurrent_rounds(stacks, x, y, args.batch_size, device, args.rounds)
        result["concurrent"] = project_concurrent(scaled, statistics.median(times) * PROTOCOL_TRAIN / args.samples,
                                                  PROTOCOL_EPOCHS)
        result["concurrent"]["rounds_s"] = times
        c = result["concurrent"]
        print(f"every depth at once: an epoch of all depths {c['round_s']:.3f} s against {c['sequential_round_s']:.3f} s "
              f"one after another (x{c['speedup']:.2f}); projected protocol {c['total_min']:.2f} min", flush=True)
    return result


def project_concurrent(per_depth: dict[int, Any], round_s: float, epochs: int) -> dict[str, Any]:
    """The whole protocol's seconds when every depth's stack trains at once (`concurrent_rounds`): each
    depth's first epoch (its capture) alone, one after another, then `epochs` − 1 rounds of `round_s`
    (one epoch of every depth together, at the protocol's size), then `epochs` evaluations of every
    depth one after another. `sequential_round_s` is the sum of the depths' later epochs alone, and
    `speedup` their ratio to `round_s`."""
    if epochs < 1:
        raise ValueError(f"epochs={epochs}: must be at least 1")
    first = sum(m["first_epoch_s"] for m in per_depth.values())
    sequential = sum(m["epoch_s"] for m in per_depth.values())
    evaluations = sum(m["eval_s"] for m in per_depth.values())
    total = first + (epochs - 1) * round_s + epochs * evaluations
    return {"epochs": epochs, "round_s": round_s, "sequential_round_s": sequential,
            "speedup": sequential / round_s if round_s > 0 else None, "total_s": total, "total_min": total / 60}


# ----------------------------------------------------------------------------------------------
# wrn: the toolkit's WRN-28-10 gated step against a hand-written loop
# ----------------------------------------------------------------------------------------------

def _wrn(depth: int, widen: int, device: torch.device) -> torch.nn.Module:
    from throughway.models import create_model
    torch.manual_seed(0)
    return create_model("wide_resnet", depth=depth, widen_factor=widen, dropout=0.3, gated=True,
                        num_classes=10).to(device)


def step_flops(model: torch.nn.Module, batch: int, device: torch.device, amp: bool) -> float:
    """FLOPs of one training step's forward and backward (torch's FlopCounterMode; the optimiser's
    elementwise update is not counted)."""
    from torch.utils.flop_counter import FlopCounterMode
    x = torch.rand(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    counter = FlopCounterMode(display=False)
    with counter, torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    with counter:
        loss.backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def time_toolkit(x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace, device: torch.device,
                 loss_read: str = "step") -> float:
    """Images per second of the toolkit's `fit` (resident data, on-device RandomCropFlip, bf16 autocast,
    channels_last, each step's loss read as `loss_read` says) over `args.steps` steps, after a warm-up fit
    of `args.warmup` steps."""
    from throughway.data.augment import RandomCropFlip
    from throughway.train import fit, get_recipe
    amp = device.type == "cuda"
    recipe = get_recipe("wrn-cifar", epochs=1, batch_size=args.batch)
    tiny = Split(x[:2], y[:2])  # evaluation is not what is timed
    net = _wrn(args.depth, args.widen, device)
    warm = DataSplits("bench", 10, Split(x[:args.batch * args.warmup], y[:args.batch * args.warmup]), None, tiny)
    fit(net, warm, recipe, progress=False, train_transform=RandomCropFlip(), amp=amp, channels_last=amp,
        loss_read=loss_read)
    data = DataSplits("bench", 10, Split(x[:args.batch * args.steps], y[:args.batch * args.steps]), None, tiny)
    history = fit(net, data, recipe, progress=False, train_transform=RandomCropFlip(), amp=amp, channels_last=amp,
                  loss_read=loss_read)
    return args.batch * args.steps / history.epochs[0]["epoch_time_s"]


def time_hand_loop(x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace, device: torch.device,
                   read_loss: bool = False) -> float:
    """Images per second of a hand-written loop: the same model, data, augmentation and rule
    (torch.optim.SGD, Nesterov 0.9, weight decay 5e-4 on the weights), bf16 autocast, channels_last,
    no host synchronisation until the clock stops; with `read_loss`, the loss read by the host after
    each forward pass, before the backward one (what fit's divergence check costs)."""
    from throughway.data.augment import RandomCropFlip
    amp = device.type == "cuda"
    net = _wrn(args.depth, args.widen, device).train()
    if amp:
        net = net.to(memory_format=torch.channels_last)
    decay = [p for p in net.parameters() if p.dim() > 1]
    rest = [p for p in net.parameters() if p.dim() <= 1]
    optimizer = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0.0}],
                                lr=0.1, momentum=0.9, nesterov=True)
    augment = RandomCropFlip()
    n = len(y)

    def step() -> None:
        index = torch.randint(0, n, (args.batch,), device=device)
        images = augment(x[index])
        if amp:
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(net(images), y[index])
        if read_loss and not math.isfinite(float(loss.detach())):
            raise FloatingPointError("the hand loop's loss is not finite")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    _sync(device)
    return args.batch * args.steps / (time.perf_counter() - start)


def wrn(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    n = args.batch * max(args.steps, args.warmup)
    x = torch.rand(n, 3, 32, 32, generator=g).to(device)
    y = torch.randint(0, 10, (n,), generator=g).to(device)
    flops = step_flops(_wrn(args.depth, args.widen, device), args.batch, device, amp=device.type == "cuda")
    toolkit = time_toolkit(x, y, args, device)
    lagged = time_toolkit(x, y, args, device, loss_read="lagged")  # each loss read after the next forward pass
    hand = time_hand_loop(x, y, args, device)
    hand_reading = time_hand_loop(x, y, args, device, read_loss=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    peak = peak_bf16(name) if device.type == "cuda" else None
    per_image = flops / args.batch
    result: dict[str, Any] = {
        "device": str(device), "device_name": name, "model": f"WRN-{args.depth}-{args.widen} gated, dropout 0.3",
        "batch": args.batch, "steps": args.steps, "amp_bf16": device.type == "cuda",
        "channels_last": device.type == "cuda", "flops_per_step": flops,
        "toolkit_images_per_s": toolkit, "hand_loop_images_per_s": hand, "ratio": toolkit / hand,
        "hand_loop_reading_loss_images_per_s": hand_reading, "ratio_to_hand_loop_reading_loss": toolkit / hand_reading,
        "toolkit_lagged_images_per_s": lagged, "ratio_lagged": lagged / hand,
        "peak_bf16_flops": peak, "goal_ratio": 1.0,
        "toolkit_share_of_peak": None if peak is None else toolkit * per_image / peak,
        "hand_loop_share_of_peak": None if peak is None else hand * per_image / peak,
    }
    share = "" if peak is None else f", {100 * result['toolkit_share_of_peak']:.1f}% of the bf16 peak"
    print(f"WRN step: toolkit {toolkit:.1f} images/s, hand loop {hand:.1f}: ratio {toolkit / hand:.3f}{share}; "
          f"toolkit with loss_read='lagged' {lagged:.1f} images/s: ratio {lagged / hand:.3f}", flush=True)
    return result


# ----------------------------------------------------------------------------------------------
# highway: the next unfinished shard of the conv highway table
# ----------------------------------------------------------------------------------------------

def run_name(width: int, seed: int) -> str:
    """A run's folder under results/highway-conv-table1."""
    return f"w{width}-s{seed}"


def run_status(run_dir: Path, epochs: int = HIGHWAY_EPOCHS) -> dict[str, Any]:
    """What a committed run folder holds: "finished" (results.json final, or diverged), "resumable"
    (a checkpoint.json after `epoch` epochs), "absent" (no run; a results.json without a checkpoint
    counts as absent, since nothing can resume it)."""
    results = run_dir / "results.json"
    if results.is_file():
        data = json.loads(results.read_text())
        if data.get("final") is not None:
            return {"status": "finished", "epoch": len(data.get("history", [])), "diverged": bool(data.get("diverged"))}
    checkpoint = run_dir / "checkpoint.json"
    if checkpoint.is_file():
        meta = json.loads(checkpoint.read_text())
        epoch = int(meta.get("epoch", len(meta.get("history", {}).get("epochs", []))))
        return {"status": "resumable", "epoch": epoch, "of": epochs}
    return {"status": "absent", "epoch": 0, "of": epochs}


def next_shard(results_dir: Path, size: int, table: Sequence[tuple[int, int]] = TABLE) -> list[tuple[int, int]]:
    """The first `size` runs of `table` not finished under `results_dir`, in table order (a run a
    window stopped is resumed before a new one starts, since it comes first)."""
    if size < 1:
        raise ValueError(f"--parallel {size}: must be at least 1")
    todo = [(w, s) for w, s in table if run_status(results_dir / run_name(w, s))["status"] != "finished"]
    return todo[:size]


class DeadlineReached(Exception):
    """Raised at an epoch's end (after its checkpoint) when the next epoch would not end before the deadline."""


class Deadline:
    """Callback: stop a run at the end of an epoch, its checkpoint written, when another epoch would
    not end before `deadline` (time.time() seconds) with a margin of a quarter of an epoch: the run
    stays resumable (results.json final stays null), and the next window resumes it."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.started = time.time()
        self.longest = 0.0

    def on_epoch_start(self, state: Any) -> None:
        self.started = time.time()

    def on_epoch_end(self, state: Any, record: dict[str, Any]) -> None:
        now = time.time()
        self.longest = max(self.longest, now - self.started)
        if now + 1.25 * self.longest > self.deadline and state.epoch < state.recipe.epochs:
            raise DeadlineReached(f"stopped after epoch {state.epoch}: another epoch ({self.longest:.1f} s) would "
                                  f"end after the deadline")


def highway_config(width: int, seed: int, args: argparse.Namespace) -> Any:
    """The run `throughway train --model highway_conv --depth 10 --width W --dataset mnist --recipe
    highway-conv-mnist --train-on-full --seed S --device D --eval-batch-size 1000` trains
    (results/highway-conv-authors/COMMAND.txt, step 3)."""
    from throughway.train import RunConfig
    return RunConfig(model="highway_conv", depth=10, dataset="mnist", recipe="highway-conv-mnist", seed=seed,
                     train_on_full=True, device=args.device, data_dir=args.data_dir, model_kwargs={"width": width},
                     epochs=args.epochs, limit=args.limit, eval_batch_size=1000)


def highway_run(args: argparse.Namespace) -> int:
    """One run of a shard (a child process of `highway`): resume or start it, stop at the deadline."""
    from throughway.train import run_training
    config = highway_config(args.width, args.seed, args)
    try:
        run_training(config, args.run_dir, resume=True, progress=True, callbacks=[Deadline(args.deadline)])
    except DeadlineReached as stop:
        print(f"[{Path(args.run_dir).name}] {stop}", file=sys.stderr, flush=True)
        return 3
    return 0


def _has_mnist(data_dir: str | None) -> bool:
    from throughway.data.cache import data_root
    folder = data_root(data_dir) / "mnist"
    return folder.is_dir() and any(folder.iterdir())


def _archived(name: str) -> bool:
    """Whether a run folder's file goes into a window's archive: not the lock (.lock, .lock.json) or an
    unfinished write (.tmp)."""
    return not (name.startswith(".lock") or name.endswith(".tmp"))


def _run_files(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """tarfile's filter form of `_archived`."""
    return info if _archived(Path(info.name).name) else None


def highway(args: argparse.Namespace) -> dict[str, Any]:
    started = time.time()
    results_dir = Path(args.results)
    shard = next_shard(results_dir, args.parallel)
    report: dict[str, Any] = {"results_dir": str(results_dir), "table": [run_name(w, s) for w, s in TABLE],
                              "before": {run_name(w, s): run_status(results_dir / run_name(w, s), args.epochs)
                                         for w, s in TABLE},
                              "shard": [run_name(w, s) for w, s in shard], "budget_s": args.budget_s,
                              "device": args.device, "epochs": args.epochs}
    if not shard:
        report["outcome"] = "the table is finished: nothing to run"
        return report
    if not _has_mnist(args.data_dir):
        report["outcome"] = (f"skipped: no MNIST under {args.data_dir or '$THROUGHWAY_DATA or ~/.cache/throughway'}/mnist "
                             f"(carry .throughway-data with mnist/mnist.pkl.gz, see docs/benchmarks.md)")
        return report
    work = Path(tempfile.mkdtemp(prefix="highway-shard-"))
    deadline = started + args.budget_s - args.margin_s
    children = []
    for width, seed in shard:
        name = run_name(width, seed)
        committed, run_dir = results_dir / name, work / name
        if run_status(committed, args.epochs)["status"] == "resumable":
            shutil.copytree(committed, run_dir)
        command = [sys.executable, str(Path(__file__).resolve()), "_run", "--width", str(width), "--seed", str(seed),
                   "--run-dir", str(run_dir), "--deadline", str(deadline), "--device", args.device,
                   "--epochs", str(args.epochs)]
        if args.data_dir:
            command += ["--data-dir", args.data_dir]
        if args.limit:
            command += ["--limit", str(args.limit)]
        # The GPU does the work; the runs' CPU threads share the machine's cores instead of each taking all.
        threads = str(max(1, (os.cpu_count() or 1) // len(shard)))
        children.append((name, subprocess.Popen(command, env={**os.environ, "OMP_NUM_THREADS": threads})))
    codes = {}
    for name, child in children:
        try:
            codes[name] = child.wait(timeout=max(1.0, deadline + args.margin_s / 2 - time.time()))
        except subprocess.TimeoutExpired:  # the hard guard: a run that missed its deadline is ended
            child.terminate()
            codes[name] = child.wait()
    report["exit_codes"] = codes
    report["after"] = {name: run_status(work / name, args.epochs) for name, _ in children}
    with tarfile.open(Path(args.out) / "highway_runs.tar.gz", "w:gz") as archive:
        for name, _ in children:
            if (work / name).is_dir():
                archive.add(work / name, arcname=name, filter=_run_files)
    shutil.rmtree(work, ignore_errors=True)
    report["outcome"] = "ran"
    report["seconds"] = time.time() - started
    names = " ".join(name for name, _ in children)
    report["commit"] = (f"cd {HIGHWAY_RESULTS} && rm -rf {names} && tar -xzf $OUT/highway_runs.tar.gz "
                        f"(each run folder replaces the committed one of its name, older checkpoints included)")
    return report


# ----------------------------------------------------------------------------------------------
# profile: what bounds a captured protocol epoch, measured
# ----------------------------------------------------------------------------------------------

def kernel_kind(name: str) -> str:
    """The kind of a kernel (or, on a CPU, an operator) by its name: matmul, optimizer (foreach),
    reduction, elementwise, memory (copies and sets) or other."""
    n = name.lower()
    if "memcpy" in n or "memset" in n or "copy_" in n:
        return "memory"
    if any(k in n for k in ("gemm", "cutlass", "xmma", "sm90_", "sm80_", "cublas", "matmul", "bmm", "addmm", "mm")):
        return "matmul"
    if "foreach" in n or "multi_tensor" in n:
        return "optimizer (foreach)"
    if any(k in n for k in ("reduce", "softmax", "norm", "sum", "mean", "max")):
        return "reduction"
    if any(k in n for k in ("elementwise", "vectorized", "unrolled", "pointwise", "triton")):
        return "elementwise"
    return "other"


def busy_seconds(intervals: Sequence[tuple[float, float]]) -> float:
    """Seconds covered by the union of (start, end) intervals given in microseconds: the time the
    device ran at least one kernel."""
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total / 1e6


def profile_events(events: Sequence[Any], device: torch.device) -> dict[str, Any]:
    """Kernel count, time and busy time by kind from a torch.profiler event list: the device's kernels on
    a GPU, the top-level operators on a CPU (the dry run)."""
    cuda = device.type == "cuda"
    kernels = [e for e in events if (e.device_type == torch.autograd.DeviceType.CUDA if cuda
                                     else e.device_type == torch.autograd.DeviceType.CPU and e.cpu_parent is None)]
    spans = [(e.time_range.start, e.time_range.end) for e in kernels]
    durations = sorted(e.time_range.elapsed_us() for e in kernels)
    by_kind: dict[str, dict[str, float]] = {}
    by_name: dict[str, float] = {}
    for e in kernels:
        kind = by_kind.setdefault(kernel_kind(e.name), {"count": 0, "time_s": 0.0})
        kind["count"] += 1
        kind["time_s"] += e.time_range.elapsed_us() / 1e6
        by_name[e.name] = by_name.get(e.name, 0.0) + e.time_range.elapsed_us() / 1e6
    top = sorted(by_name.items(), key=lambda item: -item[1])[:8]
    return {"kernels": len(kernels), "kernel_time_s": sum(durations) / 1e6, "busy_s": busy_seconds(spans),
            "median_kernel_us": statistics.median(durations) if durations else None,
            "mean_kernel_us": statistics.fmean(durations) if durations else None,
            "by_kind": by_kind, "top": [{"name": name[:120], "time_s": t} for name, t in top]}


def profile(args: argparse.Namespace) -> dict[str, Any]:
    """One captured training epoch of the protocol's stack at each of `args.depths`, timed without the
    profiler and then profiled (torch.profiler, CUDA activity): kernels per step, the device's busy
    share of the epoch (the union of kernel intervals over the profiled epoch's wall time) and the time
    by kernel kind. A busy share near 1 with long kernels says the arithmetic bounds the step; a low
    share or a median kernel of a few microseconds says launches and gaps do."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    device = torch.device(args.device)
    data = random_mnist(args.samples, 16, device)
    x, y = data.train.x.flatten(1), data.train.y
    steps = math.ceil(args.samples / args.batch_size)
    result: dict[str, Any] = {"device": str(device), "samples": args.samples, "batch_size": args.batch_size,
                              "steps": steps, "seeds": args.seeds, "width": args.width, "depths": {}}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for depth in args.depths:
        stack, step, generators = protocol_stack(depth, args.seeds, device, args.width, args.batch_size)
        _protocol_epoch(step, x, y, generators, args.batch_size)  # the capture
        _sync(device)
        start = time.perf_counter()
        _protocol_epoch(step, x, y, generators, args.batch_size)
        _sync(device)
        wall = time.perf_counter() - start
        with torch_profile(activities=activities) as prof:
            start = time.perf_counter()
            _protocol_epoch(step, x, y, generators, args.batch_size)
            _sync(device)
            profiled_wall = time.perf_counter() - start
        measured = profile_events(prof.events(), device)
        measured.update({"models": 3 * args.seeds, "epoch_s": wall, "profiled_epoch_s": profiled_wall,
                         "kernels_per_step": measured["kernels"] / steps,
                         "busy_share": measured["busy_s"] / profiled_wall if profiled_wall > 0 else None,
                         "captured": bool(getattr(step, "captures", 0))})
        result["depths"][str(depth)] = measured
        print(f"profile d = {depth}: {measured['kernels_per_step']:.0f} kernels a step, median "
              f"{measured['median_kernel_us'] or 0:.1f} us, busy {100 * (measured['busy_share'] or 0):.0f}% of "
              f"{profiled_wall:.3f} s (unprofiled epoch {wall:.3f} s)", flush=True)
        del stack, step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


# ----------------------------------------------------------------------------------------------
# conv: the conv highway step, as the table runs it and with channels_last and bf16 autocast
# ----------------------------------------------------------------------------------------------

CONV_VARIANTS = {  # name -> (amp, channels_last)
    "fp32 (as the table runs)": (False, False),
    "channels_last": (False, True),
    "bf16 autocast + channels_last": (True, True),
}


def conv(args: argparse.Namespace) -> dict[str, Any]:
    """Images per second of `fit` on the highway paper's conv net (`highway_conv` d = 10, recipe
    highway-conv-mnist) at each width, for each of CONV_VARIANTS, on random MNIST-shaped data resident
    on the device (a step's speed does not depend on the values); each after a warm-up fit. Then the
    step captured as one CUDA graph, for one run and for `args.runs` runs at once (`captured_conv_speed`;
    a failed capture is recorded with its error). The speed-ups are over the fp32 fit, measured in the
    same run."""
    from throughway.models import create_model
    from throughway.train import fit, get_recipe
    device = torch.device(args.device)
    n = args.batch * args.steps
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 1, 28, 28, generator=g).to(device)
    y = torch.randint(0, 10, (n,), generator=g).to(device)
    recipe = get_recipe("highway-conv-mnist", epochs=1, batch_size=args.batch)
    tiny = Split(x[:2], y[:2])
    result: dict[str, Any] = {"device": str(device), "batch": args.batch, "steps": args.steps, "widths": {}}
    for width in args.widths:
        rows: dict[str, Any] = {}
        for name, (amp, channels_last) in CONV_VARIANTS.items():
            if amp and device.type != "cuda":
                continue  # bf16 autocast is the GPU's; the dry run skips it
            torch.manual_seed(0)
            net = create_model("highway_conv", depth=10, width=width).to(device)
            warm = DataSplits("bench", 10, Split(x[:args.batch * 3], y[:args.batch * 3]), None, tiny)
            fit(net, warm, recipe, progress=False, amp=amp, channels_last=channels_last)
            data = DataSplits("bench", 10, Split(x, y), None, tiny)
            history = fit(net, data, recipe, progress=False, amp=amp, channels_last=channels_last)
            speed = n / history.epochs[0]["epoch_time_s"]
            rows[name] = {"images_per_s": speed, "epoch_s_at_60000": 60_000 / speed}
            print(f"conv highway w = {width}, {name}: {speed:.0f} images/s", flush=True)
        for runs in (1, args.runs):
            name = "captured step" if runs == 1 else f"{runs} runs at once, captured, one stream each"
            try:
                speed = captured_conv_speed(width, x, y, args.batch, args.steps, device, runs)
            except Exception as error:  # a step that cannot be captured is a finding, not the end of the part
                rows[name] = {"images_per_s": None, "error": repr(error)[:300]}
                print(f"conv highway w = {width}, {name}: failed: {error!r}", flush=True)
                continue
            rows[name] = {"images_per_s": speed, "runs": runs, "epoch_s_at_60000": 60_000 * runs / speed}
            print(f"conv highway w = {width}, {name}: {speed:.0f} images/s in all", flush=True)
        base = rows["fp32 (as the table runs)"]["images_per_s"]
        for row in rows.values():
            row["speedup"] = row["images_per_s"] / base if row["images_per_s"] else None
        result["widths"][str(width)] = rows
    return result


def captured_conv_speed(width: int, x: torch.Tensor, y: torch.Tensor, batch: int, steps: int,
                        device: torch.device, runs: int = 1) -> float:
    """Images per second, over all `runs`, of `runs` conv highway nets (`highway_conv` d = 10 at `width`,
    the highway-conv-mnist recipe's optimiser from `build_optimizer`, cross-entropy) each training
    `steps` steps of `batch` images of its own random order of the resident `x`, `y`, where each net's
    whole step (forward, backward, update) is one captured CUDA graph (the PyTorch documentation's
    whole-network capture: warm-up steps on a side stream, then capture) replayed after its batch is
    copied into the graph's input, and the runs replay at the same time, one thread and CUDA stream
    each. The 5-process window shard spends its time launching each process's many small kernels; this
    measures whether capture and one process's streams remove that. On a CPU the same steps run
    eagerly (the dry run checks the bookkeeping, not the speed)."""
    from throughway.models import create_model
    from throughway.train import build_optimizer, get_recipe

    cuda = device.type == "cuda"
    recipe = get_recipe("highway-conv-mnist", batch_size=batch)
    buffers, steppers, streams = [], [], []
    for run in range(runs):
        torch.manual_seed(run)
        net = create_model("highway_conv", depth=10, width=width).to(device).train()
        optimizer = build_optimizer(net, recipe)
        static_x, static_y = x[:batch].clone(), y[:batch].clone()

        def step(net: torch.nn.Module = net, optimizer: Any = optimizer, static_x: torch.Tensor = static_x,
                 static_y: torch.Tensor = static_y) -> None:
            loss = torch.nn.functional.cross_entropy(net(static_x), static_y)
            loss.backward()
            optimizer.step()

        stream = torch.cuda.Stream(device) if cuda else None
        if cuda:
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(3):  # warm-up: cuDNN's choices and the optimiser's state, before the capture
                    optimizer.zero_grad(set_to_none=True)
                    step()
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            optimizer.zero_grad(set_to_none=True)
            with torch.cuda.graph(graph):
                step()
            replay = graph.replay
        else:
            def replay(optimizer: Any = optimizer, step: Callable[[], None] = step) -> None:
                optimizer.zero_grad(set_to_none=True)
                step()
        buffers.append((static_x, static_y))
        steppers.append(replay)
        streams.append(stream)
    orders = [torch.randperm(len(x), generator=torch.Generator().manual_seed(run)).to(device) for run in range(runs)]

    def train(run: int) -> None:
        static_x, static_y = buffers[run]
        with (torch.cuda.stream(streams[run]) if cuda else contextlib.nullcontext()):
            for i in range(steps):
                index = orders[run][(i * batch) % (len(x) - batch + 1):][:batch]
                static_x.copy_(x[index])
                static_y.copy_(y[index])
                steppers[run]()

    seconds = _at_once(train, range(runs), device, "captured conv step, run")
    return runs * steps * batch / seconds


# ----------------------------------------------------------------------------------------------
# studies: the layer-dropping studies on the GPU, resumable across windows
# ----------------------------------------------------------------------------------------------

# The language-model study at the scale of nanoGPT's baby GPT (config/train_shakespeare_char.py: 6 layers of
# width 384, 6 heads, context 256, batch 64), trained 5,000 steps as nanoGPT does: what a GPU window runs
# with --study-options baby-gpt (its own out folder, layer-drop-baby-gpt, so it never mixes with the
# defaults' runs).
STUDY_OPTIONS = {
    "defaults": {},
    "baby-gpt": {"layer-drop": ["--depth", "6", "--width", "384", "--heads", "6", "--context", "256",
                                "--batch-size", "64", "--steps", "5000", "--eval-every", "250"]},
}


def study_command(name: str, out: Path, args: argparse.Namespace, resume: bool) -> list[str]:
    """The `throughway reproduce NAME` command a window runs: the study's defaults, or the options of
    `args.study_options` (STUDY_OPTIONS) for that study."""
    command = [sys.executable, "-m", "throughway", "reproduce", name, "--out", str(out), "--device", args.device,
               "--jobs", str(args.jobs[name]), "--threads", "1", "--quiet",
               *STUDY_OPTIONS[getattr(args, "study_options", "defaults")].get(name, [])]
    if args.data_dir:
        command += ["--data-dir", args.data_dir]
    if args.dry_run:
        command.append("--quick")
    if resume:
        command.append("--resume")
    return command


def _study_state(folder: Path) -> dict[str, Any]:
    runs = folder / "runs"
    names = sorted(p.name for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
    finished = [n for n in names if (runs / n / "results.json").is_file()
                and json.loads((runs / n / "results.json").read_text()).get("final") is not None]
    return {"runs": len(names), "finished": len(finished), "summary": (folder / "results.json").is_file()}


ARCHIVE_LIMIT = 15 * 2 ** 20  # a window brings back files of at most 16 MiB


def archive_studies(work: Path, archive_path: Path, report: dict[str, Any], limit: int = ARCHIVE_LIMIT) -> dict[str, Any]:
    """Pack the studies under `work` into `archive_path` within `limit` bytes (what a window brings
    back): every file but the weights first (results, analyses, metrics, summaries, logs, each run's
    checkpoint.json), then the weights a later window resumes from (an unfinished run's newest
    checkpoint), smallest first, while they fit; a finished run's model.safetensors is left on the
    device (its analysis is already in its folder). studies.json (`report`, with what was left out)
    goes in last. Returns what was packed and left out."""
    weights, rest = [], []
    for path in sorted(p for p in work.rglob("*") if p.is_file()):
        base = path.name
        if not _archived(base) or base == "studies.json":
            continue
        (weights if base.endswith(".safetensors") else rest).append(path)
    finished_runs = {p.parent for p in work.rglob("results.json")
                     if "runs" in p.parts and json.loads(p.read_text()).get("final") is not None}
    newest: dict[Path, Path] = {}
    for path in weights:
        if path.parent not in finished_runs and path.name.startswith("checkpoint-"):
            if path.parent not in newest or path.name > newest[path.parent].name:
                newest[path.parent] = path
    packed = sum(p.stat().st_size for p in rest)
    chosen, left_out = [], []
    for path in sorted(newest.values(), key=lambda q: q.stat().st_size):
        if packed + path.stat().st_size <= limit * 0.8:  # gzip cannot be counted on for weights
            chosen.append(path)
            packed += path.stat().st_size
        else:
            left_out.append(str(path.relative_to(work)))
    summary = {"files": len(rest) + len(chosen), "weights": [str(p.relative_to(work)) for p in chosen],
               "weights_left_out": left_out, "bytes_before_compression": packed}
    report["archive"] = summary
    _write_json(work / "studies.json", report)
    with tarfile.open(archive_path, "w:gz") as archive:
        for path in [*rest, *chosen, work / "studies.json"]:
            archive.add(path, arcname=str(path.relative_to(work)))
    if archive_path.stat().st_size > limit:
        raise RuntimeError(f"{archive_path}: {archive_path.stat().st_size} bytes, over the {limit} a window brings back")
    return summary


def studies(args: argparse.Namespace) -> dict[str, Any]:
    """Train the studies named in `args.studies` at once (one `throughway reproduce` each, its runs in
    --jobs worker processes sharing the GPU), each resumed from `args.resume_from`/<study> when a former
    window left it there; at `args.budget_s` (less the margin) every study still training is interrupted
    (SIGINT to all at once, SIGKILL to what has not stopped within a third of the margin: a study keeps every
    finished run and each run's last checkpoint). The study folders and studies.json go into
    OUT/studies.tar.gz within what a window brings back (`archive_studies`)."""
    import signal
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="studies-"))
    report: dict[str, Any] = {"studies": {}, "budget_s": args.budget_s, "device": args.device,
                              "study_options": getattr(args, "study_options", "defaults")}
    children = []
    suffix = "" if getattr(args, "study_options", "defaults") == "defaults" else f"-{args.study_options}"
    for name in args.studies:
        folder = work / f"{name}{suffix}"
        earlier = Path(args.resume_from) / folder.name if args.resume_from else None
        resume = earlier is not None and earlier.is_dir()
        if earlier is not None and resume:
            shutil.copytree(earlier, folder)
        command = study_command(name, folder, args, resume)
        log = open(work / f"{name}.log", "w")
        children.append((name, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True), log))
        report["studies"][name] = {"command": " ".join(command[1:]), "resumed": resume,
                                   "before": _study_state(folder)}
    deadline = started + args.budget_s - args.margin_s
    codes: dict[str, int | None] = {name: None for name, _, _ in children}
    while time.time() < deadline and any(child.poll() is None for _, child, _ in children):
        time.sleep(1.0)
    # At the deadline every study still training is interrupted at once (the finished runs and each
    # run's last checkpoint stay), then ended if it does not stop within a third of the margin.
    for _name, child, _ in children:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGINT)
    for name, child, log in children:
        try:
            codes[name] = child.wait(timeout=max(1.0, args.margin_s / 3 - (time.time() - deadline)))
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            codes[name] = child.wait()
        log.close()
        report["studies"][name].update({"exit_code": codes[name], "after": _study_state(work / f"{name}{suffix}"),
                                        "seconds": time.time() - started})
        print(f"study {name}: exit {codes[name]}, {report['studies'][name]['after']}", flush=True)
    report["archive"] = archive_studies(work, Path(args.out) / "studies.tar.gz", report)
    shutil.rmtree(work, ignore_errors=True)
    return report


# ----------------------------------------------------------------------------------------------
# summary.md
# ----------------------------------------------------------------------------------------------

def _read(out: Path, name: str) -> Any:
    path = out / name
    return json.loads(path.read_text()) if path.is_file() else None


def _revision_text(device: dict[str, Any]) -> str:
    """What ran, in words: the commit, or the HEAD whose tree was changed and the digest that names the files."""
    revision = device.get("git_revision")
    if device.get("git_dirty") is False:
        return f"git {revision} (clean)"
    if device.get("git_dirty"):
        return (f"git HEAD {revision}, but the sources differed from it (dirty; sources sha256 "
                f"{device.get('sources_sha256')}: `python scripts/device_check.py which-commit --out OUT` names "
                f"the commit they are)")
    return f"git {revision} (whether the tree was dirty was not recorded)"


def _summary_second_round(out: Path, parts: Sequence[str]) -> list[str]:
    """The profile's, the conv step's and the studies' headlines."""
    lines: list[str] = []
    prof = _read(out, "profile.json")
    if "profile" in parts and prof:
        lines += ["", "Profile of one captured protocol epoch (" f"{prof['steps']} steps of {prof['batch_size']}):", "",
                  "| d | models | kernels a step | median kernel (us) | busy share | epoch (s) |", "|---|---|---|---|---|---|"]
        for d, m in prof["depths"].items():
            lines.append(f"| {d} | {m['models']} | {m['kernels_per_step']:.0f} | {m['median_kernel_us'] or 0:.1f} | "
                         f"{100 * (m['busy_share'] or 0):.0f}% | {m['epoch_s']:.3f} |")
    elif "profile" in parts:
        lines += ["", "Profile: profile.json missing (see device_check.log)."]
    c = _read(out, "conv.json")
    if "conv" in parts and c:
        lines += ["", f"Conv highway step (batch {c['batch']}, {c['steps']} steps; images per second over all the "
                      f"runs a variant trains, against one run's fp32 fit):", ""]
        for width, rows in c["widths"].items():
            lines.append(f"- w = {width}: " + "; ".join(
                f"{name} {row['images_per_s']:.0f} images/s (×{row['speedup']:.2f})" if row["images_per_s"]
                else f"{name} failed ({row.get('error')})" for name, row in rows.items()))
    elif "conv" in parts:
        lines += ["", "Conv step: conv.json missing (see device_check.log)."]
    if "studies" in parts:
        archive = out / "studies.tar.gz"
        lines += ["", f"Studies: {'studies.tar.gz written' if archive.is_file() else 'studies.tar.gz missing'} "
                      "(studies.json inside it; see device_check.log for each study's state)."]
    return lines


def summary(out: Path, parts: Sequence[str] = DEFAULT_PARTS) -> str:
    """summary.md: the window's device and the headline of each of `parts`, or why it is missing."""
    lines = ["# Device check", ""]
    device = _read(out, "device.json")
    if device:
        lines.append(f"Device: {device.get('gpu', 'no GPU')} (driver {device.get('driver')}), torch {device['torch']}, "
                     f"CUDA {device['cuda']}, {_revision_text(device)}.")
    else:
        lines.append("Device: device.json missing.")
    lines.append("")
    protocol_result = _read(out, "protocol.json")
    if "protocol" not in parts:
        pass
    elif protocol_result and not protocol_result.get("projection"):
        measured = ", ".join(f"d = {d}: epoch {m['epoch_s']:.3f} s" for d, m in protocol_result["at_protocol_size"].items())
        lines.append(f"Table 1 protocol: stopped before every depth was measured, no projection ({measured or 'none'}).")
    elif protocol_result:
        p = protocol_result["projection"]
        how = {None: "captured, eager kernels", False: "captured, eager kernels", True: "compiled and captured",
               "whole": "compiled and captured", "blocks": "compiled per block and captured"}[protocol_result.get("compile")]
        lines += [f"Table 1 protocol ({protocol_result['models']} models x {p['epochs']} epochs; step {how}), projected: "
                  f"**{p['total_min']:.2f} min** (goal {protocol_result['goal_min']:g} min).", "",
                  "| d | first epoch (s) | epoch (s) | evaluation (s) | projected (min) |", "|---|---|---|---|---|"]
        for d, m in protocol_result["at_protocol_size"].items():
            lines.append(f"| {d} | {m['first_epoch_s']:.2f} | {m['epoch_s']:.3f} | {m['eval_s']:.3f} | "
                         f"{p['per_depth_s'][d] / 60:.2f} |")
        c = protocol_result.get("concurrent")
        if c:
            lines += ["", f"Every depth's stack at once (one thread and CUDA stream each): an epoch of all depths "
                          f"{c['round_s']:.3f} s against {c['sequential_round_s']:.3f} s one after another "
                          f"(x{c['speedup']:.2f}); the protocol so, projected: **{c['total_min']:.2f} min**."]
    else:
        lines.append("Table 1 protocol: protocol.json missing (the part failed or ran out of time; see device_check.log).")
    lines.append("")
    w = _read(out, "wrn.json")
    if "wrn" not in parts:
        pass
    elif w:
        share = ("" if w["toolkit_share_of_peak"] is None else
                 f"; share of the bf16 peak: toolkit {100 * w['toolkit_share_of_peak']:.1f}%, hand loop "
                 f"{100 * w['hand_loop_share_of_peak']:.1f}%")
        lines.append(f"{w['model']} step, batch {w['batch']}: toolkit {w['toolkit_images_per_s']:.0f} images/s, hand "
                     f"loop {w['hand_loop_images_per_s']:.0f}: **ratio {w['ratio']:.3f}** (goal ≥ 1.0){share}.")
        if w.get("hand_loop_reading_loss_images_per_s"):
            lines.append(f"The hand loop reading its loss each step before the backward pass (fit's divergence "
                         f"check): {w['hand_loop_reading_loss_images_per_s']:.0f} images/s; the toolkit's ratio to it "
                         f"{w['ratio_to_hand_loop_reading_loss']:.3f}.")
        if w.get("toolkit_lagged_images_per_s"):
            lines.append(f"The toolkit with `loss_read=\"lagged\"` (each step's loss read after the next step's forward "
                         f"pass is launched): {w['toolkit_lagged_images_per_s']:.0f} images/s: **ratio "
                         f"{w['ratio_lagged']:.3f}** to the hand loop.")
    else:
        lines.append("WRN step: wrn.json missing (see device_check.log).")
    lines.append("")
    h = _read(out, "highway_shard.json")
    if "highway" not in parts:
        pass
    elif h:
        lines.append(f"Conv highway table shard {', '.join(h['shard']) or '(none)'}: {h['outcome']}.")
        for name, status in (h.get("after") or {}).items():
            lines.append(f"- {name}: {status['status']} after epoch {status['epoch']}")
    else:
        lines.append("Conv highway shard: highway_shard.json missing (see device_check.log).")
    lines += _summary_second_round(out, parts)
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


# ----------------------------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------------------------

# The studies a window trains and their worker processes sharing the GPU (16 cores on the lent machines).
STUDY_JOBS = {"layer-drop": 7, "transformer-gates": 7}

DRY_RUN: dict[str, dict[str, Any]] = {  # tiny sizes on the CPU: every part in seconds
    "protocol": {"depths": [2, 4], "seeds": 1, "samples": 300, "test": 100, "epochs": 2, "width": 8,
                 "concurrent": True, "rounds": 1},
    "wrn": {"depth": 10, "widen": 1, "batch": 8, "steps": 2, "warmup": 1},
    "highway": {"epochs": 2, "limit": 64, "parallel": 2},
    "profile": {"depths": [2, 4], "seeds": 1, "samples": 256, "width": 8},
    "conv": {"widths": [4], "batch": 8, "steps": 2, "runs": 2},
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="The parts of one GPU window (issue 35); scripts/device_check.sh runs "
                                            "them, each under its own time limit.")
    sub = p.add_subparsers(dest="part", required=True)

    def part(name: str, help_text: str) -> argparse.ArgumentParser:
        s = sub.add_parser(name, help=help_text)
        s.add_argument("--out", required=name != "_run", help="the folder the part writes into ($OUT)")
        s.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
        s.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (the suite's check)")
        return s

    part("device", "write device.json")
    s = part("protocol", "time the Table 1 protocol per depth, projected")
    s.add_argument("--depths", type=int, nargs="+", default=list(PROTOCOL_DEPTHS))
    s.add_argument("--seeds", type=int, default=PROTOCOL_SEEDS)
    s.add_argument("--samples", type=int, default=PROTOCOL_TRAIN, help="training images per timed epoch")
    s.add_argument("--test", type=int, default=PROTOCOL_TEST, help="test images per timed evaluation")
    s.add_argument("--epochs", type=int, default=3, help="epochs timed per depth (the first includes the capture)")
    s.add_argument("--batch-size", type=int, default=128)
    s.add_argument("--width", type=int, default=50)
    s.add_argument("--compile", choices=("whole", "blocks"), default=None,
                   help="the step compiled by torch.compile inside the captured graph: the whole unrolled forward "
                        "and loss, or one block reused by every block (compilation about constant in depth)")
    s.add_argument("--concurrent", action="store_true",
                   help="then time every depth's captured stack training at once (one thread and CUDA stream each)")
    s.add_argument("--rounds", type=int, default=2, help="with --concurrent: the rounds timed (an epoch of every depth)")
    s = part("wrn", "time a WRN-28-10 gated step: toolkit against a hand-written loop")
    s.add_argument("--depth", type=int, default=28)
    s.add_argument("--widen", type=int, default=10)
    s.add_argument("--batch", type=int, default=128)
    s.add_argument("--steps", type=int, default=150,
                   help="timed steps (fit's fixed costs per call, its first-step checks and a fresh optimiser "
                        "state, spread over them; window a timed 50)")
    s.add_argument("--warmup", type=int, default=5)
    s = part("highway", "run the next unfinished shard of the conv highway table")
    s.add_argument("--results", default=str(REPOSITORY / HIGHWAY_RESULTS), help="where the committed runs are")
    s.add_argument("--parallel", type=int, default=5, help="runs of the shard, trained at once (one process each)")
    s.add_argument("--budget-s", type=float, required=True, help="seconds this part may take in all")
    s.add_argument("--margin-s", type=float, default=20.0, help="kept free before the budget's end")
    s.add_argument("--data-dir", default=None, help="the data root holding mnist/ (default: $THROUGHWAY_DATA, ~/.cache/throughway)")
    s.add_argument("--epochs", type=int, default=HIGHWAY_EPOCHS)
    s.add_argument("--limit", type=int, default=None, help=argparse.SUPPRESS)
    s = part("_run", "one run of a highway shard (started by the highway part)")
    for flag in ("--width", "--seed"):
        s.add_argument(flag, type=int, required=True)
    s.add_argument("--run-dir", required=True)
    s.add_argument("--deadline", type=float, required=True)
    s.add_argument("--data-dir", default=None)
    s.add_argument("--epochs", type=int, default=HIGHWAY_EPOCHS)
    s.add_argument("--limit", type=int, default=None)
    s = part("profile", "profile one captured protocol epoch per depth: kernels and busy time by kind")
    s.add_argument("--depths", type=int, nargs="+", default=[50, 100])
    s.add_argument("--seeds", type=int, default=PROTOCOL_SEEDS)
    s.add_argument("--samples", type=int, default=128 * 100, help="training images of the profiled epoch")
    s.add_argument("--batch-size", type=int, default=128)
    s.add_argument("--width", type=int, default=50)
    s = part("conv", "time the conv highway step: fp32, channels_last, bf16 autocast")
    s.add_argument("--widths", type=int, nargs="+", default=[16, 32])
    s.add_argument("--batch", type=int, default=100, help="the recipe's batch (highway-conv-mnist)")
    s.add_argument("--steps", type=int, default=300)
    s.add_argument("--runs", type=int, default=5, help="runs trained at once by the last variant (a width's 5 seeds)")
    s = part("studies", "train the layer-dropping studies at once, resumable across windows")
    s.add_argument("--studies", nargs="+", default=list(STUDY_JOBS), choices=list(STUDY_JOBS))
    s.add_argument("--budget-s", type=float, required=True, help="seconds this part may take in all")
    s.add_argument("--margin-s", type=float, default=30.0, help="kept for interrupting and archiving")
    s.add_argument("--resume-from", default=None, help="a folder holding a former window's study folders")
    s.add_argument("--study-options", default="defaults", choices=list(STUDY_OPTIONS),
                   help="the studies' options: their defaults, or baby-gpt (nanoGPT's baby GPT for layer-drop; "
                        "the study folder gets the name as a suffix)")
    s.add_argument("--data-dir", default=None)
    s = part("summary", "write summary.md from the parts' files")
    s.add_argument("--parts", default=",".join(DEFAULT_PARTS), help="the parts the window ran, comma-separated")
    part("which-commit", "print the commits whose sources OUT/device.json's sources_sha256 names, newest first "
                         "(run it where the history is, not on the device)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.dry_run:
        args.device = "cpu"
        for key, value in DRY_RUN.get(args.part, {}).items():
            setattr(args, key, value)
    if args.part == "_run":
        return highway_run(args)
    out = Path(args.out)
    if args.part != "which-commit":  # it only reads OUT
        out.mkdir(parents=True, exist_ok=True)
    if args.part == "device":
        _write_json(out / "device.json", device_info())
    elif args.part == "protocol":
        _write_json(out / "protocol.json", protocol(args, out))
    elif args.part == "wrn":
        _write_json(out / "wrn.json", wrn(args))
    elif args.part == "highway":
        if args.dry_run and args.data_dir is None:
            args.data_dir = str(_fake_mnist(Path(tempfile.mkdtemp(prefix="device-check-data-"))))
        if args.dry_run and args.results == str(REPOSITORY / HIGHWAY_RESULTS):  # never the committed runs
            args.results = tempfile.mkdtemp(prefix="device-check-results-")
        report = highway(args)
        _write_json(out / "highway_shard.json", report)
        print(f"highway shard {report['shard']}: {report['outcome']}", flush=True)
    elif args.part == "profile":
        _write_json(out / "profile.json", profile(args))
    elif args.part == "conv":
        _write_json(out / "conv.json", conv(args))
    elif args.part == "studies":
        args.jobs = dict(STUDY_JOBS) if not args.dry_run else {name: 1 for name in STUDY_JOBS}
        studies(args)
    elif args.part == "summary":
        print(summary(out, args.parts.split(",")), end="")
    elif args.part == "which-commit":
        digest = (_read(out, "device.json") or {}).get("sources_sha256")
        commits = commits_of(digest) if digest else []
        if not commits:
            print(f"which-commit: no commit of the last 2000 has the sources {out / 'device.json'} records "
                  f"({digest or 'no sources_sha256'})", file=sys.stderr)
            return 2
        print("\n".join(commits))  # the oldest is the one that introduced these sources
    return 0


def _fake_mnist(root: Path) -> Path:
    """A data root with a small fake MNIST cache (the dry run's highway shard)."""
    import numpy as np
    from throughway.data import ArraySplits
    from throughway.data.sources import save_cache
    rng = np.random.default_rng(0)

    def split(n: int) -> tuple[Any, Any]:
        return rng.integers(0, 256, (n, 1, 28, 28)).astype(np.uint8), rng.integers(0, 10, n).astype(np.uint8)

    (tx, ty), (vx, vy), (sx, sy) = split(64), split(32), split(32)
    save_cache(root / "mnist", ArraySplits("mnist", 10, tx, ty, vx, vy, sx, sy), "device_check dry run")
    return root


if __name__ == "__main__":
    sys.exit(main())
