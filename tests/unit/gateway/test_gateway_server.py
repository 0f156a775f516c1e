"""The gateway served by uvicorn as ``kembed gateway`` serves it (gateway.server), on a
loopback port, spoken to over raw sockets: a client that sends part of its headers or
part of its body is answered 408 and closed after the documented timeout instead of
holding the connection, a request that takes long to answer is not cut, and the
framework's own errors (unknown path, wrong method) come in each API's error shape.

Kafka is the fake client of test_gateway: nothing here reaches a worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import uvicorn

from gateway.app import create_app
from gateway.server import _h11_protocol, http_protocol, server_config
from kembed_shared.settings import KafkaClientSettings
from tests.support.sdk import MODEL, FakeClient
from tests.unit.gateway.test_gateway import gateway_settings

LIMIT_S = 30.0
"""How long a test waits for the server to answer and close: far above the 1 s timeouts
the servers here run with, so a loaded machine does not fail them, and far below for ever,
which is what a held connection waits."""

PROTOCOLS: dict[str, Callable[[float], type[asyncio.Protocol]]] = {
    "auto": http_protocol,  # httptools where installed, as kembed gateway runs
    "h11": _h11_protocol,
}


@contextlib.asynccontextmanager
async def serving(protocol: str, **settings: Any) -> AsyncIterator[tuple[int, FakeClient]]:
    """A gateway on a free loopback port with 1 s header and body timeouts (unless
    ``settings`` says otherwise), over a fake client; yields the port."""
    FakeClient.made.clear()
    fields = {"host": "127.0.0.1", "port": 0, "header_timeout_s": 1, "body_timeout_s": 1}
    chosen = gateway_settings(**(fields | settings))
    app = create_app(
        chosen,
        KafkaClientSettings.model_validate({"bootstrap_servers": "kafka:9092"}),
        client_factory=FakeClient,
    )
    config = server_config(chosen, app)
    config.http = PROTOCOLS[protocol](chosen.header_timeout_s)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "the server did not start"
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield port, FakeClient.made[-1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, LIMIT_S)


async def exchange(port: int, *sent: bytes, pause_s: float = 0.0) -> bytes:
    """Connect, send each of ``sent`` (``pause_s`` apart), then read until the server
    closes the connection; what it answered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for part in sent:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(pause_s)
        return await asyncio.wait_for(reader.read(), LIMIT_S)  # read() ends at EOF
    finally:
        writer.close()


def answers_of(raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """The HTTP/1.1 answers in ``raw``: status, headers, body (by Content-Length)."""
    answers = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        answers.append((int(status_line.split()[1]), headers, rest[:length]))
        raw = rest[length:]
    return answers


def post(path: str, body: bytes, length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return (
        f"POST {path} HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
        f"content-length: {size}\r\n\r\n"
    ).encode() + body


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
async def test_partial_headers_are_answered_408_and_closed_after_header_timeout_s(
    protocol: str,
) -> None:
    """Part of the headers of a first request, or of the request after a kept-alive
    answer: the connection is answered 408 and closed, not held."""
    async with serving(protocol) as (port, _):
        raw = await exchange(port, b"POST /v1/embeddings HTTP/1.1\r\nhost: gateway\r\ncontent-")
        [(status, headers, _)] = answers_of(raw)
        assert (status, headers["connection"]) == (408, "close")

        health = b"GET /health HTTP/1.1\r\nhost: gateway\r\n\r\n"
        raw = await exchange(port, health, b"GET /health HTTP/1.1\r\nho", pause_s=0.2)
        first, second = answers_of(raw)
        assert (first[0], json.loads(first[2])) == (200, {"status": "ok"})
        assert second[0] == 408

        raw = await exchange(port)  # connects and sends nothing at all
        assert answers_of(raw)[0][0] == 408


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
async def test_a_partial_body_is_answered_408_in_the_apis_shape_and_closed(protocol: str) -> None:
    async with serving(protocol) as (port, fake):
        raw = await exchange(port, post("/v1/embeddings", b'{"input": ["a', length=100))
        [(status, headers, body)] = answers_of(raw)
        assert (status, headers["connection"]) == (408, "close")
        error = json.loads(body)["error"]
        assert (error["code"], error["type"]) == ("request_timeout", "invalid_request_error")
        assert "1 s" in error["message"]

        raw = await exchange(port, post("/embed", b'{"inputs": "a', length=100))
        [(status, _, body)] = answers_of(raw)
        assert (status, json.loads(body)["error_type"]) == (408, "Validation")
        assert fake.calls == []  # nothing was sent to Kafka


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
async def test_a_request_answered_later_than_the_timeouts_is_not_cut(protocol: str) -> None:
    """The header deadline is for headers: a request whose answer takes longer than it
    (the workers are slow) is answered whole, on the same connection."""
    async with serving(protocol) as (port, fake):
        fake.gate = asyncio.Event()
        body = json.dumps({"input": ["slow answer"], "model": MODEL}).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(post("/v1/embeddings", body))
            await writer.drain()
            await asyncio.wait_for(fake.arrivals.get(), LIMIT_S)
            await asyncio.sleep(2.5)  # past both 1 s timeouts
            fake.gate.set()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), LIMIT_S)
            assert head.startswith(b"HTTP/1.1 200 ")
        finally:
            writer.close()


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
async def test_an_unknown_path_or_method_answers_in_the_apis_error_shape(protocol: str) -> None:
    async with serving(protocol) as (port, _):
        close = "host: gateway\r\nconnection: close\r\n\r\n"
        raw = await exchange(port, f"GET /v1/nothing HTTP/1.1\r\n{close}".encode())
        [(status, _, body)] = answers_of(raw)
        assert (status, json.loads(body)["error"]["code"]) == (404, "not_found")

        raw = await exchange(port, f"GET /v1/embeddings HTTP/1.1\r\n{close}".encode())
        [(status, headers, body)] = answers_of(raw)
        assert (status, json.loads(body)["error"]["code"]) == (405, "method_not_allowed")
        assert headers["allow"] == "POST"

        raw = await exchange(port, f"GET /embed HTTP/1.1\r\n{close}".encode())
        [(status, _, body)] = answers_of(raw)
        assert status == 405
        assert set(json.loads(body)) == {"error", "error_type"}
