"""Where a CUDA run's memmap batches are finished: in the reading thread that read them.

Each reading thread has a CUDA stream of its own (``ThreadStreams``): it copies its batch's
rows (pinned, non-blocking) or decodes its batch's JPEG bytes (a batched nvJPEG decoder of its
own, on that stream), crops, resizes and flips on that stream, and records an event. The
consumer's stream waits for the event and the batch's tensors are recorded on the consumer's
stream (``decode.hand_over``), so the caching allocator keeps them until the model is done with
them. So ``num_workers`` threads overlap their batches' device work with each other and with
the model's step, and that work is counted where it runs (the reading threads), not as the
consumer's data wait.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

from loaderbench.imaging.decode import BatchJpegDecoder, CudaJpegDecoder, require_cuda


class ThreadStreams:
    """Per reading thread: its CUDA stream, and (``jpeg``) its own batched JPEG decoder, whose
    stream is the thread's. On the CPU (the tests' forced device paths) no stream, and a CPU
    batched decoder."""

    def __init__(self, device: torch.device, *, jpeg: bool, what: str) -> None:
        if jpeg and device.type == "cuda":
            require_cuda(device, what)  # here, not in the first reading thread
        self.device = device
        self.jpeg = jpeg
        self._local = threading.local()
        # The threads that got a stream (or decoder) of their own, by name: where the work ran.
        # Each epoch's reading threads are new (and get new streams), with the same names.
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def _made_here(self) -> None:
        with self._lock:
            self.threads.add(threading.current_thread().name)

    def decoder(self) -> BatchJpegDecoder:
        """This thread's decoder: a ``CudaJpegDecoder`` of its own, with its own stream (not the
        device's shared one and its lock), created on first use. Whether that feeds the
        hardware engine faster than one shared decoder is the GPU check's ``sharing`` phase's
        question (the backend's own decode call may still take turns:
        ``loaderbench.imaging.decode``)."""
        decoder = getattr(self._local, "decoder", None)
        if decoder is None:
            if self.device.type == "cuda":
                decoder = CudaJpegDecoder(self.device)
            else:
                decoder = BatchJpegDecoder(self.device)
            self._local.decoder = decoder
            self._made_here()
        return decoder

    def stream(self) -> torch.cuda.Stream | None:
        """This thread's stream (None off CUDA): the decoder's, for a jpeg store."""
        if self.device.type != "cuda":
            return None
        if self.jpeg:
            decoder = self.decoder()
            assert isinstance(decoder, CudaJpegDecoder)
            return decoder.stream
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = torch.cuda.Stream(self.device)
            self._made_here()
        return stream

    @contextlib.contextmanager
    def on_stream(self) -> Iterator[None]:
        """Work queued inside the block goes to this thread's stream."""
        stream = self.stream()
        if stream is None:
            yield
            return
        with torch.cuda.stream(stream):
            yield

    def ready(self) -> torch.cuda.Event | None:
        """An event after everything queued so far on this thread's stream (None off CUDA)."""
        stream = self.stream()
        if stream is None:
            return None
        event = torch.cuda.Event()
        event.record(stream)
        return event
