"""The Postgres store's sparse write path: a batch's sparse rows into the ``sparse`` column
of their documents' rows, at the sparse kind's own version (see ``sink.postgres.store``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from sink.postgres.copy import sparse_copy_data
from sink.postgres.documents import documents
from sink.rows import Row

__all__ = ["NEWER_METADATA", "SparseStatements", "write_sparse"]

NEWER_METADATA = (
    "CASE WHEN EXCLUDED.requested_ms >= t.requested_ms THEN EXCLUDED.metadata ELSE t.metadata END"
)
"""A row written by both kinds has the metadata of the newer write (by requested_ms), and
its ``requested_ms`` is the newer's: whichever order the sink processes them in."""

_STAGING = "kembed_sink_staging_sparse"
"""The temporary table a batch's sparse rows are copied into (per connection)."""


class SparseStatements:
    """The statements of a sparse write into ``table`` and its ``documents`` table."""

    def __init__(self, table: sql.Identifier, documents_table: sql.Identifier) -> None:
        staging = sql.Identifier(_STAGING)
        self.staging = sql.SQL(
            "CREATE TEMPORARY TABLE IF NOT EXISTS {staging} (id text NOT NULL, "
            "sparse sparsevec NOT NULL, metadata jsonb NOT NULL, model text NOT NULL, "
            "requested_ms bigint NOT NULL, doc_key text NOT NULL) ON COMMIT DELETE ROWS"
        ).format(staging=staging)
        """The connection's staging table: an unconstrained ``sparsevec``, so a vector of
        another dimension fails at the INSERT into the table (rows refused)."""
        self.copy = sql.SQL(
            "COPY {staging} (id, sparse, metadata, model, requested_ms, doc_key) "
            "FROM STDIN WITH (FORMAT BINARY)"
        ).format(staging=staging)
        self.claim = sql.SQL(
            "INSERT INTO {documents} AS d (doc_key, requested_ms, request_id, chunks, "
            "sparse_requested_ms, sparse_request_id) "
            "SELECT k, -1, '', NULL, ms, rid "
            "FROM unnest(%s::text[], %s::bigint[], %s::text[]) AS u(k, ms, rid) ORDER BY 1 "
            "ON CONFLICT (doc_key) DO UPDATE SET "
            "sparse_requested_ms = EXCLUDED.sparse_requested_ms, "
            "sparse_request_id = EXCLUDED.sparse_request_id "
            "WHERE (coalesce(d.sparse_requested_ms, -1), coalesce(d.sparse_request_id, '')) "
            "< (EXCLUDED.sparse_requested_ms, EXCLUDED.sparse_request_id) "
            "RETURNING doc_key"
        ).format(documents=documents_table)
        self.move = sql.SQL(
            "INSERT INTO {table} AS t "
            "(id, sparse, metadata, sparse_model, requested_ms, updated_at, doc_key) "
            "SELECT s.id, s.sparse, s.metadata, s.model, s.requested_ms, now(), s.doc_key "
            "FROM {staging} s JOIN unnest(%s::text[]) AS w(doc_key) ON w.doc_key = s.doc_key "
            "ON CONFLICT (id) DO UPDATE SET sparse = EXCLUDED.sparse, "
            f"sparse_model = EXCLUDED.sparse_model, metadata = {NEWER_METADATA}, "
            "requested_ms = greatest(t.requested_ms, EXCLUDED.requested_ms), "
            "updated_at = EXCLUDED.updated_at"
        ).format(table=table, staging=staging)


def write_sparse(
    cursor: psycopg.Cursor[Any], statements: SparseStatements, rows: Sequence[Row]
) -> None:
    """In the caller's transaction: copy ``rows`` into the staging table (before the claim:
    locks are held briefly), claim their documents' sparse version in the documents table
    (in key order, under each document's row lock until the commit, as dense writes do; a
    document new to it gets dense version -1, older than any), then upsert the claimed
    documents' rows (id = key), setting ``sparse``, ``sparse_model``, ``updated_at``, and
    ``metadata`` and ``requested_ms`` when newer than the row's: a row's dense vector is
    left as it is. A document whose stored sparse version is the same or newer is left
    alone (a replay, or a result processed late)."""
    keys, versions, request_ids, _ = documents(rows).columns()
    with cursor.copy(statements.copy) as pipe:
        pipe.write(sparse_copy_data(rows))
    cursor.execute(statements.claim, [keys, versions, request_ids])
    won = [key for (key,) in cursor.fetchall()]
    if won:
        cursor.execute(statements.move, [won])
