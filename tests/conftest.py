"""Shared fixtures: small generated data sets on disk and real runs of the entry points."""

# ruff: noqa: E402  (the cores are shared out before torch is first imported: share_the_cores)

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import random
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import pytest_timeout
from _pytest.faulthandler import fault_handler_stderr_fd_key


def share_the_cores(env: dict[str, str] | os._Environ = os.environ) -> None:
    """Each xdist worker, and every process its tests start, gets its share of the cores in
    OMP_NUM_THREADS (unless given one): at torch's default, two runs at once on 2 cores spin
    OpenMP threads on each other's cores (docs/design.md, "The test suite"). Called before
    torch is first imported: OpenMP reads the variable when it loads."""
    workers = int(env.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in env:
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cpus = os.cpu_count() or 1
        env["OMP_NUM_THREADS"] = str(max(1, cpus // workers))


share_the_cores()

from loaderbench.data.synthetic import SyntheticSpec, ensure_synthetic
from loaderbench.imaging.files import DEFAULT_MAX_PIXELS, set_max_pixels
from loaderbench.loaders import file_loader_names, loader_names, settings_class
from tests import fd_audit

# The descriptor audit is opt-in (`make test-audit` names its folder and preloads its shim): a
# plain run tests the product as users run it, with the real os.close and Connection.
if os.environ.get("FD_AUDIT_DIR"):
    fd_audit.install()  # before any test: in the controller and in every xdist worker

REPO = Path(__file__).resolve().parents[1]
TINY = SyntheticSpec(num_classes=3, train_per_class=8, val_per_class=4, seed=0)


# Each way a loader runs on the CPU, as overrides of its keys, where it has more than its
# defaults: the loader contract and the pixel-parity tests run every one.
CONTRACT_VARIANTS: dict[str, list[dict[str, Any]]] = {
    "memmap": [{"store": "raw"}, {"store": "jpeg"}],
    "spdl": [{"decoder": "turbo"}, {"decoder": "ffmpeg"}],
}


def loader_variants(names: tuple[str, ...] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """Every loader in the registry (or of ``names``) and every way it runs on the CPU
    (``CONTRACT_VARIANTS``): the matrix of the loader contract (every loader) and of the
    pixel-parity tests (``READERS``: the loaders that read the files)."""
    return [
        (name, variant)
        for name in (loader_names() if names is None else names)
        for variant in CONTRACT_VARIANTS.get(name, [{}])
    ]


READERS = loader_variants(file_loader_names())


def loader_folders(loader: str, folder: Path) -> dict[str, str]:
    """The on-disk folders loader ``loader`` keeps (the keys its settings declare in
    ``folder_keys``: memmap's ``cache_dir``), each under ``folder``, so that a test's runs never
    share the repo's."""
    return {key: str(folder / key) for key in settings_class(loader).folder_keys()}


def loader_folder_overrides(loader: str, folder: Path) -> list[str]:
    """``loader_folders`` as command-line overrides (``loader.cache_dir=...``)."""
    return [f"loader.{key}={value}" for key, value in loader_folders(loader, folder).items()]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--order",
        default="slow-first",
        help="slow-first (the default: the modules of xdist groups, then those with slow "
        "tests, then the rest, each as written), as-written, reverse, or shuffle:SEED (a check "
        "that no test depends on another having run first)",
    )


def _slow_first(items: list[pytest.Item]) -> Callable[[pytest.Item], tuple[bool, bool]]:
    """The longest work first (xdist hands the tests out in this order), so that two workers
    end together, the short tests filling in behind the long ones, rather than one worker
    finishing a long end-to-end run alone: first the modules of an xdist group (a group is one
    worker's, never split), then the other modules with a slow test, then the rest; each
    module whole and as written (a module fixture is made once). A key for a stable sort."""

    def modules(marker: str) -> set[object]:
        return {getattr(i, "module", None) for i in items if i.get_closest_marker(marker)}

    grouped, slow = modules("xdist_group"), modules("slow")

    def key(item: pytest.Item) -> tuple[bool, bool]:
        module = getattr(item, "module", None)
        return module not in grouped, module not in slow

    return key


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order = config.getoption("--order")
    if order == "slow-first":
        items.sort(key=_slow_first(items))
    elif order == "reverse":
        items.reverse()
    elif order.startswith("shuffle:"):
        # Seeded (the same order in every xdist worker); the modules in a random order and the
        # tests in each, but each module's tests together, as pytest-randomly does: a module
        # fixture (the quick bench) would otherwise be torn down and rebuilt at every turn.
        rng = random.Random(int(order.split(":", 1)[1]))
        modules: dict[str, list[pytest.Item]] = {}
        for item in items:
            modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
        groups = list(modules.values())
        rng.shuffle(groups)
        for group in groups:
            rng.shuffle(group)
        items[:] = [item for group in groups for item in group]
    elif order != "as-written":
        raise pytest.UsageError(f"--order={order}: slow-first, as-written, reverse or shuffle:SEED")


@pytest.fixture(autouse=True)
def native_watchdog(request: pytest.FixtureRequest) -> Iterator[None]:
    """Behind pytest-timeout (a Python thread, which a main thread blocked in native code with
    the GIL held would stall too): faulthandler's watchdog, a C thread, prints every thread's
    stack and ends the process a minute after the test's timeout (pytest-timeout's own reading
    of it: marker, --timeout, PYTEST_TIMEOUT, ini; none under a debugger). xdist then fails that
    test and ends the run (``--max-worker-restart=0``): a hang can never hold it for ever. The
    stacks go to pytest's copy of the real stderr, which output capture does not swallow. (A
    child forked with ``os.fork`` that then exits through the interpreter's finalisation would
    wait for the watchdog thread it does not have: children here exit as multiprocessing's do,
    with ``os._exit``.)"""
    settings = pytest_timeout._get_item_settings(request.node)
    if not settings.timeout or settings.timeout <= 0 or pytest_timeout.is_debugging():
        yield
        return
    stderr = request.config.stash.get(fault_handler_stderr_fd_key, None)
    where = stderr if stderr is not None else sys.__stderr__
    faulthandler.dump_traceback_later(settings.timeout + 60, exit=True, file=where)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


class ProcessInAFastTest(RuntimeError):
    """A test not marked ``slow`` started a process (not an OSError: nothing swallows it)."""


@pytest.fixture(scope="session", autouse=True)
def first_use_probes() -> None:
    """What starts a process on its first use in a process, done here once a worker, so that
    a test meeting it second starts none: matplotlib's font cache (``fc-list``; the sweep plots,
    the report) and ``platform.processor()`` (``uname -p``; the remembered decisions' keys)."""
    import platform

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.font_manager  # builds the cache

    platform.processor()


@pytest.fixture(autouse=True)
def process_guard(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[str]]:
    """A test that starts a process (train.py, eval.py, torchrun, a script, a compiler, even
    ``python -c``) is marked ``slow``: `make test-fast` leaves them out, and this keeps it so.
    Any other test that starts one fails, naming the command (even where its code catches the
    refusal). Processes a loader forks (DataLoader workers) are not started this way. Yields
    the commands refused (tests/test_suite.py empties it, having checked the refusal)."""
    if request.node.get_closest_marker("slow"):
        yield []
        return
    started: list[str] = []

    def refuse(self: subprocess.Popen, args: Any, *rest: Any, **options: Any) -> None:
        started.append(repr(args)[:300])
        raise ProcessInAFastTest(
            f"{request.node.nodeid} starts a process, {started[-1]}, and is not marked slow: "
            "mark it @pytest.mark.slow (docs/design.md#the-test-suite)"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    yield started
    assert not started, f"started a process in a test not marked slow: {started}"


def _audit_folder() -> str | None:
    """The descriptor audit's folder, in the controller only (xdist workers have no summary)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return os.environ.get("FD_AUDIT_DIR") or None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    folder = _audit_folder()
    if folder and os.environ.get("FD_AUDIT_STRICT") == "1" and fd_audit.findings(folder)[1]:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    folder = _audit_folder()
    if folder is None:
        return
    if not fd_audit.shim_loaded():
        terminalreporter.write_line("descriptor audit: off (closeshim.so not preloaded)")
        return
    audited, text = fd_audit.findings(folder)
    if not text:
        terminalreporter.write_line(
            "descriptor audit: no descriptor closed twice, none taken from a live "
            f"multiprocessing Connection ({audited} pytest processes with Python stacks, every "
            "Python process they started natively)"
        )
        shutil.rmtree(folder, ignore_errors=True)
        return
    terminalreporter.section("descriptor audit: a descriptor closed twice or taken (issue 21)")
    terminalreporter.write_line(text)
    terminalreporter.write_line(f"(all of it in {folder})")


def shared_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the session's generated data sets go: one folder for all xdist workers (the
    session's base folder holds one per worker), made once under ensure_synthetic's lock."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "data"


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-class ImageFolder tree of real JPEGs: 24 train and 12 val images (read only)."""
    return ensure_synthetic(TINY, shared_data_dir(tmp_path_factory))


@pytest.fixture(scope="session")
def small_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-class tree big enough to learn from: 160 train and 40 val images (read only)."""
    spec = SyntheticSpec(num_classes=4, train_per_class=40, val_per_class=10, seed=1)
    return ensure_synthetic(spec, shared_data_dir(tmp_path_factory))


# The pixel limit of the messy tests (tests/test_messy.py, tests/test_messy_verdicts.py).
MAX_PIXELS = 1_000_000  # huge.JPEG is 1200 x 1000; every other image is at most 120 x 90


@pytest.fixture
def pixel_limit():
    set_max_pixels(MAX_PIXELS)
    yield MAX_PIXELS
    set_max_pixels(DEFAULT_MAX_PIXELS)


def run_entry(
    script: str,
    *overrides: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Run train.py or eval.py for real, in a subprocess, with outputs under ``cwd``."""
    full_env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, str(REPO / script), *overrides],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{script} {' '.join(overrides)} exited {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc


def start_torchrun(
    *args: str,
    cwd: Path,
    nproc: int = 2,
    script: Path = REPO / "train.py",
    launcher: str = "torch.distributed.run",
) -> subprocess.Popen:
    """train.py (or ``script``) under torchrun (or ``launcher``, a module taking torchrun's
    arguments), ``nproc`` processes on this machine; output on ``stdout``, as it comes."""
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            launcher,
            "--standalone",
            f"--nproc_per_node={nproc}",
            str(script),
            *args,
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float) -> str:
    """Its output once it ends; killed whole (agent and ranks) if it runs past ``timeout``."""
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        agent = psutil.Process(proc.pid)
        for process in [*agent.children(recursive=True), agent]:  # ranks have own sessions
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        output, _ = proc.communicate()
        raise AssertionError(f"still running after {timeout:.0f} s:\n{output[-4000:]}") from None
    return output


def torchrun(
    *args: str, cwd: Path, check: bool = True, timeout: float = 900, nproc: int = 2
) -> subprocess.CompletedProcess:
    """train.py under torchrun, two processes on this machine."""
    proc = start_torchrun(*args, cwd=cwd, nproc=nproc)
    output = finish(proc, timeout)
    if check:
        assert proc.returncode == 0, output[-6000:]
    return subprocess.CompletedProcess(proc.args, proc.returncode, output, "")


def reference_checkpoints(
    tmp_path_factory: pytest.TempPathFactory, launch: Callable[..., object]
) -> Callable[..., dict]:
    """For a module fixture: the checkpoint of the uninterrupted run that ``launch(*key,
    cwd=folder)`` makes (train.py or torchrun, with its own outputs/), run once a key and kept;
    the resume tests of the module compare their resumed runs with it."""
    made: dict[tuple[str, ...], dict] = {}

    def get(*key: str) -> dict:
        if key not in made:
            import torch

            cwd = tmp_path_factory.mktemp("whole")
            launch(*key, cwd=cwd)
            (run_dir,) = run_dirs(cwd, "train")
            made[key] = torch.load(run_dir / "checkpoint.pt", weights_only=True)
        return made[key]

    return get


def run_dirs(cwd: Path, task: str) -> list[Path]:
    """Run directories (those holding metrics.json) that a job left under cwd/outputs/<task>."""
    return sorted(p.parent for p in (cwd / "outputs" / task).rglob("metrics.json"))


def read_metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def single_run(cwd: Path, task: str) -> tuple[Path, dict]:
    dirs = run_dirs(cwd, task)
    assert len(dirs) == 1, f"expected one run directory, found {dirs}"
    return dirs[0], read_metrics(dirs[0])


def folder_index(root: Path):
    """Discover an ImageFolder tree the way every run does."""
    from omegaconf import OmegaConf

    from loaderbench.config.schema import DatasetConfig
    from loaderbench.data.discovery import discover

    cfg = OmegaConf.structured(DatasetConfig(index_dir=None))
    cfg.name, cfg.root = "folder", str(root)
    return discover(cfg)


def rewrite_in_place(path: Path, colour: tuple[int, int, int], same_size: bool = False) -> None:
    """Another photo written over ``path`` itself (Pillow's save, as mogrify or a CMYK fix
    does): its folder's mtime stays as it was. ``same_size``: padded with a JPEG comment to
    the old file's size exactly, so only the mtime tells it apart."""
    import io

    from PIL import Image

    folder_mtime = path.parent.stat().st_mtime_ns
    size, quality = path.stat().st_size, 95
    while True:
        buffer = io.BytesIO()
        Image.new("RGB", (47, 41), colour).save(buffer, "JPEG", quality=quality)
        data = buffer.getvalue()
        if not same_size or len(data) + 4 <= size:
            break
        quality -= 10  # too big to pad to the old size: a smaller encoding
        assert quality > 0, f"cannot encode a JPEG smaller than {path} ({size} bytes)"
    if same_size:  # SOI, then COM segments (FFFE, 2-byte length, text) filling the difference
        comments, missing = b"", size - len(data)
        while missing:
            length = min(missing - 2, 65535) if missing - 2 <= 65535 else 32768
            comments += b"\xff\xfe" + length.to_bytes(2, "big") + b"\0" * (length - 2)
            missing -= length + 2
        data = data[:2] + comments + data[2:]
        assert len(data) == size
    with open(path, "r+b") as file:  # over the same inode, as an in-place editor writes
        file.truncate(0)
        file.write(data)
    assert path.parent.stat().st_mtime_ns == folder_mtime


def cpu_spec(split, train: bool, loader: str = "torchvision", **overrides):
    """A small LoaderSpec on the CPU for ``loader``; keyword arguments override the fields of
    the spec or of the loader's typed settings (``cache_dir=...``, ``decoder=...``)."""
    from dataclasses import fields

    import torch

    from loaderbench.loaders import LoaderSpec, settings_class

    settings_type = settings_class(loader)
    keys = {f.name for f in fields(settings_type)}
    settings = {"batch_size": 5, "num_workers": 1, "prefetch": 2}
    settings.update({k: v for k, v in overrides.items() if k in keys})
    spec = {"split": split, "train": train, "image_size": 32, "device": torch.device("cpu")}
    spec.update({k: v for k, v in overrides.items() if k not in keys})
    return LoaderSpec(settings=settings_type(name=loader, **settings), **spec)


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports free now, below the ephemeral range (where no
    outgoing connection of a test running meanwhile can take one): a session's own, so that
    clusters of sessions running at once do not meet."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        first = rng.randrange(20000, low - count)
        sockets = [socket.socket() for _ in range(count)]
        try:
            for offset, sock in enumerate(sockets):
                sock.bind(("", first + offset))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        return first
    raise RuntimeError(f"no {count} consecutive free ports below {low}")


@pytest.fixture(scope="session")
def local_slurm(tmp_path_factory: pytest.TempPathFactory):
    """A one-node SLURM cluster started for the session (scripts/local_slurm.sh): yields the
    environment to submit with (SLURM_CONF); stops the daemons it started. Skips, with the
    reason, where SLURM cannot start here (not root, no apt-get)."""
    state = tmp_path_factory.mktemp("slurm")
    script = REPO / "scripts" / "local_slurm.sh"
    # slurmctld's and slurmd's ports, and the jobs' MASTER_PORT (submitit otherwise draws it
    # from the job id: job 1 of every fresh cluster would take the same port).
    port = free_ports(3)
    proc = subprocess.run(
        [str(script), "start", str(state)],
        env={**os.environ, "LOCAL_SLURM_PORT": str(port)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode == 2:
        pytest.skip(f"no local SLURM: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    conf = proc.stdout.strip().splitlines()[-1].split("=", 1)[1]
    try:
        yield {
            **os.environ,
            "SLURM_CONF": conf,
            "WANDB_MODE": "offline",
            "MASTER_PORT": str(port + 2),
        }
    finally:
        subprocess.run([str(script), "stop", str(state)], timeout=120, check=False)
