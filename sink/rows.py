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

A sparse result (term weights) becomes one row per input whose ``vector`` is a
:class:`SparseVector` (``Row.kind`` ``"sparse"``), its id the key as for a dense row per
input: a store that keeps both kinds writes the two into one row, each kind at its own
version (a document's dense and sparse versions are independent).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

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
    "VectorKind",
    "Refused",
    "Row",
    "RowsOf",
    "SparseVector",
    "jsonable",
    "newest",
    "rows_of",
]

_NOT_VECTORS: dict[type, str] = {
    RerankResult: "a rerank result holds scores",
    TokenizeResult: "a tokenize result holds tokens",
    DecodeResult: "a decode result holds texts",
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
VectorKind = Literal["dense", "sparse"]
"""What a row's vector is: dense (float32 values) or sparse (term ids and weights)."""


@dataclass(frozen=True, slots=True, eq=False)
class SparseVector:
    """A sparse vector: ``indices`` (int32, ascending, each below ``size``) and their
    nonzero float32 ``values``; ``size`` is the dimension (the vocabulary's size)."""

    indices: npt.NDArray[np.int32]
    values: npt.NDArray[np.float32]
    size: int

    def __len__(self) -> int:
        return len(self.indices)


@dataclass(frozen=True, slots=True)
class Row:
    id: str
    vector: Vector | SparseVector
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

    @property
    def kind(self) -> VectorKind:
        """``"sparse"`` for a row of term weights, ``"dense"`` otherwise."""
        return "sparse" if isinstance(self.vector, SparseVector) else "dense"

    @property
    def dense(self) -> Vector:
        """The dense vector (a dense row's only)."""
        assert not isinstance(self.vector, SparseVector), "a sparse row"
        return self.vector

    @property
    def sparse(self) -> SparseVector:
        """The sparse vector (a sparse row's only)."""
        assert isinstance(self.vector, SparseVector), "a dense row"
        return self.vector


@dataclass(frozen=True, slots=True)
class RowsOf:
    """The rows of one result, and what the result said about itself."""

    request_id: str
    model: str
    dim: int
    """The vectors' dimension: a sparse result's vocabulary size."""
    dtype: str
    rows: list[Row]
    kind: VectorKind = "dense"


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
    if isinstance(result, RerankResult | TokenizeResult | DecodeResult):
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
    version = result.requested_ms or max(record_ms, 0)
    if isinstance(result, SparseResult):
        return _sparse_rows(result, keys, version)
    return _rows(result, keys, version)


def _key_refusal(
    result: EmbedResult | SparseResult, keys: tuple[str, ...], inputs: int, suffix_bytes: int
) -> tuple[str, str] | None:
    """Why the result's keys cannot be row ids, if they cannot: (code, message)."""
    if result.keys is None:
        return MISSING_KEYS, "the result has no keys: rows need ids (send keys=...)"
    if any(KEY_SEPARATOR in key for key in keys):
        return (
            INVALID_KEY,
            f"a key holds {KEY_SEPARATOR!r}, which separates a document's key from its chunk "
            "index in row ids: use keys without it",
        )
    if len(keys) != inputs:
        return INVALID_RESULT, f"{len(keys)} keys for {inputs} inputs"
    if any(len(k.encode("utf-8")) + suffix_bytes > MAX_ID_BYTES for k in keys):
        return INVALID_KEY, f"a key is longer than {MAX_ID_BYTES} bytes"
    return None


def _docs(meta: dict[str, Any], inputs: int) -> tuple[list[Any] | None, str | None]:
    """``meta["docs"]`` (popped from ``meta``), or why it cannot be used."""
    docs = meta.pop(DOCS_KEY, None)
    if docs is not None and (not isinstance(docs, list) or len(docs) != inputs):
        size = len(docs) if isinstance(docs, list) else type(docs).__name__
        return None, f"meta.docs must be a list of {inputs}, got {size}"
    return docs, None


def _sparse_rows(result: SparseResult, keys: tuple[str, ...], version: int) -> RowsOf | Refused:
    """One sparse row per input, its id the input's key."""
    refusal = _key_refusal(result, keys, result.count, 0)
    if refusal is not None:
        return Refused(*refusal, request_id=result.id, keys=keys)
    meta = dict(result.meta or {})
    meta.pop(CHUNK_POOLING_KEY, None)  # a dense request's convention: not stored
    docs, bad_docs = _docs(meta, result.count)
    if bad_docs is not None:
        return Refused(INVALID_RESULT, bad_docs, request_id=result.id, keys=keys)
    shared = jsonable(meta)
    # Ascending and below vocab: the decoder checked; vocab ids fit int32 (pgvector's).
    indices = np.frombuffer(result.indices, dtype="<u4").astype(np.int32)
    values = np.frombuffer(result.values, dtype="<f4").astype(np.float32)
    ends = np.cumsum(result.counts, dtype=np.int64)
    rows = []
    for index, (key, end, count) in enumerate(zip(keys, ends, result.counts, strict=True)):
        ids, weights = indices[end - count : end], values[end - count : end]
        nonzero = weights != 0  # a stored sparse vector holds nonzero values only
        rows.append(
            Row(
                key,
                SparseVector(ids[nonzero], weights[nonzero], result.vocab),
                _metadata(shared, docs, index),
                result.model,
                version,
                doc_key=key,
                request_id=result.id,
            )
        )
    return RowsOf(result.id, result.model, result.vocab, "float32", rows, kind="sparse")


def _rows(result: EmbedResult, keys: tuple[str, ...], version: int) -> RowsOf | Refused:
    def refuse(code: str, message: str) -> Refused:
        return Refused(code, message, request_id=result.id, keys=keys)

    meta = dict(result.meta or {})
    per_chunk = _per_chunk(result, meta.pop(CHUNK_POOLING_KEY, None) == "mean")
    inputs = len(result.chunks) if result.chunks is not None else result.count
    longest = _CHUNK_SUFFIX_BYTES + len(str(max(result.chunks or (1,)))) if per_chunk else 0
    refusal = _key_refusal(result, keys, inputs, longest)
    if refusal is not None:
        return refuse(*refusal)
    if result.chunks is not None and not per_chunk and result.count != inputs:
        return refuse(
            INVALID_RESULT,
            f"{result.count} vectors for {inputs} chunked inputs "
            f"({sum(result.chunks)} chunks, {len(result.spans or ())} spans)",
        )
    if LAYOUTS[Encoding(result.dtype)].floats is None:
        return refuse(
            UNSUPPORTED_DTYPE,
            "binary vectors are not written: the table holds float vectors (request "
            "float32, float16 or int8)",
        )
    docs, bad_docs = _docs(meta, inputs)
    if bad_docs is not None:
        return refuse(INVALID_RESULT, bad_docs)
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
    form, would otherwise come back). A document's dense and sparse rows are versions of
    two vector kinds, each reduced on its own."""
    latest: dict[tuple[str, VectorKind], Row] = {}
    doc_version: dict[tuple[str, VectorKind], tuple[int, str]] = {}
    for row in rows:
        kind = row.kind
        seen = doc_version.get((row.document, kind))
        if seen is None or seen <= row.version:
            doc_version[row.document, kind] = row.version
        if seen is None or seen <= row.version or (row.id, kind) not in latest:
            latest[row.id, kind] = row
    return [row for row in latest.values() if row.version == doc_version[row.document, row.kind]]


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
