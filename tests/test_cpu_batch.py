"""spdl turbo's batch path (``decode.cpu_batch``): a batch read in one call and decoded, cut,
resized and flipped in another, with the pixels, crops, labels and verdicts of the
image-by-image path it replaces, on real JPEGs."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from loaderbench.imaging import decoded_by
from loaderbench.imaging.decode import cpu_batch, decode_cpu
from loaderbench.imaging.spdl.decoders import TurboDecoder
from loaderbench.imaging.spdl.geometry import Geometry
from loaderbench.imaging.spdl.records import DecodedBatch, Sample
from loaderbench.platform.buffers import BatchBuffers

pytestmark = pytest.mark.skipif(not cpu_batch.available(), reason="no torchvision image ops")


def decoders(train: bool, size: int = 64) -> tuple[TurboDecoder, TurboDecoder]:
    """The batch path and the image-by-image one, on the same geometry."""
    geometry = Geometry(size, train, seed=3, scale=(0.08, 1.0))
    batched = TurboDecoder(geometry, torch.device("cpu"))
    alone = TurboDecoder(geometry, torch.device("cpu"))
    alone.batched = False
    alone.geometry = batched.geometry  # the same val plans (the centre crop's region)
    return batched, alone


def decode(decoder: TurboDecoder, samples: list[Sample], size: int = 64) -> DecodedBatch:
    buffers = BatchBuffers(len(samples), (3, size, size), 2, pin=False)
    with decoded_by.counting() as counts:
        batch = decoder.decode_batch(samples, buffers)
    return batch._replace(images=batch.images.clone(), decoded_by=dict(counts))


def photos(root: Path) -> list[str]:
    """The tree's train JPEGs (generated, real files)."""
    return sorted(str(path) for path in root.glob("train/*/*"))


def samples_of(paths: list[str], epoch: int = 1) -> list[Sample]:
    return [Sample(i, path, i % 3, epoch) for i, path in enumerate(paths)]


@pytest.mark.parametrize("train", [True, False])
def test_the_batch_path_gives_the_image_by_image_pixels(tiny_root: Path, train: bool) -> None:
    paths = photos(tiny_root)
    batched, alone = decoders(train)
    got, expected = decode(batched, samples_of(paths)), decode(alone, samples_of(paths))
    assert got.images.shape == expected.images.shape == (len(paths), 3, 64, 64)
    assert torch.equal(got.images, expected.images)  # same crops, flips, pixels: to the bit
    assert torch.equal(got.labels, expected.labels) and not got.failures
    assert got.decoded_by == {cpu_batch.LIBRARY: len(paths)}
    assert batched.jpeg_backend() == cpu_batch.LIBRARY and not batched.decodes_regions()


def test_a_whole_decode_is_nvimgcodecs_and_its_box_the_region_decode(tiny_root: Path) -> None:
    path = photos(tiny_root)[0]
    (data,) = cpu_batch.read_files([path])
    assert torch.equal(data, torch.from_numpy(np.fromfile(path, dtype=np.uint8)))
    whole = decode_cpu(data)
    height, width = whole.shape[-2:]
    box = [3, 5, height - 7, width - 9]
    out = torch.empty((1, 3, box[2], box[3]), dtype=torch.uint8)  # no resize: the box itself
    cpu_batch.decode_into([data], [box], [False], [0], out)
    assert torch.equal(out[0], decode_cpu(data, tuple(box)))


def test_a_file_that_fails_is_named_and_left_out_the_rest_in_order(
    tiny_root: Path, tmp_path: Path
) -> None:
    paths = photos(tiny_root)[:6]
    broken = tmp_path / "broken.JPEG"
    data = bytearray(Path(paths[2]).read_bytes())
    # A whole JPEG whose frame header says 12-bit samples: past the admission rule, refused
    # by libjpeg-turbo in the batch call (and by Pillow).
    data[data.index(b"\xff\xc0") + 4] = 12
    broken.write_bytes(bytes(data))
    shutil.copy(paths[3], tmp_path / "fine.JPEG")
    mixed = [*paths[:2], str(broken), str(tmp_path / "fine.JPEG"), *paths[4:]]
    batched, alone = decoders(train=True)
    got, expected = decode(batched, samples_of(mixed)), decode(alone, samples_of(mixed))
    assert [f.path for f in got.failures] == [f.path for f in expected.failures] == [str(broken)]
    assert torch.equal(got.images, expected.images)
    assert torch.equal(got.labels, expected.labels)


def test_a_missing_file_is_named_like_the_image_by_image_path(tiny_root: Path) -> None:
    paths = photos(tiny_root)[:4]
    paths[1] = paths[1] + ".gone"
    batched, _ = decoders(train=True)
    got = decode(batched, samples_of(paths))
    assert [f.path for f in got.failures] == [paths[1]] and len(got.labels) == 3
