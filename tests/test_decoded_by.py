"""What decoded every image (issue 29, B10 and B11): every loader's ``decoded_by`` sums to the
images it delivered, a fallback to Pillow is counted (and above 1% said in the log), the
nvImageCodec decoders get the options that let nvJPEG decode regions, and the backend probe
refuses a backend whose region decode comes back empty."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from loaderbench.imaging import decode, decoded_by
from loaderbench.imaging.decode import Engine, NvImageCodecBackend, PilBackend, cpu_batch
from loaderbench.loaders import build_loader, file_loader_names
from tests.conftest import (
    cpu_spec,
    folder_index,
    loader_folders,
    loader_variants,
    run_entry,
    single_run,
)
from tests.helpers import photo

CPU = torch.device("cpu")
HAS_CUDA = torch.cuda.is_available()
PLAIN = 6  # plain RGB JPEGs per split
ODD = ("png_named.JPEG", "cmyk.JPEG")  # readable, but Pillow's to decode in every loader
BROKEN = ("truncated.JPEG", "text.JPEG")
# Every loader in the registry, each way it runs on the CPU (the contract's matrix); memmap's
# jpeg store keeps val as JPEG here too, so that val is decoded per batch as train is.
READERS = [
    (name, {**options, "val_store": "jpeg"} if options.get("store") == "jpeg" else options)
    for name, options in loader_variants(file_loader_names())
]


SMALL = (64, 48)  # the test images' width and height


@pytest.fixture(scope="module")
def mixed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Train and val: plain JPEGs, a PNG named .JPEG, a CMYK JPEG and two unreadable files."""
    root = tmp_path_factory.mktemp("decoded_by")
    for split in ("train", "val"):
        folder = root / split / "n00000001"
        folder.mkdir(parents=True)
        for i in range(PLAIN):
            photo(i, SMALL).save(folder / f"plain_{i}.JPEG", quality=90)
        photo(10, SMALL).save(folder / "png_named.JPEG", format="PNG")
        photo(11, SMALL).convert("CMYK").save(folder / "cmyk.JPEG", quality=90)
        buffer = io.BytesIO()
        photo(12, SMALL).save(buffer, format="JPEG", quality=90)
        (folder / "truncated.JPEG").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 3])
        (folder / "text.JPEG").write_text("not an image\n")
    return root


def read_split(
    root: Path, train: bool, loader: str, options: dict[str, Any], tmp_path: Path
) -> tuple[int, dict[str, Any]]:
    """Images delivered over two epochs and the loader's stats, worker processes or threads
    decoding (num_workers=2)."""
    split = folder_index(root).train if train else folder_index(root).val
    own = loader_folders(loader, tmp_path)
    spec = cpu_spec(
        split, train, loader=loader, image_size=32, batch_size=3, num_workers=2, **own, **options
    )
    delivered = 0
    with build_loader(spec) as built:
        for epoch in range(2):
            built.set_epoch(epoch)
            delivered += sum(len(batch.labels) for batch in built)
        stats = built.stats()
    return delivered, stats


@pytest.mark.parametrize("train", [False, True], ids=["val", "train"])
@pytest.mark.parametrize(("loader", "options"), READERS)
def test_decoded_by_sums_to_the_images_decoded(
    mixed_root: Path, loader: str, options: dict[str, Any], train: bool, tmp_path: Path
) -> None:
    delivered, stats = read_split(mixed_root, train, loader, options, tmp_path)
    counts = stats["decoded_by"]
    assert stats["skipped_files"] == len(BROKEN)
    readable = PLAIN + len(ODD)
    if loader == "memmap":
        # What made the store: the build decoded every readable source once, with Pillow.
        assert stats["cache_decoded_by"] == {"pil": readable}
    if loader == "memmap" and stats["cache_store"] == "raw":  # val's store is raw by default
        # This run built the cache: the build's decodes are its own; a later run served from
        # the same cache decodes nothing.
        assert counts == {"pil": readable} and stats["cache_built"]
        _, again = read_split(mixed_root, train, loader, options, tmp_path)
        assert not again["cache_built"] and again["decoded_by"] == {}
        assert again["cache_decoded_by"] == {"pil": readable}
        return
    assert sum(counts.values()) == delivered > 0, counts
    # What decodes is each loader's own: the libraries expected of the three known here (a
    # loader added later is held to the sum above).
    if loader == "torchvision":
        assert set(counts) == {"pil"}
    elif loader == "memmap":  # every stored image re-encoded as a plain RGB JPEG
        assert set(counts) == {decode.counted_as("cpu")}
    elif loader == "spdl":
        # The PNG and the CMYK JPEG are Pillow's in every loader: a fallback, counted.
        ffmpeg = options["decoder"] == "ffmpeg"
        # turbo's batch path decodes with torchvision's libjpeg-turbo (``decode.cpu_batch``).
        batched = cpu_batch.available()
        turbo = cpu_batch.LIBRARY if batched else decode.backend("cpu")
        assert stats["jpeg_backend"] == ("ffmpeg" if ffmpeg else turbo)
        # nvImageCodec's count names its engine too.
        own = "ffmpeg" if ffmpeg else (cpu_batch.LIBRARY if batched else decode.counted_as("cpu"))
        assert counts["pil"] > 0 and counts[own] > counts["pil"]
        assert set(counts) == {"pil", own}


