"""Calls waiting for their results, by request id.

A result is delivered at most once: a duplicate (a worker redelivery after a crash), a late
result (its call timed out) and another client's result (a shared reply partition) find no
waiting call and are dropped.
"""

from __future__ import annotations

import asyncio

from schemas import Result

__all__ = ["PendingCalls"]


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

    def discard(self, request_id: str) -> None:
        self._calls.pop(request_id, None)

    def fail_all(self, error: BaseException) -> None:
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error)
        self._calls.clear()
