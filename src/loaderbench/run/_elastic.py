"""Resuming on another number of ranks: a checkpoint taken on N ranks continues on M.

Kept: the global batch G (each rank now takes G / M, which M must divide), so the schedule's
steps and each step's images are the run's; each epoch's global order and every crop; the place
in the interrupted epoch, whose rest the M ranks share out (``ResumedEpoch``), each image once.
Changed: the per-rank batch, and with it BatchNorm's batch statistics and the per-rank random
streams; the step's gradient is the same mean over the same images, up to the order of the sums.
``fit_to_checkpoint`` settles this before any loader is built (docs/imagenet_and_slurm.md,
"Resuming on another number of ranks").
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from loaderbench.config.schema import RunConfig
from loaderbench.data.order import training_places
from loaderbench.data.resumed import ResumedEpoch
from loaderbench.loaders import LoaderSettings
from loaderbench.measure.metrics import GLOBAL_BATCH
from loaderbench.run._resume_rules import Resumable
from loaderbench.run._validation import ConfigError
from loaderbench.run.checkpoint import check_format

log = logging.getLogger(__name__)


def resume_path(config: RunConfig, resumable: Resumable | None) -> Path | None:
    """The checkpoint to continue from: checkpoint=PATH with train.resume=true, or, with no flag
    at all, the run directory's own when it holds a run of the same config (a SLURM job
    requeued after its time limit or a preemption runs again in the same run directory)."""
    if config.train.resume:
        if config.checkpoint is None:
            raise ValueError("train.resume=true needs checkpoint=PATH (a train.py checkpoint.pt)")
        return Path(config.checkpoint)
    return resumable.path if resumable else None


@dataclass(frozen=True)
class Continued:
    """How a training run's loaders continue a checkpoint: the loader's settings with the
    per-rank batch (the checkpoint's global batch over this run's ranks), and the epoch they
    continue where the checkpoint stopped in the middle of one."""

    settings: LoaderSettings
    resumed: ResumedEpoch | None = None


def fit_to_checkpoint(config: RunConfig, resumable: Resumable | None, ranks: int) -> Continued:
    """Before anything is built: a resumed training run takes the checkpoint's global batch
    over its ``ranks`` (``batch_size`` = G / ranks, logged where it changes; a count that does
    not divide G is refused, naming both). ``config.loader`` as it is for a fresh run. A
    checkpoint that cannot be read is left to the resume itself to report; one of another
    format is refused here, before any loader is built (``check_format``)."""
    asked = Continued(config.loader)
    path = resume_path(config, resumable)
    if path is None or not path.is_file():
        return asked
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return asked
    if not isinstance(state, dict) or "config" not in state:
        return asked
    check_format(state, path)
    saved, images = int(state["world_size"]), int(state[GLOBAL_BATCH])
    batch = per_rank_batch(images, saved, ranks)
    if saved != ranks or batch != config.loader.batch_size:
        log.info(
            "resuming on %d ranks a checkpoint taken on %d: global batch %d kept, "
            "loader.batch_size=%d per rank (%d on the checkpoint's ranks, %d asked)",
            ranks,
            saved,
            images,
            batch,
            images // saved,
            config.loader.batch_size,
        )
    settings = dataclasses.replace(config.loader, batch_size=batch)
    return Continued(settings, resumed_epoch(state, ranks))


def per_rank_batch(global_batch: int, saved_ranks: int, ranks: int) -> int:
    """The per-rank batch of a job resumed on ``ranks`` ranks from a checkpoint taken on
    ``saved_ranks`` with ``global_batch`` images a step: the global batch is kept (the
    schedule's steps and each step's images are the run's), so ``ranks`` must divide it."""
    if global_batch % ranks:
        raise ConfigError(
            f"checkpoint taken on {saved_ranks} ranks with a global batch of {global_batch} "
            f"({saved_ranks} x loader.batch_size={global_batch // saved_ranks}) cannot resume "
            f"on {ranks} ranks: {ranks} does not divide {global_batch}; resume on a number of "
            f"ranks that divides {global_batch} (torchrun --nproc-per-node/--nnodes, SLURM tasks)"
        )
    return global_batch // ranks


def unpack_places(packed: torch.Tensor | None, images: int) -> torch.Tensor | None:
    if packed is None:
        return None
    return torch.from_numpy(np.unpackbits(packed.cpu().numpy(), count=images).astype(bool))


def pack_places(done: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.packbits(done.numpy()))


def resumed_epoch(state: dict[str, Any], ranks: int) -> ResumedEpoch | None:
    """The interrupted epoch as ``ranks`` ranks continue it; None where the checkpoint is at
    an epoch's end, or where the same number of ranks continue an epoch that was not itself
    resumed on another number (each rank then continues from its own ``position``)."""
    if not int(state["batches"]):
        return None
    epoch, saved = int(state["epoch"]), int(state["world_size"])
    images = int(state["train_set"]["images"])
    if saved == ranks:
        base = unpack_places(state["order_base"], images)
        return None if base is None else ResumedEpoch(epoch, base)
    return ResumedEpoch(epoch, places_gone_through(state, images))


def places_gone_through(state: dict[str, Any], images: int) -> torch.Tensor:
    """The places of the interrupted epoch's global order (bool, one per place) that the
    checkpoint's ranks had gone through, each up to its saved ``position``."""
    # The places the interrupted epoch's order was shared from (a resume on another number
    # of ranks before): each rank's position counts batches of that order.
    base = unpack_places(state["order_base"], images)
    saved = int(state["world_size"])
    done = torch.zeros(images, dtype=torch.bool) if base is None else base.clone()
    per_rank = int(state[GLOBAL_BATCH]) // saved
    for rank, mine in enumerate(state["ranks"]):
        places = training_places(images, per_rank * saved, rank, saved, base)
        done[places[: int(mine["position"]) * per_rank]] = True
    return done


def continued_rank_state(saved: list[dict[str, Any]], rank: int, ranks: int) -> dict[str, Any]:
    """What rank ``rank`` of ``ranks`` takes over from the ``saved`` ranks' states of another
    count: the random streams of the saved rank of its number (a rank beyond them keeps its
    own, seeded ``seed + rank``), the interrupted epoch's running loss over every saved rank
    (a share of it each, so the mean over ranks is the epoch's), and position 0 of its new
    share of the order (``ResumedEpoch``)."""
    total = sum(float(state["epoch_loss"][0]) for state in saved)
    count = sum(state["epoch_loss"][1] for state in saved)
    state: dict[str, Any] = {"epoch_loss": (total / ranks, count / ranks), "position": 0}
    if rank < len(saved):
        state["rng"] = saved[rank]["rng"]
    return state
