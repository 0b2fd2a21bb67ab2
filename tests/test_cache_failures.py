"""The memmap cache when the disk fails it: files edited or truncated after the build, a full
disk, a read-only cache folder. Real files; the disk cases on a real tmpfs in a private mount
namespace (``unshare``), so the kernel itself says ENOSPC and EROFS."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from loaderbench.imaging.files import load_rgb
from loaderbench.imaging.transforms import pil_val_transform
from loaderbench.loaders.memmap._cache import META_FILE, cache_name, ensure_cache
from loaderbench.loaders.memmap.build import StorePolicy
from tests.conftest import REPO, folder_index

SIZE = 32
POLICY = StorePolicy.for_split(False, SIZE, 1.5)


def build(root: Path, cache_dir: Path):
    return ensure_cache(
        folder_index(root).val, POLICY, cache_dir, num_workers=0, skip_errors=True, progress=False
    )


def reference(root: Path) -> torch.Tensor:
    return torch.stack([pil_val_transform(SIZE)(load_rgb(p)) for p in folder_index(root).val.paths])


def edit_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        value = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([value ^ 0xFF]))


@pytest.mark.parametrize("damage", ["truncate", "extend", "edit_image_row", "edit_label"])
def test_a_cache_changed_after_its_build_is_rebuilt_never_read(
    tiny_root: Path, tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    first = build(tiny_root, tmp_path)
    assert first.built
    folder = first.path
    files = folder / "_tensordict"
    images, labels = files / "images.memmap", files / "labels.memmap"
    del first
    if damage == "truncate":
        with open(images, "r+b") as f:
            f.truncate(images.stat().st_size // 2)
    elif damage == "extend":
        with open(images, "ab") as f:
            f.write(b"\0" * 100)
    elif damage == "edit_image_row":  # one byte of the first image: a sampled row
        edit_byte(images, 100)
    else:
        edit_byte(labels, 0)

    second = build(tiny_root, tmp_path)
    assert second.built and second.path == folder  # rebuilt in place, under its lock
    assert "was changed after it was built" in caplog.text
    expected_word = {"truncate": "images.memmap", "extend": "images.memmap"}.get(damage, "checksum")
    assert expected_word in caplog.text
    assert torch.equal(torch.as_tensor(second.data.images), reference(tiny_root))
    assert second.data.labels.tolist() == list(folder_index(tiny_root).val.labels)


def test_an_unchanged_cache_is_opened_not_rebuilt(tiny_root: Path, tmp_path: Path) -> None:
    build(tiny_root, tmp_path)
    again = build(tiny_root, tmp_path)
    assert not again.built
    integrity = json.loads((again.path / META_FILE).read_text())["integrity"]
    assert set(integrity["files"]) >= {"_tensordict/images.memmap", "_tensordict/labels.memmap"}
    assert len(integrity["sample"]) == 32


# ---------------------------------------------------------------------------------------------
# The disk itself: a small tmpfs that fills up, a read-only one.

CAN_MOUNT = (
    shutil.which("unshare") is not None
    and subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True
    ).returncode
    == 0
)
NO_MOUNT_REASON = "needs unshare to mount a private tmpfs (user namespaces disabled here)"

IN_TMPFS = """
import json, os, shutil, sys
from pathlib import Path
from omegaconf import OmegaConf
import loaderbench.loaders.memmap.build as mb
import loaderbench.loaders.memmap._cache as mc
import loaderbench.loaders.memmap.store_raw as raw_store
from loaderbench.config.schema import DatasetConfig
from loaderbench.data.discovery import discover

root, cache_dir, step = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
cfg = OmegaConf.structured(DatasetConfig(index_dir=None))
cfg.name, cfg.root = "folder", root
split = discover(cfg).val
policy = mb.StorePolicy.for_split(False, 32, 1.5)

def build(policy=policy):
    return mc.ensure_cache(split, policy, cache_dir, num_workers=1, skip_errors=True,
                           progress=False)

def report(**extra):
    print(json.dumps({"entries": sorted(os.listdir(cache_dir)) if cache_dir.exists() else [],
                      **extra}))

if step == "fill":
    # Someone else fills the disk right after the free-space check passed.
    real_reserve = raw_store.reserve_space
    def filled_first(folder):
        free = shutil.disk_usage(cache_dir).free
        with open(cache_dir / "someone_else.bin", "wb") as f:
            f.write(b"x" * (free - 4096))
        return real_reserve(folder)
    raw_store.reserve_space = filled_first
    try:
        build()
    except mb.CacheError as error:
        os.remove(cache_dir / "someone_else.bin")
        report(error=str(error))
        raw_store.reserve_space = real_reserve
        cache = build()  # space again: the same run builds it
        report(built=cache.built, images=int(cache.data.images.shape[0]))
elif step == "build":
    report(built=build().built)
elif step == "read":
    cache = build()
    report(built=cache.built, images=int(cache.data.images.shape[0]))
    try:
        build(mb.StorePolicy.for_split(False, 48, 1.5))  # another size: needs a build
    except mb.CacheError as error:
        report(error=str(error))
"""


def in_tmpfs(tmp_path: Path, shell: str) -> list[dict]:
    """Run ``shell`` in a private mount namespace with a 2 MB tmpfs mounted at tmp_path/disk
    (``$DISK``) and ``$BUILD root cache_dir step`` running IN_TMPFS; its JSON lines."""
    disk = tmp_path / "disk"
    disk.mkdir()
    script = tmp_path / "in_tmpfs.py"
    script.write_text(IN_TMPFS)
    command = f"mount -t tmpfs -o size=2m tmpfs {disk} && {shell}"
    proc = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", command],
        cwd=REPO,
        env={
            **os.environ,
            "DISK": str(disk),
            "BUILD": f"{sys.executable} {script}",
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
@pytest.mark.skipif(not CAN_MOUNT, reason=NO_MOUNT_REASON)
def test_a_disk_that_fills_during_the_build_fails_at_once_and_leaves_nothing(
    tiny_root: Path, tmp_path: Path
) -> None:
    failed, rebuilt = in_tmpfs(tmp_path, f'$BUILD {tiny_root} "$DISK/cache" fill')
    name = cache_name(folder_index(tiny_root).val, POLICY)
    assert "cannot reserve" in failed["error"] and "No space left on device" in failed["error"]
    assert str(Path("cache") / f".{name}.tmp-") in failed["error"]  # names the folder
    # No half-written cache: neither the final folder nor the build's temporary one.
    assert failed["entries"] == [".lockkind", f".{name}.inuse", f".{name}.lock"]
    entries = [".lockkind", f".{name}.inuse", f".{name}.lock", name]
    assert rebuilt == {"entries": entries, "built": True, "images": 12}


@pytest.mark.slow
@pytest.mark.skipif(not CAN_MOUNT, reason=NO_MOUNT_REASON)
def test_a_read_only_cache_dir_serves_its_caches_and_names_the_key_for_a_new_one(
    tiny_root: Path, tmp_path: Path
) -> None:
    built, opened, refused = in_tmpfs(
        tmp_path,
        f'$BUILD {tiny_root} "$DISK/cache" build && mount -o remount,ro "$DISK" && '
        f'$BUILD {tiny_root} "$DISK/cache" read',
    )
    assert built["built"] is True
    assert opened["built"] is False and opened["images"] == 12
    assert "loader.cache_dir=" in refused["error"] and "not writable" in refused["error"]
