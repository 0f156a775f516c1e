"""Unit tests for worker.delivery: transaction batching (exactly once) and the commit rules
of both strategies, against fake Kafka ports (pure logic; the real broker is exercised by
tests/integration/test_exactly_once.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

import pytest

from schemas.headers import CORRELATION_ID, DLQ_ERROR_CODE, DLQ_ERROR_MESSAGE
from worker.delivery import AtLeastOnce, ExactlyOnce, TransactionError, make_delivery
from worker.offsets import OffsetTracker
from worker.ports import PublishError, Record, TopicPartition
from worker.replies import ReplyTo
from worker.settings import WorkerSettings

TP: TopicPartition = ("embed.requests", 0)
OTHER: TopicPartition = ("embed.requests", 1)


class FakeTransactions:
    """Records what a transactional producer was asked to do, as a list of events."""

    def __init__(self, topics: Mapping[str, int] | None = None) -> None:
        self.topics = dict(topics or {"embed.results": 2, "embed.requests.dlq": 1, "r": 1})
        self.events: list[tuple[Any, ...]] = []
        self.fail_send_to: str | None = None
        self.max_value_bytes: int | None = None  # larger messages are refused
        self.fail_commit = False
        self.hang_commit = False
        self.open = False
        self.begun: list[float] = []
        self.committed: list[float] = []

    async def check_destination(self, topic: str, partition: int | None) -> None:
        if topic not in self.topics:
            raise PublishError(f"topic {topic!r} is not available", retriable=False)
        if partition is not None and not 0 <= partition < self.topics[topic]:
            raise PublishError(f"partition {partition} does not exist", retriable=False)

    async def begin(self) -> None:
        assert not self.open, "one transaction at a time"
        self.open = True
        self.events.append(("begin",))
        self.begun.append(time.monotonic())

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> Awaitable[object]:
        assert self.open, "a message outside a transaction"
        self.events.append(("send", topic, value, dict(headers)))
        delivered: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        too_large = self.max_value_bytes is not None and len(value) > self.max_value_bytes
        if topic == self.fail_send_to or too_large:
            delivered.set_exception(RuntimeError("the broker refused the message"))
        else:
            delivered.set_result(None)
        return delivered

    async def send_offsets(self, offsets: Mapping[TopicPartition, int], group_id: str) -> None:
        assert self.open
        self.events.append(("offsets", dict(offsets), group_id))

    async def commit(self) -> None:
        assert self.open
        if self.hang_commit:
            await asyncio.sleep(3600)
        if self.fail_commit:
            raise RuntimeError("commit failed")
        self.open = False
        self.events.append(("commit",))
        self.committed.append(time.monotonic())

    async def abort(self) -> None:
        self.open = False
        self.events.append(("abort",))

    def transactions(self) -> list[list[tuple[Any, ...]]]:
        """Committed transactions, each as its events between begin and commit."""
        done: list[list[tuple[Any, ...]]] = []
        current: list[tuple[Any, ...]] = []
        for event in self.events:
            if event[0] == "begin":
                current = []
            elif event[0] == "commit":
                done.append(current)
            else:
                current.append(event)
        return done


class FakeSource:
    def __init__(self) -> None:
        self.member = True
        self.owned: set[TopicPartition] = {TP, OTHER}
        self.commits: list[dict[TopicPartition, int]] = []
        self.fail_commit = False

    async def poll(self, timeout_ms: int, max_records: int) -> list[Record]:
        return []

    def assignment(self) -> set[TopicPartition]:
        return set(self.owned)

    def pause(self, partitions: set[TopicPartition]) -> None:
        pass

    def resume(self, partitions: set[TopicPartition]) -> None:
        pass

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        if self.fail_commit:
            raise RuntimeError("rebalance in progress")
        self.commits.append(dict(offsets))

    def lag(self) -> dict[TopicPartition, int]:
        return {}

    def in_group(self) -> bool:
        return self.member


class Harness:
    def __init__(
        self,
        *,
        interval_s: float = 0.0,
        timeout_s: float = 5.0,
        max_answers: int = 1000,
        settle_s: float = 0.0,
    ):
        self.producer = FakeTransactions()
        self.source = FakeSource()
        self.tracker = OffsetTracker()
        self.fatal: list[BaseException] = []
        self.dead_letters: list[str] = []
        self.delivery = ExactlyOnce(
            self.producer,
            self.source,
            self.tracker,
            group_id="g",
            results_topic="embed.results",
            dlq_topic="embed.requests.dlq",
            interval_s=interval_s,
            timeout_s=timeout_s,
            on_fatal=self.fatal.append,
            on_dead_letter=self.dead_letters.append,
            max_answers=max_answers,
            settle_s=settle_s,
        )
        self.loop: asyncio.Task[None] | None = None

    def record(self, offset: int, tp: TopicPartition = TP) -> Record:
        record = Record(tp[0], tp[1], offset, b"request-%d" % offset)
        self.delivery.track(record)
        return record

    def answer(self, record: Record, reply_to: str | None = None) -> asyncio.Task[bool]:
        reply = ReplyTo(f"id-{record.partition}-{record.offset}", reply_to, None)
        return asyncio.create_task(self.delivery.answer(record, reply, b"result"))

    def start(self) -> None:
        self.loop = asyncio.create_task(self.delivery.run())

    async def stop(self) -> None:
        if self.loop is not None:
            self.loop.cancel()
            await asyncio.gather(self.loop, return_exceptions=True)


async def settle(rounds: int = 20) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


async def test_answers_and_their_offsets_are_committed_in_one_transaction() -> None:
    """A result, an error result and a dead letter waiting together are sent in one
    transaction with the offsets they make committable, and each call returns True only
    once that transaction is committed."""
    h = Harness()
    first, second, third = h.record(0), h.record(1), h.record(2)
    calls = [
        h.answer(first),
        asyncio.create_task(
            h.delivery.answer(second, ReplyTo("id-err", None, None), b"error-result")
        ),
        asyncio.create_task(h.delivery.dead_letter(third, "invalid_request", "no id")),
    ]
    await settle()
    assert not any(call.done() for call in calls), "nothing is answered before a commit"
    await h.delivery.commit()
    assert [await call for call in calls] == [True, True, True]
    [transaction] = h.producer.transactions()
    sends = [event for event in transaction if event[0] == "send"]
    assert [(topic, value) for _, topic, value, _ in sends] == [
        ("embed.results", b"result"),
        ("embed.results", b"error-result"),
        ("embed.requests.dlq", b"request-2"),
    ]
    assert sends[0][3][CORRELATION_ID] == b"id-0-0"
    assert sends[2][3][DLQ_ERROR_CODE] == b"invalid_request"
    assert transaction[-1] == ("offsets", {TP: 3}, "g"), "offsets come after the messages"
    assert h.tracker.in_flight() == 0
    assert h.fatal == []


async def test_offsets_never_pass_an_unanswered_record() -> None:
    """With record 1 still unanswered, answering 0 and 2 commits offset 1 only; answering
    1 later commits 3. Offsets already committed are not sent again, and a transaction
    whose answers move no offset sends none."""
    h = Harness()
    records = [h.record(offset) for offset in range(3)]
    h.record(0, OTHER)
    calls = [h.answer(records[0]), h.answer(records[2])]
    await settle()
    await h.delivery.commit()
    assert all([await call for call in calls])
    late = h.answer(records[1])
    await settle()
    await h.delivery.commit()
    assert await late
    first, second = h.producer.transactions()
    # OTHER's first record is unanswered: its committable offset is that record's own.
    assert ("offsets", {TP: 1, OTHER: 0}, "g") in first
    assert ("offsets", {TP: 3}, "g") in second

    # An answer that moves no committable offset (0 is still open) sends no offsets.
    a, b = h.record(10, OTHER), h.record(11, OTHER)
    del a
    call = h.answer(b)
    await settle()
    await h.delivery.commit()
    assert await call
    assert [event[0] for event in h.producer.transactions()[-1]] == ["send"]


async def test_answers_within_the_interval_share_a_transaction() -> None:
    """The run loop lets the first answer wait interval_s for company: answers arriving
    meanwhile are committed in the same transaction."""
    h = Harness(interval_s=0.05)
    h.start()
    try:
        first = h.answer(h.record(0))
        await asyncio.sleep(0.01)
        second = h.answer(h.record(1))
        assert await first
        assert await second
        assert len(h.producer.transactions()) == 1
    finally:
        await h.stop()


async def test_many_waiting_answers_cut_a_transaction_at_once() -> None:
    """max_answers waiting answers do not wait for the interval."""
    h = Harness(interval_s=60.0, max_answers=3)
    h.start()
    try:
        calls = [h.answer(h.record(offset)) for offset in range(3)]
        done = await asyncio.wait_for(asyncio.gather(*calls), 2)
        assert done == [True, True, True]
        assert len(h.producer.transactions()) == 1
    finally:
        await h.stop()


async def test_a_transaction_begins_only_once_the_previous_one_settled() -> None:
    """Back-to-back answers are spread over transactions at least settle_s apart (the
    broker refuses a transaction that begins while it completes the previous one)."""
    h = Harness(settle_s=0.05)
    h.start()
    try:
        for offset in range(3):
            assert await h.answer(h.record(offset))
        assert len(h.producer.begun) == 3
        for committed, begun in zip(h.producer.committed, h.producer.begun[1:], strict=False):
            assert begun - committed >= 0.045
    finally:
        await h.stop()


async def test_answers_arriving_during_a_transaction_wait_for_the_next() -> None:
    """One transaction at a time: what arrives while one commits goes into the next."""
    h = Harness()
    release = asyncio.Event()
    commit = h.producer.commit

    async def slow_commit() -> None:
        await release.wait()
        await commit()

    h.producer.commit = slow_commit  # type: ignore[method-assign]
    first = h.answer(h.record(0))
    await settle()
    running = asyncio.create_task(h.delivery.commit())
    await settle()
    second = h.answer(h.record(1))
    await settle()
    assert not first.done()
    assert not second.done()
    release.set()
    await running
    assert await first
    assert not second.done()
    await h.delivery.commit()
    assert await second
    first_txn, second_txn = h.producer.transactions()
    assert [e[0] for e in first_txn].count("send") == 1
    assert ("offsets", {TP: 2}, "g") in second_txn


async def test_a_failed_send_aborts_the_transaction_and_fails_the_worker() -> None:
    """A message the broker refuses aborts the whole transaction (no commit, so no offset
    moves), every waiting call returns False, the worker is told to fail, and later answers
    are refused."""
    h = Harness()
    h.producer.fail_send_to = "embed.requests.dlq"
    ok = h.answer(h.record(0))
    letter = asyncio.create_task(h.delivery.dead_letter(h.record(1), "invalid_request", "x"))
    await settle()
    with pytest.raises(TransactionError):
        await h.delivery.commit()
    assert await ok is False
    assert await letter is False
    assert h.producer.events[-1] == ("abort",)
    assert h.producer.transactions() == []
    assert len(h.fatal) == 1
    assert await h.delivery.answer(h.record(2), ReplyTo("x", None, None), b"v") is False
    with pytest.raises(TransactionError):
        await h.delivery.commit()


async def test_a_refused_result_is_dead_lettered_in_a_second_attempt() -> None:
    """A reply topic that exists but refuses the result (too large for it, not
    authorized) aborts the transaction; the same answers are then committed with that
    result replaced by a dead letter (reason reply_failed), as at least once would, and
    the worker keeps running."""
    h = Harness()
    h.producer.topics["refusing"] = 1
    h.producer.fail_send_to = "refusing"
    refused = h.answer(h.record(0), reply_to="refusing")
    fine = h.answer(h.record(1))
    await settle()
    await h.delivery.commit()
    assert await refused
    assert await fine
    assert [event[0] for event in h.producer.events].count("abort") == 1
    [transaction] = h.producer.transactions()
    sends = [(event[1], event[3]) for event in transaction if event[0] == "send"]
    assert [topic for topic, _ in sends] == ["embed.requests.dlq", "embed.results"]
    assert sends[0][1][DLQ_ERROR_CODE] == b"reply_failed"
    assert ("offsets", {TP: 2}, "g") in transaction
    assert h.fatal == []
    assert h.dead_letters == ["reply_failed"], "dead letters are counted once committed"


async def test_a_dead_letter_too_large_for_its_topic_goes_without_the_request() -> None:
    """A dead letter the dead-letter topic refuses (the request is too large for it) is
    committed without the request's bytes, its reason saying so, as at least once does."""
    h = Harness()
    h.producer.max_value_bytes = 50
    record = Record(TP[0], TP[1], 0, b"x" * 100)
    h.delivery.track(record)
    letter = asyncio.create_task(h.delivery.dead_letter(record, "invalid_request", "bad"))
    await settle()
    await h.delivery.commit()
    assert await letter
    [transaction] = h.producer.transactions()
    [(_, topic, value, headers)] = [e for e in transaction if e[0] == "send"]
    assert (topic, value) == ("embed.requests.dlq", b"")
    assert headers[DLQ_ERROR_CODE] == b"invalid_request"
    assert b"value of 100 bytes omitted" in headers[DLQ_ERROR_MESSAGE]
    assert h.dead_letters == ["invalid_request"]
    assert h.fatal == []


