"""``python -m loaderbench.bench``: measure the benchmark, write bench/report.json, draw
bench/report.md and bench/report.png from it (``loaderbench.bench.measure``)."""

import sys

from loaderbench.bench.measure import main

sys.exit(main())
