"""One JPEG decode module for every loader: which backend, that each gives libjpeg-turbo's
pixels, that a region decode is exactly the same crop of a whole decode, and that the loaders
decoding only their crops' regions still give the crops of a whole decode."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from loaderbench.imaging import decode, decoded_by
from loaderbench.imaging.decode import BACKENDS, JpegBackend, cpu_batch, decode_pil
from loaderbench.imaging.plans import apply_plan
from loaderbench.imaging.spdl.decoders import TurboDecoder
from loaderbench.imaging.spdl.geometry import Geometry
from loaderbench.imaging.spdl.records import Opened, Sample
from loaderbench.imaging.transforms import resized_crop_images
from loaderbench.loaders import build_loader
from loaderbench.loaders.memmap.loader import store_batches
from tests.conftest import REPO, cpu_spec, folder_index

CPU = torch.device("cpu")
HAS_CUDA = torch.cuda.is_available()


def as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def photo_like(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Smooth colour gradients, noise and a hard-edged block: chroma edges that show any
    upsampling difference at a region's border."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([(xx * 3) % 256, (yy * 5) % 256, ((xx + yy) * 2) % 256], axis=-1)
    base = base + rng.integers(-25, 25, base.shape)
    base[height // 3 : 2 * height // 3, width // 4 : width // 2] = (250, 10, 30)
    return np.clip(base, 0, 255).astype(np.uint8)


def encode(image: Image.Image, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=88, **options)
    return buffer.getvalue()


def as_ycck(cmyk_jpeg: bytes) -> bytes:
    """A CMYK JPEG relabelled YCCK (Adobe APP14 transform 2): what Photoshop writes for CMYK.
    Pillow cannot write one; decoders then convert its components as YCC + K."""
    data = bytearray(cmyk_jpeg)
    at = data.find(b"\xff\xee")  # APP14: length (2), "Adobe", version, flags (4), transform
    assert at >= 0 and data[at + 4 : at + 9] == b"Adobe", "Pillow wrote no Adobe segment"
    data[at + 15] = 2
    return bytes(data)


# Odd sizes: the image does not end on an MCU boundary, so boxes at the right and bottom edges
# end inside a partial MCU.
HEIGHT, WIDTH = 101, 139


def jpeg_kinds() -> dict[str, bytes]:
    rgb = Image.fromarray(photo_like(HEIGHT, WIDTH))
    cmyk = encode(rgb.convert("CMYK"))
    kinds = {
        "420": encode(rgb, subsampling=2),
        "422": encode(rgb, subsampling=1),
        "444": encode(rgb, subsampling=0),
        "grey": encode(rgb.convert("L")),
        "cmyk": cmyk,
        "ycck": as_ycck(cmyk),
        "progressive": encode(rgb, subsampling=2, progressive=True),
        "restart-blocks": encode(rgb, subsampling=2, restart_marker_blocks=3),
        "restart-rows": encode(rgb, subsampling=0, restart_marker_rows=1),
        "progressive-restarts": encode(rgb, progressive=True, restart_marker_rows=2),
    }
    assert b"\xff\xdd" in kinds["restart-blocks"] and b"\xff\xdd" in kinds["restart-rows"]
    return kinds


KINDS = jpeg_kinds()


def boxes(height: int, width: int) -> list[tuple[int, int, int, int]]:
    """Boxes (top, left, h, w) touching each edge and corner, inside, one pixel, whole."""
    return [
        (0, 0, 17, 23),  # top-left corner
        (0, width - 31, 20, 31),  # top-right corner
        (height - 19, 0, 19, 40),  # bottom-left corner
        (height - 25, width - 37, 25, 37),  # bottom-right corner
        (0, 5, height, 50),  # top to bottom
        (7, 0, 33, width),  # left to right
        (13, 21, 41, 57),  # inside, at odd offsets
        (50, 77, 1, 1),  # one pixel
        (0, 0, height, width),  # the whole image
    ]


def loaded(name: str) -> JpegBackend:
    backend = BACKENDS[name]
    try:
        backend.load()
    except Exception as error:
        pytest.skip(f"{name} does not load here: {error}")
    return backend


def pil_reference(data: bytes) -> torch.Tensor:
    return decode_pil(as_tensor(data))


# ---------------------------------------------------------------------------------------------
# Every backend: Pillow's pixels, whole and by region.


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("name", list(BACKENDS))
def test_every_backend_decodes_every_kind_of_jpeg_to_pillows_pixels(name: str, kind: str) -> None:
    backend = loaded(name)
    (image,) = backend.decode([as_tensor(KINDS[kind])], CPU, [None])
    assert isinstance(image, torch.Tensor) and image.dtype == torch.uint8
    assert image.shape == (3, HEIGHT, WIDTH)
    assert torch.equal(image, pil_reference(KINDS[kind])), f"{name} on {kind}"


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("name", list(BACKENDS))
def test_a_region_is_exactly_that_crop_of_the_whole_image(name: str, kind: str) -> None:
    """Exact, at every edge: libjpeg-turbo's region decode starts at the iMCU before the box
    and upsamples chroma with the neighbours a whole decode uses (measured: max difference 0
    for every kind and box here)."""
    backend = loaded(name)
    data = as_tensor(KINDS[kind])
    whole = pil_reference(KINDS[kind])
    cases = boxes(HEIGHT, WIDTH)
    regions = backend.decode([data] * len(cases), CPU, cases)
    for (top, left, h, w), region in zip(cases, regions, strict=True):
        assert isinstance(region, torch.Tensor)
        expected = whole[:, top : top + h, left : left + w]
        assert region.shape == expected.shape, (name, kind, (top, left, h, w))
        assert torch.equal(region, expected), (name, kind, (top, left, h, w))


REGION_BACKENDS = [name for name, backend in BACKENDS.items() if backend.can.region]


@pytest.mark.parametrize("name", REGION_BACKENDS)
def test_a_region_backend_decodes_the_region_alone(name: str) -> None:
    """A backend that declares ``region`` decodes the box alone: its pixels come back in a
    buffer of the box's size, decoded by the backend itself, where a crop of a whole decode
    (every other backend's way, ``base.cut``) is a view into the whole image's buffer. So do
    the loaders' calls wherever the chosen backend decodes regions. How much a region saves
    is measured by the benchmark, not here: the report's "CPU region decode limit" row
    (``bench.limits.measure_region_decode_limit``: turbo-region against turbo-whole)."""
    backend = loaded(name)
    big = as_tensor(encode(Image.fromarray(photo_like(1200, 1600)), subsampling=2))
    box = (100, 1500, 64, 64)  # near the top right: most of the image lies outside it
    box_bytes, whole_bytes = 3 * 64 * 64, 3 * 1200 * 1600
    with decoded_by.counting() as counts:
        (region,) = backend.decode([big], CPU, [box])
    assert isinstance(region, torch.Tensor) and region.shape == (3, 64, 64)
    assert region.untyped_storage().nbytes() == box_bytes
    assert counts == {backend.counted_as(CPU): 1}  # not handed to PIL
    assert torch.equal(region, pil_reference(bytes(big.numpy()))[:, 100:164, 1500:1564])
    # The check tells the two apart: a crop of a whole decode holds the whole image.
    cut = decode.cut(decode_pil(big), box)
    assert isinstance(cut, torch.Tensor) and cut.untyped_storage().nbytes() == whole_bytes
    if decode.backend("cpu") == name:  # what the loaders call: decode_cpu with the box
        assert decode.region_decode("cpu")
        assert decode.decode_cpu(big, box).untyped_storage().nbytes() == box_bytes


def test_nvimgcodec_does_not_apply_exif_orientation() -> None:
    """Its default does; no loader here does (``loaderbench.imaging.files``)."""
    backend = loaded("nvimgcodec")
    pixels = photo_like(40, 70)
    exif = Image.Exif()
    exif[0x0112] = 6  # shown turned 90 degrees clockwise
    data = encode(Image.fromarray(pixels), exif=exif)
    (image,) = backend.decode([as_tensor(data)], CPU, [None])
    assert isinstance(image, torch.Tensor) and image.shape == (3, 40, 70)
    assert torch.equal(image, pil_reference(data))


def test_admitted_jpegs_skip_the_admission_parse_and_others_do_not() -> None:
    """A memmap jpeg store's own JPEGs are decoded ``admitted``: no header parse by the
    admission rule (``images.fast_jpeg``), which sends a file with an EXIF orientation tag to
    PIL; so such a file goes to PIL unadmitted, and to nvImageCodec admitted, with the same
    pixels (neither applies the orientation)."""
    loaded("nvimgcodec")
    exif = Image.Exif()
    exif[0x0112] = 6
    data = as_tensor(encode(Image.fromarray(photo_like(40, 70)), exif=exif))
    for admitted, library in ((False, "pil"), (True, "nvimgcodec:cpu")):
        with decoded_by.counting() as counts:
            (image,) = decode.decode_batch([data], CPU, [(4, 8, 16, 32)], admitted=admitted)
        assert counts == {library: 1}
        assert torch.equal(image, pil_reference(data.numpy().tobytes())[:, 4:20, 8:40])


def test_stray_bytes_between_header_segments_send_a_jpeg_to_pil() -> None:
    """libjpeg skips bytes where a marker should start ("extraneous bytes before marker") and
    decodes the image as if they were not there; nvJPEG reads such a file's pixels otherwise
    (the GPU check's damaged set, issue 36), so the admission rule sends it to PIL, the
    reference, in every loader. 0xFF fill bytes before a marker are the standard's, not
    stray."""
    from loaderbench.imaging.files import fast_jpeg, headers_contiguous

    good = KINDS["420"]
    scan = good.index(b"\xff\xda")
    tables = good.index(b"\xff\xc4")
    stray_before_scan = good[:scan] + b"\x12\x34\x56" + good[scan:]
    stray_before_tables = good[:tables] + b"\x00" + good[tables:]
    fill_bytes = good[:scan] + b"\xff\xff" + good[scan:]
    assert fast_jpeg(good) is not None and fast_jpeg(fill_bytes) is not None
    for data in (stray_before_scan, stray_before_tables):
        assert not headers_contiguous(data) and fast_jpeg(data) is None
        reference = pil_reference(data)
        assert torch.equal(reference, pil_reference(good))  # Pillow reads it whole
        with decoded_by.counting() as counts:
            (image,) = decode.decode_batch([as_tensor(data)], CPU)
        assert counts == {"pil": 1} and torch.equal(image, reference)


def test_a_box_outside_the_image_is_refused_naming_it() -> None:
    for name in BACKENDS:
        backend = loaded(name)
        with pytest.raises(ValueError, match=r"\(90, 0, 20, 10\) is not inside a 139x101 image"):
            backend.decode([as_tensor(KINDS["420"])], CPU, [(90, 0, 20, 10)])


@pytest.mark.parametrize("name", list(BACKENDS))
def test_a_bad_file_in_a_batch_fails_alone(name: str) -> None:
    backend = loaded(name)
    good = as_tensor(KINDS["420"])
    datas = [good, good[:300], as_tensor(b"\xff\xd8\xff" + b"x" * 50), good]
    results = backend.decode(datas, CPU, [None, None, None, (0, 0, 10, 10)])
    assert isinstance(results[1], BaseException) and isinstance(results[2], BaseException)
    assert isinstance(results[0], torch.Tensor) and results[0].shape == (3, HEIGHT, WIDTH)
    assert isinstance(results[3], torch.Tensor) and results[3].shape == (3, 10, 10)


def test_the_header_gives_size_and_exif_orientation() -> None:
    """The boxes are drawn from the header's size, before anything is decoded."""
    from loaderbench.imaging.files import jpeg_header

    array = np.zeros((30, 50, 3), dtype=np.uint8)
    for orientation in (None, 1, 3, 6, 8):
        exif = Image.Exif()
        if orientation is not None:
            exif[0x0112] = orientation
        header = jpeg_header(encode(Image.fromarray(array), exif=exif))
        assert header is not None and (header.width, header.height) == (50, 30)
        assert header.orientation == orientation


# ---------------------------------------------------------------------------------------------
# The choice of backend.


class MissingBackend(JpegBackend):
    """A backend whose library is not installed."""

    name = "missing"
    can = decode.Capabilities(frozenset({"cpu"}), batch=False, region=True)

    def load(self) -> None:
        import loaderbench_no_such_codec  # noqa: F401

    def decode_whole(self, datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        raise AssertionError("never loaded")


def test_a_missing_backend_is_passed_over_with_one_log_line_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backends = {"missing": MissingBackend(), **BACKENDS}
    with caplog.at_level("INFO", logger="loaderbench.imaging.decode"):
        name = decode.choose("cpu", backends)
    assert name == decode.choose("cpu", BACKENDS)
    (record,) = caplog.records
    assert "missing" in record.getMessage()
    assert "No module named 'loaderbench_no_such_codec'" in record.getMessage()


CHOICE_WITHOUT_NVIMGCODEC = """
import logging, sys
sys.modules["nvidia.nvimgcodec"] = None  # as if it were not installed
logging.basicConfig(level=logging.INFO, format="LOG %(name)s %(message)s")
from loaderbench.imaging import decode
print("CHOSEN", decode.backend("cpu"), decode.region_decode("cpu"))
print("CHOSEN", decode.backend("cpu"))  # chosen once per process
"""


@pytest.mark.slow
def test_without_nvimgcodec_the_cpu_decodes_with_the_next_backend_saying_why_once() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHOICE_WITHOUT_NVIMGCODEC],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=True,
    )
    chosen = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("CHOSEN")]
    assert chosen[0] == [
        decode.choose("cpu", {k: v for k, v in BACKENDS.items() if k != "nvimgcodec"}),
        "False",
    ]
    logs = [
        line
        for line in done.stderr.splitlines()
        if line.startswith("LOG loaderbench.imaging.decode")
    ]
    assert len(logs) == 1 and "nvimgcodec" in logs[0] and "ModuleNotFoundError" in logs[0], logs


