"""From a result message to database rows: pure, no Kafka, no database.

A result with vectors becomes one :class:`Row` per input: its id is the request's
``keys[i]`` (as text), its vector the float32 values whatever the wire ``dtype``, its
metadata the request's ``meta`` without ``docs``, merged with ``meta["docs"][i]``.
A chunked result (``chunks`` and ``spans``, one vector per chunk) becomes one row per
chunk: chunk ``k`` of input ``i`` is row ``{keys[i]}#{k}``, its metadata the input's plus
``doc_key``, ``chunk_index``, ``start_char`` and ``end_char``; the row also knows how many
chunks its document has now (``Row.chunks``). Every row knows its document
(``Row.doc_key``: the key as text), its chunk (``Row.chunk_index``, None for a row per
input) and its version (``Row.version``: ``requested_ms``, then the request id), so a store
can replace a document as a whole (schemas/README.md, "Ingestion conventions"); the
metadata is data and never decides what is written. A chunked result pooled to one vector
per input (the result's ``chunk_pooling`` ``mean``) is one row per input, as unchunked. A
key holding ``#`` is refused (``invalid_key``): row ids stay unambiguous. Anything else
that cannot be written becomes a :class:`Refused` with a code for the dead-letter topic.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kembed_shared.encodings import LAYOUTS, decode_scales, decode_vectors, to_float32
from schemas import (
    DecodeResult,
    EmbedResult,
    Encoding,
    ErrorResult,
    RerankResult,
    SchemaError,
    SparseResult,
    TokenizeResult,
    decode_result,
)

__all__ = [
    "CHUNK_POOLING_KEY",
    "DOCS_KEY",
    "KEY_SEPARATOR",
    "MAX_ID_BYTES",
    "Refused",
    "Row",
    "RowsOf",
    "jsonable",
    "newest",
    "rows_of",
]

_NOT_VECTORS: dict[type, str] = {
    RerankResult: "a rerank result holds scores",
    TokenizeResult: "a tokenize result holds tokens",
    DecodeResult: "a decode result holds texts",
    SparseResult: "a sparse result holds term weights (sinks do not write them yet)",
}

DOCS_KEY = "docs"
"""``meta[DOCS_KEY]``: per-input metadata, a list aligned with the request's inputs."""
CHUNK_POOLING_KEY = "chunk_pooling"
"""``meta[CHUNK_POOLING_KEY] == "mean"``: the producer asked for one vector per input. Only
needed to tell the two apart when every input is a single chunk (then ``count`` equals
both ``len(chunks)`` and ``len(spans)``); ``ingest()`` sets it with ``chunk_pooling="mean"``."""
MAX_ID_BYTES = 1024
"""Longest row id (UTF-8 bytes): a Milvus VARCHAR primary key needs a bound."""

# Sink dead-letter codes (besides the worker's error codes, for error results).
INVALID_RESULT = "invalid_result"
UNSUPPORTED_DTYPE = "unsupported_dtype"
MISSING_KEYS = "missing_keys"
INVALID_KEY = "invalid_key"
DIMENSION_MISMATCH = "dimension_mismatch"

Vector = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Row:
    id: str
    vector: Vector
    metadata: dict[str, Any]
    model: str
    requested_ms: int = 0
    """The row's version: when its request was produced (the result's ``requested_ms``,
    else the result record's timestamp). A store never replaces a row by an older one."""
    doc_key: str | None = None
    """The row's document: the request's key as text (None: the row's ``id``). A row per
    input is its document's only row; a chunk row is one of its document's rows."""
    chunks: int = 0
    """For a chunk row: how many chunks its document has in this version; 0 otherwise."""
    chunk_index: int | None = None
    """For a chunk row: its chunk's index (from 0); None for a row per input."""
    request_id: str = ""
    """The request that produced the row: of two versions with the same ``requested_ms``
    the one with the larger request id wins, for all of a document's rows."""

    @property
    def document(self) -> str:
        """The row's document key (its ``doc_key``, else its ``id``)."""
        return self.id if self.doc_key is None else self.doc_key

    @property
    def version(self) -> tuple[int, str]:
        """What orders two versions of a document: ``(requested_ms, request_id)``."""
        return (self.requested_ms, self.request_id)


