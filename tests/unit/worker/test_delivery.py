"""Unit tests for worker.delivery: transaction batching (exactly once) and the commit rules
of both strategies, against fake Kafka ports (pure logic; the real broker is exercised by
tests/integration/test_exactly_once.py)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import structlog
from aiokafka import errors as kafka_errors
from aiokafka.errors import CommitFailedError

from kembed_shared.kafka.commit_errors import FatalCommitError
from kembed_shared.observability.probes import Probes
from kembed_shared.ports import KafkaAccessError, Record, TopicPartition
from schemas.headers import CORRELATION_ID, DLQ_ERROR_CODE, DLQ_ERROR_MESSAGE, LANE
from tests.support.kafka import FakePublisher, FakeSource, FakeTransactions
from worker.at_least_once import AtLeastOnce
from worker.delivery import make_delivery
from worker.exactly_once import ExactlyOnce, TransactionError
from worker.offsets import OffsetTracker
from worker.replies import ReplyTo
from worker.settings import WorkerSettings

TP: TopicPartition = ("embed.requests", 0)
OTHER: TopicPartition = ("embed.requests", 1)


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
        self.source = FakeSource({TP, OTHER})
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
    """With record 1 still unanswered, answering 0 and 2 commits record 0's answer and
    offset 1 only: answer 2 is held (its call waits). Answering 1 later commits 1 and 2
    with offset 3. Offsets already committed are not sent again, and answers that no
    offset would cover begin no transaction at all."""
    h = Harness()
    records = [h.record(offset) for offset in range(3)]
    h.record(0, OTHER)
    first, held = h.answer(records[0]), h.answer(records[2])
    await settle()
    await h.delivery.commit()
    assert await first
    assert not held.done(), "an answer above an unanswered record waits"
    assert h.tracker.committable(TP) == 1
    late = h.answer(records[1])
    await settle()
    await h.delivery.commit()
    assert await asyncio.wait_for(late, 1)
    assert await asyncio.wait_for(held, 1)
    one, two = h.producer.transactions()
    # OTHER's first record is unanswered: its committable offset is that record's own.
    assert sent_ids(one) == ["id-0-0"]
    assert ("offsets", {TP: 1, OTHER: 0}, "g") in one
    assert sent_ids(two) == ["id-0-2", "id-0-1"], "in the order they arrived"
    assert ("offsets", {TP: 3}, "g") in two

    # OTHER's record 0 is still open: an answer to 11 is held, and no transaction begins.
    h.record(10, OTHER)
    waiting = h.answer(h.record(11, OTHER))
    await settle()
    await h.delivery.commit()
    assert not waiting.done()
    assert len(h.producer.begun) == 2
    waiting.cancel()


def sent_ids(transaction: list[tuple[Any, ...]]) -> list[str]:
    """The request ids of a transaction's results, in the order sent."""
    return [e[3][CORRELATION_ID].decode() for e in transaction if e[0] == "send"]


def covered(h: Harness) -> None:
    """Every committed transaction carries only answers its offsets cover: per partition,
    each answer's offset is below that partition's committed offset once the transaction
    commits. (A crash after a commit must leave no answer the next owner would repeat.)"""
    committed: dict[TopicPartition, int] = {}
    for transaction in h.producer.transactions():
        for event in transaction:
            if event[0] == "offsets":
                committed.update(event[1])
        for request_id in sent_ids(transaction):
            _, partition, offset = request_id.split("-")
            tp = (TP[0], int(partition))
            assert int(offset) < committed.get(tp, 0), (
                f"{request_id} committed with offset {committed.get(tp)}"
            )


