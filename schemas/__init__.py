"""kembed wire format: versioned msgpack messages. Depends on msgpack and the stdlib only."""

from schemas.codec import decode_request, decode_result, encode_request, encode_result
from schemas.encodings import Encoding
from schemas.errors import Envelope, ErrorCode, SchemaError
from schemas.kinds import Kind
from schemas.v1 import (
    CHUNK_POOLINGS,
    DEFAULT_MAX_INPUT_CHARS,
    DEFAULT_RESULTS_TOPIC,
    REQUEST_KINDS,
    VERSION,
    Chunking,
    EmbedRequest,
    EmbedResult,
    ErrorInfo,
    ErrorResult,
    Request,
    RerankRequest,
    RerankResult,
    Result,
)

__all__ = [
    "CHUNK_POOLINGS",
    "DEFAULT_MAX_INPUT_CHARS",
    "DEFAULT_RESULTS_TOPIC",
    "REQUEST_KINDS",
    "VERSION",
    "Chunking",
    "EmbedRequest",
    "EmbedResult",
    "Encoding",
    "Envelope",
    "ErrorCode",
    "ErrorInfo",
    "ErrorResult",
    "Kind",
    "RerankRequest",
    "RerankResult",
    "Request",
    "Result",
    "SchemaError",
    "decode_request",
    "decode_result",
    "encode_request",
    "encode_result",
]
