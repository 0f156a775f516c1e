"""The invalid messages of the golden vectors, and the routing cases (what a worker answers,
and where, for a record whose body or headers are wrong)."""

from __future__ import annotations

from typing import Any

from scripts.golden.common import (
    pack,
)
from scripts.golden.sparse import sparse_invalid_cases
from scripts.golden.tokenizer import tokenizer_invalid_cases


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
        *tokenizer_invalid_cases(),
        *sparse_invalid_cases(),
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
