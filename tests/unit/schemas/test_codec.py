"""Unit tests for schemas.codec, the float32 helpers of schemas.v1 and schemas.encodings."""

from __future__ import annotations

import struct
from array import array
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from schemas import (
    EmbedRequest,
    EmbedResult,
    Encoding,
    Envelope,
    ErrorCode,
    ErrorInfo,
    ErrorResult,
    Request,
    SchemaError,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from schemas.codec import is_valid_topic
from schemas.encodings import INT8_NORMALIZED_SCALE, row_bytes, unpack_rows, unpack_scales
from schemas.v1 import MAX_ID_BYTES, pack_float32, unpack_float32
from tests.conftest import embed_request
from tests.support.msgpack_raw import packed, raw_array, raw_map, raw_str

# ---------------------------------------------------------------------------- strategies

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
)
# Values that survive a msgpack round trip unchanged (str keys, lists, no NaN).
msgpack_values = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=8), children, max_size=4),
    ),
    max_leaves=12,
)
metas = st.dictionaries(st.text(max_size=10), msgpack_values, max_size=4)
ids = st.text(min_size=1, max_size=40)
texts = st.text(min_size=1, max_size=30)
topics = st.from_regex(r"[A-Za-z0-9._-]{1,60}", fullmatch=True).filter(
    lambda t: t not in (".", "..")
)
keys_of = st.one_of(st.text(max_size=10), st.integers(min_value=-(2**63), max_value=2**63 - 1))
optional_ints = st.none() | st.integers(min_value=0, max_value=2**63 - 1)


REQUEST_KEYS = [
    "v",
    "id",
    "inputs",
    "model",
    "normalize",
    "truncate",
    "dimensions",
    "encoding",
    "prompt",
    "deadline_ms",
    "reply_to",
    "reply_partition",
    "keys",
    "meta",
]
"""Every field of a request, in the codec's canonical order."""


@st.composite
def requests(draw: st.DrawFn) -> EmbedRequest:
    inputs = tuple(draw(st.lists(texts, min_size=1, max_size=5)))
    keys = draw(st.none() | st.lists(keys_of, min_size=len(inputs), max_size=len(inputs)))
    return EmbedRequest(
        id=draw(ids),
        inputs=inputs,
        model=draw(st.none() | st.text(min_size=1, max_size=20)),
        normalize=draw(st.booleans()),
        truncate=draw(st.booleans()),
        dimensions=draw(st.none() | st.integers(min_value=1, max_value=4096)),
        encoding=draw(st.sampled_from(Encoding)),
        prompt=draw(st.none() | st.text(max_size=20)),
        deadline_ms=draw(optional_ints),
        reply_to=draw(st.none() | topics),
        reply_partition=draw(st.none() | st.integers(min_value=0, max_value=2**31 - 1)),
        keys=None if keys is None else tuple(keys),
        meta=draw(st.none() | metas),
    )


@st.composite
def embed_results(draw: st.DrawFn) -> EmbedResult:
    dim = draw(st.integers(min_value=1, max_value=20))
    tokens = tuple(draw(st.lists(st.integers(min_value=0, max_value=10_000), max_size=4)))
    encoding = draw(st.sampled_from(Encoding))
    size = len(tokens) * row_bytes(encoding, dim)
    scales = None
    if encoding == Encoding.INT8:
        scales = draw(st.binary(min_size=4 * len(tokens), max_size=4 * len(tokens)))
    keys = draw(st.none() | st.lists(keys_of, max_size=4))
    return EmbedResult(
        id=draw(ids),
        model=draw(st.text(max_size=20)),
        dim=dim,
        vectors=draw(st.binary(min_size=size, max_size=size)),
        tokens=tokens,
        dtype=encoding,
        keys=None if keys is None else tuple(keys),
        meta=draw(st.none() | metas),
        scales=scales,
        requested_ms=draw(st.none() | st.integers(min_value=0, max_value=2**62)),
    )


@st.composite
def error_results(draw: st.DrawFn) -> ErrorResult:
    keys = draw(st.none() | st.lists(keys_of, max_size=4))
    return ErrorResult(
        id=draw(ids),
        error=ErrorInfo(
            code=draw(st.sampled_from(list(ErrorCode))),
            message=draw(st.text(max_size=40)),
            index=draw(st.none() | st.integers(min_value=0, max_value=1000)),
        ),
        keys=None if keys is None else tuple(keys),
        meta=draw(st.none() | metas),
    )


