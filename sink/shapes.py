"""What the sink's table holds, per vector kind: the dimension of its dense vectors and of
its sparse ones, read from the table or made at the first result of that kind; results of
another dimension are refused (see ``sink.consumer``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from kembed_shared.ports import Record
from sink.rows import DIMENSION_MISMATCH, Refused, RowsOf
from sink.settings import SinkSettings
from sink.store import DimensionMismatchError, Metric, SparseStore, VectorStore

__all__ = ["SPARSE_NOT_SUPPORTED", "TableShape"]

_T = TypeVar("_T")

SPARSE_NOT_SUPPORTED = "sparse_not_supported"
"""Dead-letter code of a sparse result on a sink whose target stores dense vectors only."""
_UNIT_NORM_TOLERANCE = 1e-2  # int8 codes of a unit vector are unit length to within ~1e-3

Results = list[tuple[Record, RowsOf]]


class TableShape:
    """The table's dimensions: dense (``table_dim``: the existing table's, else the
    setting, else the first result's) and sparse (read at the first sparse result)."""

    def __init__(
        self,
        store: VectorStore,
        settings: SinkSettings,
        table_dim: int | None,
        executor: ThreadPoolExecutor,
    ) -> None:
        self._store = store
        self._settings = settings
        self._executor = executor
        self.exists = table_dim is not None
        """Whether the table (with its dense column) exists."""
        self._dim = table_dim or settings.dim
        self._sparse_dim: int | None = None

    async def matching(
        self, good: Results, dead: list[tuple[Record, Refused]], written_any: bool
    ) -> Results:
        """The results the table can take, dense then sparse (the table or its sparse
        column made at the first that needs it); the others appended to ``dead``."""
        dense = [(r, res) for r, res in good if res.kind == "dense"]
        sparse = [(r, res) for r, res in good if res.kind == "sparse"]
        return await self._dense(dense, dead, written_any) + await self._sparse(sparse, dead)

    async def _dense(
        self, good: Results, dead: list[tuple[Record, Refused]], written_any: bool
    ) -> Results:
        """The dense results of the table's dimension; the others dead-lettered, unless
        none matches before anything was written: then the sink points at the wrong
        table, and stops."""
        if not good:
            return []
        await self._ensure_table(good)
        matching = [(r, res) for r, res in good if res.dim == self._dim]
        if not matching and not written_any:
            raise DimensionMismatchError(
                self._store.name,
                self._dim or 0,
                good[0][1].dim,
                f"the results on {self._settings.results_topic!r} have",
            )
        dead.extend((r, _mismatch(res, self._dim)) for r, res in good if res.dim != self._dim)
        return matching

    async def _sparse(self, good: Results, dead: list[tuple[Record, Refused]]) -> Results:
        """The sparse results of the table's sparse dimension (its vocabulary size); the
        others dead-lettered, and all of them on a target that holds dense vectors only."""
        if not good:
            return []
        store = self._store
        if not isinstance(store, SparseStore):
            dead.extend((record, _no_sparse(result, store.name)) for record, result in good)
            return []
        if self._sparse_dim is None:
            dim = await self._in_db(store.sparse_dim)
            if dim is None:
                dim = good[0][1].dim
                metric: Metric = (
                    "inner_product" if self._settings.metric == "auto" else self._settings.metric
                )
                await self._in_db(lambda: store.create_sparse(dim, metric))
            self._sparse_dim = dim
        sparse_dim = self._sparse_dim
        dead.extend((r, _mismatch(res, sparse_dim)) for r, res in good if res.dim != sparse_dim)
        return [(r, res) for r, res in good if res.dim == sparse_dim]

    async def _ensure_table(self, good: Results) -> None:
        """Create the table at the first batch that needs it: of the configured dimension,
        or the first result's, and the metric the settings or the vectors call for."""
        if self.exists:
            return
        dim = self._dim or good[0][1].dim
        metric = self._metric([result for _, result in good if result.dim == dim])
        await self._in_db(lambda: self._store.create(dim, metric))
        self.exists, self._dim = True, dim

    def _metric(self, results: list[RowsOf]) -> Metric:
        if self._settings.metric != "auto":
            return self._settings.metric
        vectors = np.stack([row.dense for result in results for row in result.rows])
        norms = np.linalg.norm(vectors, axis=1)
        unit = bool(np.all(np.abs(norms - 1.0) <= _UNIT_NORM_TOLERANCE))
        return "inner_product" if unit else "cosine"

    def _in_db(self, call: Callable[[], _T]) -> asyncio.Future[_T]:
        return asyncio.get_running_loop().run_in_executor(self._executor, call)


def _mismatch(result: RowsOf, dim: int | None) -> Refused:
    held = "the table's sparse vectors have" if result.kind == "sparse" else "the table holds"
    kind = "sparse vectors" if result.kind == "sparse" else "vectors"
    return Refused(
        DIMENSION_MISMATCH,
        f"{kind} of dimension {result.dim}; {held} dimension {dim}",
        request_id=result.request_id,
        keys=tuple(row.id for row in result.rows),
    )


def _no_sparse(result: RowsOf, target: str) -> Refused:
    return Refused(
        SPARSE_NOT_SUPPORTED,
        f"a sparse result; {target!r} stores dense vectors only (write sparse results to "
        "a PostgreSQL target)",
        request_id=result.request_id,
        keys=tuple(row.id for row in result.rows),
    )
