"""Resume's "same run?" rule, in one table: how each config key bears on continuing a run.

- *Requeued* (no flag): a SLURM job run again in its run directory continues from its own
  ``checkpoint.pt`` only when that holds this very config, every key equal but those that say
  how to resume (``MAY_DIFFER``); otherwise the checkpoint is another run's, left alone.
- *Asked* (``checkpoint=PATH train.resume=true``): a user may change what does not break the
  run (the learning rate, the loader, ``epochs``), not the keys that fix the steps per epoch,
  each epoch's order and crops and the saved batch offset (``MUST_MATCH``), refused by name.

Both compare the config as composed (``auto`` stays ``auto``), ``loader.batch_size`` as typed.
The number of ranks is not a key and may differ (``loaderbench.run._elastic``).
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from loaderbench.config.schema import RunConfig
from loaderbench.data.discovery import Split
from loaderbench.data.splits import DatasetIndex
from loaderbench.measure.metrics import GLOBAL_BATCH
from loaderbench.run.checkpoint import CHECKPOINT_FILE, check_format

log = logging.getLogger(__name__)

MAY_DIFFER = "may differ"
MUST_MATCH = "must match"

# Dotted config key -> its rule. A key not named here must match for a requeued run to
# continue and may change in an asked-for resume.
RESUME_RULES: dict[str, str] = {
    # How the run was asked to resume.
    "checkpoint": MAY_DIFFER,
    "train.resume": MAY_DIFFER,
    # How long to wait for a stuck worker: nothing trained depends on it.
    "loader.timeout_s": MAY_DIFFER,
    # The schedule's steps per epoch, each epoch's order and crops, the saved batch offset.
    "seed": MUST_MATCH,
    "image_size": MUST_MATCH,
    "loader.batch_size": MUST_MATCH,  # as asked; the per-rank batch follows the ranks
    "bench.max_batches": MUST_MATCH,
}


def keys_with(rule: str) -> tuple[str, ...]:
    return tuple(key for key, each in RESUME_RULES.items() if each == rule)


def select(config: dict[str, Any], key: str) -> Any:
    """The value of dotted ``key`` in a nested dict; None where any part is missing."""
    value: Any = config
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _without_may_differ(config: dict[str, Any]) -> dict[str, Any]:
    trimmed = copy.deepcopy(config)
    for key in keys_with(MAY_DIFFER):
        head, _, leaf = key.rpartition(".")
        parent = select(trimmed, head) if head else trimmed
        if isinstance(parent, dict):
            parent.pop(leaf, None)
    return trimmed


def same_run(ours: dict[str, Any], saved: dict[str, Any]) -> bool:
    """A requeued run's rule: ``saved`` (a checkpoint's config) is this run's config, every
    key equal but those that ``MAY_DIFFER``."""
    return _without_may_differ(ours) == _without_may_differ(saved)


def changed_kept_keys(ours: dict[str, Any], saved: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """An asked-for resume's rule: the ``MUST_MATCH`` keys whose value differs, as
    ``(key, ours, saved)``; empty when the resume continues the same run."""
    changed = []
    for key in keys_with(MUST_MATCH):
        if select(ours, key) != select(saved, key):
            changed.append((key, select(ours, key), select(saved, key)))
    return changed


@dataclass(frozen=True)
class Resumable:
    """A checkpoint in the run directory that this run continues (no flag needed)."""

    path: Path
    requeues: int  # preemptions so far
    wandb_run_id: str | None


def find_resumable(
    config: RunConfig, composed: dict[str, Any], run_dir: Path, task: str
) -> Resumable | None:
    """The run directory's checkpoint if it holds an unfinished run of this very config
    (``same_run``): a SLURM job requeued after its time limit or a preemption
    runs again in the same run directory, and continues where it stopped without any flag
    from the user."""
    path = run_dir / CHECKPOINT_FILE
    if task != "train" or config.train.resume or not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:
        log.warning("%s cannot be read (%s): not resuming from it", path, error)
        return None
    if not same_run(composed, state.get("config", {})):
        log.warning("%s holds a run of another config: not resuming from it", path)
        return None
    # This run's own checkpoint, in a format this version does not read: refused rather than
    # left alone, for a fresh start would overwrite it with the first epoch's.
    check_format(state, path)
    epoch, batches = int(state["epoch"]), int(state["batches"])
    if epoch >= config.epochs and not batches:
        return None  # a finished run
    log.info("%s holds this run, stopped after %d epochs and %d batches", path, epoch, batches)
    return Resumable(path, int(state["requeues"]), state["wandb_run_id"])


def note_fresh_start(config: RunConfig, run_dir: Path, task: str, world_size: int) -> None:
    """A train.py run of a launch that may mean to continue one (several ranks, or a SLURM
    requeue) that finds no checkpoint in its run directory: say where it looked, for a plain
    re-launch gets a new run directory (torchrun's run id, the time of day in its name)."""
    requeued = int(os.environ.get("SLURM_RESTART_COUNT", "0")) > 0
    if task != "train" or config.train.resume or (world_size == 1 and not requeued):
        return
    if not (run_dir / CHECKPOINT_FILE).is_file():
        log.info(
            "no checkpoint in %s: starting afresh (to continue a run, name its directory, "
            "hydra.run.dir=..., or give checkpoint=PATH train.resume=true)",
            run_dir,
        )


@dataclass(frozen=True)
class ResumingRun:
    """What a resume is checked against: this run's data set, its config as composed, its
    ranks and its per-rank batch (settled: an elastic resume may have changed it)."""

    dataset: DatasetIndex
    composed: dict[str, Any]
    ranks: int
    batch_size: int


def train_set_signature(split: Split) -> dict[str, Any]:
    """What the epoch order depends on besides the seed: the train set's size and its labels
    in order (not its location, so a copy of the data set on node-local disk resumes)."""
    labels = np.asarray(split.labels, dtype=np.int64)
    return {"images": len(split), "labels_sha1": hashlib.sha1(labels.tobytes()).hexdigest()}


def check_resumable(state: dict[str, Any], path: Path, run: ResumingRun) -> None:
    """Refuse a resume that would not continue the same run, naming what changed (the config
    keys that must match: ``resume_rules``)."""
    if list(state["classes"]) != list(run.dataset.classes):
        raise ValueError(f"checkpoint {path} was trained on other classes")
    changed = changed_kept_keys(run.composed, state["config"])
    if changed:
        key, ours, theirs = changed[0]
        raise ValueError(
            f"{key}={ours} but checkpoint {path} was trained with {key}={theirs}; "
            "a resumed run must keep it"
        )
    # Another number of ranks may continue it (``elastic``): the global batch is what must
    # be kept, and the session took it over before any loader was built.
    ranks = run.ranks
    kept = run.batch_size * ranks
    if kept != int(state[GLOBAL_BATCH]):
        raise ValueError(
            f"global batch {kept} ({ranks} ranks x loader.batch_size="
            f"{run.batch_size}) but checkpoint {path} was trained with "
            f"{state[GLOBAL_BATCH]}; a resumed run must keep it"
        )
    signature = train_set_signature(run.dataset.train)
    saved = state["train_set"]
    if saved != signature:
        raise ValueError(
            f"dataset: the train set ({signature['images']} images) is not the one checkpoint "
            f"{path} was trained on ({saved['images']} images, or other labels in another "
            "order): the epoch order would change; resume on the same dataset.root, "
            "dataset.max_images and file list"
        )
