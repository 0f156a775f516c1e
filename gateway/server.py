"""How uvicorn serves the gateway: :func:`server_config`, and the HTTP protocol that gives
a connection ``header_timeout_s`` to send a request's headers.

uvicorn closes an idle keep-alive connection (``timeout_keep_alive``) but waits for ever
for the headers of a request that has begun to arrive, and for the first request of a new
connection: a client that sends part of its headers holds the connection and its memory.
:func:`http_protocol` is uvicorn's own HTTP protocol (httptools when installed, else h11)
with one more timer: armed when the connection opens and each time an answer is complete,
it answers ``408 Request Timeout`` and closes the connection if no request's headers have
arrived whole by then. The body has its own deadline (``body_timeout_s``), kept where the
body is read (:class:`gateway.app.Guard`), so that it is answered in the API's shape.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn

from gateway.settings import GatewaySettings

__all__ = ["HEADER_TIMEOUT_ANSWER", "http_protocol", "server_config"]

HEADER_TIMEOUT_ANSWER = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: 35\r\n"
    b"connection: close\r\n\r\n"
    b"the request headers came too slowly"
)
"""What a connection whose headers did not arrive in time gets before it is closed (its
path is not known yet, so no API's error shape applies)."""


class _HeaderDeadline:
    """The timer of one connection: requests whose headers arrived (``begun``) and answers
    completed (``ended``); when it fires with every begun request answered, the connection
    is waiting for headers and has waited too long."""

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: Any, timeout_s: float) -> None:
        self._loop = loop
        self._transport = transport
        self._timeout_s = timeout_s
        self._timer: asyncio.TimerHandle | None = None
        self.begun = 0
        self.ended = 0

    def arm(self) -> None:
        self.cancel()
        if not self._transport.is_closing():
            self._timer = self._loop.call_later(self._timeout_s, self._late)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _late(self) -> None:
        self._timer = None
        if self.begun == self.ended and not self._transport.is_closing():
            self._transport.write(HEADER_TIMEOUT_ANSWER)
            self._transport.close()


def http_protocol(header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (the one its ``http="auto"`` picks) with a deadline of
    ``header_timeout_s`` for each request's headers."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is not installed: uvicorn's h11 protocol
        return _h11_protocol(header_timeout_s)

    class GatewayHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._kembed_deadline = _HeaderDeadline(self.loop, transport, header_timeout_s)
            self._kembed_deadline.arm()

        def on_headers_complete(self) -> None:
            self._kembed_deadline.begun += 1
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            self._kembed_deadline.ended += 1
            super().on_response_complete()
            self._kembed_deadline.arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._kembed_deadline.cancel()
            super().connection_lost(exc)

    return GatewayHttpToolsProtocol


def _h11_protocol(header_timeout_s: float) -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GatewayH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._kembed_deadline = _HeaderDeadline(self.loop, transport, header_timeout_s)
            self._kembed_deadline.arm()

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # h11 parsed a request's headers: a new cycle
                self._kembed_deadline.begun += 1

        def on_response_complete(self) -> None:
            self._kembed_deadline.ended += 1
            super().on_response_complete()  # may start a pipelined request (handle_events)
            self._kembed_deadline.arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._kembed_deadline.cancel()
            super().connection_lost(exc)

    return GatewayH11Protocol


def server_config(settings: GatewaySettings, app: Any) -> uvicorn.Config:
    """The uvicorn configuration ``kembed gateway`` serves ``app`` with: its own log
    configuration off (its few lines go through the gateway's structlog set-up), no access
    log (the gateway logs each API request itself, without bodies), no Server header, and
    the header deadline."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        server_header=False,
        lifespan="on",
        http=http_protocol(settings.header_timeout_s),
    )
