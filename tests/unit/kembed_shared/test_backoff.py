"""The shared backoff helper: schedules and the retry loop, with a fake clock and sleep."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from kembed_shared.backoff import doubling, retry, stepped


class TransientError(Exception):
    def __init__(self, retriable: bool = True) -> None:
        super().__init__("transient" if retriable else "permanent")
        self.retriable = retriable


class FakeTime:
    """A clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    async def retry(self, attempt: Callable[[], Awaitable[str]], **options: Any) -> str:
        """``retry`` of TransientError on this clock."""
        return await retry(
            attempt, errors=TransientError, sleep=self.sleep, clock=self.clock, **options
        )


class Failing:
    """An attempt that raises the given exceptions in turn, then returns "done"."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "done"


def test_stepped_repeats_its_last_wait() -> None:
    assert list(itertools.islice(stepped((0.2, 0.5, 1.0)), 5)) == [0.2, 0.5, 1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="at least one wait"):
        next(stepped(()))


def test_doubling_stops_at_its_ceiling() -> None:
    waits = list(itertools.islice(doubling(0.05, 2.0), 8))

    assert waits == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    with pytest.raises(ValueError, match="0 < first <= most"):
        next(doubling(3.0, 2.0))


async def test_retries_with_the_schedule_until_the_attempt_succeeds() -> None:
    """Each retry waits the next delay, and on_retry sees the error, its count and wait."""
    time = FakeTime()
    attempt = Failing(TransientError(), TransientError(), TransientError())
    seen: list[tuple[str, int, float]] = []

    result = await retry(
        attempt,
        errors=TransientError,
        delays=stepped((0.2, 0.5)),
        retry_for_s=60,
        on_retry=lambda exc, n, wait: seen.append((str(exc), n, wait)),
        sleep=time.sleep,
        clock=time.clock,
    )

    assert result == "done"
    assert attempt.calls == 4
    assert time.slept == [0.2, 0.5, 0.5]
    assert seen == [("transient", 1, 0.2), ("transient", 2, 0.5), ("transient", 3, 0.5)]


async def test_gives_up_when_the_next_wait_would_end_past_retry_for_s() -> None:
    """Waits of 1, 2 and 4 s fit in 7 s; the next (8 s) does not: the error propagates."""
    time = FakeTime()
    attempt = Failing(*(TransientError() for _ in range(10)))

    with pytest.raises(TransientError):
        await time.retry(attempt, delays=doubling(1.0, 60.0), retry_for_s=7)

    assert time.slept == [1.0, 2.0, 4.0]
    assert attempt.calls == 4


@pytest.mark.parametrize(
    ("failure", "retry_for_s"),
    [
        pytest.param(TransientError(), 0, id="no-time-to-retry"),
        pytest.param(KeyError("not ours"), 60, id="not-an-error-to-retry"),
    ],
)
async def test_tries_once_without_time_or_for_other_errors(
    failure: Exception, retry_for_s: float
) -> None:
    time = FakeTime()
    attempt = Failing(failure)

    with pytest.raises(type(failure)):
        await time.retry(attempt, delays=stepped((0.2,)), retry_for_s=retry_for_s)

    assert (attempt.calls, time.slept) == (1, [])


async def test_a_permanent_error_propagates_at_once() -> None:
    """retriable() false: no wait, no on_retry, the same exception object."""
    time = FakeTime()
    permanent = TransientError(retriable=False)
    attempt = Failing(TransientError(), permanent)
    retried: list[int] = []

    with pytest.raises(TransientError) as raised:
        await time.retry(
            attempt,
            delays=stepped((0.2,)),
            retry_for_s=60,
            retriable=lambda exc: exc.retriable,
            on_retry=lambda exc, n, wait: retried.append(n),
        )

    assert raised.value is permanent
    assert retried == [1]
    assert time.slept == [0.2]


async def test_default_sleep_is_asyncio() -> None:
    """Without a fake, the loop really waits (a short schedule keeps this quick)."""
    attempt = Failing(TransientError())

    done = await retry(attempt, errors=TransientError, delays=stepped((0.001,)), retry_for_s=5)

    assert done == "done"
    assert attempt.calls == 2
