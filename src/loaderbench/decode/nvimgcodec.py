"""NVIDIA nvImageCodec (libjpeg-turbo on the CPU, nvJPEG on a GPU; the library DALI decodes
with): the only backend that decodes a region (libjpeg-turbo's ``jpeg_crop_scanline`` +
``jpeg_skip_scanlines``; nvJPEG's ROI decode on a GPU, batched), which keeps it first.

Its pixels are libjpeg-turbo's, identical to Pillow's for every kind of JPEG the loaders give
it, and a region's are identical to the same crop of a whole decode (tests/test_decode.py). It
is told not to apply EXIF orientation (its default does). YCCK JPEGs come out up to 1 grey
level off Pillow's colour conversion, so those go to PIL with every file that
``images.fast_jpeg`` keeps from the fast decoders (the loaders' one rule), as do the rare files
it refuses (PIL then says why, or decodes them). docs/decoding.md gives the measurements.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from loaderbench import decoded_by
from loaderbench.decode.base import Box, Capabilities, Decoded, JpegBackend, check_box
from loaderbench.decode.pil import decode_pil


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


# nvImageCodec's decoder options (docs.nvidia.com/cuda/nvimagecodec/codec_options.html: a
# space-separated list, ``:<option>=<value>`` for every decoder that knows the option,
# ``<decoder_id>:<option>=<value>`` for one). Fancy (interpolating) chroma upsampling is
# libjpeg's and so Pillow's: asked for explicitly, as some releases of the Python binding
# default to ``:fancy_upsampling=0``. nvImageCodec 0.9's nvJPEG decoders then refuse a region
# of a 4:2:0 or 4:2:2 JPEG with nvJPEG older than 13.2 ("ROI decode with fancy upsampling may
# produce wrong results on image edge (1 pixel wide) with nvJPEG < 13.2 ... set
# enable_roi_fancy_upsampling=1", libnvjpeg_ext.so 0.9.0), and every such train crop and val
# centre crop would go to Pillow on one thread: enabled for the CUDA and hardware decoders, a
# box's outermost pixel's chroma being the price (the resize to the model's size blends it).
FANCY_UPSAMPLING = ":fancy_upsampling=1"
NVJPEG_DECODER_IDS = ("nvjpeg_cuda_decoder", "nvjpeg_hw_decoder")


def nvimgcodec_options(device_type: str) -> str:
    """The options string of the nvImageCodec decoder made for this kind of device."""
    if device_type == "cpu":
        return FANCY_UPSAMPLING
    roi = [f"{decoder}:enable_roi_fancy_upsampling=1" for decoder in NVJPEG_DECODER_IDS]
    return " ".join([FANCY_UPSAMPLING, *roi])


class NvImageCodecBackend(JpegBackend):
    """nvImageCodec: a decoder per CPU thread (one thread of its own each), one per GPU."""

    name = "nvimgcodec"
    can = Capabilities(frozenset({"cpu", "cuda"}), batch=True, region=True)

    def __init__(self) -> None:
        self._module: Any = None
        self._params: Any = None
        self.import_notes: list[str] = []
        self._thread = threading.local()
        self._gpu_decoders: dict[int, Any] = {}
        self._lock = threading.Lock()
        # nvImageCodec documents that not all its types are thread safe: memmap's reading
        # threads share the device's decoder, so its decode calls take turns (each thread's
        # parsing, copies and crops still run side by side, on the thread's own stream).
        self._gpu_decode_lock = threading.Lock()

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

    def _decoder(self, device: torch.device) -> Any:
        nv = self._module
        if device.type == "cpu":
            decoder = getattr(self._thread, "decoder", None)
            if decoder is None:  # the calling thread is the parallelism: one thread each
                decoder = nv.Decoder(
                    device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
                    max_num_cpu_threads=1,
                    backends=[nv.Backend(nv.BackendKind.CPU_ONLY)],
                    options=nvimgcodec_options("cpu"),
                )
                self._thread.decoder = decoder
            return decoder
        index = device.index if device.index is not None else torch.cuda.current_device()
        with self._lock:
            if index not in self._gpu_decoders:
                # nvJPEG's hardware engine where the GPU has one, its CUDA decoder otherwise.
                self._gpu_decoders[index] = nv.Decoder(
                    device_id=index,
                    backends=[
                        nv.Backend(nv.BackendKind.HW_GPU_ONLY),
                        nv.Backend(nv.BackendKind.GPU_ONLY),
                        nv.Backend(nv.BackendKind.HYBRID_CPU_GPU),
                    ],
                    options=nvimgcodec_options("cuda"),
                )
            return self._gpu_decoders[index]

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
        streams, positions = [], []
        for i, (data, box) in enumerate(zip(datas, boxes, strict=True)):
            try:
                stream = self._code_stream(data, box, admitted)
            except RuntimeError as error:  # no JPEG header, a bad box: PIL says why, or reads it
                results[i] = self._with_pil(data, box, device, error)
                continue
            if stream is None:
                results[i] = self._with_pil(data, box, device, None)
                continue
            streams.append(stream)
            positions.append(i)
        if streams:
            images = self._run(streams, device)
            for i, image in zip(positions, images, strict=True):
                if image is None:  # nvImageCodec refused it: PIL says why, or reads it
                    results[i] = self._with_pil(datas[i], boxes[i], device, None)
                else:
                    results[i] = self._tensor(image, device)
            decoded_by.note(self.name, sum(image is not None for image in images))
        return results  # type: ignore[return-value]

    def _run(self, streams: list[Any], device: torch.device) -> list[Any]:
        """nvImageCodec's decode of code streams: an image each, None for one it refused."""
        decoder = self._decoder(device)
        if device.type == "cpu":  # one call a batch: as fast as one a stream, one GIL release
            return list(decoder.decode(streams, params=self._params))
        cuda_stream = torch.cuda.current_stream(device).cuda_stream
        with self._gpu_decode_lock:
            return list(decoder.decode(streams, params=self._params, cuda_stream=cuda_stream))

    def _code_stream(self, data: torch.Tensor, box: Box | None, admitted: bool = False) -> Any:
        """The JPEG's code stream (its headers parsed), cut to ``box``; None for a file that
        PIL decodes (``images.fast_jpeg``, the loaders' one rule: CMYK and YCCK, whose colours
        Pillow converts the reference way, among others), unless ``admitted``."""
        from loaderbench.images import fast_jpeg

        array = data.numpy()
        if not admitted and fast_jpeg(array) is None:
            return None
        nv = self._module
        stream = nv.CodeStream(array)
        if box is None or tuple(box) == (0, 0, stream.height, stream.width):
            return stream
        check_box(box, stream.height, stream.width)
        top, left, h, w = box
        return stream.get_sub_code_stream(region=nv.Region(top, left, top + h, left + w))

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
