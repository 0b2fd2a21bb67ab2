"""Checkpoints: written atomically, loadable with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from loaderbench.platform.atomic import atomic_write

# The one format this version reads and writes (issue 44: formats 1-3 are refused, not
# converted). 4: every rank's random streams, running loss and position in the epoch's order
# (``ranks``), the GradScaler's state, the run's shape (``world_size``, ``global_batch``,
# ``train_set``), the places an elastically resumed epoch's order was shared from
# (``order_base``) and the ledger of images trained on (``ledger``). A change to what a
# checkpoint holds raises it, and ``check_format`` refuses every other.
FORMAT_VERSION = 4
CHECKPOINT_FILE = "checkpoint.pt"  # train.py's, in its run directory


def rng_state() -> dict[str, Any]:
    """This process's random streams where they stand: torch's CPU generator, its CUDA
    device's, Python's and numpy's (the whole state: key, position and cached Gaussian).
    Each rank of a data-parallel job has its own (seeded ``seed + rank``): the checkpoint keeps
    every rank's."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": list(random.getstate()[1]),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # this process's device
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Undo ``rng_state``: the random streams continue where the checkpoint left them (its
    tensors may have been loaded onto the run's device: generator states live on the CPU)."""
    torch.set_rng_state(state["torch"].cpu())
    random.setstate((3, tuple(int(x) for x in state["python"]), None))
    numpy = state["numpy"]
    keys = numpy["keys"].cpu().numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, numpy["pos"], numpy["has_gauss"], numpy["gauss"]))
    if "cuda" in state and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state["cuda"].cpu())


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path``: a reader sees the old file or the new one, never a part."""
    payload = {"format_version": FORMAT_VERSION, **state}
    atomic_write(path, lambda tmp: torch.save(payload, tmp))


class CheckpointFormatError(ValueError):
    """A loaderbench checkpoint in a format this version does not read."""


def check_format(state: dict[str, Any], path: str | Path) -> None:
    """Refuse a checkpoint of any format but ``FORMAT_VERSION``, naming the file, its format,
    the one read here and what to do. Every reader of a checkpoint's fields calls it first: the
    code past it reads format 4's keys as they are, with no fallback for older ones."""
    found = state.get("format_version")
    if found == FORMAT_VERSION:
        return
    if found is None:
        what = "records no format_version (it was not written by loaderbench's save_checkpoint)"
        todo = "train the run again with this version"
    elif isinstance(found, int) and found < FORMAT_VERSION:
        what = f"is in checkpoint format {found}, written by an earlier loaderbench"
        todo = (
            "train the run again with this version, or resume or evaluate the checkpoint "
            f"with a loaderbench checkout that writes format {found}"
        )
    else:
        what = f"is in checkpoint format {found!r}, written by a later loaderbench"
        todo = "update this checkout of loaderbench"
    raise CheckpointFormatError(
        f"checkpoint {path} {what}; this version reads checkpoint format {FORMAT_VERSION} "
        f"only: {todo}"
    )


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A loaderbench checkpoint of this version's format, read with ``weights_only=True``; a
    missing, unreadable or foreign file, or another format (``check_format``), is refused
    naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint={str(path)!r} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:
        raise ValueError(f"checkpoint {path} cannot be read: {error}") from error
    if not isinstance(state, dict) or "model" not in state or "config" not in state:
        raise ValueError(f"checkpoint {path} is not a loaderbench checkpoint")
    check_format(state, path)
    return state
