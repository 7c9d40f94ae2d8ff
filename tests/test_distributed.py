"""DistributedDataParallel under torchrun: the gloo backend, 2 processes on the CPU.

One `torchrun --standalone --nproc-per-node 2` launch runs this file as its worker script. In each
rank the worker (1) trains a small conv net (no BatchNorm, no dropout, so one process can match it
exactly) through `fit` with on-device augmentation, after `init_from_env` set up the process group
from torchrun's environment, and saves its weights; then (2) runs `throughway train` through the
command line's own `main` in the same process group, recording that the model was wrapped in DDP
and how many images each rank's forward saw. The test compares the ranks with each other and with
one process on the same global batches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from throughway.cli import main
from throughway.data import DataSplits, Split
from throughway.data.augment import RandomCropFlip
from throughway.models import create_model
from throughway.train import distributed, fit, get_recipe

N, BATCH = 96, 32  # 3 steps of a global batch of 32, 16 per rank
CLI_ARGS = ["train", "--model", "highway_conv", "--model-arg", "arch=mnist-10-ours", "--depth", "10", "--width", "2",
            "--dataset", "mnist",
            "--recipe", "preact-cifar", "--limit", "64", "--batch-size", "32", "--epochs", "1", "--quiet"]


def _data() -> DataSplits:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 1, 8, 8, generator=g)
    y = torch.randint(0, 3, (N,), generator=g)
    return DataSplits("toy", 3, Split(x, y), None, Split(x[:16], y[:16]))


def _model(seed: int = 0) -> torch.nn.Module:
    # A conv highway net has no BatchNorm: with it, per-shard statistics would (rightly) differ from one process's.
    # Our layout has no dropout either, whose masks differ between ranks and one process (the authors' has).
    torch.manual_seed(seed)
    return create_model("highway_conv", arch="mnist-10-ours", width=2, in_channels=1, image_size=8, num_classes=3)


def _recipe():
    return get_recipe("highway-conv-mnist-ours", lr=0.1, epochs=1, batch_size=BATCH)


def _fit(model: torch.nn.Module) -> tuple[float, list[int]]:
    """Train one epoch with augmentation; return the recorded loss and the rows of each training forward."""
    rows: list[int] = []
    model.register_forward_pre_hook(lambda m, args: rows.append(len(args[0])) if m.training else None)
    torch.manual_seed(5)  # the augmentation's random stream, the same in every rank and in one process
    history = fit(model, _data(), _recipe(), progress=False, seed=7, train_transform=RandomCropFlip(padding=2))
    return history.epochs[0]["train_loss"], rows


def _worker(out: Path, cli_out: Path) -> None:
    """Run inside each torchrun rank (see the module docstring)."""
    torch.set_num_threads(1)
    device = distributed.init_from_env("cpu")  # what `throughway train` calls first
    rank, world = distributed.rank_and_world()
    assert (device, world) == ("cpu", 2) and dist.get_backend() == "gloo"
    model = _model(seed=0 if rank == 0 else 123)  # rank 1 starts elsewhere: DDP must broadcast rank 0's weights
    loss, rows = _fit(model)
    tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
    tensors["train_loss"] = torch.tensor(loss, dtype=torch.float64)
    tensors["rows"] = torch.tensor(rows)
    save_file(tensors, str(out / f"rank{rank}.safetensors"))

    seen: dict[str, object] = {"rows": []}
    wrap = distributed.wrap_model

    def spy(net: torch.nn.Module) -> torch.nn.Module:
        net.register_forward_pre_hook(lambda m, args: seen["rows"].append(len(args[0])) if m.training else None)
        wrapped = wrap(net)
        seen["wrapper"] = type(wrapped).__name__
        return wrapped

    distributed.wrap_model = spy
    code = main([*CLI_ARGS, "--out", str(cli_out)])  # ends by destroying the process group
    seen["code"] = code
    (out / f"cli-rank{rank}.json").write_text(json.dumps(seen))


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")
@pytest.mark.slow
def test_torchrun_two_ranks_match_each_other_and_one_process(tmp_path, fake_mnist_root):
    cli_out = tmp_path / "cli-ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    launch = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__,
         str(tmp_path), str(cli_out)],
        env=env, capture_output=True, text=True, timeout=240)
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]

    # (1) fit under DDP: identical ranks, each on its half of every global batch, equal to one process.
    rank0 = load_file(str(tmp_path / "rank0.safetensors"))
    rank1 = load_file(str(tmp_path / "rank1.safetensors"))
    assert rank0["rows"].tolist() == rank1["rows"].tolist() == [BATCH // 2] * (N // BATCH)
    weights = [k for k in rank0 if k not in ("rows", "train_loss")]
    for key in weights:
        assert torch.equal(rank0[key], rank1[key]), key
    single = _model()
    loss, rows = _fit(single)
    assert rows == [BATCH] * (N // BATCH)
    for key, value in single.state_dict().items():
        assert torch.allclose(rank0[key], value, atol=1e-6), key
    assert float(rank0["train_loss"]) == pytest.approx(loss, rel=1e-6)
    assert any(not torch.allclose(v, rank0[k]) for k, v in _model().state_dict().items())  # it trained

    # (2) `throughway train` under torchrun: both ranks trained through DDP on 16 of each 32 images
    # (augmented, normalised) and rank 0's results equal one process's.
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"cli-rank{rank}.json").read_text())
        assert seen == {"rows": [16, 16], "wrapper": "DistributedDataParallel", "code": 0}, (rank, seen)
    assert main([*CLI_ARGS, "--out", str(tmp_path / "cli-one")]) == 0
    ddp_results = json.loads((cli_out / "results.json").read_text())
    one_results = json.loads((tmp_path / "cli-one" / "results.json").read_text())
    assert ddp_results["recipe"]["augment"] == "crop-flip"
    # results.json tells a 2-rank run from a one-process run: world size, backend, rank layout (issue 34).
    launch = ddp_results["launch"]
    assert (launch["world_size"], launch["backend"], launch["shard"]) == (2, "gloo", None)
    assert {k: launch["rank_layout"][k] for k in ("nodes", "ranks_per_node", "rank", "local_rank")} == \
        {"nodes": 1, "ranks_per_node": 2, "rank": 0, "local_rank": 0}
    assert one_results["launch"]["world_size"] == 1 and one_results["launch"]["backend"] is None
    assert ddp_results["final"]["train_loss"] == pytest.approx(one_results["final"]["train_loss"], rel=1e-6)
    assert ddp_results["final"]["test_error_pct"] == one_results["final"]["test_error_pct"]
    ddp_model = load_file(str(cli_out / "model.safetensors"))
    one_model = load_file(str(tmp_path / "cli-one" / "model.safetensors"))
    assert ddp_model.keys() == one_model.keys()
    for key in ddp_model:
        assert torch.allclose(ddp_model[key], one_model[key], atol=1e-6), key


if __name__ == "__main__":  # the worker script of the torchrun launch above
    _worker(Path(sys.argv[1]), Path(sys.argv[2]))