"""Every field of a request, in the canonical order of the codec."""


def pack(value: object) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


# ---------------------------------------------------------------------------- round trips


@settings(max_examples=200, deadline=None)
@given(requests())
def test_request_round_trip(request: EmbedRequest) -> None:
    """Any valid request decodes back to an equal request after encoding."""
    assert decode_request(encode_request(request)) == request


@settings(max_examples=200, deadline=None)
@given(embed_results())
def test_embed_result_round_trip(result: EmbedResult) -> None:
    """Any valid vector result decodes back to an equal result after encoding."""
    assert decode_result(encode_result(result)) == result


@settings(max_examples=200, deadline=None)
@given(error_results())
def test_error_result_round_trip(result: ErrorResult) -> None:
    """Any error result decodes back to an equal result, its code an ErrorCode again."""
    decoded = decode_result(encode_result(result))
    assert decoded == result
    assert isinstance(decoded, ErrorResult)
    assert isinstance(decoded.error.code, ErrorCode)


def test_unknown_error_code_is_kept_as_text() -> None:
    """A result with an error code newer than this client keeps the code as a plain string."""
    data = pack({"v": 1, "id": "r", "error": {"code": "brand_new_code", "message": "m"}})
    decoded = decode_result(data)
    assert isinstance(decoded, ErrorResult)
    assert decoded.error.code == "brand_new_code"
    assert not isinstance(decoded.error.code, ErrorCode)


# ---------------------------------------------------------------------------- canonical form


def test_minimal_request_encodes_only_required_fields() -> None:
    """A request with all defaults encodes as exactly v, id, inputs (normalize omitted)."""
    data = encode_request(EmbedRequest(id="r1", inputs=("a",)))
    body = unpack(data)
    assert list(body) == ["v", "id", "inputs"]
    assert body == {"v": 1, "id": "r1", "inputs": ["a"]}


def test_non_default_flags_are_encoded() -> None:
    """normalize=False and truncate=False are written; their True defaults never are."""
    body = unpack(encode_request(EmbedRequest(id="r1", inputs=("a",), normalize=False)))
    assert body["normalize"] is False
    assert "truncate" not in body
    body = unpack(encode_request(EmbedRequest(id="r1", inputs=("a",), truncate=False)))
    assert body["truncate"] is False
    assert "normalize" not in body


def test_full_request_key_order_is_canonical() -> None:
    """Every field present is written in the documented key order."""
    request = EmbedRequest(
        id="r",
        inputs=("a",),
        model="m",
        normalize=False,
        truncate=False,
        dimensions=8,
        encoding=Encoding.BINARY,
        prompt="query: ",
        deadline_ms=0,
        reply_to="t",
        reply_partition=0,
        keys=("k",),
        meta={"x": 1},
    )
    assert list(unpack(encode_request(request))) == REQUEST_KEYS


def test_encoding_is_deterministic() -> None:
    """Equal requests encode to identical bytes."""
    first = EmbedRequest(id="r", inputs=("a", "b"), meta={"z": 1, "a": 2}, keys=(1, 2))
    second = EmbedRequest(id="r", inputs=("a", "b"), meta={"z": 1, "a": 2}, keys=(1, 2))
    assert encode_request(first) == encode_request(second)


def test_result_omits_absent_keys_and_meta() -> None:
    """Results leave out keys and meta when they are None."""
    result = EmbedResult(id="r", model="m", dim=1, vectors=b"\x00" * 4, tokens=(3,))
    present = ["v", "id", "model", "dim", "dtype", "vectors", "tokens"]
    assert list(unpack(encode_result(result))) == present
    error = ErrorResult(id="r", error=ErrorInfo(ErrorCode.INTERNAL, "boom"))
    body = unpack(encode_result(error))
    assert body == {"v": 1, "id": "r", "error": {"code": "internal", "message": "boom"}}


# ---------------------------------------------------------------------------- leniency


def test_unknown_fields_are_ignored() -> None:
    """Keys the decoder does not know are ignored, whatever their value."""
    body = {"v": 1, "id": "r", "inputs": ["a"], "future": {"x": [1, 2]}, "zz": b"\x00"}
    assert decode_request(pack(body)) == EmbedRequest(id="r", inputs=("a",))


