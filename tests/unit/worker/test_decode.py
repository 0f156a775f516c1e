"""Unit tests for worker.decode: a record becomes Accepted, Rejected (answered) or DeadLetter."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import msgpack

from kembed_shared.ports import Record
from schemas import EmbedRequest, ErrorCode, encode_request
from schemas.headers import routing_headers
from tests.support.msgpack_raw import packed, raw_array, raw_map, raw_str
from worker.decode import Accepted, DeadLetter, Limits, ModelLimits, Rejected, decode_record

NOW_MS = 1_700_000_000_000
_MINILM = ModelLimits("minilm", 384, ("query", "passage"))
LIMITS = Limits(
    max_request_bytes=4096,
    max_client_batch_size=4,
    models={"minilm": _MINILM, "all-MiniLM-L6-v2": _MINILM},
)


def pack(body: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


def body(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"v": 1, "id": "req-1", "inputs": ["hello", "world"]}
    base["reply_to"] = "client.replies"
    base["reply_partition"] = 2
    base.update(fields)
    return {k: v for k, v in base.items() if v is not _DROP}


_DROP: Any = object()


def record(value: bytes | None, headers: list[tuple[str, bytes]] | None = None) -> Record:
    return Record(
        topic="embed.requests",
        partition=3,
        offset=42,
        value=value,
        headers=tuple(headers or ()),
    )


def decode(value: bytes | None, headers: list[tuple[str, bytes]] | None = None) -> object:
    return decode_record(record(value, headers), LIMITS, NOW_MS)


def rejected(result: object) -> Rejected:
    assert isinstance(result, Rejected), result
    return result


def dead_letter(result: object) -> DeadLetter:
    assert isinstance(result, DeadLetter), result
    return result


def test_valid_request_is_accepted() -> None:
    """A well-formed request within every limit is accepted with all its fields."""
    request = EmbedRequest(
        id="req-1",
        inputs=("a", "b"),
        model="minilm",
        normalize=False,
        dimensions=128,
        deadline_ms=NOW_MS + 5000,
        reply_to="client.replies",
        reply_partition=2,
        keys=("k1", 2),
        meta={"trace": "x"},
    )
    result = decode(encode_request(request))
    assert isinstance(result, Accepted)
    assert result.request == request


def test_model_alias_and_full_dimensions_are_accepted() -> None:
    """Any served model name is accepted, and dimensions equal to the model's dim is allowed."""
    result = decode(pack(body(model="all-MiniLM-L6-v2", dimensions=384)))
    assert isinstance(result, Accepted)
    assert isinstance(result.request, EmbedRequest)
    assert result.request.dimensions == 384


def test_not_msgpack_without_headers_is_dead_lettered() -> None:
    """Garbage with no correlation header cannot be answered and goes to the dead letters."""
    result = dead_letter(decode(b"\xc1\xc1 definitely not msgpack"))
    assert result.code == ErrorCode.INVALID_REQUEST
    assert result.message


def test_not_msgpack_with_routing_headers_is_answered() -> None:
    """Garbage whose headers name a request id is answered to the header's reply topic."""
    headers = routing_headers("hdr-7", "client.replies", 5)
    result = rejected(decode(b"\xc1 not msgpack", headers))
    assert result.request_id == "hdr-7"
    assert result.reply_to == "client.replies"
    assert result.reply_partition == 5
    assert result.error.code == ErrorCode.INVALID_REQUEST


def test_body_envelope_wins_over_headers() -> None:
    """When the body's id is readable, the answer goes where the body says, not the headers."""
    headers = routing_headers("hdr-7", "header.topic")
    result = rejected(decode(pack(body(inputs=[])), headers))
    assert result.request_id == "req-1"
    assert result.reply_to == "client.replies"


def test_missing_id_is_dead_lettered() -> None:
    """A request without an id (and no headers) cannot be answered: dead letter."""
    result = dead_letter(decode(pack(body(id=_DROP))))
    assert result.code == ErrorCode.INVALID_REQUEST
    assert "id" in result.message


def test_not_a_map_is_dead_lettered() -> None:
    """A msgpack value that is not a map, with no headers, is dead-lettered."""
    value: bytes = msgpack.packb(["v", 1, "id", "req-1"])
    result = dead_letter(decode(value))
    assert result.code == ErrorCode.INVALID_REQUEST


def test_empty_inputs_are_rejected_with_body_envelope() -> None:
    """An empty inputs array is answered as invalid_request to the body's reply_to."""
    result = rejected(decode(pack(body(inputs=[]))))
    assert result.request_id == "req-1"
    assert result.reply_to == "client.replies"
    assert result.reply_partition == 2
    assert result.error.code == ErrorCode.INVALID_REQUEST


