"""Calls waiting for their results, by request id.

A result is delivered at most once: a duplicate (a worker redelivery after a crash), a late
result (its call timed out) and another client's result (a shared reply partition) find no
waiting call and are dropped.
"""

from __future__ import annotations

import asyncio

import structlog

from schemas import Result, SchemaError, decode_result

__all__ = ["PendingCalls"]

log = structlog.get_logger("kembed.sdk")


class PendingCalls:
    def __init__(self) -> None:
        self._calls: dict[str, asyncio.Future[Result]] = {}
        self.dropped = 0
        """Results that matched no waiting call (late, duplicate or not ours)."""

    def __len__(self) -> int:
        return len(self._calls)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._calls

    def add(self, request_id: str) -> asyncio.Future[Result]:
        if request_id in self._calls:
            raise ValueError(f"request id {request_id!r} is already waiting")
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._calls[request_id] = future
        return future

    def resolve(self, result: Result) -> bool:
        future = self._calls.pop(result.id, None)
        if future is None or future.done():
            self.dropped += 1
            return False
        future.set_result(result)
        return True

    def receive(self, request_id: str | None, value: bytes) -> None:
        """Take a result as read from the reply partition: ``request_id`` from its
        correlation header (None: decode it to find out), ``value`` its bytes. A result no
        call waits for is counted and skipped without decoding; a malformed one is logged."""
        if request_id is not None and request_id not in self._calls:
            self.dropped += 1  # someone else's, or late: skip without decoding
            return
        try:
            result = decode_result(value)
        except SchemaError as exc:
            log.warning("result.malformed", error=exc.message)
            return
        self.resolve(result)

    def discard(self, request_id: str) -> None:
        self._calls.pop(request_id, None)

    def fail_all(self, error: BaseException) -> None:
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error)
        self._calls.clear()
