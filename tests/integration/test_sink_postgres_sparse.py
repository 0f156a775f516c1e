"""Sparse vectors in the Postgres store, against a real PostgreSQL with pgvector: a
``sparsevec`` column beside the dense ``vector`` in one row per document key, each kind at
its own version in the documents table; exact round trips (pgvector's binary form read
back bit for bit), a nearest-neighbour query on the sparse HNSW index, a table made by
sparse results first, and sparse vectors too large for the index refused."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql

from scripts.pg_local import LocalPostgres
from sink.rows import Row, SparseVector
from sink.store import DimensionMismatchError, RowsRefusedError
from tests.integration.test_sink_postgres_write import _store

pytestmark = pytest.mark.integration


@pytest.fixture
def conn(postgres: LocalPostgres) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(postgres.dsn, password=postgres.password, autocommit=True) as c:
        yield c


DIM = 8
VOCAB = 30522


def _sparse(rng: np.random.Generator, nnz: int) -> SparseVector:
    ids = np.sort(rng.choice(VOCAB, nnz, replace=False)).astype(np.int32)
    values = rng.uniform(0.01, 3.0, nnz).astype(np.float32)
    values[0] = np.float32(1e-45)  # a subnormal: the text form would round it
    return SparseVector(ids, values, VOCAB)


def _sparse_rows(keys: list[str], version: int, seed: int, nnz: int = 40) -> list[Row]:
    rng = np.random.default_rng(seed)
    return [
        Row(
            key,
            _sparse(rng, nnz),
            {"n": i, "kind": "sparse"},
            "splade-ü",
            version,
            doc_key=key,
            request_id=f"sparse-{version}",
        )
        for i, key in enumerate(keys)
    ]


def _dense_rows(keys: list[str], version: int, seed: int) -> list[Row]:
    rng = np.random.default_rng(seed)
    return [
        Row(
            key,
            rng.standard_normal(DIM).astype(np.float32),
            {"n": i, "kind": "dense"},
            "dense-model",
            version,
            doc_key=key,
            request_id=f"dense-{version}",
        )
        for i, key in enumerate(keys)
    ]


def _chunk_rows(key: str, chunks: int, version: int, seed: int) -> list[Row]:
    rng = np.random.default_rng(seed)
    return [
        Row(
            f"{key}#{k}",
            rng.standard_normal(DIM).astype(np.float32),
            {"chunk_index": k},
            "dense-model",
            version,
            doc_key=key,
            chunks=chunks,
            chunk_index=k,
            request_id=f"chunks-{version}",
        )
        for k in range(chunks)
    ]


def _stored(conn: psycopg.Connection[Any], table: str) -> dict[str, dict[str, Any]]:
    """Each row: its sparse vector read in pgvector's binary form (bit for bit), whether it
    has a dense vector, its models and metadata."""
    query = sql.SQL(
        "SELECT id, sparsevec_send(sparse), {dense}, model, sparse_model, metadata FROM {t}"
    )
    columns = {
        name
        for (name,) in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0",
            [table],
        ).fetchall()
    }
    dense = sql.SQL("vector IS NOT NULL" if "vector" in columns else "false")
    out = {}
    for row_id, raw, has_dense, model, sparse_model, metadata in conn.execute(
        query.format(dense=dense, t=sql.Identifier(table))
    ).fetchall():
        vector = None
        if raw is not None:
            dim, nnz, unused = np.frombuffer(raw[:12], ">i4")
            assert unused == 0
            ids = np.frombuffer(raw[12:], ">i4", nnz).astype(np.int32)
            values = np.frombuffer(raw[12 + 4 * nnz :], ">f4", nnz).astype(np.float32)
            vector = (int(dim), ids, values)
        out[row_id] = {
            "sparse": vector,
            "dense": has_dense,
            "model": model,
            "sparse_model": sparse_model,
            "metadata": metadata,
        }
    return out


def _same(stored: tuple[int, Any, Any] | None, row: Row) -> bool:
    assert stored is not None
    dim, ids, values = stored
    vector = row.sparse
    return (
        dim == vector.size
        and ids.tobytes() == vector.indices.tobytes()
        and values.tobytes() == vector.values.tobytes()
    )


def test_sparse_rows_round_trip_exactly_beside_dense_ones_and_answer_a_query(
    postgres: LocalPostgres, conn: psycopg.Connection[Any]
) -> None:
    """A dense table given sparse vectors: one row per key holds both, each bit for bit;
    the sparse HNSW index answers an inner-product query with the expected document."""
    keys = [f"doc-{i}-é" for i in range(60)]
    dense, sparse = _dense_rows(keys, 1_000, seed=1), _sparse_rows(keys, 1_000, seed=2)
    store = _store(postgres, "sparse_beside")
    try:
        store.create(DIM, "cosine")
        store.upsert(dense)
        assert store.sparse_dim() is None
        store.create_sparse(VOCAB, "inner_product")
        assert store.sparse_dim() == VOCAB
        assert store.table_dim() == DIM
        store.upsert(sparse[:30])
        store.upsert(sparse[30:] + _dense_rows(["only-dense"], 1_000, seed=3))
    finally:
        store.close()
    stored = _stored(conn, "sparse_beside")
    assert set(stored) == {*keys, "only-dense"}
    for row in sparse:
        got = stored[row.id]
        assert _same(got["sparse"], row)
        assert got["dense"] is True
        assert (got["model"], got["sparse_model"]) == ("dense-model", "splade-ü")
    assert stored["only-dense"]["sparse"] is None
    query = sparse[17].sparse
    terms = ",".join(
        f"{i + 1}:{float(v)!r}" for i, v in zip(query.indices, query.values, strict=True)
    )
    literal = f"{{{terms}}}/{VOCAB}"  # the text form counts dimensions from 1
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")  # the HNSW index, not a scan
        plan = conn.execute(
            "EXPLAIN SELECT id FROM sparse_beside ORDER BY sparse <#> %s::sparsevec LIMIT 3",
            [literal],
        ).fetchall()
        nearest = conn.execute(
            "SELECT id FROM sparse_beside ORDER BY sparse <#> %s::sparsevec LIMIT 1", [literal]
        ).fetchone()
    assert any("sparse_beside_sparse_hnsw" in line for (line,) in plan), plan
    assert nearest == (keys[17],)


def test_each_kind_keeps_its_own_version(
    postgres: LocalPostgres, conn: psycopg.Connection[Any]
) -> None:
    """An older sparse version changes nothing; a newer one replaces the sparse vector and
    leaves the dense one; a dense replacement (even into chunks, and back) keeps the
    sparse vector; a replay is idempotent."""
    store = _store(postgres, "sparse_versions")
    try:
        store.create(DIM, "cosine")
        store.create_sparse(VOCAB, "inner_product")
        store.upsert(_dense_rows(["a", "b"], 2_000, seed=1))
        newer = _sparse_rows(["a", "b"], 3_000, seed=2)
        store.upsert(newer)
        store.upsert(_sparse_rows(["a", "b"], 2_500, seed=3))  # older: ignored
        store.upsert(newer)  # a replay
        after = _stored(conn, "sparse_versions")
        assert _same(after["a"]["sparse"], newer[0])
        assert _same(after["b"]["sparse"], newer[1])
        assert after["a"]["dense"]
        assert after["b"]["dense"]
        assert after["b"]["metadata"]["kind"] == "sparse"  # the newer write's
        # Document a becomes three chunks: its row "a" keeps the sparse vector, no dense.
        store.upsert(_chunk_rows("a", 3, 4_000, seed=4))
        chunked = _stored(conn, "sparse_versions")
        assert set(chunked) == {"a", "a#0", "a#1", "a#2", "b"}
        assert chunked["a"]["dense"] is False
        assert chunked["a"]["model"] is None
        assert _same(chunked["a"]["sparse"], newer[0])
        assert all(
            chunked[f"a#{k}"]["dense"] and chunked[f"a#{k}"]["sparse"] is None for k in range(3)
        )
        # An older dense version of a (one vector) is refused by the documents table.
        store.upsert(_dense_rows(["a"], 3_500, seed=5))
        assert set(_stored(conn, "sparse_versions")) == set(chunked)
        # A newer one: the chunks go, row a holds both again.
        store.upsert(_dense_rows(["a"], 5_000, seed=6))
        back = _stored(conn, "sparse_versions")
        assert set(back) == {"a", "b"}
        assert back["a"]["dense"]
        assert _same(back["a"]["sparse"], newer[0])
        latest = _sparse_rows(["a"], 6_000, seed=7)
        store.upsert(latest)
        assert _same(_stored(conn, "sparse_versions")["a"]["sparse"], latest[0])
        # A sparse vector older than the row's dense one: the metadata stays the dense's.
        store.upsert(_dense_rows(["c"], 9_000, seed=8))
        store.upsert(_sparse_rows(["c"], 8_000, seed=9))
        c = _stored(conn, "sparse_versions")["c"]
        assert c["metadata"]["kind"] == "dense"
        assert c["sparse"] is not None
        assert _stored(conn, "sparse_versions")["a"]["metadata"]["kind"] == "sparse"
        versions = conn.execute(
            "SELECT doc_key, requested_ms, sparse_requested_ms, sparse_request_id "
            "FROM sparse_versions_documents ORDER BY doc_key"
        ).fetchall()
    finally:
        store.close()
    assert versions == [
        ("a", 5_000, 6_000, "sparse-6000"),
        ("b", 2_000, 3_000, "sparse-3000"),
        ("c", 9_000, 8_000, "sparse-8000"),
    ]


def test_a_table_made_by_sparse_results_first_takes_dense_ones_later(
    postgres: LocalPostgres, conn: psycopg.Connection[Any]
) -> None:
    """Sparse results make a table with no dense column; dense results add it (with its
    index); a second sparse sink sees the vocabulary size, and another size is refused."""
    store = _store(postgres, "sparse_first")
    try:
        assert store.sparse_dim() is None
        store.create_sparse(VOCAB, "inner_product")
        assert store.table_dim() is None
        rows = _sparse_rows(["x", "y"], 1_000, seed=1)
        store.upsert(rows)
        assert _stored(conn, "sparse_first")["x"]["dense"] is False
        store.create(DIM, "l2")
        assert store.table_dim() == DIM
        store.upsert(_dense_rows(["y", "z"], 1_000, seed=2))
        with pytest.raises(DimensionMismatchError, match="sparse results"):
            store.create_sparse(VOCAB + 1, "inner_product")
    finally:
        store.close()
    other = _store(postgres, "sparse_first")
    try:
        assert other.sparse_dim() == VOCAB
    finally:
        other.close()
    stored = _stored(conn, "sparse_first")
    assert {key: (row["dense"], row["sparse"] is not None) for key, row in stored.items()} == {
        "x": (False, True),
        "y": (True, True),
        "z": (True, False),
    }
    assert _same(stored["y"]["sparse"], rows[1])
    indexes = {
        name
        for (name,) in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'sparse_first'"
        ).fetchall()
    }
    assert {"sparse_first_vector_hnsw", "sparse_first_sparse_hnsw"} <= indexes


def test_a_sparse_vector_over_the_index_limit_is_refused_and_nothing_written(
    postgres: LocalPostgres, conn: psycopg.Connection[Any]
) -> None:
    """pgvector's HNSW index holds at most 1,000 nonzero values: a batch with a longer
    vector is refused as a whole (the sink then finds the culprit result)."""
    store = _store(postgres, "sparse_limit")
    try:
        store.create_sparse(VOCAB, "inner_product")
        fits = _sparse_rows(["ok"], 1_000, seed=1, nnz=1000)
        store.upsert(fits)
        with pytest.raises(RowsRefusedError) as refused:
            store.upsert(_sparse_rows(["big", "small"], 1_000, seed=2, nnz=1001))
        store.upsert(_sparse_rows(["small"], 1_000, seed=3))
    finally:
        store.close()
    assert refused.value.code == "limit_exceeded"
    assert "1000" in str(refused.value)
    assert set(_stored(conn, "sparse_limit")) == {"ok", "small"}


def test_dense_and_sparse_writers_at_once_leave_each_kind_at_its_newest_version(
    postgres: LocalPostgres, conn: psycopg.Connection[Any]
) -> None:
    """Two stores (two sinks) write one table at once, one dense versions (per input and in
    chunks) and one sparse versions of the same documents, in shuffled orders, the sparse
    column added by the sparse writer while the dense one is writing: every document ends
    with its newest dense version's rows and its newest sparse vector, nothing lost, no
    deadlock."""
    keys = [f"k{i}" for i in range(30)]
    rng = np.random.default_rng(11)
    dense_batches = []
    for round_ in range(12):
        version = 1_000 + int(rng.integers(0, 50)) * 10 + round_  # unique per round
        chosen = [k for k in keys if rng.random() < 0.6]
        rows: list[Row] = []
        for k in chosen:
            chunks = int(rng.integers(0, 3))
            rows += (
                _chunk_rows(k, chunks, version, round_)
                if chunks
                else _dense_rows([k], version, round_)
            )
        dense_batches.append(rows)
    sparse_batches = [
        _sparse_rows([k for k in keys if rng.random() < 0.6], 1_000 + int(v), seed=int(v))
        for v in rng.permutation(np.arange(12) * 7 + 1)
    ]
    store = _store(postgres, "sparse_race")
    store.create(DIM, "cosine")
    store.close()
    barrier = threading.Barrier(2)

    def write(batches: list[list[Row]], sparse: bool) -> None:
        writer = _store(postgres, "sparse_race")
        try:
            barrier.wait()
            for index, batch in enumerate(batches):
                if sparse and index == 1:
                    writer.create_sparse(VOCAB, "inner_product")  # mid-stream
                if batch and (not sparse or index >= 1):
                    writer.upsert(batch)
        finally:
            writer.close()

    with ThreadPoolExecutor(2) as pool:
        done = [
            pool.submit(write, dense_batches, False),
            pool.submit(write, sparse_batches, True),
        ]
        for future in done:
            future.result(timeout=120)
    newest_dense: dict[str, list[Row]] = {}
    for batch in dense_batches:
        for doc in {row.document for row in batch}:
            rows = [row for row in batch if row.document == doc]
            if doc not in newest_dense or newest_dense[doc][0].version < rows[0].version:
                newest_dense[doc] = rows
    newest_sparse: dict[str, Row] = {}
    for batch in sparse_batches[1:]:  # the first came before the column: never written
        for row in batch:
            if row.id not in newest_sparse or newest_sparse[row.id].version < row.version:
                newest_sparse[row.id] = row
    stored = _stored(conn, "sparse_race")
    expected_ids = {row.id for rows in newest_dense.values() for row in rows}
    expected_ids |= set(newest_sparse)
    assert set(stored) == expected_ids
    for doc, rows in newest_dense.items():
        for row in rows:
            assert stored[row.id]["dense"], row.id
        if doc in newest_sparse and doc not in {row.id for row in rows}:
            assert stored[doc]["dense"] is False  # the chunks hold the dense vectors
    for key, row in newest_sparse.items():
        assert _same(stored[key]["sparse"], row), key


def test_adding_the_sparse_column_waits_for_a_writer_that_claimed_documents(
    postgres: LocalPostgres, conn: psycopg.Connection[Any]
) -> None:
    """A dense write that has claimed its documents (their rows in the documents table
    locked) and not yet written the table, while a sparse sink adds its column: the
    change waits for the documents table before it takes the table, so the write goes on
    and both finish (locking the table first would deadlock, and PostgreSQL would abort
    one of the two)."""
    store = _store(postgres, "sparse_lock_order")
    store.create(DIM, "cosine")
    store.upsert(_dense_rows(["a"], 1_000, seed=1))
    store.close()
    adder = _store(postgres, "sparse_lock_order")
    with psycopg.connect(postgres.dsn, password=postgres.password) as writer:
        writer.execute(  # a dense write's claim: the document's row locked to the commit
            "UPDATE sparse_lock_order_documents SET requested_ms = 2000 WHERE doc_key = 'a'"
        )
        with ThreadPoolExecutor(1) as pool:
            added = pool.submit(adder.create_sparse, VOCAB, "inner_product")
            for _ in range(200):  # until the change waits on the writer's lock
                waiting = conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
                if (waiting.fetchone() or (0,))[0]:
                    break
                threading.Event().wait(0.05)
            writer.execute("DELETE FROM sparse_lock_order WHERE doc_key = 'a'")  # the write
            writer.commit()
            added.result(timeout=60)
    adder.close()
    assert conn.execute("SELECT count(*) FROM sparse_lock_order").fetchone() == (0,)
    columns = {
        name
        for (name,) in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'sparse_lock_order'::regclass"
        ).fetchall()
    }
    assert {"sparse", "sparse_model"} <= columns


def test_a_sparse_vector_without_terms_is_stored_empty_in_postgres(
    postgres: LocalPostgres, conn: psycopg.Connection[Any]
) -> None:
    """A text whose every term weighs zero: its row holds an empty sparsevec (pgvector
    takes it, index and all), beside the others of its batch."""
    store = _store(postgres, "sparse_empty")
    try:
        store.create_sparse(VOCAB, "inner_product")
        rows = _sparse_rows(["a", "b"], 1_000, seed=1)
        empty = SparseVector(np.zeros(0, np.int32), np.zeros(0, np.float32), VOCAB)
        rows[1] = replace(rows[1], vector=empty)
        store.upsert(rows)
    finally:
        store.close()
    stored = _stored(conn, "sparse_empty")
    assert _same(stored["a"]["sparse"], rows[0])
    assert _same(stored["b"]["sparse"], rows[1])