def test_any_key_order_is_accepted() -> None:
    """The decoder accepts fields in any order."""
    body = {"meta": {"q": 1}, "inputs": ["a"], "normalize": False, "id": "r", "v": 1}
    expected = EmbedRequest(id="r", inputs=("a",), normalize=False, meta={"q": 1})
    assert decode_request(pack(body)) == expected


def test_explicit_nil_is_treated_as_absent_in_requests() -> None:
    """Every optional request field set to nil decodes as its default."""
    optional = REQUEST_KEYS[3:]
    assert optional[0] == "model"
    body: dict[str, Any] = {"v": 1, "id": "r", "inputs": ["a"]}
    body.update(dict.fromkeys(optional))
    assert decode_request(pack(body)) == EmbedRequest(id="r", inputs=("a",))


def test_explicit_nil_is_treated_as_absent_in_results() -> None:
    """Optional result fields (keys, meta, error index) set to nil decode as None."""
    body = {
        "v": 1,
        "id": "r",
        "model": "m",
        "dim": 1,
        "dtype": "float32",
        "vectors": b"\x00" * 4,
        "tokens": [1],
        "keys": None,
        "meta": None,
    }
    assert decode_result(pack(body)) == EmbedResult(
        id="r", model="m", dim=1, vectors=b"\x00" * 4, tokens=(1,)
    )
    error_body = {"v": 1, "id": "r", "error": {"code": "internal", "message": "m", "index": None}}
    assert decode_result(pack(error_body)) == ErrorResult(
        id="r", error=ErrorInfo(ErrorCode.INTERNAL, "m")
    )