async def test_a_failed_commit_aborts_and_ends_the_run_loop() -> None:
    """A commit the broker refuses aborts the transaction, reports the failure (so the
    worker stops) and ends the run loop."""
    h = Harness()
    h.producer.fail_commit = True
    h.start()
    call = h.answer(h.record(0))
    assert await call is False
    assert h.loop is not None
    await asyncio.wait_for(h.loop, 2)
    assert ("abort",) in h.producer.events
    assert h.producer.transactions() == []
    assert len(h.fatal) == 1
    assert isinstance(h.fatal[0], TransactionError)


async def test_a_transaction_that_outlives_its_timeout_is_aborted() -> None:
    """A transaction that cannot finish within transaction_timeout_ms fails the worker."""
    h = Harness(timeout_s=0.05)
    h.producer.hang_commit = True
    call = h.answer(h.record(0))
    await settle()
    with pytest.raises(TransactionError):
        await h.delivery.commit()
    assert await call is False
    assert h.fatal


async def test_unwritable_reply_topic_is_dead_lettered_in_the_transaction() -> None:
    """A reply topic that does not exist turns the answer into a dead letter (reason
    reply_failed), committed like any answer; without a dead-letter topic the worker fails."""
    h = Harness()
    call = h.answer(h.record(0), reply_to="no.such.topic")
    await settle()
    await h.delivery.commit()
    assert await call
    [transaction] = h.producer.transactions()
    [(_, topic, value, headers)] = [e for e in transaction if e[0] == "send"]
    assert topic == "embed.requests.dlq"
    assert value == b"request-0"
    assert headers[DLQ_ERROR_CODE] == b"reply_failed"

    del h.producer.topics["embed.requests.dlq"]
    assert await h.answer(h.record(1), reply_to="no.such.topic") is False
    assert len(h.fatal) == 1


