"""NVIDIA nvImageCodec (libjpeg-turbo on the CPU, nvJPEG on a GPU; the library DALI decodes
with): the only backend that decodes a region, which keeps it first.

Its pixels are libjpeg-turbo's, Pillow's for every JPEG the loaders give it, and a region's are
the same crop of a whole decode (tests/test_decode.py). EXIF orientation is not applied. YCCK
JPEGs, and every file ``files.fast_jpeg`` keeps from the fast decoders, go to PIL, as do the
rare files it refuses. On a GPU each engine (``decode.engines``) is a decoder of its own, tried
in the order measured for the machine (``decode.engine_choice``). docs/decoding.md has the
measurements.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from loaderbench.imaging import decoded_by
from loaderbench.imaging.decode._base import Box, Capabilities, Decoded, JpegBackend, check_box
from loaderbench.imaging.decode._engine_choice import (
    EngineRate,
    rank,
    remembered_rates,
    sample_jpegs,
    time_engine,
)
from loaderbench.imaging.decode._pil import decode_pil
from loaderbench.imaging.decode.engines import ENGINES, Engine, engines_for, make_decoder, takes

# The package's logger, the name users filter decoding's lines by.
log = logging.getLogger(__package__)


@contextlib.contextmanager
def _stderr_captured() -> Iterator[list[str]]:
    """What native code writes to file descriptor 2 inside the block, kept out of the log.

    nvImageCodec prints a paragraph per missing optional library (nvJPEG, nvJPEG2000, nvTIFF)
    when it is imported, which on a CPU machine is every run; the text is kept as the reason
    to give if its GPU decode is then found not to work.
    """
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode(errors="replace")
            lines.extend(line.strip() for line in text.splitlines() if line.strip())


class NvImageCodecBackend(JpegBackend):
    """nvImageCodec: on the CPU a libjpeg-turbo decoder per thread (one thread of its own each);
    on a GPU a decoder per engine (``decode.engines``), in the order measured for this machine
    (``decode.engine_choice``), an image one engine cannot take retried on the next."""

    name = "nvimgcodec"
    can = Capabilities(frozenset({"cpu", "cuda"}), batch=True, region=True)

    def __init__(self) -> None:
        self._module: Any = None
        self._params: Any = None
        self.import_notes: list[str] = []
        self._thread = threading.local()
        self._gpu_chains: dict[int, list[tuple[Engine, Any]]] = {}
        self.gpu_rates: dict[int, list[EngineRate]] = {}  # each GPU's engine measurement
        self._lock = threading.Lock()
        # nvImageCodec documents that not all its types are thread safe: memmap's reading
        # threads share the device's decoders, so their decode calls take turns (each thread's
        # parsing, copies and crops still run side by side, on the thread's own stream).
        self._gpu_decode_lock = threading.Lock()
        self._warned: set[str] = set()

    def load(self) -> None:
        if self._module is not None:
            return
        # Its per-image errors (a truncated file) would go to stderr; they come back as a
        # failed image here, and PIL says why. PYNVIMGCODEC_VERBOSITY set by the user wins.
        os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
        with _stderr_captured() as notes:
            from nvidia import nvimgcodec
        self.import_notes = notes
        self._params = nvimgcodec.DecodeParams(
            apply_exif_orientation=False,  # its default applies it; no loader here does
            color_spec=nvimgcodec.ColorSpec.SRGB,
            allow_any_depth=False,
            sample_format=nvimgcodec.SampleFormat.I_RGB,
        )
        self._module = nvimgcodec

    def engine_key(self, engine: Engine) -> str:
        """How ``decoded_by`` counts this engine's images: ``nvimgcodec:<engine>``."""
        return f"{self.name}:{engine.name}"

    def counted_as(self, device: torch.device) -> str:
        return self.engine_key(self.chain(device)[0][0])

    def chain(self, device: torch.device) -> list[tuple[Engine, Any]]:
        """The engines that decode on ``device`` and their decoders, first tried first."""
        if device.type == "cpu":
            decoder = getattr(self._thread, "decoder", None)
            if decoder is None:
                decoder = make_decoder(self._module, ENGINES["cpu"], None)
                self._thread.decoder = decoder
            return [(ENGINES["cpu"], decoder)]
        index = device.index if device.index is not None else torch.cuda.current_device()
        with self._lock:
            if index not in self._gpu_chains:
                self._gpu_chains[index] = self._gpu_chain(index)
            return self._gpu_chains[index]

    def _gpu_chain(self, index: int) -> list[tuple[Engine, Any]]:
        """A decoder per engine this GPU has, ranked by the machine's remembered measurement
        (measured now where there is none)."""
        device = torch.device("cuda", index)
        decoders, errors = {}, {}
        for engine in engines_for("cuda"):
            try:
                decoders[engine.name] = make_decoder(self._module, engine, index)
            except Exception as error:  # RuntimeError: "Could not create decoder. Code: 7"
                errors[engine.name] = f"{type(error).__name__}: {error}".splitlines()[0]

        def measure() -> list[EngineRate]:
            return self._measure(device, decoders, errors)

        rates, _ = remembered_rates(torch.cuda.get_device_name(index), measure)
        self.gpu_rates[index] = rates
        order = [name for name in rank(rates) if name in decoders]
        if not order:
            raise RuntimeError(f"no nvImageCodec engine decodes on {device}: {errors}")
        return [(ENGINES[name], decoders[name]) for name in order]

    def _measure(
        self, device: torch.device, decoders: dict[str, Any], errors: dict[str, str]
    ) -> list[EngineRate]:
        """Each engine's rate on a batch of generated photo-sized JPEGs, alone on the GPU."""
        import numpy as np

        nv = self._module
        streams = [nv.CodeStream(np.frombuffer(data, np.uint8)) for data in sample_jpegs()]
        rates = []
        for engine in engines_for("cuda"):
            if engine.name not in decoders:
                error = errors[engine.name]
                rates.append(EngineRate(engine.name, engine.huffman, None, error=error))
                continue

            def once(engine: Engine = engine) -> int:
                images = self._decode_with(engine, decoders[engine.name], streams, device)
                torch.cuda.synchronize(device)
                return sum(image is not None for image in images)

            try:
                speed, cpu_ms = time_engine(once, len(streams))
                rates.append(EngineRate(engine.name, engine.huffman, speed, cpu_ms))
            except Exception as error:  # the engine stays out of the order, saying why
                reason = f"{type(error).__name__}: {error}".splitlines()[0]
                rates.append(EngineRate(engine.name, engine.huffman, None, error=reason))
        return rates

    def decode_whole(self, datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        results = self.decode(datas, device, [None] * len(datas))
        for result in results:
            if isinstance(result, BaseException):
                raise RuntimeError(str(result)) from result
        return results  # type: ignore[return-value]

    def decode(
        self,
        datas: Sequence[torch.Tensor],
        device: torch.device,
        boxes: Sequence[Box | None],
        *,
        admitted: bool = False,
    ) -> list[Decoded]:
        results: list[Decoded | None] = [None] * len(datas)
        streams, sequential, positions = [], [], []
        for i, (data, box) in enumerate(zip(datas, boxes, strict=True)):
            try:
                parsed = self._code_stream(data, box, admitted)
            except RuntimeError as error:  # no JPEG header, a bad box: PIL says why, or reads it
                results[i] = self._with_pil(data, box, device, error)
                continue
            if parsed is None:
                results[i] = self._with_pil(data, box, device, None)
                continue
            streams.append(parsed[0])
            sequential.append(parsed[1])
            positions.append(i)
        if streams:
            images = self._run(streams, sequential, device)
            for i, image in zip(positions, images, strict=True):
                if image is None:  # every engine refused it: PIL says why, or reads it
                    results[i] = self._with_pil(datas[i], boxes[i], device, None)
                else:
                    results[i] = self._tensor(image, device)
        return results  # type: ignore[return-value]

    def _run(self, streams: list[Any], sequential: list[bool], device: torch.device) -> list[Any]:
        """Each code stream decoded by the first engine of the chain that takes it (None where
        none does), counted by engine (``decoded_by``: ``nvimgcodec:<engine>``)."""
        images: list[Any] = [None] * len(streams)
        pending = list(range(len(streams)))
        chain = self.chain(device)
        for place, (engine, decoder) in enumerate(chain):
            todo = [i for i in pending if takes(engine, sequential[i])]
            if not todo:
                continue
            try:
                out = self._decode_with(engine, decoder, [streams[i] for i in todo], device)
            except RuntimeError as error:  # a whole batch failed (nvImageCodec#55: 0.9.0's GPU
                # ROI decode fails with INTERNAL_ERROR on some GPUs): its images go on
                self._warn_once(
                    f"failed-{engine.name}",
                    "JPEG decoding on %s: %s failed a batch (%s); its images go to the next "
                    "engine or to PIL, and are counted there",
                    device,
                    self.engine_key(engine),
                    f"{type(error).__name__}: {error}".splitlines()[0],
                )
                out = [None] * len(todo)
            for i, image in zip(todo, out, strict=True):
                images[i] = image
            done = sum(image is not None for image in out)
            decoded_by.note(self.engine_key(engine), done)
            if done and device.type == "cuda" and engine.huffman == "cpu":
                self._warn_cpu_huffman(device, chain[:place], engine, todo, sequential)
            pending = [i for i in pending if images[i] is None]
            if not pending:
                break
        return images

    def _decode_with(
        self, engine: Engine, decoder: Any, streams: list[Any], device: torch.device
    ) -> list[Any]:
        """One engine's decode of code streams: an image each, None for one it refused."""
        if device.type == "cpu":  # one call a batch: as fast as one a stream, one GIL release
            return list(decoder.decode(streams, params=self._params))
        cuda_stream = torch.cuda.current_stream(device).cuda_stream
        with self._gpu_decode_lock:
            return list(decoder.decode(streams, params=self._params, cuda_stream=cuda_stream))

    def _warn_cpu_huffman(
        self,
        device: torch.device,
        before: list[tuple[Engine, Any]],
        engine: Engine,
        todo: list[int],
        sequential: list[bool],
    ) -> None:
        """Once per cause: a CUDA run's images Huffman-decoded on the CPU, and why."""
        progressive = sum(not sequential[i] for i in todo)
        if not before:
            cause = "measured-first"
            why = (
                f"the measurement of this machine's engines ranked {engine.name} first "
                f"({self._rates_text(device)}); LOADERBENCH_DECODE_REFRESH=1 measures again"
            )
        elif progressive:
            cause = "progressive"
            why = "they are progressive JPEGs, which the GPU's Huffman decoders do not take"
        else:
            cause = "refused"
            names = ", ".join(e.name for e, _ in before)
            why = f"{names} refused them (nvImageCodec gives no reason)"
        self._warn_once(
            cause,
            "JPEG decoding on %s: images are Huffman-decoded on the CPU (%s): %s; counted as "
            "%s in loader_<split>_decoded_by",
            device,
            self.engine_key(engine),
            why,
            self.engine_key(engine),
        )

    def _warn_once(self, cause: str, message: str, *args: Any) -> None:
        if cause in self._warned:
            return
        self._warned.add(cause)
        log.warning(message, *args)

    def _rates_text(self, device: torch.device) -> str:
        rates = self.gpu_rates.get(device.index if device.index is not None else 0, [])
        return ", ".join(
            f"{r.engine} {r.images_per_s:,.0f}/s" if r.images_per_s else f"{r.engine}: {r.error}"
            for r in rates
        )

    def _code_stream(
        self, data: torch.Tensor, box: Box | None, admitted: bool = False
    ) -> tuple[Any, bool] | None:
        """The JPEG's code stream (its headers parsed), cut to ``box``, and whether it is
        sequential (baseline); None for a file that PIL decodes (``images.fast_jpeg``, the
        loaders' one rule: CMYK and YCCK, whose colours Pillow converts the reference way,
        among others), unless ``admitted`` (a memmap jpeg store's baseline JPEGs)."""
        from loaderbench.imaging.files import fast_jpeg

        array = data.numpy()
        sequential = True
        if not admitted:
            header = fast_jpeg(array)
            if header is None:
                return None
            sequential = header.sequential
        nv = self._module
        stream = nv.CodeStream(array)
        if box is None or tuple(box) == (0, 0, stream.height, stream.width):
            return stream, sequential
        check_box(box, stream.height, stream.width)
        top, left, h, w = box
        region = nv.Region(top, left, top + h, left + w)
        return stream.get_sub_code_stream(region=region), sequential

    @staticmethod
    def _tensor(image: Any, device: torch.device) -> torch.Tensor:
        """CHW view of an HWC image; it keeps nvImageCodec's buffer alive."""
        if device.type == "cpu":
            import numpy as np

            return torch.from_numpy(np.asarray(image)).permute(2, 0, 1)
        return torch.from_dlpack(image).permute(2, 0, 1)

    @staticmethod
    def _with_pil(
        data: torch.Tensor, box: Box | None, device: torch.device, error: BaseException | None
    ) -> Decoded:
        try:
            return decode_pil(data, box).to(device)
        except OSError as pil_error:
            reason = f"nvImageCodec: {error}; PIL: {pil_error}" if error else str(pil_error)
            return OSError(reason)
