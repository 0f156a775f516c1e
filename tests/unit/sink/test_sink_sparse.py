"""Sparse results in the sink, as pure logic: a SparseResult becomes one sparse row per
input (its key the id, its terms exact, its metadata merged as a dense row's); a batch
with dense and sparse results writes both (the sparse column made at the first, for the
vocabulary size), dead-letters sparse results of another vocabulary, and, on a target
without sparse vectors, dead-letters them with ``sparse_not_supported``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from schemas import SparseResult, encode_result
from sink.rows import Refused, Row, RowsOf, SparseVector, newest, rows_of
from sink.store import Metric
from tests.unit.sink.test_sink_batch import TOPIC, FakeStore, Log, make_sink, record, vectors_result

VOCAB = 30522


def sparse_result(
    request_id: str,
    keys: tuple[str, ...] | None,
    terms: Sequence[dict[int, float]],
    *,
    vocab: int = VOCAB,
    requested_ms: int | None = None,
    meta: dict[str, Any] | None = None,
) -> bytes:
    ids = [i for row in terms for i in sorted(row)]
    weights = [row[i] for row in terms for i in sorted(row)]
    return encode_result(
        SparseResult(
            id=request_id,
            model="splade",
            vocab=vocab,
            counts=tuple(len(row) for row in terms),
            indices=np.asarray(ids, "<u4").tobytes(),
            values=np.asarray(weights, "<f4").tobytes(),
            tokens=(4,) * len(terms),
            requested_ms=requested_ms,
            keys=keys,
            meta=meta,
        )
    )


class FakeSparseStore(FakeStore):
    """A FakeStore that also holds sparse vectors (the Postgres store's SparseStore)."""

    def __init__(self, log: Log, dim: int | None = None, sparse: int | None = None) -> None:
        super().__init__(log, dim)
        self.sparse = sparse

    def sparse_dim(self) -> int | None:
        return self.sparse

    def create_sparse(self, dim: int, metric: Metric) -> None:
        self.log.calls.append(("create_sparse", (dim, metric)))
        self.sparse = dim

    def upsert(self, rows: Sequence[Row]) -> None:
        self.log.calls.append(("kinds", sorted((row.id, row.kind) for row in rows)))
        super().upsert(rows)


def test_a_sparse_result_becomes_one_exact_row_per_key() -> None:
    terms = [{7: 0.5, 3: 1.25, 30521: 2.0**-20}, {}, {11: 3.0}]
    meta = {"source": "s", "docs": [{"lang": "en"}, None, "plain"]}
    value = sparse_result("r1", ("a", "b", "c"), terms, requested_ms=5, meta=meta)
    result = rows_of(value, record_ms=9)
    assert isinstance(result, RowsOf)
    assert (result.kind, result.dim, result.model, result.request_id) == (
        "sparse",
        VOCAB,
        "splade",
        "r1",
    )
    assert [row.id for row in result.rows] == ["a", "b", "c"]
    for row, expected in zip(result.rows, terms, strict=True):
        vector = row.sparse
        assert isinstance(vector, SparseVector)
        assert row.kind == "sparse"
        assert vector.size == VOCAB
        assert vector.indices.dtype == np.int32
        assert vector.values.dtype == np.float32
        assert vector.indices.tolist() == sorted(expected)
        assert vector.values.tolist() == [expected[i] for i in sorted(expected)]
        assert (row.requested_ms, row.request_id, row.document) == (5, "r1", row.id)
    assert [row.metadata for row in result.rows] == [
        {"source": "s", "lang": "en"},
        {"source": "s"},
        {"source": "s", "docs": "plain"},
    ]
    with pytest.raises(AssertionError):
        _ = result.rows[0].dense


@pytest.mark.parametrize(
    ("keys", "meta", "code", "message"),
    [
        (None, None, "missing_keys", "no keys"),
        (("a#1", "b"), None, "invalid_key", "'#'"),
        (("a", "b"), {"docs": [{}]}, "invalid_result", "meta.docs must be a list of 2"),
        (("x" * 1025, "b"), None, "invalid_key", "longer than 1024"),
    ],
)
def test_a_sparse_result_without_usable_keys_is_refused(
    keys: tuple[str, ...] | None, meta: dict[str, Any] | None, code: str, message: str
) -> None:
    refused = rows_of(sparse_result("r1", keys, [{1: 1.0}, {2: 1.0}], meta=meta))
    assert isinstance(refused, Refused)
    assert refused.code == code
    assert message in refused.message
    assert refused.request_id == "r1"


def test_newest_reduces_each_kind_of_a_document_on_its_own() -> None:
    def row(key: str, ms: int, sparse: bool) -> Row:
        vector = (
            SparseVector(np.array([1], np.int32), np.array([1.0], np.float32), VOCAB)
            if sparse
            else np.ones(3, np.float32)
        )
        return Row(key, vector, {}, "m", ms, doc_key=key, request_id=f"r{ms}")

    rows = [row("a", 3, False), row("a", 1, True), row("a", 2, True), row("a", 1, False)]
    kept = newest(rows)
    assert sorted((r.kind, r.requested_ms) for r in kept) == [("dense", 3), ("sparse", 2)]


async def test_a_batch_writes_dense_and_sparse_rows_of_one_key_together() -> None:
    log = Log()
    store = FakeSparseStore(log)
    sink, _, metrics = make_sink(store, log)
    await sink._batch(
        [
            record(0, vectors_result("d1", ("a", "b"), 0.5)),
            record(1, sparse_result("s1", ("a",), [{5: 1.0}]), partition=1),
            record(2, sparse_result("s2", ("b",), [{6: 2.0}], vocab=100)),  # another vocab
        ]
    )
    assert log.calls == [
        ("create", (3, "cosine")),
        ("create_sparse", (VOCAB, "inner_product")),  # SPLADE scores by inner product
        ("kinds", [("a", "dense"), ("a", "sparse"), ("b", "dense")]),
        ("upsert", ["a", "b", "a"]),
        ("dead_letter", "dimension_mismatch"),
        ("commit", {(TOPIC, 0): 3, (TOPIC, 1): 2}),
    ]
    assert metrics.rows.labels("docs")._value.get() == 3
    # An existing sparse column's size is read, not made again; metric as configured.
    later = Log()
    sink, _, _ = make_sink(FakeSparseStore(later, dim=3, sparse=VOCAB), later, metric="cosine")
    await sink._batch([record(0, sparse_result("s3", ("c",), [{1: 1.0}]))])
    assert later.calls[0] == ("kinds", [("c", "sparse")])
    fresh = Log()
    sink, _, _ = make_sink(FakeSparseStore(fresh), fresh, metric="l2")
    await sink._batch([record(0, sparse_result("s4", ("d",), [{1: 1.0}]))])
    assert fresh.calls[0] == ("create_sparse", (VOCAB, "l2"))


async def test_a_target_without_sparse_vectors_dead_letters_sparse_results() -> None:
    log = Log()
    sink, publisher, _ = make_sink(FakeStore(log, dim=3), log)
    await sink._batch(
        [
            record(0, sparse_result("s1", ("a",), [{5: 1.0}])),
            record(1, vectors_result("d1", ("b",), 0.5)),
        ]
    )
    assert log.calls == [
        ("upsert", ["b"]),
        ("dead_letter", "sparse_not_supported"),
        ("commit", {(TOPIC, 0): 2}),
    ]
    _, _, headers = publisher.sent[0]
    assert b"dense vectors only" in headers["kembed.dlq.error.message"]
