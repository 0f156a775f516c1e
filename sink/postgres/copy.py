"""PostgreSQL's binary ``COPY`` format for the sink's rows (pgvector's binary vectors)."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence

import numpy as np

from sink.rows import Row

__all__ = ["copy_data", "sparse_copy_data"]

# PostgreSQL's binary COPY format: a signature, flags and header-extension length; each
# row a field count, then each field's byte length and bytes; -1 as the trailer.
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)
_FIELDS = struct.pack(">h", 5)  # id, vector, metadata, model, requested_ms
_FIELDS_IDENTITY = struct.pack(">h", 7)  # the same, then doc_key, chunk_index (or NULL)
_FIELDS_SPARSE = struct.pack(">h", 6)  # id, sparse, metadata, model, requested_ms, doc_key
_NULL = struct.pack(">i", -1)
_BIGINT = struct.pack(">i", 8)
_JSONB_VERSION = b"\x01"  # jsonb's binary form: a version byte, then the JSON text


def copy_data(rows: Sequence[Row], *, identity: bool = False) -> bytes:
    """``rows`` in PostgreSQL's binary COPY format, for the columns (id text, vector
    vector, metadata jsonb, model text, requested_ms bigint), then (``identity``) doc_key
    text and chunk_index integer (NULL for a row per input). A vector is pgvector's binary
    form: its dimension and a zero (two int16), then its float32 values, all big-endian;
    the values are the row's float32 values bit for bit."""
    parts = [_COPY_HEADER]
    append = parts.append
    pack_len = struct.Struct(">i").pack
    pack_bigint = struct.Struct(">q").pack
    pack_int = struct.Struct(">ii").pack
    pack_dim = struct.Struct(">ihh").pack
    for row in rows:
        key = row.id.encode("utf-8")
        values = np.ascontiguousarray(row.dense, dtype=">f4").tobytes()
        metadata = _JSONB_VERSION + json.dumps(row.metadata).encode("utf-8")
        model = row.model.encode("utf-8")
        dim = len(values) // 4
        append(_FIELDS_IDENTITY if identity else _FIELDS)
        append(pack_len(len(key)))
        append(key)
        append(pack_dim(4 + len(values), dim, 0))
        append(values)
        append(pack_len(len(metadata)))
        append(metadata)
        append(pack_len(len(model)))
        append(model)
        append(_BIGINT)
        append(pack_bigint(row.requested_ms))
        if identity:
            document = row.document.encode("utf-8")
            append(pack_len(len(document)))
            append(document)
            append(_NULL if row.chunk_index is None else pack_int(4, row.chunk_index))
    append(_COPY_TRAILER)
    return b"".join(parts)


def sparse_copy_data(rows: Sequence[Row]) -> bytes:
    """Sparse ``rows`` in PostgreSQL's binary COPY format, for the columns (id text, sparse
    sparsevec, metadata jsonb, model text, requested_ms bigint, doc_key text). A sparse
    vector is pgvector's binary form: its dimension, its count of nonzero values and a
    zero (three int32), then its indices (int32, from 0, ascending) and its values
    (float32), all big-endian."""
    parts = [_COPY_HEADER]
    append = parts.append
    pack_len = struct.Struct(">i").pack
    pack_bigint = struct.Struct(">q").pack
    pack_head = struct.Struct(">iiii").pack
    for row in rows:
        vector = row.sparse
        key = row.id.encode("utf-8")
        indices = np.ascontiguousarray(vector.indices, dtype=">i4").tobytes()
        values = np.ascontiguousarray(vector.values, dtype=">f4").tobytes()
        metadata = _JSONB_VERSION + json.dumps(row.metadata).encode("utf-8")
        model = row.model.encode("utf-8")
        document = row.document.encode("utf-8")
        append(_FIELDS_SPARSE)
        append(pack_len(len(key)))
        append(key)
        append(pack_head(12 + len(indices) + len(values), vector.size, len(vector), 0))
        append(indices)
        append(values)
        append(pack_len(len(metadata)))
        append(metadata)
        append(pack_len(len(model)))
        append(model)
        append(_BIGINT)
        append(pack_bigint(row.requested_ms))
        append(pack_len(len(document)))
        append(document)
    append(_COPY_TRAILER)
    return b"".join(parts)
