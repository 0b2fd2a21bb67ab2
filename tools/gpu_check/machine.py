"""The machine record (``python -m tools.gpu_check env OUT.json``): Python, torch, CUDA, the GPU
(and ``nvidia-smi``), the kit's packages, and whether torchcodec, ``spdl.io`` and nvImageCodec
load (each tried in a fresh interpreter, so a library that crashes on load cannot take the
check with it)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

PACKAGES = (
    "torch",
    "torchvision",
    "timm",
    "numpy",
    "pillow",
    "hydra-core",
    "omegaconf",
    "antlr4-python3-runtime",
    "tensordict",
    "pyvers",
    "spdl",
    "spdl_core",
    "spdl_io",
    "torchcodec",
    "nvidia-nvimgcodec-cu13",
    "nvidia-nvjpeg",
    "pytest",
    "pytest-timeout",
    "psutil",
)
PROBES = {
    "torchcodec": "import torchcodec, torchcodec.decoders; print(torchcodec.__version__)",
    "spdl.io": "import spdl.io; print('imported')",
    "tensordict": "import tensordict; print(tensordict.__version__)",
    "hydra": "import hydra, omegaconf; print(hydra.__version__, omegaconf.__version__)",
    # The libnvjpeg its nvJPEG extension loaded on import (the kit's, found through
    # nvImageCodec's RUNPATH), and whether a GPU decoder can be made.
    "nvimgcodec": """
import os
os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
import torch
from nvidia import nvimgcodec as nv
gpu = "no GPU"
if torch.cuda.is_available():
    nv.Decoder(device_id=0)
    gpu = "GPU decoder made"
maps = open("/proc/self/maps").read().split()
nvjpeg = next((p for p in maps if "libnvjpeg.so" in p), "libnvjpeg not loaded")
print(f"{nv.__version__}, {gpu}, nvjpeg: {nvjpeg}")
""",
    "loaderbench.imaging.decode": """
import torch
from loaderbench.imaging import decode
devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
print(", ".join(
    f"{d}: {decode.backend(d)}{' (regions)' if decode.region_decode(d) else ''}" for d in devices
))
""",
}


def _run(command: list[str], timeout: float = 60) -> tuple[int, str]:
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        return -1, f"{type(error).__name__}: {error}"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _probe(code: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter: loaded or not, and the last line it printed (to
    stdout where it worked: nvImageCodec's notes on optional libraries go to stderr; to
    either where it failed)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"loaded": False, "detail": f"{type(error).__name__}: {error}"}
    output = proc.stdout if proc.returncode == 0 else proc.stdout + proc.stderr
    lines = [line for line in output.splitlines() if line.strip()]
    return {
        "loaded": proc.returncode == 0,
        "detail": lines[-1] if lines else f"exit code {proc.returncode}",
    }


def _probe_all() -> dict[str, dict[str, Any]]:
    """Every probe, at once: each is a fresh interpreter (seconds, most importing torch), and
    the GPU machine's time is counted."""
    with ThreadPoolExecutor(max_workers=len(PROBES)) as pool:
        results = {name: pool.submit(_probe, code) for name, code in PROBES.items()}
        return {name: result.result() for name, result in results.items()}


def machine_info(probes: bool = True) -> dict[str, Any]:
    """The machine as JSON; without ``probes`` (the first record, written before the kit is
    installed) no library is imported in a fresh interpreter."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "packages": {},
    }
    for name in PACKAGES:
        try:
            info["packages"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info["packages"][name] = None
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda_build"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
            info["gpu_memory_gb"] = round(props.total_memory / 1e9, 1)
            info["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
            info["cudnn"] = torch.backends.cudnn.version()
            info["bf16_supported"] = torch.cuda.is_bf16_supported()
    except Exception as error:  # the report says what is wrong instead of failing
        info["torch_error"] = f"{type(error).__name__}: {error}"
    info["probes"] = _probe_all() if probes else {}
    if shutil.which("nvidia-smi"):
        _, info["nvidia_smi"] = _run(["nvidia-smi"])
        _, info["nvidia_smi_query"] = _run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm",
                "--format=csv",
            ]
        )
    else:
        info["nvidia_smi"] = "nvidia-smi not found"
    return info
