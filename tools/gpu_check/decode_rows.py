"""The decoder table's rows (``decode_bench``): which decoders, and each one as a callable that
decodes a batch (each image's box where given) and waits until its pixels are there.

On a GPU a row's decode is waited for with ``torch.cuda.synchronize`` after each batch; on the
CPU (the dry run) the libraries' rows split a batch over the CPU's threads, and nvImageCodec's
CPU engine is given as many threads of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from loaderbench.imaging.decode import Box, Decoded

CHOICE = "loaders' choice"  # loaderbench.imaging.decode.decode_batch: what every loader calls
DECODE_BASELINE = "torchcodec"  # what the report's ratio column compares with
KINDS = ("full", "region")
NV_ENGINES = ("hardware", "cuda", "hybrid", "cpu")
LIBRARIES = ("torchcodec", "torchvision")
# The hardware engine's share of each batch, the CUDA decoder (GPU Huffman) taking the rest:
# DALI's hw_decoder_load (0.65 by default; 0.75 beat 1.0 on an A100).
SPLIT_LOADS = (0.9, 0.75, 0.65, 0.5)
ADAPTIVE = "split adaptive from 0.75 hardware + cuda"


def nv_label(engine: str, fancy: bool) -> str:
    return f"nvimgcodec {engine}" + ("" if fancy else " (no fancy)")


def split_label(load: float) -> str:
    return f"split {load:.2f} hardware + cuda"


def cases_for(device_type: str) -> list[tuple[str, str]]:
    """The rows, (decoder, what is decoded), in the order they run; the GPU engines' rows are
    there on the CPU too (``absent``), so the dry run walks every label."""
    rows = [(CHOICE, kind) for kind in KINDS]
    rows += [
        (nv_label(engine, fancy), kind)
        for engine in NV_ENGINES
        for fancy in (True, False)
        for kind in KINDS
    ]
    rows += [(library, kind) for library in LIBRARIES for kind in KINDS]
    if device_type == "cuda":
        rows += [(split_label(load), "full") for load in SPLIT_LOADS] + [(ADAPTIVE, "full")]
    return rows


DECODE_CASES = tuple(cases_for("cuda"))


class Unavailable(RuntimeError):
    """A library the row needs does not load here."""


class RowDecoder:
    """Decodes a batch and waits for it; ``region``: decodes only the box; ``counts``: the
    ``decoded_by`` counts of the loaders' choice since the last ``clear``."""

    region = False

    def __init__(self, device: torch.device, threads: int) -> None:
        import torch

        self.device = device
        self.counts: dict[str, int] = {}
        self._torch = torch
        cpu_threads = threads if device.type == "cpu" and threads > 1 else 0
        self._pool = ThreadPoolExecutor(cpu_threads) if cpu_threads else None
        self._threads = threads

    def __call__(self, datas: list[torch.Tensor], boxes: list[Box] | None) -> list[Decoded]:
        wanted: list[Box | None] = list(boxes) if boxes is not None else [None] * len(datas)
        if self._pool is None:
            images = self.decode(datas, wanted)
        else:
            step = -(-len(datas) // self._threads)
            starts = range(0, len(datas), step)
            parts = [(datas[i : i + step], wanted[i : i + step]) for i in starts]
            done = self._pool.map(lambda part: self.decode(*part), parts)
            images = [image for part in done for image in part]
        if self.device.type == "cuda":
            self._torch.cuda.synchronize(self.device)
        return images

    def decode(self, datas: list[torch.Tensor], boxes: Sequence[Box | None]) -> list[Decoded]:
        raise NotImplementedError

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()


class ChoiceRow(RowDecoder):
    """What the loaders call, counted by engine as a loader counts it."""

    def __init__(self, device: torch.device, threads: int) -> None:
        from loaderbench.imaging import decode

        super().__init__(device, threads)
        self.region = decode.region_decode(device)

    def decode(self, datas: list[torch.Tensor], boxes: Sequence[Box | None]) -> list[Decoded]:
        from loaderbench.imaging import decode, decoded_by

        with decoded_by.counting() as counts:
            images = decode.decode_batch(datas, self.device, boxes)
        decoded_by.add(self.counts, counts)  # dict updates are atomic enough under the GIL
        return images


class LibraryRow(RowDecoder):
    """TorchCodec's or torchvision.io's batched decode (whole images; a box is cut after)."""

    def __init__(self, name: str, device: torch.device, threads: int) -> None:
        from loaderbench.imaging import decode

        self.backend = decode.BACKENDS[name]
        try:
            self.backend.load()
        except Exception as error:  # ImportError, or OSError from a native library
            raise Unavailable(f"{type(error).__name__}: {error}".splitlines()[0]) from error
        super().__init__(device, threads)

    def decode(self, datas: list[torch.Tensor], boxes: Sequence[Box | None]) -> list[Decoded]:
        return self.backend.decode(datas, self.device, boxes)


class NvRow(RowDecoder):
    """One nvImageCodec decoder (an engine alone, or a split) called with the whole batch."""

    region = True

    def __init__(self, decoder: Any, nv: Any, device: torch.device, on_host: bool) -> None:
        super().__init__(device, 1)  # nvImageCodec's own threads, where it has any
        self.decoder, self.nv, self.on_host = decoder, nv, on_host
        self.params = nv.DecodeParams(
            apply_exif_orientation=False,
            color_spec=nv.ColorSpec.SRGB,
            allow_any_depth=False,
            sample_format=nv.SampleFormat.I_RGB,
        )

    def decode(self, datas: list[torch.Tensor], boxes: Sequence[Box | None]) -> list[Decoded]:
        import numpy as np

        torch, nv = self._torch, self.nv
        streams = []
        for data, box in zip(datas, boxes, strict=True):
            stream = nv.CodeStream(data.numpy())
            if box is not None:
                top, left, h, w = box
                stream = stream.get_sub_code_stream(region=nv.Region(top, left, top + h, left + w))
            streams.append(stream)
        if self.on_host:
            images = self.decoder.decode(streams, params=self.params)
        else:
            cuda_stream = torch.cuda.current_stream(self.device).cuda_stream
            images = self.decoder.decode(streams, params=self.params, cuda_stream=cuda_stream)
        out: list[Decoded] = []
        for image in images:
            if image is None:
                out.append(RuntimeError("refused by this decoder"))
            elif self.on_host:
                out.append(torch.from_numpy(np.asarray(image)).permute(2, 0, 1))
            else:
                out.append(torch.from_dlpack(image).permute(2, 0, 1))
        return out


def _nv_module() -> Any:
    from loaderbench.imaging import decode

    try:
        decode.BACKENDS["nvimgcodec"].load()  # quiet import, EXIF off: as the loaders load it
    except Exception as error:
        raise Unavailable(f"{type(error).__name__}: {error}".splitlines()[0]) from error
    from nvidia import nvimgcodec

    return nvimgcodec


def engine_row(engine_name: str, fancy: bool, device: torch.device, threads: int) -> NvRow:
    """An engine alone; the CPU engine gets the machine's threads (one batch call)."""
    from loaderbench.imaging.decode.engines import ENGINES, make_decoder

    nv, engine = _nv_module(), ENGINES[engine_name]
    if engine.device_type == "cpu":
        decoder = nv.Decoder(
            device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
            max_num_cpu_threads=threads,
            backends=[nv.Backend(nv.BackendKind.CPU_ONLY)],
            options=engine.option_string(fancy),
        )
        return NvRow(decoder, nv, device, on_host=True)
    if device.type != "cuda":
        raise RuntimeError("needs a CUDA device")
    return NvRow(make_decoder(nv, engine, device.index or 0, fancy), nv, device, on_host=False)


def split_row(load: float, adaptive: bool, device: torch.device) -> NvRow:
    """The hardware engine taking ``load`` of each batch (sized on the first call, the full
    batch's: ``time_rows`` warms up with one), the CUDA decoder with GPU Huffman the rest."""
    from loaderbench.imaging.decode.engines import ENGINES

    if device.type != "cuda":
        raise RuntimeError("needs a CUDA device")
    nv = _nv_module()
    policy = nv.LoadHintPolicy.ADAPTIVE_MINIMIZE_IDLE_TIME if adaptive else nv.LoadHintPolicy.FIXED
    decoder = nv.Decoder(
        device_id=device.index or 0,
        backends=[
            nv.Backend(nv.BackendKind.HW_GPU_ONLY, load_hint=load, load_hint_policy=policy),
            nv.Backend(nv.BackendKind.HYBRID_CPU_GPU),
        ],
        options=ENGINES["cuda"].option_string(),
    )
    return NvRow(decoder, nv, device, on_host=False)


def make_row_decoder(label: str, device: torch.device, threads: int) -> RowDecoder:
    """The decoder of a row's label (``cases_for``)."""
    if label == CHOICE:
        return ChoiceRow(device, threads)
    if label in LIBRARIES:
        return LibraryRow(label, device, threads)
    if label == ADAPTIVE:
        return split_row(0.75, True, device)
    for load in SPLIT_LOADS:
        if label == split_label(load):
            return split_row(load, False, device)
    for engine in NV_ENGINES:
        for fancy in (True, False):
            if label == nv_label(engine, fancy):
                return engine_row(engine, fancy, device, threads)
    raise ValueError(f"no decoder row named {label!r}")
