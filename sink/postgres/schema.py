"""The PostgreSQL sink's schema: its table, the documents table, their indexes, and the
migration of a table made by an older sink (see ``sink.postgres`` for their shape)."""

from __future__ import annotations

from typing import Any

import psycopg
import structlog
from psycopg import sql

from sink.store import DimensionMismatchError, Metric, TargetError

__all__ = ["HNSW_MAX_DIM", "HNSW_MAX_SPARSE_NNZ", "SCHEMA_LOCK", "PostgresSchema"]

log = structlog.get_logger("kembed.sink")

HNSW_MAX_DIM = 2000
"""pgvector indexes ``vector`` columns of at most 2,000 dimensions with HNSW."""

HNSW_MAX_SPARSE_NNZ = 1000
"""pgvector's HNSW index holds sparse vectors of at most 1,000 nonzero values (a row with
more is refused: ``limit_exceeded``); ``top_k`` keeps a sparse result within it."""

_OPS: dict[Metric, str] = {
    "inner_product": "vector_ip_ops",
    "cosine": "vector_cosine_ops",
    "l2": "vector_l2_ops",
}
_SPARSE_OPS: dict[Metric, str] = {
    "inner_product": "sparsevec_ip_ops",
    "cosine": "sparsevec_cosine_ops",
    "l2": "sparsevec_l2_ops",
}
_COLUMNS = {"id", "metadata", "model", "updated_at"}
"""Every kembed table's columns; then ``vector`` (dense), ``sparse`` (sparse), or both."""
_PENDING = "kembed: hnsw index pending, "
"""A table comment: bulk mode created the table without its index, to build with this
operator class once the load is done."""
# Sinks that start together on one database (replicas of a Deployment) set up the schema
# one at a time: concurrent CREATE EXTENSION / CREATE TABLE IF NOT EXISTS of one name
# collide on PostgreSQL's catalog indexes (UniqueViolation) instead of skipping. The lock
# is held until the set-up transaction ends; the next sink then finds everything there.
SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(hashtext('kembed-sink schema set-up'))"