def test_nvimgcodec_is_the_backend_where_it_loads() -> None:
    loaded("nvimgcodec")
    assert decode.backend() == "nvimgcodec" and decode.region_decode("cpu")


# ---------------------------------------------------------------------------------------------
# Batches.


def test_the_cpu_batch_decoder_decodes_regions_and_has_no_event() -> None:
    decoder = decode.batch_decoder(CPU)
    datas = [as_tensor(KINDS["420"]), as_tensor(KINDS["444"])]
    shapes, ready = decoder.run(
        datas, lambda images: [i.shape for i in images], [None, (1, 2, 3, 4)]
    )
    assert ready is None and shapes == [(3, HEIGHT, WIDTH), (3, 3, 4)]


@pytest.mark.skipif(HAS_CUDA, reason="checks the message without a GPU")
def test_nvjpeg_without_a_gpu_says_so() -> None:
    with pytest.raises(RuntimeError, match="no CUDA device"):
        decode.batch_decoder(torch.device("cuda"))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_the_gpu_decodes_a_batch_of_regions_like_the_cpu_under_a_busy_consumer() -> None:
    """One batched nvJPEG call with regions, again and again while the consumer's stream is
    busy and frees memory: the boxes of the CPU's decode, to within nvJPEG's IDCT and chroma
    upsampling (not libjpeg's: the spdl loader's nvjpeg tolerance), never corrupted."""
    cuda = torch.device("cuda")
    names = ["420", "444", "grey", "cmyk", "ycck", "progressive", "restart-rows"]
    datas = [as_tensor(KINDS[k]) for k in names]
    cases = [boxes(HEIGHT, WIDTH)[i % 9] for i in range(len(names))]
    expected = [decode.decode_cpu(data, box) for data, box in zip(datas, cases, strict=True)]
    decoder = decode.CudaJpegDecoder.for_device(cuda)
    assert decode.backend(cuda) in ("nvimgcodec", "torchcodec", "torchvision")

    def finish(images: list[decode.Decoded]) -> list[torch.Tensor]:
        assert all(isinstance(i, torch.Tensor) and i.is_cuda for i in images)
        return [i.flip(-1).flip(-1).contiguous() for i in images]  # type: ignore[union-attr]

    for _ in range(10):
        busy = torch.randn(4096, 4096, device=cuda)
        for _ in range(4):
            busy = busy @ busy / 64  # queued work that holds, then frees, memory
        del busy
        got, ready = decoder.run(datas, finish, cases)
        assert ready is not None
        decode.hand_over(ready, *got)
        for name, image, reference in zip(names, got, expected, strict=True):
            assert image.shape == reference.shape, name
            diff = (image.cpu().int() - reference.int()).abs().float()
            assert diff.mean() <= 2.0 and diff.flatten().quantile(0.99) <= 14, name


