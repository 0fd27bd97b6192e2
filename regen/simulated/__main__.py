"""``python -m regen.simulated``: the simulated server's command line (``regen serve-simulated``)."""

import signal
import sys

from regen.simulated.launcher import cli

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
raise SystemExit(cli(sys.argv[1:]))
