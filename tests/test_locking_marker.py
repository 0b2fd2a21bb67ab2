"""One lock kind per folder (``locking/_kinds.py``): every process uses the kind recorded in the
folder's ``.lockkind`` or fails naming it, and a recorded kind that then fails raises rather
than falling through to a kind the other processes do not use.

The file system is simulated, not the lock: ``fcntl.flock`` is made to fail as an NFS mount
whose lock daemon stops answering does (in this process, or in another through the
``sitecustomize`` of ``test_locking_fallback``); the lock code under test runs as it is."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from loaderbench.platform.locking import FileLock, LockKindError
from loaderbench.platform.locking._kinds import read_marker
from tests.conftest import REPO
from tests.test_locking_fallback import simulated_env


def failing(code: int) -> Callable[..., None]:
    """What a file system without the call answers (the lock code stays real)."""

    def call(*args: object) -> None:
        raise OSError(code, f"{os.strerror(code)} (simulated file system)")

    return call


def test_a_recorded_kind_that_then_fails_raises_naming_the_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("LOADERBENCH_LOCK", raising=False)
    recorded_dir, new_dir = tmp_path / "index", tmp_path / "cache"
    recorded_dir.mkdir()
    new_dir.mkdir()
    with FileLock(recorded_dir / ".x.lock"):  # flock works here
        pass
    assert (recorded_dir / ".lockkind").read_text().split()[0] == "flock"
    monkeypatch.setattr(fcntl, "flock", failing(errno.ENOLCK))  # NFS's lock daemon goes quiet
    with pytest.raises(LockKindError) as error, FileLock(recorded_dir / ".x.lock"):
        pytest.fail("took another kind than the folder's")
    message = str(error.value)
    assert str(recorded_dir / ".lockkind") in message and "records flock" in message
    assert socket.gethostname() in message and "ENOLCK" in message
    assert error.value.errno == errno.ENOLCK
    # A folder with no kind yet takes lock files, records them, and every process follows.
    with FileLock(new_dir / ".y.lock"):
        assert (new_dir / ".y.lock.excl").is_file()
    assert (new_dir / ".lockkind").read_text().split()[0] == "lockfile"
    assert "lock files created exclusively" in caplog.text and "with ENOLCK" in caplog.text


TRY_TAKE = """
import sys
from loaderbench.platform.locking import try_exclusive
held = try_exclusive(sys.argv[1])
print("busy" if held is None else "taken while another process holds it")
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setting", "refusal"),
    [
        ({"LOADERBENCH_LOCK": "lockfile"}, "LOADERBENCH_LOCK=lockfile for "),
        ({"SIMULATED_MISSING_LOCKS": "flock:ENOLCK"}, "fails on this host"),
    ],
    ids=["forced-to-another-kind", "flock-fails-on-its-node"],
)
def test_a_second_process_that_cannot_use_the_folder_kind_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: dict[str, str], refusal: str
) -> None:
    monkeypatch.delenv("LOADERBENCH_LOCK", raising=False)
    lock = tmp_path / ".build.lock"
    env = simulated_env(tmp_path, "")
    env.update(setting)
    with FileLock(lock):  # this process: flock, recorded in the folder's marker
        out = subprocess.run(
            [sys.executable, "-c", TRY_TAKE, str(lock)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode != 0, out.stdout  # not two locks that do not exclude each other
    assert "LockKindError" in out.stderr and refusal in out.stderr, out.stderr[-3000:]
    assert str(tmp_path / ".lockkind") in out.stderr and "records flock" in out.stderr
    assert socket.gethostname() in out.stderr or "LOADERBENCH_LOCK" in setting


RACER = """
import sys, time
from pathlib import Path
from loaderbench.platform.locking import FileLock, LockKindError

lock, go, ready = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
ready.touch()
while not go.exists():
    time.sleep(0.002)
try:
    with FileLock(lock):
        print("took")
except LockKindError as error:
    print("refused:", error)
"""


@pytest.mark.slow
def test_one_kind_is_recorded_however_many_processes_race_to_record_theirs(
    tmp_path: Path,
) -> None:
    lock, go = tmp_path / "shared" / ".x.lock", tmp_path / "go"
    readies = [tmp_path / f"ready{i}" for i in range(6)]
    lock.parent.mkdir()
    kinds = ["flock", "lockfile"] * 3
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(lock), str(go), str(ready)],
            cwd=REPO,
            env={**os.environ, "LOADERBENCH_LOCK": kind},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for kind, ready in zip(kinds, readies, strict=True)
    ]
    deadline = time.monotonic() + 60
    while not all(ready.exists() for ready in readies):  # all of them waiting for the word
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
        time.sleep(0.01)
    go.touch()
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * len(procs), [e for _, e in outputs]
    recorded = (lock.parent / ".lockkind").read_text().split()[0]
    for kind, (out, _) in zip(kinds, outputs, strict=True):
        if kind == recorded:
            assert out.strip() == "took"
        else:
            assert out.startswith("refused:") and f"records {recorded}" in out, out
    assert sorted(p.name for p in lock.parent.iterdir()) == [".lockkind", ".x.lock"]


def test_a_marker_being_written_in_place_is_waited_for_and_a_wrong_one_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / ".lockkind"
    path.touch()  # created exclusively; its line still to come
    writer = threading.Timer(0.3, lambda: path.write_text("lockfile\nchosen by pid 1 on n7\n"))
    writer.start()
    recorded = read_marker(tmp_path)
    writer.join()
    assert recorded == ("lockfile", "chosen by pid 1 on n7")
    path.write_text("fcntl\n")  # an older loaderbench's POSIX record locks
    with pytest.raises(OSError, match=f"{path}.*'fcntl'.*not one of"):
        FileLock(tmp_path / ".x.lock").__enter__()
    monkeypatch.setenv("LOADERBENCH_LOCK", "posix")
    with pytest.raises(ValueError, match="LOADERBENCH_LOCK='posix': expected one of flock"):
        FileLock(tmp_path / ".x.lock").__enter__()