@dataclass(frozen=True, slots=True)
class RowsOf:
    """The rows of one result, and what the result said about itself."""

    request_id: str
    model: str
    dim: int
    dtype: str
    rows: list[Row]


@dataclass(frozen=True, slots=True)
class Refused:
    """A message the sink does not write; it goes to the dead-letter topic with ``code``.

    ``error_result`` is true for results that are errors (the worker refused the input),
    false for messages the sink itself cannot use. ``keys`` are the row ids it would have
    had, for the log (never texts: results carry none)."""

    code: str
    message: str
    request_id: str | None = None
    keys: tuple[str, ...] = ()
    error_result: bool = False


def rows_of(value: bytes | None, record_ms: int = 0) -> RowsOf | Refused:
    """Decode one result message into rows, or say why it cannot be written.
    ``record_ms``: the message's Kafka timestamp, the rows' version when the result has no
    ``requested_ms`` (a worker that predates it)."""
    if value is None:
        return Refused(INVALID_RESULT, "empty message (no value)")
    try:
        result = decode_result(value)
    except SchemaError as exc:
        return Refused(INVALID_RESULT, f"not a valid result: {exc.message}")
    if isinstance(result, RerankResult | SparseResult | TokenizeResult | DecodeResult):
        return Refused(INVALID_RESULT, f"{_NOT_VECTORS[type(result)]}, not vectors", result.id)
    keys = tuple(str(key) for key in result.keys or ())
    if isinstance(result, ErrorResult):
        return Refused(
            str(result.error.code),
            result.error.message,
            request_id=result.id,
            keys=keys,
            error_result=True,
        )
    return _rows(result, keys, result.requested_ms or max(record_ms, 0))


def _rows(result: EmbedResult, keys: tuple[str, ...], version: int) -> RowsOf | Refused:
    def refuse(code: str, message: str) -> Refused:
        return Refused(code, message, request_id=result.id, keys=keys)

    if result.keys is None:
        return refuse(MISSING_KEYS, "the result has no keys: rows need ids (send keys=...)")
    meta = dict(result.meta or {})
    per_chunk = _per_chunk(result, meta.pop(CHUNK_POOLING_KEY, None) == "mean")
    if any(KEY_SEPARATOR in key for key in keys):
        return refuse(
            INVALID_KEY,
            f"a key holds {KEY_SEPARATOR!r}, which separates a document's key from its chunk "
            "index in row ids: use keys without it",
        )
    inputs = len(result.chunks) if result.chunks is not None else result.count
    if len(keys) != inputs:
        return refuse(INVALID_RESULT, f"{len(keys)} keys for {inputs} inputs")
    if result.chunks is not None and not per_chunk and result.count != inputs:
        return refuse(
            INVALID_RESULT,
            f"{result.count} vectors for {inputs} chunked inputs "
            f"({sum(result.chunks)} chunks, {len(result.spans or ())} spans)",
        )
    longest = _CHUNK_SUFFIX_BYTES + len(str(max(result.chunks or (1,)))) if per_chunk else 0
    too_long = next((k for k in keys if len(k.encode("utf-8")) + longest > MAX_ID_BYTES), None)
    if too_long is not None:
        return refuse(INVALID_KEY, f"a key is longer than {MAX_ID_BYTES} bytes")
    if LAYOUTS[Encoding(result.dtype)].floats is None:
        return refuse(
            UNSUPPORTED_DTYPE,
            "binary vectors are not written: the table holds float vectors (request "
            "float32, float16 or int8)",
        )
    docs = meta.pop(DOCS_KEY, None)
    if docs is not None and (not isinstance(docs, list) or len(docs) != inputs):
        size = len(docs) if isinstance(docs, list) else type(docs).__name__
        return refuse(INVALID_RESULT, f"meta.docs must be a list of {inputs}, got {size}")
    shared = jsonable(meta)
    vectors = float_vectors(result)
    if per_chunk:
        rows = _chunk_rows(result, keys, docs, shared, vectors, version)
    else:
        rows = [
            Row(
                key,
                vectors[index],
                _metadata(shared, docs, index),
                result.model,
                version,
                doc_key=key,
                request_id=result.id,
            )
            for index, key in enumerate(keys)
        ]
    return RowsOf(result.id, result.model, result.dim, str(result.dtype), rows)


