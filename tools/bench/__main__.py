"""``python -m tools.bench``: measure the benchmark, write bench/report.json, draw
bench/report.md and bench/report.png from it (``tools.bench.measure``)."""

import sys

from tools.bench.measure import main

sys.exit(main())
