"""``kembed gateway``: the OpenAI- and TEI-shaped HTTP gateway (needs kembed[gateway]).

Flags come from :class:`~gateway.settings.GatewaySettings` (``KEMBED_GATEWAY_<FLAG>``) and
the Kafka connection settings every kembed process shares (``KEMBED_<FLAG>``). uvicorn
serves the app; its own log configuration is off, so its few lines go through our
structlog set-up, and its access log is off (the gateway logs each API request itself,
without bodies).
"""

from __future__ import annotations

import argparse
from typing import Any

from gateway.settings import GatewaySettings
from kembed_cli.common import add_settings_flags, settings_from
from kembed_cli.extras import require
from kembed_shared.observability.fatal import ExitCode, install_hooks, log_fatal, secrets_of
from kembed_shared.observability.logging import configure_logging
from kembed_shared.settings import KafkaClientSettings

__all__ = ["EXIT_CONFIG", "EXIT_FAILED", "add_parser", "run", "serve"]

EXIT_FAILED = 1
"""Kafka could not be reached or refused the gateway at start, or the port is taken."""
EXIT_CONFIG = 2
"""Invalid settings (an unreadable API key file, a contradictory security set-up)."""


def add_parser(subcommands: Any, name: str, summary: str) -> None:
    parser: argparse.ArgumentParser = subcommands.add_parser(
        name,
        help=summary,
        description="Serve OpenAI's embeddings API (POST /v1/embeddings, GET /v1/models) and "
        "text-embeddings-inference's POST /embed over HTTP, each request sent to the "
        "workers through Kafka (docs/gateway.md). Gateway flags are also environment "
        "variables KEMBED_GATEWAY_<FLAG>; the Kafka connection flags are the worker's "
        "(KEMBED_<FLAG>). Exit status 2 for invalid settings, 1 when Kafka cannot be "
        "reached at start.",
    )
    add_settings_flags(parser, GatewaySettings, env_prefix="KEMBED_GATEWAY_")
    add_settings_flags(parser, KafkaClientSettings)


def run(args: argparse.Namespace) -> int:
    require("gateway", "gateway")
    settings = settings_from(GatewaySettings, args, "gateway")
    kafka = settings_from(KafkaClientSettings, args, "gateway")
    if settings is None or kafka is None:
        return EXIT_CONFIG
    return serve(settings, kafka)


def serve(settings: GatewaySettings, kafka: KafkaClientSettings) -> int:
    """Serve until SIGTERM or SIGINT; the exit status."""
    import uvicorn

    from gateway.app import create_app

    configure_logging(settings.log_level, settings.log_format)
    install_hooks(secrets_of(settings, kafka) + settings.keys())
    config = uvicorn.Config(
        create_app(settings, kafka),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        server_header=False,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    try:
        server.run()
    except KeyboardInterrupt as exc:
        log_fatal(exc, "gateway.interrupted", exit_code=int(ExitCode.INTERRUPTED))
        return ExitCode.INTERRUPTED
    except Exception as exc:  # noqa: BLE001 (anything else: logged, never a raw traceback)
        log_fatal(exc, "gateway.fatal", exit_code=EXIT_FAILED)
        return EXIT_FAILED
    return 0 if server.started else EXIT_FAILED
