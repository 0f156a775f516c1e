"""Exceptions raised by the producer SDK.

Exception tree::

    KembedError                  base of everything the SDK raises on purpose
    ├── EmbedError               the worker answered with an error result (wire ``code``)
    ├── EmbedTimeoutError        no result within the timeout (also a ``TimeoutError``)
    ├── UnexpectedEncodingError  the result is not in the encoding asked for
    ├── UnexpectedResultError    the result is not of the kind asked for (vectors, scores)
    ├── ClientClosedError        the client was closed while the call waited
    ├── RequestTooLargeError     the encoded request exceeds max_request_bytes (a ValueError)
    ├── InputTooLongError        a text exceeds max_input_chars (a ValueError)
    ├── IngestError              ``ingest()`` stopped; ``summary`` says what was sent before
    ├── CatalogUnavailableError  the model catalog could not be read (``models()``)
    └── KafkaAccessError         Kafka refused this client; retrying will not help
        ├── AuthenticationError  the login (SASL) or the TLS handshake was rejected
        └── AuthorizationError   the client's principal lacks an ACL on a topic

Messages name the user, topic and operation, never a password.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schemas import ErrorCode

if TYPE_CHECKING:
    from producer_sdk.ingest import IngestSummary

__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "CatalogUnavailableError",
    "ClientClosedError",
    "EmbedError",
    "EmbedTimeoutError",
    "IngestError",
    "InputTooLongError",
    "KafkaAccessError",
    "KembedError",
    "RequestTooLargeError",
    "UnexpectedEncodingError",
    "UnexpectedResultError",
]


class KembedError(Exception):
    """Base class of the SDK's exceptions."""


class EmbedError(KembedError):
    """The worker could not embed the request; ``code`` is the stable wire code."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        index: int | None = None,
        request_id: str = "",
        item: str = "input",
    ) -> None:
        """``index``: the input (``item`` "input") or document ("document") at fault."""
        where = f" ({item} {index})" if index is not None else ""
        super().__init__(f"{code}: {message}{where}")
        self.code = code
        self.message = message
        self.index = index
        self.request_id = request_id

    @property
    def retriable(self) -> bool:
        """Whether the same request may succeed if sent again (unknown codes: yes)."""
        try:
            return ErrorCode(self.code).retriable
        except ValueError:
            return True


class EmbedTimeoutError(KembedError, TimeoutError):
    """No result arrived in time; a result arriving later is dropped."""

    def __init__(self, request_id: str, timeout: float) -> None:
        super().__init__(f"no result for request {request_id} within {timeout:g} s")
        self.request_id = request_id
        self.timeout = timeout


class UnexpectedEncodingError(KembedError):
    """The worker answered in another encoding than the one asked for: a worker that
    predates output encodings ignores the request's ``encoding`` and answers float32."""

    def __init__(self, request_id: str, asked: str, got: str) -> None:
        super().__init__(
            f"asked for {asked} vectors, the worker answered {got} (request {request_id}); "
            "the worker may predate output encodings"
        )
        self.request_id = request_id
        self.asked = asked
        self.got = got


class UnexpectedResultError(KembedError):
    """The worker answered with another kind of result than the call asked for (scores for
    an embed call, vectors for a rerank call), or with scores for another number of
    documents: a worker that predates reranking, or a model that is not what its name
    says. ``asked`` and ``got`` say which."""

    def __init__(self, request_id: str, asked: str, got: str) -> None:
        super().__init__(f"asked for {asked}, the worker answered {got} (request {request_id})")
        self.request_id = request_id
        self.asked = asked
        self.got = got


class ClientClosedError(KembedError):
    """The client was closed (or never started) while a call needed it."""


class RequestTooLargeError(KembedError, ValueError):
    """The encoded request would exceed the client's ``max_request_bytes``: nothing was sent.

    Send fewer or shorter texts (or less metadata) per request; ``ingest()`` splits its
    batches on this error by itself.
    """

    def __init__(self, size: int, limit: int, detail: str = "") -> None:
        super().__init__(
            f"the request would be {size} bytes, above max_request_bytes ({limit}){detail}; "
            "send fewer or shorter texts, or less metadata, per request"
        )
        self.size = size
        self.limit = limit


class InputTooLongError(KembedError, ValueError):
    """A text has more characters than the client's ``max_input_chars``: nothing was sent.

    ``index`` is the input (``item`` "input") or document ("document") at fault, None for
    a rerank query ("query"). The workers answer such a text ``input_too_long`` (their
    KEMBED_MAX_INPUT_CHARS, the same default): a model uses only a text's first tokens,
    so send less of it, or embed it with ``chunking`` (chunked inputs have no such limit).
    """

    def __init__(self, length: int, limit: int, index: int | None = None, item: str = "input"):
        what = "the query" if index is None else f"{item} {index}"
        super().__init__(
            f"{what} has {length} characters, above max_input_chars ({limit}); nothing was "
            "sent: send less of it (a model uses only a text's first tokens)"
        )
        self.length = length
        self.limit = limit
        self.index = index
        self.item = item


class IngestError(KembedError):
    """``ingest()`` stopped before the end of its documents.

    ``cause`` is what stopped it (also the ``__cause__``): a bad document (ValueError, a
    :class:`~producer_sdk.jsonl.JsonlError` from the JSONL reader), or a failed submit (a
    :class:`KembedError` such as AuthorizationError, or a Kafka error). ``summary`` counts
    what the broker had acknowledged when it stopped: those requests are in Kafka and will
    be answered; nothing after them was sent.
    """

    def __init__(self, summary: IngestSummary, cause: BaseException) -> None:
        super().__init__(
            f"ingestion stopped after {summary.documents} documents in {summary.requests} "
            f"acknowledged requests: {cause}"
        )
        self.summary = summary
        self.cause = cause


class KafkaAccessError(KembedError):
    """Kafka refused this client: wrong credentials, or missing rights."""


class AuthenticationError(KafkaAccessError):
    """The broker rejected the client's login (SASL) or its TLS handshake failed.

    Raised by ``start()`` (``async with EmbedClient(...)``).
    """

    @classmethod
    def of(cls, kind: str, reason: str) -> AuthenticationError:
        """The error for a diagnosis of ``kembed_shared.kafka.security.diagnose_login``
        (``kind`` "authentication"): "authentication failed: <reason>"."""
        return cls(f"{kind} failed: {reason}")


class AuthorizationError(KafkaAccessError):
    """The client's principal may not do ``operation`` ("write", "read", "describe") on
    ``topic``: the cluster needs an ACL allowing it.

    Raised by ``embed()`` when the request topic may not be written (at once, not after the
    timeout), and by ``start()`` or ``embed()`` when the reply topic may not be read.
    """

    def __init__(self, principal: str, operation: str, topic: str) -> None:
        op = operation.upper()
        super().__init__(
            f"authorization failed: {principal} is not authorized for {op} on topic "
            f"{topic!r} (Kafka TOPIC_AUTHORIZATION_FAILED); it needs an ACL allowing {op} "
            "on that topic"
        )
        self.principal = principal
        self.operation = operation
        self.topic = topic


class CatalogUnavailableError(KembedError):
    """The model catalog topic could not be read: no broker answered, or not in time."""
