"""Where a loader's hot path spends its time: a sampling profile of a ``model=none`` run.

``python -m tools.bench.profile [--threads PREFIX] [--out DIR] -- OVERRIDES...`` (``make profile
ARGS='...'``) runs ``train.py model=none`` (``--task val``: ``eval.py``) under py-spy, which
samples every thread's stack from outside (the run's speed is the run's), after a warm-up run
that builds what the run needs (``--no-warmup`` skips it). It writes ``DIR/profile.txt``
(collapsed stacks, for flame graph tools) and ``DIR/profile.md`` (the loader threads' top
entries by self and total time; threads found by name, ``--subprocesses`` for torchvision's
workers; ``--idle`` keeps waiting samples, ``--native`` adds C/C++ frames). docs/benchmark.md
("Profiling a loader") says how to use it.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from loaderbench.platform.tables import markdown_table
from tools.bench import gil_profile, py_spy

REPO = Path(__file__).resolve().parents[2]
DEFAULT_THREADS = ("memmap-loader", "loaderbench_spdl_decode")
# py-spy's frame: "function (path/to/module.py:123)"; the line number varies within a function.
_FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^():]+)(?::\d+)?\)$")


@dataclass(frozen=True)
class Profile:
    """The loader threads' samples, as counts per frame."""

    samples: int
    self_counts: Counter[str]
    total_counts: Counter[str]

    def top(self, counts: Counter[str], n: int) -> list[tuple[str, float]]:
        return [(frame, 100.0 * c / max(1, self.samples)) for frame, c in counts.most_common(n)]


def frame_name(frame: str) -> str:
    """``function (module.py)``: the frame without its line number, its path from the package
    (``loaderbench/...``, ``torch/...``) rather than the disk's."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    path = match["file"]
    for root in ("site-packages/", "src/", "lib/python3"):
        if root in path:
            path = path.split(root, 1)[1]
    return f"{match['name']} ({path.split('/', 1)[-1] if path.startswith('.') else path})"


def summarise(lines: Iterable[str], threads: Sequence[str]) -> Profile:
    """The samples of the threads whose name starts with one of ``threads``, from py-spy's
    raw (collapsed) output: ``thread (tid): name;frame;...;frame count`` a line."""
    samples, self_counts, total_counts = 0, Counter[str](), Counter[str]()
    for line in lines:
        stack, _, count_text = line.rstrip("\n").rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        head, *frames = stack.split(";")
        name = head.split(": ", 1)[-1]
        if not any(name.startswith(prefix) for prefix in threads):
            continue
        count = int(count_text)
        samples += count
        names = [frame_name(frame) for frame in frames] or ["(no Python frame: native code)"]
        self_counts[names[-1]] += count
        for frame in set(names):
            total_counts[frame] += count
    return Profile(samples, self_counts, total_counts)


def render(profile: Profile, title: str, n: int = 15) -> str:
    """The top ``n`` entries by self and by total time, as markdown."""
    lines = [f"# {title}", "", f"{profile.samples} samples of the loader threads.", ""]
    for label, counts in (("self", profile.self_counts), ("total", profile.total_counts)):
        rows = [[f"{share:.1f}", f"`{frame}`"] for frame, share in profile.top(counts, n)]
        lines += [markdown_table([f"{label} %", "frame"], rows, align=["right", "left"]), ""]
    return "\n".join(lines)


def run_command(args: argparse.Namespace, folder: str, *more: str) -> list[str]:
    """The run's command; ``more`` overrides replace the user's of the same keys."""
    script = "eval.py" if args.task == "val" else "train.py"
    replaced = {override.split("=", 1)[0] for override in more}
    kept = [o for o in args.overrides if o.split("=", 1)[0].lstrip("+") not in replaced]
    run = [sys.executable, str(REPO / script), "model=none", "logger=none", *kept]
    return [*run, *more, f"hydra.run.dir={args.out / folder}"]


def record_command(args: argparse.Namespace, raw: Path) -> list[str]:
    run = run_command(args, "run")
    spy = [py_spy.executable(), "record", "--threads", "-r", str(args.rate), "-f", "raw"]
    spy += ["-o", str(raw)]
    spy += ["--idle"] * args.idle + ["--subprocesses"] * args.subprocesses
    spy += ["--native"] * args.native
    return [*spy, "--", *run]


def warm_up(args: argparse.Namespace) -> None:
    """A first pass builds what the run needs once (a memmap cache) and warms the page cache,
    so the profile is of the hot path; and py-spy names a thread by its id, which a new thread
    may take over from a finished one (the build's), hiding the loader's threads under another
    name."""
    warmup = run_command(args, "warmup", "bench.epochs=1")
    print("+", " ".join(warmup), flush=True)
    subprocess.run(warmup, check=True, stdout=subprocess.DEVNULL)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("profile"))
    parser.add_argument("--task", choices=("train", "val"), default="train")
    parser.add_argument(
        "--threads",
        default=",".join(DEFAULT_THREADS),
        help="comma-separated prefixes of the thread names to summarise",
    )
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--idle", action="store_true", help="keep waiting threads' samples")
    parser.add_argument("--subprocesses", action="store_true", help="sample worker processes")
    parser.add_argument("--native", action="store_true", help="C/C++ frames too (slower)")
    parser.add_argument(
        "--no-warmup", action="store_true", help="profile the first run (a cache build too)"
    )
    parser.add_argument(
        "--summarise", type=Path, default=None, help="only summarise this profile.txt"
    )
    parser.add_argument(
        "--gil",
        action="store_true",
        help="GIL-held ms per 1,000 images by thread group (py-spy --gil; two runs)",
    )
    parser.add_argument(
        "--gil-epochs", type=gil_profile.epochs_pair, default=(2, 6), help="A,B: the two runs"
    )
    parser.add_argument("overrides", nargs="*", help="train.py / eval.py overrides")
    args = parser.parse_args(argv)
    args.out = args.out.absolute()
    args.loader_threads = [prefix for prefix in args.threads.split(",") if prefix]
    if args.gil:
        if args.threads == ",".join(DEFAULT_THREADS):
            args.loader_threads = list(gil_profile.LOADER_THREADS)
        args.out.mkdir(parents=True, exist_ok=True)
        if not args.no_warmup:
            warm_up(args)
        gil_profile.measure(args, run_command)
        return 0
    raw = args.summarise or args.out / "profile.txt"
    if args.summarise is None:
        args.out.mkdir(parents=True, exist_ok=True)
        if not args.no_warmup:
            warm_up(args)
        command = record_command(args, raw)
        print("+", " ".join(command), flush=True)
        subprocess.run(command, check=True)
    threads = [prefix for prefix in args.threads.split(",") if prefix]
    with open(raw) as f:
        profile = summarise(f, threads)
    if profile.samples == 0:
        raise SystemExit(f"{raw}: no samples of threads named {', '.join(threads)}*")
    text = render(profile, f"Profile of {' '.join(args.overrides) or raw}", args.top)
    if args.summarise is None:
        (args.out / "profile.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
