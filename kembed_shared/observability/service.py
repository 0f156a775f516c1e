"""What a kembed service process (the worker, the sink) runs beside its Kafka loop: the
HTTP endpoints (/health, /ready, /metrics, /info) with the probes' event-loop watch, and
the SIGTERM/SIGINT handlers that start a drain.

- :func:`http_endpoints`: an async context manager that serves the four routes for as
  long as the service runs, logs ``http.started`` (host and bound port) on the service's
  own logger, ties the metrics' ready gauge to the readiness probe, and on leaving marks
  the probes ``stopped`` and closes the server.
- :func:`missing_topics_reporter`: while topics the service reads do not exist, /ready
  names them, and one ``kafka.topics_missing`` error says which and how to create them.
- :func:`stop_on_signals`: hands the running loop (``probes.pipeline``) to the probes and
  makes SIGTERM and SIGINT log ``<name>.stopping``, set the phase ``draining`` and ask the
  loop to stop (it finishes what is in flight first).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from structlog.typing import FilteringBoundLogger

from kembed_shared.observability.http import HttpServer, Route
from kembed_shared.observability.metrics import CONTENT_TYPE
from kembed_shared.observability.probes import JSON, PipelineView, Probes, json_body

__all__ = [
    "ServiceMetrics",
    "Stoppable",
    "http_endpoints",
    "missing_topics_reporter",
    "routes",
    "stop_on_signals",
]


class _Gauge(Protocol):
    def set_function(self, f: Callable[[], float]) -> None: ...


class ServiceMetrics(Protocol):
    """A service's Prometheus metrics: the text exposition and the ready gauge."""

    @property
    def ready(self) -> _Gauge: ...

    def exposition(self) -> bytes: ...


class Stoppable(PipelineView, Protocol):
    """A service's main loop as the probes see it, and as a signal stops it."""

    def stop(self) -> None: ...


def routes(
    probes: Probes, metrics: ServiceMetrics, info: Callable[[], dict[str, Any]]
) -> dict[str, Route]:
    """/health and /ready from the probes, /metrics in Prometheus' text format, /info as
    one JSON object (``info()`` at the time of the request) and a newline."""
    return {
        "/health": probes.health_response,
        "/ready": probes.ready_response,
        "/metrics": lambda: (200, CONTENT_TYPE, metrics.exposition()),
        "/info": lambda: (200, JSON, json_body(info())),
    }


@contextlib.asynccontextmanager
async def http_endpoints(
    host: str,
    port: int,
    *,
    probes: Probes,
    metrics: ServiceMetrics,
    info: Callable[[], dict[str, Any]],
    log: FilteringBoundLogger,
) -> AsyncIterator[HttpServer]:
    """Serve :func:`routes` on ``host``:``port`` (0: any free port) while the block runs."""
    metrics.ready.set_function(lambda: 1.0 if probes.ready()[0] else 0.0)
    server = HttpServer(host, port, routes(probes, metrics, info))
    await server.start()
    log.info("http.started", host=host, port=server.port)
    watcher = asyncio.create_task(probes.watch_loop())
    try:
        yield server
    finally:
        probes.phase = "stopped"
        watcher.cancel()
        await server.stop()


def stop_on_signals(
    service: Stoppable, probes: Probes, log: FilteringBoundLogger, name: str
) -> None:
    """From now on the probes watch ``service``, and SIGTERM or SIGINT drains it."""
    probes.pipeline = service
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stop, service, probes, log, name, sig)


def _stop(
    service: Stoppable,
    probes: Probes,
    log: FilteringBoundLogger,
    name: str,
    sig: signal.Signals,
) -> None:
    log.info(f"{name}.stopping", signal=sig.name)
    probes.phase = "draining"
    service.stop()


def missing_topics_reporter(
    probes: Probes, log: FilteringBoundLogger, create: str
) -> Callable[[list[str]], None]:
    """The ``on_missing`` hook of :meth:`KafkaSource.start
    <kembed_shared.kafka.source.KafkaSource.start>`: keeps ``probes.missing_topics``
    current, logs one ``kafka.topics_missing`` error (the topics, and ``create``: the
    command that creates them) the first time some are missing, and ``kafka.topics_found``
    when the last one appeared."""
    logged: list[str] = []

    def report(missing: list[str]) -> None:
        probes.missing_topics = tuple(missing)
        if missing and not logged:
            logged.extend(missing)
            log.error(
                "kafka.topics_missing",
                topics=missing,
                create=create,
                reason=f"topic(s) {', '.join(missing)} do not exist: create them with "
                f"`{create}`; waiting for them (checked every second)",
            )
        elif not missing and logged:
            log.info("kafka.topics_found", topics=logged)

    return report