async def test_answers_of_revoked_partitions_are_dropped_not_committed() -> None:
    """After a partition is forgotten (revoked), its late answers are dropped (True, so
    the pipeline moves on) and neither sent nor counted in any offset."""
    h = Harness()
    mine, moved = h.record(0, OTHER), h.record(0)
    h.delivery.forget([TP])
    calls = [h.answer(mine), h.answer(moved)]
    await settle()
    await h.delivery.commit()
    assert [await call for call in calls] == [True, True]
    [transaction] = h.producer.transactions()
    assert [e[1] for e in transaction if e[0] == "send"] == ["embed.results"]
    assert ("offsets", {OTHER: 1}, "g") in transaction
    assert h.delivery.dropped == 1


async def test_a_record_fetched_anew_is_answered_once() -> None:
    """A partition revoked and assigned back is fetched again from the committed offset:
    the answer of the old copy of a record is dropped, the new copy's is committed, and the
    old answer does not mark the new copy answered."""
    h = Harness()
    old = h.record(5)
    h.delivery.forget([TP])
    new = h.record(5)
    stale = h.answer(old)
    await settle()
    await h.delivery.commit()
    assert await stale
    assert h.producer.transactions() == []
    assert h.tracker.committable(TP) == 5, "the new copy is still unanswered"
    fresh = h.answer(new)
    await settle()
    await h.delivery.commit()
    assert await fresh
    [transaction] = h.producer.transactions()
    assert ("offsets", {TP: 6}, "g") in transaction


