"""``kembed sink``: results into pgvector or Milvus (needs kembed[sink]); its failures
become exit statuses.

Flags come from :class:`~sink.settings.SinkSettings` (``KEMBED_SINK_<FLAG>``) and the Kafka
connection settings every kembed process shares (``KEMBED_<FLAG>``).
"""

from __future__ import annotations

import asyncio

from kembed_cli.common import ServiceCommand, run_to_exit
from kembed_shared.observability.fatal import install_hooks, secrets_of
from kembed_shared.observability.logging import configure_logging
from kembed_shared.ports import KafkaAccessError
from kembed_shared.settings import KafkaClientSettings
from sink.settings import SinkSettings

__all__ = ["EXIT_CONFIG", "EXIT_FAILED", "DESCRIPTION", "add_arguments", "run", "serve"]

EXIT_FAILED = 1
"""Kafka refused the sink (its login, a right, or its offset commits for good), or the
database or dead-letter topic stayed unreachable."""
EXIT_CONFIG = 2
"""Settings or target unusable as configured: a table of another dimension, a wrong URI."""


DESCRIPTION = (
    "Consume a results topic as a consumer group and upsert each vector by its key into "
    "a PostgreSQL table with pgvector or a Milvus collection; offsets are committed after "
    "the database transaction. Sink flags are also environment variables "
    "KEMBED_SINK_<FLAG>; the Kafka connection flags are the worker's (KEMBED_<FLAG>). "
    "Exit status 2 for invalid settings or an unusable target (a table of another "
    "dimension), 1 when Kafka or the database fails."
)


def serve(settings: SinkSettings, kafka: KafkaClientSettings) -> int:
    """Serve until SIGTERM; the exit status (each failure was logged by run_sink, and any
    other error is logged here as one ``sink.fatal`` event, never a raw traceback)."""
    from sink.app import run_sink
    from sink.store import TargetError, TransientWriteError

    configure_logging(settings.log_level, settings.log_format)
    install_hooks(secrets_of(settings, kafka) + _target_secrets(settings))

    def sink() -> int:
        try:
            asyncio.run(run_sink(settings, kafka))
        except TargetError:
            return EXIT_CONFIG
        except (KafkaAccessError, TransientWriteError):
            return EXIT_FAILED
        return 0

    return run_to_exit("sink", sink)


def _target_secrets(settings: SinkSettings) -> tuple[str, ...]:
    """The database password, also where the target URI holds it."""
    try:
        password = settings.target_spec().password
    except ValueError:
        return ()
    return (password.get_secret_value(),) if password is not None else ()


_COMMAND = ServiceCommand("sink", SinkSettings, "KEMBED_SINK_", serve)
add_arguments = _COMMAND.add_arguments
run = _COMMAND.run
