"""Checkpoints: written atomically, loadable with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from loaderbench.locking import atomic_write

FORMAT_VERSION = 1
CHECKPOINT_FILE = "checkpoint.pt"  # train.py's, in its run directory


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": list(random.getstate()[1]),
        "numpy": torch.from_numpy(np.random.get_state()[1].astype(np.int64)),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Undo ``rng_state``: the random streams continue where the checkpoint left them."""
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(int(x) for x in state["python"]), None))
    numpy_state = np.random.get_state()
    np.random.set_state(
        (numpy_state[0], state["numpy"].numpy().astype(np.uint32), *numpy_state[2:])
    )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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
