"""Data-parallel runs: torchrun (or SLURM through submitit) starts the processes; this module
only reads where each one stands, joins the process group and reduces the numbers.

Every rank runs the same job; rank 0 alone writes metrics.json, the checkpoint and the W&B run.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _slurm_env_for_torch() -> None:
    """Under a SLURM job of several tasks (hydra/launcher=slurm), export torch's variables."""
    if "RANK" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return
    try:
        from submitit.helpers import TorchDistributedEnvironment
    except ImportError:  # pragma: no cover - submitit ships with the launcher plugin
        return
    environment = TorchDistributedEnvironment()  # takes a MASTER_PORT already set, if any
    # A port the user set (two jobs on one node must not share one) is kept: submitit reads
    # it above, then refuses to export over it.
    os.environ.pop("MASTER_PORT", None)
    environment.export(set_cuda_visible_devices=False)


def dist_info() -> DistInfo:
    _slurm_env_for_torch()
    return DistInfo(
        rank=int(os.environ.get("RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
    )


def run_id() -> str | None:
    """An id every rank of one launch shares (torchrun's run id, or SLURM's job id)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("TORCHELASTIC_RUN_ID"):
        return f"torchrun-{os.environ['TORCHELASTIC_RUN_ID']}"
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1 and os.environ.get("SLURM_JOB_ID"):
        return f"slurm-{os.environ['SLURM_JOB_ID']}"
    return None


def init(info: DistInfo, device: torch.device, timeout_s: float = 600) -> None:
    """Join the job's process group (NCCL on GPUs, gloo on CPUs).

    A rank that fails must end the job within seconds, not leave the others in a collective
    until ``timeout_s``: the failing rank aborts its communicators as it exits (``shutdown``),
    torchrun's agent then stops the other ranks (SIGTERM, then SIGKILL after its grace
    period), and NCCL's asynchronous error handling tears down a rank whose collective errs or
    times out instead of letting it hang.
    """
    if not info.enabled or dist.is_initialized():
        return
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend=backend,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )


def shutdown(failed: bool = False) -> None:
    """Leave the process group: gracefully after a run that went well; after a failure by
    aborting it, since a graceful exit would wait for peers still inside a collective."""
    if not dist.is_initialized():
        return
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if failed and abort is not None:
        abort()
    else:
        dist.destroy_process_group()


def _collective_device() -> torch.device:
    """Where the process group's collectives take their tensors (NCCL: this rank's GPU)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """Sum (or ``max``, ``min``) of each value across ranks; the identity in a single
    process."""
    if op not in REDUCE_OPS:
        raise ValueError(f"all_reduce: op={op!r} is none of {sorted(REDUCE_OPS)}")
    if not dist.is_initialized():
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=_collective_device())
    dist.all_reduce(tensor, op=REDUCE_OPS[op])
    return tensor.tolist()


def all_reduce_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of a CPU ``tensor`` over ranks (a new tensor; itself in a single process):
    for arrays too long for ``all_reduce``'s list of floats (a count per image)."""
    if not dist.is_initialized():
        return tensor
    summed = tensor.to(_collective_device(), copy=True)
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    return summed.cpu()


def broadcast_values(values: list[float]) -> list[float]:
    """Rank 0's ``values`` on every rank (as given in a single process)."""
    if not dist.is_initialized():
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=_collective_device())
    dist.broadcast(tensor, src=0)
    return tensor.tolist()


def barrier() -> None:
    """Wait for every rank (nothing in a single process)."""
    if dist.is_initialized():
        dist.barrier()


def broadcast_from_main(tensors: list[torch.Tensor]) -> None:
    """Every rank's ``tensors`` become rank 0's, in place (nothing in a single process)."""
    if not dist.is_initialized():
        return
    with torch.no_grad():
        for tensor in tensors:
            dist.broadcast(tensor, src=0)


def gather_objects(value: Any) -> list[Any]:
    """Every rank's ``value`` (picklable), in rank order; ``[value]`` in a single process."""
    if not dist.is_initialized():
        return [value]
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def world_size() -> int:
    """Ranks in the job's process group (1 without one)."""
    return dist.get_world_size() if dist.is_initialized() else 1
