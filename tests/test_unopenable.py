"""A file listed at discovery, then unopenable (deleted since, or not readable by this user):
every loader skips it, counts it and names it. The unreadable case runs where the suite runs
as root too: its reading part runs in a process that cannot override mode bits."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loaderbench.data.discovery import Split
from loaderbench.loaders import build_loader, file_loader_names
from tests.conftest import REPO, cpu_spec, folder_index, loader_folders

SIZE = 32


def read_unopenable(loader: str, paths: list[str], labels: list[int], folder: str) -> dict:
    """One val epoch of these files by ``loader``: images served, files counted as skipped."""
    split = Split("val", tuple(paths), tuple(labels))
    options = {"on_error": "skip", **loader_folders(loader, Path(folder))}
    spec = cpu_spec(split, False, loader=loader, image_size=SIZE, batch_size=4, **options)
    with build_loader(spec) as built:
        served = sum(len(batch.labels) for batch in built)
        return {"served": served, "skipped": built.stats()["skipped_files"]}


# The reading part of the no-permission case, in a process that cannot override mode bits.
AS_A_USER = """
import json, logging, sys
from tests.test_unopenable import read_unopenable
logging.basicConfig(level=logging.WARNING)
args = json.loads(sys.argv[1])
try:
    open(args["bad"], "rb").close()
    opened = True
except PermissionError:
    opened = False
read = read_unopenable(args["loader"], args["paths"], args["labels"], args["folder"])
print(json.dumps({"opened": opened, **read}))
"""
PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2  # <linux/prctl.h>, capability.h
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: the forked child only calls it


def without_mode_bit_override() -> None:
    """(In the child, before it runs the program.) Root's power to read a file whatever its
    mode bits (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH) dropped from the bounding set, so the
    program runs without it, as any other user would: the suite runs as root in CI. A no-op
    for a user who never had it (the call fails, and nothing needed dropping)."""
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        _LIBC.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)


def read_as_a_user(loader: str, split: Split, bad: Path, folder: Path) -> tuple[dict, str]:
    """``read_unopenable`` in a process without root's override of mode bits; its log."""
    args = {
        "loader": loader,
        "paths": list(split.paths),
        "labels": [int(label) for label in split.labels],
        "folder": str(folder),
        "bad": str(bad),
    }
    proc = subprocess.run(
        [sys.executable, "-c", AS_A_USER, json.dumps(args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=without_mode_bit_override,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.parametrize("loader", file_loader_names())
# no_permission reads in a process of its own: the full suite's (slow).
@pytest.mark.parametrize(
    "kind", ["vanished", pytest.param("no_permission", marks=pytest.mark.slow)]
)
def test_a_file_that_cannot_be_opened_is_skipped_and_named(
    loader: str, kind: str, tiny_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Listed at discovery, then unopenable: deleted since, or not readable by this user (read
    by a process that, even when the suite runs as root, cannot override mode bits)."""
    split = folder_index(tiny_root).val
    bad = tmp_path / "n00000001" / f"{kind}.JPEG"
    bad.parent.mkdir()
    split = Split("val", (*split.paths, str(bad)), (*split.labels, 0))
    if kind == "vanished":
        read = read_unopenable(loader, list(split.paths), list(split.labels), str(tmp_path))
        log = caplog.text
    else:
        shutil.copyfile(split.paths[0], bad)
        bad.chmod(0)
        read, log = read_as_a_user(loader, split, bad, tmp_path)
        assert not read.pop("opened"), "the reading process could open a file of mode 000"
    assert read == {"served": len(split) - 1, "skipped": 1}
    assert str(bad) in log
