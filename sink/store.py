"""What the sink needs from a vector database, whatever it is: the ``VectorStore`` port.

Implementations (``sink.postgres``, ``sink.milvus``) are synchronous; the sink calls them
on one dedicated thread, so a slow database never blocks its event loop (heartbeats,
probes, metrics scrapes go on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

from sink.rows import Row

__all__ = [
    "DimensionMismatchError",
    "IndexBuilder",
    "Metric",
    "RowsRefusedError",
    "SparseStore",
    "TargetError",
    "TransientWriteError",
    "VectorStore",
]

Metric = Literal["cosine", "inner_product", "l2"]


class TargetError(Exception):
    """The target cannot be used as configured (wrong URI, missing rights, a table of
    another shape): retrying will not help, the sink exits with status 2. The text never
    holds a password."""


class DimensionMismatchError(TargetError):
    """The table's vector dimension differs from the results' (or the configured one).
    ``source`` completes "but ... dimension N", e.g. "the results have"."""

    def __init__(self, table: str, table_dim: int, dim: int, source: str) -> None:
        super().__init__(
            f"table {table!r} holds vectors of dimension {table_dim}, but {source} "
            f"dimension {dim}: point the sink at another table (--table), or at the stream "
            "of the model this table was built for"
        )
        self.table_dim = table_dim
        self.dim = dim


class TransientWriteError(Exception):
    """The write failed for a reason that passes (connection lost, database restarting):
    nothing of the batch was written; reconnect and retry."""


class RowsRefusedError(Exception):
    """The database refused the data of this batch for good (say, a value it cannot store):
    nothing was written; the sink writes the batch result by result to find the culprit,
    and dead-letters it with ``code`` (what kind of refusal: ``invalid_value``,
    ``limit_exceeded``, ...; ``write_refused`` when the database does not say)."""

    def __init__(self, message: str, code: str = "write_refused") -> None:
        super().__init__(message)
        self.code = code


class VectorStore(Protocol):
    @property
    def name(self) -> str:
        """The table or collection, for logs and errors."""
        ...

    def open(self) -> None:
        """Connect (and, for Postgres, make sure pgvector is installed). Raises TargetError
        or TransientWriteError."""
        ...

    def table_dim(self) -> int | None:
        """The vector dimension of the existing table; None when there is no table yet."""
        ...

    def create(self, dim: int, metric: Metric) -> None:
        """Create the table and its HNSW index if absent."""
        ...

    def upsert(self, rows: Sequence[Row]) -> None:
        """Insert or replace ``rows`` by id, all or nothing (one transaction). Raises
        TransientWriteError, RowsRefusedError, or anything else for a fatal failure."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class IndexBuilder(Protocol):
    """A store that can load a table without its vector index and build it afterwards
    (Postgres' bulk mode, ``index=after``)."""

    def build_pending_index(self) -> float | None:
        """Build the index a bulk load left pending: the seconds the build took, or None
        when no index is pending (none was deferred, or it was built already)."""
        ...


@runtime_checkable
class SparseStore(Protocol):
    """A store that also holds sparse vectors (rows of ``kind`` ``"sparse"``), beside the
    dense ones and in the same rows (the Postgres store: a ``sparsevec`` column). A store
    without it has its sparse results dead-lettered (``sparse_not_supported``)."""

    def sparse_dim(self) -> int | None:
        """The dimension (vocabulary size) of the stored sparse vectors; None when the
        table holds none yet."""
        ...

    def create_sparse(self, dim: int, metric: Metric) -> None:
        """Make the table hold sparse vectors of ``dim`` (creating it if absent), with an
        index for ``metric``. Raises DimensionMismatchError for another ``dim``."""
        ...
