"""Decode stage: a Kafka record becomes a request to compute, an error to answer, or a
dead letter.

Nothing here raises for bad input. A message is answered with an error result whenever it
names a request id (in the body, or in the ``kafka_correlationId`` header when the body is
unreadable); only messages nobody could correlate an answer with go to the dead-letter
topic.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from schemas import EmbedRequest, ErrorCode, ErrorInfo, SchemaError, decode_request
from schemas.errors import Envelope
from schemas.headers import envelope_from_headers
from worker.ports import Record

__all__ = ["Accepted", "DeadLetter", "Limits", "Rejected", "decode_record"]


@dataclass(frozen=True, slots=True)
class Limits:
    max_request_bytes: int
    max_client_batch_size: int
    model_names: Collection[str]
    dim: int


@dataclass(frozen=True, slots=True)
class Accepted:
    request: EmbedRequest


@dataclass(frozen=True, slots=True)
class Rejected:
    """An error result to send to ``reply_to`` (None: the worker's results topic)."""

    request_id: str
    reply_to: str | None
    reply_partition: int | None
    error: ErrorInfo
    keys: tuple[str | int, ...] | None = None
    meta: dict[str, object] | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    code: ErrorCode
    message: str


Decoded = Accepted | Rejected | DeadLetter


def decode_record(record: Record, limits: Limits, now_ms: int) -> Decoded:
    if record.value is None:
        return _answer(SchemaError(ErrorCode.INVALID_REQUEST, "message has no value"), record)
    if len(record.value) > limits.max_request_bytes:
        error = SchemaError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"message of {len(record.value)} bytes exceeds {limits.max_request_bytes}",
        )
        return _answer(error, record)
    try:
        request = decode_request(record.value)
    except SchemaError as exc:
        return _answer(exc, record)
    problem = _check(request, limits, now_ms)
    if problem is not None:
        return Rejected(
            request.id,
            request.reply_to,
            request.reply_partition,
            problem,
            request.keys,
            request.meta,
        )
    return Accepted(request)


def _check(request: EmbedRequest, limits: Limits, now_ms: int) -> ErrorInfo | None:
    if len(request.inputs) > limits.max_client_batch_size:
        return ErrorInfo(
            ErrorCode.TOO_MANY_INPUTS,
            f"{len(request.inputs)} inputs exceed max_client_batch_size "
            f"{limits.max_client_batch_size}",
        )
    if request.deadline_ms is not None and request.deadline_ms <= now_ms:
        return ErrorInfo(ErrorCode.DEADLINE_EXCEEDED, "deadline passed before computation")
    if request.model is not None and request.model not in limits.model_names:
        served = ", ".join(sorted(limits.model_names))
        return ErrorInfo(ErrorCode.UNKNOWN_MODEL, f"model not served here; served: {served}")
    if request.dimensions is not None and request.dimensions > limits.dim:
        return ErrorInfo(
            ErrorCode.INVALID_REQUEST, f"'dimensions' must be <= the model's {limits.dim}"
        )
    return None


def _answer(error: SchemaError, record: Record) -> Rejected | DeadLetter:
    envelope = _merge(error.envelope, envelope_from_headers(record.headers))
    if envelope.id is None:
        return DeadLetter(error.code, error.message)
    info = ErrorInfo(error.code, error.message, error.index)
    return Rejected(envelope.id, envelope.reply_to, envelope.reply_partition, info)


def _merge(body: Envelope, headers: Envelope) -> Envelope:
    """The body's routing fields win; headers fill what the body could not give."""
    if body.id is not None:
        return body
    return headers
