"""Unit tests for rerank requests and results in the wire format (schemas/README.md,
"Reranking"): round trips, canonical encoding, and every check a reader makes."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import (
    EmbedRequest,
    EmbedResult,
    ErrorCode,
    ErrorResult,
    RerankRequest,
    RerankResult,
    SchemaError,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from tests.unit.schemas.test_codec import pack, unpack

texts = st.text(min_size=1, max_size=12).filter(lambda t: t.encode("utf-8", "surrogatepass"))
utf8 = st.text(min_size=1, max_size=12, alphabet=st.characters(blacklist_categories=["Cs"]))


@st.composite
def rerank_requests(draw: st.DrawFn) -> RerankRequest:
    return RerankRequest(
        id=draw(utf8),
        query=draw(utf8),
        documents=tuple(draw(st.lists(utf8, min_size=1, max_size=5))),
        model=draw(st.none() | utf8),
        top_n=draw(st.none() | st.integers(1, 1000)),
        return_documents=draw(st.booleans()),
        raw_scores=draw(st.booleans()),
        truncate=draw(st.booleans()),
        truncation_direction=draw(st.none() | st.sampled_from(["right", "left"])),
        deadline_ms=draw(st.none() | st.integers(0, 2**62)),
        reply_to=draw(st.none() | st.sampled_from(["embed.results", "embed.results.app"])),
        reply_partition=draw(st.none() | st.integers(0, 100)),
        meta=draw(st.none() | st.dictionaries(utf8, st.integers(-(2**63), 2**63 - 1), max_size=2)),
    )


@st.composite
def rerank_results(draw: st.DrawFn) -> RerankResult:
    count = draw(st.integers(1, 6))
    scores = draw(st.lists(st.floats(width=32, allow_nan=False), min_size=count, max_size=count))
    order = draw(st.permutations(range(count)))[: draw(st.integers(1, count))]
    documents = draw(st.none() | st.lists(utf8, min_size=len(order), max_size=len(order)))
    return RerankResult(
        id=draw(utf8),
        model=draw(utf8),
        scores=struct.pack(f"<{count}f", *scores),
        order=tuple(order),
        tokens=tuple(draw(st.lists(st.integers(1, 512), min_size=count, max_size=count))),
        documents=None if documents is None else tuple(documents),
        requested_ms=draw(st.none() | st.integers(0, 2**62)),
        meta=draw(st.none() | st.dictionaries(utf8, st.integers(-(2**63), 2**63 - 1), max_size=2)),
    )


@given(rerank_requests())
def test_rerank_request_round_trip(request: RerankRequest) -> None:
    """Any valid rerank request decodes back to an equal request after encoding."""
    assert decode_request(encode_request(request)) == request


@given(rerank_results())
def test_rerank_result_round_trip(result: RerankResult) -> None:
    decoded = decode_result(encode_result(result))
    assert decoded == result
    assert isinstance(decoded, RerankResult)
    assert list(decoded.score_values()) == list(struct.unpack(f"<{result.count}f", result.scores))


def test_defaults_are_left_out_and_kind_is_written() -> None:
    request = RerankRequest(id="r", query="q", documents=("a", "b"))
    assert unpack(encode_request(request)) == {
        "v": 1,
        "id": "r",
        "kind": "rerank",
        "query": "q",
        "documents": ["a", "b"],
    }


def test_an_explicit_embed_kind_is_an_embed_request() -> None:
    decoded = decode_request(pack({"v": 1, "id": "r", "kind": "embed", "inputs": ["a"]}))
    assert decoded == EmbedRequest(id="r", inputs=("a",))
    assert "kind" not in unpack(encode_request(decoded))  # the default is left out


def test_embed_only_keys_are_ignored_in_a_rerank_request() -> None:
    body = {"v": 1, "id": "r", "kind": "rerank", "query": "q", "documents": ["d"]}
    extra = {"inputs": ["x"], "normalize": False, "dimensions": 8, "keys": ["k"]}
    assert decode_request(pack({**body, **extra})) == decode_request(pack(body))


@pytest.mark.parametrize(
    ("changes", "index", "words"),
    [
        ({"query": None}, None, "'query'"),
        ({"query": 3}, None, "'query' must be a string"),
        ({"documents": ["a", ""]}, 1, "'documents' [1] must not be empty"),
        ({"documents": []}, None, "at least one"),
        ({"top_n": 0}, None, "'top_n' must be >= 1"),
        ({"return_documents": "yes"}, None, "'return_documents' must be a boolean"),
        ({"truncation_direction": "middle"}, None, "'truncation_direction' must be one of"),
        ({"kind": "Rerank"}, None, "'kind' must be one of embed, rerank"),
    ],
)
def test_invalid_rerank_requests_keep_their_envelope(
    changes: dict[str, Any], index: int | None, words: str
) -> None:
    body = {"v": 1, "id": "r-1", "kind": "rerank", "query": "q", "documents": ["d"]}
    body |= {"reply_to": "embed.results.app", "reply_partition": 2}
    with pytest.raises(SchemaError) as caught:
        decode_request(pack({**body, **changes}))
    error = caught.value
    assert error.code == ErrorCode.INVALID_REQUEST
    assert words in error.message
    assert error.index == index
    assert (error.envelope.id, error.envelope.reply_to) == ("r-1", "embed.results.app")
    assert error.envelope.reply_partition == 2


def test_a_document_that_is_not_utf8_is_named() -> None:
    body = (
        b"\x85"
        + pack("v") + pack(1) + pack("id") + pack("r-2") + pack("kind") + pack("rerank")
        + pack("query") + pack("q") + pack("documents")
        + b"\x92\xa1a\xa2\xff\xfe"  # ["a", <2 bytes that are not UTF-8>]
    )  # fmt: skip
    with pytest.raises(SchemaError) as caught:
        decode_request(body)
    assert (caught.value.index, caught.value.envelope.id) == (1, "r-2")
    assert "a document is not valid UTF-8" in caught.value.message


RESULT = {
    "v": 1,
    "id": "r",
    "kind": "rerank",
    "model": "m",
    "scores": struct.pack("<3f", 0.5, 0.25, 0.75),
    "order": [2, 0],
    "tokens": [5, 6, 7],
}


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"scores": struct.pack("<2f", 0.5, 0.25)}, "'scores' holds 8 bytes, expected 3"),
        ({"order": [2, 2]}, "distinct document indices in 0..2"),
        ({"order": [3]}, "distinct document indices in 0..2"),
        ({"documents": ["only one"]}, "'documents' has 1 entries for 2"),
        ({"documents": [1, 2]}, "'documents' must be an array of strings"),
        ({"model": None}, "'model'"),
        ({"order": None}, "'order'"),
    ],
)
def test_malformed_rerank_results_are_refused(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(SchemaError) as caught:
        decode_result(pack({**RESULT, **changes}))
    assert words in caught.value.message


def test_results_are_told_apart_by_kind() -> None:
    assert isinstance(decode_result(pack(RESULT)), RerankResult)
    error = {"v": 1, "id": "r", "kind": "rerank", "error": {"code": "internal", "message": "x"}}
    assert isinstance(decode_result(pack(error)), ErrorResult)
    plain = {k: v for k, v in RESULT.items() if k not in ("kind", "scores", "order")}
    vectors = plain | {"dim": 1, "dtype": "float32", "vectors": struct.pack("<3f", 1, 1, 1)}
    assert isinstance(decode_result(pack(vectors)), EmbedResult)
