"""Error codes of the kembed wire format, and the one exception the codec raises.

Every error result carries one of the :class:`ErrorCode` values below. The codes are part
of the wire contract: they never change meaning and are never removed; new ones may be
added, so a client must treat an unknown code like ``internal``.

Exception tree::

    SchemaError            a message that does not conform to the wire format;
                           carries the code, a human message, the input index when one
                           input is at fault, and whatever routing envelope could be read
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Envelope", "ErrorCode", "SchemaError"]


class ErrorCode(StrEnum):
    """Stable error codes; ``retriable`` says whether sending the same request again can help."""

    INVALID_REQUEST = "invalid_request"
    """Malformed message: not msgpack, not a map, missing or mistyped field, empty input."""
    UNSUPPORTED_VERSION = "unsupported_version"
    """The request's ``v`` is newer than this worker understands."""
    TOO_MANY_INPUTS = "too_many_inputs"
    """More inputs than the worker's ``max_client_batch_size``."""
    INPUT_TOO_LONG = "input_too_long"
    """An input exceeds the model's maximum length and the request said ``truncate: false``."""
    MESSAGE_TOO_LARGE = "message_too_large"
    """The request message exceeds the worker's ``max_request_bytes``."""
    RESULT_TOO_LARGE = "result_too_large"
    """The result would exceed the worker's ``max_result_bytes``; send fewer inputs."""
    UNKNOWN_MODEL = "unknown_model"
    """The request names a model this worker does not serve."""
    DEADLINE_EXCEEDED = "deadline_exceeded"
    """The request's ``deadline_ms`` passed before it was computed."""
    INTERNAL = "internal"
    """The worker failed; the request may succeed if sent again."""
    REPLY_FORBIDDEN = "reply_forbidden"
    """The request's reply topic is not one the worker may answer on (its ``reply_topics``
    setting): never an error result, which would go to that topic; the request is
    dead-lettered with this code instead. Or the request came on the interactive lane and
    names an ingestion results topic (``ingest_topics``, a sink's input, the bulk lane's
    alone): then an error result with this code, on that topic."""

    @property
    def retriable(self) -> bool:
        return self in (ErrorCode.INTERNAL, ErrorCode.DEADLINE_EXCEEDED)


@dataclass(frozen=True, slots=True)
class Envelope:
    """Routing fields recovered from a message, even when the rest of it is invalid."""

    id: str | None = None
    reply_to: str | None = None
    reply_partition: int | None = None


class SchemaError(ValueError):
    """A message does not conform to the wire format."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        index: int | None = None,
        envelope: Envelope | None = None,
    ) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.index = index
        self.envelope = envelope or Envelope()

    def with_envelope(self, envelope: Envelope) -> SchemaError:
        """The same error, carrying the routing fields the caller managed to recover."""
        return SchemaError(self.code, self.message, index=self.index, envelope=envelope)
