"""Sparse vectors in Milvus Lite (the same store code as a Milvus server): a companion
collection ``{collection}_sparse`` with an inner-product SPARSE_INVERTED_INDEX, made at the
first sparse result; terms stored exactly, each document's sparse vector at its own
version, a search by a document's sparse vector finding it, another vocabulary refused."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sink.milvus import MilvusStore
from sink.registry import parse_target
from sink.rows import Row, SparseVector
from sink.store import DimensionMismatchError
from tests.integration.test_sink_postgres_sparse import DIM, VOCAB, _dense_rows, _sparse_rows

pytestmark = pytest.mark.integration


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MilvusStore]:
    store = MilvusStore(parse_target(f"milvus://{tmp_path / 'sparse.db'}", None), "docs")
    store.open()
    yield store
    store.close()


def _sparse_stored(store: MilvusStore) -> dict[str, dict[str, Any]]:
    hits = store._connected().query(
        "docs_sparse",
        filter='id != ""',
        output_fields=["sparse", "requested_ms", "request_id", "metadata", "model", "doc_key"],
    )
    return {hit["id"]: hit for hit in hits}


def _same(stored: dict[int, float], row: Row) -> bool:
    vector = row.sparse
    ids = np.array(sorted(stored), np.int64)
    values = np.array([stored[i] for i in sorted(stored)], np.float32)
    return ids.tolist() == vector.indices.tolist() and values.tobytes() == vector.values.tobytes()


def test_milvus_sparse_vectors_round_trip_keep_their_version_and_answer_a_search(
    store: MilvusStore,
) -> None:
    keys = [f"doc-{i}" for i in range(40)]
    store.create(DIM, "cosine")
    store.upsert(_dense_rows(keys, 1_000, seed=1))
    assert store.sparse_dim() is None
    store.create_sparse(VOCAB, "inner_product")
    assert store.sparse_dim() == VOCAB
    rows = _sparse_rows(keys, 2_000, seed=2)
    store.upsert(rows[:25])
    store.upsert(rows[25:] + _dense_rows(["dense-only"], 1_000, seed=3))
    store.upsert(_sparse_rows(keys[:5], 1_500, seed=4))  # older: changes nothing
    newer = _sparse_rows(keys[5:7], 3_000, seed=5)
    store.upsert(newer)
    stored = _sparse_stored(store)
    assert set(stored) == set(keys)
    expected = {row.id: row for row in rows} | {row.id: row for row in newer}
    for key, row in expected.items():
        hit = stored[key]
        assert _same(hit["sparse"], row), key
        assert (int(hit["requested_ms"]), hit["request_id"]) == row.version
        assert (hit["model"], hit["doc_key"], hit["metadata"]) == (
            "splade-ü",
            key,
            row.metadata,
        )
    dense = store._connected().query("docs", filter='id != ""', output_fields=["id"])
    assert {hit["id"] for hit in dense} == {*keys, "dense-only"}
    query = rows[17].sparse
    found = store._connected().search(
        "docs_sparse",
        data=[dict(zip(query.indices.tolist(), query.values.tolist(), strict=True))],
        anns_field="sparse",
        limit=1,
        search_params={"metric_type": "IP"},
    )
    assert found[0][0]["id"] == keys[17]
    with pytest.raises(DimensionMismatchError, match="sparse results"):
        store.create_sparse(VOCAB + 1, "inner_product")


def test_milvus_sparse_collection_is_inner_product_whatever_the_metric(
    store: MilvusStore, tmp_path: Path
) -> None:
    store.create_sparse(VOCAB, "cosine")  # warned: Milvus has IP only for sparse vectors
    store.upsert(_sparse_rows(["a"], 1_000, seed=1))
    indexes = store._connected().describe_index("docs_sparse", "sparse")
    assert indexes["metric_type"] == "IP"
    assert store.table_dim() is None  # no dense collection until dense results come
    again = MilvusStore(parse_target(f"milvus://{tmp_path / 'sparse.db'}", None), "docs")
    store.close()
    again.open()
    try:
        assert again.sparse_dim() == VOCAB
    finally:
        again.close()


def test_a_sparse_vector_without_terms_has_no_milvus_row_and_spoils_no_batch(
    store: MilvusStore,
) -> None:
    """Milvus refuses a sparse vector with no nonzero weight (a text whose every term
    weighs zero): such a document has no row (an older one of it is deleted), and the rest
    of its batch is written."""
    store.create_sparse(VOCAB, "inner_product")
    store.upsert(_sparse_rows(["a", "b", "c"], 1_000, seed=1))
    rows = _sparse_rows(["a", "b", "c"], 2_000, seed=2)
    empty = SparseVector(np.zeros(0, np.int32), np.zeros(0, np.float32), VOCAB)
    rows[1] = replace(rows[1], vector=empty)
    store.upsert(rows)
    stored = _sparse_stored(store)
    assert set(stored) == {"a", "c"}
    assert _same(stored["a"]["sparse"], rows[0])
    assert _same(stored["c"]["sparse"], rows[2])