class PostgresSchema:
    """The statements that make and migrate one table (``schema.table`` or ``table``) and
    its documents table, run on the connection given."""

    def __init__(
        self, table: str, *, hnsw_m: int, hnsw_ef_construction: int, index_after: bool
    ) -> None:
        self._table_name = table
        self._table = sql.Identifier(*table.split("."))
        self._hnsw = (hnsw_m, hnsw_ef_construction)
        self._index_after = index_after

    def table_dim(self, conn: psycopg.Connection[Any]) -> int | None:
        """The vector dimension of the existing table; None when there is no table yet, or
        a table of sparse vectors only."""
        columns = self._columns(conn)
        if columns is None or ("vector" not in columns and "sparse" in columns):
            return None
        return self._dim_of(columns, "vector", "vector")

    def sparse_dim(self, conn: psycopg.Connection[Any]) -> int | None:
        """The sparse vectors' dimension of the existing table; None when there is no table
        yet, or no ``sparse`` column."""
        columns = self._columns(conn)
        if columns is None or "sparse" not in columns:
            return None
        return self._dim_of(columns, "sparse", "sparsevec")

    def _dim_of(self, columns: dict[str, tuple[str, int]], column: str, type_name: str) -> int:
        if column not in columns:
            raise TargetError(
                f"table {self._table_name!r} exists but lacks the column {column}: it was "
                "not made by kembed sink; use another table"
            )
        typname, typmod = columns[column]
        if typname != type_name or typmod <= 0:
            raise TargetError(
                f"table {self._table_name!r}: column {column} is {typname}, not {type_name}(N)"
            )
        return typmod

    def _columns(self, conn: psycopg.Connection[Any]) -> dict[str, tuple[str, int]] | None:
        """The table's columns (name: type name, type modifier); None when it is absent."""
        regclass = self._table.as_string(conn)
        if conn.execute("SELECT to_regclass(%s)", [regclass]).fetchone() == (None,):
            return None
        columns = {
            name: (typname, typmod)
            for name, typname, typmod in conn.execute(
                "SELECT a.attname, t.typname, a.atttypmod FROM pg_attribute a "
                "JOIN pg_type t ON t.oid = a.atttypid "
                "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped",
                [regclass],
            ).fetchall()
        }
        missing = _COLUMNS - columns.keys()
        if missing:
            raise TargetError(
                f"table {self._table_name!r} exists but lacks the column(s) "
                f"{', '.join(sorted(missing))}: it was not made by kembed sink; use another "
                "table"
            )
        return columns

    def create_table(self, conn: psycopg.Connection[Any], dim: int, metric: Metric) -> None:
        existing = self.table_dim(conn)
        if existing is not None:
            if existing != dim:
                raise DimensionMismatchError(self._table_name, existing, dim, "the results have")
            with conn.transaction():  # a table made before rows had versions, or documents
                self.migrate(conn)
            return
        if self._columns(conn) is not None:  # a table of sparse vectors: add dense ones
            with conn.transaction():
                conn.execute(
                    sql.SQL("ALTER TABLE {table} ADD COLUMN vector vector({dim})").format(
                        table=self._table, dim=sql.Literal(dim)
                    )
                )
                if dim <= HNSW_MAX_DIM:
                    conn.execute(self.index_statement(_OPS[metric]))
            log.info("sink.column_added", table=self._table_name, column="vector", dim=dim)
            return
        with conn.transaction():
            conn.execute(
                self._table_statement(
                    sql.SQL("vector vector({dim}) NOT NULL").format(dim=sql.Literal(dim)),
                    sql.SQL("model text NOT NULL"),
                )
            )
            conn.execute(self.doc_index_statement())
            conn.execute(self.documents_statement())
            if dim <= HNSW_MAX_DIM and self._index_after:
                # Bulk mode: the index is built once the load is done; the table says which.
                conn.execute(
                    sql.SQL("COMMENT ON TABLE {table} IS {note}").format(
                        table=self._table, note=sql.Literal(_PENDING + _OPS[metric])
                    )
                )
            elif dim <= HNSW_MAX_DIM:
                conn.execute(self.index_statement(_OPS[metric]))
        if dim > HNSW_MAX_DIM:
            log.warning(
                "sink.no_index",
                table=self._table_name,
                dim=dim,
                reason=f"pgvector's HNSW indexes vector columns of up to {HNSW_MAX_DIM} "
                "dimensions; queries will scan the table",
            )
        log.info(
            "sink.table_created",
            table=self._table_name,
            dim=dim,
            metric=metric,
            index="after the load" if self._index_after else "hnsw",
        )

    def migrate(self, conn: psycopg.Connection[Any]) -> None:
        """Bring a table made by an older sink to this shape: ``requested_ms`` (0 for its
        rows), the identity columns ``doc_key`` and ``chunk_index`` (filled in once: a row
        whose id is ``{metadata.doc_key}#{metadata.chunk_index}`` is that chunk, any other
        row its own document), their index, and the documents table (each document at its
        rows' newest version). The former index on ``metadata->>'doc_key'`` is dropped."""
        table = self._table
        conn.execute(
            sql.SQL(
                "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "
                "requested_ms bigint NOT NULL DEFAULT 0"
            ).format(table=table)
        )
        regclass = table.as_string(conn)
        has_identity = conn.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) "
            "AND attname = 'doc_key' AND NOT attisdropped",
            [regclass],
        ).fetchone()
        if not has_identity:
            log.info("sink.table_migrating", table=self._table_name, to="documents")
            conn.execute(
                sql.SQL(
                    "ALTER TABLE {table} ADD COLUMN doc_key text, ADD COLUMN chunk_index integer"
                ).format(table=table)
            )
            chunk = (
                "coalesce(jsonb_typeof(metadata->'chunk_index') = 'number' "
                "AND (metadata->>'chunk_index') ~ '^[0-9]{1,9}$' AND metadata ? 'doc_key' "
                "AND id = (metadata->>'doc_key') || '#' || (metadata->>'chunk_index'), false)"
            )
            conn.execute(
                sql.SQL(
                    "UPDATE {table} SET doc_key = CASE WHEN {chunk} THEN metadata->>'doc_key' "
                    "ELSE id END, chunk_index = CASE WHEN {chunk} THEN "
                    "(metadata->>'chunk_index')::integer END"
                ).format(table=table, chunk=sql.SQL(chunk))
            )
            conn.execute(
                sql.SQL("ALTER TABLE {table} ALTER COLUMN doc_key SET NOT NULL").format(table=table)
            )
            old_index = sql.Identifier(
                *self._table_name.split(".")[:-1], f"{self._base_name()}_doc_key"[:63]
            )
            conn.execute(sql.SQL("DROP INDEX IF EXISTS {index}").format(index=old_index))
        conn.execute(self.doc_index_statement())
        conn.execute(self.documents_statement())
        if not has_identity:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {documents} (doc_key, requested_ms, request_id, chunks) "
                    "SELECT doc_key, max(requested_ms), '', "
                    "CASE WHEN bool_or(chunk_index IS NOT NULL) THEN count(*)::integer END "
                    "FROM {table} GROUP BY doc_key ON CONFLICT (doc_key) DO NOTHING"
                ).format(documents=self.documents_table, table=table)
            )

    def create_sparse(self, conn: psycopg.Connection[Any], dim: int, metric: Metric) -> None:
        """Make the table hold sparse vectors of dimension ``dim``: a new table with the
        ``sparse`` column only (a dense sink adds ``vector`` when it comes), or an existing
        one given ``sparse sparsevec(dim)`` and ``sparse_model`` (``vector`` and ``model``
        become nullable: a row may hold one kind), its documents table the sparse version
        columns, and an HNSW index on ``sparse`` for ``metric``, built at once."""
        existing = self.sparse_dim(conn)
        if existing is not None:
            if existing != dim:
                raise DimensionMismatchError(
                    self._table_name, existing, dim, "the sparse results have"
                )
            return
        columns = self._columns(conn)
        with conn.transaction():
            documents = self.documents_table.as_string(conn)
            if conn.execute("SELECT to_regclass(%s)", [documents]).fetchone() != (None,):
                # Writers lock the documents table (their claims), then the table: so does
                # this change of both, or a writer that claimed, waiting for the table,
                # and this change, waiting for the documents table, would deadlock.
                conn.execute(
                    sql.SQL("LOCK TABLE {documents} IN ACCESS EXCLUSIVE MODE").format(
                        documents=self.documents_table
                    )
                )
            if columns is None:
                conn.execute(
                    self._table_statement(
                        sql.SQL("sparse sparsevec({dim}), sparse_model text").format(
                            dim=sql.Literal(dim)
                        ),
                        sql.SQL("model text"),
                    )
                )
                conn.execute(self.doc_index_statement())
                conn.execute(self.documents_statement())
            else:
                self.migrate(conn)
                conn.execute(
                    sql.SQL(
                        "ALTER TABLE {table} ALTER COLUMN model DROP NOT NULL, "
                        "ADD COLUMN sparse sparsevec({dim}), ADD COLUMN sparse_model text"
                    ).format(table=self._table, dim=sql.Literal(dim))
                )
                if "vector" in columns:
                    conn.execute(
                        sql.SQL("ALTER TABLE {table} ALTER COLUMN vector DROP NOT NULL").format(
                            table=self._table
                        )
                    )
            conn.execute(
                sql.SQL(
                    "ALTER TABLE {documents} ADD COLUMN IF NOT EXISTS sparse_requested_ms "
                    "bigint, ADD COLUMN IF NOT EXISTS sparse_request_id text"
                ).format(documents=self.documents_table)
            )
            conn.execute(
                self.index_statement(
                    _SPARSE_OPS[metric], "sparse", self._derived_name("_sparse_hnsw")
                )
            )
        log.info(
            "sink.column_added", table=self._table_name, column="sparse", dim=dim, metric=metric
        )

    def _base_name(self) -> str:
        return self._table_name.split(".")[-1]

    def _derived_name(self, suffix: str) -> str:
        """A name made from the table's and ``suffix``, within PostgreSQL's 63 bytes (the
        table's part is cut, so two suffixes never give one name)."""
        base = self._base_name().encode("utf-8")[: 63 - len(suffix)]
        return base.decode("utf-8", "ignore") + suffix

    @property
    def documents_table(self) -> sql.Identifier:
        """The documents table: one row per document key, its version and form."""
        *schema, _ = self._table_name.split(".")
        return sql.Identifier(*schema, self._derived_name("_documents"))

    def documents_statement(self) -> sql.Composed:
        return sql.SQL(
            "CREATE TABLE IF NOT EXISTS {documents} (doc_key text PRIMARY KEY, "
            "requested_ms bigint NOT NULL, request_id text NOT NULL, chunks integer)"
        ).format(documents=self.documents_table)

    def index_statement(
        self, ops: str, column: str = "vector", name: str | None = None
    ) -> sql.Composed:
        """The HNSW index on ``column`` (``vector``, or ``sparse``) with operator class
        ``ops``, named ``name`` (default: the dense index's name)."""
        m, ef_construction = self._hnsw
        return sql.SQL(
            "CREATE INDEX IF NOT EXISTS {index} ON {table} USING hnsw "
            "({column} {ops}) WITH (m = {m}, ef_construction = {ef})"
        ).format(
            index=sql.Identifier(name or self.index_name()),
            table=self._table,
            column=sql.Identifier(column),
            ops=sql.SQL(ops),
            m=sql.Literal(m),
            ef=sql.Literal(ef_construction),
        )

    def _table_statement(self, vectors: sql.Composable, model: sql.Composable) -> sql.Composed:
        """CREATE TABLE of kembed's columns, with ``vectors`` (the column(s) of one kind)
        and ``model`` (the model column, NOT NULL unless a row may lack a dense vector)."""
        return sql.SQL(
            "CREATE TABLE IF NOT EXISTS {table} ("
            "id text PRIMARY KEY, "
            "{vectors}, "
            "metadata jsonb NOT NULL DEFAULT '{{}}'::jsonb, "
            "{model}, "
            "requested_ms bigint NOT NULL DEFAULT 0, "
            "updated_at timestamptz NOT NULL DEFAULT now(), "
            "doc_key text NOT NULL, "
            "chunk_index integer)"
        ).format(table=self._table, vectors=vectors, model=model)

    def doc_index_statement(self) -> sql.Composed:
        """The index that finds a document's rows (one, or a few chunks, per key)."""
        name = self._derived_name("_doc_key_idx")
        return sql.SQL("CREATE INDEX IF NOT EXISTS {index} ON {table} (doc_key)").format(
            index=sql.Identifier(name), table=self._table
        )

    def pending_index(self, conn: psycopg.Connection[Any]) -> str | None:
        """The operator class of the HNSW index a bulk load left to build, if any."""
        regclass = self._table.as_string(conn)
        row = conn.execute(
            "SELECT obj_description(to_regclass(%s), 'pg_class')", [regclass]
        ).fetchone()
        note = row[0] if row else None
        if not isinstance(note, str) or not note.startswith(_PENDING):
            return None
        ops = note.removeprefix(_PENDING)
        if ops not in _OPS.values():
            raise TargetError(f"table {self._table_name!r}: unknown pending index {note!r}")
        return ops

    def index_name(self) -> str:
        return f"{self._table_name.split('.')[-1]}_vector_hnsw"[:63]
