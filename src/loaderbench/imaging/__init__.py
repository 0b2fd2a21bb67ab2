"""The imaging layer, where pixels are made: reading and admitting a file, decoding (every CPU
and GPU engine), the crop plan, the resize and the flip, and what decoded each image. Loaders
compose these; none decodes or resizes on its own."""

from loaderbench.imaging import decode, decoded_by, spdl, stored
from loaderbench.imaging.batch_resize import warm_up
from loaderbench.imaging.crops import (
    CROP_STREAM,
    RRC_RATIO,
    RRC_SCALE,
    augmentation_draws,
    random_crops,
    seeded_crops,
)
from loaderbench.imaging.device_resize import resize_boxes, resize_images
from loaderbench.imaging.files import (
    DEFAULT_MAX_PIXELS,
    ImageTooLarge,
    fast_jpeg,
    jpeg_header,
    load_rgb,
    max_pixels,
    set_max_pixels,
)
from loaderbench.imaging.plans import (
    Plan,
    apply_plan,
    plan_table,
    split_region,
    train_plans,
    val_plan,
    val_region_plan,
)
from loaderbench.imaging.transforms import (
    PilTrainTransform,
    crop_resize_flip_rows,
    normalize_uint8,
    pil_val_transform,
    resize_uint8,
    resized_crop_images,
    val_resize_size,
)

__all__ = [
    "CROP_STREAM",
    "DEFAULT_MAX_PIXELS",
    "RRC_RATIO",
    "RRC_SCALE",
    "ImageTooLarge",
    "PilTrainTransform",
    "Plan",
    "apply_plan",
    "augmentation_draws",
    "crop_resize_flip_rows",
    "decode",
    "decoded_by",
    "fast_jpeg",
    "jpeg_header",
    "load_rgb",
    "max_pixels",
    "normalize_uint8",
    "pil_val_transform",
    "plan_table",
    "random_crops",
    "resize_boxes",
    "resize_images",
    "resize_uint8",
    "resized_crop_images",
    "seeded_crops",
    "set_max_pixels",
    "spdl",
    "split_region",
    "stored",
    "train_plans",
    "val_plan",
    "val_region_plan",
    "val_resize_size",
    "warm_up",
]
