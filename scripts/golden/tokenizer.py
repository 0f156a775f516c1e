"""The golden vectors of tokenize and decode requests (``kind`` tokenize/decode) and their
results: the tokens of all-MiniLM-L6-v2's tokenizer, written out by hand."""

from __future__ import annotations

from typing import Any

from scripts.golden.common import pack

__all__ = ["tokenizer_invalid_cases", "tokenizer_valid_cases"]

_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def tokenizer_valid_cases() -> list[tuple[str, str, dict[str, Any], str]]:
    return [
        (
            "request-tokenize",
            "request",
            {"v": 1, "id": "req-20", "kind": "tokenize", "inputs": ["Héllo world"]},
            "a tokenize request with every option at its default: special tokens added, no prompt",
        ),
        (
            "result-tokenize",
            "result",
            {
                "v": 1,
                "id": "req-20",
                "kind": "tokenize",
                "model": _MODEL,
                "tokens": [
                    [
                        [101, "[CLS]", True, None, None],
                        [7592, "Héllo", False, 0, 6],
                        [2088, "world", False, 7, 12],
                        [102, "[SEP]", True, None, None],
                    ]
                ],
                "requested_ms": 1760000000000,
            },
            "the answer to request-tokenize: per input, [id, text, special, start, stop]; "
            "offsets in UTF-8 bytes ('é' is two), nil for special tokens",
        ),
        (
            "request-tokenize-options",
            "request",
            {
                "v": 1,
                "id": "req-21",
                "kind": "tokenize",
                "inputs": ["a", "b"],
                "model": "e5",
                "add_special_tokens": False,
                "prompt_name": "query",
            },
            "no special tokens; the model's prompt 'query' before each input (offsets then "
            "count from the prompt's start)",
        ),
        (
            "request-decode",
            "request",
            {"v": 1, "id": "req-22", "kind": "decode", "ids": [[101, 7592, 2088, 102], []]},
            "two sequences, the second empty; special tokens skipped (the default)",
        ),
        (
            "result-decode",
            "result",
            {
                "v": 1,
                "id": "req-22",
                "kind": "decode",
                "model": _MODEL,
                "texts": ["hello world", ""],
            },
            "the answer to request-decode: one text per sequence",
        ),
        (
            "request-decode-options",
            "request",
            {
                "v": 1,
                "id": "req-23",
                "kind": "decode",
                "ids": [[101, 102]],
                "model": "e5",
                "skip_special_tokens": False,
            },
            "special tokens kept: '[CLS] [SEP]'",
        ),
    ]


def tokenizer_invalid_cases() -> list[tuple[str, bytes, str, int | None, str | None]]:
    bad, eid = "invalid_request", "bad-1"
    tokenize = {"v": 1, "id": "bad-1", "kind": "tokenize", "inputs": ["a"]}
    decode = {"v": 1, "id": "bad-1", "kind": "decode", "ids": [[1]]}
    return [
        ("tokenize-no-inputs", pack({**tokenize, "inputs": []}), bad, None, eid),
        ("tokenize-empty-input", pack({**tokenize, "inputs": ["a", ""]}), bad, 1, eid),
        ("tokenize-special-not-bool", pack({**tokenize, "add_special_tokens": 1}), bad, None, eid),
        ("decode-without-ids", pack({**decode, "ids": None}), bad, None, eid),
        ("decode-no-sequences", pack({**decode, "ids": []}), bad, None, eid),
        ("decode-negative-id", pack({**decode, "ids": [[1], [2, -1]]}), bad, 1, eid),
        ("decode-id-not-integer", pack({**decode, "ids": [["7"]]}), bad, 0, eid),
        ("decode-skip-not-bool", pack({**decode, "skip_special_tokens": "no"}), bad, None, eid),
    ]
