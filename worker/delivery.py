"""How answers and offsets reach Kafka: at least once, or exactly once with transactions.

The pipeline tells its ``Delivery`` about every record it takes (``track``) and, later, hands
it the record's answer (``answer``: a result or an error result; ``dead_letter``). Both
strategies keep one rule: no offset is committed past a record whose answer is not written.
They differ in how answers and offsets are written:

- ``AtLeastOnce`` (``worker.at_least_once``): each answer is published on its own and
  acknowledged by the broker; a commit loop commits, per partition, up to the first
  unanswered record. A crash between an answer and the next commit makes a restarted
  worker send that answer again. A commit refused because of a rebalance is left to the
  next one; one that cannot pass (an ACL revoked, a fenced group instance:
  ``commit_error_is_fatal``), or rebalance failures that outlast any rebalance, fail the
  worker.
- ``ExactlyOnce`` (``worker.exactly_once``): answers are collected for a few milliseconds
  and written in one Kafka transaction together with the offsets they make committable;
  the transaction commits both or neither, and carries only answers that its offsets
  cover (an answer above a partition's first unanswered record waits for that record). A
  ``read_committed`` reader of the result topics sees each answer once, whatever crashes
  or rebalances happen.

How an answer finds its topic, and what happens when that topic refuses it, is
``worker.replies``'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from kembed_shared.ports import Publisher, Record, Source, TopicPartition, TransactionalPublisher
from worker.at_least_once import AtLeastOnce
from worker.exactly_once import ExactlyOnce
from worker.offsets import OffsetTracker
from worker.replies import ReplyTo
from worker.settings import WorkerSettings

__all__ = ["Delivery", "make_delivery"]


class Delivery(Protocol):
    """Owns the offset tracker's bookkeeping: ``track`` marks a record in flight, and a
    record counts as answered once its answer is written (at least once) or is in the
    transaction being committed (exactly once; an answer held behind an unanswered record
    of its partition is not answered yet)."""

    def track(self, record: Record) -> None:
        """``record`` was taken from Kafka and will be answered."""
        ...

    async def answer(self, record: Record, reply: ReplyTo, value: bytes) -> bool:
        """Write ``value`` (a result or an error result) to the request's reply topic, or
        dead-letter the record if that topic cannot take it. True once the record needs
        nothing more from this worker (answered, or dropped because its partition moved);
        False if it could not be answered (the worker is failing, and nothing is committed
        past the record)."""
        ...

    async def dead_letter(self, record: Record, code: str, message: str) -> bool:
        """Copy ``record`` to the dead-letter topic; True and False as for ``answer``."""
        ...

    async def run(self) -> None:
        """Commit in the background until cancelled."""
        ...

    async def commit(self, partitions: set[TopicPartition] | None = None) -> None:
        """Commit now what is answered (in ``partitions``, or everywhere): before revoked
        partitions move, and at shutdown."""
        ...

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """Drop revoked partitions: their new owner resumes from the last commit."""
        ...


def make_delivery(
    publisher: Publisher | TransactionalPublisher,
    *,
    source: Source,
    tracker: OffsetTracker,
    settings: WorkerSettings,
    on_fatal: Callable[[BaseException], None],
    retry_for_s: float = 300.0,
    on_retry: Callable[[], None] = lambda: None,
    on_dead_letter: Callable[[str], None] = lambda code: None,
) -> Delivery:
    """The strategy ``settings.delivery`` names, over ``publisher`` (which must be a
    ``TransactionalPublisher`` for exactly_once). ``on_dead_letter`` is told the code of
    every dead letter written; ``retry_for_s`` and ``on_retry`` concern retries of transient
    publish failures (at least once: every send; exactly once: the check of a destination
    before its answer joins a transaction, which then retries within the transaction)."""
    if settings.delivery == "exactly_once":
        if not isinstance(publisher, TransactionalPublisher):
            raise TypeError("exactly_once delivery needs a transactional publisher")
        return ExactlyOnce(
            publisher,
            source,
            tracker,
            group_id=settings.group_id,
            results_topic=settings.results_topic,
            dlq_topic=settings.dlq_topic,
            interval_s=settings.transaction_interval_ms / 1000,
            timeout_s=settings.transaction_timeout_ms / 1000,
            on_fatal=on_fatal,
            on_dead_letter=on_dead_letter,
            retry_for_s=retry_for_s,
            on_retry=on_retry,
        )
    if isinstance(publisher, TransactionalPublisher):
        raise TypeError("at_least_once delivery needs a plain publisher")
    return AtLeastOnce(
        publisher,
        source,
        tracker,
        results_topic=settings.results_topic,
        dlq_topic=settings.dlq_topic,
        commit_interval_s=settings.commit_interval_ms / 1000,
        on_fatal=on_fatal,
        retry_for_s=retry_for_s,
        on_retry=on_retry,
        on_dead_letter=on_dead_letter,
        # How long rebalance failures may last: kembed_shared.kafka.commit_errors.CommitFailures.
        give_up_after_s=(settings.max_poll_interval_ms + settings.session_timeout_ms) / 1000,
    )