@pytest.mark.parametrize("seed", range(5))
async def test_answers_completing_out_of_order_are_committed_with_their_offsets(
    seed: int,
) -> None:
    """Answers of three partitions arrive in random order (as length-sorted batches
    finish them) while transactions are cut at random moments: every transaction holds
    only answers below its partitions' committed offsets, each answer is sent once, each
    call returns True once its answer is committed, and the final offsets cover every
    record."""
    rng = random.Random(seed)
    h = Harness()
    partitions = [("embed.requests", p) for p in range(3)]
    h.source.owned = set(partitions)
    records = [h.record(offset, tp) for tp in partitions for offset in range(40)]
    order = records[:]
    rng.shuffle(order)
    calls: dict[Record, asyncio.Task[bool]] = {}
    for record in order:
        calls[record] = h.answer(record)
        if rng.random() < 0.2:
            await settle()
            await h.delivery.commit()
            await settle()
            covered(h)
            for done, call in calls.items():
                # A call returns exactly when its record is below the committed offset.
                committable = h.tracker.committable(done.tp)
                assert committable is not None
                assert call.done() == (done.offset < committable)
    await settle()
    await h.delivery.commit()
    assert all(await asyncio.wait_for(asyncio.gather(*calls.values()), 1))
    covered(h)
    sent = [i for transaction in h.producer.transactions() for i in sent_ids(transaction)]
    assert sorted(sent) == sorted(f"id-{r.partition}-{r.offset}" for r in records)
    assert {tp: h.tracker.committable(tp) for tp in partitions} == dict.fromkeys(partitions, 40)
    assert h.tracker.in_flight() == 0


async def test_held_answers_are_committed_with_the_answer_that_fills_the_gap() -> None:
    """The run loop: answers to 1 and 2 arrive first and are held (no transaction begins);
    the answer to 0 then brings them along, all three in one transaction with offset 3."""
    h = Harness()
    records = [h.record(offset) for offset in range(3)]
    h.start()
    try:
        held = [h.answer(records[2]), h.answer(records[1])]
        await asyncio.sleep(0.05)
        assert h.producer.begun == []
        assert not any(call.done() for call in held)
        first = h.answer(records[0])
        assert await asyncio.wait_for(asyncio.gather(first, *held), 2) == [True] * 3
        [transaction] = h.producer.transactions()
        assert sorted(sent_ids(transaction)) == ["id-0-0", "id-0-1", "id-0-2"]
        assert ("offsets", {TP: 3}, "g") in transaction
    finally:
        await h.stop()


async def test_a_revoked_partition_drops_its_held_answers() -> None:
    """Answers held in a partition that is revoked are dropped when it is forgotten: their
    calls return True (the pipeline moves on), nothing of theirs is sent, and their
    records, above the committed offset, are left to the partition's next owner. Held
    answers of other partitions stay held."""
    h = Harness()
    gap, above = h.record(0), h.record(1)
    other_gap, other_above = h.record(0, OTHER), h.record(1, OTHER)
    moved, kept = h.answer(above), h.answer(other_above)
    await settle()
    await h.delivery.commit()
    h.delivery.forget([TP])
    assert await asyncio.wait_for(moved, 1)
    assert h.delivery.dropped == 1
    assert not kept.done()
    late = h.answer(gap)  # the gap's answer arrives after the revocation: dropped too
    await settle()
    await h.delivery.commit()
    assert await asyncio.wait_for(late, 1)
    assert h.producer.begun == [], "nothing of TP was committed"
    filled = h.answer(other_gap)
    await settle()
    await h.delivery.commit()
    assert await asyncio.wait_for(filled, 1)
    assert await asyncio.wait_for(kept, 1)
    [transaction] = h.producer.transactions()
    assert sent_ids(transaction) == ["id-1-1", "id-1-0"]
    assert ("offsets", {OTHER: 2}, "g") in transaction


async def test_shutdown_commits_what_is_covered_and_leaves_held_answers() -> None:
    """The commit at shutdown writes what the offsets cover and nothing above a record
    that is still unanswered: the held answer's record stays in flight and uncommitted,
    for the partition's next owner to answer."""
    h = Harness()
    records = [h.record(offset) for offset in range(3)]
    covered_call, held = h.answer(records[0]), h.answer(records[2])
    await settle()
    await h.delivery.commit()  # the shutdown commit, with record 1 unfinished
    assert await covered_call
    assert not held.done()
    [transaction] = h.producer.transactions()
    assert sent_ids(transaction) == ["id-0-0"]
    assert ("offsets", {TP: 1}, "g") in transaction
    assert h.tracker.in_flight() == 2
    assert h.tracker.committable(TP) == 1
    held.cancel()


