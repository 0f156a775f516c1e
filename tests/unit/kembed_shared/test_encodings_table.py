"""Unit tests for kembed_shared.encodings: the one numpy table of the output encodings that
the worker packs with, the SDK unpacks with and the sink reads floats from, checked
against the plain-Python reference decoder of schemas.encodings."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kembed_shared.encodings import (
    LAYOUTS,
    decode_scales,
    decode_vectors,
    encode_rows,
    to_float32,
)
from schemas import EmbedResult, Encoding
from schemas.encodings import row_bytes, unpack_rows, unpack_scales


@st.composite
def rows(draw: st.DrawFn) -> npt.NDArray[np.float32]:
    """1-4 rows of 1-40 float32 values in [-4, 4]."""
    shape = (draw(st.integers(1, 4)), draw(st.integers(1, 40)))
    return draw(hnp.arrays(np.float32, shape, elements=st.floats(-4, 4, width=32)))


def packed(vectors: npt.NDArray[np.float32], encoding: Encoding) -> EmbedResult:
    blob, scales = encode_rows(vectors, encoding, normalized=False)
    count, dim = vectors.shape
    return EmbedResult(
        id="r",
        model="m",
        dim=dim,
        vectors=blob,
        tokens=(1,) * count,
        dtype=encoding,
        scales=scales,
    )


def test_every_encoding_has_one_layout_whose_rows_have_the_schema_size() -> None:
    assert set(LAYOUTS) == set(Encoding)
    vectors = np.linspace(-1, 1, 3 * 20, dtype=np.float32).reshape(3, 20)
    for encoding in Encoding:
        blob, scales = encode_rows(vectors, encoding, normalized=False)
        assert len(blob) == 3 * row_bytes(encoding, 20), encoding
        assert (scales is not None) == (encoding == Encoding.INT8), encoding


@settings(max_examples=100, deadline=None)
@given(rows(), st.sampled_from(Encoding))
def test_numpy_unpacking_agrees_with_the_reference_decoder(
    vectors: npt.NDArray[np.float32], encoding: Encoding
) -> None:
    """What the table unpacks is what schemas' decoder without numpy reads: the same
    values (int8: codes; binary: the bits, once unpacked) and the same int8 scales."""
    result = packed(vectors, encoding)
    unpacked = decode_vectors(result)
    assert unpacked.dtype == LAYOUTS[encoding].native
    reference = np.array(unpack_rows(result))
    if encoding == Encoding.BINARY:
        bits = np.unpackbits(unpacked, axis=1, count=result.dim, bitorder="big")
        np.testing.assert_array_equal(bits, reference)
        np.testing.assert_array_equal(bits, (vectors > 0).astype(np.uint8))
    else:
        np.testing.assert_array_equal(unpacked.astype(np.float64), reference)
    scales = decode_scales(result)
    expected = unpack_scales(result)
    assert (scales is None) == (expected is None)
    if scales is not None:
        np.testing.assert_array_equal(scales, np.array(expected, np.float32))


@settings(max_examples=100, deadline=None)
@given(rows(), st.sampled_from([Encoding.FLOAT32, Encoding.FLOAT16, Encoding.INT8]))
def test_float_values_are_exact_widened_or_dequantized(
    vectors: npt.NDArray[np.float32], encoding: Encoding
) -> None:
    result = packed(vectors, encoding)
    values = to_float32(encoding, decode_vectors(result), decode_scales(result), refusal="x")
    # A reader that skips the writable copy (the sink) gets the same values, as a new array.
    view = decode_vectors(result, writable=False)
    from_view = to_float32(encoding, view, decode_scales(result), refusal="x")
    np.testing.assert_array_equal(from_view, values)
    assert from_view.flags.writeable
    assert not np.shares_memory(from_view, view)
    assert decode_vectors(result).flags.writeable
    assert values.dtype == np.float32
    assert values.shape == vectors.shape
    match encoding:
        case Encoding.FLOAT32:
            np.testing.assert_array_equal(values, vectors)
        case Encoding.FLOAT16:
            np.testing.assert_array_equal(values, vectors.astype(np.float16).astype(np.float32))
        case Encoding.INT8:
            step = np.max(np.abs(vectors), axis=1, keepdims=True) / 127
            assert np.all(np.abs(values - vectors) <= step / 2 + 1e-6)


def test_an_encoding_without_values_refuses_with_the_callers_message() -> None:
    result = packed(np.ones((1, 9), np.float32), Encoding.BINARY)
    assert LAYOUTS[Encoding.BINARY].floats is None
    with pytest.raises(ValueError, match=r"^binary holds signs$"):
        to_float32(Encoding.BINARY, decode_vectors(result), None, refusal="binary holds signs")
