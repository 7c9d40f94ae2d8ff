"""Data-parallel training with PyTorch's DistributedDataParallel, launched by torchrun.

    torchrun --nproc-per-node N -m throughway train --model wide_resnet --depth 28 ... --device cuda

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; `init_from_env` starts
the process group (NCCL on CUDA, gloo on the CPU) and picks the local GPU. `fit` then notices the
initialised group and trains data-parallel:

* every rank draws the same permutation (same seed), so each global batch of `recipe.batch_size`
  is the same on every rank; rank r trains on the r-th of `world_size` equal contiguous shards;
* the on-device augmentation is drawn for the whole global batch on every rank (same seed, same
  random numbers) before the shard is taken, so the augmented images are those one process sees;
* DDP averages the gradients, so a step equals one single-process step on the whole global batch
  for models without BatchNorm or dropout. With BatchNorm the batch statistics are per shard (as
  usual for DDP without SyncBatchNorm); with dropout every rank draws its masks from the same
  random stream (the one that keeps the augmentation in step), so rank r's i-th image shares its
  mask with rank 0's i-th image: such steps match one process in distribution only;
* the loss and error of each step are summed over ranks, so the recorded train loss is the global
  batch's mean, the number one process would record;
* every rank evaluates; rank 0 alone writes results and checkpoints (`is_main_process`), every
  rank reads the checkpoint when resuming;
* results.json records how the run was launched (`launch_info`): world size, backend, the rank
  layout torchrun reports (nodes, ranks per node) and, for a study's run, the shard i/N of the study
  that trained it ($THROUGHWAY_SHARD, set by the study: study.shards).
"""

from __future__ import annotations

import os
import socket
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["is_distributed", "rank_and_world", "is_main_process", "init_from_env", "shard", "all_reduce_sum",
           "wrap_model", "barrier", "cleanup", "launch_info", "SHARD_ENV"]

# The shard i/N of a study that this process trains runs for (set by study.shards, inherited by workers).
SHARD_ENV = "THROUGHWAY_SHARD"
# A job scheduler's identifiers of this process, recorded as found (SLURM, Grid Engine, PBS).
_SCHEDULER_VARS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NODELIST", "SLURM_NTASKS",
                   "JOB_ID", "SGE_TASK_ID", "PBS_JOBID", "PBS_ARRAY_INDEX")


def is_distributed() -> bool:
    """True when a torch.distributed process group is initialised (e.g. by `init_from_env`)."""
    return dist.is_available() and dist.is_initialized()


def rank_and_world() -> tuple[int, int]:
    """(rank, world size); (0, 1) without a process group."""
    if not is_distributed():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def is_main_process() -> bool:
    """True on rank 0 or without a process group: the process that writes files and prints."""
    return rank_and_world()[0] == 0


def init_from_env(device: str = "cpu") -> str:
    """Initialise the process group from torchrun's environment when WORLD_SIZE > 1; return the device
    this rank should use ("cuda" becomes "cuda:LOCAL_RANK"). Without torchrun it returns `device` unchanged."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or is_distributed():
        return device
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
        backend = "nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend=backend)
    return device


def shard(index: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank `rank`'s contiguous share of a global batch's sample indices (equal shares when divisible)."""
    return index.tensor_split(world)[rank] if world > 1 else index


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum `values` over all ranks in place (no-op without a process group) and return it."""
    if is_distributed():
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def wrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """`model` wrapped in DistributedDataParallel when a process group exists, else `model` itself.

    DDP broadcasts rank 0's parameters and buffers at construction, so all ranks start equal.
    """
    if not is_distributed():
        return model
    from torch.nn.parallel import DistributedDataParallel

    device = next(model.parameters()).device
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def barrier() -> None:
    """Wait for every rank (no-op without a process group)."""
    if is_distributed():
        dist.barrier()


def cleanup() -> None:
    """Destroy the process group if one exists."""
    if is_distributed():
        dist.destroy_process_group()


def _env_int(name: str) -> int | None:
    text = os.environ.get(name, "")
    return int(text) if text.isdigit() else None


def launch_info() -> dict[str, Any]:
    """How this process was launched, for results.json: {"world_size", "backend" (None without a
    process group), "rank_layout": {"nodes", "ranks_per_node", "rank", "local_rank", "host"} (torchrun's
    GROUP_WORLD_SIZE / LOCAL_WORLD_SIZE, here read on the rank that writes, rank 0), "shard" (the
    study's "i/N" that trained the run, None outside a study), "scheduler" (the job ids found)}."""
    rank, world = rank_and_world()
    local_world = _env_int("LOCAL_WORLD_SIZE") if world > 1 else 1
    nodes = _env_int("GROUP_WORLD_SIZE") if world > 1 else 1
    if nodes is None and local_world:
        nodes = max(1, world // local_world)
    return {
        "world_size": world,
        "backend": dist.get_backend() if is_distributed() else None,
        "rank_layout": {"nodes": nodes, "ranks_per_node": local_world, "rank": rank,
                        "local_rank": _env_int("LOCAL_RANK") if world > 1 else 0, "host": socket.gethostname()},
        "shard": os.environ.get(SHARD_ENV) or None,
        "scheduler": {name: os.environ[name] for name in _SCHEDULER_VARS if os.environ.get(name)},
    }
