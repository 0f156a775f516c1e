"""Writing answers: results and error results to reply topics, dead letters to the DLQ.

Every record the worker takes ends here exactly once: answered (a result or an error result
acknowledged by the broker), or dead-lettered; both return True, and the caller lets the
offset tracker move on. A dead letter that cannot be written returns False and is reported
to ``on_fatal``: nothing is committed past that record, so a restarted worker retries it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from worker.ports import Publisher, PublishError, Record
from worker.publish import dead_letter_headers, result_headers

__all__ = ["Replier", "ReplyTo"]

log = structlog.get_logger("kembed.worker")


@dataclass(frozen=True, slots=True)
class ReplyTo:
    id: str
    reply_to: str | None
    reply_partition: int | None


class Replier:
    def __init__(
        self,
        publisher: Publisher,
        *,
        results_topic: str,
        dlq_topic: str,
        on_fatal: Callable[[BaseException], None],
    ) -> None:
        self._publisher = publisher
        self._results_topic = results_topic
        self._dlq_topic = dlq_topic
        self._on_fatal = on_fatal

    async def answer(self, record: Record, reply: ReplyTo, value: bytes) -> bool:
        """Publish ``value`` to the request's reply topic; dead-letter it if that fails."""
        topic = reply.reply_to or self._results_topic
        try:
            await self._publisher.send(
                topic,
                value,
                key=reply.id.encode("utf-8"),
                partition=reply.reply_partition,
                headers=result_headers(reply.id),
            )
        except PublishError as exc:
            log.warning(
                "publish.failed",
                request_id=reply.id,
                reply_to=topic,
                reason=exc.reason,
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
            )
            return await self.dead_letter(record, "reply_failed", exc.reason)
        return True

    async def dead_letter(self, record: Record, code: str, message: str) -> bool:
        """Copy ``record`` to the dead-letter topic with headers saying where from and why."""
        try:
            await self._publisher.send(
                self._dlq_topic,
                record.value or b"",
                key=record.key,
                headers=dead_letter_headers(record, code, message),
            )
        except PublishError as exc:
            log.error(
                "dead_letter.failed",
                reason=exc.reason,
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
            )
            self._on_fatal(exc)
            return False
        return True
