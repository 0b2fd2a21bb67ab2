"""``SLOW_RANK=1 SLOW_DECODE_S=0.03 torchrun ... tests/slow_rank.py [train.py overrides]``:
train.py, with the torchvision loader's image decode sleeping ``SLOW_DECODE_S`` seconds first
on rank ``SLOW_RANK`` alone (its DataLoader workers fork from it and inherit the sleep): one
rank whose loader is slower than the others', whatever the machine's cores.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "train.py"


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # run as a script: tests/ alone is on the path
    from tests.helpers import slow_decode

    if os.environ.get("RANK") == os.environ["SLOW_RANK"]:
        slow_decode(float(os.environ["SLOW_DECODE_S"]))
    sys.argv[0] = str(TRAIN)  # Hydra names the job (and its outputs/ folder) after it
    runpy.run_path(str(TRAIN), run_name="__main__")
