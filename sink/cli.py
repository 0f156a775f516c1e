"""``kembed sink``'s body: run the sink, turn its failures into exit statuses.

The command line itself (flags from :class:`~sink.settings.SinkSettings` and the worker's
Kafka settings) is built in ``worker/cli.py`` with the other ``kembed`` commands.
"""

from __future__ import annotations

import asyncio

from sink.app import run_sink
from sink.settings import SinkSettings
from sink.store import TargetError, TransientWriteError
from worker.ports import KafkaAccessError
from worker.settings import KafkaClientSettings

__all__ = ["EXIT_CONFIG", "EXIT_FAILED", "run"]

EXIT_FAILED = 1
"""Kafka refused the sink (its login, a right, or its offset commits for good), or the
database or dead-letter topic stayed unreachable."""
EXIT_CONFIG = 2
"""Settings or target unusable as configured: a table of another dimension, a wrong URI."""


def run(settings: SinkSettings, kafka: KafkaClientSettings) -> int:
    """Serve until SIGTERM; the exit status (each failure was logged by run_sink)."""
    try:
        asyncio.run(run_sink(settings, kafka))
    except TargetError:
        return EXIT_CONFIG
    except (KafkaAccessError, TransientWriteError):
        return EXIT_FAILED
    return 0