def test_id_of_max_bytes_is_accepted() -> None:
    """An id of exactly MAX_ID_BYTES bytes of UTF-8 is valid; one byte more is not."""
    ok = "é" * (MAX_ID_BYTES // 2)
    assert decode_request(pack({"v": 1, "id": ok, "inputs": ["a"]})).id == ok
    with pytest.raises(SchemaError) as info:
        decode_request(pack({"v": 1, "id": ok + "x", "inputs": ["a"]}))
    assert info.value.code == ErrorCode.INVALID_REQUEST
    assert info.value.envelope.id is None


def test_topic_name_rules() -> None:
    """Topic names follow Kafka's rules: legal characters, length 1..249, not . or .."""
    assert is_valid_topic("a.b_c-D9")
    assert is_valid_topic("x" * 249)
    assert not is_valid_topic("x" * 250)
    assert not is_valid_topic("")
    assert not is_valid_topic(".")
    assert not is_valid_topic("..")
    assert not is_valid_topic("has space")
    assert not is_valid_topic("slash/topic")


# ---------------------------------------------------------------------------- invalid requests

_DROP: Any = object()
BASE: dict[str, Any] = {
    "v": 1,
    "id": "req-1",
    "inputs": ["a", "b"],
    "reply_to": "replies.topic",
    "reply_partition": 1,
}
FULL_ENVELOPE = Envelope("req-1", "replies.topic", 1)

INVALID = ErrorCode.INVALID_REQUEST
INVALID_CASES: list[tuple[str, dict[str, Any], ErrorCode, int | None, Envelope]] = [
    ("v missing", {"v": _DROP}, INVALID, None, FULL_ENVELOPE),
    ("v string", {"v": "1"}, INVALID, None, FULL_ENVELOPE),
    ("v bool", {"v": True}, INVALID, None, FULL_ENVELOPE),
    ("v zero", {"v": 0}, INVALID, None, FULL_ENVELOPE),
    ("v nil", {"v": None}, INVALID, None, FULL_ENVELOPE),
    ("v newer", {"v": 2}, ErrorCode.UNSUPPORTED_VERSION, None, FULL_ENVELOPE),
    ("v much newer", {"v": 2**40}, ErrorCode.UNSUPPORTED_VERSION, None, FULL_ENVELOPE),
    ("id missing", {"id": _DROP}, INVALID, None, Envelope(None, "replies.topic", 1)),
    ("id empty", {"id": ""}, INVALID, None, Envelope(None, "replies.topic", 1)),
    ("id int", {"id": 5}, INVALID, None, Envelope(None, "replies.topic", 1)),
    ("id too long", {"id": "x" * 257}, INVALID, None, Envelope(None, "replies.topic", 1)),
    ("inputs missing", {"inputs": _DROP}, INVALID, None, FULL_ENVELOPE),
    ("inputs string", {"inputs": "abc"}, INVALID, None, FULL_ENVELOPE),
    ("inputs map", {"inputs": {"a": "b"}}, INVALID, None, FULL_ENVELOPE),
    ("inputs empty", {"inputs": []}, INVALID, None, FULL_ENVELOPE),
    ("input int", {"inputs": ["a", "b", 3]}, INVALID, 2, FULL_ENVELOPE),
    ("input nil", {"inputs": [None]}, INVALID, 0, FULL_ENVELOPE),
    ("input bytes", {"inputs": ["a", b"b"]}, INVALID, 1, FULL_ENVELOPE),
    ("input empty", {"inputs": ["a", ""]}, INVALID, 1, FULL_ENVELOPE),
    ("model empty", {"model": ""}, INVALID, None, FULL_ENVELOPE),
    ("model int", {"model": 3}, INVALID, None, FULL_ENVELOPE),
    ("normalize string", {"normalize": "yes"}, INVALID, None, FULL_ENVELOPE),
    ("normalize int", {"normalize": 1}, INVALID, None, FULL_ENVELOPE),
    ("truncate string", {"truncate": "no"}, INVALID, None, FULL_ENVELOPE),
    ("dimensions zero", {"dimensions": 0}, INVALID, None, FULL_ENVELOPE),
    ("dimensions negative", {"dimensions": -3}, INVALID, None, FULL_ENVELOPE),
    ("dimensions bool", {"dimensions": True}, INVALID, None, FULL_ENVELOPE),
    ("dimensions float", {"dimensions": 8.0}, INVALID, None, FULL_ENVELOPE),
    ("encoding unknown", {"encoding": "float64"}, INVALID, None, FULL_ENVELOPE),
    ("encoding wrong case", {"encoding": "Int8"}, INVALID, None, FULL_ENVELOPE),
    ("encoding empty", {"encoding": ""}, INVALID, None, FULL_ENVELOPE),
    ("encoding int", {"encoding": 8}, INVALID, None, FULL_ENVELOPE),
    ("encoding bytes", {"encoding": b"int8"}, INVALID, None, FULL_ENVELOPE),
    ("prompt int", {"prompt": 5}, INVALID, None, FULL_ENVELOPE),
    ("deadline negative", {"deadline_ms": -1}, INVALID, None, FULL_ENVELOPE),
    ("deadline float", {"deadline_ms": 1.5}, INVALID, None, FULL_ENVELOPE),
    ("reply_to spaces", {"reply_to": "bad topic"}, INVALID, None, Envelope("req-1", None, 1)),
    ("reply_to dot", {"reply_to": "."}, INVALID, None, Envelope("req-1", None, 1)),
    ("reply_to dotdot", {"reply_to": ".."}, INVALID, None, Envelope("req-1", None, 1)),
    ("reply_to empty", {"reply_to": ""}, INVALID, None, Envelope("req-1", None, 1)),
    ("reply_to too long", {"reply_to": "t" * 250}, INVALID, None, Envelope("req-1", None, 1)),
    ("reply_to int", {"reply_to": 7}, INVALID, None, Envelope("req-1", None, 1)),
    (
        "reply_partition negative",
        {"reply_partition": -1},
        INVALID,
        None,
        Envelope("req-1", "replies.topic", None),
    ),
    (
        "reply_partition string",
        {"reply_partition": "1"},
        INVALID,
        None,
        Envelope("req-1", "replies.topic", None),
    ),
    ("keys not array", {"keys": "ab"}, INVALID, None, FULL_ENVELOPE),
    ("keys too few", {"keys": ["k"]}, INVALID, None, FULL_ENVELOPE),
    ("keys too many", {"keys": [1, 2, 3]}, INVALID, None, FULL_ENVELOPE),
    ("key bool", {"keys": [True, "b"]}, INVALID, 0, FULL_ENVELOPE),
    ("key float", {"keys": ["a", 1.5]}, INVALID, 1, FULL_ENVELOPE),
    ("meta array", {"meta": [1, 2]}, INVALID, None, FULL_ENVELOPE),
    ("meta bytes key", {"meta": {b"k": 1}}, INVALID, None, FULL_ENVELOPE),
]


@pytest.mark.parametrize(
    ("changes", "code", "index", "envelope"),
    [pytest.param(c, code, i, e, id=name) for name, c, code, i, e in INVALID_CASES],
)
def test_invalid_request_raises_schema_error(
    changes: dict[str, Any], code: ErrorCode, index: int | None, envelope: Envelope
) -> None:
    """Each kind of invalid request raises SchemaError with its code, index and envelope."""
    body = {**BASE, **changes}
    body = {k: v for k, v in body.items() if v is not _DROP}
    with pytest.raises(SchemaError) as info:
        decode_request(pack(body))
    error = info.value
    assert error.code == code
    assert error.index == index
    assert error.envelope == envelope
    assert error.message
    assert str(error).startswith(f"{code.value}: ")


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\xc1", id="reserved byte"),
        pytest.param(b"\x82\xa1v", id="truncated map"),
        pytest.param(pack({"v": 1}) + b"\x00", id="trailing bytes"),
        pytest.param(pack([1, 2]), id="array"),
        pytest.param(pack("just a string"), id="string"),
        pytest.param(pack(None), id="nil"),
        pytest.param(pack({1: "int key"}), id="int key"),
    ],
)
def test_unreadable_message_is_invalid_without_envelope(data: bytes) -> None:
    """Bytes that are not a msgpack map raise invalid_request with an empty envelope."""
    with pytest.raises(SchemaError) as info:
        decode_request(data)
    assert info.value.code == ErrorCode.INVALID_REQUEST
    assert info.value.envelope == Envelope()


