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
    ]
    return [
        {"name": name, "kind": kind, "hex": pack(body).hex(), "value": as_json(body), "note": note}
        for name, kind, body, note in cases
    ]


def invalid_cases() -> list[dict[str, Any]]:
    ok = {"v": 1, "id": "bad-1", "inputs": ["text"], "reply_to": "my.replies"}
    invalid_utf8 = (
        b"\x83"  # map of 3
        + pack("v") + pack(1) + pack("id") + pack("bad-utf8") + pack("inputs")
        + b"\x91\xa2\xff\xfe"  # array of 1: a 2-byte str that is not UTF-8
    )  # fmt: skip
    bad, eid = "invalid_request", "bad-1"  # the usual code; the id the envelope keeps

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
    ]
    return [
        {"name": name, "hex": data.hex(), "code": code, "index": index, "envelope_id": envelope}
        for name, data, code, index, envelope in cases
    ]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, cases in (("valid", valid_cases()), ("invalid", invalid_cases())):
        text = json.dumps(cases, indent=2, ensure_ascii=False) + "\n"
        (OUT / f"{name}.json").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
