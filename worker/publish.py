"""Publish stage, pure part: finished vectors and errors become result messages.

Per-request post-processing happens here, after pooling, so requests with different
options share batches, in this order: Matryoshka ``dimensions`` (truncate), L2
``normalize``, then the output ``encoding`` (float32, float16, int8 or binary; byte layouts
in ``schemas/README.md``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from schemas import (
    EmbedRequest,
    EmbedResult,
    Encoding,
    ErrorCode,
    ErrorInfo,
    ErrorResult,
    encode_result,
)
from schemas.encodings import INT8_NORMALIZED_SCALE
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

INT8_MAX = 127


def finish(
    raw: npt.NDArray[np.float32], *, normalize: bool, dimensions: int | None
) -> npt.NDArray[np.float32]:
    vectors = raw[:, :dimensions] if dimensions else raw
    if normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(vectors, dtype="<f4")


def encode_rows(
    vectors: npt.NDArray[np.float32], encoding: Encoding, *, normalized: bool
) -> tuple[bytes, bytes | None]:
    """The ``vectors`` blob of ``vectors`` (finished rows) in ``encoding``, and the int8
    ``scales`` blob (None for the other encodings)."""
    match encoding:
        case Encoding.FLOAT32:
            return np.ascontiguousarray(vectors, dtype="<f4").tobytes(), None
        case Encoding.FLOAT16:
            with np.errstate(over="ignore"):  # beyond +-65504 is +-inf, as IEEE says
                return np.ascontiguousarray(vectors, dtype="<f2").tobytes(), None
        case Encoding.INT8:
            codes, scales = quantize_int8(vectors, normalized=normalized)
            return codes.tobytes(), scales.astype("<f4").tobytes()
        case Encoding.BINARY:
            return np.packbits(vectors > 0, axis=1, bitorder="big").tobytes(), None


def quantize_int8(
    vectors: npt.NDArray[np.float32], *, normalized: bool
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.float32]]:
    """Codes ``q`` in [-127, 127] and one float32 scale per row, value ~= ``q * scale``.

    One formula for every row: ``q = rint(x / scale)``, the quotient taken in float64 with
    the float32 scale that is sent (``rint`` rounds half to even). Normalized rows share the
    fixed scale float32(1/127), so int8 dot products compare across vectors; other rows use
    their own largest magnitude (``scale = max|x| / 127``, rounded to float32).
    """
    values = vectors.astype(np.float64)
    rows = values.shape[0]
    if normalized:
        scales = np.full(rows, INT8_NORMALIZED_SCALE, dtype=np.float32)
    else:
        scales = (np.max(np.abs(values), axis=1) / INT8_MAX).astype(np.float32)
        # An all-zero row (or one so small that its scale underflows) codes as zeros.
        scales[~(scales > 0)] = np.float32(INT8_NORMALIZED_SCALE)
    scaled = values / scales.astype(np.float64)[:, None]
    codes = np.clip(np.rint(scaled), -INT8_MAX, INT8_MAX).astype(np.int8)
    return codes, scales


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