def test_invalid_utf8_in_input_keeps_envelope_and_index() -> None:
    """Invalid UTF-8 in an input is invalid_request with its index and the intact envelope."""
    data = raw_map(
        ("v", packed(1)),
        ("id", packed("r9")),
        ("reply_to", packed("replies")),
        ("inputs", raw_array(packed("fine"), raw_str(b"\xff\xfe"))),
    )
    with pytest.raises(SchemaError) as info:
        decode_request(data)
    assert info.value.code == ErrorCode.INVALID_REQUEST
    assert info.value.index == 1
    assert info.value.envelope == Envelope("r9", "replies", None)


def test_invalid_utf8_in_other_field_has_no_index() -> None:
    """Invalid UTF-8 in a non-input field names no input index but keeps the id."""
    data = raw_map(
        ("v", packed(1)),
        ("id", packed("r9")),
        ("inputs", packed(["ok"])),
        ("prompt", raw_str(b"\xff")),
    )
    with pytest.raises(SchemaError) as info:
        decode_request(data)
    assert info.value.code == ErrorCode.INVALID_REQUEST
    assert info.value.index is None
    assert info.value.envelope.id == "r9"


# ---------------------------------------------------------------------------- fuzzing

# Arbitrary nesting, including maps with non-string keys (which msgpack can encode).
any_values = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(
            st.one_of(st.text(max_size=6), st.integers(-5, 5), st.binary(max_size=4)),
            children,
            max_size=4,
        ),
    ),
    max_leaves=15,
)
field_values = st.one_of(
    any_values,
    st.just(1),
    st.lists(
        st.one_of(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1), st.none()), max_size=3
    ),
    topics,
    st.integers(min_value=-2, max_value=3),
    st.sampled_from([*Encoding, "float64", "INT8", ""]),
)
request_like = st.one_of(
    any_values,
    st.dictionaries(st.sampled_from(REQUEST_KEYS), field_values, max_size=len(REQUEST_KEYS)),
    st.fixed_dictionaries(
        {"v": st.just(1), "id": ids, "inputs": st.lists(texts, min_size=1, max_size=3)},
        optional={k: field_values for k in REQUEST_KEYS if k not in ("v", "id", "inputs")},
    ),
)


def decode_or_error(data: bytes) -> Request | SchemaError:
    """decode_request's result, or the SchemaError it raised (any other exception escapes)."""
    try:
        return decode_request(data)
    except SchemaError as exc:
        return exc


def assert_request_or_schema_error(data: bytes) -> None:
    outcome = decode_or_error(data)
    if isinstance(outcome, SchemaError):
        assert isinstance(outcome.code, ErrorCode)
        assert isinstance(outcome.envelope, Envelope)
        envelope_id = outcome.envelope.id
        assert envelope_id is None or (isinstance(envelope_id, str) and envelope_id)
    else:
        assert isinstance(outcome, EmbedRequest)
        assert outcome.inputs
        assert all(isinstance(text, str) and text for text in outcome.inputs)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    """For arbitrary bytes, decode_request returns a request or raises SchemaError only."""
    assert_request_or_schema_error(data)


