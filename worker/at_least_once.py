"""At least once: each answer published on its own, offsets committed by the consumer.

Each answer is published on its own and acknowledged by the broker; a commit loop commits,
per partition, up to the first unanswered record. A crash between an answer and the next
commit makes a restarted worker send that answer again. A commit refused because of a
rebalance is left to the next one; one that cannot pass (an ACL revoked, a fenced group
instance: ``commit_error_is_fatal``), or rebalance failures that outlast any rebalance,
fail the worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping

import structlog

from kembed_shared.kafka.commit_errors import CommitFailures, log_commit_retried
from kembed_shared.ports import Publisher, Record, Source, TopicPartition
from worker.offsets import OffsetTracker
from worker.replies import Replier, ReplyTo

__all__ = ["AtLeastOnce"]

log = structlog.get_logger("kembed.worker")


class AtLeastOnce:
    """Answers published one by one; the consumer commits up to the first unanswered record.

    A commit that fails because of a rebalance (the consumer rejoins by itself) is logged
    and left to the next one. Any other commit failure would repeat forever while offsets
    never move (an ACL revoked, a fenced group instance), and so would rebalance failures
    that go on for longer than ``give_up_after_s`` (a rebalance ends within the rebalance
    timeout): either is reported to ``on_fatal`` as a ``FatalCommitError`` (the worker logs
    it once, reports itself unhealthy and exits non-zero, and its partitions move), and
    nothing more is committed."""

    def __init__(
        self,
        publisher: Publisher,
        source: Source,
        tracker: OffsetTracker,
        *,
        results_topic: str,
        dlq_topic: str,
        commit_interval_s: float,
        on_fatal: Callable[[BaseException], None],
        retry_for_s: float = 300.0,
        on_retry: Callable[[], None] = lambda: None,
        on_dead_letter: Callable[[str], None] = lambda code: None,
        give_up_after_s: float = float("inf"),
    ) -> None:
        self._replier = Replier(
            publisher,
            results_topic=results_topic,
            dlq_topic=dlq_topic,
            on_fatal=on_fatal,
            retry_for_s=retry_for_s,
            on_retry=on_retry,
            on_dead_letter=on_dead_letter,
        )
        self._source = source
        self._tracker = tracker
        self._interval = commit_interval_s
        self._on_fatal = on_fatal
        self._commit_failures = CommitFailures(give_up_after_s, "the worker")
        self._failed: BaseException | None = None
        self._committed: dict[TopicPartition, int] = {}

    def track(self, record: Record) -> None:
        self._tracker.track(record.tp, record.offset)

    async def answer(self, record: Record, reply: ReplyTo, value: bytes) -> bool:
        if await self._replier.answer(record, reply, value):
            self._tracker.done(record.tp, record.offset)
            return True
        return False

    async def dead_letter(self, record: Record, code: str, message: str) -> bool:
        if await self._replier.dead_letter(record, code, message):
            self._tracker.done(record.tp, record.offset)
            return True
        return False

    async def run(self) -> None:
        """Commit every interval until cancelled, or until a commit fails for good."""
        while self._failed is None:
            await asyncio.sleep(self._interval)
            await self.commit()

    async def commit(self, partitions: set[TopicPartition] | None = None) -> None:
        if self._failed is not None:
            return
        owned = self._source.assignment() if partitions is None else partitions
        offsets = {
            tp: offset
            for tp in owned
            if (offset := self._tracker.committable(tp)) is not None
            and offset != self._committed.get(tp)
        }
        if not offsets:
            return
        try:
            await self._source.commit(offsets)
        except Exception as exc:  # noqa: BLE001 (a rebalance passes; anything else is fatal)
            self._commit_failed(exc, offsets)
            return
        self._commit_failures.succeeded()
        self._committed.update(offsets)

    def _commit_failed(self, exc: Exception, offsets: Mapping[TopicPartition, int]) -> None:
        fatal = self._commit_failures.failed(exc)
        if fatal is None:
            log_commit_retried(log, exc, offsets)
            return
        # Logged once, by the worker as it stops (kafka.authorization_failed or
        # kafka.commit_failed); /health fails from now on.
        self._failed = fatal
        self._on_fatal(fatal)

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        self._tracker.forget(partitions)
        for tp in partitions:
            self._committed.pop(tp, None)
