"""The crop-and-resize limit: the yardstick of memmap's raw train path, which decodes nothing.

Its work per image is cutting the box from the stored row, resizing it and flipping it, on rows
decoded as the store keeps them, with the boxes and flips every loader draws; measured as the
decode limits are (``tools.bench.limits``: one thread x cores, and a plain pool). Its
candidates include the loader's own way (a batch's boxes in one call that holds no GIL), and
its plain pool is the faster of the best way's and that way's: a pool of one Python call an
image measures the GIL more than the cores.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from loaderbench.imaging.transforms import RRC_SCALE
from tools.bench.limits import (
    BATCH,
    DecodeFn,
    batched,
    measure_rates,
    time_single_thread,
    usable_cores,
)
from tools.bench.schema import DecodeLimit, DecodeRate


@dataclass(frozen=True)
class StoredCrops:
    """Train images as memmap's raw store keeps them, with the boxes and flips every loader
    draws for them (``seeded_crops`` of seed, epoch and the image's position)."""

    rows: torch.Tensor  # uint8 (N, L, L, 3): each image fitted at the top left, as stored
    boxes: list[list[int]]  # (top, left, h, w) inside each stored image
    flips: list[bool]


def stored_crops(
    paths: Sequence[str],
    image_size: int,
    seed: int = 0,
    epoch: int = 0,
    scale: tuple[float, float] = RRC_SCALE,
) -> StoredCrops:
    """``paths`` decoded and fitted as the store's build does (at its default stored side for
    ``image_size``), into rows in memory, with their train boxes and flips."""
    from concurrent.futures import ThreadPoolExecutor

    from loaderbench.imaging.transforms import seeded_crops
    from loaderbench.loaders.memmap import Settings
    from loaderbench.loaders.memmap.build import StorePolicy, decode_stored
    from loaderbench.loaders.memmap.store_raw import write_fit

    defaults = Settings()
    policy = StorePolicy.for_split(
        True, image_size, defaults.train_store_ratio, defaults.train_store_min_side
    )
    rows = torch.zeros((len(paths), *policy.image_shape()), dtype=torch.uint8)
    heights, widths = [], []
    with ThreadPoolExecutor(usable_cores()) as pool:
        fitted = pool.map(lambda path: decode_stored(path, policy), paths)
        for row, pixels in zip(rows, fitted, strict=True):
            write_fit(row, pixels)
            heights.append(pixels.shape[0])
            widths.append(pixels.shape[1])
    boxes, flips = seeded_crops(heights, widths, seed, epoch, range(len(paths)), scale)
    return StoredCrops(rows, boxes.tolist(), flips.tolist())


def crop_candidates(
    crops: StoredCrops, paths: Sequence[str], image_size: int, flips: bool = True
) -> dict[str, DecodeFn]:
    """The train job for image ``i`` of ``paths`` (its stored row i): cut its box, resize it to
    ``image_size`` and (``flips``) flip it where drawn, per way of doing it with the same
    antialiased filter:

    * ``batch-loop``: a batch's boxes resized into a reused batch (each thread its own) by
      one call that holds no GIL (``transforms.crop_resize_flip_rows``): what memmap's
      reading threads call per batch;
    * ``torch-into-batch``: the uint8 kernel writing into a slot of a reused batch, from a
      view of the box, one Python call an image;
    * ``torch-new-tensor``: the per-image reference, ``resize_uint8`` into a new tensor.

    PIL (the same filter) would first copy the row into an image of its own; OpenCV's INTER_AREA
    measured no faster here, and is not installed with the project.
    """
    from loaderbench.imaging.transforms import (
        crop_resize_flip_rows,
        resize_into,
        resize_uint8,
        stored_box,
    )

    index = {path: i for i, path in enumerate(paths)}
    size = (image_size, image_size)
    local = threading.local()
    boxes, flip_flags = torch.tensor(crops.boxes), torch.tensor(crops.flips) & flips

    def batch() -> torch.Tensor:
        if not hasattr(local, "batch"):  # a batch for this thread, as a loader's
            rows = torch.empty((BATCH, *size, crops.rows.shape[3]), dtype=torch.uint8)
            local.batch = rows.permute(0, 3, 1, 2)
        return local.batch

    def slots() -> tuple[torch.Tensor, ...]:
        if not hasattr(local, "slots"):
            local.slots = batch().split(1)
        return local.slots

    @batched
    def batch_loop(chunk: Sequence[str]) -> torch.Tensor:
        rows = torch.tensor([index[path] for path in chunk])
        out = batch()[: len(chunk)]
        return crop_resize_flip_rows(
            crops.rows, rows, boxes[rows], image_size, flip_flags[rows], out
        )

    def into_batch(path: str) -> torch.Tensor:
        i = index[path]
        slot = slots()[i % BATCH]
        resize_into(stored_box(crops.rows, i, crops.boxes[i]), slot, flips and crops.flips[i])
        return slot

    def new_tensor(path: str) -> torch.Tensor:
        i = index[path]
        top, left, h, w = crops.boxes[i]
        out = resize_uint8(crops.rows[i, top : top + h, left : left + w].permute(2, 0, 1), size)
        return out.flip(-1) if flips and crops.flips[i] else out

    return {
        "batch-loop": batch_loop,
        "torch-into-batch": into_batch,
        "torch-new-tensor": new_tensor,
    }


def measure_crop_limit(
    paths: Sequence[str],
    image_size: int,
    repeats: int = 2,
    pool: bool = True,
    scale: tuple[float, float] = RRC_SCALE,
) -> DecodeLimit:
    """The crop-and-resize limit: the train job on stored rows (``crop_candidates``: box,
    resize, flip) of the fastest way on one thread x cores, and in a plain pool of one thread
    per core; the yardstick of memmap's raw train path. ``without_flips``: the best way's rate
    without the flips (the resize alone), to show what they cost."""
    if not paths:
        raise ValueError("measure_crop_limit needs at least one image path")
    crops = stored_crops(paths, image_size, scale=scale)
    fns = crop_candidates(crops, paths, image_size)
    limit = measure_rates(fns, paths, image_size, repeats, pool, pool_with="batch-loop")
    unflipped = crop_candidates(crops, paths, image_size, flips=False)[limit.best.name]
    wall, cpu = time_single_thread(unflipped, paths, repeats)
    resize_alone = DecodeRate(f"{limit.best.name}, no flips", len(paths), wall, cpu)
    job, title = "train crop + resize + flip", "crop-and-resize limit"
    return replace(limit, job=job, title=title, without_flips=resize_alone)