@settings(max_examples=500, deadline=None)
@given(request_like)
def test_fuzz_arbitrary_msgpack_values(value: object) -> None:
    """For arbitrary msgpack values, decode_request returns a request or raises SchemaError."""
    assert_request_or_schema_error(pack(value))


@settings(max_examples=500, deadline=None)
@given(requests(), st.data())
def test_fuzz_corrupted_valid_requests(request: EmbedRequest, data: st.DataObject) -> None:
    """A valid encoding with bytes overwritten decodes or raises SchemaError, nothing else."""
    encoded = bytearray(encode_request(request))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        position = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
        encoded[position] = data.draw(st.integers(min_value=0, max_value=255))
    assert_request_or_schema_error(bytes(encoded))


# ---------------------------------------------------------------------------- decode_result


def _result_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "v": 1,
        "id": "r",
        "model": "m",
        "dim": 2,
        "dtype": "float32",
        "vectors": b"\x00" * 16,
        "tokens": [1, 2],
    }
    body.update(changes)
    return body


@pytest.mark.parametrize(
    "vectors",
    [
        pytest.param(b"\x00" * 15, id="one byte short"),
        pytest.param(b"\x00" * 17, id="one byte long"),
        pytest.param(b"\x00" * 8, id="one row"),
        pytest.param(b"", id="empty"),
    ],
)
def test_decode_result_rejects_wrong_vectors_length(vectors: bytes) -> None:
    """A vectors blob whose length is not count * dim * 4 is rejected."""
    with pytest.raises(SchemaError) as info:
        decode_result(pack(_result_body(vectors=vectors)))
    assert info.value.code == ErrorCode.INVALID_REQUEST
    assert "vectors" in info.value.message


def test_decode_result_accepts_matching_vectors_length() -> None:
    """A vectors blob of exactly count * dim * 4 bytes decodes."""
    decoded = decode_result(pack(_result_body()))
    assert isinstance(decoded, EmbedResult)
    assert decoded.count == 2
    assert decoded.dim == 2


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"dtype": "float64"}, id="unknown dtype"),
        pytest.param({"dtype": "INT8", "vectors": b"\x00" * 4}, id="dtype wrong case"),
        pytest.param({"dtype": "int8", "vectors": b"\x00" * 4}, id="int8 without scales"),
        pytest.param(
            {"dtype": "int8", "vectors": b"\x00" * 4, "scales": b"\x00" * 4},
            id="int8 scales one row short",
        ),
        pytest.param(
            {"dtype": "int8", "vectors": b"\x00" * 4, "scales": [1.0, 1.0]},
            id="int8 scales not binary",
        ),
        pytest.param({"scales": b"\x00" * 8}, id="scales with float32"),
        pytest.param({"dtype": "binary", "vectors": b"\x00" * 4}, id="binary unpadded length"),
        pytest.param({"dim": 0}, id="zero dim"),
        pytest.param({"vectors": [0, 0]}, id="vectors not binary"),
        pytest.param({"tokens": ["1", "2"]}, id="tokens not ints"),
        pytest.param({"model": None}, id="model nil"),
        pytest.param({"v": 0}, id="version zero"),
        pytest.param({"error": "boom"}, id="error not a map"),
        pytest.param({"error": {"code": "internal"}}, id="error without message"),
        pytest.param({"requested_ms": -1}, id="negative requested_ms"),
        pytest.param({"requested_ms": "1767225600000"}, id="requested_ms not an int"),
    ],
)
def test_decode_result_rejects_malformed(changes: dict[str, Any]) -> None:
    """Malformed results raise SchemaError(invalid_request)."""
    with pytest.raises(SchemaError) as info:
        decode_result(pack(_result_body(**changes)))
    assert info.value.code == ErrorCode.INVALID_REQUEST


def test_decode_result_newer_version() -> None:
    """A result with a newer version raises unsupported_version."""
    with pytest.raises(SchemaError) as info:
        decode_result(pack(_result_body(v=2)))
    assert info.value.code == ErrorCode.UNSUPPORTED_VERSION


