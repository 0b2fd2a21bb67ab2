"""The decoder table (``python -m tools.gpu_check decode ROOT --out JSON --device cuda``; the dry
run: ``--device cpu`` or ``--dry-run``): the synthetic set's train JPEGs decoded in batches by
the loaders' choice (``decode.decode_batch``, with its ``decoded_by`` counts), each
nvImageCodec engine alone (with and without fancy upsampling), TorchCodec's and
torchvision.io's batched decode, and the hardware engine and the CUDA decoder sharing each batch
(DALI's ``hw_decoder_load``; nvImageCodec's adaptive policy). Whole images and each train crop's
box, in images/s, CPU ms per image and |difference| from Pillow's pixels. Rows are
``decode_rows``; the markdown section is ``decode_table``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loaderbench.measure.metrics import DECODED_BY, IMAGES_PER_S
from tools.gpu_check.decode_rows import (
    CHOICE,
    DECODE_BASELINE,
    DECODE_CASES,
    RowDecoder,
    Unavailable,
    cases_for,
    make_row_decoder,
)

if TYPE_CHECKING:  # torch and the decoders load when the phase runs, not on import
    import torch

    from loaderbench.imaging.decode import Box, Decoded

__all__ = [
    "CHOICE",
    "DECODE_BASELINE",
    "DECODE_CASES",
    "DecodeSet",
    "decode_benchmark",
    "decode_exit_code",
]

# Images whose pixels are compared with Pillow's (its decode is the slow part).
AGREEMENT_IMAGES = 64


@dataclass
class DecodeSet:
    """The encoded images (in memory, so no file reads are timed) and their train crop boxes."""

    datas: list[torch.Tensor]  # uint8, 1-D
    boxes: list[Box]
    megapixels: float  # mean image size

    @classmethod
    def load(cls, root: Path, limit: int, seed: int = 0) -> DecodeSet:
        import torch

        from loaderbench.imaging.files import jpeg_header
        from loaderbench.imaging.transforms import seeded_crops

        paths = sorted((root / "train").rglob("*.JPEG"))[:limit]
        if not paths:
            raise FileNotFoundError(f"no train JPEGs under {root / 'train'}")
        datas, heights, widths = [], [], []
        for path in paths:
            raw = path.read_bytes()
            header = jpeg_header(raw)
            if header is None:
                raise ValueError(f"{path}: no JPEG frame header")
            datas.append(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
            heights.append(header.height)
            widths.append(header.width)
        boxes, _ = seeded_crops(heights, widths, seed, 0, range(len(paths)))
        mean_px = sum(h * w for h, w in zip(heights, widths, strict=True)) / len(paths)
        return cls(datas, [tuple(map(int, box)) for box in boxes.tolist()], mean_px / 1e6)

    def batches(self, size: int) -> list[tuple[list[torch.Tensor], list[Box]]]:
        return [
            (self.datas[i : i + size], self.boxes[i : i + size])
            for i in range(0, len(self.datas), size)
        ]


def _failures(images: list[Decoded]) -> list[str]:
    return [f"{type(i).__name__}: {i}" for i in images if isinstance(i, BaseException)]


def time_rows(
    decoder: RowDecoder, data: DecodeSet, region: bool, batch: int, seconds: float
) -> dict[str, Any]:
    """One row's figures: a warm-up batch of the full size (it sizes nvImageCodec's fixed
    shares), then the set's batches in order, round and round, until at least ``seconds``
    have passed and the set was decoded at least once, each batch waited for."""
    batches = data.batches(batch)
    warm_datas, warm_boxes = batches[0]
    decoder(warm_datas, warm_boxes if region else None)
    failed: list[str] = []
    images = passes = 0
    decoder.counts.clear()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while passes == 0 or time.perf_counter() - wall0 < seconds:
        for datas, boxes in batches:
            out = decoder(datas, boxes if region else None)
            if passes == 0:  # the same images fail again on later passes
                failed += _failures(out)
            images += len(datas)
        passes += 1
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {
        "images": images,
        "passes": passes,
        "seconds": round(wall, 4),
        IMAGES_PER_S: images / wall,
        "source_mpx_per_s": images * data.megapixels / wall,
        "cpu_ms_per_image": 1000 * cpu / images,
        "failed_images": len(failed),
        "first_failure": failed[0] if failed else "",
        **({DECODED_BY: dict(decoder.counts)} if decoder.counts else {}),
    }


def pillow_difference(
    decoder: RowDecoder, data: DecodeSet, region: bool, reference: list[torch.Tensor]
) -> dict[str, Any]:
    """Max and mean |difference| from Pillow's pixels (its whole decode, cut to the box for a
    region) over the set's first images."""
    from loaderbench.imaging.decode import cut

    n = len(reference)
    boxes = data.boxes[:n] if region else [None] * n
    images = decoder(data.datas[:n], data.boxes[:n] if region else None)
    worst, total, count = 0, 0.0, 0
    for image, pil, box in zip(images, reference, boxes, strict=True):
        if isinstance(image, BaseException):
            continue
        expected = cut(pil, box)
        if tuple(image.shape) != tuple(expected.shape):
            return {"pillow_error": f"shape {tuple(image.shape)}, not {tuple(expected.shape)}"}
        diff = (image.cpu().int() - expected.int()).abs()
        worst = max(worst, int(diff.max()))
        total += float(diff.double().sum())
        count += diff.numel()
    if not count:
        return {"pillow_error": "no image decoded"}
    return {"max_abs_vs_pillow": worst, "mean_abs_vs_pillow": total / count}


