"""Reading one image file, the same way in every loader: size limit, colour modes, orientation.

Every decode path goes through here before it spends memory on pixels:

* **Size limit** (``dataset.max_image_pixels``, PIL's own bomb threshold by default): the
  header is read first and a larger image refused with ``ImageTooLarge`` naming the file, so a
  tiny file claiming 60000 x 60000 pixels cannot allocate gigabytes in a worker;
* **Admission** (``fast_jpeg``): from a file's bytes, whether a fast JPEG decoder may take it;
  every other file is Pillow's to read or refuse, in every loader;
* **Colour modes**: everything becomes 8-bit RGB; 16- and 32-bit images by their high byte
  (PIL's ``convert`` would turn a 16-bit photo white);
* **Orientation**: EXIF orientation is *not* applied, as in torchvision's ImageFolder, timm and
  ``torchvision.io``, so models see the pixels published ImageNet models were trained on
  (rotate phone photos on disk once: ``exiftran -ai``).

``set_max_pixels`` sets the limit for the process, before any worker is forked.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import BinaryIO, NamedTuple

import numpy as np
from PIL import Image

from loaderbench.imaging import decoded_by

# torchvision 0.29 deprecates its image codecs in favour of TorchCodec; they are still the
# libjpeg-turbo and nvJPEG bindings we want, so keep the warning out of every decode.
warnings.filterwarnings(
    "ignore",
    message="The image decoding and encoding capabilities of TorchVision",
    category=DeprecationWarning,
)

# PIL refuses images over 2 x MAX_IMAGE_PIXELS (89,478,485) with DecompressionBombError.
DEFAULT_MAX_PIXELS = 2 * 89_478_485

_max_pixels: int | None = DEFAULT_MAX_PIXELS

# Our own check (``check_size``, on the outer header) replaces PIL's warning at 89M pixels.
# PIL's own error stays, at the same limit, for the images it opens inside a file (an ICNS or
# ICO holding a PNG, a TIFF's JPEG tiles) whose size no outer header gives: without it a
# 256 x 256 ICNS of a few kilobytes allocates 8 GB (Pillow's Tests/images/oom-8ed3316a...).
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


def _pil_limit(limit: int | None) -> int | None:
    """PIL's MAX_IMAGE_PIXELS for our limit: PIL refuses more than twice it."""
    return None if limit is None else -(-limit // 2)


Image.MAX_IMAGE_PIXELS = _pil_limit(DEFAULT_MAX_PIXELS)


class ImageTooLarge(OSError):
    """An image over the pixel limit (a decompression bomb, or just too big to decode)."""


def set_max_pixels(limit: int | None) -> None:
    """The pixel limit for this process (None: no limit)."""
    global _max_pixels
    _max_pixels = limit
    Image.MAX_IMAGE_PIXELS = _pil_limit(limit)


def max_pixels() -> int | None:
    return _max_pixels


def check_size(width: int, height: int, path: str) -> None:
    """Raise ``ImageTooLarge`` for an image over the limit, before it is decoded."""
    if _max_pixels is not None and width * height > _max_pixels:
        raise ImageTooLarge(
            f"image {path} is {width}x{height} = {width * height:,} pixels, over "
            f"dataset.max_image_pixels={_max_pixels:,} (a decompression bomb?); raise the "
            f"limit if the file is genuine"
        )


@contextmanager
def bombs_named(path: str) -> Iterator[None]:
    """PIL's own refusal of an image over the limit (one it opens inside the file, or the
    file's own) as ``ImageTooLarge`` naming the file and the setting."""
    try:
        yield
    except Image.DecompressionBombError as error:
        raise ImageTooLarge(
            f"image {path} holds an image over dataset.max_image_pixels={_max_pixels:,} "
            f"(a decompression bomb?): {error} Raise the limit if the file is genuine"
        ) from error


def open_checked(file: BinaryIO, path: str) -> Image.Image:
    """``Image.open`` (header only) with the size checked; decode it with ``load()`` inside
    ``bombs_named``. An image with no pixels (a stub format's, as HDF5's) is refused here, not
    by each loader's own arithmetic later."""
    with bombs_named(path):
        image = Image.open(file)
    width, height = image.size
    if width < 1 or height < 1:
        raise OSError(f"image {path} is {width}x{height} ({image.format}): it holds no pixels")
    check_size(width, height, path)
    return image


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB from any PIL mode; integer images deeper than 8 bits keep their high byte."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N"):
        pixels = np.asarray(image, dtype=np.uint32)
        # 16-bit data in a 32-bit mode ("I", as PIL opens 16-bit PNGs) still spans 0..65535.
        shift = 8 if pixels.max(initial=0) <= 0xFFFF else 24
        return Image.fromarray((pixels >> shift).astype(np.uint8), mode="L").convert("RGB")
    return image.convert("RGB")