RESULT_KEYS = [
    "v",
    "id",
    "model",
    "dim",
    "dtype",
    "vectors",
    "scales",
    "tokens",
    "keys",
    "meta",
    "error",
]
result_field_values = st.one_of(
    any_values,
    st.just(1),
    st.sampled_from([*Encoding, "float64"]),
    st.binary(max_size=16),
    st.lists(st.integers(min_value=0, max_value=3), max_size=3),
    st.dictionaries(
        st.sampled_from(["code", "message", "index"]),
        any_values | st.sampled_from(["internal", "brand_new"]),
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(any_values, st.dictionaries(st.sampled_from(RESULT_KEYS), result_field_values)))
def test_fuzz_decode_result(value: object) -> None:
    """For arbitrary msgpack values, decode_result returns a Result or raises SchemaError."""
    try:
        decoded = decode_result(pack(value))
    except SchemaError:
        return
    assert isinstance(decoded, EmbedResult | ErrorResult)


# ---------------------------------------------------------------------------- float32 helpers


def test_pack_float32_is_little_endian() -> None:
    """pack_float32 writes IEEE float32 little-endian, whatever the host order."""
    values = array("f", [1.0, -2.5, 0.0])
    assert pack_float32(values) == struct.pack("<3f", 1.0, -2.5, 0.0)
    assert pack_float32(array("f", [1.0])) == b"\x00\x00\x80\x3f"


def test_unpack_float32_reads_little_endian() -> None:
    """unpack_float32 reads little-endian float32 bytes."""
    assert list(unpack_float32(b"\x00\x00\x80\x3f\x00\x00\x20\xc0")) == [1.0, -2.5]


def test_pack_float32_rejects_other_typecodes() -> None:
    """pack_float32 refuses an array that is not array('f')."""
    with pytest.raises(TypeError):
        pack_float32(array("d", [1.0]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False), max_size=50))
def test_float32_round_trip(values: list[float]) -> None:
    """unpack_float32(pack_float32(x)) == x for float32 values."""
    packed = pack_float32(array("f", values))
    assert len(packed) == 4 * len(values)
    assert list(unpack_float32(packed)) == values
    assert packed == struct.pack(f"<{len(values)}f", *values)


@pytest.mark.parametrize(
    "meta",
    [
        pytest.param({1: "x"}, id="int key at top"),
        pytest.param({"trace": {2: "y"}}, id="int key nested"),
    ],
)
def test_int_keyed_meta_does_not_lose_the_envelope(meta: dict[Any, Any]) -> None:
    """A request whose meta holds an int-keyed map is valid msgpack, so its id stays readable."""
    outcome = decode_or_error(pack({**BASE, "meta": meta}))
    if isinstance(outcome, SchemaError):
        assert outcome.envelope == FULL_ENVELOPE, outcome
    else:
        assert outcome.id == "req-1"


# ---------------------------------------------------------------------------- encodings


def test_encoding_defaults_to_float32_and_is_left_out() -> None:
    """No 'encoding' means float32, an explicit float32 decodes the same, and the canonical
    form never writes the default (so old requests and old clients are unaffected)."""
    minimal = {"v": 1, "id": "r", "inputs": ["a"]}
    assert embed_request(pack(minimal)).encoding == Encoding.FLOAT32
    explicit = embed_request(pack({**minimal, "encoding": "float32"}))
    assert explicit == EmbedRequest(id="r", inputs=("a",))
    assert encode_request(explicit) == pack(minimal)


@pytest.mark.parametrize("encoding", list(Encoding))
def test_each_encoding_decodes_and_encodes_by_name(encoding: Encoding) -> None:
    """Every documented encoding name is accepted and written back as the same plain string."""
    body = {"v": 1, "id": "r", "inputs": ["a"], "encoding": encoding.value}
    request = embed_request(pack(body))
    assert request.encoding is encoding
    written = unpack(encode_request(request))
    assert written.get("encoding", "float32") == encoding.value
    assert type(written.get("encoding", "")) is str


def test_unknown_encoding_is_invalid_request_naming_the_choices() -> None:
    """An unknown encoding is invalid_request; the message lists the valid names and the
    envelope survives so the error can be answered."""
    with pytest.raises(SchemaError) as info:
        decode_request(pack({**BASE, "encoding": "int4"}))
    assert info.value.code == ErrorCode.INVALID_REQUEST
    assert "'encoding' must be one of float32, float16, int8, binary" in info.value.message
    assert info.value.envelope == FULL_ENVELOPE


