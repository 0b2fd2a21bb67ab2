"""The jpeg store's batches (``loader.store=jpeg``): each image's bytes decoded again (a train
image's box alone), then resized and flipped (train) or taken as stored (val) into one batch.

Two makers: ``DecodedOnCpu`` (the batch in one call of the CPU decoder, one GIL release) and
``DecodedOnDevice`` (one batched call of the reading thread's own decoder, nvJPEG on CUDA, on
the thread's stream). docs/loaders.md, "How a batch is made".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loaderbench.imaging.decode import CPU, Box, Decoded, backend, decode_batch, region_decode
from loaderbench.imaging.decoded_by import counting
from loaderbench.imaging.device_resize import resize_images
from loaderbench.imaging.transforms import resized_crop_images
from loaderbench.loaders.memmap._parts import BatchParts, Gathered
from loaderbench.loaders.memmap._store_jpeg import JpegCache


def _regions(boxes: torch.Tensor | None, count: int) -> list[Box | None]:
    """What to decode of each image: its train box, or (val) all of it."""
    if boxes is None:
        return [None] * count
    return [tuple(box) for box in boxes.tolist()]  # type: ignore[misc]


def _within_box(boxes: torch.Tensor) -> torch.Tensor:
    """The boxes in the coordinates of their own decoded region: each the whole region."""
    inside = boxes.clone()
    inside[:, :2] = 0
    return inside


@dataclass
class _JpegBatch:
    """A batch to decode: its images' bytes (views of the map), indices and labels, and (train)
    their boxes in the stored images' coordinates and flips."""

    encoded: list[torch.Tensor]
    indices: torch.Tensor
    labels: torch.Tensor
    boxes: torch.Tensor | None
    flips: torch.Tensor | None


class _JpegBytes:
    """The store's bytes: memory-mapped, back to back, found by offset and length."""

    def __init__(self, data: JpegCache, parts: BatchParts, cache_name: str) -> None:
        self.parts = parts
        self.bytes: torch.Tensor = data.data
        # A plain tensor over the same mapped bytes: an image's bytes are a slice of it, which
        # through the tensordict subclass costs 7x the slice (docs/measurements.md).
        self._plain = data.data.as_subclass(torch.Tensor)
        self._spans = torch.stack([data.offsets, data.offsets + data.lengths], 1).tolist()
        self._cache_name = cache_name  # for the error naming a stored image that fails

    def read(self, epoch: int, indices: torch.Tensor) -> Gathered:
        parts = self.parts
        labels = parts.labels_of(indices)
        boxes = flips = None
        if parts.spec.train:  # in the stored image's coordinates, from its stored size
            boxes, flips = parts.train_boxes(epoch, indices)
        spans = [self._spans[i] for i in indices.tolist()]
        encoded = [self._plain[start:stop] for start, stop in spans]
        with counting() as counts:
            gathered = self._decode(_JpegBatch(encoded, indices, labels, boxes, flips))
        gathered.decoded_by = counts
        return gathered

    def _decode(self, batch: _JpegBatch) -> Gathered:
        """The batch decoded, finished and (off the CPU) on the device."""
        raise NotImplementedError

    def whole(self, decoded: list[Decoded], indices: torch.Tensor) -> list[torch.Tensor]:
        """The decoded images of a batch; the cache was built from images that decoded, so
        one that fails now is a damaged cache, named with the image and its source file."""
        for image, index in zip(decoded, indices.tolist(), strict=True):
            if isinstance(image, BaseException):
                raise OSError(
                    f"memmap cache {self._cache_name}: stored image {index} (from "
                    f"{self.parts.spec.split.paths[index]}) does not decode: {image}"
                ) from image
        return decoded  # type: ignore[return-value]

    def finish(
        self,
        images: list[torch.Tensor],
        boxes: torch.Tensor | None,
        flips: torch.Tensor | None,
        out: torch.Tensor,
    ) -> torch.Tensor:
        """Decoded images into one batch: the stored val crops as they are, train boxes (each
        decoded alone: its image is the box) resized and flipped; off the CPU, each a batched
        call (no Python an image but the list itself)."""
        if boxes is None:
            torch._foreach_copy_(list(out.unbind(0)), images)
            return out
        size = self.parts.spec.image_size
        if out.device.type != "cpu":
            return resize_images(images, size, flips, out)
        return resized_crop_images(images, _within_box(boxes), size, flips, out)

    def stored_bytes(self) -> int:
        return self.bytes.numel()

    def stats(self) -> dict[str, object]:
        """The library that decodes the store, and whether it decodes train boxes alone."""
        where = self.decodes_on()
        return {
            "jpeg_backend": backend(where),
            "region_decode": self.parts.spec.train and region_decode(where),
        }

    def decodes_on(self) -> torch.device:
        return CPU


class DecodedOnCpu(_JpegBytes):
    """The store's own JPEGs, which the build encoded: no admission parse (``admitted``), and
    the batch in one call (as fast as one a file, and one GIL release)."""

    def _decode(self, batch: _JpegBatch) -> Gathered:
        regions = _regions(batch.boxes, len(batch.encoded))
        decoded = decode_batch(batch.encoded, CPU, regions, admitted=True)
        out = self.parts.crop_out(len(decoded))
        images = self.whole(decoded, batch.indices)
        return Gathered(self.finish(images, batch.boxes, batch.flips, out), batch.labels)


class DecodedOnDevice(_JpegBytes):
    """One batched call of the reading thread's decoder (nvJPEG on CUDA) for the batch's bytes,
    its crops and the labels' copy, on the thread's stream."""

    def _decode(self, batch: _JpegBatch) -> Gathered:
        parts = self.parts
        device, size = parts.spec.device, parts.spec.image_size
        encoded = [data.clone() for data in batch.encoded]  # owned copies, not views of the map

        def finish(decoded: list[Decoded]) -> torch.Tensor:
            out = torch.empty((len(decoded), 3, size, size), dtype=torch.uint8, device=device)
            images = self.whole(decoded, batch.indices)
            return self.finish(images, batch.boxes, batch.flips, out)

        regions = _regions(batch.boxes, len(encoded))
        with parts.threads.on_stream():
            images, _ = parts.threads.decoder().run(encoded, finish, regions, admitted=True)
            labels = parts.label_pool.to_device(batch.labels, device)
            return Gathered(images, labels, parts.threads.ready())

    def decodes_on(self) -> torch.device:
        return self.parts.spec.device
