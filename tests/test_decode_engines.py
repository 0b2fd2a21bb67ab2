"""nvImageCodec's engines (issue 36): a decoder per engine, an image one engine cannot take
retried on the next and counted there (``decoded_by``: ``nvimgcodec:<engine>``), progressive
JPEGs sent past the engines that take sequential ones only, the CPU-Huffman warning, and the
engines' order on a GPU measured once per machine and remembered. Real nvImageCodec decoders
on the CPU stand in for the GPU's (the GPU's own run under ``-m cuda``)."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from loaderbench.imaging import decode, decoded_by
from loaderbench.imaging.decode import ENGINES, Engine, EngineRate, NvImageCodecBackend
from loaderbench.imaging.decode import _engine_choice as choice
from loaderbench.imaging.decode.engines import is_cpu_huffman, make_decoder, takes

pytest.importorskip("nvidia.nvimgcodec")

CPU = torch.device("cpu")
HAS_CUDA = torch.cuda.is_available()


def jpeg(seed: int, progressive: bool = False) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 255, (48, 64, 3)).astype("u1")
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90, progressive=progressive)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def pillow(data: torch.Tensor) -> torch.Tensor:
    image = Image.open(io.BytesIO(data.numpy().tobytes())).convert("RGB")
    return torch.from_numpy(np.array(image)).permute(2, 0, 1)


# A first engine that takes sequential JPEGs only and refuses every other image it is given,
# as the hardware engine refuses what it cannot decode; then libjpeg-turbo.
PICKY = Engine("picky", "CPU_ONLY", (), "engine", True, "cpu")


class Chained(NvImageCodecBackend):
    """The real backend, its CPU chain two real decoders: ``PICKY``, then ``cpu``."""

    def chain(self, device: torch.device) -> list[tuple[Engine, Any]]:
        if not hasattr(self, "_two"):
            nv = self._module
            self._two = [(PICKY, make_decoder(nv, PICKY, None)), *super().chain(device)]
        return self._two

    def _decode_with(
        self, engine: Engine, decoder: Any, streams: list[Any], device: torch.device
    ) -> list[Any]:
        images = super()._decode_with(engine, decoder, streams, device)
        if engine is PICKY:
            return [image if i % 2 == 0 else None for i, image in enumerate(images)]
        return images


def test_an_image_one_engine_refuses_is_decoded_by_the_next_and_counted_there() -> None:
    backend = Chained()
    backend.load()
    datas = [jpeg(i) for i in range(5)] + [jpeg(9, progressive=True)]
    with decoded_by.counting() as counts:
        images = backend.decode(datas, CPU, [None] * len(datas))
    # Images 0, 2, 4 taken by the first engine; 1 and 3 it refused; the progressive one is
    # never sent to it (sequential only): every one of them decoded by libjpeg-turbo.
    assert counts == {"nvimgcodec:picky": 3, "nvimgcodec:cpu": 3}, counts
    assert sum(counts.values()) == len(datas)
    for data, image in zip(datas, images, strict=True):
        assert isinstance(image, torch.Tensor) and torch.equal(image, pillow(data))


class Failing(Chained):
    """The first engine fails whole batches, as nvImageCodec 0.9.0's GPU ROI decode does on
    some GPUs (NVIDIA/nvImageCodec#55)."""

    def _decode_with(
        self, engine: Engine, decoder: Any, streams: list[Any], device: torch.device
    ) -> list[Any]:
        if engine is PICKY:
            raise RuntimeError("Internal error - nvImageCodec failure: '#8'")
        return super()._decode_with(engine, decoder, streams, device)


def test_a_batch_an_engine_fails_goes_to_the_next_saying_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = Failing()
    backend.load()
    datas = [jpeg(i) for i in range(3)]
    with caplog.at_level(logging.WARNING, logger="loaderbench.imaging.decode"):
        for _ in range(2):
            with decoded_by.counting() as counts:
                images = backend.decode(datas, CPU, [None, (0, 0, 8, 8), None])
            assert counts == {"nvimgcodec:cpu": 3}, counts
    assert torch.equal(images[1], pillow(datas[1])[:, :8, :8])
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "nvimgcodec:picky failed a batch" in lines[0], lines
    assert "'#8'" in lines[0]


def test_the_cpu_engine_counts_its_images_and_names_itself() -> None:
    backend = decode.BACKENDS["nvimgcodec"]
    backend.load()
    assert decode.counted_as("cpu") == "nvimgcodec:cpu" == backend.counted_as(CPU)
    data = jpeg(1, progressive=True)
    with decoded_by.counting() as counts:
        decode.decode_batch([data, jpeg(2)], CPU)
    assert counts == {"nvimgcodec:cpu": 2}


def test_the_engines_pin_where_the_huffman_decode_runs() -> None:
    assert {name for name, e in ENGINES.items() if e.device_type == "cuda"} == {
        "hardware",
        "cuda",
        "hybrid",
    }
    assert [ENGINES[n].backend_kind for n in ("hardware", "cuda", "hybrid", "cpu")] == [
        "HW_GPU_ONLY",
        "HYBRID_CPU_GPU",  # nvJPEG's CUDA decoder registers as hybrid; no GPU_ONLY for JPEG
        "HYBRID_CPU_GPU",
        "CPU_ONLY",
    ]
    assert takes(ENGINES["hardware"], sequential=True)
    assert not takes(ENGINES["hardware"], sequential=False)
    assert not takes(ENGINES["cuda"], sequential=False) and takes(ENGINES["hybrid"], False)
    assert is_cpu_huffman("nvimgcodec:hybrid")
    for key in ("nvimgcodec:hardware", "nvimgcodec:cuda", "nvimgcodec:cpu", "pil", "ffmpeg"):
        assert not is_cpu_huffman(key), key


def test_cpu_huffman_on_a_gpu_is_a_warning_naming_its_cause_once_per_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The warning's text (no GPU is touched: its device is named only)."""
    backend = NvImageCodecBackend()
    gpu = torch.device("cuda", 0)
    backend.gpu_rates[0] = [
        EngineRate("hardware", "engine", None, error="RuntimeError: no engine"),
        EngineRate("cuda", "gpu", 900.0),
        EngineRate("hybrid", "cpu", 2000.0),
    ]
    hybrid = ENGINES["hybrid"]
    before = [(ENGINES["cuda"], None)]
    with caplog.at_level(logging.WARNING, logger="loaderbench.imaging.decode"):
        backend._warn_cpu_huffman(gpu, [], hybrid, [0, 1], [True, True])
        backend._warn_cpu_huffman(gpu, [], hybrid, [0, 1], [True, True])  # said once
        backend._warn_cpu_huffman(gpu, before, hybrid, [0], [False])
        backend._warn_cpu_huffman(gpu, before, hybrid, [0], [True])
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert "ranked hybrid first (hardware: RuntimeError: no engine, cuda 900/s" in lines[0]
    assert "nvimgcodec:hybrid" in lines[0] and "LOADERBENCH_DECODE_REFRESH" in lines[0]
    assert "progressive" in lines[1]
    assert "cuda refused them" in lines[2]


# ---------------------------------------------------------------------------------------------
# The order: ranked by measured rate, remembered per machine, GPU and libraries.


def test_the_fastest_engine_decodes_first_and_cpu_huffman_must_win_by_a_margin() -> None:
    rates = [
        EngineRate("hybrid", "cpu", 1050.0),
        EngineRate("cuda", "gpu", 1000.0),
        EngineRate("hardware", "engine", None, error="Code: 7"),
    ]
    assert choice.rank(rates) == ["cuda", "hybrid"]  # 5% faster: not enough for CPU Huffman
    faster = [EngineRate("hybrid", "cpu", 1200.0), *rates[1:]]
    assert choice.rank(faster) == ["hybrid", "cuda"]
    engine = [EngineRate("hardware", "engine", 25000.0), *rates]
    assert choice.rank(engine)[0] == "hardware"


def test_an_engine_that_decodes_fewer_than_the_batch_is_not_timed() -> None:
    with pytest.raises(RuntimeError, match="fewer than the 8 images"):
        choice.time_engine(lambda: 7, 8)
    speed, cpu_ms = choice.time_engine(lambda: 8, 8, rounds=2)
    assert speed > 0 and cpu_ms >= 0


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOADERBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LOADERBENCH_DECODE_REFRESH", raising=False)
    return tmp_path


def real_measurement(calls: list[int]) -> list[EngineRate]:
    """The CPU engine measured as the GPU's are: a batch of generated JPEGs, timed."""
    backend = decode.BACKENDS["nvimgcodec"]
    backend.load()
    nv = backend._module
    streams = [nv.CodeStream(np.frombuffer(d, np.uint8)) for d in choice.sample_jpegs(4)]
    engine, decoder = backend.chain(CPU)[0]

    def once() -> int:
        images = backend._decode_with(engine, decoder, streams, CPU)
        return sum(image is not None for image in images)

    calls.append(1)
    speed, cpu_ms = choice.time_engine(once, len(streams), rounds=1)
    return [EngineRate(engine.name, engine.huffman, speed, cpu_ms)]


def test_the_measurement_is_remembered_per_machine_and_gpu(
    cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []
    rates, measured = choice.remembered_rates("GPU A", lambda: real_measurement(calls))
    assert measured and calls == [1] and rates[0].images_per_s > 0
    (saved,) = cache.glob("decode-engines-*.json")
    payload = json.loads(saved.read_text())
    assert payload["key"]["gpu"] == "GPU A" and payload["order"] == ["cpu"]
    assert "nvidia-nvimgcodec-cu13" in payload["key"]["libraries"]

    again, measured = choice.remembered_rates("GPU A", lambda: real_measurement(calls))
    assert not measured and again == rates and calls == [1]  # read back, not measured
    _, measured = choice.remembered_rates("GPU B", lambda: real_measurement(calls))
    assert measured and calls == [1, 1]  # another GPU: its own measurement

    monkeypatch.setenv("LOADERBENCH_DECODE_REFRESH", "1")
    _, measured = choice.remembered_rates("GPU A", lambda: real_measurement(calls))
    assert measured and len(calls) == 3

    monkeypatch.delenv("LOADERBENCH_DECODE_REFRESH")
    saved.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="loaderbench.imaging.decode"):
        _, measured = choice.remembered_rates("GPU A", lambda: real_measurement(calls))
    assert measured and str(saved) in caplog.text and "measuring again" in caplog.text
    assert json.loads(saved.read_text())["order"] == ["cpu"]  # written over, whole


def test_a_measurement_of_another_key_under_this_name_is_not_trusted(cache: Path) -> None:
    key = choice.choice_key("GPU A")
    path = choice.choice_path(key)
    choice.save_choice(path, {**key, "gpu": "GPU Z"}, [EngineRate("cuda", "gpu", 5.0)])
    assert choice.load_choice(path, key) is None


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="the GPU's engines need a CUDA device")
def test_the_gpu_decodes_on_the_measured_engines_with_pillows_pixels(cache: Path) -> None:
    """On a GPU: every engine that exists there measured and remembered, the loaders' images
    counted by engine, summing to the images, with Pillow's pixels (fancy upsampling)."""
    device = torch.device("cuda", torch.cuda.current_device())
    backend = NvImageCodecBackend()
    backend.load()
    chain = backend.chain(device)
    assert chain and list(cache.glob("decode-engines-*.json"))
    datas = [jpeg(i) for i in range(8)] + [jpeg(20, progressive=True)]
    with decoded_by.counting() as counts:
        images = backend.decode(datas, device, [None] * len(datas))
    assert sum(counts.values()) == len(datas), counts
    assert all(decoded_by.library(key) == "nvimgcodec" for key in counts), counts
    # The CPU's Huffman decode: the progressive one, unless measured first.
    assert counts.get("nvimgcodec:hybrid", 0) <= 1 or chain[0][0].name == "hybrid", counts
    for data, image in zip(datas, images, strict=True):
        diff = (image.cpu().int() - pillow(data).int()).abs().float()
        assert diff.mean() <= 1.0, float(diff.mean())