@pytest.mark.parametrize(
    ("encoding", "dim", "size"),
    [
        (Encoding.FLOAT32, 3, 12),
        (Encoding.FLOAT16, 3, 6),
        (Encoding.INT8, 3, 3),
        (Encoding.BINARY, 1, 1),
        (Encoding.BINARY, 8, 1),
        (Encoding.BINARY, 9, 2),
        (Encoding.BINARY, 384, 48),
    ],
)
def test_row_bytes(encoding: Encoding, dim: int, size: int) -> None:
    """Bytes per vector: 4, 2 and 1 per value, ceil(dim / 8) for binary."""
    assert row_bytes(encoding, dim) == size


@pytest.mark.parametrize("encoding", list(Encoding))
@pytest.mark.parametrize("dim", [1, 7, 8, 10])
def test_decode_result_checks_vectors_length_per_encoding(encoding: Encoding, dim: int) -> None:
    """A result's blob must hold exactly count x row_bytes(dtype, dim) bytes; a byte more or
    less is rejected."""
    size = 2 * row_bytes(encoding, dim)
    extra = {"scales": b"\x00" * 8} if encoding == Encoding.INT8 else {}
    body = _result_body(dtype=encoding.value, dim=dim, **extra)
    decoded = decode_result(pack({**body, "vectors": b"\x01" * size}))
    assert isinstance(decoded, EmbedResult)
    assert decoded.dtype is encoding
    for wrong in (size - 1, size + 1):
        with pytest.raises(SchemaError, match="vectors"):
            decode_result(pack({**body, "vectors": b"\x01" * wrong}))


def test_int8_result_keeps_its_scales_in_canonical_place() -> None:
    """An int8 result writes 'scales' right after 'vectors'; other results never write it."""
    result = EmbedResult(
        id="r",
        model="m",
        dim=2,
        vectors=b"\x01\xff",
        tokens=(3,),
        dtype=Encoding.INT8,
        scales=struct.pack("<f", 0.5),
    )
    body = unpack(encode_result(result))
    assert list(body) == ["v", "id", "model", "dim", "dtype", "vectors", "scales", "tokens"]
    assert decode_result(encode_result(result)) == result
    assert unpack_rows(result) == [[1, -1]]
    assert unpack_scales(result) == [0.5]


def test_int8_normalized_scale_is_float32_of_one_over_127() -> None:
    """INT8_NORMALIZED_SCALE is 1/127 rounded to float32."""
    assert struct.pack("<f", INT8_NORMALIZED_SCALE) == struct.pack("<f", 1 / 127)
    assert abs(INT8_NORMALIZED_SCALE - 1 / 127) < 1e-9


@settings(max_examples=200, deadline=None)
@given(embed_results())
@example(  # a signaling NaN scale: read as a Python float, it comes back quieted
    EmbedResult(
        id="0",
        model="",
        dim=1,
        vectors=b"\x00" * 4,
        tokens=(0, 0, 0, 0),
        dtype=Encoding.INT8,
        scales=b"\x00" * 14 + b"\x81\x7f",
    )
)
def test_unpack_rows_reads_every_encoding(result: EmbedResult) -> None:
    """The pure-Python reader gives count rows of dim values, matching an independent
    numpy reading of the same bytes (equal floats, int8 codes, unpacked sign bits)."""
    rows = unpack_rows(result)
    assert len(rows) == result.count
    assert all(len(row) == result.dim for row in rows)
    wire = {"float32": "<f4", "float16": "<f2", "int8": "i1", "binary": "u1"}[result.dtype]
    if result.dtype == Encoding.BINARY:
        width = row_bytes(Encoding.BINARY, result.dim)
        packed = np.frombuffer(result.vectors, "u1").reshape(result.count, width)
        expected = np.unpackbits(packed, axis=1, count=result.dim).tolist()
        assert rows == expected
    else:
        with np.errstate(invalid="ignore"):  # random bytes hold signaling NaNs
            expected_values = np.frombuffer(result.vectors, wire).astype(np.float64)
        read = np.array(rows, dtype=np.float64).reshape(expected_values.shape)
        np.testing.assert_array_equal(read, expected_values)  # NaN equals NaN here
    scales = unpack_scales(result)
    if result.dtype == Encoding.INT8:
        assert scales is not None
        assert result.scales is not None
        # Equal values, NaN equal to NaN: a float32 NaN's payload bits need not survive the
        # round trip through a Python float (a signaling NaN is quieted on the way).
        with np.errstate(invalid="ignore"):
            read_scales = np.array(scales, dtype="<f4")
        np.testing.assert_array_equal(read_scales, np.frombuffer(result.scales, "<f4"))
    else:
        assert scales is None
