"""Unit tests for the wire format's chunking fields: ``chunking`` and ``chunk_pooling`` in
requests, ``chunks`` and ``spans`` in results (schemas/README.md, "Chunking")."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import (
    Chunking,
    EmbedRequest,
    EmbedResult,
    ErrorCode,
    SchemaError,
    decode_result,
    encode_request,
    encode_result,
)
from tests.conftest import embed_request
from tests.unit.schemas.test_codec import _result_body as plain_result_body
from tests.unit.schemas.test_codec import embed_results, requests


def pack(value: object) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


@st.composite
def chunkings(draw: st.DrawFn) -> Chunking:
    max_tokens = draw(st.integers(min_value=1, max_value=2**31))
    return Chunking(max_tokens, draw(st.integers(min_value=0, max_value=max_tokens // 2)))


@st.composite
def chunked_requests(draw: st.DrawFn) -> EmbedRequest:
    return replace(
        draw(requests()),
        chunking=draw(chunkings()),
        chunk_pooling=draw(st.sampled_from(["none", "mean"])),
    )


@st.composite
def chunked_results(draw: st.DrawFn) -> EmbedResult:
    """A result whose rows are per chunk or (mean pooling) per input."""
    result = draw(embed_results())
    rows = result.count
    if rows == 0:
        return result
    per_input = draw(st.booleans())
    if per_input:
        chunks = tuple(draw(st.lists(st.integers(1, 4), min_size=rows, max_size=rows)))
    else:
        cut = sorted(draw(st.sets(st.integers(1, rows - 1), max_size=rows - 1))) if rows > 1 else []
        bounds = [0, *cut, rows]
        chunks = tuple(b - a for a, b in pairwise(bounds))
    starts = draw(st.lists(st.integers(0, 10**6), min_size=sum(chunks), max_size=sum(chunks)))
    lengths = draw(st.lists(st.integers(1, 10**4), min_size=sum(chunks), max_size=sum(chunks)))
    spans = tuple((s, s + n) for s, n in zip(starts, lengths, strict=True))
    says = draw(st.booleans())  # a worker that predates chunk_pooling leaves it out
    pooling = ("mean" if per_input else "none") if says else None
    return replace(result, chunks=chunks, spans=spans, chunk_pooling=pooling)


# ---------------------------------------------------------------------------- requests


@settings(max_examples=200, deadline=None)
@given(chunked_requests())
def test_chunked_request_round_trip(request: EmbedRequest) -> None:
    """Any valid chunked request decodes back to an equal request after encoding."""
    assert embed_request(encode_request(request)) == request


def test_chunking_is_encoded_last_and_defaults_left_out() -> None:
    """`chunking` and `chunk_pooling` follow `meta` in canonical order; a zero overlap and
    pooling `none` are left out."""
    base = EmbedRequest(id="r", inputs=("a",), meta={"x": 1})
    plain = unpack(encode_request(replace(base, chunking=Chunking(128))))
    assert list(plain) == ["v", "id", "inputs", "meta", "chunking"]
    assert plain["chunking"] == {"max_tokens": 128}
    full = unpack(encode_request(replace(base, chunking=Chunking(128, 16), chunk_pooling="mean")))
    assert list(full) == ["v", "id", "inputs", "meta", "chunking", "chunk_pooling"]
    assert list(full["chunking"].items()) == [("max_tokens", 128), ("overlap_tokens", 16)]
    assert full["chunk_pooling"] == "mean"


def test_request_without_chunking_has_none_and_pooling_none() -> None:
    decoded = embed_request(pack({"v": 1, "id": "r", "inputs": ["a"]}))
    assert decoded.chunking is None
    assert decoded.chunk_pooling == "none"


def test_explicit_nils_in_chunking_mean_absent() -> None:
    body = {"v": 1, "id": "r", "inputs": ["a"], "chunk_pooling": None}
    body["chunking"] = {"max_tokens": 8, "overlap_tokens": None}
    decoded = embed_request(pack(body))
    assert decoded.chunking == Chunking(8, 0)
    assert decoded.chunk_pooling == "none"


def test_explicit_pooling_none_with_chunking_is_accepted() -> None:
    body = {"v": 1, "id": "r", "inputs": ["a"], "chunking": {"max_tokens": 8}}
    decoded = embed_request(pack({**body, "chunk_pooling": "none"}))
    assert decoded.chunk_pooling == "none"


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        pytest.param({"chunking": 128}, "'chunking' must be a map", id="not a map"),
        pytest.param({"chunking": {}}, "'max_tokens'", id="no max_tokens"),
        pytest.param(
            {"chunking": {"max_tokens": 8, "stride": 2}}, "unknown keys 'stride'", id="other key"
        ),
        pytest.param({"chunking": {"max_tokens": 0}}, "must be >= 1, not 0", id="zero window"),
        pytest.param({"chunking": {"max_tokens": -3}}, "must be >= 1", id="negative window"),
        pytest.param({"chunking": {"max_tokens": "8"}}, "must be an integer", id="string window"),
        pytest.param({"chunking": {"max_tokens": True}}, "must be an integer", id="bool window"),
        pytest.param({"chunking": {"max_tokens": 8.0}}, "must be an integer", id="float window"),
        pytest.param(
            {"chunking": {"max_tokens": 8, "overlap_tokens": 8}},
            "must be in 0..4",
            id="overlap equal to window",
        ),
        pytest.param(
            {"chunking": {"max_tokens": 8, "overlap_tokens": 5}},
            "at most half of max_tokens 8), not 5",
            id="overlap over half the window",
        ),
        pytest.param(
            {"chunking": {"max_tokens": 256, "overlap_tokens": 253}},
            "must be in 0..128 (at most half of max_tokens 256), not 253",
            id="overlap a token short of the window",
        ),
        pytest.param(
            {"chunking": {"max_tokens": 8, "overlap_tokens": -1}},
            "not -1",
            id="negative overlap",
        ),
        pytest.param(
            {"chunking": {"max_tokens": 8, "overlap_tokens": "2"}},
            "overlap_tokens' must be an integer",
            id="string overlap",
        ),
        pytest.param({"chunk_pooling": "mean"}, "needs 'chunking'", id="mean without chunking"),
        pytest.param(
            {"chunking": {"max_tokens": 8}, "chunk_pooling": "max"},
            "must be one of none, mean",
            id="unknown pooling",
        ),
        pytest.param(
            {"chunking": {"max_tokens": 8}, "chunk_pooling": "MEAN"},
            "must be one of none, mean",
            id="pooling wrong case",
        ),
        pytest.param(
            {"chunking": {"max_tokens": 8}, "chunk_pooling": 1},
            "must be a string",
            id="pooling not a string",
        ),
    ],
)
def test_invalid_chunking_is_invalid_request(changes: dict[str, Any], words: str) -> None:
    """Bad `chunking`/`chunk_pooling` is invalid_request, says what is wrong, and keeps
    the envelope so the worker can answer."""
    body = {"v": 1, "id": "r", "inputs": ["a"], "reply_to": "my.replies", **changes}
    with pytest.raises(SchemaError) as caught:
        embed_request(pack(body))
    assert caught.value.code == ErrorCode.INVALID_REQUEST
    assert words in caught.value.message
    assert caught.value.envelope.id == "r"
    assert caught.value.envelope.reply_to == "my.replies"


@pytest.mark.parametrize(
    ("max_tokens", "overlap"),
    [(0, 0), (5, 5), (5, 3), (256, 129), (5, -1), (True, 0), (5, 1.5)],
)
def test_chunking_rejects_impossible_numbers(max_tokens: Any, overlap: Any) -> None:
    with pytest.raises(ValueError, match="chunking"):
        Chunking(max_tokens, overlap)


# ---------------------------------------------------------------------------- results


@settings(max_examples=200, deadline=None)
@given(chunked_results())
def test_chunked_result_round_trip(result: EmbedResult) -> None:
    """Any valid chunked result decodes back to an equal result after encoding."""
    assert decode_result(encode_result(result)) == result


def _result_body(**changes: Any) -> dict[str, Any]:
    """Three rows of 2: input 0 in two chunks, input 1 in one."""
    chunked = {
        "vectors": b"\x00" * 24,
        "tokens": [5, 6, 4],
        "keys": ["a", "b"],
        "chunks": [2, 1],
        "spans": [[0, 10], [8, 20], [0, 3]],
    }
    return plain_result_body(**{**chunked, **changes})


def test_result_chunks_and_spans_come_after_meta() -> None:
    result = decode_result(pack(_result_body(meta={"m": 1})))
    assert isinstance(result, EmbedResult)
    assert result.chunks == (2, 1)
    assert result.spans == ((0, 10), (8, 20), (0, 3))
    assert list(unpack(encode_result(result)))[-4:] == ["keys", "meta", "chunks", "spans"]


def test_mean_pooled_result_has_a_row_per_input() -> None:
    result = decode_result(pack(_result_body(vectors=b"\x00" * 16, tokens=[11, 4])))
    assert isinstance(result, EmbedResult)
    assert result.count == 2
    assert result.chunks == (2, 1)


def test_result_without_chunking_leaves_them_out() -> None:
    body = _result_body()
    del body["chunks"], body["spans"]
    result = decode_result(pack(body))
    assert isinstance(result, EmbedResult)
    assert result.chunks is None
    assert result.spans is None
    assert "chunks" not in unpack(encode_result(result))


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"chunks": None}, id="spans without chunks"),
        pytest.param({"spans": None}, id="chunks without spans"),
        pytest.param({"chunks": [3, 0], "spans": [[0, 1]] * 3}, id="zero chunks"),
        pytest.param({"chunks": [2, 2]}, id="fewer spans than chunks"),
        pytest.param({"spans": [[0, 10], [8, 20]]}, id="fewer spans"),
        pytest.param({"spans": [[0, 10], [20, 8], [0, 3]]}, id="span backwards"),
        pytest.param({"spans": [[0, 10], [8, 8], [0, 3]]}, id="empty span"),
        pytest.param({"spans": [[0, 10], [-1, 8], [0, 3]]}, id="negative start"),
        pytest.param({"spans": [[0, 10], [8], [0, 3]]}, id="span not a pair"),
        pytest.param({"spans": [[0, 10], ["8", 9], [0, 3]]}, id="span not ints"),
        pytest.param({"spans": "0-10"}, id="spans not an array"),
        pytest.param({"chunks": "21"}, id="chunks not an array"),
        pytest.param(
            {"chunks": [1, 1, 1], "spans": [[0, 1]] * 3, "tokens": [1, 1], "vectors": b"0" * 16},
            id="rows neither per chunk nor per input",
        ),
    ],
)
def test_malformed_chunks_or_spans_are_rejected(changes: dict[str, Any]) -> None:
    with pytest.raises(SchemaError) as caught:
        decode_result(pack(_result_body(**changes)))
    assert caught.value.code == ErrorCode.INVALID_REQUEST


def test_a_result_says_its_chunk_pooling_after_the_spans() -> None:
    """``chunk_pooling`` is encoded last; it needs ``chunks``, and its count of vectors."""
    body = {
        **plain_result_body(),
        "chunks": [1, 1],
        "spans": [[0, 1], [0, 2]],
        "chunk_pooling": "mean",
    }
    body["tokens"] = [1, 1]
    body["vectors"] = bytes(8 * body["dim"])
    result = decode_result(pack(body))
    assert isinstance(result, EmbedResult)
    assert result.chunk_pooling == "mean"
    assert list(unpack(encode_result(result)))[-3:] == ["chunks", "spans", "chunk_pooling"]
    with pytest.raises(SchemaError, match="needs 'chunks'"):
        decode_result(pack({k: v for k, v in body.items() if k not in ("chunks", "spans")}))
    with pytest.raises(SchemaError, match="expected 3"):
        decode_result(
            pack(
                {
                    **body,
                    "chunks": [2, 1],
                    "spans": [[0, 1], [1, 2], [0, 2]],
                    "chunk_pooling": "none",
                }
            )
        )
    with pytest.raises(SchemaError):
        decode_result(pack({**body, "chunk_pooling": "max"}))
