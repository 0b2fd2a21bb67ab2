"""The GPU check's helpers (``tools/gpu_check/gpu_check.sh``): the machine, the data, the decode
phases, the report. Run from the repository root:

    python -m tools.gpu_check env OUT.json [--quick]       the machine (machine.py)
    python -m tools.gpu_check data PARENT --classes N --train N --val N
                                                           the synthetic set; prints its root
    python -m tools.gpu_check decode ROOT --out JSON --device cuda    (decode_bench.py)
    python -m tools.gpu_check sharing ROOT --out JSON --device cuda   (sharing.py)
    python -m tools.gpu_check report --runs DIR --plan PLAN --phases PHASES ...   (report.py)

The report needs only the standard library and tabulate, so it is written even where the kit
did not install.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tools.gpu_check import decode_bench, machine, report, sharing


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="python -m tools.gpu_check", description=__doc__.splitlines()[0]
    )
    sub = root.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env", help="record the machine as JSON")
    env.add_argument("out", type=Path)
    env.add_argument("--quick", action="store_true", help="no library probes (seconds)")
    data = sub.add_parser("data", help="generate the synthetic set and print its root")
    data.add_argument("parent", type=Path)
    data.add_argument("--classes", type=int, default=100)
    data.add_argument("--train", type=int, default=40, help="train images a class")
    data.add_argument("--val", type=int, default=10, help="val images a class")
    data.add_argument("--max-side", type=int, default=None, help="long side (default: ImageNet's)")
    dec = sub.add_parser("decode", help="time batched JPEG decoding, write JSON")
    dec.add_argument("root", type=Path, help="the synthetic set's root (train/ inside)")
    dec.add_argument("--out", type=Path, required=True)
    dec.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    dec.add_argument("--batch", type=int, default=256)
    dec.add_argument("--images", type=int, default=2048, help="at most this many train JPEGs")
    dec.add_argument("--seconds", type=float, default=3.0, help="each case's time")
    dec.add_argument("--dry-run", action="store_true", help="on the CPU (no GPU figures)")
    share = sub.add_parser("sharing", help="time the ways of driving the JPEG decoder")
    share.add_argument("root", type=Path, help="the synthetic set's root (train/ inside)")
    share.add_argument("--out", type=Path, required=True)
    share.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    share.add_argument("--backend", choices=("hw", "hybrid"), default="hw")
    share.add_argument("--images", type=int, default=1024, help="at most this many train JPEGs")
    share.add_argument("--seconds", type=float, default=1.5, help="each mode's time")
    rep = sub.add_parser("report", help="write the markdown report")
    rep.add_argument("--out", type=Path, required=True)
    rep.add_argument("--runs", type=Path, required=True)
    rep.add_argument("--plan", type=Path)
    rep.add_argument("--phases", type=Path)
    rep.add_argument("--env", type=Path)
    rep.add_argument("--pytest-log", type=Path)
    rep.add_argument("--title", default="GPU check")
    rep.add_argument("--note", action="append", default=[])
    rep.add_argument("--decode", type=Path, help="the decode phase's JSON")
    rep.add_argument("--sharing", type=Path, help="the sharing phase's JSON")
    return root


def record_machine(out: Path, quick: bool) -> int:
    info = machine.machine_info(probes=not quick)
    out.write_text(json.dumps(info, indent=2) + "\n")
    for name, probe in info["probes"].items():
        print(f"import {name}: {'ok' if probe['loaded'] else 'FAILED'}: {probe['detail']}")
    print(f"torch {info.get('torch')}, CUDA available: {info.get('cuda_available')}")
    return 0


def make_data(parent: Path, classes: int, train: int, val: int, max_side: int | None) -> int:
    from loaderbench.data.synthetic import SyntheticSpec, ensure_synthetic

    spec = SyntheticSpec(
        num_classes=classes, train_per_class=train, val_per_class=val, max_side=max_side
    )
    print(ensure_synthetic(spec, parent.absolute()))
    return 0


def time_decoding(args: argparse.Namespace) -> int:
    def save(result: dict[str, Any]) -> None:  # after every case: a crash keeps the rows before
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    device = "cpu" if args.dry_run else args.device
    result = decode_bench.decode_benchmark(
        args.root, device, args.batch, args.images, args.seconds, save
    )
    return decode_bench.decode_exit_code(result)


def time_sharing(args: argparse.Namespace) -> int:
    result = sharing.sharing_benchmark(
        args.root, args.device, args.backend, args.images, args.seconds
    )
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for case in result["cases"]:
        print(json.dumps(case))
    return 0 if all(case["status"] == "ok" for case in result["cases"]) else 1


def write_report(args: argparse.Namespace) -> int:
    ok, total = report.write_report(
        args.out,
        args.runs,
        args.plan,
        args.phases,
        args.env,
        args.pytest_log,
        args.title,
        args.note,
        args.decode,
        args.sharing,
    )
    print(f"{args.out}: {ok} of {total} benchmark jobs ok")
    return 0 if ok == total and total > 0 else 1


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "env":
        return record_machine(args.out, args.quick)
    if args.command == "data":
        return make_data(args.parent, args.classes, args.train, args.val, args.max_side)
    if args.command == "decode":
        return time_decoding(args)
    if args.command == "sharing":
        return time_sharing(args)
    return write_report(args)


if __name__ == "__main__":
    sys.exit(main())
