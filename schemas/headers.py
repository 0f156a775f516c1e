"""Kafka header names kembed reads and writes, and their value encodings.

Request headers mirror the routing fields of the body so that routers, tracing tools and
Spring's ``ReplyingKafkaTemplate`` can work without decoding msgpack, and so that a worker
can still answer a message whose body it cannot read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from schemas.codec import is_valid_topic
from schemas.errors import Envelope
from schemas.v1 import MAX_ID_BYTES

__all__ = [
    "CORRELATION_ID",
    "DLQ_ERROR_CODE",
    "DLQ_ERROR_MESSAGE",
    "DLQ_OFFSET",
    "DLQ_PARTITION",
    "DLQ_TOPIC",
    "LANE",
    "LANE_BULK",
    "LANE_INTERACTIVE",
    "REPLY_PARTITION",
    "REPLY_TOPIC",
    "Headers",
    "Origin",
    "dead_letter_headers",
    "envelope_from_headers",
    "fill_from_headers",
    "routing_headers",
]

Headers = Sequence[tuple[str, bytes]]

CORRELATION_ID = "kafka_correlationId"
"""The request id, UTF-8. Set on requests and on results."""
REPLY_TOPIC = "kafka_replyTopic"
"""The reply topic, UTF-8."""
REPLY_PARTITION = "kafka_replyPartition"
"""The reply partition, a 4-byte big-endian signed integer (Spring's encoding)."""

LANE = "kembed.lane"
"""Set by workers on every result: the lane of its request, UTF-8 ``bulk`` (read from a
bulk topic) or ``interactive``. A sink writes only results of the bulk lane, so that a
client allowed to send interactive requests cannot choose rows of the vector database."""
LANE_BULK = "bulk"
LANE_INTERACTIVE = "interactive"

DLQ_TOPIC = "kembed.dlq.topic"
DLQ_PARTITION = "kembed.dlq.partition"
DLQ_OFFSET = "kembed.dlq.offset"
DLQ_ERROR_CODE = "kembed.dlq.error.code"
DLQ_ERROR_MESSAGE = "kembed.dlq.error.message"
"""Headers of a dead-lettered message: where it came from and why; numbers as decimal text."""


class Origin(Protocol):
    """A message as it was read (a consumed record: ``kembed_shared.ports.Record``)."""

    @property
    def topic(self) -> str:
        """The topic it was read from."""

    @property
    def partition(self) -> int:
        """Its partition there."""

    @property
    def offset(self) -> int:
        """Its offset in that partition."""

    @property
    def headers(self) -> Headers:
        """The headers it was sent with."""


def dead_letter_headers(origin: Origin, code: str, message: str) -> list[tuple[str, bytes]]:
    """The original headers plus where the message came from and why it is dead-lettered
    (the message UTF-8, a character it cannot hold written as ``?``)."""
    return [
        *origin.headers,
        (DLQ_TOPIC, origin.topic.encode()),
        (DLQ_PARTITION, str(origin.partition).encode()),
        (DLQ_OFFSET, str(origin.offset).encode()),
        (DLQ_ERROR_CODE, code.encode()),
        (DLQ_ERROR_MESSAGE, message.encode("utf-8", "replace")),
    ]


def routing_headers(
    request_id: str, reply_to: str | None = None, reply_partition: int | None = None
) -> list[tuple[str, bytes]]:
    headers = [(CORRELATION_ID, request_id.encode("utf-8"))]
    if reply_to is not None:
        headers.append((REPLY_TOPIC, reply_to.encode("utf-8")))
    if reply_partition is not None:
        headers.append((REPLY_PARTITION, reply_partition.to_bytes(4, "big", signed=True)))
    return headers


def envelope_from_headers(headers: Iterable[tuple[str, bytes]]) -> Envelope:
    """Routing fields from headers; unreadable values are left out rather than guessed, and
    so are values outside the body's limits: an id over 256 bytes, an invalid topic name."""
    found = dict(headers)
    request_id = _text(found.get(CORRELATION_ID))
    reply_to = _text(found.get(REPLY_TOPIC))
    return Envelope(
        id=request_id if request_id and len(request_id.encode()) <= MAX_ID_BYTES else None,
        reply_to=reply_to if reply_to and is_valid_topic(reply_to) else None,
        reply_partition=_partition(found.get(REPLY_PARTITION)),
    )


def fill_from_headers(body: Envelope, headers: Envelope) -> Envelope:
    """The routing of a request: the body's fields win, headers fill what the body lacks.

    A header partition goes with the header topic only: when the body names a reply topic
    other than ``kafka_replyTopic``, ``kafka_replyPartition`` is not used."""
    reply_to = body.reply_to if body.reply_to is not None else headers.reply_to
    partition = body.reply_partition
    if partition is None and headers.reply_to in (None, reply_to):
        partition = headers.reply_partition
    return Envelope(
        id=body.id if body.id is not None else headers.id,
        reply_to=reply_to,
        reply_partition=partition,
    )


def _text(value: bytes | None) -> str | None:
    if not value:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _partition(value: bytes | None) -> int | None:
    if value is None or len(value) != 4:
        return None
    number = int.from_bytes(value, "big", signed=True)
    return number if number >= 0 else None
