"""``kembed sink``: results into pgvector or Milvus (needs kembed[sink]); its failures
become exit statuses.

Flags come from :class:`~sink.settings.SinkSettings` (``KEMBED_SINK_<FLAG>``) and the Kafka
connection settings every kembed process shares (``KEMBED_<FLAG>``).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from kembed_cli.common import add_settings_flags, settings_from
from kembed_cli.extras import require
from kembed_shared.observability.fatal import ExitCode, install_hooks, log_fatal, secrets_of
from kembed_shared.observability.logging import configure_logging
from kembed_shared.ports import KafkaAccessError
from kembed_shared.settings import KafkaClientSettings
from sink.settings import SinkSettings

__all__ = ["EXIT_CONFIG", "EXIT_FAILED", "add_parser", "run", "serve"]

EXIT_FAILED = 1
"""Kafka refused the sink (its login, a right, or its offset commits for good), or the
database or dead-letter topic stayed unreachable."""
EXIT_CONFIG = 2
"""Settings or target unusable as configured: a table of another dimension, a wrong URI."""


def add_parser(subcommands: Any, name: str, summary: str) -> None:
    parser: argparse.ArgumentParser = subcommands.add_parser(
        name,
        help=summary,
        description="Consume a results topic as a consumer group and upsert each vector by "
        "its key into a PostgreSQL table with pgvector or a Milvus collection; offsets are "
        "committed after the database transaction. Sink flags are also environment "
        "variables KEMBED_SINK_<FLAG>; the Kafka connection flags are the worker's "
        "(KEMBED_<FLAG>). Exit status 2 for invalid settings or an unusable target (a table "
        "of another dimension), 1 when Kafka or the database fails.",
    )
    add_settings_flags(parser, SinkSettings, env_prefix="KEMBED_SINK_")
    add_settings_flags(parser, KafkaClientSettings)


def run(args: argparse.Namespace) -> int:
    require("sink", "sink")
    settings = settings_from(SinkSettings, args, "sink")
    kafka = settings_from(KafkaClientSettings, args, "sink")
    if settings is None or kafka is None:
        return EXIT_CONFIG
    return serve(settings, kafka)


def serve(settings: SinkSettings, kafka: KafkaClientSettings) -> int:
    """Serve until SIGTERM; the exit status (each failure was logged by run_sink, and any
    other error is logged here as one ``sink.fatal`` event, never a raw traceback)."""
    from sink.app import run_sink
    from sink.store import TargetError, TransientWriteError

    configure_logging(settings.log_level, settings.log_format)
    install_hooks(secrets_of(settings, kafka) + _target_secrets(settings))
    try:
        asyncio.run(run_sink(settings, kafka))
    except TargetError:
        return EXIT_CONFIG
    except (KafkaAccessError, TransientWriteError):
        return EXIT_FAILED
    except KeyboardInterrupt as exc:
        log_fatal(exc, "sink.interrupted", exit_code=int(ExitCode.INTERRUPTED))
        return ExitCode.INTERRUPTED
    except Exception as exc:  # noqa: BLE001 (anything else: logged, never a raw traceback)
        log_fatal(exc, "sink.fatal", exit_code=EXIT_FAILED)
        return EXIT_FAILED
    return 0


def _target_secrets(settings: SinkSettings) -> tuple[str, ...]:
    """The database password, also where the target URI holds it."""
    try:
        password = settings.target_spec().password
    except ValueError:
        return ()
    return (password.get_secret_value(),) if password is not None else ()
