"""Golden vectors of the sparse kind: sparse requests (``kind`` sparse) and their results
(term weights as ascending uint32 vocabulary ids and float32 weights, per input)."""

from __future__ import annotations

import struct
from typing import Any

from scripts.golden.common import pack

__all__ = ["sparse_invalid_cases", "sparse_valid_cases"]

_OK = {"v": 1, "id": "bad-1", "kind": "sparse", "inputs": ["text"], "reply_to": "my.replies"}


def sparse_valid_cases() -> list[tuple[str, str, dict[str, Any], str]]:
    weights = [0.5, 1.25, 2.0, 0.75]  # exact in float32
    return [
        (
            "request-sparse",
            "request",
            {"v": 1, "id": "req-30", "kind": "sparse", "inputs": ["what is kafka?", "a log"]},
            "a sparse request with every option at its default: every nonzero weight, the "
            "model's truncation side, no prompt",
        ),
        (
            "result-sparse",
            "result",
            {
                "v": 1,
                "id": "req-30",
                "kind": "sparse",
                "model": "naver/splade-v3",
                "vocab": 30522,
                "counts": [3, 1],
                "indices": struct.pack("<4I", 2003, 2054, 8833, 2009),
                "values": struct.pack("<4f", *weights),
                "tokens": [6, 4],
                "requested_ms": 1760000000000,
            },
            "the answer to request-sparse: input 0 has 3 weights (ids 2003, 2054, 8833), "
            "input 1 has 1 (id 2009); ids little-endian uint32, ascending within an input, "
            "weights little-endian float32 [0.5, 1.25, 2.0] and [0.75]",
        ),
        (
            "request-sparse-options",
            "request",
            {
                "v": 1,
                "id": "req-31",
                "kind": "sparse",
                "inputs": ["what is kafka?"],
                "model": "splade",
                "truncate": False,
                "truncation_direction": "left",
                "prompt_name": "query",
                "top_k": 64,
                "deadline_ms": 1760000000000,
                "reply_to": "embed.results.app",
                "reply_partition": 1,
                "meta": {"trace": "t-1"},
            },
            "every optional field, in canonical order ('prompt' and 'prompt_name' are "
            "exclusive, as for embed requests)",
        ),
        (
            "result-sparse-empty",
            "result",
            {
                "v": 1,
                "id": "req-31",
                "kind": "sparse",
                "model": "splade",
                "vocab": 30522,
                "counts": [0],
                "indices": b"",
                "values": b"",
                "tokens": [7],
                "meta": {"trace": "t-1"},
            },
            "an input whose every weight is zero: count 0, nothing in 'indices' and 'values'",
        ),
        (
            "request-sparse-keys",
            "request",
            {
                "v": 1,
                "id": "req-32",
                "kind": "sparse",
                "inputs": ["kafka is a log", "pgvector stores vectors"],
                "keys": ["doc-1", 2],
                "reply_to": "embed.ingest.sparse",
                "meta": {"source": "wiki", "docs": [{"lang": "en"}, None]},
            },
            "a sparse request for a sink: one key per input (string or integer) after "
            "'top_k', per-input metadata in meta['docs'], as for embed requests",
        ),
        (
            "result-sparse-keys",
            "result",
            {
                "v": 1,
                "id": "req-32",
                "kind": "sparse",
                "model": "splade",
                "vocab": 30522,
                "counts": [2, 1],
                "indices": struct.pack("<3I", 6758, 8833, 13957),
                "values": struct.pack("<3f", *weights[:3]),
                "tokens": [6, 6],
                "requested_ms": 1760000000000,
                "keys": ["doc-1", 2],
                "meta": {"source": "wiki", "docs": [{"lang": "en"}, None]},
            },
            "the answer to request-sparse-keys: the request's keys and meta copied after "
            "'requested_ms'; input 0 has ids 6758 and 8833, input 1 has id 13957",
        ),
    ]


def sparse_invalid_cases() -> list[tuple[str, bytes, str, int | None, str | None]]:
    bad, eid = "invalid_request", "bad-1"
    return [
        ("sparse-without-inputs", pack({**_OK, "inputs": None}), bad, None, eid),
        ("sparse-empty-input", pack({**_OK, "inputs": ["a", ""]}), bad, 1, eid),
        ("sparse-top-k-zero", pack({**_OK, "top_k": 0}), bad, None, eid),
        (
            "sparse-prompt-and-prompt-name",
            pack({**_OK, "prompt": "query: ", "prompt_name": "query"}),
            bad,
            None,
            eid,
        ),
        ("sparse-keys-count", pack({**_OK, "keys": ["a", "b"]}), bad, None, eid),
        (
            "sparse-docs-misaligned",
            pack({**_OK, "meta": {"docs": [{"lang": "en"}, {"lang": "de"}]}}),
            bad,
            None,
            eid,
        ),
    ]
