"""Every error the gateway answers, in one table: HTTP status and body in OpenAI's shape,
in text-embeddings-inference's and in Cohere's (docs/gateway.md, "Errors").

A failure is an :class:`ApiError` with a gateway ``code`` (the ``code`` of OpenAI's error
body); :data:`KINDS` gives each code its OpenAI status and ``type``, and its TEI status and
``error_type``; Cohere's API answers the OpenAI status with ``{"id", "message"}``.
:func:`from_sdk` turns what the producer SDK raises (and the wire error codes inside
:class:`~producer_sdk.EmbedError`) into such an error. Nothing here imports the web
framework.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from uuid import uuid4

from producer_sdk.errors import (
    CatalogUnavailableError,
    ClientClosedError,
    EmbedError,
    EmbedTimeoutError,
    InputTooLongError,
    KembedError,
    RequestTooLargeError,
)
from schemas import ErrorCode

__all__ = [
    "KINDS",
    "WIRE_CODES",
    "ApiError",
    "Kind",
    "Shape",
    "from_sdk",
]

Shape = Literal["openai", "tei", "cohere"]
"""The error body a route answers with: OpenAI's (``/v1/...``), TEI's (``/``, ``/embed``,
``/embed_sparse``, ``/rerank``, ``/similarity``, ``/info``) or Cohere's (``/v2/...``)."""


@dataclass(frozen=True, slots=True)
class Kind:
    """What one gateway error code is in each API."""

    status: int
    """HTTP status of the OpenAI-shaped answer."""
    type: str
    """OpenAI's ``error.type``."""
    tei_status: int
    """HTTP status of the TEI-shaped answer."""
    tei_type: str
    """TEI's ``error_type``."""


_INVALID = "invalid_request_error"
_SERVER = "server_error"

KINDS: dict[str, Kind] = {
    "invalid_request": Kind(400, _INVALID, 422, "Validation"),
    "empty_input": Kind(400, _INVALID, 400, "Empty"),
    "too_many_inputs": Kind(400, _INVALID, 413, "Validation"),
    "input_too_long": Kind(400, _INVALID, 422, "Validation"),
    "invalid_api_key": Kind(401, _INVALID, 401, "Validation"),
    "model_not_found": Kind(404, _INVALID, 503, "Unhealthy"),
    "not_found": Kind(404, _INVALID, 404, "Validation"),
    "method_not_allowed": Kind(405, _INVALID, 405, "Validation"),
    "request_timeout": Kind(408, _INVALID, 408, "Validation"),
    "request_too_large": Kind(413, _INVALID, 413, "Validation"),
    "overloaded": Kind(429, "rate_limit_error", 429, "Overloaded"),
    "internal": Kind(500, _SERVER, 424, "Backend"),
    "result_too_large": Kind(500, _SERVER, 424, "Backend"),
    "no_worker": Kind(503, _SERVER, 503, "Unhealthy"),
    "kafka_unavailable": Kind(503, _SERVER, 503, "Unhealthy"),
    "deadline_exceeded": Kind(504, _SERVER, 504, "Unhealthy"),
}
"""Gateway error code -> its statuses and types (TEI names no model: a ``model_not_found``
there is the gateway's configured model that no live worker serves, so Unhealthy).
``not_found`` and ``method_not_allowed`` answer a path or method no route has;
``request_timeout`` a body that did not arrive within ``body_timeout_s``."""

WIRE_CODES: dict[str, str] = {
    ErrorCode.INVALID_REQUEST: "invalid_request",
    ErrorCode.TOO_MANY_INPUTS: "too_many_inputs",
    ErrorCode.INPUT_TOO_LONG: "input_too_long",
    ErrorCode.MESSAGE_TOO_LARGE: "request_too_large",
    ErrorCode.RESULT_TOO_LARGE: "result_too_large",
    ErrorCode.UNKNOWN_MODEL: "model_not_found",
    ErrorCode.DEADLINE_EXCEEDED: "deadline_exceeded",
    ErrorCode.INTERNAL: "internal",
    ErrorCode.UNSUPPORTED_VERSION: "internal",
    ErrorCode.REPLY_FORBIDDEN: "internal",
}
"""Wire error code of a worker's error result -> gateway code (unknown codes: internal)."""


class ApiError(Exception):
    """An answer that is an error: ``code`` is a key of :data:`KINDS`."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if code not in KINDS:
            raise ValueError(f"unknown gateway error code {code!r}")
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.param = param
        self.headers = dict(headers or {})
        self.model = ""
        """The catalog's name of the model the request was for, once known (a metrics label)."""

    @property
    def kind(self) -> Kind:
        return KINDS[self.code]

    def status(self, shape: Shape) -> int:
        return self.kind.tei_status if shape == "tei" else self.kind.status

    def body(self, shape: Shape) -> dict[str, Any]:
        """The JSON body: ``{"error": {message, type, param, code}}`` (OpenAI),
        ``{"error": message, "error_type": ...}`` (TEI) or ``{"id", "message"}`` (Cohere)."""
        if shape == "tei":
            return {"error": self.message, "error_type": self.kind.tei_type}
        if shape == "cohere":
            return {"id": str(uuid4()), "message": self.message}
        return {
            "error": {
                "message": self.message,
                "type": self.kind.type,
                "param": self.param,
                "code": self.code,
            }
        }


def from_sdk(error: KembedError, *, workers_live: bool = True, field: str = "input") -> ApiError:
    """The answer for what the SDK raised. ``workers_live`` decides a timeout: 504 when
    the catalog shows a live worker for the model (slow or backlogged), else 503.
    ``field`` is what the API calls the request's texts (``input``, ``documents``,
    ``texts``): the ``param`` of an error about one of them."""
    if isinstance(error, EmbedError):
        code = WIRE_CODES.get(error.code, "internal")
        item = field.removesuffix("s")  # documents, texts: "(document 3)", "(text 3)"
        where = f" ({item} {error.index})" if error.index is not None else ""
        param = field if error.index is not None or code == "input_too_long" else None
        if code == "internal":
            return ApiError(code, "the worker failed to answer the request; it may succeed again")
        return ApiError(code, f"{error.message}{where}", param=param)
    if isinstance(error, EmbedTimeoutError):
        if workers_live:
            return ApiError(
                "deadline_exceeded",
                f"no result within {error.timeout:g} s; the workers drop the request",
            )
        return ApiError("no_worker", "no worker answered in time and none serves the model")
    if isinstance(error, RequestTooLargeError):
        return ApiError(
            "request_too_large",
            f"the request would be {error.size} bytes on Kafka, above its limit of "
            f"{error.limit}; send fewer or shorter texts",
            param=field,
        )
    if isinstance(error, InputTooLongError):  # the client's limit is below the gateway's
        where = "query" if error.index is None else f"{field}[{error.index}]"
        return ApiError(
            "input_too_long",
            f"{where} has {error.length} characters, above the limit of {error.limit}",
            param="query" if error.index is None else field,
        )
    if isinstance(error, CatalogUnavailableError | ClientClosedError):
        return ApiError("kafka_unavailable", "Kafka is not reachable from the gateway")
    return ApiError("internal", "the gateway could not send the request to Kafka")
