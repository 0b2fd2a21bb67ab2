"""Where py-spy is: the sampling profiler behind `make profile` and its `--gil` figures."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def executable() -> str:
    """The py-spy executable beside this interpreter, or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy is not installed: make install (or pip install py-spy)")
    return found
