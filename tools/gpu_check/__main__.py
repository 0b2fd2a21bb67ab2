"""``python -m tools.gpu_check env|data|decode|report``: see ``cli.py``."""

import sys

from tools.gpu_check.cli import main

sys.exit(main())
