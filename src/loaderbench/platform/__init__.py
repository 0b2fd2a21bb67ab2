"""The platform layer, the bottom of the house: what any part of a run stands on and that knows
nothing of images or loaders. Stopping on a signal, the device and precision, threads, locks and
atomic files, the distributed primitives, host buffers and the page cache."""

# The face names its modules, not their contents: the bottom layer is imported by every process
# (the tools' included), and each takes only the primitives it needs (torch only with them).
__all__ = [
    "atomic",
    "buffers",
    "distributed",
    "locking",
    "pagecache",
    "runtime",
    "stopping",
    "tables",
    "threads",
    "version",
]
