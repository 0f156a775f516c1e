"""msgpack written by hand, for messages a msgpack library will not write: strings that
are not UTF-8 inside otherwise well-formed maps and arrays."""

from __future__ import annotations

import msgpack

__all__ = ["packed", "raw_array", "raw_map", "raw_str"]


def packed(value: object) -> bytes:
    """``value`` as msgpack writes it."""
    data: bytes = msgpack.packb(value)
    return data


def raw_str(data: bytes) -> bytes:
    """A msgpack fixstr header followed by ``data`` as-is (which may be invalid UTF-8)."""
    assert len(data) < 32
    return bytes([0xA0 | len(data)]) + data


def raw_array(*items: bytes) -> bytes:
    """A msgpack fixarray of already encoded ``items``."""
    assert len(items) < 16
    return bytes([0x90 | len(items)]) + b"".join(items)


def raw_map(*fields: tuple[str, bytes]) -> bytes:
    """A msgpack fixmap of string keys and already encoded values, in the order given."""
    assert len(fields) < 16
    return bytes([0x80 | len(fields)]) + b"".join(packed(k) + v for k, v in fields)
