"""The measure layer: the metric catalog (every key of metrics.json declared once), the meters
that keep data time apart from compute time, the GIL probe, the process tree's CPU and memory,
and the spread of a steady window's rate."""
