"""PostgreSQL with pgvector: the ``VectorStore`` for ``postgresql://`` targets (psycopg 3).

The table (created if absent)::

    id          text PRIMARY KEY         -- the request's keys[i]
    vector      vector(DIM) NOT NULL     -- float32 values, whatever the wire dtype
    metadata    jsonb NOT NULL           -- meta without "docs", merged with meta["docs"][i]
    model       text NOT NULL            -- the model that computed the vector
    requested_ms bigint NOT NULL         -- the row's version: when its request was produced
    updated_at  timestamptz NOT NULL     -- when the row was last written

with an HNSW index on ``vector`` for the chosen metric (``vector_ip_ops``,
``vector_cosine_ops`` or ``vector_l2_ops``). A batch is one transaction of
``INSERT ... ON CONFLICT (id) DO UPDATE ... WHERE stored requested_ms <= new``: replaying
it changes nothing but ``updated_at``, and a result older than the row (processed late: it
came on another partition) leaves the row alone. A table made by a sink that predates
``requested_ms`` gets the column (0 for its rows) at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
import structlog
from psycopg import sql
from psycopg.types.json import Jsonb

from sink.rows import Row
from sink.store import (
    DimensionMismatchError,
    Metric,
    RowsRefusedError,
    TargetError,
    TransientWriteError,
)
from sink.targets import TargetSpec, scrub

__all__ = ["HNSW_MAX_DIM", "PostgresStore"]

log = structlog.get_logger("kembed.sink")

HNSW_MAX_DIM = 2000
"""pgvector indexes ``vector`` columns of at most 2,000 dimensions with HNSW."""

_OPS: dict[Metric, str] = {
    "inner_product": "vector_ip_ops",
    "cosine": "vector_cosine_ops",
    "l2": "vector_l2_ops",
}
_COLUMNS = {"id", "vector", "metadata", "model", "updated_at"}


class PostgresStore:
    def __init__(
        self,
        spec: TargetSpec,
        table: str,
        *,
        connect_timeout_s: float = 10.0,
        hnsw_m: int = 16,
        hnsw_ef_construction: int = 64,
    ) -> None:
        self._spec = spec
        self._table_name = table
        self._table = sql.Identifier(*table.split("."))
        self._connect_timeout_s = connect_timeout_s
        self._hnsw = (hnsw_m, hnsw_ef_construction)
        self._conn: psycopg.Connection[Any] | None = None

    @property
    def name(self) -> str:
        return self._table_name

    # ------------------------------------------------------------------ connection

    def open(self) -> None:
        self.close()
        password = self._spec.password.get_secret_value() if self._spec.password else None
        try:
            self._conn = psycopg.connect(
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
        self._ensure_pgvector()

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self.open()
        assert self._conn is not None
        return self._conn

    def _ensure_pgvector(self) -> None:
        conn = self._connection()
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone():
            return
        try:
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
        conn = self._connection()
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
        typname, typmod = columns["vector"]
        if typname != "vector" or typmod <= 0:
            raise TargetError(
                f"table {self._table_name!r}: column vector is {typname}, not vector(N)"
            )
        dim: int = typmod
        return dim

    def create(self, dim: int, metric: Metric) -> None:
        conn = self._connection()
        existing = self.table_dim()
        if existing is not None:
            if existing != dim:
                raise DimensionMismatchError(self._table_name, existing, dim, "the results have")
            with conn.transaction():  # a table made before rows had versions
                conn.execute(
                    sql.SQL(
                        "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "
                        "requested_ms bigint NOT NULL DEFAULT 0"
                    ).format(table=self._table)
                )
            return
        m, ef_construction = self._hnsw
        with conn.transaction():
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {table} ("
                    "id text PRIMARY KEY, "
                    "vector vector({dim}) NOT NULL, "
                    "metadata jsonb NOT NULL DEFAULT '{{}}'::jsonb, "
                    "model text NOT NULL, "
                    "requested_ms bigint NOT NULL DEFAULT 0, "
                    "updated_at timestamptz NOT NULL DEFAULT now())"
                ).format(table=self._table, dim=sql.Literal(dim))
            )
            if dim <= HNSW_MAX_DIM:
                conn.execute(
                    sql.SQL(
                        "CREATE INDEX IF NOT EXISTS {index} ON {table} USING hnsw "
                        "(vector {ops}) WITH (m = {m}, ef_construction = {ef})"
                    ).format(
                        index=sql.Identifier(self._index_name()),
                        table=self._table,
                        ops=sql.SQL(_OPS[metric]),
                        m=sql.Literal(m),
                        ef=sql.Literal(ef_construction),
                    )
                )
        if dim > HNSW_MAX_DIM:
            log.warning(
                "sink.no_index",
                table=self._table_name,
                dim=dim,
                reason=f"pgvector's HNSW indexes vector columns of up to {HNSW_MAX_DIM} "
                "dimensions; queries will scan the table",
            )
        log.info("sink.table_created", table=self._table_name, dim=dim, metric=metric)

    def _index_name(self) -> str:
        return f"{self._table_name.split('.')[-1]}_vector_hnsw"[:63]

    # ------------------------------------------------------------------ writing

    def upsert(self, rows: Sequence[Row]) -> None:
        statement = sql.SQL(
            "INSERT INTO {table} (id, vector, metadata, model, requested_ms, updated_at) "
            "VALUES (%s, %s::vector, %s, %s, %s, now()) "
            "ON CONFLICT (id) DO UPDATE SET vector = EXCLUDED.vector, "
            "metadata = EXCLUDED.metadata, model = EXCLUDED.model, "
            "requested_ms = EXCLUDED.requested_ms, updated_at = EXCLUDED.updated_at "
            "WHERE {table}.requested_ms <= EXCLUDED.requested_ms"
        ).format(table=self._table)
        params = [
            (row.id, vector_literal(row), Jsonb(row.metadata), row.model, row.requested_ms)
            for row in rows
        ]
        try:
            conn = self._connection()
            with conn.transaction(), conn.cursor() as cursor:
                cursor.executemany(statement, params)
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            self.close()  # reconnect on the next try
            raise TransientWriteError(self._describe("write failed", exc)) from None
        except psycopg.DataError as exc:
            raise RowsRefusedError(self._describe("rows refused", exc)) from None

    def _describe(self, what: str, exc: BaseException) -> str:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return scrub(f"{what} ({self._spec.display}): {type(exc).__name__}: {detail}", self._spec)


def vector_literal(row: Row) -> str:
    """pgvector's text form of the row's vector. Python's repr of each float32 value (as a
    double) reads back to the same float32, so the stored vector is exactly the result's."""
    return "[" + ",".join(map(repr, row.vector.tolist())) + "]"
