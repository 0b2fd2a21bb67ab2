"""The measure layer: the metric catalog (every key of metrics.json declared once), the meters
that keep data time apart from compute time, the GIL probe, the process tree's CPU and memory,
and the spread of a steady window's rate."""

# The face names its modules, not their contents: the GPU check's report reads the catalog
# (``metrics``) on a machine part-way set up, so importing this package loads nothing else.
__all__ = ["gil_probe", "meters", "metrics", "process_tree", "ranks", "record"]
