"""The cache and index locks where ``flock`` is unsupported (Lustre without ``-o flock``, some
NFS set-ups): the fallback to lock files (filelock's leases, with the shared holds of
``locking.kinds``), in real processes.

The file system is simulated, not the lock: a ``sitecustomize`` on the subprocesses' path makes
``fcntl.flock`` (and, for Lustre's ``noflock``, ``fcntl.lockf`` too) fail as such a mount does;
the lock code under test, filelock's included, runs as it is. Real JPEGs, real memmap cache
builds."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from loaderbench.imaging.files import load_rgb
from loaderbench.imaging.transforms import pil_val_transform
from loaderbench.platform.locking import FileLock, try_exclusive
from loaderbench.platform.locking._kinds import flock_local_only
from tests.conftest import REPO, folder_index

SITECUSTOMIZE = """
import errno, fcntl, os

def _unsupported(name, code):
    def call(*args, **kwargs):
        raise OSError(code, f"{name}: {os.strerror(code)} (simulated file system)")
    return call

for _entry in filter(None, os.environ.get("SIMULATED_MISSING_LOCKS", "").split(",")):
    _name, _code = _entry.split(":")
    setattr(fcntl, _name, _unsupported(_name, getattr(errno, _code)))
"""

# What each file system answers, and the lock that must then be used (named in the log line).
FILE_SYSTEMS = {
    "flock_enolck": ("flock:ENOLCK", "lock files created exclusively"),
    "lustre_noflock": ("flock:ENOSYS,lockf:ENOSYS", "lock files created exclusively"),
}


def simulated_env(tmp_path: Path, missing: str, **extra: str) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOADERBENCH_LOCK")}
    path = [str(site), env.get("PYTHONPATH", "")]
    return {
        **env,
        "PYTHONPATH": os.pathsep.join(filter(None, path)),
        **extra,
        "SIMULATED_MISSING_LOCKS": missing,
    }


RACING_BUILD = """
import sys, time
from pathlib import Path
import loaderbench.imaging.stored as stored
import loaderbench.loaders.memmap.build as mb
import loaderbench.loaders.memmap._cache as mc
from tests.conftest import folder_index

root, cache_dir, ready, go = sys.argv[1:5]
split = folder_index(Path(root)).val
real = stored.decode_crop

def slow(path, size):  # a build long enough for the other process to arrive meanwhile
    time.sleep(0.05)
    return real(path, size)

stored.decode_crop = slow
Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.005)
cache = mc.ensure_cache(split, mb.StorePolicy.for_split(False, 32, 1.5), Path(cache_dir),
                        num_workers=0, skip_errors=True, progress=False)
print(cache.built, cache.path)
cache.release()
"""


@pytest.mark.slow
@pytest.mark.parametrize("file_system", sorted(FILE_SYSTEMS))
def test_two_builders_exclude_each_other_where_flock_is_unsupported(
    tiny_root: Path, tmp_path: Path, file_system: str
) -> None:
    missing, lock_named = FILE_SYSTEMS[file_system]
    env = simulated_env(tmp_path, missing)
    cache_dir, go = tmp_path / "cache", tmp_path / "go"
    readies = [tmp_path / f"ready{i}" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACING_BUILD, str(tiny_root), str(cache_dir), str(r), str(go)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in readies
    ]
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in readies):
        assert all(p.poll() is None for p in procs), [p.communicate()[1][-3000:] for p in procs]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    go.touch()
    outputs = [proc.communicate(timeout=300) for proc in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    results = [out.split() for out, _ in outputs]
    assert sorted(built for built, _ in results) == ["False", "True"]  # one built, one reused
    assert results[0][1] == results[1][1]
    errs = [err for _, err in outputs]
    assert sum("Waiting for another run building memmap cache" in err for err in errs) == 1
    for err in errs:  # one line a process, though each took two locks (build, in use)
        assert err.count("locks in ") == 1 and lock_named in err, err[-3000:]
    assert [p.name for p in cache_dir.iterdir() if not p.name.startswith(".")] == [
        Path(results[0][1]).name
    ]
    # The cache is whole: this process (real flock) opens it without building, pixel for pixel.
    from loaderbench.loaders.memmap._cache import ensure_cache
    from loaderbench.loaders.memmap.build import StorePolicy

    split = folder_index(tiny_root).val
    opened = ensure_cache(split, StorePolicy.for_split(False, 32, 1.5), cache_dir, 0, True, False)
    try:
        assert not opened.built
        expected = torch.stack([pil_val_transform(32)(load_rgb(p)) for p in split.paths])
        assert torch.equal(torch.as_tensor(opened.data.images), expected)
    finally:
        opened.release()


HOLDER = """
import sys, time
from pathlib import Path
from loaderbench.platform.locking import SharedHold

in_use, signal_file, go_on = map(Path, sys.argv[1:4])
first, second = SharedHold(in_use), SharedHold(in_use)
first.release()  # one hold let go: the other still holds
signal_file.touch()
while not go_on.exists():
    time.sleep(0.01)