async def test_held_answers_neither_cut_nor_block_transactions() -> None:
    """With max_answers 3 and a long interval, answers held behind a gap reach the count
    without beginning a transaction (nothing could be committed) and without spinning;
    answers of another partition reaching the count are committed at once past them; the
    gap's answer with two more brings every held answer along."""
    h = Harness(interval_s=60.0, max_answers=3)
    tp_records = [h.record(offset) for offset in range(6)]
    other = [h.record(offset, OTHER) for offset in range(5)]
    checks = 0
    in_group = h.source.in_group

    def counted() -> bool:
        nonlocal checks
        checks += 1
        return in_group()

    h.source.in_group = counted  # type: ignore[method-assign]
    h.start()
    try:
        held = [h.answer(record) for record in tp_records[1:]]
        await asyncio.sleep(0.05)
        assert h.producer.begun == []
        assert checks <= 2, "held answers must not keep the loop busy"
        first = [h.answer(record) for record in other[:3]]
        assert await asyncio.wait_for(asyncio.gather(*first), 2) == [True] * 3
        assert not any(call.done() for call in held)
        rest = [h.answer(tp_records[0]), *(h.answer(record) for record in other[3:])]
        assert all(await asyncio.wait_for(asyncio.gather(*rest, *held), 2))
        one, two = h.producer.transactions()
        assert sent_ids(one) == ["id-1-0", "id-1-1", "id-1-2"]
        assert ("offsets", {OTHER: 3, TP: 0}, "g") in one
        assert sorted(sent_ids(two)) == sorted(
            [f"id-0-{offset}" for offset in range(6)] + ["id-1-3", "id-1-4"]
        )
        assert ("offsets", {TP: 6, OTHER: 5}, "g") in two
    finally:
        await h.stop()


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
    tracker, source, plain = OffsetTracker(), FakeSource({TP, OTHER}), FakePublisher()
    eos = WorkerSettings.model_validate({"delivery": "exactly_once"})
    alo = WorkerSettings.model_validate({})
    made = make_delivery(
        FakeTransactions(), source=source, tracker=tracker, settings=eos, on_fatal=print
    )
    assert isinstance(made, ExactlyOnce)
    assert isinstance(
        make_delivery(plain, source=source, tracker=tracker, settings=alo, on_fatal=print),
        AtLeastOnce,
    )
    with pytest.raises(TypeError):
        make_delivery(plain, source=source, tracker=tracker, settings=eos, on_fatal=print)
    with pytest.raises(TypeError):
        make_delivery(
            FakeTransactions(), source=source, tracker=tracker, settings=alo, on_fatal=print
        )


async def test_at_least_once_commits_acknowledged_answers_through_the_consumer() -> None:
    """At least once: an acknowledged answer marks its record answered, and commit()
    commits owned partitions up to the first unanswered record, skipping unchanged ones
    and shrugging off a failed commit (the next one catches up)."""
    publisher, source = FakePublisher(), FakeSource({TP, OTHER})
    delivery = at_least_once(source, publisher=publisher, commit_interval_s=1.0)
    records = [Record(TP[0], TP[1], offset, b"") for offset in range(3)]
    for record in records:
        delivery.track(record)
    assert await delivery.answer(records[0], ReplyTo("a", None, None), b"v")
    assert await delivery.dead_letter(records[2], "invalid_request", "x")
    assert [topic for topic, _, _ in publisher.sent] == ["embed.results", "embed.requests.dlq"]
    await delivery.commit()
    assert source.commits == [{TP: 1}]
    await delivery.commit()
    assert source.commits == [{TP: 1}], "unchanged offsets are not committed again"
    assert await delivery.answer(records[1], ReplyTo("b", None, None), b"v")
    source.commit_error = CommitFailedError()  # a rebalance: aiokafka rejoins by itself
    await delivery.commit()
    source.commit_error = None
    await delivery.commit({TP})
    assert source.commits == [{TP: 1}, {TP: 3}]


