"""The ceiling as a loader: the run's batch, made once, handed over again and again.

What the loop gets is a batch of the shape every loader hands over (uint8 NCHW at the run's
image size, on the run's device; int64 labels): the images are seeded noise made when the
loader is built, the labels the split's own, in the shared epoch order (one gather on the
device a batch), so an epoch has the split's length, its positions and resume behave as every
loader's, and the labels are in range of the data set's classes. Nothing is read or decoded,
so a loop over it runs at the model's own rate: the ceiling a real loader's ``ceiling_frac``
is measured against (docs/loaders.md, "loader=resident").
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from loaderbench.loaders.base import Batch, Loader, LoaderSpec, register_loader
from loaderbench.measure.metrics import DECODED_BY

# The noise's own stream: building the loader draws nothing from torch's global RNG.
NOISE_SEED = 20261204


def resident_images(spec: LoaderSpec) -> torch.Tensor:
    """One batch of seeded uint8 noise of the run's shape, on the run's device."""
    generator = torch.Generator().manual_seed(NOISE_SEED + spec.seed)
    shape = (spec.batch_size, 3, spec.image_size, spec.image_size)
    noise = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
    return noise.to(spec.device)


@register_loader("resident")
class ResidentLoader(Loader):
    def __init__(self, spec: LoaderSpec) -> None:
        super().__init__(spec)
        self.images = resident_images(spec)
        self.labels = torch.as_tensor(spec.split.labels, dtype=torch.int64).to(spec.device)

    def queue_depth(self) -> int:
        """Nothing is made ahead: the batch is there before the loop asks."""
        return 0

    def __iter__(self) -> Iterator[Batch]:
        spec = self.spec
        self.position = self.start_batch
        for indices in spec.epoch_batches(self.epoch, self.start_batch):
            self.position += 1
            labels = self.labels[indices.to(spec.device, non_blocking=True)]
            yield Batch(images=self.images[: len(indices)], labels=labels, indices=indices)

    def stats(self) -> dict[str, object]:
        return {**super().stats(), DECODED_BY: {}}
