"""``loader=memmap``: a decoded uint8 cache on disk (a tensordict TensorClass over memory-mapped
files), read a whole batch at a time: ``loader`` serves batches, ``cache`` builds and opens it."""
