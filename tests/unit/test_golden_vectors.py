"""The codec against the golden vectors of schemas/vectors/v1 (the cross-language contract)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from schemas import (
    Encoding,
    SchemaError,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)

VECTORS = Path(__file__).resolve().parents[2] / "schemas" / "vectors" / "v1"
VALID = json.loads((VECTORS / "valid.json").read_text(encoding="utf-8"))
INVALID = json.loads((VECTORS / "invalid.json").read_text(encoding="utf-8"))


def _from_json(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"$bin"}:
        return bytes.fromhex(value["$bin"])
    if isinstance(value, dict):
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


@pytest.mark.parametrize("case", VALID, ids=[c["name"] for c in VALID])
def test_valid_vector_decodes_and_reencodes_byte_for_byte(case: dict[str, Any]) -> None:
    """A valid golden message decodes to its documented value and re-encodes to the same bytes."""
    data = bytes.fromhex(case["hex"])
    assert msgpack.unpackb(data, raw=False) == _from_json(case["value"])
    if case["kind"] == "request":
        assert encode_request(decode_request(data)) == data
    else:
        assert encode_result(decode_result(data)) == data


@pytest.mark.parametrize("case", INVALID, ids=[c["name"] for c in INVALID])
def test_invalid_vector_raises_the_documented_code(case: dict[str, Any]) -> None:
    """An invalid golden message raises SchemaError with its code, input index and envelope."""
    with pytest.raises(SchemaError) as caught:
        decode_request(bytes.fromhex(case["hex"]))
    assert caught.value.code == case["code"]
    assert caught.value.index == case["index"]
    assert caught.value.envelope.id == case["envelope_id"]


REQUEST_FIELDS = [
    "v", "id", "inputs", "model", "normalize", "truncate", "dimensions", "encoding", "prompt",
    "deadline_ms", "reply_to", "reply_partition", "keys", "meta",
]  # fmt: skip


def test_golden_vectors_cover_every_request_field() -> None:
    """An all-fields request exercises every field the spec defines, in canonical order."""
    full = next(c for c in VALID if c["name"] == "request-all-fields-encoding")
    assert list(full["value"]) == REQUEST_FIELDS


def test_golden_vectors_cover_every_encoding() -> None:
    """Every encoding is asked for by a request vector and carried by a result vector."""
    every = {str(encoding) for encoding in Encoding}
    asked = {c["value"].get("encoding", "float32") for c in VALID if c["kind"] == "request"}
    carried = {c["value"]["dtype"] for c in VALID if "dtype" in c["value"]}
    assert asked == every
    assert carried == every
