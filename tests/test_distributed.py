"""DistributedDataParallel training with the gloo backend, 2 processes on the CPU."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from throughway.data import DataSplits, Split
from throughway.models import create_model
from throughway.train import fit, get_recipe

N, BATCH = 96, 32  # 3 steps of a global batch of 32, 16 per rank


def _data() -> DataSplits:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 1, 4, 4, generator=g)
    y = torch.randint(0, 3, (N,), generator=g)
    return DataSplits("toy", 3, Split(x, y), None, Split(x[:16], y[:16]))


def _model() -> torch.nn.Module:
    # No BatchNorm: with it, per-shard statistics would (rightly) differ from one process's.
    torch.manual_seed(0)
    return create_model("mlp_plain", depth=2, width=8, in_features=16, num_classes=3, norm="none")


def _recipe():
    return get_recipe("highway-mnist", lr=0.1, momentum=0.9, epochs=1, batch_size=BATCH)


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if rank == 1:
            torch.manual_seed(123)  # a different init on rank 1: DDP must broadcast rank 0's weights
            model = create_model("mlp_plain", depth=2, width=8, in_features=16, num_classes=3, norm="none")
        else:
            model = _model()
        history = fit(model, _data(), _recipe(), progress=False, seed=7)
        tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
        tensors["train_loss"] = torch.tensor(history.epochs[0]["train_loss"], dtype=torch.float64)
        save_file(tensors, os.path.join(out_dir, f"rank{rank}.safetensors"))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_ddp_two_ranks_match_each_other_and_one_process(tmp_path):
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    rank0 = load_file(str(tmp_path / "rank0.safetensors"))
    rank1 = load_file(str(tmp_path / "rank1.safetensors"))
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key  # identical across ranks
    single_model = _model()
    history = fit(single_model, _data(), _recipe(), progress=False, seed=7)
    for key, value in single_model.state_dict().items():
        assert torch.allclose(rank0[key], value, atol=1e-6), key  # one process on the same global batches
    assert float(rank0["train_loss"]) == pytest.approx(history.epochs[0]["train_loss"], rel=1e-6)
    moved = [k for k, v in _model().state_dict().items() if not torch.allclose(v, rank0[k])]
    assert moved  # the test trains something
