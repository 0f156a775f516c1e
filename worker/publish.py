"""Publish stage, pure part: finished vectors and errors become result messages.

Per-request post-processing happens here, after pooling, so requests with different
options share batches: Matryoshka ``dimensions`` (truncate, then re-normalize) and L2
``normalize``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from schemas import EmbedRequest, EmbedResult, ErrorCode, ErrorInfo, ErrorResult, encode_result
from schemas.headers import (
    CORRELATION_ID,
    DLQ_ERROR_CODE,
    DLQ_ERROR_MESSAGE,
    DLQ_OFFSET,
    DLQ_PARTITION,
    DLQ_TOPIC,
)
from worker.ports import Record

__all__ = ["dead_letter_headers", "encode_error", "encode_vectors", "finish", "result_headers"]


def finish(
    raw: npt.NDArray[np.float32], *, normalize: bool, dimensions: int | None
) -> npt.NDArray[np.float32]:
    vectors = raw[:, :dimensions] if dimensions else raw
    if normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(vectors, dtype="<f4")


def encode_vectors(
    request: EmbedRequest,
    raw: npt.NDArray[np.float32],
    tokens: list[int],
    model: str,
    max_bytes: int,
) -> bytes:
    """The result message; a ``result_too_large`` error if it would exceed ``max_bytes``."""
    vectors = finish(raw, normalize=request.normalize, dimensions=request.dimensions)
    result = EmbedResult(
        id=request.id,
        model=model,
        dim=int(vectors.shape[1]),
        vectors=vectors.tobytes(),
        tokens=tuple(tokens),
        keys=request.keys,
        meta=request.meta,
    )
    encoded = encode_result(result)
    if len(encoded) <= max_bytes:
        return encoded
    error = ErrorInfo(
        ErrorCode.RESULT_TOO_LARGE,
        f"result of {len(encoded)} bytes exceeds max_result_bytes {max_bytes}; "
        "send fewer inputs per request or ask for fewer dimensions",
    )
    return encode_error(request.id, error, request.keys, request.meta)


def encode_error(
    request_id: str,
    error: ErrorInfo,
    keys: tuple[str | int, ...] | None = None,
    meta: dict[str, object] | None = None,
) -> bytes:
    return encode_result(ErrorResult(id=request_id, error=error, keys=keys, meta=meta))


def result_headers(request_id: str) -> list[tuple[str, bytes]]:
    return [(CORRELATION_ID, request_id.encode("utf-8"))]


def dead_letter_headers(record: Record, code: str, message: str) -> list[tuple[str, bytes]]:
    """The original headers plus where the message came from and why it is here."""
    return [
        *record.headers,
        (DLQ_TOPIC, record.topic.encode()),
        (DLQ_PARTITION, str(record.partition).encode()),
        (DLQ_OFFSET, str(record.offset).encode()),
        (DLQ_ERROR_CODE, code.encode()),
        (DLQ_ERROR_MESSAGE, message.encode("utf-8", "replace")),
    ]