async def one_answered(
    give_up_after_s: float = float("inf"),
) -> tuple[AtLeastOnce, FakeSource, list[BaseException]]:
    """At-least-once delivery that has answered one record of TP (offset 0), its source,
    and the failures it reports."""
    fatal: list[BaseException] = []
    source = FakeSource({TP, OTHER})
    delivery = at_least_once(source, fatal.append, give_up_after_s=give_up_after_s)
    record = Record(TP[0], TP[1], 0, b"")
    delivery.track(record)
    assert await delivery.answer(record, ReplyTo("a", None, None), b"v")
    return delivery, source, fatal


def at_least_once(
    source: FakeSource,
    on_fatal: Callable[[BaseException], None] = print,
    *,
    publisher: FakePublisher | None = None,
    commit_interval_s: float = 0.01,
    give_up_after_s: float = float("inf"),
) -> AtLeastOnce:
    return AtLeastOnce(
        publisher or FakePublisher(),
        source,
        OffsetTracker(),
        results_topic="embed.results",
        dlq_topic="embed.requests.dlq",
        commit_interval_s=commit_interval_s,
        on_fatal=on_fatal,
        give_up_after_s=give_up_after_s,
    )


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (kafka_errors.GroupAuthorizationFailedError("kembed-workers"), "authorization"),
        (kafka_errors.TopicAuthorizationFailedError({"embed.requests"}), "authorization"),
        (kafka_errors.UnknownError(), "commit"),  # how aiokafka 0.14 reports FENCED_INSTANCE_ID
    ],
    ids=["group-acl-revoked", "topic-acl-revoked", "fenced-instance"],
)
async def test_a_commit_that_cannot_pass_fails_the_worker_once(error: Exception, kind: str) -> None:
    """At least once: a commit refused for good (an ACL revoked, a fenced instance) is
    reported to on_fatal once, as a FatalCommitError (a KafkaAccessError: the worker logs
    it as kafka.<kind>_failed and exits 1), without a warning of its own, and the commit
    loop ends instead of trying again every interval while offsets never move."""
    delivery, source, fatal = await one_answered()
    source.commit_error = error
    with structlog.testing.capture_logs() as logs:
        await asyncio.wait_for(delivery.run(), 5)  # returns: the loop ends
        await delivery.commit()  # and so does any later commit (shutdown, revocation)
    [failure] = fatal
    assert isinstance(failure, FatalCommitError)
    assert isinstance(failure, KafkaAccessError)
    assert failure.kind == kind
    assert failure.error == type(error).__name__
    assert failure.reason.startswith(type(error).__name__)
    assert failure.__cause__ is error
    assert source.attempts == 1
    assert source.commits == []
    assert [entry for entry in logs if entry["event"] == "commit.failed"] == []


async def test_rebalance_failures_that_outlast_a_rebalance_fail_the_worker() -> None:
    """Commits that keep failing "because of a rebalance" for longer than any rebalance
    takes (give_up_after_s: max_poll_interval_ms + session_timeout_ms) mean the worker
    never gets back into its group: a FatalCommitError (kind "commit")."""
    delivery, source, fatal = await one_answered(give_up_after_s=0.2)
    source.commit_error = CommitFailedError()
    await delivery.commit()
    assert fatal == []
    await asyncio.wait_for(delivery.run(), 5)
    [failure] = fatal
    assert isinstance(failure, FatalCommitError)
    assert failure.kind == "commit"
    assert "longer than a rebalance may take" in failure.reason
    assert source.attempts > 2


async def test_a_commit_refused_by_a_rebalance_is_retried_by_the_next_one() -> None:
    """A commit that fails because the group rebalances (aiokafka's CommitFailedError,
    a rebalance in progress) is a warning; the commit loop goes on and a later commit
    moves the offsets."""
    delivery, source, fatal = await one_answered()
    source.commit_error = CommitFailedError()
    loop = asyncio.create_task(delivery.run())
    try:
        with structlog.testing.capture_logs() as logs:
            await asyncio.sleep(0.1)
            assert source.attempts >= 2, "the loop went on after a failed commit"
            assert not loop.done()
            source.commit_error = None
            await asyncio.sleep(0.1)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert source.commits == [{TP: 1}]
    assert fatal == []
    failures = [entry for entry in logs if entry["event"] == "commit.failed"]
    assert failures
    assert {entry["log_level"] for entry in failures} == {"warning"}