def decode_row(
    label: str,
    kind: str,
    make: Callable[[], RowDecoder],
    data: DecodeSet,
    batch: int,
    seconds: float,
    reference: list[torch.Tensor],
) -> dict[str, Any]:
    """One row: the figures, or why there are none (``absent``: the engine does not exist on
    this device; ``unavailable``: the library is missing; ``failed``: it raised)."""
    row: dict[str, Any] = {"library": label, "kind": kind}
    try:
        decoder = make()
    except (ModuleNotFoundError, Unavailable) as error:
        return row | {"status": "unavailable", "error": f"{type(error).__name__}: {error}"}
    except Exception as error:  # RuntimeError: no such engine here ("Code: 7"), no CUDA
        reason = f"{type(error).__name__}: {error}".splitlines()[0]
        return row | {"status": "absent", "error": reason}
    region = kind == "region"
    row["region_decoded"] = region and decoder.region
    try:
        row |= time_rows(decoder, data, region, batch, seconds)
        row |= pillow_difference(decoder, data, region, reference)
        row["status"] = "failed" if row["failed_images"] else "ok"
    except Exception as error:  # the row says why; the other rows still run
        row |= {"status": "failed", "error": f"{type(error).__name__}: {error}"}
    finally:
        decoder.close()
    print(f"decode {label} {kind}: {row['status']}, {row.get(IMAGES_PER_S, 0):,.0f} img/s")
    return row


def decode_benchmark(
    root: Path,
    device_name: str,
    batch: int,
    limit: int,
    seconds: float,
    save: Callable[[dict[str, Any]], None] = lambda result: None,
) -> dict[str, Any]:
    """Every row of ``cases_for(device)``; ``save`` gets the result after every row, so that a
    library crashing the process leaves the rows before it."""
    import os

    import torch

    from loaderbench.imaging import decode
    from loaderbench.imaging.decode import decode_pil

    result: dict[str, Any] = {"device": device_name, "batch": batch, "seconds": seconds}
    if device_name == "cuda" and not torch.cuda.is_available():
        result["skipped"] = "no CUDA"
        save(result)
        return result
    device = torch.device(device_name, 0) if device_name == "cuda" else torch.device("cpu")
    threads = os.cpu_count() or 1
    data = DecodeSet.load(root, limit)
    try:
        choice = decode.backend(device)
        engines = _engine_order(device)
    except RuntimeError as error:  # no backend works there: the rows say why
        choice, engines = f"none ({error})", []
    result |= {
        "images": len(data.datas),
        "mean_megapixels": data.megapixels,
        "mean_kept_fraction": sum(h * w for _, _, h, w in data.boxes)
        / (data.megapixels * 1e6 * len(data.boxes)),
        "threads": threads,
        "loaders_choose": choice,
        "engine_order": engines,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }
    reference = [decode_pil(d) for d in data.datas[:AGREEMENT_IMAGES]]
    result["cases"] = []
    for label, kind in cases_for(device.type):
        save(result)

        def make(label: str = label) -> RowDecoder:
            return make_row_decoder(label, device, threads)

        result["cases"].append(decode_row(label, kind, make, data, batch, seconds, reference))
    save(result)
    return result


def _engine_order(device: torch.device) -> list[str]:
    """The loaders' nvImageCodec engines on ``device``, first tried first (empty where the
    loaders decode with another library)."""
    from loaderbench.imaging import decode

    backend = decode.chosen(device)
    chain = getattr(backend, "chain", None)
    return [engine.name for engine, _ in chain(device)] if chain else []


def decode_exit_code(result: dict[str, Any]) -> int:
    """0 when every row ran clean and the loaders' choice decoded; an engine this device does
    not have (``absent``) is allowed, a missing library only on the CPU (the dry run)."""
    if result.get("skipped"):
        return 0
    allowed = {"ok", "absent"} if result["device"] == "cuda" else {"ok", "absent", "unavailable"}
    cases = result.get("cases", [])
    expected = cases_for(result["device"])
    ran = [(c["library"], c["kind"]) for c in cases] == expected
    choice_ok = all(c.get("status") == "ok" for c in cases if c["library"] == CHOICE)
    return 0 if ran and choice_ok and all(c.get("status") in allowed for c in cases) else 1
