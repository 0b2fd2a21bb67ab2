"""Reading an offline W&B run back, for the tests: the ``.wandb`` file is a log of protobuf
records in 32 KiB blocks (LevelDB's log format behind a 7-byte W&B header)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_BLOCK = 32 * 1024
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log")
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        room = _BLOCK - pos % _BLOCK
        if room < _HEADER:
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == 0:
            pos += room - _HEADER - length  # zero padding to the end of the block
            continue
        if kind in (_FULL, _FIRST):
            pending = chunk
        else:
            pending += chunk
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


@dataclass
class OfflineRun:
    run_id: str
    group: str
    job_type: str
    name: str
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)


def _items(updates: Any) -> dict[str, Any]:
    out = {}
    for item in updates:
        key = ".".join(item.nested_key) if item.nested_key else item.key
        out[key] = json.loads(item.value_json)
    return out


def read_offline_run(run_dir: str | Path) -> OfflineRun:
    """Config, summary and history of an offline run folder (``wandb/offline-run-*``)."""
    run_dir = Path(run_dir)
    logs = sorted(run_dir.glob("run-*.wandb"))
    if not logs:
        raise FileNotFoundError(f"no run-*.wandb file in {run_dir}")
    run = OfflineRun(run_id="", group="", job_type="", name="")
    for record in _records(logs[0]):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id = record.run.run_id
            run.group = record.run.run_group
            run.job_type = record.run.job_type
            run.name = record.run.display_name
            run.config.update(_items(record.run.config.update))
        elif kind == "config":
            run.config.update(_items(record.config.update))
        elif kind == "summary":
            run.summary.update(_items(record.summary.update))
        elif kind == "history":
            run.history.append(_items(record.history.item))
        elif kind == "files":
            run.files.extend(f.path for f in record.files.files)
        elif kind == "artifact":
            artifact = record.artifact
            run.artifacts.append(
                {
                    "name": artifact.name,
                    "type": artifact.type,
                    "aliases": list(artifact.aliases),
                    "files": [entry.path for entry in artifact.manifest.contents],
                    "metadata": json.loads(artifact.metadata or "{}"),
                }
            )
    return run


def offline_runs(root: str | Path) -> list[OfflineRun]:
    """Every offline run under ``root`` (searched recursively)."""
    return [read_offline_run(p) for p in sorted(Path(root).rglob("offline-run-*")) if p.is_dir()]
