"""Publish stage, pure part: finished vectors and errors become result messages.

Per-request post-processing happens here, after pooling, so requests with different
options share batches, in this order: Matryoshka ``dimensions`` (truncate), L2
``normalize``, then the output ``encoding`` (float32, float16, int8 or binary; byte layouts
in ``schemas/README.md``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kembed_shared.encodings import encode_rows, quantize_int8
from schemas import (
    EmbedRequest,
    EmbedResult,
    ErrorCode,
    ErrorInfo,
    ErrorResult,
    encode_result,
)
from schemas.headers import CORRELATION_ID, LANE
from worker.chunking import ChunkedRequest, pool

__all__ = [
    "encode_error",
    "encode_rows",
    "encode_vectors",
    "finish",
    "quantize_int8",
    "result_headers",
    "within_limit",
]


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
    requested_ms: int | None = None,
) -> bytes:
    """The result message; a ``result_too_large`` error if it would exceed ``max_bytes``.
    ``requested_ms``: the request record's timestamp, copied as the result's version."""
    vectors = finish(raw, normalize=request.normalize, dimensions=request.dimensions)
    vectors, tokens = pool(request, vectors, tokens)  # chunks: per chunk, or their mean
    blob, scales = encode_rows(vectors, request.encoding, normalized=request.normalize)
    chunked = request if isinstance(request, ChunkedRequest) else None
    result = EmbedResult(
        id=request.id,
        model=model,
        dim=int(vectors.shape[1]),
        vectors=blob,
        tokens=tuple(tokens),
        dtype=request.encoding,
        keys=request.keys,
        meta=request.meta,
        scales=scales,
        requested_ms=requested_ms if requested_ms else None,  # 0: no timestamp known
        chunks=chunked.chunks if chunked else None,
        spans=chunked.spans if chunked else None,
        chunk_pooling=chunked.chunk_pooling if chunked else None,
    )
    return within_limit(
        encode_result(result),
        max_bytes,
        "send fewer inputs per request, ask for fewer dimensions or a smaller encoding",
        request.id,
        request.keys,
        request.meta,
    )


def within_limit(
    encoded: bytes,
    max_bytes: int,
    advice: str,
    request_id: str,
    keys: tuple[str | int, ...] | None,
    meta: dict[str, object] | None,
) -> bytes:
    """``encoded`` (a result), or a ``result_too_large`` error in its place when it exceeds
    ``max_bytes`` (``advice``: what the caller can do about it)."""
    if len(encoded) <= max_bytes:
        return encoded
    error = ErrorInfo(
        ErrorCode.RESULT_TOO_LARGE,
        f"result of {len(encoded)} bytes exceeds max_result_bytes {max_bytes}; {advice}",
    )
    return encode_error(request_id, error, keys, meta)


def encode_error(
    request_id: str,
    error: ErrorInfo,
    keys: tuple[str | int, ...] | None = None,
    meta: dict[str, object] | None = None,
) -> bytes:
    return encode_result(ErrorResult(id=request_id, error=error, keys=keys, meta=meta))


def result_headers(request_id: str, lane: str = "") -> list[tuple[str, bytes]]:
    """A result's headers: its request id, and the lane its request came on (``bulk`` or
    ``interactive``; a sink writes only results of the bulk lane)."""
    headers = [(CORRELATION_ID, request_id.encode("utf-8"))]
    if lane:
        headers.append((LANE, lane.encode("utf-8")))
    return headers
