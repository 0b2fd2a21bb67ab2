"""Files written atomically: a reader sees the old file or the whole new one, never a part, and a
stop signal does not cut a write short."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from loaderbench.platform.stopping import critical_section


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)``, fsync, then rename over ``path``: readers see all or nothing. A
    stop signal (SIGINT, SIGTERM) meanwhile waits for the end (``stopping.critical_section``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with critical_section():
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            write(Path(tmp))
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))
