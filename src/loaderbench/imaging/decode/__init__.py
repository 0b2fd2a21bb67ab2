"""JPEG decoding for every loader: one small interface, backends chosen per device by a registry.

* ``base``: the interface a backend implements (``JpegBackend``) and what it can do
  (``Capabilities``: devices, batch, region, scale);
* ``nvimgcodec``, ``torchcodec``, ``torchvision``, ``pil``: the four backends, in that order of
  preference (nvImageCodec is the only one that decodes just a box of the image);
* ``engines``: nvImageCodec's engines (hardware JPEG engine, CUDA with GPU or CPU Huffman,
  libjpeg-turbo), a decoder each; ``engine_choice``: their order on a GPU, measured once per
  machine and remembered;
* ``choice``: the registry (``BACKENDS``), the choice per kind of device (``backend``,
  ``region_decode``) and the calls that decode with it (``decode_cpu``, ``decode_batch``);
* ``batch``: batched decoders, the GPU's one nvJPEG decoder and the stream ordering that keeps
  its output whole (``CudaJpegDecoder``, ``hand_over``).

EXIF orientation is never applied (``loaderbench.imaging.files`` says why). The measurements behind
each choice (which backend, no scaled decode, val centre crops as regions) are in
docs/decoding.md; ``python -m tools.bench.backends PHOTOS`` measures them again.
"""

from __future__ import annotations

from loaderbench.imaging.decode.base import CPU, Box, Capabilities, Decoded, JpegBackend, cut
from loaderbench.imaging.decode.batch import (
    BatchJpegDecoder,
    CudaJpegDecoder,
    batch_decoder,
    hand_over,
    require_cuda,
)
from loaderbench.imaging.decode.choice import (
    BACKENDS,
    backend,
    choose,
    chosen,
    counted_as,
    decode_batch,
    decode_cpu,
    region_decode,
)
from loaderbench.imaging.decode.engine_choice import EngineRate, rank
from loaderbench.imaging.decode.engines import ENGINES, Engine, is_cpu_huffman
from loaderbench.imaging.decode.nvimgcodec import NvImageCodecBackend
from loaderbench.imaging.decode.pil import PilBackend, decode_pil
from loaderbench.imaging.decode.torchcodec import TorchCodecBackend
from loaderbench.imaging.decode.torchvision import TorchvisionBackend

__all__ = [
    "BACKENDS",
    "CPU",
    "ENGINES",
    "BatchJpegDecoder",
    "Box",
    "Capabilities",
    "CudaJpegDecoder",
    "Decoded",
    "Engine",
    "EngineRate",
    "JpegBackend",
    "NvImageCodecBackend",
    "PilBackend",
    "TorchCodecBackend",
    "TorchvisionBackend",
    "backend",
    "batch_decoder",
    "choose",
    "chosen",
    "counted_as",
    "cut",
    "decode_batch",
    "decode_cpu",
    "decode_pil",
    "hand_over",
    "is_cpu_huffman",
    "rank",
    "region_decode",
    "require_cuda",
]
