"""JPEG decoding for every loader: one small interface, backends chosen per device by a registry.

* ``_base``: the interface (``JpegBackend``) and what a backend can do (``Capabilities``);
* ``_nvimgcodec``, ``_torchcodec``, ``_torchvision``, ``_pil``: the backends, in that order of
  preference (nvImageCodec alone decodes just a box of the image);
* ``engines``, ``_engine_choice``: nvImageCodec's engines, and their order on a GPU, measured
  once per machine and remembered;
* ``_choice``: the registry (``BACKENDS``), the choice per device and the calls that decode;
* ``_batch``, ``cpu_batch``: batched decoders (the GPU's one nvJPEG decoder, ``hand_over``).

EXIF orientation is never applied (``loaderbench.imaging.files`` says why). docs/decoding.md
has the measurements behind each choice; ``python -m tools.bench.backends PHOTOS`` redoes them.
"""

from __future__ import annotations

from loaderbench.imaging.decode._base import CPU, Box, Capabilities, Decoded, JpegBackend, cut
from loaderbench.imaging.decode._batch import (
    BatchJpegDecoder,
    CudaJpegDecoder,
    batch_decoder,
    hand_over,
    require_cuda,
)
from loaderbench.imaging.decode._choice import (
    BACKENDS,
    backend,
    choose,
    chosen,
    counted_as,
    decode_batch,
    decode_cpu,
    region_decode,
)
from loaderbench.imaging.decode._engine_choice import EngineRate, rank
from loaderbench.imaging.decode._nvimgcodec import NvImageCodecBackend
from loaderbench.imaging.decode._pil import PilBackend, decode_pil
from loaderbench.imaging.decode._torchcodec import TorchCodecBackend
from loaderbench.imaging.decode._torchvision import TorchvisionBackend
from loaderbench.imaging.decode.engines import ENGINES, Engine, is_cpu_huffman

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
