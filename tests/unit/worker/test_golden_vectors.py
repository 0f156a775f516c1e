"""The codec against the golden vectors of schemas/vectors/v1 (the cross-language contract)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from kembed_shared.ports import Record
from schemas import (
    DEFAULT_RESULTS_TOPIC,
    EmbedResult,
    Encoding,
    ErrorCode,
    SchemaError,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from worker.decode import Accepted, DeadLetter, Limits, ModelLimits, Rejected, decode_record
from worker.settings import DEFAULT_REPLY_TOPICS, WorkerSettings

VECTORS = Path(__file__).resolve().parents[3] / "schemas" / "vectors" / "v1"
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


def test_golden_vectors_cover_chunking() -> None:
    """Chunked requests (with and without overlap, both poolings) and their results (a row
    per chunk, a row per input) are golden vectors; their spans reproduce chunk texts."""
    cases = {c["name"]: c["value"] for c in VALID}
    request, mean_request = cases["request-chunking"], cases["request-chunking-mean"]
    assert request["chunking"] == {"max_tokens": 16, "overlap_tokens": 4}
    assert mean_request["chunk_pooling"] == "mean"
    for name, rows in (("result-chunks", 3), ("result-chunks-mean", 2)):
        decoded = decode_result(bytes.fromhex(next(c for c in VALID if c["name"] == name)["hex"]))
        assert isinstance(decoded, EmbedResult), name
        assert decoded.count == rows, name
        assert decoded.chunks == (2, 1)
    text = request["inputs"][0]
    assert text[0:44].endswith("longer.")
    assert text[16:55].startswith("Second")


def test_golden_vectors_cover_every_encoding() -> None:
    """Every encoding is asked for by a request vector and carried by a result vector."""
    every = {str(encoding) for encoding in Encoding}
    asked = {c["value"].get("encoding", "float32") for c in VALID if c["kind"] == "request"}
    carried = {c["value"]["dtype"] for c in VALID if "dtype" in c["value"]}
    assert asked == every
    assert carried == every


ROUTING = json.loads((VECTORS / "routing.json").read_text(encoding="utf-8"))


def _default_worker_limits() -> Limits:
    """Decoding limits of a worker with the default topic settings (whatever the
    environment says), serving one model."""
    settings = WorkerSettings.model_validate(
        {"results_topic": DEFAULT_RESULTS_TOPIC, "reply_topics": DEFAULT_REPLY_TOPICS}
    )
    model = ModelLimits("sentence-transformers/all-MiniLM-L6-v2", 384)
    return Limits(
        max_request_bytes=4 * 1024 * 1024,
        max_client_batch_size=512,
        models={model.name: model},
        reply_allowed=settings.reply_topic_allowed,
    )


@pytest.mark.parametrize("case", ROUTING, ids=[c["name"] for c in ROUTING])
def test_routing_vector_is_answered_where_it_says(case: dict[str, Any]) -> None:
    """A worker with the default settings answers a routing golden message on the topic
    and partition it documents (headers filling what the body lacks), or dead-letters it
    with its code."""
    headers = tuple((name, bytes.fromhex(value)) for name, value in case["headers"])
    record = Record("embed.requests", 0, 7, bytes.fromhex(case["hex"]), headers=headers)
    decoded = decode_record(record, _default_worker_limits(), now_ms=0)
    if case["outcome"] == "dead_letter":
        assert isinstance(decoded, DeadLetter), decoded
        assert decoded.code == case["code"]
        return
    if case["code"] is None:
        assert isinstance(decoded, Accepted), decoded
        routed = (decoded.request.id, decoded.request.reply_to, decoded.request.reply_partition)
    else:
        assert isinstance(decoded, Rejected), decoded
        assert decoded.error.code == case["code"]
        routed = (decoded.request_id, decoded.reply_to, decoded.reply_partition)
    assert routed == (case["id"], case["reply_to"], case["reply_partition"])


def test_golden_vectors_cover_every_error_code() -> None:
    """Every error code of the table appears in a golden vector: an error result, an
    invalid request or a routing case."""
    codes = {c["value"]["error"]["code"] for c in VALID if "error" in c["value"]}
    codes |= {c["code"] for c in INVALID}
    codes |= {c["code"] for c in ROUTING if c["code"] is not None}
    untested = {"too_many_inputs", "message_too_large", "result_too_large"}  # worker limits
    untested |= {"deadline_exceeded", "internal"}  # time and failure, not bytes
    assert {str(code) for code in ErrorCode} - untested <= codes
