"""Milvus: the ``VectorStore`` for Milvus Lite files and Milvus servers or clusters (pymilvus).

The same code serves both; only the URI differs (``milvus:///path/file.db`` opens a Lite
file in this process, ``http://host:19530`` a server). The collection (created if
absent) has the Postgres table's fields: ``id`` (VARCHAR primary key), ``vector``
(FLOAT_VECTOR of the dimension), ``metadata`` (JSON), ``model`` (VARCHAR),
``requested_ms`` (INT64, the row's version), ``updated_at`` (INT64, Unix milliseconds)
and the identity fields below, with an HNSW index for the metric (IP, COSINE or L2). An
upsert by primary key is idempotent, so a replayed batch changes nothing but
``updated_at``. Milvus acknowledges an upsert once it is in its write-ahead log.

Rows carry their identity in scalar fields only the sink writes: ``doc_key`` (the
document: the key as text), ``chunk_index`` (-1 for a row per input) and ``request_id``
(the tie-break of two versions with one ``requested_ms``). Milvus has no transactions, so
a batch reads first: the stored rows of its documents (``doc_key in [...]``); a document
stored at a newer version is left out, the others' rows are upserted, then their stored
rows that the batch did not write (stale chunks, the other form) are deleted. A crash
between the two calls leaves those rows until the batch is replayed (its offsets were not
committed). The read and the write are separate calls: one writer per collection.

Sparse vectors (rows of ``kind`` ``"sparse"``) go to a companion collection
``{collection}_sparse``, made at the first sparse result: ``id`` (the key), ``sparse``
(SPARSE_FLOAT_VECTOR) with a SPARSE_INVERTED_INDEX for inner product (the only metric
Milvus has for sparse vectors), and the same scalar fields; a document's sparse vector has
its own version there, read and compared the same way. Milvus Lite cannot add a field to
an existing collection, so the two kinds cannot share a row as in PostgreSQL: join them by
``id`` (or search both and fuse).

A collection made by an older sink has no identity fields (Milvus Lite cannot add any):
it is written as before, documents told by their chunks' metadata, and without
``requested_ms`` without versions (a warning says which).

Filters quote keys as Milvus' own string literals (``_literal``): Milvus Lite has no
filter templates, and pymilvus' ``get``/``delete`` by ids write literals it misreads.
Whatever else Milvus refuses is ``RowsRefusedError``, so the sink dead-letters that result
and writes the next.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import structlog
from pymilvus import DataType, MilvusClient
from pymilvus.exceptions import (
    ConnectError,
    ConnectionConfigException,
    MilvusException,
    MilvusUnavailableException,
)

from sink.rows import MAX_ID_BYTES, Row, newest
from sink.settings import SinkSettings
from sink.store import (
    DimensionMismatchError,
    Metric,
    RowsRefusedError,
    TargetError,
    TransientWriteError,
)
from sink.targets import TargetSpec, scrub

__all__ = ["MilvusStore"]

log = structlog.get_logger("kembed.sink")

_METRICS: dict[Metric, str] = {"inner_product": "IP", "cosine": "COSINE", "l2": "L2"}
_MODEL_BYTES = 512
_FIELDS = {"id", "vector", "metadata", "model", "updated_at"}
_VERSION = "requested_ms"
_DOCS_PER_QUERY = 100
"""Documents per read of stored chunks by metadata (one equality each in the filter)."""
_IDS_PER_QUERY = 1000
"""Ids or document keys per ``in`` filter."""
_REQUEST_ID_BYTES = 256
_IDENTITY = ("doc_key", "chunk_index", "request_id")
_SPARSE_SUFFIX = "_sparse"
"""The companion collection of sparse vectors: ``{collection}_sparse``."""
_SPARSE_VOCAB = "kembed.vocab"
"""The sparse collection's property: the vectors' dimension (Milvus stores none)."""
"""The fields that say which document (and chunk) a row is, and which request wrote it."""


class MilvusStore:
    def __init__(
        self,
        spec: TargetSpec,
        collection: str,
        *,
        connect_timeout_s: float = 10.0,
        hnsw_m: int = 16,
        hnsw_ef_construction: int = 64,
    ) -> None:
        self._spec = spec
        self._collection = collection
        self._timeout = connect_timeout_s
        self._hnsw = (hnsw_m, hnsw_ef_construction)
        self._client: Any = None
        self._versioned = True
        self._identity = True
        self._sparse_collection = collection + _SPARSE_SUFFIX

    @classmethod
    def from_settings(cls, spec: TargetSpec, settings: SinkSettings) -> MilvusStore:
        """The store for ``spec`` with the sink's options."""
        return cls(spec, settings.table, **settings.store_options())

    @property
    def name(self) -> str:
        return self._collection

    def open(self) -> None:
        self.close()
        options: dict[str, Any] = {"uri": self._spec.uri, "timeout": self._timeout}
        if self._spec.password is not None:
            secret = self._spec.password.get_secret_value()
            if self._spec.user:
                options.update(user=self._spec.user, password=secret)
            else:
                options["token"] = secret
        try:
            self._client = MilvusClient(**options)
        except ConnectionConfigException as exc:
            # Milvus Lite: the file cannot be opened (another process holds it, or the
            # directory does not exist).
            raise TargetError(self._describe("cannot open", exc)) from None
        except (MilvusUnavailableException, ConnectError) as exc:
            raise TransientWriteError(self._describe("cannot connect", exc)) from None
        except MilvusException as exc:
            raise TargetError(self._describe("cannot connect", exc)) from None
        for collection in (self._collection, self._sparse_collection):
            if self._client.has_collection(collection):
                self._client.load_collection(collection)

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None

    def _connected(self) -> Any:
        if self._client is None:
            self.open()
        return self._client

    def table_dim(self) -> int | None:
        client = self._connected()
        if not client.has_collection(self._collection):
            return None
        fields = {f["name"]: f for f in client.describe_collection(self._collection)["fields"]}
        missing = _FIELDS - fields.keys()
        if missing:
            raise TargetError(
                f"collection {self._collection!r} exists but lacks the field(s) "
                f"{', '.join(sorted(missing))}: it was not made by kembed sink; use another "
                "collection"
            )
        if _VERSION not in fields and self._versioned:
            self._versioned = False
            log.warning(
                "sink.unversioned_collection",
                table=self._collection,
                reason=f"the collection has no {_VERSION} field (made by an older sink): a "
                "result processed late can replace a newer row",
            )
        if not all(name in fields for name in _IDENTITY) and self._identity:
            self._identity = False
            log.warning(
                "sink.collection_without_identity",
                table=self._collection,
                reason="the collection has no doc_key, chunk_index and request_id fields "
                "(made by an older sink): documents are told by their chunks' metadata, and "
                "a document that changes form keeps its other form's rows; write into a new "
                "collection to get the document rules",
            )
        vector = fields["vector"]
        if vector["type"] != DataType.FLOAT_VECTOR:
            raise TargetError(
                f"collection {self._collection!r}: field vector is {vector['type']!r}, not "
                "FLOAT_VECTOR"
            )
        return int(vector["params"]["dim"])

    def create(self, dim: int, metric: Metric) -> None:
        client = self._connected()
        existing = self.table_dim()
        if existing is not None:
            if existing != dim:
                raise DimensionMismatchError(self._collection, existing, dim, "the results have")
            return
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=MAX_ID_BYTES)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
        self._scalar_fields(schema)
        m, ef_construction = self._hnsw
        index = client.prepare_index_params()
        index.add_index(
            field_name="vector",
            index_type="HNSW",
            metric_type=_METRICS[metric],
            params={"M": m, "efConstruction": ef_construction},
        )
        client.create_collection(self._collection, schema=schema, index_params=index)
        client.load_collection(self._collection)
        log.info("sink.table_created", table=self._collection, dim=dim, metric=metric)

    def sparse_dim(self) -> int | None:
        """The vocabulary size the sparse collection was made for; None when absent."""
        client = self._connected()
        if not client.has_collection(self._sparse_collection):
            return None
        described = client.describe_collection(self._sparse_collection)
        fields = {f["name"]: f for f in described["fields"]}
        if "sparse" not in fields or fields["sparse"]["type"] != DataType.SPARSE_FLOAT_VECTOR:
            raise TargetError(
                f"collection {self._sparse_collection!r} exists but has no SPARSE_FLOAT_VECTOR "
                "field sparse: it was not made by kembed sink; use another collection"
            )
        vocab = (described.get("properties") or {}).get(_SPARSE_VOCAB)
        if vocab is None:
            raise TargetError(
                f"collection {self._sparse_collection!r} lacks the property {_SPARSE_VOCAB}: "
                "it was not made by kembed sink; use another collection"
            )
        return int(vocab)

    def create_sparse(self, dim: int, metric: Metric) -> None:
        """Make the companion collection of sparse vectors (``{collection}_sparse``),
        with an inner-product SPARSE_INVERTED_INDEX whatever ``metric`` says: Milvus has
        no other metric for sparse vectors (a warning says so)."""
        existing = self.sparse_dim()
        if existing is not None:
            if existing != dim:
                raise DimensionMismatchError(
                    self._sparse_collection, existing, dim, "the sparse results have"
                )
            return
        if metric != "inner_product":
            log.warning(
                "sink.sparse_metric",
                table=self._sparse_collection,
                metric=metric,
                reason="Milvus indexes sparse vectors for inner product only: the sparse "
                "collection's index is IP",
            )
        client = self._connected()
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=MAX_ID_BYTES)
        schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
        self._scalar_fields(schema)
        index = client.prepare_index_params()
        index.add_index(field_name="sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="IP")
        client.create_collection(
            self._sparse_collection,
            schema=schema,
            index_params=index,
            properties={_SPARSE_VOCAB: str(dim)},
        )
        client.load_collection(self._sparse_collection)
        log.info("sink.table_created", table=self._sparse_collection, dim=dim, metric="IP")

    def upsert(self, rows: Sequence[Row]) -> None:
        sparse = [row for row in rows if row.kind == "sparse"]
        if sparse:
            self._upsert_sparse(sparse)
        if len(sparse) < len(rows):
            self._upsert_dense([row for row in rows if row.kind == "dense"])

    def _upsert_sparse(self, rows: list[Row]) -> None:
        """Sparse rows into the companion collection, each document at its own version
        (one row per document: nothing stale to delete)."""
        now_ms = int(time.time() * 1000)
        try:
            kept, _ = self._by_document(newest(rows), self._sparse_collection)
            # Milvus stores no sparse vector without a nonzero weight: a text whose every
            # term weighs zero has no row (its stored one, of an older version, goes).
            data = [self._sparse_entity(row, now_ms) for row in kept if len(row.sparse)]
            empty = [row.id for row in kept if not len(row.sparse)]
            if data:
                self._connected().upsert(self._sparse_collection, data)
            for start in range(0, len(empty), _IDS_PER_QUERY):
                part = empty[start : start + _IDS_PER_QUERY]
                self._connected().delete(self._sparse_collection, filter=_in("id", part))
        except MilvusException as exc:
            raise self._classified(exc) from None

    def _sparse_entity(self, row: Row, now_ms: int) -> dict[str, Any]:
        vector = row.sparse
        return {
            "id": row.id,
            "sparse": dict(zip(vector.indices.tolist(), vector.values.tolist(), strict=True)),
            "metadata": row.metadata,
            "model": row.model[:_MODEL_BYTES],
            _VERSION: row.requested_ms,
            "updated_at": now_ms,
            "doc_key": row.document,
            "chunk_index": -1,
            "request_id": row.request_id[:_REQUEST_ID_BYTES],
        }

    def _classified(self, exc: MilvusException) -> Exception:
        """The store's error for a failed write: transient when Milvus is unreachable
        (reconnect and retry), otherwise rows refused (a value too long, a malformed
        request, data of the wrong type: the sink writes result by result and
        dead-letters the one refused)."""
        if isinstance(exc, MilvusUnavailableException | ConnectError):
            self.close()
            return TransientWriteError(self._describe("write failed", exc))
        return RowsRefusedError(self._describe("rows refused", exc))

    def _upsert_dense(self, rows: Sequence[Row]) -> None:
        now_ms = int(time.time() * 1000)
        stale: list[str] = []
        try:
            if self._identity:
                rows, stale = self._by_document(newest(rows), self._collection)
            elif self._versioned:
                rows, stale = self._chunks_by_metadata(self._newest(rows))
            else:
                rows = newest(rows)
            data = [self._entity(row, now_ms) for row in rows]
            if data:
                self._connected().upsert(self._collection, data)
            for start in range(0, len(stale), _IDS_PER_QUERY):
                part = stale[start : start + _IDS_PER_QUERY]
                self._connected().delete(self._collection, filter=_in("id", part))
        except MilvusException as exc:
            raise self._classified(exc) from None

    @staticmethod
    def _scalar_fields(schema: Any) -> None:
        """The fields beside the primary key and the vector, in either collection."""
        schema.add_field("metadata", DataType.JSON)
        schema.add_field("model", DataType.VARCHAR, max_length=_MODEL_BYTES)
        schema.add_field(_VERSION, DataType.INT64)
        schema.add_field("updated_at", DataType.INT64)
        schema.add_field("doc_key", DataType.VARCHAR, max_length=MAX_ID_BYTES)
        schema.add_field("chunk_index", DataType.INT64)
        schema.add_field("request_id", DataType.VARCHAR, max_length=_REQUEST_ID_BYTES)

    def _entity(self, row: Row, now_ms: int) -> dict[str, Any]:
        entity: dict[str, Any] = {
            "id": row.id,
            "vector": row.dense.tolist(),
            "metadata": row.metadata,
            "model": row.model[:_MODEL_BYTES],
            "updated_at": now_ms,
        }
        if self._versioned:
            entity[_VERSION] = row.requested_ms
        if self._identity:
            entity["doc_key"] = row.document
            entity["chunk_index"] = -1 if row.chunk_index is None else row.chunk_index
            entity["request_id"] = row.request_id[:_REQUEST_ID_BYTES]
        return entity

    def _by_document(self, rows: list[Row], collection: str) -> tuple[list[Row], list[str]]:
        """``rows`` less the documents whose stored version is newer than the batch's, and
        the ids of the stored rows (of either form) of the other documents that the batch
        does not write again: a document ends as exactly its newest version."""
        version: dict[str, tuple[int, str]] = {row.document: row.version for row in rows}
        ids = {row.id for row in rows}
        stored: list[dict[str, Any]] = []
        keys = list(version)
        for start in range(0, len(keys), _IDS_PER_QUERY):
            stored += self._connected().query(
                collection,
                filter=_in("doc_key", keys[start : start + _IDS_PER_QUERY]),
                output_fields=["id", "doc_key", _VERSION, "request_id"],
            )
        newer: set[str] = set()
        for hit in stored:
            doc = str(hit["doc_key"])
            if doc in version and (int(hit[_VERSION]), str(hit["request_id"])) > version[doc]:
                newer.add(doc)
        stale = [
            str(hit["id"])
            for hit in stored
            if str(hit["doc_key"]) not in newer and str(hit["id"]) not in ids
        ]
        return [row for row in rows if row.document not in newer], stale

    def _newest(self, rows: Sequence[Row]) -> list[Row]:
        """``rows`` without those that a newer stored row, or a newer row of the batch,
        supersedes; a row whose stored version is equal is written again (a replay)."""
        latest = newest(rows)
        ids = [row.id for row in latest]
        stored: dict[str, int] = {}
        for start in range(0, len(ids), _IDS_PER_QUERY):
            found = self._connected().query(
                self._collection,
                filter=_in("id", ids[start : start + _IDS_PER_QUERY]),
                output_fields=[_VERSION],
            )
            stored.update({hit["id"]: int(hit[_VERSION]) for hit in found})
        return [row for row in latest if stored.get(row.id, -1) <= row.requested_ms]

    def _chunks_by_metadata(self, rows: list[Row]) -> tuple[list[Row], list[str]]:
        """For a collection made before the identity fields: ``rows`` less the chunks of
        documents that have a newer stored chunk, and the ids of stored chunks the batch's
        documents no longer have (not newer than the batch), found by the chunks'
        ``metadata["doc_key"]`` (and an id ``{doc_key}#{chunk_index}``)."""
        docs: dict[str, tuple[int, int]] = {}  # doc_key: (chunks, version)
        for row in rows:
            if row.chunk_index is not None:
                docs[row.document] = (row.chunks, row.requested_ms)
        if not docs:
            return rows, []
        stored: list[dict[str, Any]] = []
        keys = list(docs)
        # Milvus takes "in" on plain fields only: a JSON path is compared key by key.
        for start in range(0, len(keys), _DOCS_PER_QUERY):
            part = keys[start : start + _DOCS_PER_QUERY]
            stored += self._connected().query(
                self._collection,
                filter=" or ".join(f'metadata["doc_key"] == {_literal(k)}' for k in part),
                output_fields=["metadata", _VERSION],
            )
        superseded: set[str] = set()
        stale: list[str] = []
        for hit in stored:
            metadata = hit["metadata"]
            index = metadata.get("chunk_index")
            doc_key = str(metadata.get("doc_key"))
            doc = docs.get(doc_key)
            if doc is None or not isinstance(index, int) or hit["id"] != f"{doc_key}#{index}":
                continue  # not a chunk row: a user's metadata that names a document
            chunks, version = doc
            if int(hit[_VERSION]) > version:
                superseded.add(doc_key)
            elif index >= chunks:
                stale.append(hit["id"])
        kept = [row for row in rows if row.chunk_index is None or row.document not in superseded]
        return kept, [key for key in stale if key.rsplit("#", 1)[0] not in superseded]

    def _describe(self, what: str, exc: BaseException) -> str:
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        return scrub(f"{what} ({self._spec.display}): {type(exc).__name__}: {message}", self._spec)


def _literal(text: str) -> str:
    """``text`` as a string literal of Milvus' filter language: in double quotes, with
    backslash, double quote, line feed and carriage return escaped (every other character,
    control characters included, stands for itself). Milvus Lite has no filter
    templates, and pymilvus' ``get``/``delete`` by ids quote ids in a form it misreads."""
    return '"' + text.translate(_ESCAPES) + '"'


_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r"})


def _in(field: str, values: Sequence[str]) -> str:
    return f"{field} in [{', '.join(_literal(value) for value in values)}]"
