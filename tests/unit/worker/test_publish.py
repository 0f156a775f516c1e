"""Unit tests for worker.publish: post-processing, output encodings, result encoding and
dead-letter headers."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import schemas.headers as hdr
from kembed_shared.ports import Record
from schemas import (
    EmbedRequest,
    EmbedResult,
    Encoding,
    ErrorCode,
    ErrorInfo,
    ErrorResult,
    decode_result,
    encode_result,
)
from schemas.encodings import INT8_NORMALIZED_SCALE, row_bytes, unpack_rows, unpack_scales
from tests.conftest import embed_request
from worker.publish import (
    encode_error,
    encode_rows,
    encode_vectors,
    finish,
    quantize_int8,
    result_headers,
)


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


def _float32_meta_request(**fields: Any) -> bytes:
    """A request whose meta holds msgpack float32s and a uint32-wide integer, as a JVM
    client's msgpack-core packFloat / packInt(Long) may write them."""
    packer = msgpack.Packer(use_bin_type=True)
    meta = (
        packer.pack_map_header(3)
        + packer.pack("score")
        + struct.pack(">Bf", 0xCA, 0.1)  # float32
        + packer.pack("docs")
        + packer.pack_array_header(1)
        + packer.pack_map_header(1)
        + packer.pack("weight")
        + struct.pack(">Bf", 0xCA, 0.5)
        + packer.pack("count")
        + struct.pack(">BI", 0xCE, 7)  # 7 as uint32, not a positive fixint
    )
    body = {"v": 1, "id": "req-m", "inputs": ["text"], **fields}
    return (
        packer.pack_map_header(len(body) + 1)
        + b"".join(packer.pack(key) + packer.pack(value) for key, value in body.items())
        + packer.pack("meta")
        + meta
    )


def test_meta_is_copied_into_the_result_byte_for_byte() -> None:
    """A request's meta comes back in its result (vectors or error) exactly as the client
    wrote it: float32 values stay float32, integers keep their width."""
    data = _float32_meta_request()
    packed_meta = data[data.index(b"\xa4meta") + 5 :]
    request = embed_request(data)
    assert request.meta == {"score": pytest.approx(0.1), "docs": [{"weight": 0.5}], "count": 7}
    vectors = encode_vectors(request, raw_vectors()[:1], [3], "minilm", max_bytes=10_000)
    assert vectors.endswith(b"\xa4meta" + packed_meta)
    error = encode_error(request.id, ErrorInfo(ErrorCode.INTERNAL, "x"), None, request.meta)
    assert error.endswith(b"\xa4meta" + packed_meta)
    assert decode_result(vectors).meta == request.meta


def test_changed_meta_is_encoded_from_its_contents() -> None:
    """A decoded meta that was changed afterwards is written as it now is, not as read."""
    request = embed_request(_float32_meta_request())
    assert request.meta is not None
    request.meta["score"] = 2.0
    result = decode_result(
        encode_error(request.id, ErrorInfo(ErrorCode.INTERNAL, "x"), None, request.meta)
    )
    assert result.meta is not None
    assert result.meta["score"] == 2.0


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
    assert result_headers("req-é") == [(hdr.CORRELATION_ID, "req-é".encode())]


def test_dead_letter_headers_keep_originals_and_add_origin() -> None:
    """Dead-letter headers are the original headers plus origin topic/partition/offset/why."""
    original = (("trace", b"abc"), (hdr.CORRELATION_ID, b"id-1"))
    record = Record(
        topic="embed.requests", partition=4, offset=123456, value=b"x", headers=original
    )
    headers = hdr.dead_letter_headers(record, "invalid_request", "bad \udcff message")
    assert headers[: len(original)] == list(original)
    added = dict(headers[len(original) :])
    assert added[hdr.DLQ_TOPIC] == b"embed.requests"
    assert added[hdr.DLQ_PARTITION] == b"4"
    assert added[hdr.DLQ_OFFSET] == b"123456"
    assert added[hdr.DLQ_ERROR_CODE] == b"invalid_request"
    assert added[hdr.DLQ_ERROR_MESSAGE] == b"bad ? message"
    assert len(headers) == len(original) + 5


# ---------------------------------------------------------------------------- output encodings

VECTORS = Path(__file__).resolve().parents[3] / "schemas" / "vectors" / "v1"


