"""The benchmark report's store sections: memmap's stores projected to ImageNet, and beside
FFCV's (drawn from report.json alone, as the rest of ``tools.bench.render``)."""

from __future__ import annotations

from typing import Any

from loaderbench.platform.tables import markdown_table
from tools.bench.schema import CORES, FFCV_NAMES, Row, StoreRow


def fmt(value: Any, digits: int = 1) -> str:
    """A report cell: floats with ``digits`` decimals and thousands apart; "-" for None."""
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


def rate(row: Row) -> float:
    return row.images_per_s or 0.0


def store_lines(rows: list[StoreRow]) -> list[str]:
    """The memmap stores projected to ImageNet: one line a (pipeline, store)."""
    headers = ["split", "store", "bytes / image", "ImageNet store", "images/s"]
    cells = [
        [
            row.pipeline,
            row.store,
            f"{row.bytes_per_image:,.0f}",
            f"{row.imagenet_gb:,.1f} GB",
            f"{row.images_per_s:,.1f}" if row.images_per_s else "-",
            *(f"{row.build_minutes(c):.1f} min" for c in CORES),
        ]
        for row in rows
    ]
    return [
        "## The memmap stores, projected to ImageNet",
        "",
        "Bytes per image as stored here, times 1,281,167 train or 50,000 val images; build "
        "time from this machine's build rate per core (decode, resize, and for jpeg re-encode).",
        "",
        *markdown_table([*headers, *(f"build at {c} cores" for c in CORES)], cells).splitlines(),
        "",
    ]


def ffcv_store_lines(rows: list[Row], stores: list[StoreRow], workers: int) -> list[str]:
    """Each memmap store beside FFCV's of the same kind and split, at ``workers`` (the store
    runs' worker count): bytes per image, images/s, CPU; nothing without FFCV rows."""
    ffcv = {
        (r.pipeline, r.extra["store"]): r
        for r in rows
        if r.name in FFCV_NAMES.values() and r.workers == workers
    }
    pairs = [(s, ffcv[(s.pipeline, s.store)]) for s in stores if (s.pipeline, s.store) in ffcv]
    if not pairs:
        return []
    headers = [
        "split",
        "store",
        "bytes / image: memmap",
        "FFCV",
        "FFCV file",
        "images/s: memmap",
        "FFCV",
        "memmap / FFCV",
        "CPU s / 1k images: memmap",
        "FFCV",
    ]
    cells = []
    for ours, peer in pairs:
        faster = ours.images_per_s / rate(peer) if ours.images_per_s and rate(peer) else None
        cells.append(
            [
                ours.pipeline,
                f"{ours.store} / {peer.extra['write_mode']}",
                f"{ours.bytes_per_image:,.0f}",
                f"{peer.extra['payload_bytes_per_image']:,.0f}",
                f"{peer.extra['bytes_per_image']:,.0f}",
                fmt(ours.images_per_s),
                fmt(peer.images_per_s),
                f"{fmt(faster, 2)}{'x' if faster else ''}",
                fmt(ours.cpu_s_per_1k_images, 2),
                fmt(peer.cpu_s_per_1k_images, 2),
            ]
        )
    return [
        "",
        "## FFCV's stores beside memmap's",
        "",
        f"At {workers} workers. FFCV's stores are written at memmap's train store's long side "
        "and JPEG quality; their bytes are the images' own (pixels or JPEG), the file's add "
        "header and page padding. memmap's val stores hold the exact centre crops, FFCV's the "
        "shrunk whole image (cropped and resized at load).",
        "",
        *markdown_table(headers, cells).splitlines(),
    ]