def test_non_string_input_is_rejected_with_its_index() -> None:
    """A non-string input is invalid_request naming that input's index."""
    result = rejected(decode(pack(body(inputs=["ok", "fine", 17]))))
    assert result.request_id == "req-1"
    assert result.reply_to == "client.replies"
    assert result.error.code == ErrorCode.INVALID_REQUEST
    assert result.error.index == 2


def test_newer_version_is_unsupported_version() -> None:
    """A request with v=2 is answered with unsupported_version to the body's reply_to."""
    result = rejected(decode(pack(body(v=2))))
    assert result.request_id == "req-1"
    assert result.reply_to == "client.replies"
    assert result.error.code == ErrorCode.UNSUPPORTED_VERSION


def test_too_many_inputs() -> None:
    """More inputs than max_client_batch_size is too_many_inputs, keeping keys and meta."""
    inputs = [f"t{i}" for i in range(5)]
    keys = list(range(5))
    result = rejected(decode(pack(body(inputs=inputs, keys=keys, meta={"m": 1}))))
    assert result.error.code == ErrorCode.TOO_MANY_INPUTS
    assert result.request_id == "req-1"
    assert result.reply_to == "client.replies"
    assert result.keys == tuple(keys)
    assert result.meta == {"m": 1}


def test_exactly_max_client_batch_size_is_accepted() -> None:
    """A request with exactly max_client_batch_size inputs is accepted."""
    result = decode(pack(body(inputs=["a", "b", "c", "d"])))
    assert isinstance(result, Accepted)


def test_oversize_message_is_answered_via_headers() -> None:
    """A message over max_request_bytes is message_too_large, answered via its headers."""
    value = pack(body(inputs=["x" * 5000]))
    assert len(value) > LIMITS.max_request_bytes
    result = rejected(decode(value, routing_headers("hdr-9", "big.replies")))
    assert result.error.code == ErrorCode.MESSAGE_TOO_LARGE
    assert result.request_id == "hdr-9"
    assert result.reply_to == "big.replies"


def test_oversize_message_without_headers_is_dead_lettered() -> None:
    """A message over max_request_bytes without routing headers is dead-lettered."""
    result = dead_letter(decode(pack(body(inputs=["x" * 5000]))))
    assert result.code == ErrorCode.MESSAGE_TOO_LARGE


def test_message_of_exactly_max_request_bytes_is_decoded() -> None:
    """A message exactly max_request_bytes long is not too large."""
    # The pad's msgpack header grows with it, so search for the exact length.
    value = next(
        v
        for n in range(LIMITS.max_request_bytes)
        if len(v := pack(body(meta={"pad": "p" * n}))) == LIMITS.max_request_bytes
    )
    assert isinstance(decode(value), Accepted)
    one_more = dead_letter(decode(value + b"\x00"))
    assert one_more.code == ErrorCode.MESSAGE_TOO_LARGE


def test_past_deadline_is_deadline_exceeded() -> None:
    """A request whose deadline_ms is at or before now is answered with deadline_exceeded."""
    for deadline in (NOW_MS, NOW_MS - 1, 0):
        result = rejected(decode(pack(body(deadline_ms=deadline))))
        assert result.error.code == ErrorCode.DEADLINE_EXCEEDED
        assert result.request_id == "req-1"
    assert isinstance(decode(pack(body(deadline_ms=NOW_MS + 1))), Accepted)


def test_unknown_model() -> None:
    """A request naming a model not served here is unknown_model."""
    result = rejected(decode(pack(body(model="gpt-embed-9000"))))
    assert result.error.code == ErrorCode.UNKNOWN_MODEL
    assert result.reply_to == "client.replies"


def test_dimensions_above_model_dim_is_invalid() -> None:
    """Asking for more dimensions than the model has is invalid_request."""
    result = rejected(decode(pack(body(dimensions=385))))
    assert result.error.code == ErrorCode.INVALID_REQUEST
    assert "dimensions" in result.error.message


_CLS = ModelLimits("minilm-cls", 384)
_TWO_MODELS = Limits(
    max_request_bytes=4096,
    max_client_batch_size=4,
    models={"minilm": _MINILM, "all-MiniLM-L6-v2": _MINILM, "minilm-cls": _CLS, "cls": _CLS},
    topic_models={"embed.requests.cls": "minilm-cls"},
)


def _two_models(value: bytes, topic: str = "embed.requests") -> object:
    return decode_record(replace(record(value), topic=topic), _TWO_MODELS, NOW_MS)


def test_request_is_routed_to_the_model_it_names_by_name_or_alias() -> None:
    """Each accepted request carries the served name of its model; aliases resolve to it."""
    for name, served in [("minilm-cls", "minilm-cls"), ("cls", "minilm-cls"), ("minilm", "minilm")]:
        result = _two_models(pack(body(model=name)))
        assert isinstance(result, Accepted)
        assert result.model == served