def test_a_fallback_over_one_percent_is_a_warning_naming_the_library() -> None:
    warning = decoded_by.fallback_warning("val", {"nvimgcodec:cpu": 95, "pil": 5}, "nvimgcodec")
    assert warning is not None and "pil 5 (5.0%)" in warning and "nvimgcodec" in warning
    # Every engine of nvImageCodec's is its own: not a fallback.
    engines = {"nvimgcodec:hardware": 60, "nvimgcodec:hybrid": 39, "pil": 1}
    assert decoded_by.fallback_warning("val", engines, "nvimgcodec") is None
    assert (
        decoded_by.fallback_warning("val", {"nvimgcodec:cpu": 99, "pil": 1}, "nvimgcodec") is None
    )
    assert decoded_by.fallback_warning("val", {"pil": 40}, "pil") is None
    assert decoded_by.fallback_warning("val", {}, "nvimgcodec") is None


def test_counts_stay_in_their_scope() -> None:
    data = torch.frombuffer(bytearray(_jpeg(photo(0, SMALL))), dtype=torch.uint8)
    decode.decode_cpu(data)  # outside any scope: counted nowhere, no error
    with decoded_by.counting() as outer:
        with decoded_by.counting() as inner:
            decode.decode_cpu(data)
        with decoded_by.not_counted():
            decode.decode_cpu(data)
    assert inner == {decode.counted_as("cpu"): 1}
    assert outer == inner


@pytest.mark.slow
def test_eval_reports_decoded_by_and_warns_of_the_fallback(
    mixed_root: Path, tmp_path: Path
) -> None:
    """eval.py with spdl turbo: 2 of 8 readable val images (PNG, CMYK) decoded by Pillow, over
    the 1% line; metrics.json and the W&B summary keep the counts."""
    proc = run_entry(
        "eval.py",
        "model=none",
        "loader=spdl",
        f"dataset.root={mixed_root}",
        "loader.batch_size=4",
        "loader.num_workers=1",
        "image_size=32",
        cwd=tmp_path,
    )
    run_dir, metrics = single_run(tmp_path, "eval")
    counts = metrics["loader_val_decoded_by"]
    assert sum(counts.values()) == metrics["images"] == metrics["passes"] * (PLAIN + len(ODD))
    assert counts["pil"] == len(ODD) * metrics["passes"]
    log = proc.stderr + proc.stdout
    assert f"fell back to pil {2 * metrics['passes']} (25.0%)" in log, log[-3000:]
    from tests.wandb_offline import offline_runs

    (wandb_run,) = offline_runs(run_dir)
    assert wandb_run.summary["loader_val_decoded_by"] == counts
    json.dumps(counts)  # plain JSON in metrics.json


def _jpeg(image: Image.Image, subsampling: int = 2) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, subsampling=subsampling)  # 2: 4:2:0
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------
# B10: nvImageCodec's options, and a probe that sees a refused region.


def test_the_nvjpeg_decoders_are_asked_for_regions_with_fancy_upsampling() -> None:
    # docs.nvidia.com/cuda/nvimagecodec/codec_options.html: ":<option>=<value>" for any decoder,
    # "<decoder_id>:<option>=<value>" for one; the ids and the options as nvImageCodec 0.9
    # names them (libnvjpeg_ext.so).
    for name in ("hardware", "cuda", "hybrid"):
        options = decode.ENGINES[name].option_string().split()
        assert ":fancy_upsampling=1" in options
        assert "nvjpeg_cuda_decoder:enable_roi_fancy_upsampling=1" in options
        assert "nvjpeg_hw_decoder:enable_roi_fancy_upsampling=1" in options
    # Where each pins the Huffman decode: on the GPU for every image, on the CPU for every one.
    assert "nvjpeg_cuda_decoder:hybrid_huffman_threshold=0" in decode.ENGINES["cuda"].options
    (hybrid,) = [o for o in decode.ENGINES["hybrid"].options if "hybrid_huffman_threshold" in o]
    assert int(hybrid.split("=")[1]) > 10**9  # above any image's pixels
    assert decode.ENGINES["cpu"].option_string() == ":fancy_upsampling=1"  # libjpeg's = Pillow's


