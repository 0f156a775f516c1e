"""``python -m kembed_cli``: the same as ``kembed``."""

import sys

from kembed_cli.main import main

sys.exit(main())