KEY_SEPARATOR = "#"
"""Chunk ``k`` of key ``a`` is row ``a#k``: a key holding it is refused (``invalid_key``),
so a row id names one (document, chunk) and nothing else."""
_CHUNK_SUFFIX_BYTES = len(KEY_SEPARATOR)  # then the chunk index's digits


def _metadata(shared: dict[str, Any], docs: list[Any] | None, index: int) -> dict[str, Any]:
    """Input ``index``'s metadata: the request-level ``meta`` and ``meta["docs"][index]``."""
    metadata = dict(shared)
    doc = docs[index] if docs is not None else None
    if isinstance(doc, dict):
        metadata.update(jsonable(doc))
    elif doc is not None:
        metadata[DOCS_KEY] = jsonable(doc)
    return metadata


def _per_chunk(result: EmbedResult, pooled: bool) -> bool:
    """Whether a result holds one vector per chunk (else one per input). The result says
    (``chunk_pooling``); from a worker that predates it, told by the counts: when every
    input is one chunk they agree, and the producer's ``meta`` says ``mean``."""
    if result.chunks is None:
        return False
    if result.chunk_pooling is not None:
        return result.chunk_pooling == "none"
    chunks = sum(result.chunks)
    if result.count != chunks or len(result.spans or ()) != chunks:
        return False
    return not (pooled and result.count == len(result.chunks))


def _chunk_rows(
    result: EmbedResult,
    keys: tuple[str, ...],
    docs: list[Any] | None,
    shared: dict[str, Any],
    vectors: npt.NDArray[np.float32],
    version: int,
) -> list[Row]:
    """Row ``{keys[i]}#{k}`` per chunk ``k`` of input ``i``, with the chunk's metadata."""
    assert result.chunks is not None  # _per_chunk checked both
    assert result.spans is not None
    raw_keys = result.keys or ()
    rows = []
    position = 0
    for index, (key, count) in enumerate(zip(keys, result.chunks, strict=True)):
        metadata = _metadata(shared, docs, index)
        for chunk in range(count):
            start, end = result.spans[position]
            chunk_metadata = {
                **metadata,
                "doc_key": jsonable(raw_keys[index]),
                "chunk_index": chunk,
                "start_char": start,
                "end_char": end,
            }
            rows.append(
                Row(
                    f"{key}#{chunk}",
                    vectors[position],
                    chunk_metadata,
                    result.model,
                    version,
                    doc_key=key,
                    chunks=count,
                    chunk_index=chunk,
                    request_id=result.id,
                )
            )
            position += 1
    return rows


def newest(rows: Iterable[Row]) -> list[Row]:
    """The rows of each document's newest version, one per id, whatever the order of
    ``rows``. Versions are ordered by ``(requested_ms, request_id)``, so two results with
    the same ``requested_ms`` never mix: all of a document's rows come from one of them. Of
    rows with one id and one version the last is kept (a replay, or a later offset). A
    batch can hold two versions of a document, the older from another partition polled
    after the newer: a store that never replaces a document by an older version must be
    handed the newer, and only it (an older, longer version's extra chunks, or its other
    form, would otherwise come back)."""
    latest: dict[str, Row] = {}
    doc_version: dict[str, tuple[int, str]] = {}
    for row in rows:
        seen = doc_version.get(row.document)
        if seen is None or seen <= row.version:
            doc_version[row.document] = row.version
        if seen is None or seen <= row.version or row.id not in latest:
            latest[row.id] = row
    return [row for row in latest.values() if row.version == doc_version[row.document]]


def float_vectors(result: EmbedResult) -> npt.NDArray[np.float32]:
    """The result's vectors as float32, shape (count, dim): float16 widened, int8 codes
    times their scales. Binary has no float values (the caller refuses it)."""
    return to_float32(
        Encoding(result.dtype),
        decode_vectors(result, writable=False),  # to_float32 makes the one copy
        decode_scales(result),
        refusal="binary vectors have no float values",
    )


def jsonable(value: Any) -> Any:
    """msgpack data as JSON data: map keys as text, bytes as base64 text, non-finite floats
    as null (JSON and jsonb have no NaN)."""
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
