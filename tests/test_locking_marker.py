"""One lock kind per folder (``locking/marker.py``): every process uses the kind recorded in the
folder's ``.lockkind`` or fails naming it, and a kind that worked and then fails raises rather
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
from collections.abc import Callable
from pathlib import Path

import pytest

from loaderbench.platform.locking import FileLock, LockKindError, marker
from loaderbench.platform.locking.kinds import KINDS
from tests.conftest import REPO
from tests.test_locking_fallback import simulated_env


def failing(code: int) -> Callable[..., None]:
    """What a file system without the call answers (the lock code stays real)."""

    def call(*args: object) -> None:
        raise OSError(code, f"{os.strerror(code)} (simulated file system)")

    return call


def test_a_kind_that_worked_and_then_fails_raises_naming_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
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
    worked_here = "flock has worked on this file system"
    with pytest.raises(LockKindError, match=worked_here) as error, FileLock(new_dir / ".y.lock"):
        pytest.fail("fell through to another kind")
    assert str(new_dir / ".y.lock") in str(error.value) and error.value.errno == errno.ENOLCK
    assert not (new_dir / ".lockkind").exists()  # nothing recorded from a passing failure


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
        ({"LOADERBENCH_LOCK": "fcntl"}, "LOADERBENCH_LOCK=fcntl for "),
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


def test_one_kind_is_recorded_however_many_processes_race_to_record_theirs(
    tmp_path: Path,
) -> None:
    barrier, chosen = threading.Barrier(9), []

    def race(kind: str) -> None:
        barrier.wait()
        chosen.append(marker.record(tmp_path, kind, KINDS).kind)

    threads = [threading.Thread(target=race, args=(KINDS[i % 3],)) for i in range(9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(chosen) == 9 and len(set(chosen)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [".lockkind"]  # nothing staged left behind


def test_a_marker_being_written_in_place_is_waited_for_and_a_wrong_one_named(
    tmp_path: Path,
) -> None:
    path = tmp_path / ".lockkind"
    path.touch()  # created exclusively where there are no hard links; its line still to come
    writer = threading.Timer(0.3, lambda: path.write_text("fcntl\nchosen by pid 1 on n7\n"))
    writer.start()
    recorded = marker.read(tmp_path, KINDS)
    writer.join()
    assert recorded is not None and (recorded.kind, recorded.chosen_by) == ("fcntl", "pid 1 on n7")
    path.write_text("posix\n")
    with pytest.raises(OSError, match=f"{path}.*'posix'.*not one of flock, fcntl, lockfile"):
        FileLock(tmp_path / ".x.lock").__enter__()
