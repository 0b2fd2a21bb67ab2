"""JPEG decoding for every loader: one small interface, backends chosen per device by a registry.

* ``base``: the interface (``JpegBackend``) and what a backend can do (``Capabilities``);
* ``nvimgcodec``, ``torchcodec``, ``torchvision``, ``pil``: the backends, in that order of
  preference (nvImageCodec alone decodes just a box of the image);
* ``engines``, ``engine_choice``: nvImageCodec's engines, and their order on a GPU, measured
  once per machine and remembered;
* ``choice``: the registry (``BACKENDS``), the choice per device and the calls that decode;
* ``batch``, ``cpu_batch``: batched decoders (the GPU's one nvJPEG decoder, ``hand_over``).

EXIF orientation is never applied (``loaderbench.imaging.files`` says why). docs/decoding.md
has the measurements behind each choice; ``python -m tools.bench.backends PHOTOS`` redoes them.
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
