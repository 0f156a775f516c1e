"""PostgreSQL with pgvector: the ``VectorStore`` for ``postgresql://`` targets (psycopg 3).

The table (created if absent)::

    id          text PRIMARY KEY         -- keys[i], or {keys[i]}#{k} for chunk k
    vector      vector(DIM) NOT NULL     -- float32 values, whatever the wire dtype
    metadata    jsonb NOT NULL           -- meta without "docs", merged with meta["docs"][i]
    model       text NOT NULL            -- the model that computed the vector
    requested_ms bigint NOT NULL         -- the row's version: when its request was produced
    updated_at  timestamptz NOT NULL     -- when the row was last written
    doc_key     text NOT NULL            -- the row's document (keys[i] as text), indexed
    chunk_index integer                  -- its chunk; NULL for a row per input

and, once sparse results come (``create_sparse``; a table made by them first has no
``vector`` column until dense results come, and then ``vector`` and ``model`` are
nullable)::

    sparse       sparsevec(VOCAB)        -- a sparse result's term weights (row id = key)
    sparse_model text                    -- the model that computed them

with an HNSW index on ``vector`` for the chosen metric (``vector_ip_ops``,
``vector_cosine_ops`` or ``vector_l2_ops``), made at creation, or (bulk mode,
``index="after"``) left pending, noted in the table's comment, and built by
``build_pending_index`` once the load is done; and the documents table
``{table}_documents (doc_key PRIMARY KEY, requested_ms, request_id, chunks)``: each
document's stored version (and, with sparse vectors, ``sparse_requested_ms`` and
``sparse_request_id``: its sparse version, independent of the dense one).

A batch is written by document (``sink.rows.newest`` keeps one version of each, the
newest by ``(requested_ms, request_id)``). Its transaction first upserts the documents
into the documents table, in key order, where the stored version is older (``ON CONFLICT
... DO UPDATE ... WHERE ... RETURNING``): the row lock of each document is held until the
commit, so two sinks (or writers) never write one document at once, and the one that
waits sees the other's version. Then, for the documents returned, their rows (of either
form) are deleted and the batch's inserted from a staging table filled by one binary
``COPY`` (pgvector's binary form for the vectors). A document whose stored version is the
same (a replay) or newer (a result processed late) is not touched: no new row version, no
HNSW insert. With ``writers`` > 1 the batch's documents are split between that many
connections, each its share in its own transaction, in parallel: HNSW inserts are
CPU-bound in the server, and parallel backends use its cores. The staging table (one per
connection, ``ON COMMIT DELETE ROWS``) is empty outside a transaction.

A table made by an older sink is migrated at start-up: ``requested_ms`` (0 for its rows),
then ``doc_key`` and ``chunk_index`` from its ids and metadata, and the documents table
from its rows. Failures are classified by SQLSTATE class (``sink.postgres.errors``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

import psycopg
import structlog
from psycopg import sql

from sink.postgres.copy import copy_data
from sink.postgres.dense import DenseStatements
from sink.postgres.documents import by_document
from sink.postgres.documents import documents as batch_documents
from sink.postgres.errors import FATAL, REFUSED, TRANSIENT, severity
from sink.postgres.schema import SCHEMA_LOCK, PostgresSchema
from sink.postgres.sparse import SparseStatements, write_sparse
from sink.rows import Row, newest
from sink.settings import SinkSettings
from sink.store import (
    Metric,
    RowsRefusedError,
    TargetError,
    TransientWriteError,
)
from sink.targets import TargetSpec, scrub

__all__ = ["PostgresStore"]

log = structlog.get_logger("kembed.sink")


_NEWER_METADATA = (
    "CASE WHEN EXCLUDED.requested_ms >= t.requested_ms THEN EXCLUDED.metadata ELSE t.metadata END"
)
"""A row written by both kinds has the metadata of the newer write (by requested_ms), and
its ``requested_ms`` is the newer's: whichever order the sink processes them in."""

