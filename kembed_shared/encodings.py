"""The numpy side of each output encoding, in one table: the worker packs rows with it,
the SDK unpacks them and the sink reads them back as floats.

The byte layouts are specified in ``schemas/README.md`` (section *Encodings*);
``schemas.encodings`` holds the names, the row sizes and a decoder without numpy. Adding
an encoding is its ``Encoding`` member and row size there and its line in :data:`LAYOUTS`
here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas import EmbedResult, Encoding
from schemas.encodings import INT8_NORMALIZED_SCALE, row_bytes

__all__ = [
    "LAYOUTS",
    "Layout",
    "decode_scales",
    "decode_vectors",
    "dequantize_int8",
    "encode_rows",
    "quantize_int8",
    "to_float32",
]

INT8_MAX = 127

Floats = npt.NDArray[np.float32]
Packer = Callable[[Floats, bool], tuple[bytes, bytes | None]]
"""Finished float32 rows and whether they are L2-normalized -> (``vectors``, ``scales``)."""


def quantize_int8(vectors: Floats, *, normalized: bool) -> tuple[npt.NDArray[np.int8], Floats]:
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


def dequantize_int8(codes: npt.NDArray[np.int8], scales: Floats) -> Floats:
    """int8 codes (n, dim) back to float32 values: ``codes * scales[:, None]``."""
    return (codes.astype(np.float32) * scales.astype(np.float32)[:, None]).astype(
        np.float32, copy=False
    )


def _pack_float32(vectors: Floats, normalized: bool) -> tuple[bytes, bytes | None]:
    return np.ascontiguousarray(vectors, dtype="<f4").tobytes(), None


def _pack_float16(vectors: Floats, normalized: bool) -> tuple[bytes, bytes | None]:
    with np.errstate(over="ignore"):  # beyond +-65504 is +-inf, as IEEE says
        return np.ascontiguousarray(vectors, dtype="<f2").tobytes(), None


def _pack_int8(vectors: Floats, normalized: bool) -> tuple[bytes, bytes | None]:
    codes, scales = quantize_int8(vectors, normalized=normalized)
    return codes.tobytes(), scales.astype("<f4").tobytes()


def _pack_binary(vectors: Floats, normalized: bool) -> tuple[bytes, bytes | None]:
    return np.packbits(vectors > 0, axis=1, bitorder="big").tobytes(), None


def _widen(codes: npt.NDArray[Any], scales: Floats | None) -> Floats:
    return codes.astype(np.float32)


def _dequantize(codes: npt.NDArray[Any], scales: Floats | None) -> Floats:
    assert scales is not None  # the codec requires scales with int8
    return dequantize_int8(codes, scales)


@dataclass(frozen=True, slots=True)
class Layout:
    """How one encoding's rows are held in numpy."""

    wire: str
    """The numpy dtype of one stored value in the blob (little-endian where it matters)."""
    native: type[np.generic]
    """The dtype an unpacked row has, in the host's byte order."""
    pack: Packer
    floats: Callable[[npt.NDArray[Any], Floats | None], Floats] | None
    """Unpacked rows (and int8 scales) as float32 values; None where the encoding keeps no
    values (binary: signs only)."""


LAYOUTS: dict[Encoding, Layout] = {
    Encoding.FLOAT32: Layout("<f4", np.float32, _pack_float32, _widen),
    Encoding.FLOAT16: Layout("<f2", np.float16, _pack_float16, _widen),
    Encoding.INT8: Layout("i1", np.int8, _pack_int8, _dequantize),
    Encoding.BINARY: Layout("u1", np.uint8, _pack_binary, None),
}


def encode_rows(
    vectors: Floats, encoding: Encoding, *, normalized: bool
) -> tuple[bytes, bytes | None]:
    """The ``vectors`` blob of ``vectors`` (finished rows) in ``encoding``, and the int8
    ``scales`` blob (None for the other encodings)."""
    return LAYOUTS[encoding].pack(vectors, normalized)


def decode_vectors(result: EmbedResult, *, writable: bool = True) -> npt.NDArray[Any]:
    """The vectors of ``result`` in the host's native byte order: (n, dim), or
    (n, ceil(dim / 8)) packed bits for binary. A writable copy; with ``writable=False``
    a read-only view of the blob where its byte order is the host's (no copy), for a
    reader that copies the values anyway."""
    encoding = Encoding(result.dtype)
    layout = LAYOUTS[encoding]
    width = row_bytes(encoding, result.dim) // np.dtype(layout.wire).itemsize
    rows = np.frombuffer(result.vectors, dtype=layout.wire).reshape(result.count, width)
    return rows.astype(layout.native, copy=writable)


def decode_scales(result: EmbedResult) -> Floats | None:
    """The per-vector int8 scales of ``result`` (None for the other encodings)."""
    if result.scales is None:
        return None
    return np.frombuffer(result.scales, dtype="<f4").astype(np.float32)


def to_float32(
    encoding: Encoding, vectors: npt.NDArray[Any], scales: Floats | None, *, refusal: str
) -> Floats:
    """Unpacked rows as float32 (n, dim): exact for float32, widened for float16,
    ``codes * scales`` for int8. An encoding without values (binary) raises ValueError
    with ``refusal``."""
    floats = LAYOUTS[encoding].floats
    if floats is None:
        raise ValueError(refusal)
    return floats(vectors, scales)
