"""``loader=memmap`` keys: ``num_workers`` are the threads that read batches ahead, and the
processes that build a missing cache."""

from __future__ import annotations

import math
from dataclasses import dataclass

from loaderbench.config.checks import require, require_one_of
from loaderbench.config.loader import LoaderSettings

STORES = ("raw", "jpeg")


@dataclass
class Settings(LoaderSettings):
    # Where caches live (a relative path is relative to the directory the command runs from).
    cache_dir: str = "cache"
    # Train images are stored whole, aspect kept, shrunk (never enlarged) so that their long side
    # is at most round(image_size * train_store_ratio); the random-resized crop is taken from them
    # at load time. 1.5: a 4:3 image keeps a short side of 1.125 x image_size.
    train_store_ratio: float = 1.5
    # ... and at least this many pixels: at small image sizes, crops from a store barely larger
    # than the input are blurrier than torchvision's crops from the full image, and storage is
    # cheap (the top-1 it costs: docs/measurements.md, "Figures moved from the comments").
    train_store_min_side: int = 192
    # How train images are stored: raw (decoded uint8 pixels; a batch is a gather, nothing to
    # decode) or jpeg (re-encoded JPEG bytes in one flat byte tensor, decoded per batch by the
    # reading threads: a fraction of raw's bytes, for data sets whose raw store would not fit).
    store: str = "raw"
    # The same for val, raw by default: the exact reference crop. A JPEG of the small final
    # crop carries its artifacts at full strength, while train crops are shrunk from a larger
    # stored image; and val is 4% of ImageNet.
    val_store: str = "raw"
    # The stored long side of train images (null: the train_store_ratio / min_side rule).
    store_max_side: int | None = None
    # JPEG quality of the jpeg store (1-100). 95, not the usual 90: 90 costs top-1 against raw
    # that 95 does not, for ~1.5x its bytes (docs/measurements.md, "The memmap JPEG store").
    store_quality: int = 95

    @classmethod
    def folder_keys(cls) -> tuple[str, ...]:
        return ("cache_dir",)

    def __post_init__(self) -> None:
        super().__post_init__()
        ratio, side, most = self.train_store_ratio, self.train_store_min_side, self.store_max_side
        require(
            math.isfinite(ratio) and ratio >= 1.0,
            "loader.train_store_ratio must be >= 1.0 (the stored long side / image_size)",
            ratio,
        )
        require(side >= 0, "loader.train_store_min_side must be >= 0", side)
        require_one_of(self.store, STORES, "loader.store")
        require_one_of(self.val_store, STORES, "loader.val_store")
        require(most is None or most >= 8, "loader.store_max_side must be >= 8 or null", most)
        quality = self.store_quality
        require(1 <= quality <= 100, "loader.store_quality must be 1-100", quality)
