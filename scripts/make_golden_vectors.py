"""Writes the golden test vectors of wire format v1 (schemas/vectors/v1/*.json).

Run only when the wire format changes on purpose: the vectors are the contract that every
client, in every language, is tested against. Valid messages are produced by hand-built
maps in canonical order (not by the codec under test), so the codec is checked against
them, not the other way round.

    python -m scripts.make_golden_vectors
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import msgpack

OUT = Path(__file__).resolve().parents[1] / "schemas" / "vectors" / "v1"


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


def encoding_cases() -> list[tuple[str, str, dict[str, Any], str]]:
    """Requests with an ``encoding`` and results in each non-default encoding."""
    halves = [0.5, -1.0, 0.25, 1.5, 0.0, -0.125]
    unit = [[0.6, 0.8, 0.0], [0.0, -1.0, 0.0]]
    raw = [[3.0, -4.0, 1.0], [0.5, 0.25, -0.125]]
    signs = [
        [0.5, -1.0, 0.25, 0.0, -0.1, 0.3, 0.2, -0.4, 0.9, -0.2],
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
    ]

    return [
        (
            "request-encoding-int8",
            "request",
            {"v": 1, "id": "req-5", "inputs": ["hello"], "dimensions": 64, "encoding": "int8"},
            "64 dimensions, re-normalized, then quantized to int8",
        ),
        (
            "request-encoding-binary",
            "request",
            {"v": 1, "id": "req-6", "inputs": ["hello"], "normalize": False, "encoding": "binary"},
            "",
        ),
        (
            "request-all-fields-encoding",
            "request",
            {
                "v": 1,
                "id": "7c9e6679-7425-40de-944b-e07fc1f90ae7",
                "inputs": ["first passage", "second passage"],
                "model": "sentence-transformers/all-MiniLM-L6-v2",
                "normalize": False,
                "truncate": False,
                "dimensions": 128,
                "encoding": "float16",
                "prompt": "passage: ",
                "deadline_ms": 1767225600000,
                "reply_to": "embed.results.docs",
                "reply_partition": 3,
                "keys": ["doc-1", 2],
                "meta": {"source": "crawler", "batch": 7},
            },
            "every request field, encoding in its canonical place after dimensions",
        ),
        (
            "result-float16",
            "result",
            {
                "v": 1,
                "id": "req-7",
                "model": "sentence-transformers/all-MiniLM-L6-v2",
                "dim": 3,
                "dtype": "float16",
                "vectors": struct.pack("<6e", *halves),
                "tokens": [4, 7],
            },
            "2 x 3 float16, little-endian: " + json.dumps(halves),
        ),
        (
            "result-int8-normalized",
            "result",
            int8_result("req-8", unit, normalized=True),
            "normalized rows " + json.dumps(unit) + ": codes rint(x / scale), "
            "every scale float32(1/127)",
        ),
        (
            "result-int8-unnormalized",
            "result",
            int8_result("req-9", raw, normalized=False),
            "unnormalized rows " + json.dumps(raw) + ": scale float32(max|x| / 127), "
            "codes rint(x / scale), half to even",
        ),
        (
            "result-binary",
            "result",
            {
                "v": 1,
                "id": "req-10",
                "model": "sentence-transformers/all-MiniLM-L6-v2",
                "dim": 10,
                "dtype": "binary",
                "vectors": b"".join(sign_bits(row) for row in signs),
                "tokens": [4, 7],
            },
            "2 x 10 sign bits, 2 bytes per row, most significant bit first, padding 0: "
            + json.dumps(signs),
        ),
    ]


def valid_cases() -> list[dict[str, Any]]:
    vectors = [0.5, -1.0, 0.25, 1.5, 0.0, -0.125]
    blob = struct.pack("<6f", *vectors)
    cases: list[tuple[str, str, dict[str, Any], str]] = [
        ("request-minimal", "request", {"v": 1, "id": "req-1", "inputs": ["hello"]}, ""),
        (
            "request-all-fields",
            "request",
            {
                "v": 1,
                "id": "0f8fad5b-d9cb-469f-a165-70867728950e",
                "inputs": ["first passage", "second passage"],
                "model": "sentence-transformers/all-MiniLM-L6-v2",
                "normalize": False,
                "truncate": False,
                "dimensions": 128,
                "prompt": "passage: ",
                "deadline_ms": 1767225600000,
                "reply_to": "embed.results.docs",
                "reply_partition": 3,
                "keys": ["doc-1", 2],
                "meta": {"source": "crawler", "batch": 7},
            },
            "",
        ),
        (
            "request-named-prompt-left-truncation",
            "request",
            {
                "v": 1,
                "id": "req-6",
                "inputs": ["how do I reset my password"],
                "truncation_direction": "left",
                "prompt_name": "query",
            },
            "",
        ),
        (
            "request-unicode",
            "request",
            {"v": 1, "id": "req-ü", "inputs": ["一个女孩正在梳头。", "emoji 🙂 ok"]},
            "",
        ),
        (
            "result-vectors",
            "result",
            {
                "v": 1,
                "id": "req-2",
                "model": "sentence-transformers/all-MiniLM-L6-v2",
                "dim": 3,
                "dtype": "float32",
                "vectors": blob,
                "tokens": [4, 7],
                "keys": ["doc-1", "doc-2"],
                "meta": {"source": "crawler"},
            },
            "2 x 3 float32, little-endian: " + json.dumps(vectors),
        ),
        (
            "result-vectors-with-version",
            "result",
            {
                "v": 1,
                "id": "req-7",
                "model": "sentence-transformers/all-MiniLM-L6-v2",
                "dim": 2,
                "dtype": "float32",
                "vectors": struct.pack("<2f", 0.6, 0.8),
                "tokens": [5],
                "requested_ms": 1767225600123,
                "keys": ["doc-9"],
            },
            "1 x 2 float32 [0.6, 0.8], requested at 1767225600123 ms",
        ),
        (
            "result-error-with-index",
            "result",
            {
                "v": 1,
                "id": "req-3",
                "error": {
                    "code": "input_too_long",
                    "message": "input exceeds the model's maximum of 256 tokens",
                    "index": 1,
                },
            },
            "",
        ),
        (
            "result-error",
            "result",
            {
                "v": 1,
                "id": "req-4",
                "error": {"code": "unknown_model", "message": "model not served here"},
            },
            "",
        ),
        *encoding_cases(),
        *later_valid_cases(),
    ]
    return [
        {
            "name": name,
            "kind": kind,
            "hex": pack_float32_meta(body).hex() if name in FLOAT32_META else pack(body).hex(),
            "value": as_json(body),
            "note": note,
        }
        for name, kind, body, note in cases
    ]


# Vectors whose `meta` floats are written as msgpack float32, as a client may write them.
FLOAT32_META = ("request-meta-float32", "result-meta-float32")


def pack_float32_meta(body: dict[str, Any]) -> bytes:
    """``body`` packed like pack(), but the floats in its ``meta`` as msgpack float32."""
    packer = msgpack.Packer(use_bin_type=True)
    singles = msgpack.Packer(use_bin_type=True, use_single_float=True)
    parts = [packer.pack_map_header(len(body))]
    for key, value in body.items():
        parts += [packer.pack(key), (singles if key == "meta" else packer).pack(value)]
    return b"".join(parts)


def later_valid_cases() -> list[tuple[str, str, dict[str, Any], str]]:
    """Valid messages added after the first release of v1 (appended, never reordered)."""
    near_tie = [
        [0.625984251499176, 0.7798357009887695, 0.0],
        [-0.625984251499176, 0.0, 0.7798357009887695],
    ]
    meta = {"source": "crawler", "score": f32(0.1)}
    return [
        (
            "result-int8-normalized-near-tie",
            "result",
            int8_result("req-11", near_tie, normalized=True),
            "normalized rows " + json.dumps(near_tie) + ": codes rint(x / scale) with "
            "scale float32(1/127), so 0.625984251499176 codes as 80 (rint(x * 127) would "
            "give 79)",
        ),
        (
            "request-meta-float32",
            "request",
            {"v": 1, "id": "req-12", "inputs": ["hello"], "meta": meta},
            "meta.score is a msgpack float32 (0xca); a worker copies meta byte for byte",
        ),
        (
            "result-meta-float32",
            "result",
            {
                "v": 1,
                "id": "req-12",
                "model": "sentence-transformers/all-MiniLM-L6-v2",
                "dim": 2,
                "dtype": "float32",
                "vectors": struct.pack("<2f", 0.6, 0.8),
                "tokens": [3],
                "meta": meta,
            },
            "the answer to request-meta-float32: its meta bytes unchanged, float32 included",
        ),
        *chunking_cases(),
        *rerank_cases(),
        *pooling_cases(),
    ]


def pooling_cases() -> list[tuple[str, str, dict[str, Any], str]]:
    """Chunked results that say their ``chunk_pooling``: every input one chunk, so the
    counts alone cannot tell one vector per chunk from one per input."""

    def result(request_id: str, pooling: str) -> dict[str, Any]:
        return {
            "v": 1,
            "id": request_id,
            "model": "sentence-transformers/all-MiniLM-L6-v2",
            "dim": 2,
            "dtype": "float32",
            "vectors": struct.pack("<4f", 0.6, 0.8, 1.0, 0.0),
            "tokens": [9, 3],
            "keys": ["doc-1", "doc-2"],
            "chunks": [1, 1],
            "spans": [[0, 30], [0, 5]],
            "chunk_pooling": pooling,
        }

    return [
        (
            "result-chunks-pooling-none",
            "result",
            result("req-18", "none"),
            "two inputs of one chunk each, one vector per chunk: a sink writes rows "
            "doc-1#0 and doc-2#0",
        ),
        (
            "result-chunks-pooling-mean",
            "result",
            result("req-19", "mean"),
            "the same counts, one vector per input (the request's chunk_pooling mean): a "
            "sink writes rows doc-1 and doc-2",
        ),
    ]


def rerank_cases() -> list[tuple[str, str, dict[str, Any], str]]:
    """Rerank requests (``kind`` rerank) and their results."""
    scores = [0.25, 0.875, 0.5]  # exact in float32
    return [
        (
            "request-rerank",
            "request",
            {
                "v": 1,
                "id": "req-15",
                "kind": "rerank",
                "query": "what is kafka?",
                "documents": ["a log", "a distributed event log", "a novelist"],
            },
            "a rerank request with every option at its default: all documents in 'order', "
            "activated scores, no documents returned",
        ),
        (
            "result-rerank",
            "result",
            {
                "v": 1,
                "id": "req-15",
                "kind": "rerank",
                "model": "cross-encoder/ms-marco-MiniLM-L-6-v2",
                "scores": struct.pack("<3f", *scores),
                "order": [1, 2, 0],
                "tokens": [9, 12, 9],
                "requested_ms": 1760000000000,
            },
            "the answer to request-rerank: scores " + json.dumps(scores) + " as "
            "little-endian float32, in the documents' order; 'order' highest first",
        ),
        (
            "request-rerank-options",
            "request",
            {
                "v": 1,
                "id": "req-16",
                "kind": "rerank",
                "query": "what is kafka?",
                "documents": ["a log", "a distributed event log", "a novelist"],
                "model": "reranker",
                "top_n": 2,
                "return_documents": True,
                "raw_scores": True,
                "truncate": False,
                "truncation_direction": "left",
                "deadline_ms": 1760000000000,
                "reply_to": "embed.results.app",
                "reply_partition": 1,
                "meta": {"trace": "t-1"},
            },
            "every optional field, in canonical order",
        ),
        (
            "result-rerank-documents",
            "result",
            {
                "v": 1,
                "id": "req-16",
                "kind": "rerank",
                "model": "reranker",
                "scores": struct.pack("<3f", -1.5, 2.0, 2.0),
                "order": [1, 2],
                "tokens": [9, 12, 9],
                "documents": ["a distributed event log", "a novelist"],
                "meta": {"trace": "t-1"},
            },
            "the answer to request-rerank-options: raw scores [-1.5, 2.0, 2.0]; top_n 2; "
            "the tie between documents 1 and 2 goes to the lower index; the texts of "
            "'order', in its order",
        ),
    ]


def chunking_cases() -> list[tuple[str, str, dict[str, Any], str]]:
    """Requests with ``chunking`` and their results (one row per chunk, or per input)."""
    text = "First sentence. Second one, a little longer.\nThird line"
    spans = [[0, 44], [16, 55], [0, 5]]  # text[0:44], text[16:55] and "short"[0:5]
    rows = [[0.6, 0.8], [0.0, 1.0], [1.0, 0.0]]
    chunk_rows = struct.pack("<6f", *(x for row in rows for x in row))
    mean = [f32(0.3 / 0.9486832980505138), f32(0.9 / 0.9486832980505138)]
    result = {
        "v": 1,
        "id": "req-13",
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "dim": 2,
        "dtype": "float32",
    }
    return [
        (
            "request-chunking",
            "request",
            {
                "v": 1,
                "id": "req-13",
                "inputs": [text, "short"],
                "keys": ["doc-1", "doc-2"],
                "chunking": {"max_tokens": 16, "overlap_tokens": 4},
            },
            "windows of at most 16 tokens (special tokens included), 4 tokens of overlap",
        ),
        (
            "result-chunks",
            "result",
            {
                **result,
                "vectors": chunk_rows,
                "tokens": [14, 13, 3],
                "keys": ["doc-1", "doc-2"],
                "chunks": [2, 1],
                "spans": spans,
            },
            "the answer to request-chunking: input 0 in 2 chunks, input 1 in 1; one row "
            "per chunk: " + json.dumps(rows),
        ),
        (
            "request-chunking-mean",
            "request",
            {
                "v": 1,
                "id": "req-14",
                "inputs": [text, "short"],
                "chunking": {"max_tokens": 16},
                "chunk_pooling": "mean",
            },
            "no overlap (0, left out); one vector per input, the mean of its chunks",
        ),
        (
            "result-chunks-mean",
            "result",
            {
                **result,
                "id": "req-14",
                "vectors": struct.pack("<4f", *mean, *rows[2]),
                "tokens": [27, 3],
                "chunks": [2, 1],
                "spans": spans,
            },
            "the answer to request-chunking-mean: one row per input, input 0 the "
            "re-normalized mean of " + json.dumps(rows[:2]) + ", tokens the sum per input",
        ),
    ]


def invalid_cases() -> list[dict[str, Any]]:
    ok = {"v": 1, "id": "bad-1", "inputs": ["text"], "reply_to": "my.replies"}
    invalid_utf8 = (
        b"\x83"  # map of 3
        + pack("v") + pack(1) + pack("id") + pack("bad-utf8") + pack("inputs")
        + b"\x91\xa2\xff\xfe"  # array of 1: a 2-byte str that is not UTF-8
    )  # fmt: skip
    bad, eid = "invalid_request", "bad-1"  # the usual code; the id the envelope keeps
    rerank = {
        "v": 1,
        "id": "bad-1",
        "kind": "rerank",
        "query": "q",
        "documents": ["d"],
        "reply_to": "my.replies",
    }

    def without(key: str) -> bytes:
        return pack({k: v for k, v in ok.items() if k != key})

    cases: list[tuple[str, bytes, str, int | None, str | None]] = [
        ("not-msgpack", b"\xc1", bad, None, None),
        ("truncated-msgpack", pack(ok)[:-3], bad, None, None),
        ("trailing-bytes", pack(ok) + b"\x00", bad, None, None),
        ("not-a-map", pack(["text"]), bad, None, None),
        ("missing-v", without("v"), bad, None, eid),
        ("newer-version", pack({**ok, "v": 2}), "unsupported_version", None, eid),
        ("version-zero", pack({**ok, "v": 0}), bad, None, eid),
        ("missing-id", without("id"), bad, None, None),
        ("empty-id", pack({**ok, "id": ""}), bad, None, None),
        ("id-too-long", pack({**ok, "id": "x" * 257}), bad, None, None),
        ("id-not-string", pack({**ok, "id": 42}), bad, None, None),
        ("missing-inputs", without("inputs"), bad, None, eid),
        ("inputs-not-array", pack({**ok, "inputs": "text"}), bad, None, eid),
        ("inputs-empty", pack({**ok, "inputs": []}), bad, None, eid),
        ("input-not-string", pack({**ok, "inputs": ["a", 7]}), bad, 1, eid),
        ("input-empty-string", pack({**ok, "inputs": [""]}), bad, 0, eid),
        ("input-invalid-utf8", invalid_utf8, bad, 0, "bad-utf8"),
        ("normalize-not-bool", pack({**ok, "normalize": 1}), bad, None, eid),
        ("dimensions-zero", pack({**ok, "dimensions": 0}), bad, None, eid),
        ("deadline-negative", pack({**ok, "deadline_ms": -1}), bad, None, eid),
        ("reply-to-invalid-topic", pack({**ok, "reply_to": "bad topic!"}), bad, None, eid),
        ("reply-partition-negative", pack({**ok, "reply_partition": -1}), bad, None, eid),
        ("keys-length-mismatch", pack({**ok, "keys": ["a", "b"]}), bad, None, eid),
        ("meta-not-map", pack({**ok, "meta": [1]}), bad, None, eid),
        ("encoding-unknown", pack({**ok, "encoding": "float64"}), bad, None, eid),
        ("encoding-wrong-case", pack({**ok, "encoding": "INT8"}), bad, None, eid),
        ("encoding-empty", pack({**ok, "encoding": ""}), bad, None, eid),
        ("encoding-not-string", pack({**ok, "encoding": 8}), bad, None, eid),
        (
            "truncation-direction-unknown",
            pack({**ok, "truncation_direction": "up"}),
            bad,
            None,
            eid,
        ),
        (
            "prompt-and-prompt-name",
            pack({**ok, "prompt": "q: ", "prompt_name": "q"}),
            bad,
            None,
            eid,
        ),
        ("prompt-name-empty", pack({**ok, "prompt_name": ""}), bad, None, eid),
        ("version-negative", pack({**ok, "v": -1}), bad, None, eid),
        ("version-not-integer", pack({**ok, "v": "1"}), bad, None, eid),
        ("meta-docs-length-mismatch", pack({**ok, "meta": {"docs": [{}, {}]}}), bad, None, eid),
        ("meta-docs-not-array", pack({**ok, "meta": {"docs": {"title": "x"}}}), bad, None, eid),
        ("meta-docs-item-not-map", pack({**ok, "meta": {"docs": ["title"]}}), bad, 0, eid),
        ("chunking-not-map", pack({**ok, "chunking": 128}), bad, None, eid),
        ("chunking-without-max-tokens", pack({**ok, "chunking": {}}), bad, None, eid),
        ("chunking-max-tokens-zero", pack({**ok, "chunking": {"max_tokens": 0}}), bad, None, eid),
        (
            "chunking-unknown-key",
            pack({**ok, "chunking": {"max_tokens": 64, "stride": 8}}),
            bad,
            None,
            eid,
        ),
        (
            "chunking-overlap-not-below-window",
            pack({**ok, "chunking": {"max_tokens": 64, "overlap_tokens": 64}}),
            bad,
            None,
            eid,
        ),
        ("chunk-pooling-without-chunking", pack({**ok, "chunk_pooling": "mean"}), bad, None, eid),
        (
            "chunk-pooling-unknown",
            pack({**ok, "chunking": {"max_tokens": 64}, "chunk_pooling": "max"}),
            bad,
            None,
            eid,
        ),
        ("kind-unknown", pack({**ok, "kind": "classify"}), bad, None, eid),
        ("rerank-without-query", pack({**rerank, "query": None}), bad, None, eid),
        ("rerank-empty-query", pack({**rerank, "query": ""}), bad, None, eid),
        ("rerank-without-documents", pack({**rerank, "documents": None}), bad, None, eid),
        ("rerank-no-documents", pack({**rerank, "documents": []}), bad, None, eid),
        ("rerank-empty-document", pack({**rerank, "documents": ["a", ""]}), bad, 1, eid),
        ("rerank-document-not-string", pack({**rerank, "documents": ["a", 7]}), bad, 1, eid),
        ("rerank-top-n-zero", pack({**rerank, "top_n": 0}), bad, None, eid),
        ("rerank-raw-scores-not-bool", pack({**rerank, "raw_scores": 1}), bad, None, eid),
        # An overlap of more than half the window (max_tokens // 2): each chunk would bring
        # few new tokens, so a short text would make many chunks.
        (
            "chunking-overlap-over-half",
            pack({**ok, "chunking": {"max_tokens": 256, "overlap_tokens": 129}}),
            bad,
            None,
            eid,
        ),
    ]
    return [
        {"name": name, "hex": data.hex(), "code": code, "index": index, "envelope_id": envelope}
        for name, data, code, index, envelope in cases
    ]


def routing_cases() -> list[dict[str, Any]]:
    """What a worker with the default settings (results topic ``embed.results``, reply
    topics ``embed\\.results(\\..+)?``) does with a request, headers included."""
    minimal = {"v": 1, "id": "route-1", "inputs": ["text"]}

    def headers(
        request_id: str | None = None, topic: str | None = None, partition: int | None = None
    ) -> list[list[str]]:
        found = []
        if request_id is not None:
            found.append(["kafka_correlationId", request_id.encode().hex()])
        if topic is not None:
            found.append(["kafka_replyTopic", topic.encode().hex()])
        if partition is not None:
            found.append(["kafka_replyPartition", partition.to_bytes(4, "big").hex()])
        return found

    def answer(
        reply_to: str | None, partition: int | None, code: str | None = None, rid: str = "route-1"
    ) -> dict[str, Any]:
        return {
            "outcome": "answer",
            "code": code,
            "id": rid,
            "reply_to": reply_to,
            "reply_partition": partition,
        }

    def dead_letter(code: str) -> dict[str, Any]:
        return {"outcome": "dead_letter", "code": code}

    docs = "embed.results.docs"
    long_id = "x" * 257
    cases: list[tuple[str, bytes, list[list[str]], dict[str, Any], str]] = [
        ("no-routing", pack(minimal), [], answer(None, None), "the results topic, by key"),
        (
            "headers-give-topic-and-partition",
            pack(minimal),
            headers("route-1", "embed.results.spring", 1),
            answer("embed.results.spring", 1),
            "a body without reply_to and reply_partition takes both from the headers",
        ),
        (
            "headers-give-partition",
            pack({**minimal, "reply_to": docs}),
            headers("route-1", docs, 3),
            answer(docs, 3),
            "the header partition goes with its topic, which the body names too",
        ),
        (
            "header-partition-of-another-topic",
            pack({**minimal, "reply_to": docs}),
            headers("route-1", "embed.results.other", 3),
            answer(docs, None),
            "the body names another topic than the header: the header partition is not used",
        ),
        (
            "body-wins",
            pack({**minimal, "reply_to": docs, "reply_partition": 0}),
            headers("other-id", "embed.results.other", 5),
            answer(docs, 0),
            "body fields win over headers where both are present",
        ),
        (
            "unreadable-body-headers-answer",
            b"\xc1",
            headers("route-2", docs, 2),
            answer(docs, 2, "invalid_request", "route-2"),
            "an unreadable body is answered where the headers say",
        ),
        (
            "results-topic-named",
            pack({**minimal, "reply_to": "embed.results"}),
            [],
            answer("embed.results", None),
            "",
        ),
        (
            "reply-to-forbidden",
            pack({**minimal, "reply_to": "orders"}),
            [],
            dead_letter("reply_forbidden"),
            "not computed, nothing written to orders",
        ),
        (
            "reply-to-lookalike-forbidden",
            pack({**minimal, "reply_to": "embed.resultsX"}),
            [],
            dead_letter("reply_forbidden"),
            "the pattern must match the whole name",
        ),
        (
            "header-reply-topic-forbidden",
            pack(minimal),
            headers("route-1", "orders"),
            dead_letter("reply_forbidden"),
            "a reply topic from the headers is held to the same rule",
        ),
        (
            "invalid-request-to-forbidden-topic",
            pack({**minimal, "inputs": [], "reply_to": "orders"}),
            [],
            dead_letter("reply_forbidden"),
            "not even an error result is written to a forbidden topic",
        ),
        (
            "id-too-long",
            pack({**minimal, "id": long_id}),
            headers(long_id, docs),
            dead_letter("invalid_request"),
            "an id over 256 bytes is never echoed: not from the body, not from the header",
        ),
        (
            "version-zero",
            pack({**minimal, "v": 0}),
            [],
            answer(None, None, "invalid_request"),
            "v below 1 is invalid_request (above 1: unsupported_version)",
        ),
    ]
    return [
        {"name": name, "hex": data.hex(), "headers": found, **outcome, "note": note}
        for name, data, found, outcome, note in cases
    ]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    files = (("valid", valid_cases()), ("invalid", invalid_cases()), ("routing", routing_cases()))
    for name, cases in files:
        text = json.dumps(cases, indent=2, ensure_ascii=False) + "\n"
        (OUT / f"{name}.json").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