# ---------------------------------------------------------------------------------------------
# The loaders: only the region decoded, the same crops as a whole decode.


@pytest.fixture(scope="module")
def jpeg_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Photo-sized JPEGs of every kind the loaders decode themselves (4:2:0, 4:4:4, grey,
    CMYK, progressive, restart markers) in a train/val tree."""
    root = tmp_path_factory.mktemp("jpegs")
    kinds = [
        {"subsampling": 2},
        {"subsampling": 0},
        {"progressive": True},
        {"restart_marker_rows": 1},
    ]
    for split, count in (("train", 6), ("val", 3)):
        for label in range(2):
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True)
            for i in range(count):
                h, w = (375, 500) if i % 2 else (333, 250)
                image = Image.fromarray(photo_like(h, w, seed=17 * label + i))
                if i == 4:
                    image = image.convert("L")
                if i == 5:
                    image = image.convert("CMYK")
                (folder / f"{i}.JPEG").write_bytes(encode(image, **kinds[i % len(kinds)]))
    return root


def test_spdl_train_crops_are_the_crops_of_a_whole_decode(jpeg_root: Path) -> None:
    """spdl's turbo decoder decodes each image's box (alone, or cut from a whole decode in its
    batch path); the batch is exactly the plans run on whole decodes (the seeded boxes every
    loader draws)."""
    split = folder_index(jpeg_root).train
    spec = cpu_spec(split, True, loader="spdl", image_size=48, batch_size=4, num_workers=2)
    with build_loader(spec) as loader:
        loader.set_epoch(3)
        images = torch.cat([b.images for b in loader])
        stats = loader.stats()
    if cpu_batch.available():  # the batch path: whole decodes, each box cut and resized
        assert stats["jpeg_backend"] == cpu_batch.LIBRARY and not stats["region_decode"]
    else:
        assert stats["jpeg_backend"] == decode.backend("cpu")
        assert stats["region_decode"] is decode.region_decode("cpu")
    order = torch.cat(list(spec.epoch_batches(3)))
    sizes = [Image.open(split.paths[i]).size for i in order.tolist()]
    opened = [
        Opened(Sample(i, split.paths[i], 0, 3), h, w, None)
        for i, (w, h) in zip(order.tolist(), sizes, strict=True)
    ]
    plans = Geometry(48, train=True, seed=spec.seed).plans(opened)
    expected = torch.stack(
        [
            apply_plan(decode_pil(as_tensor(Path(o.sample.path).read_bytes())), plan)
            for o, plan in zip(opened, plans, strict=True)
        ]
    )
    assert images.shape == expected.shape
    assert torch.equal(images, expected)


def test_memmap_jpeg_store_train_crops_are_the_crops_of_a_whole_decode(
    jpeg_root: Path, tmp_path: Path
) -> None:
    """A jpeg store's train box is drawn in the stored image's coordinates and decoded alone;
    the batch equals the same boxes cut from whole decodes of the stored JPEGs."""
    from loaderbench.loaders.memmap._store_jpeg import JpegCache

    split = folder_index(jpeg_root).train
    spec = cpu_spec(
        split,
        True,
        loader="memmap",
        image_size=48,
        batch_size=4,
        num_workers=2,
        cache_dir=str(tmp_path),
        store="jpeg",
    )
    with build_loader(spec) as loader:
        loader.set_epoch(2)
        images = torch.cat([b.images for b in loader])
        stats = loader.stats()
        data = loader.cache.data
        assert isinstance(data, JpegCache)
        order = torch.cat(list(spec.epoch_batches(2)))
        stored = [
            decode_pil(data.data[start : start + length])
            for start, length in zip(
                data.offsets[order].tolist(), data.lengths[order].tolist(), strict=True
            )
        ]
        boxes_, flips = spec.random_crops(
            data.heights[order], data.widths[order], 2, order.tolist()
        )
    assert stats["jpeg_backend"] == decode.backend("cpu")
    assert stats["region_decode"] is decode.region_decode("cpu")
    expected = resized_crop_images(stored, boxes_, 48, flips).contiguous()
    assert torch.equal(images.contiguous(), expected)


def test_memmap_batched_jpeg_path_decodes_regions_like_the_threads(
    jpeg_root: Path, tmp_path: Path
) -> None:
    """The CUDA path (one batched call with regions), forced on the CPU, gives exactly the
    reading threads' batches."""
    split = folder_index(jpeg_root).train
    fields = dict(image_size=48, batch_size=4, num_workers=2, cache_dir=str(tmp_path))
    spec = cpu_spec(split, True, loader="memmap", store="jpeg", **fields)
    batches = []
    for batched in (False, True):
        with build_loader(spec) as loader:
            loader.batches = store_batches(  # type: ignore[attr-defined]
                loader.cache, loader.parts, loader.policy, on_device=batched
            )
            loader.set_epoch(1)
            batches.append(torch.cat([b.images for b in loader]))
    assert torch.equal(batches[0], batches[1])


def test_the_region_decode_limit_times_the_train_pipelines_own_crops(jpeg_root: Path) -> None:
    """bench.limits' region decode limit: the train job of image i is the spdl train
    pipeline's (the same seeded box, decoded alone, resized, flipped)."""
    from tools.bench.limits import measure_region_decode_limit, train_candidates

    split = folder_index(jpeg_root).train
    paths = list(split.paths)
    fns = train_candidates(48, paths)
    regions = {"turbo-region"} if decode.region_decode() else set()
    assert set(fns) == {"turbo-whole", *regions}
    decoder = TurboDecoder(Geometry(48, train=True, seed=0), CPU)
    for i in (0, 3, len(paths) - 1):
        opened = decoder.open(Sample(i, paths[i], 0, 0))
        expected = decoder.finish(opened, decoder.geometry.plans([opened])[0])
        for fn in fns.values():
            assert torch.equal(fn(paths[i]), expected)
    limit = measure_region_decode_limit(paths, 48, repeats=1, pool=False)
    assert limit.title == "CPU region decode limit" and limit.images_per_s > 0
    assert {rate.name for rate in limit.rates} == set(fns)
