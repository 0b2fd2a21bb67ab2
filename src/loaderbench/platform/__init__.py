"""The platform layer, the bottom of the house: what any part of a run stands on and that knows
nothing of images or loaders. Stopping on a signal, the device and precision, threads, locks and
atomic files, the distributed primitives, host buffers and the page cache."""
