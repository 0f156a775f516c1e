"""Writing answers: results and error results to reply topics, dead letters to the DLQ.

Every record the worker takes ends here exactly once: answered (a result or an error result
acknowledged by the broker), or dead-lettered; both return True, and the caller lets the
offset tracker move on.

Transient failures (the broker restarting, a leader moving, a request timing out) are
retried with backoff for up to ``retry_for_s``; the record meanwhile stays uncommitted. A
reply topic that cannot be written for good (missing, not authorized, result too large)
sends the request to the dead-letter topic with the reason. When even that fails, or the
retries run out, ``on_fatal`` stops the worker and False is returned: nothing is committed
past that record, so a restarted worker (or the one that takes over its partitions) answers
it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import KW_ONLY, dataclass

import structlog

from kembed_shared import backoff
from kembed_shared.observability.logging import record_fields
from kembed_shared.ports import Publisher, PublishError, Record
from kembed_shared.publish_retry import retry_publish
from schemas.headers import dead_letter_headers
from worker.publish import result_headers

__all__ = ["Replier", "ReplyTo", "answer_failed", "dead_letter_failed", "retry_transient"]

log = structlog.get_logger("kembed.worker")


@dataclass(frozen=True, slots=True)
class ReplyTo:
    id: str
    reply_to: str | None
    reply_partition: int | None
    lane: str = ""
    """The request's lane (``bulk`` or ``interactive``), stamped on the result (header
    ``kembed.lane``); "" : none."""


@dataclass(slots=True, eq=False)
class Replier:
    publisher: Publisher
    _: KW_ONLY
    results_topic: str
    dlq_topic: str
    on_fatal: Callable[[BaseException], None]
    retry_for_s: float = 300.0
    on_retry: Callable[[], None] = lambda: None
    on_dead_letter: Callable[[str], None] = lambda code: None

    async def answer(self, record: Record, reply: ReplyTo, value: bytes) -> bool:
        """Publish ``value`` to the request's reply topic; dead-letter it if that fails."""
        topic = reply.reply_to or self.results_topic
        try:
            await self._send(
                topic,
                value,
                key=reply.id.encode("utf-8"),
                partition=reply.reply_partition,
                headers=result_headers(reply.id, reply.lane),
            )
        except PublishError as exc:
            if not answer_failed(exc, record, reply, topic, self.on_fatal):
                return False
            return await self.dead_letter(record, "reply_failed", exc.reason)
        return True

    async def dead_letter(self, record: Record, code: str, message: str) -> bool:
        """Copy ``record`` to the dead-letter topic with headers saying where from and why."""
        try:
            try:
                await self._send(
                    self.dlq_topic,
                    record.value or b"",
                    key=record.key,
                    headers=dead_letter_headers(record, code, message),
                )
            except PublishError as exc:
                if exc.retriable or not record.value:
                    raise
                # The DLQ refuses the original bytes for good (too large for the topic):
                # record where it was and why, without them, rather than stall the
                # partition on a message that can never be copied.
                log.warning("dead_letter.value_omitted", reason=exc.reason, **record_fields(record))
                omitted = f"{message} (value of {len(record.value)} bytes omitted: {exc.reason})"
                await self._send(
                    self.dlq_topic,
                    b"",
                    key=record.key,
                    headers=dead_letter_headers(record, code, omitted),
                )
        except PublishError as exc:
            return dead_letter_failed(exc, record, self.on_fatal)
        self.on_dead_letter(code)
        return True

    async def _send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        """Send, retrying transient failures (see :func:`retry_transient`)."""
        await retry_transient(
            lambda: self.publisher.send(
                topic, value, key=key, partition=partition, headers=headers
            ),
            topic=topic,
            retry_for_s=self.retry_for_s,
            on_retry=self.on_retry,
        )


def answer_failed(
    exc: PublishError,
    record: Record,
    reply: ReplyTo,
    topic: str,
    on_fatal: Callable[[BaseException], None],
) -> bool:
    """An answer to ``reply`` could not go to ``topic`` (its retries spent, see
    :func:`retry_transient`). A retriable failure means the broker is gone, and so is the
    dead-letter topic: it is fatal (``on_fatal``) and this returns False. A permanent one
    (the topic refuses it) is logged and this returns True: dead-letter the request."""
    if exc.retriable:  # retries ran out: the broker is gone, so is the DLQ
        log.error("publish.gave_up", request_id=reply.id, reply_to=topic, reason=exc.reason)
        on_fatal(exc)
        return False
    log.warning(
        "publish.failed",
        request_id=reply.id,
        reply_to=topic,
        reason=exc.reason,
        **record_fields(record),
    )
    return True


def dead_letter_failed(
    exc: PublishError, record: Record, on_fatal: Callable[[BaseException], None]
) -> bool:
    """``record`` could not be dead-lettered: log it, report it as fatal (nothing may be
    committed past it), and return False (not handled)."""
    log.error("dead_letter.failed", reason=exc.reason, **record_fields(record))
    on_fatal(exc)
    return False


async def retry_transient(
    attempt: Callable[[], Awaitable[None]],
    *,
    topic: str,
    retry_for_s: float,
    on_retry: Callable[[], None] = lambda: None,
) -> None:
    """Run ``attempt`` (a send, or a check of its destination), retrying a retriable
    PublishError with exponential backoff (50 ms to 2 s) for up to ``retry_for_s``; then,
    or at once for a permanent one, the PublishError is raised."""

    def retrying(exc: PublishError, _retries: int, delay: float) -> None:
        log.warning("publish.retrying", topic=topic, reason=exc.reason, delay_s=delay)
        on_retry()

    await retry_publish(
        attempt, delays=backoff.doubling(0.05, 2.0), retry_for_s=retry_for_s, on_retry=retrying
    )
