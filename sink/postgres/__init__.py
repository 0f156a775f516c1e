"""PostgreSQL with pgvector: the ``VectorStore`` for ``postgresql://`` targets (psycopg 3).

``store`` (connections and the write path), ``schema`` (tables, indexes, migration),
``copy`` (the binary COPY rows), ``documents`` (a batch's documents), ``errors`` (write
failures by SQLSTATE).
"""

from sink.postgres.copy import copy_data
from sink.postgres.store import PostgresStore

__all__ = ["PostgresStore", "copy_data"]
