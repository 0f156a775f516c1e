"""Unit tests for worker.publish: post-processing, result encoding and dead-letter headers."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from schemas import EmbedRequest, EmbedResult, ErrorCode, ErrorResult, decode_result
from schemas.headers import (
    CORRELATION_ID,
    DLQ_ERROR_CODE,
    DLQ_ERROR_MESSAGE,
    DLQ_OFFSET,
    DLQ_PARTITION,
    DLQ_TOPIC,
)
from worker.ports import Record
from worker.publish import dead_letter_headers, encode_vectors, finish, result_headers


def raw_vectors() -> npt.NDArray[np.float32]:
    return np.array([[3.0, 4.0, 12.0, 0.0], [1.0, 0.0, 0.0, 0.0]], dtype=np.float32)


def unpack_vectors(result: EmbedResult) -> npt.NDArray[np.float32]:
    return np.frombuffer(result.vectors, dtype="<f4").reshape(result.count, result.dim)


def test_finish_normalizes_rows_to_unit_length() -> None:
    """With normalize=True every row comes out with L2 norm 1, direction unchanged."""
    out = finish(raw_vectors(), normalize=True, dimensions=None)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), [1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(out[0], np.array([3, 4, 12, 0]) / 13.0, rtol=1e-6)


def test_finish_leaves_rows_alone_without_normalize() -> None:
    """With normalize=False and no dimensions the values are returned unchanged."""
    raw = raw_vectors()
    out = finish(raw, normalize=False, dimensions=None)
    np.testing.assert_array_equal(out, raw)


def test_finish_truncates_then_renormalizes() -> None:
    """dimensions keeps the first N values, and normalize re-normalizes the truncated row."""
    out = finish(raw_vectors(), normalize=True, dimensions=2)
    assert out.shape == (2, 2)
    np.testing.assert_allclose(out[0], [0.6, 0.8], rtol=1e-6)
    np.testing.assert_allclose(out[1], [1.0, 0.0], rtol=1e-6)


def test_finish_truncates_without_normalizing() -> None:
    """dimensions without normalize only truncates."""
    out = finish(raw_vectors(), normalize=False, dimensions=3)
    np.testing.assert_array_equal(out, raw_vectors()[:, :3])


def test_finish_zero_row_stays_finite() -> None:
    """Normalizing an all-zero row yields zeros, not NaN."""
    out = finish(np.zeros((1, 4), dtype=np.float32), normalize=True, dimensions=None)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out, np.zeros((1, 4), dtype=np.float32))


def test_finish_returns_contiguous_little_endian_float32() -> None:
    """The output is C-contiguous little-endian float32, ready for tobytes()."""
    wide = np.arange(12, dtype=np.float32).reshape(2, 6)
    out = finish(wide, normalize=False, dimensions=4)  # a column slice: not contiguous
    assert out.dtype == np.dtype("<f4")
    assert out.flags["C_CONTIGUOUS"]


def test_encode_vectors_decodes_to_the_right_result() -> None:
    """encode_vectors yields a result whose shape, values, tokens, keys and meta decode intact."""
    request = EmbedRequest(
        id="req-1", inputs=("a", "b"), dimensions=2, keys=("x", 7), meta={"trace": "t"}
    )
    encoded = encode_vectors(request, raw_vectors(), [5, 9], "minilm", max_bytes=10_000)
    result = decode_result(encoded)
    assert isinstance(result, EmbedResult)
    assert result.id == "req-1"
    assert result.model == "minilm"
    assert result.dim == 2
    assert result.dtype == "float32"
    assert result.tokens == (5, 9)
    assert result.keys == ("x", 7)
    assert result.meta == {"trace": "t"}
    np.testing.assert_allclose(unpack_vectors(result), [[0.6, 0.8], [1.0, 0.0]], rtol=1e-6)


def test_encode_vectors_without_normalize_keeps_raw_values() -> None:
    """A normalize=False request gets the raw pooled values back bit for bit."""
    request = EmbedRequest(id="r", inputs=("a", "b"), normalize=False)
    result = decode_result(encode_vectors(request, raw_vectors(), [1, 1], "m", max_bytes=10_000))
    assert isinstance(result, EmbedResult)
    assert result.dim == 4
    np.testing.assert_array_equal(unpack_vectors(result), raw_vectors())


def test_encode_vectors_over_max_bytes_is_result_too_large() -> None:
    """A result larger than max_bytes becomes a result_too_large error, keeping keys and meta."""
    request = EmbedRequest(id="big", inputs=("a", "b"), keys=(1, 2), meta={"m": 1})
    raw = np.ones((2, 384), dtype=np.float32)
    full = encode_vectors(request, raw, [3, 3], "m", max_bytes=1_000_000)
    assert isinstance(decode_result(full), EmbedResult)
    limit = len(full) - 1
    encoded = encode_vectors(request, raw, [3, 3], "m", max_bytes=limit)
    result = decode_result(encoded)
    assert isinstance(result, ErrorResult)
    assert result.id == "big"
    assert result.error.code == ErrorCode.RESULT_TOO_LARGE
    assert str(limit) in result.error.message
    assert result.keys == (1, 2)
    assert result.meta == {"m": 1}
    assert len(encoded) <= limit


def test_encode_vectors_at_exactly_max_bytes_is_sent() -> None:
    """A result exactly max_bytes long is still sent as vectors."""
    request = EmbedRequest(id="r", inputs=("a",))
    raw = np.ones((1, 16), dtype=np.float32)
    size = len(encode_vectors(request, raw, [2], "m", max_bytes=1_000_000))
    assert isinstance(decode_result(encode_vectors(request, raw, [2], "m", size)), EmbedResult)


def test_result_headers_carry_the_correlation_id() -> None:
    """Result headers hold the request id as kafka_correlationId."""
    assert result_headers("req-é") == [(CORRELATION_ID, "req-é".encode())]


def test_dead_letter_headers_keep_originals_and_add_origin() -> None:
    """Dead-letter headers are the original headers plus origin topic/partition/offset/why."""
    original = (("trace", b"abc"), (CORRELATION_ID, b"id-1"))
    record = Record(
        topic="embed.requests", partition=4, offset=123456, value=b"x", headers=original
    )
    headers = dead_letter_headers(record, "invalid_request", "bad \udcff message")
    assert headers[: len(original)] == list(original)
    added = dict(headers[len(original) :])
    assert added[DLQ_TOPIC] == b"embed.requests"
    assert added[DLQ_PARTITION] == b"4"
    assert added[DLQ_OFFSET] == b"123456"
    assert added[DLQ_ERROR_CODE] == b"invalid_request"
    assert added[DLQ_ERROR_MESSAGE] == b"bad ? message"
    assert len(headers) == len(original) + 5
