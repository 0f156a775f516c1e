"""Unit tests for producer_sdk.encodings: numpy decoding of every output encoding, checked
against the worker's encoder (worker.publish) through the real codec."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from producer_sdk import Embeddings, dequantize_int8, hamming_distances, unpack_bits
from producer_sdk.encodings import decode_scales, decode_vectors
from schemas import EmbedRequest, EmbedResult, Encoding, decode_result
from schemas.encodings import unpack_rows
from worker.publish import encode_vectors, finish

DTYPES = {
    Encoding.FLOAT32: np.float32,
    Encoding.FLOAT16: np.float16,
    Encoding.INT8: np.int8,
    Encoding.BINARY: np.uint8,
}


@st.composite
def pooled(draw: st.DrawFn) -> npt.NDArray[np.float32]:
    """Pooled-like float32 rows: 1-5 rows of 1-48 values in [-8, 8]."""
    shape = (draw(st.integers(1, 5)), draw(st.integers(1, 48)))
    return draw(hnp.arrays(np.float32, shape, elements=st.floats(-8, 8, width=32)))


def through_the_wire(
    raw: npt.NDArray[np.float32],
    encoding: Encoding,
    *,
    normalize: bool = True,
    dimensions: int | None = None,
) -> EmbedResult:
    request = EmbedRequest(
        id="r",
        inputs=tuple("t" * raw.shape[0]),
        normalize=normalize,
        dimensions=dimensions,
        encoding=encoding,
    )
    result = decode_result(encode_vectors(request, raw, [1] * raw.shape[0], "m", 1 << 20))
    assert isinstance(result, EmbedResult)
    return result


@settings(max_examples=150, deadline=None)
@given(pooled(), st.sampled_from(Encoding), st.booleans(), st.data())
def test_every_encoding_round_trips_from_worker_to_sdk(
    raw: npt.NDArray[np.float32], encoding: Encoding, normalize: bool, data: st.DataObject
) -> None:
    """Worker encoding -> wire -> SDK decoding gives the documented dtype and shape, and
    values that agree with the float32 result: float16 to half precision, int8 codes *
    scales to half a step, binary bits equal to the float32 signs."""
    dimensions = data.draw(st.none() | st.integers(1, raw.shape[1]))
    reference = finish(raw, normalize=normalize, dimensions=dimensions)
    n, dim = reference.shape
    got = Embeddings.from_result(
        through_the_wire(raw, encoding, normalize=normalize, dimensions=dimensions)
    )
    assert got.encoding is encoding
    assert got.dim == dim
    assert got.vectors.dtype == DTYPES[encoding]
    expected_shape = (n, (dim + 7) // 8) if encoding == Encoding.BINARY else (n, dim)
    assert got.vectors.shape == expected_shape
    assert got.vectors.flags.writeable
    match encoding:
        case Encoding.FLOAT32:
            np.testing.assert_array_equal(got.vectors, reference)
            np.testing.assert_array_equal(got.to_float32(), reference)
        case Encoding.FLOAT16:
            tolerance = np.maximum(np.abs(reference) * 2.0**-11, 2.0**-25)
            assert np.all(np.abs(got.to_float32() - reference) <= tolerance)
        case Encoding.INT8:
            assert got.scales is not None
            assert got.scales.shape == (n,)
            step = got.scales[:, None].astype(np.float64)
            assert np.all(np.abs(got.to_float32() - reference) <= 0.5001 * step + 1e-7)
            if normalize:
                assert np.all(got.scales == np.float32(1 / 127))
        case Encoding.BINARY:
            assert got.scales is None
            np.testing.assert_array_equal(unpack_bits(got.vectors, dim), reference > 0)
            with pytest.raises(ValueError, match="unpack_bits"):
                got.to_float32()


@settings(max_examples=100, deadline=None)
@given(pooled(), st.sampled_from(Encoding))
def test_numpy_decoding_matches_the_pure_python_reader(
    raw: npt.NDArray[np.float32], encoding: Encoding
) -> None:
    """The SDK's numpy decoding and the stdlib reference reader of schemas.encodings agree."""
    result = through_the_wire(raw, encoding, normalize=False)
    vectors = decode_vectors(result)
    rows = np.array(unpack_rows(result))
    if encoding == Encoding.BINARY:
        np.testing.assert_array_equal(unpack_bits(vectors, result.dim), rows)
    else:
        np.testing.assert_array_equal(vectors.astype(np.float64), rows)
    scales = decode_scales(result)
    assert (scales is None) == (encoding != Encoding.INT8)


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.uint8, st.tuples(st.integers(0, 4), st.integers(1, 70))))
def test_unpack_bits_inverts_packbits(bits: npt.NDArray[np.uint8]) -> None:
    """unpack_bits(packbits(b), dim) == b for any 0/1 matrix, padding dropped."""
    bits = bits % 2
    dim = bits.shape[1]
    packed = np.packbits(bits, axis=1)
    assert packed.shape == (bits.shape[0], (dim + 7) // 8)
    np.testing.assert_array_equal(unpack_bits(packed, dim), bits)


def test_unpack_bits_rejects_a_width_that_does_not_fit_dim() -> None:
    """A packed array whose width is not ceil(dim / 8) is refused, not silently misread."""
    with pytest.raises(ValueError, match="2"):
        unpack_bits(np.zeros((3, 1), np.uint8), 10)


def test_dequantize_int8_multiplies_each_row_by_its_scale() -> None:
    """dequantize_int8 gives codes * scale per row, in float32."""
    codes = np.array([[127, -64], [1, 0]], np.int8)
    out = dequantize_int8(codes, np.array([0.5, 2.0], np.float32))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[63.5, -32.0], [2.0, 0.0]])


@settings(max_examples=100, deadline=None)
@given(
    hnp.arrays(np.uint8, (3, 5)),
    hnp.arrays(np.uint8, (4, 5)),
)
def test_hamming_distances_count_differing_bits(
    queries: npt.NDArray[np.uint8], vectors: npt.NDArray[np.uint8]
) -> None:
    """hamming_distances[i, j] is the number of bits where queries[i] and vectors[j] differ."""
    distances = hamming_distances(queries, vectors)
    assert distances.shape == (3, 4)
    for i in range(3):
        for j in range(4):
            pairs = zip(queries[i].tolist(), vectors[j].tolist(), strict=True)
            expected = sum(bin(a ^ b).count("1") for a, b in pairs)
            assert distances[i, j] == expected


def test_decoding_is_native_byte_order_and_writable() -> None:
    """Decoded arrays own their memory in native order (safe to modify, fast to use)."""
    raw = np.array([[0.25, -0.5, 1.0]], np.float32)
    for encoding in Encoding:
        vectors = decode_vectors(through_the_wire(raw, encoding))
        assert vectors.dtype.isnative
        assert vectors.flags.writeable
        assert vectors.flags.owndata
