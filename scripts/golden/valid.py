"""The valid messages of the golden vectors: requests and results of every encoding,
pooling, rerank and chunking case."""

from __future__ import annotations

import json
import struct
from typing import Any

from scripts.golden.common import (
    as_json,
    f32,
    int8_result,
    pack,
    pack_float32_meta,
    sign_bits,
)
from scripts.golden.sparse import sparse_valid_cases
from scripts.golden.tokenizer import tokenizer_valid_cases


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
        *tokenizer_valid_cases(),
        *sparse_valid_cases(),
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
