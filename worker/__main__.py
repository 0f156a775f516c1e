"""``python -m worker``: the same as ``kembed worker``."""

import sys

from worker.cli import main

sys.exit(main(["worker", *sys.argv[1:]]))
