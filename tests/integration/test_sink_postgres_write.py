"""The Postgres store's write path (binary COPY into a staging table, then one INSERT ...
SELECT ... ON CONFLICT per batch) against a real PostgreSQL with pgvector: the rows are
exactly those the former path (executemany of vector text literals) wrote, the version
rule holds, replays are idempotent, refused rows and lost connections are classified."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql
from pydantic import SecretStr

from loadtest.sink import former_upsert
from scripts.pg_local import LocalPostgres
from sink.postgres import PostgresStore
from sink.registry import parse_target
from sink.rows import Row
from sink.store import RowsRefusedError, TransientWriteError

pytestmark = pytest.mark.integration

DIM = 8


def _store(postgres: LocalPostgres, table: str) -> PostgresStore:
    store = PostgresStore(parse_target(postgres.dsn, SecretStr(postgres.password)), table)
    store.open()
    return store


@pytest.fixture
def conn(postgres: LocalPostgres) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(postgres.dsn, password=postgres.password, autocommit=True) as c:
        yield c


def _rows(count: int, version: int, seed: int, prefix: str = "doc") -> list[Row]:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((count, DIM)).astype(np.float32)
    # Values whose text form is easy to get wrong: zero signs, subnormals, extremes.
    vectors[0, :4] = np.array(
        [-0.0, 1e-45, np.finfo(np.float32).max, np.finfo(np.float32).tiny], np.float32
    )
    return [
        Row(
            f"{prefix}-{i}-é",
            vectors[i],
            {"n": i, "text": "naïve “quotes” \\ \t", "nested": {"a": [1, 2.5, None]}},
            "model-ü",
            version,
        )
        for i in range(count)
    ]


def _table(conn: psycopg.Connection[Any], table: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        sql.SQL(
            "SELECT id, vector::text, metadata, model, requested_ms FROM {table} ORDER BY id"
        ).format(table=sql.Identifier(table))
    ).fetchall()


def _row_versions(conn: psycopg.Connection[Any], table: str) -> dict[str, tuple[Any, ...]]:
    """Each row's physical version (ctid, xmin) and updated_at: all unchanged when a write
    left the row alone."""
    query = sql.SQL("SELECT id, ctid::text, xmin::text, updated_at FROM {table}").format(
        table=sql.Identifier(table)
    )
    return {r[0]: r[1:] for r in conn.execute(query).fetchall()}


def _vectors(conn: psycopg.Connection[Any], table: str) -> dict[str, np.ndarray[Any, Any]]:
    """Each row's vector as float32, read in pgvector's binary form (bit for bit)."""
    out = {}
    query = sql.SQL("SELECT id, vector_send(vector) FROM {table}").format(
        table=sql.Identifier(table)
    )
    for row_id, raw in conn.execute(query).fetchall():
        dim = int.from_bytes(raw[:2], "big")
        out[row_id] = np.frombuffer(raw[4:], ">f4", dim).astype(np.float32)
    return out


def test_copy_path_writes_exactly_the_rows_of_the_former_path(
    postgres: LocalPostgres, conn: psycopg.Connection[Any]
) -> None:
    rows = _rows(300, 1_000, seed=1)
    new, old = _store(postgres, "write_copy"), _store(postgres, "write_literal")
    try:
        for store in (new, old):
            store.create(DIM, "cosine")
        new.upsert(rows)
        former_upsert(conn, "write_literal", rows)  # the reference: the former write path
    finally:
        new.close()
        old.close()
    assert _table(conn, "write_copy") == _table(conn, "write_literal")
    stored = _vectors(conn, "write_copy")
    assert len(stored) == len(rows)
    for row in rows:  # bit for bit, -0.0 and subnormals included
        assert stored[row.id].tobytes() == row.dense.astype(np.float32).tobytes()
    first = conn.execute("SELECT metadata, model FROM write_copy WHERE id = 'doc-0-é'").fetchone()
    assert first == (rows[0].metadata, "model-ü")


def test_an_older_row_never_replaces_a_newer_one_and_replays_are_idempotent(
    postgres: LocalPostgres, conn: psycopg.Connection[Any]
) -> None:
    newer, older = _rows(50, 2_000, seed=2), _rows(50, 1_000, seed=3)
    store = _store(postgres, "write_versions")
    try:
        store.create(DIM, "inner_product")
        store.upsert(newer)
        before = _table(conn, "write_versions")
        store.upsert(older)  # processed late: changes nothing
        assert _table(conn, "write_versions") == before
        versions = _row_versions(conn, "write_versions")
        store.upsert(newer)  # a replay: the same rows, the same version
        assert _table(conn, "write_versions") == before
        # Left alone: no new row version (no HNSW insert), updated_at unchanged.
        assert _row_versions(conn, "write_versions") == versions
        # The same requested_ms from another request: the larger request id wins (the
        # tie-break), whichever is written first; the same request again changes nothing.
        changed = [replace(row, metadata={"n": -1}, request_id="r2") for row in newer[:5]]
        store.upsert(changed)
        store.upsert([replace(row, request_id="r1") for row in newer[:5]])
        store.upsert(changed)
        after = _row_versions(conn, "write_versions")
        assert {k for k in after if after[k] != versions[k]} == {r.id for r in changed}
        assert {r[0]: r[2] for r in _table(conn, "write_versions")}[newer[0].id] == {"n": -1}
        # A mix: some keys newer than stored, some older, some new.
        mixed = _rows(10, 3_000, seed=4) + _rows(10, 500, seed=5, prefix="fresh")
        store.upsert([*mixed, *_rows(50, 1_500, seed=6)[10:]])
    finally:
        store.close()
    table = {r[0]: r for r in _table(conn, "write_versions")}
    assert len(table) == 60
    for i in range(50):
        assert table[f"doc-{i}-é"][4] == (3_000 if i < 10 else 2_000)
    assert all(table[f"fresh-{i}-é"][4] == 500 for i in range(10))


def test_a_key_repeated_in_one_write_keeps_its_newest_version(
    postgres: LocalPostgres, conn: psycopg.Connection[Any]
) -> None:
    """Rows written one result at a time (to find a refused one) may repeat a key."""
    first, second, older = (_rows(1, v, seed=s)[0] for v, s in ((5, 7), (5, 8), (4, 9)))
    store = _store(postgres, "write_repeats")
    try:
        store.create(DIM, "l2")
        store.upsert([first, second, older])
    finally:
        store.close()
    assert _vectors(conn, "write_repeats")[first.id].tobytes() == second.dense.tobytes()


def test_refused_rows_write_nothing_and_the_store_keeps_working(
    postgres: LocalPostgres, conn: psycopg.Connection[Any]
) -> None:
    good = _rows(5, 1, seed=10)
    wrong_dim = Row("short", np.ones(DIM - 1, np.float32), {}, "m", 1)
    nan = Row("nan", np.full(DIM, np.nan, np.float32), {}, "m", 1)
    store = _store(postgres, "write_refused")
    try:
        store.create(DIM, "cosine")
        for culprit in (wrong_dim, nan):
            with pytest.raises(RowsRefusedError):
                store.upsert([*good, culprit])
            assert _table(conn, "write_refused") == []
        store.upsert(good)
    finally:
        store.close()
    assert [r[0] for r in _table(conn, "write_refused")] == sorted(r.id for r in good)


def test_a_lost_connection_is_transient_and_the_next_write_reconnects(
    postgres: LocalPostgres, conn: psycopg.Connection[Any]
) -> None:
    rows = _rows(20, 1, seed=11)
    store = _store(postgres, "write_reconnect")
    try:
        store.create(DIM, "cosine")
        store.upsert(rows[:10])
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'kembed-sink'"
        )
        with pytest.raises(TransientWriteError):
            store.upsert(rows[10:])
        store.upsert(rows[10:])  # a new connection, its own staging table
    finally:
        store.close()
    assert len(_table(conn, "write_reconnect")) == 20


def _indexes(conn: psycopg.Connection[Any], table: str) -> list[str]:
    return [
        row[0]
        for row in conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = %s AND indexdef LIKE '%%hnsw%%'",
            [table],
        ).fetchall()
    ]


def _nearest(conn: psycopg.Connection[Any], table: str, vector: np.ndarray[Any, Any]) -> str:
    """The id nearest to ``vector`` by inner product, through the HNSW index."""
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        literal = "[" + ",".join(map(repr, vector.tolist())) + "]"
        query = sql.SQL("SELECT id FROM {t} ORDER BY vector <#> %s::vector LIMIT 1").format(
            t=sql.Identifier(table)
        )
        plan = "\n".join(r[0] for r in conn.execute(sql.SQL("EXPLAIN ") + query, [literal]))
        assert f"Index Scan using {table}_vector_hnsw" in plan, plan
        row = conn.execute(query, [literal]).fetchone()
    assert row is not None
    return str(row[0])


def _unit_rows(count: int, version: int, seed: int, prefix: str = "doc") -> list[Row]:
    rows = _rows(count + 1, version, seed, prefix)[1:]  # not the row of extreme values
    for row in rows:
        row.dense[:] /= np.linalg.norm(row.dense)
    return rows


def test_bulk_mode_loads_without_the_index_then_builds_it_once(
    postgres: LocalPostgres, conn: psycopg.Connection[Any]
) -> None:
    rows = _unit_rows(600, 1, seed=12)
    store = PostgresStore(
        parse_target(postgres.dsn, SecretStr(postgres.password)),
        "write_bulk",
        index="after",
        writers=2,
    )
    store.open()
    try:
        store.create(DIM, "inner_product")
        assert _indexes(conn, "write_bulk") == []
        assert store.pending_index() == "vector_ip_ops"
        store.upsert(rows)
        seconds = store.build_pending_index()
        assert seconds is not None
        assert store.pending_index() is None
        assert store.build_pending_index() is None  # once
        # A table that exists is not touched by create(): the index stays.
        store.create(DIM, "inner_product")
        store.upsert(_unit_rows(10, 2, seed=13, prefix="later"))  # the index maintains them
    finally:
        store.close()
    [index] = _indexes(conn, "write_bulk")
    assert "vector_ip_ops" in index
    assert "m='16'" in index.replace(" ", "")
    assert len(_table(conn, "write_bulk")) == 610
    for row in rows[:20]:
        assert _nearest(conn, "write_bulk", row.dense) == row.id


def test_sinks_starting_together_on_a_fresh_database_all_start(
    postgres: LocalPostgres, conn: psycopg.Connection[Any]
) -> None:
    """Several sinks (replicas of one Deployment, say) that open a database without
    pgvector and create the same table at the same moment all start, and agree on the
    table: the schema set-up is serialized, so no one fails on PostgreSQL's unique index of
    extension or type names ("duplicate key value violates unique constraint")."""
    sinks = 6
    for round_ in range(3):
        database = f"fresh_{uuid.uuid4().hex[:8]}"
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        dsn = postgres.dsn.rsplit("/", 1)[0] + f"/{database}"
        barrier = threading.Barrier(sinks)

        def start(_: int, dsn: str = dsn, barrier: threading.Barrier = barrier) -> int | None:
            store = PostgresStore(parse_target(dsn, SecretStr(postgres.password)), "chunks")
            try:
                barrier.wait()
                store.open()
                store.create(DIM, "cosine")
                return store.table_dim()
            finally:
                store.close()

        with ThreadPoolExecutor(sinks) as pool:
            dims = list(pool.map(start, range(sinks)))
        assert dims == [DIM] * sinks, f"round {round_}: {dims}"
