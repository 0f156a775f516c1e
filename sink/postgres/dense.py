"""The statements of the Postgres store's dense write path (``PostgresStore._write_dense``):
claim documents, remove their rows, move the batch's rows in from the staging table."""

from __future__ import annotations

from psycopg import sql

from sink.postgres.sparse import NEWER_METADATA

__all__ = ["DenseStatements"]

_STAGING = "kembed_sink_staging"
"""The temporary table a batch is copied into (in the connection's own pg_temp schema)."""


class DenseStatements:
    """The statements of a dense write into ``table`` and its ``documents`` table."""

    def __init__(self, table: sql.Identifier, documents_table: sql.Identifier) -> None:
        staging = sql.Identifier(_STAGING)
        self.staging = sql.SQL(
            "CREATE TEMPORARY TABLE IF NOT EXISTS {staging} (id text NOT NULL, "
            "vector vector NOT NULL, metadata jsonb NOT NULL, model text NOT NULL, "
            "requested_ms bigint NOT NULL, doc_key text NOT NULL, chunk_index integer) "
            "ON COMMIT DELETE ROWS"
        ).format(staging=staging)
        """The connection's staging table: an unconstrained ``vector`` column, so a vector
        of another dimension fails at the INSERT into the table (a DataError, rows
        refused) as it would have failed writing there directly."""
        self.copy = sql.SQL(
            "COPY {staging} (id, vector, metadata, model, requested_ms, doc_key, chunk_index) "
            "FROM STDIN WITH (FORMAT BINARY)"
        ).format(staging=staging)
        self.claim = sql.SQL(
            "INSERT INTO {documents} AS d (doc_key, requested_ms, request_id, chunks) "
            "SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::integer[]) "
            "ORDER BY 1 "
            "ON CONFLICT (doc_key) DO UPDATE SET requested_ms = EXCLUDED.requested_ms, "
            "request_id = EXCLUDED.request_id, chunks = EXCLUDED.chunks "
            "WHERE (d.requested_ms, d.request_id) < (EXCLUDED.requested_ms, EXCLUDED.request_id) "
            "RETURNING doc_key, xmax = 0"  # xmax 0: inserted, the document had no rows
        ).format(documents=documents_table)
        self.remove = sql.SQL("DELETE FROM {table} WHERE doc_key = ANY(%s::text[])").format(
            table=table
        )
        # A table with sparse vectors: a replaced document's rows that hold one stay.
        self.remove_dense = sql.SQL(
            "DELETE FROM {table} WHERE doc_key = ANY(%s::text[]) AND sparse IS NULL"
        ).format(table=table)
        self.clear_dense = sql.SQL(
            "UPDATE {table} SET vector = NULL, model = NULL "
            "WHERE doc_key = ANY(%s::text[]) AND sparse IS NOT NULL AND vector IS NOT NULL"
        ).format(table=table)
        # Every row of the staging table, or (some documents were not claimed) those of
        # the claimed documents: a hash join, not an array search per row.
        move = sql.SQL(
            "INSERT INTO {table} AS t "
            "(id, vector, metadata, model, requested_ms, updated_at, doc_key, chunk_index) "
            "SELECT s.id, s.vector, s.metadata, s.model, s.requested_ms, now(), s.doc_key, "
            "s.chunk_index FROM {staging} s{claimed} "
            "ON CONFLICT (id) DO UPDATE SET vector = EXCLUDED.vector, "
            f"metadata = {NEWER_METADATA}, model = EXCLUDED.model, "
            "requested_ms = greatest(t.requested_ms, EXCLUDED.requested_ms), "
            "updated_at = EXCLUDED.updated_at, "
            "doc_key = EXCLUDED.doc_key, chunk_index = EXCLUDED.chunk_index"
        )
        self.move_all = move.format(table=table, staging=staging, claimed=sql.SQL(""))
        self.move_claimed = move.format(
            table=table,
            staging=staging,
            claimed=sql.SQL(" JOIN unnest(%s::text[]) AS w(doc_key) ON w.doc_key = s.doc_key"),
        )
