"""The CPU time and memory of the whole process tree (workers included), sampled in a thread.

``ProcessTreeMonitor`` samples this process and its descendants; ``CpuWindow`` sums the tree's
CPU seconds over the windows a loop measures (docs/metrics.md, ``cpu_s_per_1k_images``).
"""

from __future__ import annotations

import os
import threading

import psutil


def _is_excluded(proc: psutil.Process) -> bool:
    try:
        name = proc.name()
        cmdline = " ".join(proc.cmdline()[:2])
    except (psutil.Error, OSError):
        return True
    return "wandb" in name or "wandb" in cmdline


def _child_pids(pid: int) -> list[int] | None:
    """The children of process ``pid``, from Linux's ``/proc/<pid>/task/<tid>/children`` (a
    small read per thread); None where the kernel does not keep those files."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    pids: list[int] = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                pids += map(int, f.read().split())
        except FileNotFoundError:  # a thread that ended, or no such file on this kernel
            if task == str(pid):
                return None
        except OSError:
            continue
    return pids


def _resident_bytes(proc: psutil.Process) -> int:
    """Proportional set size where the OS reports it: forked workers share the parent's pages
    (and every process maps the same page cache for memmaps), and summing plain RSS would
    count those pages once per process."""
    try:
        return int(proc.memory_full_info().pss)
    except (AttributeError, psutil.AccessDenied):
        return int(proc.memory_info().rss)


class ProcessTreeMonitor:
    """CPU seconds and peak RSS of this process and its descendants, sampled in a thread.

    CPU time of a worker that exits between two samples is counted up to its last sample
    (``interval_s`` bounds the loss); ``snapshot()`` samples at once, so call it at the edges of
    the window you measure.
    """

    def __init__(self, interval_s: float = 0.25, memory_every: int = 4) -> None:
        self.interval_s = interval_s
        # Reading PSS (smaps) costs milliseconds for a process with large mappings: sample
        # memory every few CPU samples, and never at the edges of a measured window.
        self.memory_every = memory_every
        self._samples = 0
        self.root = psutil.Process(os.getpid())
        self._procs: dict[int, psutil.Process] = {}  # descendants seen, reused (cheap to ask)
        self._cpu: dict[int, float] = {}
        self._excluded: set[int] = set()
        self.peak_rss_bytes = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self, memory: bool = True) -> float:
        """Sample the tree now; returns its total CPU seconds so far."""
        with self._lock:
            rss = 0
            for proc in [self.root, *self._descendants()]:
                if proc.pid in self._excluded:
                    continue
                if proc is not self.root and _is_excluded(proc):
                    self._excluded.add(proc.pid)
                    continue
                try:
                    with proc.oneshot():
                        times = proc.cpu_times()
                        if memory:
                            rss += _resident_bytes(proc)
                except psutil.Error:
                    continue
                self._cpu[proc.pid] = times.user + times.system
            if memory:
                self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
            return sum(self._cpu.values())

    def _descendants(self) -> list[psutil.Process]:
        """The tree below this process, read from each process's children files: far cheaper
        than psutil's scan of every process on the machine (docs/measurements.md has both),
        since the monitor samples at every measured window's edges, twice an epoch."""
        pids, frontier = [], [self.root.pid]
        while frontier:
            found = _child_pids(frontier.pop())
            if found is None:  # no children files: psutil's scan
                try:
                    return self.root.children(recursive=True)
                except psutil.Error:
                    return []
            pids += found
            frontier += found
        known, self._procs = self._procs, {}
        for pid in pids:
            try:
                self._procs[pid] = known[pid] if pid in known else psutil.Process(pid)
            except psutil.Error:
                continue
        return list(self._procs.values())

    def snapshot(self) -> float:
        """CPU seconds of the tree now (cheap: no memory reading)."""
        return self.sample(memory=False)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._samples += 1
            self.sample(memory=self._samples % self.memory_every == 0)

    def start(self) -> ProcessTreeMonitor:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="process-tree-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    def __enter__(self) -> ProcessTreeMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class CpuWindow:
    """Sums the tree's CPU seconds over several windows (for example, the train epochs only)."""

    def __init__(self, monitor: ProcessTreeMonitor) -> None:
        self.monitor = monitor
        self.cpu_s = 0.0
        self._start: float | None = None

    def __enter__(self) -> CpuWindow:
        self._start = self.monitor.snapshot()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._start is not None
        self.cpu_s += self.monitor.snapshot() - self._start
        self._start = None
