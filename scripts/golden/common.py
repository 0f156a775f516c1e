"""What every golden-vector module uses: canonical msgpack, JSON views, float32 rounding
and the packed forms of int8 and binary rows."""

from __future__ import annotations

import struct
from typing import Any

import msgpack


def pack(value: Any) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def as_json(value: Any) -> Any:
    """A decoded msgpack value as JSON: binary as {"$bin": hex}, everything else as is."""
    if isinstance(value, bytes):
        return {"$bin": value.hex()}
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    return value


def f32(value: float) -> float:
    """``value`` rounded to float32."""
    rounded: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return rounded


def int8_row(row: list[float], *, normalized: bool) -> tuple[list[int], float]:
    """The int8 codes and scale of one row, straight from the spec's formula: codes
    rint(x / scale) in double precision with the float32 scale (Python's round() rounds
    half to even, like the spec)."""
    own = f32(max(abs(x) for x in row) / 127) or f32(1 / 127)  # 0 underflows to 1/127
    scale = f32(1 / 127) if normalized else own
    codes = [round(x / scale) for x in row]
    return [max(-127, min(127, q)) for q in codes], scale


def sign_bits(row: list[float]) -> bytes:
    """One row packed: bit 1 where the value is > 0, most significant bit first."""
    bits = [1 if x > 0 else 0 for x in row] + [0] * (-len(row) % 8)
    return bytes(int("".join(map(str, bits[i : i + 8])), 2) for i in range(0, len(bits), 8))


def int8_result(name: str, rows: list[list[float]], normalized: bool) -> dict[str, Any]:
    """A result of two 3-dimensional int8 rows coded from ``rows``."""
    coded = [int8_row([f32(x) for x in row], normalized=normalized) for row in rows]
    return {
        "v": 1,
        "id": name,
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "dim": 3,
        "dtype": "int8",
        "vectors": struct.pack("<6b", *(q for codes, _ in coded for q in codes)),
        "scales": struct.pack("<2f", *(scale for _, scale in coded)),
        "tokens": [4, 7],
    }


def pack_float32_meta(body: dict[str, Any]) -> bytes:
    """``body`` packed like pack(), but the floats in its ``meta`` as msgpack float32."""
    packer = msgpack.Packer(use_bin_type=True)
    singles = msgpack.Packer(use_bin_type=True, use_single_float=True)
    parts = [packer.pack_map_header(len(body))]
    for key, value in body.items():
        parts += [packer.pack(key), (singles if key == "meta" else packer).pack(value)]
    return b"".join(parts)
