"""One verdict per file, in every loader, memmap store and spdl decoder (nvjpeg's on CUDA):
4-component and damaged JPEGs, and other formats named .JPEG, are loaded or skipped as Pillow,
the reference, loads or refuses them, each skipped file named once in the log, and what loads
has the reference's pixels. The messy folder's odd and broken files: tests/test_messy.py."""

from __future__ import annotations

import io
import re
import struct
import tarfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch
from PIL import Image

from loaderbench.data.discovery import Split
from loaderbench.imaging.files import ImageTooLarge, fast_jpeg, load_rgb
from loaderbench.imaging.spdl.decoders import Sample, is_encoded, open_file
from loaderbench.loaders import build_loader
from tests.conftest import READERS, cpu_spec, folder_index, loader_folders
from tests.helpers import photo
from tests.test_messy import SIZE, gradient16, plain_tree

pytestmark = pytest.mark.slow

REFERENCE = ("torchvision", {})  # the reader every other is held to


# ---------------------------------------------------------------------------------------------
# One verdict per file: 4-component and damaged JPEGs, in every loader and every spdl decoder.

# Each: (what the file is, whether Pillow, the reference, loads it).
DAMAGED = {
    # libjpeg warns "Corrupt JPEG data: 3 extraneous bytes before marker 0xda"; Pillow loads it.
    "extraneous.JPEG": True,
    "extraneous_eoi.JPEG": True,
    # A scan cut short, then the end-of-image marker: libjpeg warns "premature end of data
    # segment" and fills the rest; Pillow loads it, FFmpeg refuses it.
    "premature_end.JPEG": True,
    # Cut before the end-of-image marker: Pillow refuses ("image file is truncated"), even for
    # two bytes, where FFmpeg decodes a file 100 bytes short without an error.
    "no_eoi.JPEG": False,
    "short.JPEG": False,
    "junk_first.JPEG": False,  # data before the first marker: not a JPEG to Pillow
}


def _jpeg_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _insert_before(data: bytes, marker: bytes, junk: bytes, last: bool = False) -> bytes:
    at = data.rfind(marker) if last else data.find(marker)
    assert at > 0, marker
    return data[:at] + junk + data[at:]


