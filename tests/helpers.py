"""Helpers shared by test modules and by the scripts the tests run under torchrun
(tests/slow_rank.py): plain functions, importable without pytest or the conftest's set-up."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image


def photo(seed: int, size: tuple[int, int] = (120, 90)) -> Image.Image:
    """A seeded RGB image (width, height): colour gradients under noise, every channel
    varying, so that a decoder or a colour conversion that gets one wrong shows in the pixels."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0 : size[1], 0 : size[0]]
    base = np.stack([(xx * 4) % 256, (yy * 5) % 256, (xx + yy) % 256], axis=-1)
    noisy = base + rng.integers(-20, 20, base.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def slow_decode(seconds: float) -> None:
    """The torchvision loader's image decode sleeps ``seconds`` first, in this process and in
    the DataLoader workers it forks: each worker adds a batch per sleep, whatever the machine's
    cores, so rates follow the worker count."""
    from loaderbench.loaders.torchvision import loader as module

    decode = module.load_rgb

    def slow(path):  # load_rgb's signature
        time.sleep(seconds)
        return decode(path)

    module.load_rgb = slow


CONF = Path(__file__).resolve().parents[1] / "conf"


def compose_cfg(config: str, overrides: list[str]) -> Any:
    """The repo's ``config`` (train or eval) composed with ``overrides``, as Hydra would."""
    from hydra import compose, initialize_config_dir

    import loaderbench.run.compose  # noqa: F401  (registers the schemas the YAML files extend)

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config, overrides=overrides, return_hydra_config=False)
