"""Checkpoints: written atomically, loadable with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from loaderbench.platform.locking import atomic_write

# 2: every rank's random state, the GradScaler's, the run's shape. 3: each rank's position in
# the epoch's order (``ranks[i]["position"]``) beside the steps taken (``batches``). 4: the
# global batch, the places an elastically resumed epoch's order was shared from
# (``order_base``) and the ledger of images trained on (``ledger``); older ones still resume.
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
    if isinstance(numpy, dict):
        keys = numpy["keys"].cpu().numpy().astype(np.uint32)
        np.random.set_state(("MT19937", keys, numpy["pos"], numpy["has_gauss"], numpy["gauss"]))
    else:  # a format-1 checkpoint kept the key alone
        np.random.set_state(("MT19937", numpy.cpu().numpy().astype(np.uint32), 624, 0, 0.0))
    if "cuda" in state and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state["cuda"].cpu())


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path``: a reader sees the old file or the new one, never a part."""
    payload = {"format_version": FORMAT_VERSION, **state}
    atomic_write(path, lambda tmp: torch.save(payload, tmp))


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint={str(path)!r} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:
        raise ValueError(f"checkpoint {path} cannot be read: {error}") from error
    if not isinstance(state, dict) or "model" not in state or "config" not in state:
        raise ValueError(f"checkpoint {path} is not a loaderbench checkpoint")
    return state
