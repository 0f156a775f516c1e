"""Unit tests for producer_sdk.pending: each result reaches its waiting call at most once."""

from __future__ import annotations

import asyncio

import pytest

from producer_sdk.pending import PendingCalls
from schemas import EmbedResult, ErrorCode, ErrorInfo, ErrorResult


def result(request_id: str) -> EmbedResult:
    return EmbedResult(id=request_id, model="m", dim=1, vectors=b"\x00" * 4, tokens=(1,))


async def test_resolve_delivers_to_the_waiting_call() -> None:
    """resolve() completes the future of the call with the result's id, and only that one."""
    calls = PendingCalls()
    first = calls.add("a")
    second = calls.add("b")
    answer = result("a")
    assert calls.resolve(answer) is True
    assert first.done()
    assert await first is answer
    assert not second.done()
    assert "a" not in calls
    assert "b" in calls
    assert len(calls) == 1
    assert calls.dropped == 0


async def test_error_result_is_delivered_too() -> None:
    """An error result resolves its call like a vector result does."""
    calls = PendingCalls()
    future = calls.add("e")
    error = ErrorResult(id="e", error=ErrorInfo(ErrorCode.INTERNAL, "boom"))
    assert calls.resolve(error)
    assert await future is error


async def test_duplicate_result_is_dropped_and_counted() -> None:
    """A second result for an already answered id is dropped and counted in dropped."""
    calls = PendingCalls()
    future = calls.add("a")
    first = result("a")
    assert calls.resolve(first)
    assert calls.resolve(result("a")) is False
    assert calls.dropped == 1
    assert await future is first


async def test_unknown_result_is_dropped_and_counted() -> None:
    """A result for an id nobody waits on is dropped and counted, leaving others waiting."""
    calls = PendingCalls()
    future = calls.add("mine")
    assert calls.resolve(result("someone-else")) is False
    assert calls.resolve(result("another")) is False
    assert calls.dropped == 2
    assert not future.done()
    assert len(calls) == 1


async def test_late_result_after_cancelled_call_is_dropped() -> None:
    """A result for a call whose future was cancelled (timed out) is dropped, not raised."""
    calls = PendingCalls()
    future = calls.add("late")
    future.cancel()
    assert calls.resolve(result("late")) is False
    assert calls.dropped == 1
    assert "late" not in calls


async def test_discarded_call_gets_no_result() -> None:
    """After discard(), a result for that id is dropped and the future stays pending."""
    calls = PendingCalls()
    future = calls.add("gone")
    calls.discard("gone")
    calls.discard("never-added")  # no error
    assert calls.resolve(result("gone")) is False
    assert calls.dropped == 1
    assert not future.done()


async def test_fail_all_fails_every_waiting_call() -> None:
    """fail_all() sets the error on every waiting future and forgets them all."""
    calls = PendingCalls()
    futures = [calls.add(name) for name in ("a", "b", "c")]
    assert calls.resolve(result("b"))
    error = ConnectionError("consumer died")
    calls.fail_all(error)
    assert len(calls) == 0
    for name, future in zip(("a", "c"), (futures[0], futures[2]), strict=True):
        with pytest.raises(ConnectionError, match="consumer died"):
            await future
        assert name not in calls
    assert isinstance(futures[1].result(), EmbedResult)  # already answered: untouched


async def test_fail_all_skips_cancelled_futures() -> None:
    """fail_all() leaves a cancelled future cancelled instead of raising InvalidStateError."""
    calls = PendingCalls()
    cancelled = calls.add("x")
    waiting = calls.add("y")
    cancelled.cancel()
    calls.fail_all(RuntimeError("stop"))
    assert cancelled.cancelled()
    assert isinstance(waiting.exception(), RuntimeError)


async def test_adding_a_duplicate_id_raises() -> None:
    """Adding an id that is already waiting raises ValueError and keeps the first call."""
    calls = PendingCalls()
    first = calls.add("dup")
    with pytest.raises(ValueError, match="dup"):
        calls.add("dup")
    assert len(calls) == 1
    assert calls.resolve(result("dup"))
    assert first.done()


async def test_id_can_be_reused_after_resolution() -> None:
    """Once a call is answered, its id may be added again as a new call."""
    calls = PendingCalls()
    calls.add("again")
    calls.resolve(result("again"))
    second = calls.add("again")
    assert not second.done()
    assert isinstance(second, asyncio.Future)
