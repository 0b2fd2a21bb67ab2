"""``python -m loaderbench.bench``: the benchmark report (see ``loaderbench.bench.report``)."""

import sys

from loaderbench.bench.report import main

sys.exit(main())
