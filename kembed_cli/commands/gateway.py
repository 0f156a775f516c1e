"""``kembed gateway``: the OpenAI- and TEI-shaped HTTP gateway (needs kembed[gateway]).

Flags come from :class:`~gateway.settings.GatewaySettings` (``KEMBED_GATEWAY_<FLAG>``) and
the Kafka connection settings every kembed process shares (``KEMBED_<FLAG>``). uvicorn
serves the app as :func:`gateway.server.server_config` says: its own log configuration is
off, so its few lines go through our structlog set-up, its access log is off (the gateway
logs each API request itself, without bodies), and a connection has ``header_timeout_s``
to send a request's headers.
"""

from __future__ import annotations

import signal
from types import FrameType

from gateway.settings import GatewaySettings
from kembed_cli.common import ServiceCommand, run_to_exit
from kembed_shared.observability.fatal import ExitCode, install_hooks, secrets_of
from kembed_shared.observability.logging import configure_logging
from kembed_shared.settings import KafkaClientSettings

__all__ = ["DESCRIPTION", "add_arguments", "run", "serve"]


DESCRIPTION = (
    "Serve embedding and rerank APIs over HTTP, each request sent to the workers through "
    "Kafka (docs/gateway.md): OpenAI's (POST /v1/embeddings, GET /v1/models), Cohere's "
    "(POST /v2/embed, /v2/rerank, and /v1/rerank, also Jina's) and "
    "text-embeddings-inference's (POST /, /embed, /rerank, /similarity, /tokenize, /decode, "
    "GET /info). "
    "Gateway flags are also environment variables KEMBED_GATEWAY_<FLAG>; the Kafka "
    "connection flags are the worker's (KEMBED_<FLAG>). "
    "Exit status 2 for invalid settings, 1 when Kafka cannot be reached at start."
)


def serve(settings: GatewaySettings, kafka: KafkaClientSettings) -> int:
    """Serve until SIGTERM or SIGINT; the exit status (1 when the server never started:
    Kafka unreachable, logged as ``gateway.kafka_failed``, or the port taken)."""
    import uvicorn

    from gateway.app import create_app
    from gateway.server import server_config

    configure_logging(settings.log_level, settings.log_format)
    install_hooks(secrets_of(settings, kafka) + settings.keys())
    server = uvicorn.Server(server_config(settings, create_app(settings, kafka)))

    def gateway() -> int:
        # uvicorn drains on SIGTERM/SIGINT, restores the handlers it found and raises the
        # signal again; with these no-op handlers a drained gateway then exits 0, as the
        # worker and the sink do.
        for stop in (signal.SIGTERM, signal.SIGINT):
            signal.signal(stop, _ignore)
        try:
            server.run()
        except SystemExit:  # uvicorn's answer to a failed start-up (logged before)
            return ExitCode.FAILED
        return ExitCode.OK if server.started else ExitCode.FAILED

    return run_to_exit("gateway", gateway)


def _ignore(signum: int, frame: FrameType | None) -> None:
    """A signal that arrives after uvicorn has drained: nothing is left to stop."""


_COMMAND = ServiceCommand("gateway", GatewaySettings, "KEMBED_GATEWAY_", serve)
add_arguments = _COMMAND.add_arguments
run = _COMMAND.run
