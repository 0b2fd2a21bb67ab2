"""Device and precision: resolved once, with a clear error where a choice cannot run."""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from loaderbench.config.schema import DeviceConfig

log = logging.getLogger(__name__)

DEVICE_TYPES = ("auto", "cpu", "cuda")


class UnsupportedSetting(RuntimeError):
    """A setting this machine cannot run; the message names the key and what would work."""


def resolve_device(device_config: DeviceConfig, local_rank: int | None = None) -> torch.device:
    """``device=auto|cpu|cuda`` (and ``device.index``) to a torch.device.

    Under torchrun each process takes the GPU of its LOCAL_RANK, whatever ``device.index`` says.
    """
    kind = device_config.type
    if kind not in DEVICE_TYPES:
        raise UnsupportedSetting(f"device.type={kind!r} is unknown; choose one of {DEVICE_TYPES}")
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UnsupportedSetting(
            "device=cuda, but no CUDA device is available here "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); use device=cpu or auto"
        )
    index = local_rank if local_rank is not None else device_config.index
    if not 0 <= index < torch.cuda.device_count():
        raise UnsupportedSetting(
            f"device.index={index} is out of range: {torch.cuda.device_count()} CUDA device(s)"
        )
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


@dataclass(frozen=True)
class Precision:
    name: str
    dtype: torch.dtype | None  # None: no autocast
    needs_grad_scaler: bool = False

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.dtype)

    def grad_scaler(self, device: torch.device) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(device.type, enabled=self.needs_grad_scaler)


def _check_bf16(device: torch.device) -> None:
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UnsupportedSetting(
            f"precision=bf16: {torch.cuda.get_device_name(device)} has no bfloat16 support; "
            "use precision=fp16 or fp32"
        )


def _check_fp16(device: torch.device) -> None:
    if device.type != "cuda":
        raise UnsupportedSetting(
            "precision=fp16 needs a CUDA device (mixed-precision float16 with a GradScaler); "
            "on the CPU use precision=bf16 or fp32"
        )


PRECISIONS: dict[str, tuple[Precision, Callable[[torch.device], None] | None]] = {
    "fp32": (Precision("fp32", None), None),
    "bf16": (Precision("bf16", torch.bfloat16), _check_bf16),
    "fp16": (Precision("fp16", torch.float16, needs_grad_scaler=True), _check_fp16),
}


def resolve_precision(name: str, device: torch.device) -> Precision:
    if name not in PRECISIONS:
        raise UnsupportedSetting(
            f"precision.name={name!r} is unknown; choose one of {sorted(PRECISIONS)}"
        )
    precision, check = PRECISIONS[name]
    if check is not None:
        check(device)
    return precision


def synchronizer(device: torch.device) -> Callable[[], None] | None:
    """What the meters call so that timings include the device's queued work."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _local_tasks(env: os._Environ | dict[str, str]) -> int:
    """Processes of this job on this node: torchrun's LOCAL_WORLD_SIZE, or SLURM's tasks per
    node (``2`` or ``2(x3)``)."""
    for key in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        value = env.get(key)
        if value:
            return max(1, int(value.split("(")[0].split(",")[0]))
    return 1


def _affinity_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (not the machine's count), or the
    machine's count where the system keeps no mask (not Linux)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def allotted_cpus(env: os._Environ | dict[str, str] = os.environ) -> tuple[int, str] | None:
    """The CPUs this process was given, and by whom; None when nobody said (a plain run, where
    torch's own default stands)."""
    if env.get("SLURM_CPUS_PER_TASK"):
        return int(env["SLURM_CPUS_PER_TASK"]), "SLURM_CPUS_PER_TASK"
    tasks = _local_tasks(env)
    if env.get("SLURM_JOB_ID") and env.get("SLURM_CPUS_ON_NODE"):
        cpus = int(env["SLURM_CPUS_ON_NODE"])
        return max(1, cpus // tasks), f"SLURM_CPUS_ON_NODE={cpus} / {tasks} tasks"
    if tasks > 1:
        cpus = _affinity_cpus()
        return max(1, cpus // tasks), f"{cpus} CPUs / {tasks} local ranks"
    return None


def cpus_allowed(env: os._Environ | dict[str, str] = os.environ) -> int:
    """The CPUs this process may use, at least one: its SLURM allotment or torchrun's share
    per local rank (``allotted_cpus``), else its affinity mask (``_affinity_cpus``). The one
    count of CPUs the project sizes work by: ``num_workers=auto``'s ladder, memmap's cache
    build, the bench's decode limits."""
    allotment = allotted_cpus(env)
    return max(1, allotment[0] if allotment else _affinity_cpus())


class IntraOpThreads(NamedTuple):
    """torch's intra-op threads in this process, and what set that number."""

    threads: int
    source: str


def set_intra_op_threads(
    configured: int | None, loader_threads: int, env: os._Environ | dict[str, str] = os.environ
) -> IntraOpThreads:
    """torch's intra-op threads (and OpenMP's, for child processes) for this process: the
    CPUs it was given less its loader's decode threads or workers, at least one;
    ``runtime.threads=N`` overrides. Several ranks or SLURM tasks on one node would otherwise
    each run as many intra-op threads as the node has cores, plus their loaders' threads.
    Returns the count and its source (metrics.json's ``intra_op_threads`` and its source)."""
    allotment = allotted_cpus(env)
    if configured is not None:
        threads, source = configured, "runtime.threads"
    elif allotment is not None:
        cpus, given_by = allotment
        threads = max(1, cpus - loader_threads)
        source = f"{given_by} - {loader_threads} loader threads"
    else:
        return IntraOpThreads(torch.get_num_threads(), "torch")
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    log.info("intra-op threads: %d (%s)", threads, source)
    return IntraOpThreads(threads, source)
