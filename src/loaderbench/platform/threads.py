"""Thread settings shared by the loaders that decode in thread pools (spdl's pipeline,
memmap's reading threads, the benchmark's decode limits).

A pool's parallelism is its threads: a torch op (resize, stack) that also splits itself over
torch's intra-op OpenMP team makes num_workers x intra-op threads fight over the cores, and on
a busy machine one parallel region waits for a descheduled teammate (docs/decoding.md).
"""

from __future__ import annotations

import ctypes
import functools
import re
import threading

import torch

_THREAD = threading.local()


@functools.cache
def _openmp_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime torch loaded (libgomp / libiomp / libomp), if we can find it."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted(
                {
                    line.split()[-1]
                    for line in maps
                    if re.search(r"lib(gomp|iomp5|omp)[^/]*\.so", line)
                }
            )
        return ctypes.CDLL(paths[0]) if paths else None
    except (OSError, IndexError):
        return None


def serial_torch_in_this_thread() -> None:
    """Run torch ops called from this pool thread on one core.

    ``torch.set_num_threads(1)`` would also change the default of every later thread in the
    process, so only this thread's OpenMP setting is changed, after torch has initialised it.
    """
    if getattr(_THREAD, "serial", False):
        return
    _THREAD.serial = True
    torch.get_num_threads()  # torch initialises this thread's OpenMP setting on first use
    runtime = _openmp_runtime()
    if runtime is not None and torch.__config__.parallel_info().find("OpenMP") >= 0:
        runtime.omp_set_num_threads(1)


__all__ = ["serial_torch_in_this_thread"]