@st.composite
def matrices(draw: st.DrawFn, *, max_magnitude: float = 1e4) -> npt.NDArray[np.float32]:
    """Finite float32 matrices, 1-6 rows of 1-40 values, zeros and tiny values included."""
    shape = (draw(st.integers(1, 6)), draw(st.integers(1, 40)))
    values = st.floats(-max_magnitude, max_magnitude, width=32, allow_subnormal=True)
    return draw(hnp.arrays(np.float32, shape, elements=values))


def unit_rows(raw: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    return finish(raw, normalize=True, dimensions=None)


@settings(max_examples=200, deadline=None)
@given(matrices())
def test_float32_encoding_is_the_values_bit_for_bit(vectors: npt.NDArray[np.float32]) -> None:
    """float32 writes the little-endian float32 values unchanged, no scales."""
    blob, scales = encode_rows(vectors, Encoding.FLOAT32, normalized=False)
    assert scales is None
    assert blob == vectors.astype("<f4").tobytes()


@settings(max_examples=200, deadline=None)
@given(matrices(max_magnitude=6e4))
def test_float16_encoding_is_ieee_half_rounding(vectors: npt.NDArray[np.float32]) -> None:
    """float16 is little-endian IEEE half, each value rounded to nearest: relative error at
    most 2^-11 for normal halves, absolute at most 2^-25 below them."""
    blob, scales = encode_rows(vectors, Encoding.FLOAT16, normalized=False)
    assert scales is None
    assert len(blob) == vectors.size * 2
    halves = np.frombuffer(blob, "<f2").reshape(vectors.shape).astype(np.float64)
    exact = vectors.astype(np.float64)
    assert np.all(np.abs(halves - exact) <= np.maximum(np.abs(exact) * 2.0**-11, 2.0**-25))


@settings(max_examples=200, deadline=None)
@given(matrices())
def test_int8_of_normalized_rows_is_rint_x_over_the_scale(raw: npt.NDArray[np.float32]) -> None:
    """Normalized rows: codes rint(x / scale) in [-127, 127] (float64 quotient), every
    scale float32(1/127), and codes / 127 within half a step (1/254) of the value."""
    vectors = unit_rows(raw)
    codes, scales = quantize_int8(vectors, normalized=True)
    assert codes.dtype == np.int8
    assert codes.shape == vectors.shape
    scale = np.float64(np.float32(INT8_NORMALIZED_SCALE))
    np.testing.assert_array_equal(codes, np.rint(vectors.astype(np.float64) / scale))
    assert np.all(np.abs(codes.astype(np.int32)) <= 127)
    assert np.all(scales == np.float32(INT8_NORMALIZED_SCALE))
    assert np.all(np.abs(codes / 127 - vectors) <= 0.5 / 127 + 1e-7)


@settings(max_examples=200, deadline=None)
@given(matrices())
def test_int8_of_unnormalized_rows_uses_a_per_row_scale(raw: npt.NDArray[np.float32]) -> None:
    """Unnormalized rows: scale = max|x| / 127 per row, the largest magnitude codes as
    +-127, and codes * scale is within half a step of every value."""
    codes, scales = quantize_int8(raw, normalized=False)
    assert scales.dtype == np.float32
    assert scales.shape == (raw.shape[0],)
    peaks = np.max(np.abs(raw.astype(np.float64)), axis=1)
    restored = codes.astype(np.float64) * scales.astype(np.float64)[:, None]
    for row in range(raw.shape[0]):
        if np.float32(peaks[row] / 127) >= np.finfo(np.float32).tiny:  # not vanishingly small
            assert scales[row] == np.float32(peaks[row] / 127)
            assert np.max(np.abs(codes[row].astype(np.int32))) == 127
            assert np.all(np.abs(restored[row] - raw[row]) <= 0.5001 * scales[row])
        else:  # peaks under ~1e-36: subnormal scales are coarse; never worse than zeros
            assert np.all(np.abs(restored[row] - raw[row]) <= 2 * peaks[row])


def test_int8_zero_row_has_zero_codes_and_the_default_scale() -> None:
    """An all-zero row codes as zeros with scale 1/127, never NaN or a zero scale."""
    codes, scales = quantize_int8(np.zeros((1, 5), np.float32), normalized=False)
    assert codes.tolist() == [[0, 0, 0, 0, 0]]
    assert scales.tolist() == [np.float32(INT8_NORMALIZED_SCALE)]


def test_int8_rounds_half_to_even() -> None:
    """Ties of x / scale round to the even code, as numpy.rint and IEEE roundTiesToEven
    do (a row whose largest magnitude is 127 has scale 1, so x / scale is x)."""
    vectors = np.array([[127.0, 0.5, 1.5, 2.5, -0.5, -3.5]], np.float32)
    codes, scales = quantize_int8(vectors, normalized=False)
    assert scales.tolist() == [1.0]
    assert codes[0].tolist() == [127, 0, 2, 2, 0, -4]


def test_int8_uses_one_formula_for_normalized_rows() -> None:
    """A normalized value codes as rint(x / float32(1/127)), the formula of every row, not
    rint(x * 127): for 0.625984251499176 (float32) the two fall either side of 79.5."""
    x = np.float32(0.625984251499176)
    assert np.rint(np.float64(x) * 127) == 79
    codes, scales = quantize_int8(np.array([[x, -x]], np.float32), normalized=True)
    assert codes[0].tolist() == [80, -80]
    assert scales[0] == np.float32(INT8_NORMALIZED_SCALE)


@settings(max_examples=200, deadline=None)
@given(matrices())
def test_binary_encoding_packs_sign_bits_msb_first(vectors: npt.NDArray[np.float32]) -> None:
    """binary: bit 1 where the value is > 0, 8 per byte, most significant first, each row
    padded with zero bits to ceil(dim / 8) bytes."""
    rows, dim = vectors.shape
    blob, scales = encode_rows(vectors, Encoding.BINARY, normalized=False)
    assert scales is None
    width = (dim + 7) // 8
    assert len(blob) == rows * width == rows * row_bytes(Encoding.BINARY, dim)
    packed = np.frombuffer(blob, np.uint8).reshape(rows, width)
    bits = np.unpackbits(packed, axis=1)
    np.testing.assert_array_equal(bits[:, :dim], (vectors > 0).astype(np.uint8))
    assert not bits[:, dim:].any()
    first = int(packed[0, 0])
    assert bool(first & 0x80) == bool(vectors[0, 0] > 0)  # value 0 is the top bit


def test_binary_encoding_of_a_known_row() -> None:
    """A worked example: 10 values give 2 bytes, 0b10100110 0b10000000; zero is bit 0."""
    row = np.array([[0.5, -1.0, 0.25, 0.0, -0.1, 0.3, 0.2, -0.4, 0.9, -0.2]], np.float32)
    blob, _ = encode_rows(row, Encoding.BINARY, normalized=False)
    assert blob == bytes([0b10100110, 0b10000000])


@pytest.mark.parametrize(
    "name",
    [
        "result-float16",
        "result-int8-normalized",
        "result-int8-unnormalized",
        "result-int8-normalized-near-tie",
        "result-binary",
    ],
)
def test_worker_reproduces_the_golden_result_vectors(name: str) -> None:
    """The worker encodes the source values named in each golden result's note to exactly
    the golden bytes (blob and scales), so the worker and the spec agree."""
    sources: dict[str, tuple[list[list[float]], bool]] = {
        "result-float16": ([[0.5, -1.0, 0.25], [1.5, 0.0, -0.125]], False),
        "result-int8-normalized": ([[0.6, 0.8, 0.0], [0.0, -1.0, 0.0]], True),
        "result-int8-unnormalized": ([[3.0, -4.0, 1.0], [0.5, 0.25, -0.125]], False),
        "result-int8-normalized-near-tie": (
            [
                [0.625984251499176, 0.7798357009887695, 0.0],
                [-0.625984251499176, 0.0, 0.7798357009887695],
            ],
            True,
        ),
        "result-binary": (
            [
                [0.5, -1.0, 0.25, 0.0, -0.1, 0.3, 0.2, -0.4, 0.9, -0.2],
                [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
            ],
            False,
        ),
    }
    cases = json.loads((VECTORS / "valid.json").read_text(encoding="utf-8"))
    case = next(c for c in cases if c["name"] == name)
    golden: dict[str, Any] = case["value"]
    rows, normalized = sources[name]
    flat = [x for row in rows for x in row]
    assert json.dumps(rows) in case["note"] or json.dumps(flat) in case["note"]
    blob, scales = encode_rows(
        np.array(rows, np.float32), Encoding(golden["dtype"]), normalized=normalized
    )
    assert blob.hex() == golden["vectors"]["$bin"]
    assert (scales or b"").hex() == golden.get("scales", {"$bin": ""})["$bin"]


@pytest.mark.parametrize("encoding", list(Encoding))
def test_encode_vectors_truncates_normalizes_then_encodes(encoding: Encoding) -> None:
    """The result carries dtype = the requested encoding, dim = dimensions, and the encoding
    of the truncated, re-normalized rows."""
    request = EmbedRequest(id="r", inputs=("a", "b"), dimensions=3, encoding=encoding)
    result = decode_result(encode_vectors(request, raw_vectors(), [5, 9], "m", max_bytes=10_000))
    assert isinstance(result, EmbedResult)
    assert result.dtype is encoding
    assert result.dim == 3
    expected = finish(raw_vectors(), normalize=True, dimensions=3)  # [[3,4,12]/13, [1,0,0]]
    np.testing.assert_allclose(expected[0], np.array([3, 4, 12]) / 13, rtol=1e-6)
    blob, scales = encode_rows(expected, encoding, normalized=True)
    assert result.vectors == blob
    assert result.scales == scales
    rows = np.array(unpack_rows(result), dtype=np.float64)
    match encoding:
        case Encoding.FLOAT32 | Encoding.FLOAT16:
            np.testing.assert_allclose(rows, expected, atol=1e-3)
        case Encoding.INT8:
            assert unpack_scales(result) == [INT8_NORMALIZED_SCALE] * 2
            np.testing.assert_allclose(rows / 127, expected, atol=0.5 / 127 + 1e-7)
        case Encoding.BINARY:
            np.testing.assert_array_equal(rows, expected > 0)


def test_encode_vectors_int8_without_normalize_carries_per_row_scales() -> None:
    """normalize=False with int8: scales are max|x| / 127 per row and restore magnitudes."""
    request = EmbedRequest(id="r", inputs=("a", "b"), normalize=False, encoding=Encoding.INT8)
    result = decode_result(encode_vectors(request, raw_vectors(), [1, 1], "m", max_bytes=10_000))
    assert isinstance(result, EmbedResult)
    scales = unpack_scales(result)
    assert scales is not None
    assert scales == [struct.unpack("<f", struct.pack("<f", peak / 127))[0] for peak in (12, 1)]
    restored = np.array(unpack_rows(result)) * np.array(scales)[:, None]
    np.testing.assert_allclose(restored, raw_vectors(), atol=0.5 * 12 / 127)


@pytest.mark.parametrize(
    ("encoding", "fits"),
    [
        (Encoding.FLOAT32, False),
        (Encoding.FLOAT16, False),
        (Encoding.INT8, True),
        (Encoding.BINARY, True),
    ],
)
def test_result_size_limit_applies_to_the_encoded_size(encoding: Encoding, fits: bool) -> None:
    """max_result_bytes is checked against the encoded message: 8 x 384 values need ~12 KiB
    as float32, ~6 KiB as float16, ~3 KiB as int8 and ~0.4 KiB as binary, so a 4 KiB
    limit refuses the first two and sends the others."""
    request = EmbedRequest(id="r", inputs=tuple("abcdefgh"), encoding=encoding)
    raw = np.random.default_rng(7).standard_normal((8, 384)).astype(np.float32)
    encoded = encode_vectors(request, raw, [3] * 8, "m", max_bytes=4096)
    result = decode_result(encoded)
    if fits:
        assert isinstance(result, EmbedResult)
        assert len(encoded) <= 4096
        assert len(result.vectors) == 8 * row_bytes(encoding, 384)
    else:
        assert isinstance(result, ErrorResult)
        assert result.error.code == ErrorCode.RESULT_TOO_LARGE
        assert "smaller encoding" in result.error.message


@settings(max_examples=100, deadline=None)
@given(matrices(), st.sampled_from(Encoding), st.booleans())
def test_encoded_results_survive_the_wire(
    raw: npt.NDArray[np.float32], encoding: Encoding, normalize: bool
) -> None:
    """Any finished matrix, in any encoding, encodes to a result the codec accepts and that
    re-encodes to the same bytes."""
    request = EmbedRequest(
        id="r", inputs=tuple("x" * raw.shape[0]), normalize=normalize, encoding=encoding
    )
    encoded = encode_vectors(request, raw, [1] * raw.shape[0], "m", max_bytes=1 << 20)
    result = decode_result(encoded)
    assert isinstance(result, EmbedResult)
    assert (result.dtype, result.dim, result.count) == (encoding, raw.shape[1], raw.shape[0])
    assert encode_result(result) == encoded