MIN_WRITER_ROWS = 256
"""A batch is split between writers only into parts of at least this many rows."""


class PostgresStore:
    def __init__(
        self,
        spec: TargetSpec,
        table: str,
        *,
        connect_timeout_s: float = 10.0,
        hnsw_m: int = 16,
        hnsw_ef_construction: int = 64,
        writers: int = 1,
        index: Literal["streaming", "after"] = "streaming",
        index_build_memory_mb: int = 1024,
        index_build_workers: int = 4,
    ) -> None:
        if writers < 1:
            raise ValueError("writers must be at least 1")
        self._spec = spec
        self._table_name = table
        self._table = sql.Identifier(*table.split("."))
        self._connect_timeout_s = connect_timeout_s
        self._schema = PostgresSchema(
            table,
            hnsw_m=hnsw_m,
            hnsw_ef_construction=hnsw_ef_construction,
            index_after=index == "after",
        )
        self._dense = DenseStatements(self._table, self._schema.documents_table)
        self._sparse = SparseStatements(self._table, self._schema.documents_table)
        self._build_settings = {
            "maintenance_work_mem": f"{index_build_memory_mb}MB",
            "max_parallel_maintenance_workers": str(index_build_workers),
        }
        self._conn: psycopg.Connection[Any] | None = None
        # Writers 1.. have their own connections (writer 0 uses _conn), opened when needed.
        self._extra: list[psycopg.Connection[Any] | None] = [None] * (writers - 1)
        self._staging_on: dict[int, psycopg.Connection[Any]] = {}  # writer: its staging's
        self._sparse_staging_on: dict[int, psycopg.Connection[Any]] = {}
        self._has_sparse = False  # the table has a sparse column (once true, for good)
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def from_settings(cls, spec: TargetSpec, settings: SinkSettings) -> PostgresStore:
        """The store for ``spec`` with the sink's options."""
        return cls(
            spec,
            settings.table,
            writers=settings.writers,
            index=settings.index,
            index_build_memory_mb=settings.index_build_memory_mb,
            index_build_workers=settings.index_build_workers,
            **settings.store_options(),
        )

    @property
    def name(self) -> str:
        return self._table_name

    # ------------------------------------------------------------------ connection

    def open(self) -> None:
        self.close()
        self._conn = self._connect()
        self._ensure_pgvector()

    def _connect(self) -> psycopg.Connection[Any]:
        password = self._spec.password.get_secret_value() if self._spec.password else None
        try:
            return psycopg.connect(
                self._spec.uri,
                password=password,
                connect_timeout=max(1, round(self._connect_timeout_s)),
                application_name="kembed-sink",
                autocommit=True,
            )
        except psycopg.OperationalError as exc:
            raise TransientWriteError(self._describe("cannot connect", exc)) from None
        except psycopg.Error as exc:
            raise TargetError(self._describe("cannot connect", exc)) from None

    def close(self) -> None:
        for writer in range(len(self._extra) + 1):
            self._close_writer(writer)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _close_writer(self, writer: int) -> None:
        conn = self._conn if writer == 0 else self._extra[writer - 1]
        if writer == 0:
            self._conn = None
        else:
            self._extra[writer - 1] = None
        self._staging_on.pop(writer, None)
        self._sparse_staging_on.pop(writer, None)
        if conn is not None:
            conn.close()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self.open()
        assert self._conn is not None
        return self._conn

    def _writer_connection(self, writer: int) -> psycopg.Connection[Any]:
        """A writer's connection, reconnected alone if lost (the others may be writing)."""
        conn = self._conn if writer == 0 else self._extra[writer - 1]
        if conn is None or conn.closed:
            conn = self._connect()
            if writer == 0:
                self._conn = conn
            else:
                self._extra[writer - 1] = conn
        return conn

    def _ensure_pgvector(self) -> None:
        conn = self._connection()
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone():
            return
        try:
            with conn.transaction():
                conn.execute(SCHEMA_LOCK)
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except psycopg.errors.InsufficientPrivilege:
            raise TargetError(
                f"pgvector is not installed in the database of {self._spec.display}, and "
                f"user {self._spec.user or '(default)'} may not install it: run CREATE "
                "EXTENSION vector as its owner or a superuser"
            ) from None
        except psycopg.errors.FeatureNotSupported as exc:
            raise TargetError(self._describe("pgvector is not available", exc)) from None
        except psycopg.errors.UndefinedFile as exc:
            raise TargetError(self._describe("pgvector is not available", exc)) from None

    # ------------------------------------------------------------------ the table

    def table_dim(self) -> int | None:
        return self._schema.table_dim(self._connection())

    def create(self, dim: int, metric: Metric) -> None:
        conn = self._connection()
        with conn.transaction():
            conn.execute(SCHEMA_LOCK)
            self._schema.create_table(conn, dim, metric)

    def sparse_dim(self) -> int | None:
        """The dimension of the table's sparse vectors; None when it has none (yet)."""
        dim = self._schema.sparse_dim(self._connection())
        self._has_sparse = self._has_sparse or dim is not None
        return dim

    def create_sparse(self, dim: int, metric: Metric) -> None:
        """Make the table hold sparse vectors of dimension ``dim`` (``PostgresSchema.
        create_sparse``): a new table, or columns added to the dense one."""
        conn = self._connection()
        with conn.transaction():
            conn.execute(SCHEMA_LOCK)
            self._schema.create_sparse(conn, dim, metric)
        self._has_sparse = True

    def pending_index(self) -> str | None:
        """The operator class of the HNSW index a bulk load left to build, if any."""
        return self._schema.pending_index(self._connection())

    def build_pending_index(self) -> float | None:
        """Build the pending HNSW index in one transaction (with the session settings that
        make pgvector's build fast), and clear the table's note. Writes wait meanwhile."""
        try:
            ops = self.pending_index()
            if ops is None:
                return None
            conn = self._connection()
            started = time.monotonic()
            with conn.transaction():
                for name, value in self._build_settings.items():
                    conn.execute("SELECT set_config(%s, %s, true)", [name, value])
                conn.execute(self._schema.index_statement(ops))
                conn.execute(sql.SQL("COMMENT ON TABLE {table} IS NULL").format(table=self._table))
            seconds = time.monotonic() - started
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            self.close()
            raise TransientWriteError(self._describe("index build failed", exc)) from None
        log.info("sink.index_built", table=self._table_name, seconds=round(seconds, 2))
        return seconds

    # ------------------------------------------------------------------ writing

    def upsert(self, rows: Sequence[Row]) -> None:
        # One version per document, one row per id: INSERT ... ON CONFLICT may not touch a
        # row twice in one command, and writers must hold disjoint documents. The sink
        # hands over a batch reduced this way already; the results it writes one by one
        # (to find a refused one) may repeat a key within a result.
        unique = newest(rows)
        parts = max(1, min(len(self._extra) + 1, len(unique) // MIN_WRITER_ROWS))
        if parts == 1:
            self._write(0, unique)
            return
        shares = by_document(unique, parts)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(len(self._extra), thread_name_prefix="kembed-pg")
        futures: list[Future[None]] = [
            self._pool.submit(self._write, writer, shares[writer]) for writer in range(1, parts)
        ]
        errors: list[BaseException] = []
        try:
            self._write(0, shares[0])
        except Exception as exc:  # noqa: BLE001 (weighed with the other writers' below)
            errors.append(exc)
        for future in futures:
            error = future.exception()
            if error is not None:
                errors.append(error)
        # Anything unexpected first (fatal), then a transient failure (all is retried),
        # then refused rows (the sink looks for the culprit): every part is idempotent.
        if errors:
            errors.sort(key=severity)
            raise errors[0]

    def _write(self, writer: int, rows: Sequence[Row]) -> None:
        """A share's dense rows, then its sparse rows: one transaction each (each claims its
        documents in key order, so two writers never wait on each other in a cycle)."""
        dense = [row for row in rows if row.kind == "dense"]
        sparse = [row for row in rows if row.kind == "sparse"]
        if dense:
            self._write_dense(writer, dense)
        if sparse:
            self._write_sparse(writer, sparse)

    def _write_dense(self, writer: int, rows: Sequence[Row]) -> None:
        """One transaction on one writer's connection: claim the rows' documents in the
        documents table (in key order, each under its row lock until the commit: a
        document is written by one transaction at a time, whichever sink runs it), then,
        for the documents whose stored version is older than the batch's, replace all
        their rows (of either form) by the batch's (a document new to the documents table
        has no rows to remove). A document whose stored version is the same or newer is
        left alone (a replay, or a result processed late). In a table that also holds
        sparse vectors, a replaced document's rows that hold one are kept, their dense
        vector cleared (the batch's may set it again): the sparse kind has its own
        version."""
        statements = self._dense
        documents = batch_documents(rows)
        data = copy_data(rows, identity=True)
        try:
            conn = self._writer_connection(writer)
            if self._staging_on.get(writer) is not conn:
                conn.execute(statements.staging)
                self._staging_on[writer] = conn
            with conn.transaction(), conn.cursor() as cursor:
                with cursor.copy(statements.copy) as pipe:  # before the claim: locks held briefly
                    pipe.write(data)
                cursor.execute(statements.claim, documents.columns())
                claimed = cursor.fetchall()
                won = [key for key, _ in claimed]
                replaced = [key for key, inserted in claimed if not inserted]
                # Checked after the claim: a sparse write of these documents waits for it.
                if replaced and (self._has_sparse or self._sparse_column(cursor)):
                    cursor.execute(statements.remove_dense, [replaced])
                    cursor.execute(statements.clear_dense, [replaced])
                elif replaced:
                    cursor.execute(statements.remove, [replaced])
                if len(won) == len(documents):
                    cursor.execute(statements.move_all)
                elif won:
                    cursor.execute(statements.move_claimed, [won])
        except psycopg.Error as exc:
            raise self._classified(writer, exc) from None

    def _sparse_column(self, cursor: psycopg.Cursor[Any]) -> bool:
        """Whether the table has a sparse column now (a sparse sink may have added it)."""
        found = cursor.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) "
            "AND attname = 'sparse' AND NOT attisdropped",
            [self._table.as_string(cursor.connection)],
        ).fetchone()
        self._has_sparse = found is not None
        return self._has_sparse

    def _write_sparse(self, writer: int, rows: Sequence[Row]) -> None:
        """One transaction of sparse rows (``sink.postgres.sparse.write_sparse``)."""
        try:
            conn = self._writer_connection(writer)
            if self._sparse_staging_on.get(writer) is not conn:
                conn.execute(self._sparse.staging)
                self._sparse_staging_on[writer] = conn
            with conn.transaction(), conn.cursor() as cursor:
                write_sparse(cursor, self._sparse, rows)
        except psycopg.Error as exc:
            raise self._classified(writer, exc) from None

    def _classified(self, writer: int, exc: psycopg.Error) -> Exception:
        """The store's error for a failed write, by SQLSTATE class (``sink.postgres.errors``)."""
        state = exc.sqlstate or ""
        refused = REFUSED.get(state[:2])
        if refused is None and not state and isinstance(exc, psycopg.DataError):
            refused = REFUSED["22"]  # refused by psycopg itself, before the server
        if state in FATAL:
            return TargetError(self._describe(FATAL[state], exc))
        if refused is not None:
            return RowsRefusedError(self._describe("rows refused", exc), code=refused)
        lost = isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
        if state[:2] in TRANSIENT or (lost and not state):
            self._close_writer(writer)  # reconnect on the next try
            return TransientWriteError(self._describe("write failed", exc))
        return TargetError(self._describe("write failed", exc))

    def _describe(self, what: str, exc: BaseException) -> str:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return scrub(f"{what} ({self._spec.display}): {type(exc).__name__}: {detail}", self._spec)
