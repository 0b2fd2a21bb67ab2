"""Tooling that serves one script each, beside it, outside the ``loaderbench`` library; run from
the repository root (``python -m tools.<name>``), importing only loaderbench's public names."""
