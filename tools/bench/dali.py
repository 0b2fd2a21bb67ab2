"""NVIDIA DALI as a peer in the benchmark report: what many users would pick instead.

Its pipelines do the report's two jobs on the same files, with the same batch size and as many
threads as our loaders have workers, uint8 out: val decodes, resizes the short side and crops
the centre; train uses ``fn.decoders.image_random_crop`` (decoding only the region it keeps)
with the same area and aspect ranges, resizes and flips half. DALI is not in
``requirements.txt``: ``make bench`` installs it on demand (``nvidia-dali-cuda130``), and the
report says so where it is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from loaderbench.data.discovery import Split
from loaderbench.imaging.transforms import RRC_RATIO, RRC_SCALE, val_resize_size


def dali_version() -> str | None:
    """DALI's version where it imports, else None."""
    try:
        import nvidia.dali
    except ImportError:
        return None
    return str(nvidia.dali.__version__)


class DaliLoader:
    """A DALI pipeline over a split, iterated once per epoch as (uint8 NCHW, int64 labels)."""

    def __init__(
        self,
        split: Split,
        size: int,
        train: bool,
        batch_size: int,
        threads: int,
        *,
        device: str = "cpu",
        seed: int = 0,
    ) -> None:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        self.batch_size = batch_size
        pipe = self._pipeline(split, size, train, batch_size, max(1, threads), device, seed)
        pipe.build()
        self._iterator = DALIGenericIterator(
            pipe,
            ["images", "labels"],
            reader_name="reader",
            last_batch_policy=LastBatchPolicy.DROP if train else LastBatchPolicy.PARTIAL,
            auto_reset=True,
        )

    @staticmethod
    def _pipeline(
        split: Split,
        size: int,
        train: bool,
        batch_size: int,
        threads: int,
        device: str,
        seed: int,
    ) -> Any:
        from nvidia.dali import fn, pipeline_def, types

        decode_device = "mixed" if device == "gpu" else "cpu"

        @pipeline_def(
            batch_size=batch_size,
            num_threads=threads,
            device_id=0 if device == "gpu" else None,
            seed=seed,
        )
        def pipeline() -> tuple[Any, Any]:
            jpegs, labels = fn.readers.file(
                files=list(split.paths),
                labels=[int(label) for label in split.labels],
                random_shuffle=train,
                name="reader",
            )
            if train:
                images = fn.decoders.image_random_crop(
                    jpegs,
                    device=decode_device,
                    output_type=types.RGB,
                    random_area=list(RRC_SCALE),
                    random_aspect_ratio=list(RRC_RATIO),
                    num_attempts=10,
                )
                images = fn.resize(images, resize_x=size, resize_y=size, antialias=True)
                mirror = fn.random.coin_flip(probability=0.5)
            else:
                images = fn.decoders.image(jpegs, device=decode_device, output_type=types.RGB)
                images = fn.resize(images, resize_shorter=val_resize_size(size), antialias=True)
                mirror = 0
            images = fn.crop_mirror_normalize(
                images,
                dtype=types.UINT8,
                output_layout="CHW",
                crop=(size, size),
                mirror=mirror,
                mean=[0.0],
                std=[1.0],
            )
            return images, labels.gpu() if device == "gpu" else labels

        return pipeline()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for (out,) in self._iterator:
            yield out["images"], out["labels"].view(-1).long()

    def __len__(self) -> int:
        return len(self._iterator)