def load_rgb(path: str) -> Image.Image:
    """Decode an image file with PIL into RGB: size checked, any colour mode, no EXIF rotation."""
    return read_rgb(path)[0]


Shrink = Callable[[int, int], tuple[int, int]]  # (width, height) -> the size it is shrunk to


def read_rgb(path: str, shrink: Shrink | None = None) -> tuple[Image.Image, tuple[int, int]]:
    """``load_rgb``, and the (width, height) the image is to be shrunk to (``shrink`` of its
    size; its own size without one). A JPEG is then decoded at the smallest of 1/1, 1/2, 1/4,
    1/8 scale still at least that (``Image.draft``: the DCT does the power-of-two part): the
    only difference from ``load_rgb``, which the memmap build relies on to admit and refuse
    exactly the files the other loaders do."""
    with open(path, "rb") as f:
        image = open_checked(f, path)
        size = image.size
        if shrink is not None and image.format == "JPEG":
            target = shrink(*size)
            if target != size:
                image.draft("RGB", target)
        with bombs_named(path):
            image.load()
    rgb = to_rgb(image)
    decoded_by.note("pil")
    return rgb, shrink(*size) if shrink is not None else size


class JpegHeader(NamedTuple):
    width: int
    height: int
    orientation: int | None  # the EXIF orientation tag (1 = as stored), None without one
    components: int = 3  # colour components: 1 grey, 3 YCbCr/RGB, 4 CMYK or YCCK (Adobe)
    frame: int = 0xC0  # its start-of-frame marker: 0xC0 baseline, 0xC2 progressive, ...

    @property
    def sequential(self) -> bool:
        """Baseline or extended sequential Huffman (SOF0, SOF1): what nvJPEG's hardware engine
        and its GPU Huffman decoder take; a progressive JPEG's Huffman decode is the CPU's."""
        return self.frame in (0xC0, 0xC1)


def _exif_orientation(exif: bytes | memoryview) -> int | None:
    """The orientation tag (0x0112) of an APP1 segment's payload, if it holds one."""
    if bytes(exif[:6]) != b"Exif\x00\x00" or len(exif) < 14:
        return None
    tiff = exif[6:]
    order = {b"II": "little", b"MM": "big"}.get(bytes(tiff[:2]))
    if order is None:
        return None

    def number(at: int, size: int) -> int:
        return int.from_bytes(bytes(tiff[at : at + size]), order)  # type: ignore[arg-type]

    ifd = number(4, 4)
    if ifd + 2 > len(tiff):
        return None
    for entry in range(number(ifd, 2)):
        at = ifd + 2 + 12 * entry
        if at + 12 > len(tiff):
            return None
        if number(at, 2) == 0x0112:
            return number(at + 8, 2)
    return None


def jpeg_header(data: bytes | memoryview) -> JpegHeader | None:
    """Size and EXIF orientation from a JPEG's headers, without decoding; None if its frame
    header is not found."""
    n, i, orientation = len(data), 2, None
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length field
            i += 2
            continue
        length = (data[i + 2] << 8) | data[i + 3]
        if marker == 0xE1 and orientation is None:  # APP1: Exif (or XMP)
            orientation = _exif_orientation(data[i + 4 : i + 2 + length])
        # SOF0..SOF15 carry the frame size, except DHT (C4), JPG (C8) and DAC (CC).
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 9 > n:
                return None
            height = (data[i + 5] << 8) | data[i + 6]
            width = (data[i + 7] << 8) | data[i + 8]
            components = data[i + 9] if i + 10 <= n else 0
            return JpegHeader(width, height, orientation, components, marker)
        i += 2 + length
    return None


# Bytes searched at a JPEG's end for its end-of-image marker: what follows it (a camera's
# trailer) is rarely longer; where it is, PIL decides.
JPEG_TAIL_SCAN = 64 * 1024


