"""Exactly once: answers and the offsets they make committable, in Kafka transactions.

Answers are collected for a few milliseconds and written in one Kafka transaction together
with the offsets they make committable; the transaction commits both or neither, and
carries only answers that its offsets cover (an answer above a partition's first
unanswered record waits for that record). A ``read_committed`` reader of the result topics
sees each answer once, whatever crashes or rebalances happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import KW_ONLY, dataclass, field

import structlog

from kembed_shared.observability.logging import partition_names, record_fields
from kembed_shared.ports import (
    PublishError,
    Record,
    Source,
    TopicPartition,
    TransactionalPublisher,
)
from schemas.headers import CORRELATION_ID, dead_letter_headers
from worker.offsets import OffsetTracker
from worker.publish import result_headers
from worker.replies import ReplyTo, answer_failed, dead_letter_failed, retry_transient

__all__ = ["MAX_TRANSACTION_ANSWERS", "SETTLE_S", "ExactlyOnce", "TransactionError"]

log = structlog.get_logger("kembed.worker")


# A transaction is cut at once when this many answers wait, whatever the interval.
MAX_TRANSACTION_ANSWERS = 1000
# Tries of one transaction: a refused result becomes a dead letter, a refused dead letter
# loses the request's bytes; what is refused after that fails the worker.
_ATTEMPTS = 3
# A transaction begins no sooner than this after the previous one committed. The broker
# completes a commit (transaction markers) just after answering it, and a transaction that
# begins meanwhile is refused with CONCURRENT_TRANSACTIONS, which aiokafka retries after a
# fixed 20 ms: back to back, a transaction took ~36 ms; 5 ms apart, ~7 ms (local broker).
SETTLE_S = 0.005


class TransactionError(Exception):
    """A transaction could not be committed and was aborted; the worker must stop so that a
    restarted one resumes from the last committed offsets."""


@dataclass(frozen=True, slots=True)
class _Message:
    topic: str
    value: bytes
    key: bytes | None
    partition: int | None
    headers: Sequence[tuple[str, bytes]]
    code: str | None = None  # a dead letter's error code; None for a result
    reason: str = ""  # a dead letter's reason


@dataclass(eq=False, slots=True)
class _Answer:  # mutable: a refused result becomes a dead letter
    record: Record
    message: _Message
    since: float  # time.monotonic() when it began to wait
    done: asyncio.Future[bool]


@dataclass(slots=True, eq=False)
class ExactlyOnce:
    """Answers and the offsets they make committable, written in Kafka transactions.

    A transaction is cut when the oldest waiting answer has waited ``interval_s``, or when
    ``max_answers`` wait; never while another one runs (answers arriving meanwhile wait for
    the next), nor within ``settle_s`` of the previous commit. Each transaction: begin;
    send the answers its offsets will cover (results, error results and dead letters
    alike); mark their records answered in the offset tracker; add the offsets that became
    committable (``send_offsets``); wait until the broker has every message; commit. Any
    failure aborts the transaction and fails the worker: its answers are then invisible to
    read_committed readers and its offsets uncommitted, so a restarted worker answers
    those records again, once.

    Requests finish out of order (batches are cut by length), and a partition's offset can
    only be committed up to its first unanswered record. An answer above that record is
    therefore *held*: it joins no transaction until every record of its partition below it
    is answered, since a committed answer whose offset is not committed would be answered
    again by the partition's next owner. Held answers do not start transactions (only new
    answers do: the one that fills a gap brings those behind it along); their records stay
    in flight, and their ``answer`` calls return once they are committed. The record a held
    answer waits for is in flight in this worker, so it is answered in time (or its
    partition is revoked, and the held answers are dropped with it).

    Answers are committed only for records the worker still owns: an answer whose record's
    partition was revoked (or taken again since: a record fetched anew is another
    ``Record``), or that is ready while the consumer knows it was expelled from its group,
    is dropped, since the partition's new owner answers that record itself.
    """

    producer: TransactionalPublisher
    source: Source
    tracker: OffsetTracker
    _: KW_ONLY
    group_id: str
    results_topic: str
    dlq_topic: str
    interval_s: float
    timeout_s: float
    on_fatal: Callable[[BaseException], None]
    on_dead_letter: Callable[[str], None] = lambda code: None
    max_answers: int = MAX_TRANSACTION_ANSWERS
    settle_s: float = SETTLE_S
    retry_for_s: float = 300.0
    on_retry: Callable[[], None] = lambda: None
    # time.monotonic() when the last transaction ended.
    _ended: float = field(init=False, default=0.0)
    # Arrived since the last transaction.
    _waiting: list[_Answer] = field(init=False, default_factory=list)
    # Claimed answers behind an unanswered record of their partition, by offset.
    _held: dict[TopicPartition, dict[int, _Answer]] = field(init=False, default_factory=dict)
    # Set when the first answer waits, or many do.
    _arrived: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    # One transaction at a time.
    _lock: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)
    # Tracked, not yet answered.
    _live: dict[TopicPartition, dict[int, Record]] = field(init=False, default_factory=dict)
    _committed: dict[TopicPartition, int] = field(init=False, default_factory=dict)
    _failed: BaseException | None = field(init=False, default=None)
    # The step the current transaction is in, for failure logs.
    _phase: str = field(init=False, default="")
    transactions: int = field(init=False, default=0)
    """Transactions committed."""
    dropped: int = field(init=False, default=0)
    """Answers dropped because their partition had moved."""

    def track(self, record: Record) -> None:
        self.tracker.track(record.tp, record.offset)
        self._live.setdefault(record.tp, {})[record.offset] = record

    async def answer(self, record: Record, reply: ReplyTo, value: bytes) -> bool:
        topic = reply.reply_to or self.results_topic
        try:
            await self._check_destination(topic, reply.reply_partition)
        except PublishError as exc:
            if not answer_failed(exc, record, reply, topic, self.on_fatal):
                return False
            return await self.dead_letter(record, "reply_failed", exc.reason)
        message = _Message(
            topic,
            value,
            reply.id.encode("utf-8"),
            reply.reply_partition,
            result_headers(reply.id, reply.lane),
        )
        return await self._wait(record, message)

    async def dead_letter(self, record: Record, code: str, message: str) -> bool:
        try:
            await self._check_destination(self.dlq_topic, None)
        except PublishError as exc:
            return dead_letter_failed(exc, record, self.on_fatal)
        return await self._wait(record, self._letter(record, code, message))

    async def _check_destination(self, topic: str, partition: int | None) -> None:
        """The producer's check, its transient failures retried for up to retry_for_s."""
        await retry_transient(
            lambda: self.producer.check_destination(topic, partition),
            topic=topic,
            retry_for_s=self.retry_for_s,
            on_retry=self.on_retry,
        )

    def _letter(self, record: Record, code: str, message: str, *, value: bool = True) -> _Message:
        return _Message(
            self.dlq_topic,
            (record.value or b"") if value else b"",
            record.key,
            None,
            dead_letter_headers(record, code, message),
            code,
            message,
        )

    async def _wait(self, record: Record, message: _Message) -> bool:
        if self._failed is not None:
            return False
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Answer(record, message, time.monotonic(), done))
        if len(self._waiting) == 1 or len(self._waiting) >= self.max_answers:
            self._arrived.set()
        return await done

    async def run(self) -> None:
        """Cut transactions until cancelled, or until one fails (reported to on_fatal)."""
        while True:
            self._arrived.clear()
            if not self._waiting:
                await self._arrived.wait()
                continue
            now = time.monotonic()
            settled = self._ended + self.settle_s
            if len(self._waiting) >= self.max_answers:
                start = settled
            else:
                start = max(self._waiting[0].since + self.interval_s, settled)
            if start > now:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), start - now)
                continue
            try:
                await self._transaction()
            except TransactionError:
                return

    async def commit(self, partitions: set[TopicPartition] | None = None) -> None:
        """Commit now, in one transaction, every answer that its offsets can cover
        (``partitions``' among them); answers behind an unanswered record stay held."""
        await self._transaction()

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """Drop revoked partitions, and the answers held in them: those records are above
        the committed offset, so the partitions' next owner answers them."""
        partitions = list(partitions)
        self.tracker.forget(partitions)
        held: list[_Answer] = []
        for tp in partitions:
            self._live.pop(tp, None)
            self._committed.pop(tp, None)
            held.extend(self._held.pop(tp, {}).values())
        if held:
            self._drop(held, "revoked")

    async def _transaction(self) -> None:
        async with self._lock:
            if self._failed is not None:
                raise TransactionError("an earlier transaction failed") from self._failed
            batch, self._waiting = self._waiting, []
            stale: list[_Answer] = []
            for answer in batch:
                record = answer.record
                if self._claim(record):
                    self._held.setdefault(record.tp, {})[record.offset] = answer
                else:
                    stale.append(answer)
            if stale:
                # Their partitions moved (or were taken anew): not ours to answer, and not
                # ours to mark answered either (a record fetched anew may have the offset).
                self._drop(stale, "revoked")
            if self._held and not self.source.in_group():
                # Expelled: the partitions are someone else's now, and so are these answers.
                # They count as answered so that the revocation that follows does not wait
                # for them; nothing is committed before that revocation forgets them.
                expelled = [answer for held in self._held.values() for answer in held.values()]
                self._held.clear()
                for answer in expelled:
                    self.tracker.done(answer.record.tp, answer.record.offset)
                self._drop(expelled, "not_in_group")
                return
            live = self._covered({answer.record.tp for answer in batch})
            if not live:
                return
            offsets = await self._commit_answers(live)
            self._ended = time.monotonic()
            self._committed.update(offsets)
            self.transactions += 1
            for answer in live:
                if answer.message.code is not None:
                    self.on_dead_letter(answer.message.code)
                if not answer.done.done():
                    answer.done.set_result(True)

    def _covered(self, arrived: set[TopicPartition]) -> list[_Answer]:
        """Take the held answers the next transaction's offsets will cover: per partition,
        those below its first record still unanswered (all of them if there is none), in
        the order they arrived. The others stay held. Only partitions in ``arrived`` (where
        answers arrived since the last transaction) are looked at: elsewhere that first
        record is still unanswered."""
        covered: list[_Answer] = []
        for tp in arrived & self._held.keys():
            held = self._held[tp]
            gap = self.tracker.first_unanswered(tp, held)
            for offset in [offset for offset in held if gap is None or offset < gap]:
                covered.append(held.pop(offset))
            if not held:
                del self._held[tp]
        covered.sort(key=lambda answer: answer.since)
        return covered

    async def _commit_answers(self, live: list[_Answer]) -> dict[TopicPartition, int]:
        """Write ``live`` in one transaction; the offsets committed with them.

        Any failure aborts the transaction. What the broker refused for good is then
        handled as at least once handles it, and the transaction tried again: a result or
        error result that its reply topic refuses (too large for its max.message.bytes,
        not authorized) becomes a dead letter (reply_failed), and a dead letter the
        dead-letter topic refuses (the request too large for it) is written without the
        request's bytes. Any other failure fails the worker (raises TransactionError)."""
        for attempt in range(_ATTEMPTS):
            sends: list[Awaitable[object]] = []
            try:
                async with asyncio.timeout(self.timeout_s):
                    return await self._write(live, sends)
            except Exception as exc:  # noqa: BLE001 (any failure: abort, then see what failed)
                error = exc
            aborted = await self._try_abort()
            refused = _refused(sends)
            _discard(sends)
            fixes = {i: self._instead(live[i], reason) for i, reason in refused.items()}
            if attempt + 1 == _ATTEMPTS or not aborted or not refused or None in fixes.values():
                self._fail(error, live)
                raise TransactionError(f"transaction failed: {type(error).__name__}") from error
            log.warning(
                "transaction.aborted",
                error=type(error).__name__,
                phase=self._phase,
                refused=len(refused),
            )
            for i, message in fixes.items():
                assert message is not None
                live[i].message = message
        raise AssertionError("unreachable")  # pragma: no cover

    def _instead(self, answer: _Answer, reason: str) -> _Message | None:
        """What to send instead of ``answer``'s message, which the broker refused for
        ``reason``; None if nothing can be."""
        record, message = answer.record, answer.message
        where = record_fields(record)
        if message.code is None:
            request_id = dict(message.headers).get(CORRELATION_ID, b"").decode()
            log.warning(
                "publish.failed",
                request_id=request_id,
                reply_to=message.topic,
                reason=reason,
                **where,
            )
            return self._letter(record, "reply_failed", reason)
        if message.value:
            log.warning("dead_letter.value_omitted", reason=reason, **where)
            omitted = f"{message.reason} (value of {len(message.value)} bytes omitted: {reason})"
            return self._letter(record, message.code, omitted, value=False)
        return None

    async def _write(
        self, live: list[_Answer], sends: list[Awaitable[object]]
    ) -> dict[TopicPartition, int]:
        self._phase = "begin"
        await self.producer.begin()
        self._phase = "send"
        for answer in live:
            m = answer.message
            sends.append(
                await self.producer.send(
                    m.topic, m.value, key=m.key, partition=m.partition, headers=m.headers
                )
            )
        for answer in live:
            self.tracker.done(answer.record.tp, answer.record.offset)
        offsets = {
            tp: offset
            for tp in self.tracker.partitions()
            if (offset := self.tracker.committable(tp)) is not None
            and offset != self._committed.get(tp)
        }
        self._phase = "send_offsets"
        if offsets:
            await self.producer.send_offsets(offsets, self.group_id)
        # Every message must be on the broker before the commit: a send that failed would
        # otherwise be lost while its record's offset is committed.
        self._phase = "delivery"
        await asyncio.gather(*sends)
        self._phase = "commit"
        await self.producer.commit()
        return offsets

    async def _try_abort(self) -> bool:
        try:
            await asyncio.wait_for(self.producer.abort(), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 (the broker aborts it at transaction_timeout_ms)
            log.warning("transaction.abort_failed", error=type(exc).__name__)
            return False
        return True

    def _fail(self, error: BaseException, live: list[_Answer]) -> None:
        self._failed = error
        log.error(
            "transaction.failed",
            error=type(error).__name__,
            phase=self._phase,
            reason=str(error)[:500],
            answers=len(live),
            partitions=partition_names({answer.record.tp for answer in live}),
        )
        held = [answer for answers in self._held.values() for answer in answers.values()]
        for answer in [*live, *self._waiting, *held]:
            if not answer.done.done():
                answer.done.set_result(False)
        self._waiting.clear()
        self._held.clear()
        self.on_fatal(TransactionError(f"transaction failed: {type(error).__name__}"))

    def _claim(self, record: Record) -> bool:
        """True (once) if ``record`` is the live one of its partition and offset."""
        live = self._live.get(record.tp)
        if live is None or live.get(record.offset) is not record:
            return False
        del live[record.offset]
        return True

    def _drop(self, answers: list[_Answer], reason: str) -> None:
        self.dropped += len(answers)
        log.info(
            "answers.dropped",
            reason=reason,
            answers=len(answers),
            partitions=partition_names({answer.record.tp for answer in answers}),
        )
        for answer in answers:
            if not answer.done.done():
                answer.done.set_result(True)


def _refused(sends: list[Awaitable[object]]) -> dict[int, str]:
    """Which sends the broker refused, by index, with the reason."""
    refused: dict[int, str] = {}
    for index, send in enumerate(sends):
        if isinstance(send, asyncio.Future) and send.done() and not send.cancelled():
            error = send.exception()
            if error is not None:
                refused[index] = f"{type(error).__name__}: {error}"[:500]
    return refused


def _discard(sends: list[Awaitable[object]]) -> None:
    """Retrieve the outcome of an aborted transaction's sends (their errors are reported
    already), so that asyncio does not log each as never retrieved."""

    def retrieve(future: asyncio.Future[object]) -> None:
        if not future.cancelled():
            future.exception()

    for send in sends:
        if isinstance(send, asyncio.Future):
            if send.done():
                retrieve(send)
            else:
                send.add_done_callback(retrieve)
