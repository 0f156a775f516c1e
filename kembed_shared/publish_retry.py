"""Retrying a publish: a ``PublishError`` is tried again while the broker calls it passing.

The worker retries its answers and dead letters with it (``worker.replies``), and the sink
its dead letters (``sink.consumer``), each with its own schedule::

    await retry_publish(send, delays=backoff.stepped((0.2, 0.5, 1.0)), retry_for_s=60)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from kembed_shared import backoff
from kembed_shared.ports import PublishError

__all__ = ["retry_publish"]

_T = TypeVar("_T")


def _nothing(exc: PublishError, retries: int, wait_s: float) -> None:
    return None


async def retry_publish(
    attempt: Callable[[], Awaitable[_T]],
    *,
    delays: Iterable[float],
    retry_for_s: float,
    on_retry: Callable[[PublishError, int, float], None] = _nothing,
) -> _T:
    """Await ``attempt()`` (a send, or a check of its destination), retrying a retriable
    PublishError after each wait of ``delays`` for up to ``retry_for_s`` (``on_retry`` as
    for :func:`kembed_shared.backoff.retry`); then, or at once for a permanent one, the
    PublishError is raised."""
    return await backoff.retry(
        attempt,
        errors=PublishError,
        delays=delays,
        retry_for_s=retry_for_s,
        retriable=lambda exc: exc.retriable,
        on_retry=on_retry,
    )