def jpeg_ends(data: bytes | memoryview) -> bool:
    """Whether a JPEG (its whole bytes) has an end-of-image marker after its last scan, within
    its last ``JPEG_TAIL_SCAN`` bytes. Pillow refuses a JPEG cut anywhere before that marker
    ("image file is truncated", even one byte short); FFmpeg decodes one cut 100 bytes short
    with no error, so such files go to PIL for its verdict. Entropy-coded data never holds
    0xFF 0xD9, so a file ending with it is whole (no copy made: the usual case)."""
    data = memoryview(data)
    if bytes(data[-2:]) == b"\xff\xd9":
        return True
    tail = bytes(data[-JPEG_TAIL_SCAN:])
    end = tail.rfind(b"\xff\xd9")  # what follows it is a trailer, unless it holds a scan
    return end >= 0 and tail.find(b"\xff\xda", end) < 0


def headers_contiguous(data: bytes | memoryview) -> bool:
    """Whether a JPEG's segments follow one another from its start to its first scan with no
    byte between them (0xFF fill bytes aside). libjpeg skips stray bytes before a marker
    ("Corrupt JPEG data: N extraneous bytes before marker") and decodes the image; nvJPEG's
    parser does not skip them the same way, so such a file is PIL's (``fast_jpeg``). A header
    that runs past what is given (``JPEG_HEADER_SCAN``) counts as not contiguous."""
    n, i = len(data), 2
    while i + 4 <= n:
        if data[i] != 0xFF:
            return False  # where a marker must start: bytes libjpeg would skip
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0xDA:  # the first scan: its entropy-coded data follows
            return True
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length field
            i += 2
            continue
        i += 2 + ((data[i + 2] << 8) | data[i + 3])
    return False


def fast_decodable(header: JpegHeader | None) -> bool:
    """Whether a fast JPEG decoder (libjpeg-turbo through any backend, FFmpeg, nvJPEG) may take
    a JPEG with this header, else PIL (``load_rgb``) decodes it, as the torchvision loader does.

    Not without a frame header or a size (a height defined later, DNL), nor with an EXIF
    orientation (TorchCodec would apply it; no loader does), nor with 4 components: Adobe CMYK
    and YCCK, whose conversion to RGB is Pillow's own (FFmpeg hands YCCK's channels back
    unconverted, with no error; nvImageCodec's differs slightly).
    """
    return (
        header is not None
        and header.width > 0
        and header.height > 0
        and header.orientation in (None, 1)
        and header.components in (1, 3)
    )


JPEG_MAGIC = b"\xff\xd8\xff"  # start of image, then a marker: how every JPEG begins
# The frame header follows the EXIF, ICC and quantisation segments: 256 KiB covers them all but
# for a pathological file (which then goes to PIL).
JPEG_HEADER_SCAN = 256 * 1024


def fast_jpeg(data: bytes | memoryview | np.ndarray) -> JpegHeader | None:
    """The one admission rule of every decode path, from a file's whole bytes (its signature,
    never its name): the header of a JPEG that a fast decoder may take, else None, and PIL
    (``load_rgb``) reads or refuses the file, as it does every file in the torchvision loader.
    So Pillow, the reference, decides what is an image (FFmpeg would read a PDF or a cut PCX
    that Pillow refuses).

    A fast decoder takes a file that starts as a JPEG whose frame header gives its size
    (``jpeg_header``), that ``fast_decodable`` lets through, whose segments follow one another
    with no stray bytes up to its first scan (``headers_contiguous``: nvJPEG reads such a
    file's pixels otherwise than libjpeg) and that ends with its end-of-image marker
    (``jpeg_ends``: Pillow refuses a cut one, FFmpeg does not)."""
    view = memoryview(data).cast("B")
    if bytes(view[:3]) != JPEG_MAGIC:
        return None
    head = view[:JPEG_HEADER_SCAN]
    header = jpeg_header(head)
    ok = fast_decodable(header) and headers_contiguous(head) and jpeg_ends(view)
    return header if ok else None


__all__ = [
    "DEFAULT_MAX_PIXELS",
    "ImageTooLarge",
    "JpegHeader",
    "bombs_named",
    "check_size",
    "fast_decodable",
    "fast_jpeg",
    "headers_contiguous",
    "jpeg_ends",
    "jpeg_header",
    "load_rgb",
    "max_pixels",
    "open_checked",
    "read_rgb",
    "set_max_pixels",
    "to_rgb",
]
