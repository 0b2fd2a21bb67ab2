"""Which backend decodes on each kind of device, and the calls that decode with it.

``BACKENDS`` lists them in order of preference (docs/decoding.md gives the measurements that
keep each in its place). Per kind of device the first backend whose decode of a tiny JPEG
(whole, and a region of it) works there is taken, once per process; one that is missing or
fails to load is passed over with one log line naming it and the reason. ``backend(device)``
names the choice (metrics.json's ``loader_<split>_jpeg_backend``), ``region_decode(device)``
says whether it decodes regions.
"""

from __future__ import annotations

import functools
import io
import logging
import threading
from collections.abc import Sequence

import torch

from loaderbench.imaging import decoded_by
from loaderbench.imaging.decode._base import CPU, Box, Decoded, JpegBackend
from loaderbench.imaging.decode._nvimgcodec import NvImageCodecBackend
from loaderbench.imaging.decode._pil import PilBackend
from loaderbench.imaging.decode._torchcodec import TorchCodecBackend
from loaderbench.imaging.decode._torchvision import TorchvisionBackend

# The package's logger, the name users filter the "does not work here" lines by.
log = logging.getLogger(__package__)

# In order of preference on every device; ``Capabilities.devices`` says where each decodes.
BACKENDS: dict[str, JpegBackend] = {
    backend.name: backend
    for backend in (
        NvImageCodecBackend(),
        TorchCodecBackend(),
        TorchvisionBackend(),
        PilBackend(),
    )
}


@functools.cache
def _tiny_jpeg() -> torch.Tensor:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 90)).save(buffer, "JPEG")
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _works(backend: JpegBackend, device: torch.device) -> None:
    """Load the backend and decode the tiny JPEG (4:2:0, as most photos) on ``device``, whole
    and (where the backend can) a region; raises with the reason where it does not work,
    including where it did not decode them itself: a region it refused comes back empty (None)
    and the backend hands that image to Pillow, which would pass for a working region decode
    while every crop of the run went to Pillow."""
    backend.load()
    data = _tiny_jpeg()
    with decoded_by.not_counted(), decoded_by.counting() as counts:
        images = backend.decode([data, data], device, [None, (8, 0, 8, 16)])
    for image, shape in zip(images, ((3, 16, 16), (3, 8, 16)), strict=True):
        if isinstance(image, BaseException):
            raise image
        if tuple(image.shape) != shape or image.device.type != device.type:
            raise RuntimeError(f"decoded {tuple(image.shape)} on {image.device}, not {shape}")
    others = {lib: n for lib, n in counts.items() if decoded_by.library(lib) != backend.name}
    if others:
        raise RuntimeError(
            f"{backend.name} refused {sum(others.values())} of 2 test images (whole, and a "
            f"region of a 4:2:0 JPEG), which fell back to {', '.join(sorted(others))}"
        )


def _device_of(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    return torch.device("cuda", torch.cuda.current_device()) if device.type == "cuda" else device


def chosen(device: torch.device | str = "cpu") -> JpegBackend:
    """The backend decoding on this kind of device: the first in ``BACKENDS`` that works."""
    return BACKENDS[_choose(torch.device(device).type)]


_choices: dict[str, str] = {}
_choices_lock = threading.Lock()


def _choose(device_type: str) -> str:
    """Once per process and kind of device, whichever thread asks first."""
    with _choices_lock:
        if device_type not in _choices:
            _choices[device_type] = choose(device_type, BACKENDS)
        return _choices[device_type]


def choose(device_type: str, backends: dict[str, JpegBackend]) -> str:
    """The first of ``backends`` that decodes on this kind of device; each one passed over
    gets one log line naming it and the reason."""
    device = _device_of(device_type)
    tried: list[str] = []
    for backend in backends.values():
        if device_type not in backend.can.devices:
            continue
        try:
            _works(backend, device)
        except Exception as error:  # ImportError, OSError, RuntimeError from native code
            reason = f"{type(error).__name__}: {error}".strip().splitlines()[0]
            notes = getattr(backend, "import_notes", None)
            if device_type == "cuda" and notes:  # what its import said about nvJPEG
                reason += f" ({notes[0]})"
            log.warning(
                "JPEG decoding on %s: %s does not work here (%s); trying the next backend",
                device_type,
                backend.name,
                reason,
            )
            tried.append(backend.name)
            continue
        return backend.name
    raise RuntimeError(f"no JPEG decoder works on {device_type} here (tried {', '.join(tried)})")


def backend(device: torch.device | str = "cpu") -> str:
    """The name of the backend that decodes JPEGs on this kind of device."""
    return chosen(device).name


def counted_as(device: torch.device | str = "cpu") -> str:
    """The ``decoded_by`` key of the images the chosen backend decodes on this kind of device
    (``nvimgcodec:cpu`` on the CPU; on a GPU the engine measured first there)."""
    return chosen(device).counted_as(_device_of(torch.device(device).type))


def region_decode(device: torch.device | str = "cpu") -> bool:
    """Whether the backend for this kind of device decodes only an image's box."""
    return chosen(device).can.region


def decode_cpu(data: torch.Tensor, box: Box | None = None) -> torch.Tensor:
    """JPEG bytes (uint8, 1-D, no EXIF orientation tag) to uint8 RGB CHW on the CPU: ``box``
    (top, left, height, width) only, or the whole image; releases the GIL. Raises for a file
    that cannot be decoded."""
    (image,) = BACKENDS[_choose("cpu")].decode([data], CPU, [box])
    if isinstance(image, BaseException):
        raise image
    return image


def decode_batch(
    datas: Sequence[torch.Tensor],
    device: torch.device,
    boxes: Sequence[Box | None] | None = None,
    *,
    admitted: bool = False,
) -> list[Decoded]:
    """Decode JPEGs at once on ``device`` (each only its box where given); a file that fails
    comes back as its error, the others still decode. ``admitted``: JPEGs this project
    encoded, taken without the admission parse (``JpegBackend.decode``)."""
    boxes = [None] * len(datas) if boxes is None else boxes
    return chosen(device).decode(list(datas), device, boxes, admitted=admitted)