async def test_a_fatal_commit_makes_the_worker_unhealthy() -> None:
    """/health fails once the pipeline holds the failure that on_fatal reported, naming
    the error (the worker then exits; an orchestrator restarts it)."""
    failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    class View:
        def assigned_partitions(self) -> set[tuple[str, int]]:
            return {TP}

        def busy_seconds(self) -> float | None:
            return None

        def failure(self) -> BaseException | None:
            return failure.exception() if failure.done() else None

    probes = Probes(stuck_batch_s=60.0, phase="serving")
    probes.pipeline = View()
    source = FakeSource({TP, OTHER})
    delivery = at_least_once(source, failure.set_exception)
    record = Record(TP[0], TP[1], 0, b"")
    delivery.track(record)
    assert await delivery.answer(record, ReplyTo("a", None, None), b"v")
    assert probes.health_response()[0] == 200
    source.commit_error = kafka_errors.GroupAuthorizationFailedError("kembed-workers")
    await delivery.commit()
    status, _, body = probes.health_response()
    assert status == 503
    assert b"worker failed: FatalCommitError" in body
    failure.exception()  # retrieved


async def test_exactly_once_offsets_refused_for_good_fail_the_worker_once() -> None:
    """Exactly once commits offsets inside the transaction (send_offsets), not through the
    consumer: a group right revoked there aborts the transaction and fails the worker at
    once, like at least once's refused commit (one transaction.failed error naming the
    step, on_fatal once; the worker exits 1 and its restart resumes from the last commit)."""
    h = Harness()

    async def refused(offsets: Mapping[TopicPartition, int], group_id: str) -> None:
        raise kafka_errors.GroupAuthorizationFailedError(group_id)

    h.producer.send_offsets = refused  # type: ignore[method-assign]
    call = h.answer(h.record(0))
    await settle()
    with structlog.testing.capture_logs() as logs, pytest.raises(TransactionError):
        await h.delivery.commit()
    assert await call is False
    assert h.producer.transactions() == []
    assert [event[0] for event in h.producer.events].count("begin") == 1, "not retried"
    [failure] = h.fatal
    assert isinstance(failure, TransactionError)
    [failed] = [entry for entry in logs if entry["event"] == "transaction.failed"]
    assert failed["log_level"] == "error"
    assert (failed["phase"], failed["error"]) == ("send_offsets", "GroupAuthorizationFailedError")


async def test_every_answer_carries_the_lane_of_its_request_both_ways() -> None:
    """Results say which lane their request came on (kembed.lane): a sink writes only
    those of the bulk lane. At least once and exactly once alike."""
    publisher = FakePublisher()
    delivery = at_least_once(FakeSource({TP, OTHER}), publisher=publisher, commit_interval_s=1.0)
    records = [Record(TP[0], TP[1], offset, b"") for offset in range(2)]
    for record, lane in zip(records, ("bulk", "interactive"), strict=True):
        delivery.track(record)
        assert await delivery.answer(record, ReplyTo(f"id-{lane}", None, None, lane), b"v")
    assert [(h[CORRELATION_ID], h[LANE]) for _, _, h in publisher.sent] == [
        (b"id-bulk", b"bulk"),
        (b"id-interactive", b"interactive"),
    ]

    h = Harness()
    record = h.record(0)
    call = asyncio.create_task(h.delivery.answer(record, ReplyTo("id-b", None, None, "bulk"), b"v"))
    await settle()
    await h.delivery.commit()
    assert await call
    [transaction] = h.producer.transactions()
    [headers] = [event[3] for event in transaction if event[0] == "send"]
    assert headers[LANE] == b"bulk"
