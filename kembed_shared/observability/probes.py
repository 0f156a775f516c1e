"""Liveness and readiness of a worker (or a sink), as the /health and /ready endpoints
report them.

- live (/health): the event loop answers (and its scheduling lag is under
  ``max_loop_lag_s``), the encoder thread (the sink: its batch) is not stuck in one batch
  for longer than ``stuck_batch_s``, and the Kafka clients have not failed. A failing
  liveness probe means "restart me".
- ready (/ready): the model is loaded and warmed up (at its largest batch shape, compiled
  when compiling), and the consumer has joined its group with partitions assigned. A worker
  with no partitions (more workers than partitions) is alive but not ready: it serves
  nothing. While topics it reads do not exist, it is not ready either, and /ready names
  them (``"status": "missing topics"``, ``"missing_topics": [...]``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

from kembed_shared.observability.http import Response

__all__ = ["JSON", "PipelineView", "Probes", "json_body"]

JSON = "application/json"


class PipelineView(Protocol):
    def assigned_partitions(self) -> set[tuple[str, int]]: ...

    def busy_seconds(self) -> float | None:
        """How long the running batch has run; None when none runs."""
        ...

    def failure(self) -> BaseException | None: ...


class Probes:
    def __init__(
        self,
        *,
        stuck_batch_s: float,
        max_loop_lag_s: float = 5.0,
        phase: str = "loading",
        busy: str = "encoder",
        name: str = "worker",
    ) -> None:
        # worker: loading -> warming -> (validating) -> joining -> serving -> draining
        self.phase = phase
        self.pipeline: PipelineView | None = None
        self._busy = busy
        self._name = name
        self._stuck_batch_s = stuck_batch_s
        self._max_loop_lag_s = max_loop_lag_s
        self._loop_lag = 0.0
        # Topics the service reads that do not exist (it waits for them before joining).
        self.missing_topics: tuple[str, ...] = ()

    async def watch_loop(self, every: float = 0.5) -> None:
        """Measure how late the event loop wakes up (run as a task for the worker's life)."""
        loop = asyncio.get_running_loop()
        while True:
            expected = loop.time() + every
            await asyncio.sleep(every)
            self._loop_lag = max(0.0, loop.time() - expected)

    def live(self) -> tuple[bool, dict[str, Any]]:
        problems = []
        if self._loop_lag > self._max_loop_lag_s:
            problems.append(f"event loop lagging {self._loop_lag:.1f} s")
        pipeline = self.pipeline
        if pipeline is not None:
            busy = pipeline.busy_seconds()
            if busy is not None and busy > self._stuck_batch_s:
                problems.append(f"{self._busy} stuck in one batch for {busy:.0f} s")
            failure = pipeline.failure()
            if failure is not None:
                problems.append(f"{self._name} failed: {type(failure).__name__}")
        return not problems, {
            "status": "ok" if not problems else "failing",
            "problems": problems,
            "phase": self.phase,
            "loop_lag_s": round(self._loop_lag, 4),
        }

    def ready(self) -> tuple[bool, dict[str, Any]]:
        partitions = sorted(self.pipeline.assigned_partitions()) if self.pipeline else []
        ok = self.phase == "serving" and bool(partitions)
        reason = "ready" if ok else self.phase if self.phase != "serving" else "no partitions"
        body: dict[str, Any] = {"ready": ok, "status": reason}
        if self.missing_topics and not ok:
            body.update(status="missing topics", missing_topics=list(self.missing_topics))
        body["partitions"] = [f"{topic}-{partition}" for topic, partition in partitions]
        return ok, body

    def health_response(self) -> Response:
        ok, body = self.live()
        return (200 if ok else 503), JSON, json_body(body)

    def ready_response(self) -> Response:
        ok, body = self.ready()
        return (200 if ok else 503), JSON, json_body(body)


def json_body(body: dict[str, Any]) -> bytes:
    """``body`` as one line of JSON."""
    return (json.dumps(body) + "\n").encode()
