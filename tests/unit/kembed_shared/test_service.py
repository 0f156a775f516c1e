"""The service wiring the worker and the sink share (kembed_shared.observability.service):
the four endpoints over a real socket, and the drain a signal starts."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable

import pytest
import structlog

from kembed_shared.observability.metrics import CONTENT_TYPE
from kembed_shared.observability.probes import Probes
from kembed_shared.observability.service import http_endpoints, stop_on_signals


class FakeGauge:
    def __init__(self) -> None:
        self.read: Callable[[], float] = lambda: -1.0

    def set_function(self, f: Callable[[], float]) -> None:
        self.read = f


class FakeMetrics:
    def __init__(self) -> None:
        self.ready = FakeGauge()

    def exposition(self) -> bytes:
        return b"kembed_test 1.0\n"


class FakeLoop:
    """A service's main loop as the probes see it."""

    def __init__(self) -> None:
        self.stopped = asyncio.Event()

    def assigned_partitions(self) -> set[tuple[str, int]]:
        return {("t", 0)}

    def busy_seconds(self) -> float | None:
        return None

    def failure(self) -> BaseException | None:
        return None

    def stop(self) -> None:
        self.stopped.set()


async def get(port: int, path: str) -> tuple[int, str, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), headers["Content-Type"], body


async def test_the_endpoints_answer_from_the_probes_metrics_and_info_until_the_block_ends() -> None:
    probes = Probes(stuck_batch_s=60.0, phase="starting")
    metrics = FakeMetrics()
    info: dict[str, object] = {"name": "x"}
    with structlog.testing.capture_logs() as logs:
        async with http_endpoints(
            "127.0.0.1",
            0,
            probes=probes,
            metrics=metrics,
            info=lambda: info,
            log=structlog.get_logger("kembed.test"),
        ) as server:
            port = server.port
            assert await get(port, "/ready") == (
                503,
                "application/json",
                b'{"ready": false, "status": "starting", "partitions": []}\n',
            )
            assert metrics.ready.read() == 0.0
            info["dim"] = 3  # /info reads the callable at each request
            assert await get(port, "/info") == (
                200,
                "application/json",
                b'{"name": "x", "dim": 3}\n',
            )
            assert await get(port, "/metrics") == (200, CONTENT_TYPE, b"kembed_test 1.0\n")
            status, content_type, body = await get(port, "/health")
            assert (status, content_type, json.loads(body)["phase"]) == (
                200,
                "application/json",
                "starting",
            )
            probes.pipeline, probes.phase = FakeLoop(), "serving"
            assert (await get(port, "/ready"))[0] == 200
            assert metrics.ready.read() == 1.0
    assert probes.phase == "stopped"
    assert logs == [
        {"event": "http.started", "log_level": "info", "host": "127.0.0.1", "port": port}
    ]
    with pytest.raises(ConnectionRefusedError):
        await get(port, "/health")


async def test_sigterm_logs_the_stop_drains_and_stops_the_loop() -> None:
    probes = Probes(stuck_batch_s=60.0, phase="serving")
    service = FakeLoop()
    loop = asyncio.get_running_loop()
    try:
        with structlog.testing.capture_logs() as logs:
            stop_on_signals(service, probes, structlog.get_logger("kembed.test"), "thing")
            assert probes.pipeline is service
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(service.stopped.wait(), 10)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    assert probes.phase == "draining"
    assert logs == [{"event": "thing.stopping", "log_level": "info", "signal": "SIGTERM"}]
