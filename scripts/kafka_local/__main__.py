"""``python -m scripts.kafka_local``: see ``scripts/kafka_local/cli.py``."""

import sys

from scripts.kafka_local.cli import main

sys.exit(main())
