"""The checks of a message's fields, shared by the codec (requests and results) and the
catalog (model cards): each raises :class:`MistypedError` with what is wrong, which
:func:`field_value` turns into an ``invalid_request`` naming the field."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from schemas.encodings import Encoding
from schemas.errors import ErrorCode, SchemaError
from schemas.v1 import (
    CHUNK_POOLINGS,
    MAX_ID_BYTES,
    MAX_TOPIC_LENGTH,
    REQUEST_KINDS,
    TRUNCATION_DIRECTIONS,
    Chunking,
    Key,
    Span,
    Token,
    chunking_problem,
)

__all__ = [
    "ENCODING_NAMES",
    "MistypedError",
    "binary",
    "boolean",
    "chunk_counts",
    "chunk_pooling_name",
    "chunking_value",
    "direction",
    "encoding_value",
    "error_code",
    "fail",
    "field_value",
    "flag",
    "identifier",
    "ids_lists",
    "inputs_list",
    "int_list",
    "integer",
    "is_valid_topic",
    "check_docs",
    "input_keys",
    "keys_list",
    "kind_name",
    "meta_map",
    "non_empty",
    "non_negative",
    "one_of",
    "optional",
    "positive",
    "put",
    "required",
    "spans_list",
    "str_list",
    "string",
    "tokens_lists",
    "topic_name",
]

ENCODING_NAMES = frozenset(encoding.value for encoding in Encoding)
_TOPIC = re.compile(r"[A-Za-z0-9._-]+")
_T = TypeVar("_T")


def is_valid_topic(name: str) -> bool:
    return (
        0 < len(name) <= MAX_TOPIC_LENGTH
        and name not in (".", "..")
        and bool(_TOPIC.fullmatch(name))
    )


# ---------------------------------------------------------------------------- encoding


def put(body: dict[str, Any], key: str, value: object) -> None:
    """Set ``body[key]`` unless ``value`` is None (an optional field at its default)."""
    if value is not None:
        body[key] = value


def fail(message: str, index: int | None = None) -> NoReturn:
    raise SchemaError(ErrorCode.INVALID_REQUEST, message, index=index)


def required(
    body: dict[Any, Any], key: str, check: Callable[[object], _T], *, nil_is_missing: bool = False
) -> _T:
    """``body[key]`` checked by ``check``; absent: ``missing required field``. An explicit nil
    is checked like any value (so it is mistyped), or, with ``nil_is_missing``, missing (the
    catalog's cards, written by workers of other versions, may carry nil for absent)."""
    if key not in body or (nil_is_missing and body[key] is None):
        fail(f"missing required field {key!r}")
    return field_value(key, body[key], check)


def optional(body: dict[Any, Any], key: str, check: Callable[[object], _T]) -> _T | None:
    value = body.get(key)
    if value is None:  # an explicit nil means "absent", as in most msgpack peers
        return None
    return field_value(key, value, check)


def flag(body: dict[str, Any], key: str) -> bool:
    """An optional boolean that defaults to true."""
    value = optional(body, key, boolean)
    return True if value is None else value


def field_value(key: str, value: object, check: Callable[[object], _T]) -> _T:
    try:
        return check(value)
    except MistypedError as exc:
        fail(f"{key!r} {exc.args[0]}", index=exc.index)


class MistypedError(Exception):
    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


def integer(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MistypedError("must be an integer")
    return value


def non_negative(value: object) -> int:
    number = integer(value)
    if number < 0:
        raise MistypedError("must be >= 0")
    return number


def positive(value: object) -> int:
    number = integer(value)
    if number < 1:
        raise MistypedError("must be >= 1")
    return number


def boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise MistypedError("must be a boolean")
    return value


def string(value: object) -> str:
    if not isinstance(value, str):
        raise MistypedError("must be a string")
    return value


def non_empty(value: object) -> str:
    text = string(value)
    if not text:
        raise MistypedError("must not be empty")
    return text


def binary(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise MistypedError("must be binary")
    return value


def encoding_value(value: object) -> Encoding:
    text = string(value)
    if text not in ENCODING_NAMES:
        raise MistypedError(f"must be one of {', '.join(Encoding)}")
    return Encoding(text)


def one_of(choices: tuple[str, ...]) -> Callable[[object], str]:
    """The check of a string field that must be one of ``choices`` (exact)."""

    def check(value: object) -> str:
        text = string(value)
        if text not in choices:
            raise MistypedError(f"must be one of {', '.join(choices)}")
        return text

    return check


direction = one_of(TRUNCATION_DIRECTIONS)
kind_name = one_of(REQUEST_KINDS)
chunk_pooling_name = one_of(CHUNK_POOLINGS)


def error_code(value: str) -> ErrorCode | str:
    try:
        return ErrorCode(value)
    except ValueError:
        return value  # a code newer than this client: keep it, callers treat it as internal


def identifier(value: object) -> str:
    text = non_empty(value)
    if len(text.encode("utf-8")) > MAX_ID_BYTES:
        raise MistypedError(f"must be at most {MAX_ID_BYTES} bytes of UTF-8")
    return text


def topic_name(value: object) -> str:
    text = string(value)
    if not is_valid_topic(text):
        raise MistypedError("is not a valid Kafka topic name")
    return text


def inputs_list(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise MistypedError("must be an array of strings")
    if not value:
        raise MistypedError("must hold at least one input")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise MistypedError(f"[{index}] must be a string", index)
        if not item:
            raise MistypedError(f"[{index}] must not be empty", index)
    return tuple(value)


def str_list(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise MistypedError("must be an array of strings")
    return tuple(value)


def keys_list(value: object) -> tuple[Key, ...]:
    if not isinstance(value, list):
        raise MistypedError("must be an array")
    for index, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, str | int):
            raise MistypedError(f"[{index}] must be a string or an integer", index)
    return tuple(value)


def input_keys(body: dict[str, Any], inputs: int) -> tuple[Key, ...] | None:
    """A request's ``keys``, when given: exactly one per input."""
    keys = optional(body, "keys", keys_list)
    if keys is not None and len(keys) != inputs:
        fail(f"'keys' has {len(keys)} entries for {inputs} inputs")
    return keys


DOCS = "docs"
"""``meta["docs"]``: one item of metadata per input (see schemas/README.md)."""


def check_docs(meta: dict[str, Any] | None, inputs: int) -> None:
    """``meta["docs"]``, when present, holds exactly one map (or nil) per input."""
    docs = None if meta is None else meta.get(DOCS)
    if docs is None:
        return
    if not isinstance(docs, list):
        fail("'meta.docs' must be an array with one map per input")
    if len(docs) != inputs:
        fail(f"'meta.docs' has {len(docs)} entries for {inputs} inputs")
    for index, item in enumerate(docs):
        if item is not None and not (
            isinstance(item, dict) and all(isinstance(k, str) for k in item)
        ):
            fail(f"'meta.docs'[{index}] must be a map with string keys, or nil", index)


def int_list(value: object) -> list[int]:
    if not isinstance(value, list):
        raise MistypedError("must be an array of integers")
    return [integer(item) for item in value]


def ids_lists(value: object) -> tuple[tuple[int, ...], ...]:
    """A decode request's ``ids``: at least one sequence of token ids (each >= 0; a
    sequence may be empty). ``index``: the sequence at fault."""
    if not isinstance(value, list) or not value:
        raise MistypedError("must be an array of at least one array of token ids")
    sequences = []
    for index, sequence in enumerate(value):
        if not isinstance(sequence, list) or not all(
            isinstance(item, int) and not isinstance(item, bool) and item >= 0 for item in sequence
        ):
            raise MistypedError(f"[{index}] must be an array of integers >= 0", index)
        sequences.append(tuple(sequence))
    return tuple(sequences)


def tokens_lists(value: object) -> tuple[tuple[Token, ...], ...]:
    """A tokenize result's ``tokens``: per input, its tokens as
    ``[id, text, special, start, stop]`` (``start``/``stop`` nil for a special token)."""
    if not isinstance(value, list):
        raise MistypedError("must be an array with one array of tokens per input")
    out = []
    for index, tokens in enumerate(value):
        if not isinstance(tokens, list):
            raise MistypedError(f"[{index}] must be an array of tokens", index)
        out.append(tuple(_token(token, index) for token in tokens))
    return tuple(out)


def _token(token: object, index: int) -> Token:
    if isinstance(token, list) and len(token) == 5:
        token_id, text, special, start, stop = token
        offsets = (start, stop)
        if (
            isinstance(token_id, int)
            and isinstance(text, str)
            and isinstance(special, bool)
            and all(o is None or (isinstance(o, int) and not isinstance(o, bool)) for o in offsets)
        ):
            return (token_id, text, special, start, stop)
    raise MistypedError(f"[{index}] holds a token that is not [id, text, special, start, stop]")


def chunking_value(value: object) -> Chunking:
    if not isinstance(value, dict):
        raise MistypedError("must be a map with 'max_tokens' and optionally 'overlap_tokens'")
    unknown = sorted(str(key) for key in value if key not in ("max_tokens", "overlap_tokens"))
    if unknown:
        raise MistypedError(f"has unknown keys {', '.join(map(repr, unknown))}")
    if value.get("max_tokens") is None:
        raise MistypedError("must hold 'max_tokens'")
    overlap = value.get("overlap_tokens")
    overlap = 0 if overlap is None else overlap
    problem = chunking_problem(value["max_tokens"], overlap)
    if problem is not None:
        fail(problem)
    return Chunking(value["max_tokens"], overlap)


def chunk_counts(value: object) -> tuple[int, ...]:
    counts = int_list(value)
    if any(count < 1 for count in counts):
        raise MistypedError("must hold integers >= 1")
    return tuple(counts)


def spans_list(value: object) -> tuple[Span, ...]:
    if not isinstance(value, list):
        raise MistypedError("must be an array of [start, end] pairs")
    spans: list[Span] = []
    for index, item in enumerate(value):
        if not (isinstance(item, list) and len(item) == 2):
            raise MistypedError(f"[{index}] must be a [start, end] pair")
        start, end = integer(item[0]), integer(item[1])
        if not 0 <= start < end:
            raise MistypedError(f"[{index}] must have 0 <= start < end, not [{start}, {end}]")
        spans.append((start, end))
    return tuple(spans)


def meta_map(value: object) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise MistypedError("must be a map with string keys")
    return value