def test_request_naming_no_model_gets_its_topics_default() -> None:
    """No model named: the topic's default model, else the first model configured."""
    on_cls = _two_models(pack(body()), topic="embed.requests.cls")
    on_default = _two_models(pack(body()))
    assert isinstance(on_cls, Accepted)
    assert isinstance(on_default, Accepted)
    assert (on_cls.model, on_default.model) == ("minilm-cls", "minilm")


def test_unknown_model_lists_the_served_names() -> None:
    result = rejected(_two_models(pack(body(model="e5"))))
    assert result.error.code == ErrorCode.UNKNOWN_MODEL
    assert "minilm-cls" in result.error.message
    assert "all-MiniLM-L6-v2" in result.error.message


def test_prompt_name_must_be_one_of_the_models_prompts() -> None:
    """A known prompt name is accepted; another, or one the model lacks, is invalid_request."""
    assert isinstance(decode(pack(body(prompt_name="query"))), Accepted)
    for name, limits_model in [("summary", "minilm"), ("query", "minilm-cls")]:
        result = rejected(_two_models(pack(body(model=limits_model, prompt_name=name))))
        assert result.error.code == ErrorCode.INVALID_REQUEST
        assert "prompt_name" in result.error.message


def test_prompt_and_prompt_name_together_are_invalid() -> None:
    result = rejected(decode(pack(body(prompt="query: ", prompt_name="query"))))
    assert result.error.code == ErrorCode.INVALID_REQUEST
    assert "exclusive" in result.error.message


def test_truncation_direction_must_be_right_or_left() -> None:
    accepted = decode(pack(body(truncation_direction="left")))
    assert isinstance(accepted, Accepted)
    assert isinstance(accepted.request, EmbedRequest)
    assert accepted.request.truncation_direction == "left"
    result = rejected(decode(pack(body(truncation_direction="middle"))))
    assert result.error.code == ErrorCode.INVALID_REQUEST
    assert "truncation_direction" in result.error.message


def test_invalid_utf8_input_is_rejected_with_index_and_id() -> None:
    """Invalid UTF-8 inside one input is invalid_request naming its index, id preserved."""
    value = raw_map(
        ("v", packed(1)),
        ("id", packed("utf-req")),
        ("reply_to", packed("client.replies")),
        ("inputs", raw_array(packed("fine"), packed("also fine"), raw_str(b"ab\xff\xfe"))),
    )
    result = rejected(decode(value))
    assert result.request_id == "utf-req"
    assert result.reply_to == "client.replies"
    assert result.error.code == ErrorCode.INVALID_REQUEST
    assert result.error.index == 2
    assert "UTF-8" in result.error.message


def test_invalid_utf8_id_falls_back_to_headers() -> None:
    """Invalid UTF-8 in the id itself loses the body id; headers still allow an answer."""
    value = raw_map(("v", packed(1)), ("id", raw_str(b"\xff\xfe")), ("inputs", packed(["x"])))
    assert isinstance(decode(value), DeadLetter)
    result = rejected(decode(value, routing_headers("hdr-id")))
    assert result.request_id == "hdr-id"
    assert result.error.code == ErrorCode.INVALID_REQUEST


def test_tombstone_is_dead_lettered() -> None:
    """A record with no value (a tombstone) is dead-lettered as invalid_request."""
    result = dead_letter(decode(None))
    assert result.code == ErrorCode.INVALID_REQUEST


def test_tombstone_with_headers_is_answered() -> None:
    """A tombstone that carries a correlation id is answered instead of dead-lettered."""
    result = rejected(decode(None, routing_headers("hdr-t")))
    assert result.request_id == "hdr-t"
    assert result.error.code == ErrorCode.INVALID_REQUEST


def test_chunking_window_over_the_models_maximum_is_invalid_request() -> None:
    """`chunking.max_tokens` may be the model's max_seq_length, not more (when known)."""
    limits = replace(LIMITS, models={"minilm": replace(_MINILM, max_seq_length=256)})
    at_limit = pack(body(chunking={"max_tokens": 256}))
    over = pack(body(chunking={"max_tokens": 257}, keys=["a", "b"]))
    accepted = decode_record(record(at_limit), limits, NOW_MS)
    assert isinstance(accepted, Accepted)
    refused = rejected(decode_record(record(over), limits, NOW_MS))
    assert refused.error.code == ErrorCode.INVALID_REQUEST
    assert "'chunking.max_tokens' 257 exceeds the model's max_seq_length 256" in (
        refused.error.message
    )
    assert refused.keys == ("a", "b")
    assert isinstance(decode(over), Accepted)  # no maximum known: not checked here
