"""``kembed worker``: consume embedding requests, publish vectors (needs kembed[worker])."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from kembed_cli.common import add_settings_flags, local_models_only, settings_from
from kembed_cli.extras import require
from worker.settings import WorkerSettings

__all__ = ["add_parser", "run"]


def add_parser(subcommands: Any, name: str, summary: str) -> None:
    parser: argparse.ArgumentParser = subcommands.add_parser(
        name,
        help=summary,
        description="Consume embedding requests, publish vectors. Every flag is also an "
        "environment variable KEMBED_<FLAG> (dashes as underscores); a flag wins.",
    )
    add_settings_flags(parser, WorkerSettings)


def run(args: argparse.Namespace) -> int:
    require("worker", "worker")
    settings = settings_from(WorkerSettings, args, "worker")
    if settings is None:
        return 2
    local_models_only()
    from kembed_shared.observability.fatal import ExitCode, install_hooks, log_fatal, secrets_of
    from kembed_shared.observability.logging import configure_logging

    # From here on every way out is one log event (docs/operations.md, "Exit statuses"):
    # no raw traceback, whatever fails, the imports of torch and transformers included.
    configure_logging(settings.log_level, settings.log_format)
    install_hooks(secrets_of(settings))
    try:
        return _serve(settings)
    except KeyboardInterrupt as exc:  # SIGINT before the worker's own handler is in place
        log_fatal(exc, "worker.interrupted", exit_code=int(ExitCode.INTERRUPTED))
        return ExitCode.INTERRUPTED
    except Exception as exc:  # noqa: BLE001 (anything else: logged, never a raw traceback)
        log_fatal(exc, exit_code=int(ExitCode.FAILED))
        return ExitCode.FAILED


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
