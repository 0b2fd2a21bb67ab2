"""The suite's descriptor audit (tests/fd_audit): a planted double close and a planted theft of
a Connection's descriptor are each reported with the culprit's Python stack; ordinary queue and
pipe traffic is not reported at all."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fd_audit
from tests.conftest import REPO

ORDINARY = """
import multiprocessing as mp
import os
from tests import fd_audit

assert fd_audit.install()
queue = mp.Queue()
queue.put(list(range(1000)))
assert queue.get() == list(range(1000))
queue.close()
queue.join_thread()
reader, writer = mp.Pipe(duplex=False)
writer.send(b"x")
assert reader.recv() == b"x"
reader.close()
writer.close()
process = mp.get_context("fork").Process(target=os.getpid)
process.start()
process.join()
process.close()
"""

PLANTED = """
import multiprocessing as mp
import os
from tests import fd_audit

assert fd_audit.install()


def close_twice():
    first, second = os.pipe()
    os.close(second)
    os.close(first)
    try:
        os.close(first)
    except OSError:
        pass


def take_the_descriptor_of(connection):
    os.close(connection.fileno())


close_twice()
reader, writer = mp.Pipe(duplex=False)
take_the_descriptor_of(reader)
reader._handle = None  # its own close would only report the theft a second time
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler: the audit is off where there is none (make test says so)")
    built = tmp_path_factory.mktemp("fd_audit") / "closeshim.so"
    source = REPO / "tests" / "fd_audit" / "closeshim.c"
    subprocess.run(
        [compiler, "-O1", "-shared", "-fPIC", "-o", str(built), str(source), "-ldl"],
        check=True,
    )
    return built


def audited_python(code: str, shim: Path, folder: Path) -> None:
    folder.mkdir()
    env = dict(os.environ, FD_AUDIT_DIR=str(folder), LD_PRELOAD=str(shim), PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True, timeout=60)


@pytest.mark.slow
def test_ordinary_queues_pipes_and_processes_are_not_reported(shim: Path, tmp_path: Path) -> None:
    audited_python(ORDINARY, shim, tmp_path / "audit")
    audited, text = fd_audit.findings(tmp_path / "audit")
    assert audited == 1  # the script's process; its forked child is not a new audit
    assert text == ""


@pytest.mark.slow
def test_a_double_close_and_a_taken_descriptor_name_their_culprits(
    shim: Path, tmp_path: Path
) -> None:
    audited_python(PLANTED, shim, tmp_path / "audit")
    audited, text = fd_audit.findings(tmp_path / "audit")
    assert audited == 1
    assert text.count("=== EBADF close(") == 1, text
    assert text.count("=== STOLEN close(") == 1, text
    # Each report's Python stack is the culprit's, in order: the double close, then the theft.
    stacks = text.split("Stack (most recent call first):")[1:]
    assert len(stacks) == 2, text
    assert "in close_twice" in stacks[0] and "take_the_descriptor_of" not in stacks[0]
    assert "in take_the_descriptor_of" in stacks[1]
    # The double close also names the first close of that number (two lines earlier).
    first = text.index("its previous Python close")
    assert "<string>:12 in close_twice" in text[first:], text


@pytest.mark.slow
def test_without_the_shim_install_does_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "audit"
    folder.mkdir()
    env = dict(os.environ, FD_AUDIT_DIR=str(folder), PYTHONPATH=str(REPO))
    env.pop("LD_PRELOAD", None)
    code = "import os; from tests import fd_audit; assert not fd_audit.install(); print(os.close)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, check=True, capture_output=True, text=True
    ).stdout
    assert "built-in function close" in out
    assert list(folder.iterdir()) == []


@pytest.mark.skipif(
    os.environ.get("FD_AUDIT_STRICT") == "1", reason="`make test-audit`: audited on purpose"
)
def test_a_plain_test_process_runs_the_real_close_and_connection() -> None:
    """`make test` tests the product as users run it: no shim preloaded, and neither os.close
    nor multiprocessing's Connection replaced in the test process (the audit is opt-in)."""
    import multiprocessing.connection
    import posix

    assert "closeshim" not in os.environ.get("LD_PRELOAD", "")
    assert not fd_audit.shim_loaded()
    assert os.close is posix.close
    connection = multiprocessing.connection.Connection
    assert connection.__init__.__module__ == "multiprocessing.connection"
    assert connection._close.__module__ == "multiprocessing.connection"