async def test_an_expelled_worker_commits_nothing() -> None:
    """While the consumer knows it was expelled from its group, waiting answers are
    dropped without a transaction: the partitions' new owners answer those records."""
    h = Harness()
    h.source.member = False
    call = h.answer(h.record(0))
    await settle()
    await h.delivery.commit()
    assert await call
    assert h.producer.events == []
    assert h.delivery.dropped == 1


async def test_make_delivery_picks_the_strategy_from_settings() -> None:
    """delivery=exactly_once needs a transactional publisher; the default a plain one."""
    tracker, source = OffsetTracker(), FakeSource()

    class Plain:
        async def send(
            self,
            topic: str,
            value: bytes,
            *,
            key: bytes | None = None,
            partition: int | None = None,
            headers: Sequence[tuple[str, bytes]] = (),
        ) -> None:
            pass

    eos = WorkerSettings.model_validate({"delivery": "exactly_once"})
    alo = WorkerSettings.model_validate({})
    made = make_delivery(
        FakeTransactions(), source=source, tracker=tracker, settings=eos, on_fatal=print
    )
    assert isinstance(made, ExactlyOnce)
    assert isinstance(
        make_delivery(Plain(), source=source, tracker=tracker, settings=alo, on_fatal=print),
        AtLeastOnce,
    )
    with pytest.raises(TypeError):
        make_delivery(Plain(), source=source, tracker=tracker, settings=eos, on_fatal=print)
    with pytest.raises(TypeError):
        make_delivery(
            FakeTransactions(), source=source, tracker=tracker, settings=alo, on_fatal=print
        )


