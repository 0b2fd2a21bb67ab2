"""The spdl loader's parts that run without a pipeline: the plan each image is decoded by (val:
the reference's resize and centre crop, or that crop as a region of the original; train: the
seeded random-resized crop of the true size), the same plan as an FFmpeg filter graph, the
settings that name the decoder, and that no other loader reaches into its modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from loaderbench.imaging.plans import Plan, apply_plan, val_plan, val_region_plan
from loaderbench.imaging.spdl import decoders
from loaderbench.imaging.spdl.decoders import ffmpeg_filter
from loaderbench.imaging.spdl.geometry import Geometry
from loaderbench.imaging.spdl.records import Opened, Sample
from loaderbench.imaging.transforms import seeded_crops


def test_val_geometry_is_resize_short_side_then_centre_crop() -> None:
    # Landscape 500x375 -> 341x256 (torchvision truncates the long side), centre 224.
    plan = val_plan(375, 500, 224)
    assert plan.resize == (256, 341) and plan.crop == (16, 58, 224, 224)
    assert val_plan(500, 333, 224).resize == (384, 256)  # portrait: int(256 * 500 / 333)
    # Not SPDL's default letterbox (scale + pad): scale keeps the aspect, crop, no pad.
    text = ffmpeg_filter(plan, 375, 500)
    assert "scale=w=341:h=256" in text and "crop=w=224:h=224:x=58:y=16" in text
    assert "pad" not in text and text.endswith("format=pix_fmts=rgb24")


def test_val_region_is_the_centre_crop_in_the_originals_pixels() -> None:
    """The region decoders' val plan: the reference's centre crop (16, 58, 224, 224) of the
    341x256 resize, mapped back to the 500x375 original and rounded to whole pixels."""
    plan = val_region_plan(375, 500, 224)
    assert plan == Plan(box=(23, 85, 329, 328), resize=(224, 224))
    for height, width in ((375, 500), (500, 333), (64, 64), (1000, 90)):
        top, left, h, w = val_region_plan(height, width, 64).box
        assert 0 <= top and 0 <= left and top + h <= height and left + w <= width
    # Taken where the JPEG backend decodes regions, or where turbo's batch path cuts it from
    # a whole decode; FFmpeg decodes whole, as the reference.
    turbo = decoders.TurboDecoder(Geometry(64, train=False), torch.device("cpu"))
    assert turbo.geometry.val_region is (turbo.batched or turbo.decodes_regions())
    ffmpeg = decoders.FFmpegDecoder(Geometry(64, train=False), torch.device("cpu"))
    assert not ffmpeg.geometry.val_region and not ffmpeg.decodes_regions()


def opened(sizes: list[tuple[int, int]], epoch: int = 0) -> list[Opened]:
    """Images of (height, width) as the decode stage sees them after reading their headers."""
    return [Opened(Sample(i, f"{i}.jpg", 0, epoch), h, w, None) for i, (h, w) in enumerate(sizes)]


def test_train_crops_are_seeded_rrc_boxes_of_the_true_sizes() -> None:
    sizes = [(375, 500), (500, 333), (90, 120)] * 70
    geometry = Geometry(64, train=True, seed=11)
    plans = geometry.plans(opened(sizes))
    assert plans == geometry.plans(opened(sizes))  # reproducible from (seed, epoch, image)
    assert plans != Geometry(64, train=True, seed=12).plans(opened(sizes))
    assert plans != geometry.plans(opened(sizes, epoch=1))
    for (height, width), plan in zip(sizes, plans, strict=True):
        top, left, h, w = plan.box
        assert 0 <= top and 0 <= left and top + h <= height and left + w <= width
        assert 0.08 * height * width * 0.9 <= h * w <= height * width and plan.resize == (64, 64)
    assert len({plan.box for plan in plans}) > 150  # drawn per image, not once per batch
    flips = sum(plan.flip for plan in plans)
    assert 60 < flips < 150
    image = torch.arange(3 * 375 * 500, dtype=torch.int64).reshape(3, 375, 500).to(torch.uint8)
    assert apply_plan(image, plans[0]).shape == (3, 64, 64)
    # The shared sampler, the same boxes the other loaders draw for these images.
    boxes, _ = seeded_crops([h for h, _ in sizes], [w for _, w in sizes], 11, 0, range(210))
    assert [plan.box for plan in plans] == [tuple(b) for b in boxes.tolist()]
    # augment.scale / augment.ratio reach the sampler: the whole 4:3 image, only.
    whole = Geometry(64, train=True, scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3))
    assert {plan.box for plan in whole.plans(opened([(375, 500)] * 5))} == {(0, 0, 375, 500)}


def test_spdl_settings_refuse_an_unknown_decoder_and_timeout() -> None:
    from loaderbench.config.checks import ConfigError
    from loaderbench.loaders.spdl.settings import Settings

    assert Settings(name="spdl").decoder == "turbo"
    unknown = "loader.decoder must be one of ['ffmpeg', 'nvjpeg', 'turbo'], got 'nope'"
    with pytest.raises(ConfigError, match=re.escape(unknown)):
        Settings(name="spdl", decoder="nope")
    never = "loader.timeout_s must be > 0 (finite) or null, got 0.0"
    with pytest.raises(ConfigError, match=re.escape(never)):
        Settings(name="spdl", timeout_s=0.0)


def test_no_loader_imports_another_loaders_modules() -> None:
    """Each loader package stands alone: what two loaders share (the JPEG backends, the pool
    threads' OpenMP setting) lives outside ``loaderbench.loaders``, so a loader can be changed
    or removed without breaking another (memmap used to import spdl's decoders module)."""
    loaders = Path(decoders.__file__).parents[2] / "loaders"
    reaches = []
    for path in sorted(loaders.glob("*/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                other = name.split(".")[2] if name.startswith("loaderbench.loaders.") else ""
                if (loaders / other).is_dir() and other not in ("", path.parent.name):
                    reaches.append(f"{path.relative_to(loaders)} imports {name}")
    assert reaches == []


def test_the_packages_public_names_are_its_own() -> None:
    """``loaderbench.imaging.spdl``'s public face holds its own names, each defined by one of
    its modules, and nothing passed through from elsewhere (it used to re-export
    ``serial_torch_in_this_thread``, which every user imports from ``loaderbench.platform``)."""
    import loaderbench.imaging.spdl as spdl
    from loaderbench.imaging.spdl import geometry, records

    own = {*records.__all__, *geometry.__all__, *decoders.__all__}
    assert sorted(set(spdl.__all__) - own) == []
    for name in spdl.__all__:
        assert getattr(spdl, name) is not None
