"""``kembed sink``'s body: run the sink, turn its failures into exit statuses.

The command line itself (flags from :class:`~sink.settings.SinkSettings` and the worker's
Kafka settings) is built in ``worker/cli.py`` with the other ``kembed`` commands.
"""

from __future__ import annotations

import asyncio

from sink.app import run_sink
from sink.settings import SinkSettings
from sink.store import TargetError, TransientWriteError
from worker.observability.fatal import ExitCode, install_hooks, log_fatal, secrets_of
from worker.observability.logging import configure_logging
from worker.ports import KafkaAccessError
from worker.settings import KafkaClientSettings

__all__ = ["EXIT_CONFIG", "EXIT_FAILED", "run"]

EXIT_FAILED = 1
"""Kafka refused the sink (its login, a right, or its offset commits for good), or the
database or dead-letter topic stayed unreachable."""
EXIT_CONFIG = 2
"""Settings or target unusable as configured: a table of another dimension, a wrong URI."""


def run(settings: SinkSettings, kafka: KafkaClientSettings) -> int:
    """Serve until SIGTERM; the exit status (each failure was logged by run_sink, and any
    other error is logged here as one ``sink.fatal`` event, never a raw traceback)."""
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
