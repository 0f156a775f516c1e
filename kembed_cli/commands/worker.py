"""``kembed worker``: consume embedding requests, publish vectors (needs kembed[worker])."""

from __future__ import annotations

import argparse
import asyncio

from kembed_cli.common import add_settings_flags, local_models_only, run_to_exit, settings_from
from kembed_cli.extras import require
from worker.settings import WorkerSettings

__all__ = ["DESCRIPTION", "add_arguments", "model_settings", "run"]


DESCRIPTION = (
    "Consume embedding requests, publish vectors. Every flag is also an "
    "environment variable KEMBED_<FLAG> (dashes as underscores); a flag wins."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser, WorkerSettings)


def model_settings(args: argparse.Namespace, command: str) -> WorkerSettings | None:
    """The settings of a command that loads models (``worker``, ``validate``): the worker
    extra is installed, the settings are valid (None after saying why they are not), models
    come from local files only, and log events go to stderr."""
    require(command, "worker")
    settings = settings_from(WorkerSettings, args, command)
    if settings is None:
        return None
    local_models_only()
    from kembed_shared.observability.logging import configure_logging

    configure_logging(settings.log_level, settings.log_format)
    return settings


def run(args: argparse.Namespace) -> int:
    settings = model_settings(args, "worker")
    if settings is None:
        return 2
    from kembed_shared.observability.fatal import install_hooks, secrets_of

    # From here on every way out is one log event (docs/operations.md, "Exit statuses"):
    # no raw traceback, whatever fails, the imports of torch and transformers included.
    install_hooks(secrets_of(settings))
    return run_to_exit("worker", lambda: _serve(settings))


def _serve(settings: WorkerSettings) -> int:
    """Run the worker; the exit status of the failures it logged itself."""
    from kembed_shared.observability.fatal import ExitCode
    from kembed_shared.ports import KafkaAccessError
    from worker.app import ModelLoadError, QualityGateFailedError, run_worker

    try:
        asyncio.run(run_worker(settings))
    except KafkaAccessError:
        return ExitCode.FAILED  # logged as kafka.*_failed
    except ModelLoadError:
        return ExitCode.STARTUP  # logged as model.load_failed
    except QualityGateFailedError:
        return ExitCode.QUALITY_GATE  # logged as quality_gate.failed
    return ExitCode.OK