second.release()
print("released")
time.sleep(0.5)  # still alive: the lock went with the release, not with the process
"""


@pytest.mark.slow
@pytest.mark.parametrize("file_system", [*sorted(FILE_SYSTEMS), "local"])
def test_an_in_use_hold_keeps_removal_out_until_its_last_holder_goes(
    tmp_path: Path, file_system: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Here and with flock ("local"): shared holds are files of their own in both kinds."""
    missing, lock_named = FILE_SYSTEMS.get(file_system, ("", ""))
    in_use, held, go_on = tmp_path / ".cache.inuse", tmp_path / "held", tmp_path / "go_on"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(in_use), str(held), str(go_on)],
        cwd=REPO,
        env=simulated_env(tmp_path, missing),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # This process, where flock works, takes the kind the holder's file system detection
    # arrived at, as the folder's marker records it: no setting needed.
    monkeypatch.delenv("LOADERBENCH_LOCK", raising=False)
    try:
        deadline = time.monotonic() + 60
        while not held.exists():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert try_exclusive(in_use) is None  # the second hold still holds
        go_on.touch()
        assert proc.stdout is not None and proc.stdout.readline().strip() == "released"
        taken = try_exclusive(in_use)
        assert taken is not None
        taken.release()
    finally:
        go_on.touch()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert lock_named in err
    recorded = (tmp_path / ".lockkind").read_text().split()[0]
    assert recorded == ("flock" if file_system == "local" else "lockfile")
    assert [p.name for p in tmp_path.iterdir() if ".shared-" in p.name] == []  # each let go


# ---------------------------------------------------------------------------------------------
# The lock files' stale-holder rule (filelock's leases), one process against another.

TAKE_AND_DIE = """
import os, sys
from loaderbench.platform.locking import FileLock
lock = FileLock(sys.argv[1])
lock.__enter__()
print(os.getpid(), flush=True)
os._exit(0)  # dies holding it, as a SIGKILLed build would: nothing removes its record
"""

TAKE_AND_HOLD = """
import sys, time
from loaderbench.platform.locking import FileLock
with FileLock(sys.argv[1]):
    print("holding", flush=True)
    time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def lock_files(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("LOADERBENCH_LOCK", "lockfile")
    return {**os.environ, "LOADERBENCH_LOCK": "lockfile"}


def record_pid(record: Path) -> int:
    """The holder's pid as its record (filelock's format, a ``key=value`` a line) names it."""
    fields = dict(line.split("=", 1) for line in record.read_text().splitlines()[1:])
    return int(fields["pid"])


@pytest.mark.slow
def test_a_lock_file_naming_a_dead_process_on_this_host_is_taken_over(
    tmp_path: Path, lock_files: dict[str, str]
) -> None:
    lock = tmp_path / ".index.lock"
    out = subprocess.run(
        [sys.executable, "-c", TAKE_AND_DIE, str(lock)],
        cwd=REPO,
        env=lock_files,
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(out.stdout)
    record = lock.with_name(lock.name + ".excl")
    assert record_pid(record) == dead_pid  # left behind by the dead holder
    begun = time.monotonic()
    with FileLock(lock):
        assert time.monotonic() - begun < 5  # not the age rule: the holder is known dead
        assert record_pid(record) == os.getpid()
    assert not record.exists() and lock.is_file()


@pytest.mark.slow
def test_a_live_holder_of_a_lock_file_is_waited_for(
    tmp_path: Path,
    lock_files: dict[str, str],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    lock = tmp_path / ".build.lock"
    proc = subprocess.Popen(
        [sys.executable, "-c", TAKE_AND_HOLD, str(lock), "1.5"],
        cwd=REPO,
        env=lock_files,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
        assert record_pid(lock.with_name(lock.name + ".excl")) == proc.pid  # names its holder
        begun = time.monotonic()
        with FileLock(lock, wait_message="waiting for the holder"):
            waited = time.monotonic() - begun
            assert proc.poll() is not None or proc.wait(5) == 0  # it finished before we got in
    finally:
        proc.wait(60)
    assert proc.returncode == 0
    assert waited > 0.8
    assert "waiting for the holder" in capfd.readouterr().err
    assert not [r.getMessage() for r in caplog.records if "lock record" in r.getMessage()]


def write_record_of_another_host(record: Path, lease_s: float) -> None:
    """A lease as filelock's holder on another node writes it (its duration: the job's)."""
    fields = ["pid=4242", "host=another-node", "mode=lease", "token=" + "0" * 32]
    record.write_text("\n".join(["filelock/2", *fields, f"duration={lease_s!r}"]) + "\n")


def test_a_holder_elsewhere_is_stale_only_once_its_heartbeat_stops(
    tmp_path: Path, lock_files: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOADERBENCH_LOCK_STALE_S", "1")
    lock = tmp_path / ".build.lock"
    record = lock.with_name(lock.name + ".excl")
    write_record_of_another_host(record, 1.0)
    beating = threading.Event()
    beating.set()

    def heartbeat() -> None:  # what the holder on the other node does, for 2.5 s
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            os.utime(record)
            time.sleep(0.2)
        beating.clear()

    thread = threading.Thread(target=heartbeat)
    thread.start()
    begun = time.monotonic()
    with FileLock(lock):
        waited = time.monotonic() - begun
        assert not beating.is_set()  # never while the record was being refreshed
        assert record_pid(record) == os.getpid()
    thread.join()
    assert 3.0 < waited < 15


def test_a_shared_record_elsewhere_long_without_heartbeat_is_taken_at_once(
    tmp_path: Path, lock_files: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    in_use = tmp_path / ".cache.inuse"
    in_use.touch()
    record = in_use.with_name(in_use.name + ".shared-" + "ab" * 16)
    write_record_of_another_host(record, 120.0)
    hour_ago = time.time() - 3600
    os.utime(record, (hour_ago, hour_ago))
    taken = try_exclusive(in_use)  # housekeeping removes a cache whose only reader died long ago
    assert taken is not None
    taken.release()
    assert not record.exists() and "no heartbeat for" in caplog.text


def test_a_shared_record_elsewhere_with_a_recent_heartbeat_keeps_removal_out(
    tmp_path: Path, lock_files: dict[str, str]
) -> None:
    in_use = tmp_path / ".cache.inuse"
    in_use.touch()
    record = in_use.with_name(in_use.name + ".shared-" + "cd" * 16)
    write_record_of_another_host(record, 120.0)
    assert try_exclusive(in_use) is None  # its holder may still be reading: not judged at a look
    assert record.exists()


COUNTER = """
import os, sys, time
from pathlib import Path
from loaderbench.platform.locking import FileLock