async def test_at_least_once_commits_acknowledged_answers_through_the_consumer() -> None:
    """At least once: an acknowledged answer marks its record answered, and commit()
    commits owned partitions up to the first unanswered record, skipping unchanged ones
    and shrugging off a failed commit (the next one catches up)."""
    sent: list[str] = []

    class Plain:
        async def send(
            self,
            topic: str,
            value: bytes,
            *,
            key: bytes | None = None,
            partition: int | None = None,
            headers: Sequence[tuple[str, bytes]] = (),
        ) -> None:
            sent.append(topic)

    tracker, source = OffsetTracker(), FakeSource()
    delivery = AtLeastOnce(
        Plain(),
        source,
        tracker,
        results_topic="embed.results",
        dlq_topic="embed.requests.dlq",
        commit_interval_s=1.0,
        on_fatal=print,
    )
    records = [Record(TP[0], TP[1], offset, b"") for offset in range(3)]
    for record in records:
        delivery.track(record)
    assert await delivery.answer(records[0], ReplyTo("a", None, None), b"v")
    assert await delivery.dead_letter(records[2], "invalid_request", "x")
    assert sent == ["embed.results", "embed.requests.dlq"]
    await delivery.commit()
    assert source.commits == [{TP: 1}]
    await delivery.commit()
    assert source.commits == [{TP: 1}], "unchanged offsets are not committed again"
    assert await delivery.answer(records[1], ReplyTo("b", None, None), b"v")
    source.fail_commit = True
    await delivery.commit()
    source.fail_commit = False
    await delivery.commit({TP})
    assert source.commits == [{TP: 1}, {TP: 3}]
