"""nvImageCodec's JPEG engines: where an image's Huffman decode and IDCT run, one decoder each.

nvImageCodec names backend kinds, not engines (its CUDA decoder moves the Huffman decode
between CPU and GPU by image size, and there is no GPU-only JPEG decoder), so an engine here is
a backend kind plus the options that pin where the Huffman decode runs:

* ``hardware``: HW_GPU_ONLY, the GPU's JPEG engine (A100, H100, H200, GB200; none elsewhere);
* ``cuda``: HYBRID_CPU_GPU, every Huffman decode on the GPU (``hybrid_huffman_threshold=0``);
* ``hybrid``: HYBRID_CPU_GPU, every Huffman decode on the CPU;
* ``cpu``: CPU_ONLY, libjpeg-turbo.

Each is a decoder of its own with one backend (so no load hint caps it); an image an engine
cannot take (a progressive JPEG, for the first two) goes to the next, counted there
(``decoded_by``: ``nvimgcodec:<engine>``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Fancy (interpolating) chroma upsampling is libjpeg's and so Pillow's: asked for explicitly, as
# some releases of the Python binding default to ``:fancy_upsampling=0`` (far off Pillow's
# pixels: docs/measurements.md, "Figures moved from the comments"). nvImageCodec 0.9's nvJPEG
# decoders refuse a region of a 4:2:0 or 4:2:2 JPEG with fancy upsampling on nvJPEG older than
# 13.2 unless ``enable_roi_fancy_upsampling=1`` (libnvjpeg_ext.so 0.9.0): enabled, a box's
# outermost pixel's chroma being the price (the resize to the model's size blends it).
FANCY_UPSAMPLING = ":fancy_upsampling=1"
NVJPEG_DECODER_IDS = ("nvjpeg_cuda_decoder", "nvjpeg_hw_decoder")
ROI_FANCY = tuple(f"{decoder}:enable_roi_fancy_upsampling=1" for decoder in NVJPEG_DECODER_IDS)
# Above any image's pixel count (nvImageCodec reads it into a size_t): Huffman always on the CPU.
CPU_HUFFMAN_THRESHOLD = 1 << 40


@dataclass(frozen=True)
class Engine:
    name: str  # decoded_by's ``nvimgcodec:<name>``
    backend_kind: str  # nvImageCodec's BackendKind member
    options: tuple[str, ...]  # beside the fancy upsampling every engine gets
    huffman: str  # where its Huffman decode runs: "engine", "gpu" or "cpu"
    sequential_only: bool  # takes baseline/extended sequential JPEGs only
    device_type: str  # "cuda" or "cpu"

    def option_string(self, fancy: bool = True) -> str:
        """Its options; ``fancy=False`` (the decoder table's comparison only) asks for nvJPEG's
        and libjpeg's simple chroma upsampling, which no loader uses."""
        return " ".join([FANCY_UPSAMPLING if fancy else ":fancy_upsampling=0", *self.options])


ENGINES: dict[str, Engine] = {
    engine.name: engine
    for engine in (
        Engine("hardware", "HW_GPU_ONLY", ROI_FANCY, "engine", True, "cuda"),
        Engine(
            "cuda",
            "HYBRID_CPU_GPU",
            (*ROI_FANCY, "nvjpeg_cuda_decoder:hybrid_huffman_threshold=0"),
            "gpu",
            True,
            "cuda",
        ),
        Engine(
            "hybrid",
            "HYBRID_CPU_GPU",
            (*ROI_FANCY, f"nvjpeg_cuda_decoder:hybrid_huffman_threshold={CPU_HUFFMAN_THRESHOLD}"),
            "cpu",
            False,
            "cuda",
        ),
        Engine("cpu", "CPU_ONLY", (), "cpu", False, "cpu"),
    )
}


def engines_for(device_type: str) -> list[Engine]:
    """The engines that decode onto this kind of device, in no order (the measurement ranks
    the GPU's: ``decode.engine_choice``)."""
    return [engine for engine in ENGINES.values() if engine.device_type == device_type]


def make_decoder(nv: Any, engine: Engine, device_index: int | None, fancy: bool = True) -> Any:
    """A decoder with this engine alone; raises (nvImageCodec's RuntimeError) where the engine
    cannot be created here (no hardware engine, no nvJPEG)."""
    backend = nv.Backend(getattr(nv.BackendKind, engine.backend_kind))
    options = engine.option_string(fancy)
    if engine.device_type == "cpu":  # the calling thread is the parallelism: one thread each
        return nv.Decoder(
            device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
            max_num_cpu_threads=1,
            backends=[backend],
            options=options,
        )
    return nv.Decoder(device_id=device_index, backends=[backend], options=options)


def takes(engine: Engine, sequential: bool) -> bool:
    """Whether the engine is sent a JPEG of this kind (``JpegHeader.sequential``)."""
    return sequential or not engine.sequential_only


def is_cpu_huffman(counted_as: str) -> bool:
    """Whether a ``decoded_by`` key (``nvimgcodec:<engine>``) names images of a CUDA run whose
    Huffman decode ran on the CPU."""
    library, _, name = counted_as.partition(":")
    engine = ENGINES.get(name)
    return (
        library == "nvimgcodec"
        and engine is not None
        and engine.device_type == "cuda"
        and (engine.huffman == "cpu")
    )
