"""Vector encodings of wire format v1: what the ``vectors`` blob of a result holds.

The byte layouts are specified in ``schemas/README.md`` (section *Encodings*). This module
holds the names and sizes the codec validates against, and a reference decoder in plain
Python for clients without numpy (the producer SDK decodes with numpy instead).
"""

from __future__ import annotations

import struct
import sys
from array import array
from enum import StrEnum
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from schemas.v1 import EmbedResult

__all__ = [
    "INT8_NORMALIZED_SCALE",
    "Encoding",
    "row_bytes",
    "unpack_rows",
    "unpack_scales",
]

_V = TypeVar("_V", int, float)


class Encoding(StrEnum):
    """How each vector value is written; a request's ``encoding``, a result's ``dtype``."""

    FLOAT32 = "float32"
    """Little-endian IEEE-754 binary32, 4 bytes per value (the default)."""
    FLOAT16 = "float16"
    """Little-endian IEEE-754 binary16, 2 bytes per value."""
    INT8 = "int8"
    """Signed bytes ``q`` with one float32 scale per vector: value ~= ``q * scale``."""
    BINARY = "binary"
    """One sign bit per value (1 when the value is > 0), 8 per byte, most significant first."""


INT8_NORMALIZED_SCALE: float = struct.unpack("<f", struct.pack("<f", 1 / 127))[0]
"""The int8 scale of every normalized vector: 1/127 rounded to float32."""


def row_bytes(encoding: Encoding | str, dim: int) -> int:
    """Bytes one vector of ``dim`` values takes in ``encoding``."""
    match Encoding(encoding):
        case Encoding.FLOAT32:
            return 4 * dim
        case Encoding.FLOAT16:
            return 2 * dim
        case Encoding.INT8:
            return dim
        case Encoding.BINARY:
            return (dim + 7) // 8


def unpack_rows(result: EmbedResult) -> list[list[float]] | list[list[int]]:
    """The vectors of ``result`` as the wire carries them, one list per input.

    float32 and float16 give floats; int8 gives the integer codes (multiply by
    :func:`unpack_scales` for values); binary gives ``dim`` bits (0 or 1) per vector, the
    padding bits of each vector's last byte dropped.
    """
    blob, dim, count = result.vectors, result.dim, result.count
    match Encoding(result.dtype):
        case Encoding.FLOAT32:
            return _rows(list(_float32s(blob)), dim, count)
        case Encoding.FLOAT16:
            return _rows(list(struct.unpack(f"<{len(blob) // 2}e", blob)), dim, count)
        case Encoding.INT8:
            return _rows(list(array("b", blob)), dim, count)
        case Encoding.BINARY:
            width = row_bytes(Encoding.BINARY, dim)
            return [
                [(blob[row * width + i // 8] >> (7 - i % 8)) & 1 for i in range(dim)]
                for row in range(count)
            ]


def unpack_scales(result: EmbedResult) -> list[float] | None:
    """The per-vector scales of an int8 result (None for other encodings)."""
    if result.scales is None:
        return None
    return list(_float32s(result.scales))


def _float32s(blob: bytes) -> array[float]:
    values = array("f")
    values.frombytes(blob)
    if sys.byteorder != "little":
        values.byteswap()
    return values


def _rows(flat: list[_V], dim: int, count: int) -> list[list[_V]]:
    return [flat[row * dim : (row + 1) * dim] for row in range(count)]