lock, counter, die = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "die"
for i in range(8):
    with FileLock(lock, wait_message=""):
        value = int(counter.read_text())  # read, pause, write: lost updates if two are inside
        time.sleep(0.01)
        counter.write_text(str(value + 1))
        if die and i == 3:
            os._exit(0)  # dies inside, its record left: the others must take over, not overlap
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["flock", "lockfile"])
def test_processes_never_overlap_inside_even_when_a_holder_dies(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock, counter = tmp_path / ".count.lock", tmp_path / "count"
    counter.write_text("0")
    monkeypatch.setenv("LOADERBENCH_LOCK", kind)
    env = {**os.environ}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", COUNTER, str(lock), str(counter), "die" if i == 0 else ""],
            cwd=REPO,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    errs = [proc.communicate(timeout=120)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 4, errs
    assert int(counter.read_text()) == 4 + 3 * 8  # the dead one's four, and every other one
    with FileLock(lock):  # at once, though the dead one's record may be the last one left
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == [".count.lock", ".lockkind", "count"]


THREADS = """
import sys, threading, time
from pathlib import Path
from loaderbench.platform.locking import FileLock, SharedHold, try_exclusive

lock, inside, overlaps = Path(sys.argv[1]), [0], []

def work():
    with FileLock(lock):
        inside[0] += 1
        overlaps.append(inside[0])
        time.sleep(0.05)
        inside[0] -= 1

threads = [threading.Thread(target=work) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
hold = SharedHold(lock)
print(overlaps, try_exclusive(lock) is None)  # this process's own shared hold keeps it out
hold.release()
"""


@pytest.mark.slow
def test_threads_of_one_process_exclude_each_other_with_lock_files(tmp_path: Path) -> None:
    """filelock's leases are per instance: a thread's marker keeps the others out."""
    missing, lock_named = FILE_SYSTEMS["flock_enolck"]
    out = subprocess.run(
        [sys.executable, "-c", THREADS, str(tmp_path / ".x.lock")],
        cwd=REPO,
        env=simulated_env(tmp_path, missing),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[0] == "[1, 1, 1, 1] True"
    assert lock_named in out.stderr


@pytest.mark.parametrize(
    ("fstype", "options", "local"),
    [
        ("nfs4", "rw,vers=4.2,local_lock=none", None),
        ("nfs4", "rw,vers=4.2,local_lock=flock", "local_lock=flock"),
        ("nfs", "rw,vers=3,local_lock=posix", None),
        ("nfs", "rw,vers=3,nolock", "local_lock=all"),
        ("nfs", "rw,vers=3,nolock,local_lock=all", "local_lock=all"),
        ("lustre", "rw,localflock", "localflock"),
        ("lustre", "rw,flock", None),
        ("ext4", "rw,relatime", None),
    ],
)
def test_mounts_that_lock_one_host_only_are_recognised(
    fstype: str, options: str, local: str | None
) -> None:
    assert flock_local_only(fstype, frozenset(options.split(","))) == local