class RegionRefusing(NvImageCodecBackend):
    """The real nvImageCodec (on the CPU here) answering as nvJPEG older than 13.2 does without
    ``enable_roi_fancy_upsampling``: no image (None) for a region of a 4:2:0 or 4:2:2 JPEG."""

    name = "region_refusing"

    def _decode_with(
        self, engine: Engine, decoder: Any, streams: list[Any], device: torch.device
    ) -> list[Any]:
        nv = self._module
        chroma = (nv.ChromaSubsampling.CSS_420, nv.ChromaSubsampling.CSS_422)
        images = super()._decode_with(engine, decoder, streams, device)
        return [
            None if stream.view is not None and stream.chroma_subsampling in chroma else image
            for stream, image in zip(streams, images, strict=True)
        ]


def test_a_region_decode_that_comes_back_empty_fails_the_probe(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusing = RegionRefusing()
    refusing.load()
    # Its region decodes fall back to Pillow: the right shape, so only the count tells.
    data = torch.frombuffer(bytearray(_jpeg(photo(1, SMALL))), dtype=torch.uint8)
    with decoded_by.counting() as counts:
        images = refusing.decode([data, data], CPU, [None, (8, 8, 16, 16)])
    assert [tuple(i.shape) for i in images] == [(3, 48, 64), (3, 16, 16)]
    assert counts == {"region_refusing:cpu": 1, "pil": 1}
    with caplog.at_level("WARNING", logger="loaderbench.imaging.decode"):
        name = decode.choose("cpu", {"region_refusing": refusing, "pil": PilBackend()})
    assert name == "pil"
    assert "region_refusing does not work here" in caplog.text
    assert "fell back to pil" in caplog.text
    # The real backend, with its options, still passes on the CPU.
    assert decode.choose("cpu", {"nvimgcodec": NvImageCodecBackend()}) == "nvimgcodec"


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (nvJPEG)")
def test_nvjpeg_decodes_regions_of_subsampled_jpegs_itself() -> None:
    """On the GPU, with the options: a region of a 4:2:0 and of a 4:2:2 JPEG decoded by
    nvImageCodec, not handed to Pillow; the probe picks nvImageCodec."""
    device = torch.device("cuda", torch.cuda.current_device())
    assert decode.backend(device) == "nvimgcodec"
    for subsampling in (2, 1):  # 4:2:0, 4:2:2
        data = torch.frombuffer(bytearray(_jpeg(photo(2, SMALL), subsampling)), dtype=torch.uint8)
        with decoded_by.counting() as counts:
            (image,) = decode.decode_batch([data], device, [(8, 8, 16, 24)])
        assert not isinstance(image, BaseException) and tuple(image.shape) == (3, 16, 24)
        # The GPU's engines, not the CPU's Huffman decode nor Pillow.
        assert image.is_cuda and sum(counts.values()) == 1, counts
        assert set(counts) <= {"nvimgcodec:hardware", "nvimgcodec:cuda"}, counts
        reference = decode.decode_pil(data, (8, 8, 16, 24)).to(device)
        # Fancy upsampling, as Pillow's; the box's outermost pixel's chroma may differ.
        inner = (image.int() - reference.int())[:, 1:-1, 1:-1].abs()
        assert inner.float().mean() <= 2.0


def test_sweep_summaries_and_the_report_say_what_decoded() -> None:
    from loaderbench.measure.metrics import summary_keys
    from tools.bench.measure import row_note

    metrics = {"loader_val_decoded_by": {"pil": 2, "nvimgcodec": 6}}
    assert decoded_by.summary_text(metrics) == "val: nvimgcodec 6, pil 2"
    assert decoded_by.summary_text({"images": 3}) is None
    assert "decoded_by" in summary_keys()  # a summary.csv column
    run = {"status": "ok", "decoded_by": "val: nvimgcodec 6, pil 2"}
    assert row_note(run) == "decoded by val: nvimgcodec 6, pil 2"
    assert row_note({"status": "failed", "error": "boom"}) == "failed: boom"
