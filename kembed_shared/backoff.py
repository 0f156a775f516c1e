"""Retrying with backoff: schedules of waits, and one async loop that retries for a while.

The worker retries a publish (``worker.replies.retry_transient``), the sink a database write
and a dead letter (``sink.app``); each keeps its own schedule, exceptions, log events and
metrics, and this loop does the retrying for all of them::

    await retry(send, errors=PublishError, delays=doubling(0.05, 2.0), retry_for_s=300,
                retriable=lambda exc: exc.retriable)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TypeVar

__all__ = ["doubling", "retry", "stepped"]

_T = TypeVar("_T")
_E = TypeVar("_E", bound=Exception)


def stepped(waits: Sequence[float]) -> Iterator[float]:
    """The ``waits`` in turn, then the last of them for ever."""
    if not waits:
        raise ValueError("stepped() needs at least one wait")
    yield from waits
    while True:
        yield waits[-1]


def doubling(first: float, most: float) -> Iterator[float]:
    """``first``, then twice the previous wait, up to ``most`` (and ``most`` for ever)."""
    if not 0 < first <= most:
        raise ValueError(f"doubling() needs 0 < first <= most, not {first}, {most}")
    wait = first
    while True:
        yield wait
        wait = min(2 * wait, most)


def _always(exc: Exception) -> bool:
    return True


def _nothing(exc: Exception, retries: int, wait_s: float) -> None:
    return None


async def retry(
    attempt: Callable[[], Awaitable[_T]],
    *,
    errors: type[_E],
    delays: Iterable[float],
    retry_for_s: float,
    retriable: Callable[[_E], bool] = _always,
    on_retry: Callable[[_E, int, float], None] = _nothing,
    sleep: Callable[[float], Awaitable[object]] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> _T:
    """Await ``attempt()`` until it returns, and return what it returned.

    An exception of type ``errors`` for which ``retriable(exc)`` holds is retried after the
    next wait of ``delays``, as long as that wait ends within ``retry_for_s`` of the call;
    before each wait ``on_retry(exc, retries, wait_s)`` runs (``retries`` counts from 1:
    log and count there). Otherwise the exception propagates: at once when it is not
    retriable (or not an ``errors``), after the last wait that fits when it is.
    ``sleep`` (default ``asyncio.sleep``) and ``clock`` are there for tests.
    """
    pause = asyncio.sleep if sleep is None else sleep
    give_up = clock() + retry_for_s
    waits = iter(delays)
    retries = 0
    while True:
        try:
            return await attempt()
        except errors as exc:
            if not retriable(exc):
                raise
            wait = next(waits)
            if clock() + wait > give_up:
                raise
            retries += 1
            on_retry(exc, retries, wait)
            await pause(wait)
