"""The suite's descriptor audit (issue 21): the Python half of ``closeshim.c``.

`make test` preloads the shim into every process it starts and names a folder in
``FD_AUDIT_DIR``. In a process where the shim is loaded, ``install()`` (conftest calls it)
- registers faulthandler on the shim's signal, so a report carries the culprit's Python stack;
- marks each multiprocessing Connection's descriptor as held, and its own close as legitimate,
  so any other close of that number is reported as the theft it is;
- wraps ``os.close``: a close failing with EBADF names the last Python code that closed that
  number (the first close of a double close).
``findings()`` reads the folder back for the session's summary.
"""

from __future__ import annotations

import ctypes
import faulthandler
import fcntl
import os
import sys
import threading
import time
from pathlib import Path

STACK_SIGNAL = 40  # closeshim.c's STACK_SIGNAL
_installed = False


def shim_loaded() -> bool:
    return hasattr(ctypes.CDLL(None), "fd_audit_loaded")


def _where(skip: int, depth: int = 12) -> list[str]:
    frame = sys._getframe(skip)
    lines = []
    while frame is not None and len(lines) < depth:
        lines.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return lines


def install() -> bool:
    """Audit this process (True), or do nothing where the shim or the folder is missing."""
    global _installed
    folder = os.environ.get("FD_AUDIT_DIR")
    if _installed or not folder or not Path(folder).is_dir() or not shim_loaded():
        return _installed
    shim = ctypes.CDLL(None)
    opened = os.open(Path(folder) / f"python.{os.getpid()}", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    log = fcntl.fcntl(opened, fcntl.F_DUPFD_CLOEXEC, 900)  # out of the way of the numbers in play
    real_close = os.close
    real_close(opened)
    faulthandler.register(STACK_SIGNAL, file=log, all_threads=False, chain=False)
    last_closer: dict[int, tuple[str, float, list[str]]] = {}

    def audited_close(fd: int, who: str = "os.close") -> None:
        where = _where(2)
        try:
            real_close(fd)
        except OSError as error:
            if error.errno == 9:
                lines = [
                    f"### EBADF {who}({fd}) pid {os.getpid()} thread "
                    f"{threading.current_thread().name}",
                    *("    " + w for w in where),
                ]
                if fd in last_closer:
                    thread, at, stack = last_closer[fd]
                    lines.append(
                        f"  its previous Python close, thread {thread}, "
                        f"{(time.monotonic() - at) * 1e3:.3f} ms before:"
                    )
                    lines += ["    " + w for w in stack]
                os.write(log, ("\n".join(lines) + "\n").encode())
            raise
        last_closer[fd] = (threading.current_thread().name, time.monotonic(), where)

    import multiprocessing.connection as connection

    init = connection.Connection.__init__

    def held_init(self, handle: int, readable: bool = True, writable: bool = True) -> None:
        init(self, handle, readable, writable)
        shim.fd_audit_own(self._handle)

    def own_close(self) -> None:
        shim.fd_audit_legit(self._handle)
        audited_close(self._handle, "Connection._close")

    os.close = audited_close
    connection.Connection.__init__ = held_init
    connection.Connection._close = own_close
    _installed = True
    return True


def findings(folder: str | os.PathLike[str], max_chars: int = 12000) -> tuple[int, str]:
    """(Python processes audited, the reports of all of them: empty when nothing was found)."""
    folder = Path(folder)
    python_frames = ("libpython", "closeshim", "fd_audit", "__libc_start", "(_start+")

    def native_report(path: Path) -> str:  # a Python process's own frames say nothing
        lines = path.read_text(errors="replace").splitlines()
        return "\n".join(line for line in lines if not any(p in line for p in python_frames))

    audited = len(list(folder.glob("python.*")))
    parts = []
    for native in sorted(folder.glob("native.*")):
        pid = native.suffix.lstrip(".")
        parts.append(f"--- process {pid}, native reports:\n{native_report(native)}")
        python = folder / f"python.{pid}"
        if python.exists() and python.stat().st_size:
            parts.append(f"--- process {pid}, Python stacks:\n{python.read_text(errors='replace')}")
    for python in sorted(folder.glob("python.*")):  # EBADF seen by Python with no native report
        pid = python.suffix.lstrip(".")
        if not (folder / f"native.{pid}").exists() and python.stat().st_size:
            parts.append(f"--- process {pid}:\n{python.read_text(errors='replace')}")
    text = "\n".join(parts)
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n... ({len(text) - max_chars} more characters in {folder})"
    return audited, text