@pytest.fixture(scope="module")
def damaged_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 classes of 4 plain JPEGs in train and val; val also holds a YCCK JPEG, an Adobe CMYK
    one, and the ``DAMAGED`` files, made from Pillow-written JPEGs."""
    from tests.test_decode import as_ycck

    root = plain_tree(tmp_path_factory.mktemp("damaged"))
    val = root / "val" / "n00000001"
    (val / "ycck.JPEG").write_bytes(as_ycck(_jpeg_bytes(photo(11).convert("CMYK"))))
    (val / "cmyk.JPEG").write_bytes(_jpeg_bytes(photo(12).convert("CMYK")))
    good = _jpeg_bytes(photo(13))
    files = {
        "extraneous.JPEG": _insert_before(good, b"\xff\xda", b"\x12\x34\x56"),
        "extraneous_eoi.JPEG": _insert_before(good, b"\xff\xd9", b"\x12\x34\x56", last=True),
        "premature_end.JPEG": good[: len(good) // 2] + b"\xff\xd9",
        "no_eoi.JPEG": good[:-2],
        "short.JPEG": good[:-100],
        "junk_first.JPEG": b"junk" + good,
    }
    for name, data in files.items():
        (val / name).write_bytes(data)
    return root


def _own_cache(loader: str, options: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """Each reader its own folders (a memmap store its own cache, built for it)."""
    return loader_folders(loader, tmp_path / "-".join([loader, *map(str, options.values())]))


class Read(NamedTuple):
    """One reader's epoch over a split: the images it yielded, in order, and for each file it
    skipped the error its one log line gave (the exception's name)."""

    images: torch.Tensor
    skipped: dict[str, str]  # file name -> error type


SKIP_LINE = re.compile(r"skipping unreadable image (\S+): (\w+)")


def read_every_way(
    split: Split,
    train: bool,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    readers: list[tuple[str, dict[str, str]]] = READERS,
    device: str = "cpu",
) -> dict[str, Read]:
    """One epoch of ``split`` (on_error=skip) by every loader and spdl decoder, by label; each
    skipped file named by exactly one log line, and counted (``skipped_indices``) as named."""
    reads = {}
    for loader, options in readers:
        caplog.clear()
        options = {"on_error": "skip", **_own_cache(loader, options, tmp_path), **options}
        batch = 1 if train else 4  # train drops a last partial batch: none with 1
        spec = cpu_spec(
            split,
            train,
            loader=loader,
            image_size=SIZE,
            batch_size=batch,
            device=torch.device(device),
            **options,
        )
        with build_loader(spec) as built:
            built.set_epoch(0)
            images = torch.cat([batch.images.cpu() for batch in built])
            counted = {Path(split.paths[i]).name for i in built.skipped_indices()}
            assert built.stats()["skipped_files"] == len(counted)
        label = f"{loader} {options}"
        lines = [SKIP_LINE.search(r.getMessage()) for r in caplog.records]
        named = [(Path(m[1]).name, m[2]) for m in lines if m]
        assert len(named) == len(dict(named)), f"{label}: a file named twice: {named}"
        assert set(dict(named)) == counted, label
        reads[label] = Read(images, dict(named))
    return reads


def assert_one_verdict(
    reads: dict[str, Read],
    refused: set[str],
    tolerance: float | None,
    names: list[str] | None = None,
) -> None:
    """Every reader skipped the ``refused`` files for the reference's reasons and loaded the
    rest; with a ``tolerance``, with its pixels (mean |difference| an image at most that; the
    loaded files' ``names``, in order, name the ones over it)."""
    reference = reads["torchvision {'on_error': 'skip'}"]
    assert set(reference.skipped) == refused
    for label, read in reads.items():
        assert read.skipped == reference.skipped, label
        assert read.images.shape == reference.images.shape, label
        if tolerance is None:
            continue
        per_image = (read.images.float() - reference.images.float()).abs().mean(dim=(1, 2, 3))
        over = [
            f"{names[i] if names else i} {float(d):.2f}"
            for i, d in enumerate(per_image)
            if d > tolerance
        ]
        assert not over, f"{label}: mean |diff| over {tolerance}: {', '.join(over)}"


def test_the_damaged_files_are_what_they_say(damaged_root: Path) -> None:
    """Pillow reads the YCCK file as YCCK (not as the CMYK it was written from) and gives each
    damaged file the verdict ``DAMAGED`` says; FFmpeg alone gets YCCK's colours and a cut
    file's verdict wrong, which is what the loaders must not let through."""
    import spdl.io

    val = damaged_root / "val" / "n00000001"
    ycck = np.asarray(Image.open(val / "ycck.JPEG").convert("RGB"), dtype=np.float32)
    as_cmyk = np.asarray(photo(11).convert("CMYK").convert("RGB"), dtype=np.float32)
    assert np.abs(ycck - as_cmyk).mean() > 20
    for name, loads in DAMAGED.items():
        try:
            Image.open(val / name).load()
            loaded = True
        except OSError:
            loaded = False
        assert loaded == loads, name
    packets = spdl.io.demux_image(str(val / "ycck.JPEG"))
    frames = spdl.io.decode_packets(packets, filter_desc="format=pix_fmts=rgb24")
    by_ffmpeg = spdl.io.to_torch(spdl.io.convert_frames(frames)).numpy().astype(np.float32)
    assert np.abs(by_ffmpeg.reshape(ycck.shape) - ycck).mean() > 20
    packets = spdl.io.demux_image(str(val / "short.JPEG"))
    frames = spdl.io.decode_packets(packets, filter_desc="format=pix_fmts=rgb24")
    assert spdl.io.to_torch(spdl.io.convert_frames(frames)).numel() > 0


def test_every_decoder_gives_pillows_verdict_and_pixels(
    damaged_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """YCCK, Adobe CMYK and the damaged JPEGs: the same files load and are skipped (each named
    once in the log, for the same reason) in every loader and spdl decoder, with the
    reference's pixels."""
    split = folder_index(damaged_root).val
    refused = {name for name, loads in DAMAGED.items() if not loads}
    loaded = [Path(p).name for p in split.paths if Path(p).name not in refused]
    reads = read_every_way(split, False, tmp_path, caplog)
    # The messy set's tolerances: re-encoded (memmap's jpeg store), FFmpeg's chroma.
    assert_one_verdict(reads, refused, tolerance=6.0)
    reference = reads["torchvision {'on_error': 'skip'}"].images.float()
    for label, read in reads.items():
        per_image = (read.images.float() - reference).abs().mean(dim=(1, 2, 3))
        for name in ("ycck.JPEG", "cmyk.JPEG"):  # decoded by PIL, whatever the decoder
            at = loaded.index(name)
            tolerance = 6.0 if "'jpeg'" in label else 0.0
            assert per_image[at] <= tolerance, f"{label}: {name} mean |diff| {per_image[at]:.2f}"


def test_only_whole_three_component_jpegs_reach_a_fast_decoder(damaged_root: Path) -> None:
    """The one rule every spdl decoder opens files by (nvjpeg's too): 4-component and cut
    JPEGs are decoded by PIL on opening (or refused by it), the rest handed on encoded; and
    every JPEG backend loads what Pillow loads."""
    from loaderbench.imaging.decode import BACKENDS, CPU

    val = damaged_root / "val" / "n00000001"
    # Stray bytes before the scan's marker: libjpeg skips them, nvJPEG does not (PIL's).
    fast = {"ok_0.JPEG", "extraneous_eoi.JPEG", "premature_end.JPEG"}
    for name in ("ycck.JPEG", "cmyk.JPEG", *DAMAGED, "ok_0.JPEG"):
        try:
            encoded = is_encoded(open_file(Sample(0, str(val / name), 0, 0)))
        except OSError:
            encoded = False
        assert encoded == (name in fast), name
    for name in ("extraneous.JPEG", "extraneous_eoi.JPEG", "premature_end.JPEG"):
        data = torch.frombuffer(bytearray((val / name).read_bytes()), dtype=torch.uint8)
        reference = torch.from_numpy(np.array(Image.open(val / name).convert("RGB")))
        for backend in BACKENDS.values():
            try:
                backend.load()
            except Exception:
                continue  # not installed here: choose() passes it over too
            (image,) = backend.decode([data], CPU, [None])
            assert isinstance(image, torch.Tensor), f"{backend.name}: {name}: {image}"
            diff = (image.permute(1, 2, 0).int() - reference.int()).abs()
            assert diff.max() <= 1, f"{backend.name}: {name}"


# The train split's odd files: what the memmap build must admit or refuse as torchvision does.
TRAIN_ODD = {
    "png_named.JPEG": True,
    "gray16.png": True,
    "ycck.JPEG": True,
    "truncated.JPEG": False,
    "text.JPEG": False,
}


def test_memmap_builds_skip_exactly_what_torchvision_skips(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The train store (``fit``: a JPEG decoded at a reduced DCT scale) opens and verifies
    every file as the torchvision loader does: the same files trained on and skipped."""
    from tests.test_decode import as_ycck

    root = tmp_path / "data"
    (root / "val" / "n00000001").mkdir(parents=True)
    photo(9).save(root / "val" / "n00000001" / "ok.JPEG", quality=90)
    folder = root / "train" / "n00000001"
    folder.mkdir(parents=True)
    for i in range(3):
        photo(i, (400, 300)).save(folder / f"ok_{i}.JPEG", quality=90)
    photo(3).save(folder / "png_named.JPEG", format="PNG")
    Image.fromarray(gradient16()).save(folder / "gray16.png")
    (folder / "ycck.JPEG").write_bytes(as_ycck(_jpeg_bytes(photo(4, (400, 300)).convert("CMYK"))))
    good = _jpeg_bytes(photo(5, (400, 300)))
    (folder / "truncated.JPEG").write_bytes(good[: len(good) // 2])
    (folder / "text.JPEG").write_text("this is not an image\n")
    split = folder_index(root).train
    refused = {name for name, loads in TRAIN_ODD.items() if not loads}
    reads = read_every_way(split, True, tmp_path, caplog)
    assert_one_verdict(reads, refused, tolerance=None)
    assert len(reads["torchvision {'on_error': 'skip'}"].images) == len(split) - len(refused)


# ---------------------------------------------------------------------------------------------
# Other formats named .JPEG: the kinds of file on which the loaders and decoders once disagreed
# over a folder of real files no one here wrote (Pillow's own Tests/images, 1067 files): FFmpeg
# read what Pillow refuses and refused what it reads, the memmap build decoded another way,
# and a small ICNS holding a huge PNG took 8 GB. Each is written here (by Pillow, or by hand
# where Pillow would not write it), with whether Pillow, the reference, loads it at the tests'
# pixel limit.


def _encoded(image: Image.Image, image_format: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=image_format, **options)
    return buffer.getvalue()


def _ico_holding(png: bytes, width: int = 64, height: int = 48) -> bytes:
    """An icon whose directory says ``width`` x ``height`` and whose one image is ``png``."""
    header = struct.pack("<HHH", 0, 1, 1)  # reserved, type 1 (icon), one image
    entry = struct.pack("<BBBBHHII", width, height, 0, 0, 1, 32, len(png), 6 + 16)
    return header + entry + png


def _tar_holding(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        member = tarfile.TarInfo(name)
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


FOREIGN_LOADS = {
    "pcx.JPEG": True,
    "pcx_cut.JPEG": False,  # FFmpeg reads it
    "ico.JPEG": True,
    "ico_holding_a_bomb.JPEG": False,  # 64 x 48 by its directory, its PNG 1200 x 1000
    "dds.JPEG": True,
    "tiff_g4.JPEG": True,
    "tiff_jpeg.JPEG": True,  # FFmpeg refuses it
    "tga.JPEG": True,  # FFmpeg refuses it
    "sgi_cut.JPEG": False,
    "jp2.JPEG": True,
    "jp2_cut.JPEG": False,
    "pdf.JPEG": False,  # a JPEG inside: FFmpeg reads it
    "tar.JPEG": False,  # a JPEG inside: FFmpeg reads it
    "hdf5.JPEG": False,  # Pillow's stub: a 0 x 0 image
    "png_bomb.JPEG": False,  # over the limit: FFmpeg reads it
}


def foreign_files(seed: int) -> dict[str, bytes]:
    picture = photo(seed)
    over_limit = Image.new("L", (1200, 1000), 90)  # 1.2 Mpx, over MAX_PIXELS
    jp2 = _encoded(picture, "JPEG2000")
    files = {
        "pcx.JPEG": _encoded(picture, "PCX"),
        "pcx_cut.JPEG": _encoded(picture, "PCX")[:-300],
        "ico.JPEG": _encoded(picture, "ICO", sizes=[(64, 48)]),
        "ico_holding_a_bomb.JPEG": _ico_holding(_encoded(over_limit, "PNG")),
        "dds.JPEG": _encoded(picture, "DDS"),
        "tiff_g4.JPEG": _encoded(picture.convert("1"), "TIFF", compression="group4"),
        "tiff_jpeg.JPEG": _encoded(picture, "TIFF", compression="jpeg"),
        "tga.JPEG": _encoded(picture, "TGA"),
        "sgi_cut.JPEG": _encoded(picture, "SGI", rle=True)[:-2000],
        "jp2.JPEG": jp2,
        "jp2_cut.JPEG": jp2[: len(jp2) // 2],
        "pdf.JPEG": _encoded(picture, "PDF"),
        "tar.JPEG": _tar_holding("picture.jpg", _jpeg_bytes(picture)),
        "hdf5.JPEG": b"\x89HDF\r\n\x1a\n" + bytes(200),  # its signature, then nothing
        "png_bomb.JPEG": _encoded(over_limit, "PNG"),
    }
    assert files.keys() == FOREIGN_LOADS.keys()
    return files


@pytest.fixture(scope="module")
def foreign_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``plain_tree``, its train and val both also holding the ``foreign_files``."""
    root = plain_tree(tmp_path_factory.mktemp("foreign"))
    for seed, split in enumerate(("train", "val")):
        for name, data in foreign_files(20 + seed).items():
            (root / split / "n00000001" / name).write_bytes(data)
    return root


def _ffmpeg_loads(path: Path) -> bool:
    """Whether FFmpeg alone (SPDL's demux and decode, the loader's options) decodes a file."""
    import spdl.io

    from loaderbench.imaging.spdl.decoders import FFMPEG_DECODER_OPTIONS

    config = spdl.io.decode_config(decoder_options=FFMPEG_DECODER_OPTIONS)
    try:
        packets = spdl.io.demux_image(path.read_bytes())
        frames = spdl.io.decode_packets(
            packets, filter_desc="format=pix_fmts=rgb24", decode_config=config
        )
        return spdl.io.to_torch(spdl.io.convert_frames(frames)).numel() > 0
    except Exception:
        return False


def test_the_foreign_files_are_what_they_say(foreign_root: Path, pixel_limit: int) -> None:
    """Pillow loads and refuses them as ``FOREIGN_LOADS`` says (the ICO's PNG as too large,
    by PIL's own check inside the file); FFmpeg alone disagrees on several, which is what the
    admission rule (``images.fast_jpeg``) must keep from deciding."""
    val = foreign_root / "val" / "n00000001"
    for name, loads in FOREIGN_LOADS.items():
        try:
            load_rgb(str(val / name))
            loaded = True
        except Exception:
            loaded = False
        assert loaded == loads, name
        assert fast_jpeg((val / name).read_bytes()) is None, name  # never a fast decoder's
    with pytest.raises(ImageTooLarge, match="ico_holding_a_bomb.JPEG"):
        load_rgb(str(val / "ico_holding_a_bomb.JPEG"))
    with pytest.raises(OSError, match="hdf5.JPEG is 0x0"):
        load_rgb(str(val / "hdf5.JPEG"))
    by_ffmpeg = {
        name for name, loads in FOREIGN_LOADS.items() if _ffmpeg_loads(val / name) != loads
    }
    assert {"pcx_cut.JPEG", "pdf.JPEG", "tar.JPEG", "tga.JPEG", "tiff_jpeg.JPEG"} <= by_ffmpeg


@pytest.mark.parametrize("split", ["val", "train"])
def test_every_reader_gives_pillows_verdict_on_other_formats(
    split: str,
    foreign_root: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    pixel_limit: int,
) -> None:
    """Every loader, store and spdl decoder loads the formats Pillow loads and skips the rest,
    each named once for Pillow's reason; val's pixels are the reference's (train's crops are
    drawn from each store's own image size, so only the verdicts are compared there)."""
    refused = {name for name, loads in FOREIGN_LOADS.items() if not loads}
    train = split == "train"
    reads = read_every_way(folder_index(foreign_root).split(split), train, tmp_path, caplog)
    assert_one_verdict(reads, refused, tolerance=None if train else 6.0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="nvjpeg decodes on a CUDA device")
def test_nvjpeg_gives_pillows_verdict_and_pixels(
    damaged_root: Path,
    foreign_root: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    pixel_limit: int,
) -> None:
    """The GPU's decoder opens files by the same rule: the damaged JPEGs and the other formats
    get the reference's verdicts, and what loads its pixels (nvJPEG's IDCT within the messy
    set's tolerance; YCCK and CMYK decoded by PIL)."""
    nvjpeg = [("spdl", {"decoder": "nvjpeg"})]
    for root, verdicts in ((damaged_root, DAMAGED), (foreign_root, FOREIGN_LOADS)):
        split = folder_index(root).val
        reads = read_every_way(split, False, tmp_path, caplog, [REFERENCE])
        reads |= read_every_way(split, False, tmp_path, caplog, nvjpeg, device="cuda")
        refused = {name for name, loads in verdicts.items() if not loads}
        names = [Path(p).name for p in split.paths if Path(p).name not in refused]
        assert_one_verdict(reads, refused, tolerance=6.0, names=names)
