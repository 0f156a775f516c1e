"""A small HTTP server on the worker's event loop: /health, /ready, /metrics and /info.

GET (and HEAD) only, one request per connection, no request body: what Kubernetes probes
and a Prometheus scrape need, without a web framework. Handlers are plain functions that
return (status, content type, body); they run on the event loop, so an answer at all
already shows that the loop is responsive.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from http import HTTPStatus

import structlog

__all__ = ["HttpServer", "Response", "Route"]

log = structlog.get_logger("kembed.http")

Response = tuple[int, str, bytes]
Route = Callable[[], Response]

_MAX_HEAD_BYTES = 8192
_READ_TIMEOUT_S = 5.0


class HttpServer:
    def __init__(self, host: str, port: int, routes: Mapping[str, Route]) -> None:
        self._host = host
        self._port = port
        self._routes = dict(routes)
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The bound port (the chosen one when configured as 0)."""
        if self._server is None:
            raise RuntimeError("the HTTP server is not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, self._port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
            status, content_type, body, method = self._respond(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            status, content_type, body, method = 400, "text/plain", b"bad request\n", "GET"
        except ConnectionError:
            writer.close()
            return
        reason = HTTPStatus(status).phrase
        headers = (
            f"HTTP/1.1 {status} {reason}\r\n"
            f"Content-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Cache-Control: no-store\r\n"
            "Connection: close\r\n\r\n"
        )
        try:
            writer.write(headers.encode("ascii") + (b"" if method == "HEAD" else body))
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def _respond(self, head: bytes) -> tuple[int, str, bytes, str]:
        if len(head) > _MAX_HEAD_BYTES:
            return 431, "text/plain", b"request header fields too large\n", "GET"
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        if len(parts) != 3:
            return 400, "text/plain", b"bad request\n", "GET"
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed\n", "GET"
        route = self._routes.get(target.split("?", 1)[0])
        if route is None:
            return 404, "text/plain", b"not found\n", method
        try:
            status, content_type, body = route()
        except Exception as exc:  # noqa: BLE001 (a failing handler is a 500, never a crash)
            log.error("http.handler_failed", path=target, error=type(exc).__name__)
            return 500, "text/plain", b"internal error\n", method
        return status, content_type, body, method
