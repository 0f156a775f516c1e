"""Milvus: the ``VectorStore`` for Milvus Lite files and Milvus servers or clusters (pymilvus).

The same code serves both; only the URI differs (``milvus:///path/file.db`` opens a Lite
file in this process, ``http://host:19530`` a server). The collection (created if
absent) has the Postgres table's fields: ``id`` (VARCHAR primary key), ``vector``
(FLOAT_VECTOR of the dimension), ``metadata`` (JSON), ``model`` (VARCHAR),
``requested_ms`` (INT64, the row's version) and ``updated_at`` (INT64, Unix milliseconds),
with an HNSW index for the metric (IP, COSINE or L2). A batch is one ``upsert`` call:
Milvus has no multi-call transactions, and an upsert by primary key is idempotent, so a
replayed batch changes nothing but ``updated_at``. Milvus acknowledges an upsert once it is
in its write-ahead log.

Milvus has no conditional upsert, so versions are kept by reading first: rows whose stored
``requested_ms`` is newer than the batch's are left out of the upsert (and of a batch
holding one id twice, only the newest row is written). The read and the write are two
calls, so two sinks writing one id at the same instant could still let the older win;
one sink group per collection, as documented, does not do that. A collection made by a sink
that predates ``requested_ms`` is written without versions (a warning says so).

Chunk rows (``{key}#{k}``, see ``sink.rows``) are read by document too (a filter on
``metadata["doc_key"]``): a document whose stored rows include a newer one is left out of
the upsert (an older, longer version arriving late brings no chunks back), and after the
upsert the document's stored chunks of ``chunk_index >= chunks`` that are not newer are
deleted by id. Without transactions a crash between the two calls leaves the stale chunks
until the batch is replayed (which it is: its offsets were not committed). A collection
without versions does not remove stale chunks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import structlog
from pymilvus import DataType, MilvusClient
from pymilvus.exceptions import (
    ConnectError,
    ConnectionConfigException,
    DataNotMatchException,
    DataTypeNotMatchException,
    MilvusException,
    MilvusUnavailableException,
    ParamError,
)

from sink.rows import MAX_ID_BYTES, Row, newest
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
"""Documents per read of stored chunks (one equality each in the filter)."""


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
        if self._client.has_collection(self._collection):
            self._client.load_collection(self._collection)

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
        schema.add_field("metadata", DataType.JSON)
        schema.add_field("model", DataType.VARCHAR, max_length=_MODEL_BYTES)
        schema.add_field(_VERSION, DataType.INT64)
        schema.add_field("updated_at", DataType.INT64)
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

    def upsert(self, rows: Sequence[Row]) -> None:
        now_ms = int(time.time() * 1000)
        stale: list[str] = []
        try:
            if self._versioned:
                rows, stale = self._chunks_by_document(self._newest(rows))
            data = [
                {
                    "id": row.id,
                    "vector": row.vector.tolist(),
                    "metadata": row.metadata,
                    "model": row.model[:_MODEL_BYTES],
                    "updated_at": now_ms,
                }
                | ({_VERSION: row.requested_ms} if self._versioned else {})
                for row in rows
            ]
            if data:
                self._connected().upsert(self._collection, data)
            if stale:
                self._connected().delete(self._collection, ids=stale)
        except (MilvusUnavailableException, ConnectError) as exc:
            self.close()
            raise TransientWriteError(self._describe("write failed", exc)) from None
        except (ParamError, DataNotMatchException, DataTypeNotMatchException) as exc:
            raise RowsRefusedError(self._describe("rows refused", exc)) from None

    def _newest(self, rows: Sequence[Row]) -> list[Row]:
        """``rows`` without those that a newer stored row, or a newer row of the batch,
        supersedes; a row whose stored version is equal is written again (a replay)."""
        latest = newest(rows)
        ids = [row.id for row in latest]
        stored: dict[str, int] = {}
        for start in range(0, len(ids), 1000):
            chunk = ids[start : start + 1000]
            found = self._connected().query(
                self._collection,
                filter=f"id in {json.dumps(chunk, ensure_ascii=False)}",
                output_fields=[_VERSION],
            )
            stored.update({hit["id"]: int(hit[_VERSION]) for hit in found})
        return [row for row in latest if stored.get(row.id, -1) <= row.requested_ms]

    def _chunks_by_document(self, rows: list[Row]) -> tuple[list[Row], list[str]]:
        """``rows`` less the chunks of documents that have a newer stored row, and the ids
        of stored chunks the batch's documents no longer have (not newer than the batch)."""
        docs: dict[str, tuple[Any, int, int]] = {}  # doc_key: (as sent, chunks, version)
        for row in rows:
            if row.doc_key is not None:
                docs[row.doc_key] = (row.metadata["doc_key"], row.chunks, row.requested_ms)
        if not docs:
            return rows, []
        stored: list[dict[str, Any]] = []
        sent = [raw for raw, _, _ in docs.values()]
        # Milvus takes "in" on plain fields only: a JSON path is compared key by key.
        for start in range(0, len(sent), _DOCS_PER_QUERY):
            part = sent[start : start + _DOCS_PER_QUERY]
            stored += self._connected().query(
                self._collection,
                filter=" or ".join(
                    f'metadata["doc_key"] == {json.dumps(key, ensure_ascii=False)}' for key in part
                ),
                output_fields=["metadata", _VERSION],
            )
        superseded: set[str] = set()
        stale: list[str] = []
        for hit in stored:
            metadata = hit["metadata"]
            index = metadata.get("chunk_index")
            doc = docs.get(str(metadata.get("doc_key")))
            if doc is None or not isinstance(index, int):
                continue
            _, chunks, version = doc
            if int(hit[_VERSION]) > version:
                superseded.add(str(metadata["doc_key"]))
            elif index >= chunks:
                stale.append(hit["id"])
        kept = [row for row in rows if row.doc_key not in superseded]
        return kept, [key for key in stale if key.rsplit("#", 1)[0] not in superseded]

    def _describe(self, what: str, exc: BaseException) -> str:
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        return scrub(f"{what} ({self._spec.display}): {type(exc).__name__}: {message}", self._spec)
