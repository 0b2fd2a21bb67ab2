"""The spdl pipeline's geometry: the run's output size, seed and crop ranges, turned into one
crop plan per opened image (``loaderbench.imaging.plans``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loaderbench.imaging.plans import Plan, train_plans, val_plan, val_region_plan
from loaderbench.imaging.spdl.records import Opened, is_encoded
from loaderbench.imaging.transforms import RRC_RATIO, RRC_SCALE, seeded_crops


@dataclass(frozen=True)
class Geometry:
    """The output size, for training the run's seed and the random-resized crop's ranges, and
    for val whether a JPEG's centre crop is taken as a region of the original
    (``val_region_plan``) or from the resized image (``val_plan``)."""

    size: int
    train: bool
    seed: int = 0
    scale: tuple[float, float] = RRC_SCALE
    ratio: tuple[float, float] = RRC_RATIO
    val_region: bool = False

    def val_plan(self, opened: Opened) -> Plan:
        """The centre crop's region of a JPEG still to be decoded (where regions are decoded);
        the reference's plan for a file decoded already (not a JPEG, or one PIL reads)."""
        plan = val_region_plan if self.val_region and is_encoded(opened) else val_plan
        return plan(opened.height, opened.width, self.size)

    def plans(self, opened: Sequence[Opened]) -> list[Plan]:
        """One plan per opened image; a train image's crop and flip come from the run's seed,
        the epoch and the image (``seeded_crops``)."""
        if not self.train:
            return [self.val_plan(o) for o in opened]
        if not opened:
            return []
        boxes, flips = seeded_crops(
            [o.height for o in opened],
            [o.width for o in opened],
            self.seed,
            opened[0].sample.epoch,
            [o.sample.index for o in opened],
            self.scale,
            self.ratio,
        )
        return train_plans(boxes, flips, self.size)


__all__ = ["Geometry"]
