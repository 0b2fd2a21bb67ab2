"""One JPEG decoder for every loader: which backend, and that it gives libjpeg-turbo's pixels."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from loaderbench import jpeg


def encoded(seed: int = 0, size: tuple[int, int] = (90, 120)) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    array = (rng.random((*size, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "JPEG", quality=85)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def test_torchcodec_is_the_backend_where_it_loads() -> None:
    pytest.importorskip("torchcodec")
    assert jpeg.backend() == "torchcodec"


def test_both_backends_give_the_same_pixels_as_pil() -> None:
    data = encoded()
    reference = torch.from_numpy(np.array(Image.open(io.BytesIO(data.numpy().tobytes()))))
    for name, decode in jpeg.BACKENDS.items():
        if name == "torchcodec" and jpeg.backend() != "torchcodec":
            continue
        image = decode([data], torch.device("cpu"))[0]
        assert image.shape == (3, 90, 120) and image.dtype == torch.uint8, name
        assert torch.equal(image.permute(1, 2, 0), reference), name


def test_a_bad_file_in_a_batch_fails_alone() -> None:
    datas = [encoded(0), encoded(1)[:200], encoded(2)]
    results = jpeg.decode_batch(datas, torch.device("cpu"))
    assert isinstance(results[1], BaseException)
    assert all(isinstance(r, torch.Tensor) and r.shape == (3, 90, 120) for r in results[::2])


def test_the_cpu_batch_decoder_has_no_event() -> None:
    decoder = jpeg.batch_decoder(torch.device("cpu"))
    shapes, ready = decoder.run([encoded(0), encoded(1)], lambda images: [i.shape for i in images])
    assert ready is None and shapes == [(3, 90, 120)] * 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_nvjpeg_without_a_gpu_says_so() -> None:
    with pytest.raises(RuntimeError, match="no CUDA device"):
        jpeg.batch_decoder(torch.device("cuda"))


def test_the_header_gives_size_and_exif_orientation() -> None:
    from loaderbench.images import jpeg_header

    array = np.zeros((30, 50, 3), dtype=np.uint8)
    for orientation in (None, 1, 3, 6, 8):
        exif = Image.Exif()
        if orientation is not None:
            exif[0x0112] = orientation
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, "JPEG", exif=exif)
        header = jpeg_header(buffer.getvalue())
        assert header is not None and (header.width, header.height) == (50, 30)
        assert header.orientation == orientation
