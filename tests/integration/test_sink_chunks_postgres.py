"""Chunk rows in a real PostgreSQL with pgvector: one row per chunk ``{key}#{k}`` with its
span in the metadata; re-ingesting a shorter document removes the chunks it no longer
has; an older, longer version processed late does not bring them back (in a later batch
or in the same one); replays change nothing; several writers remove stale chunks too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql
from pydantic import SecretStr

from schemas import EmbedResult, encode_result
from scripts.pg_local import LocalPostgres
from sink.postgres import PostgresStore
from sink.registry import parse_target
from sink.rows import Row, RowsOf, rows_of

pytestmark = pytest.mark.integration

DIM = 8


def chunk_rows(docs: dict[str, int] | dict[int, int], version: int, seed: int = 0) -> list[Row]:
    """The rows of one chunked result: document key -> its number of chunks (spans of 10
    characters each), through the wire codec and the sink's row building."""
    count = sum(docs.values())
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((count, DIM)).astype("<f4")
    result = EmbedResult(
        id=f"req-{version}-{seed}",
        model="m",
        dim=DIM,
        vectors=vectors.tobytes(),
        tokens=(12,) * count,
        keys=tuple(docs),
        meta={"docs": [{"title": str(key).upper()} for key in docs]},
        requested_ms=version,
        chunks=tuple(docs.values()),
        spans=tuple((10 * k, 10 * k + 12) for n in docs.values() for k in range(n)),
    )
    outcome = rows_of(encode_result(result))
    assert isinstance(outcome, RowsOf)
    return outcome.rows


@pytest.fixture
def table(postgres: LocalPostgres, request: pytest.FixtureRequest) -> str:
    return f"chunks_{request.node.name.replace('[', '_').replace(']', '')}"[:60].lower()


@pytest.fixture
def store(postgres: LocalPostgres, table: str) -> Iterator[PostgresStore]:
    store = PostgresStore(parse_target(postgres.dsn, SecretStr(postgres.password)), table)
    store.open()
    store.create(DIM, "cosine")
    yield store
    store.close()


def _stored(postgres: LocalPostgres, table: str) -> dict[str, tuple[int, dict[str, Any]]]:
    with psycopg.connect(postgres.dsn, password=postgres.password, autocommit=True) as conn:
        found = conn.execute(
            sql.SQL("SELECT id, requested_ms, metadata FROM {t}").format(t=sql.Identifier(table))
        ).fetchall()
    return {key: (version, metadata) for key, version, metadata in found}


def test_chunks_are_rows_and_a_shorter_version_removes_the_extra_ones(
    postgres: LocalPostgres, store: PostgresStore, table: str
) -> None:
    store.upsert(chunk_rows({"a": 5, "b": 2}, version=10))
    stored = _stored(postgres, table)
    assert sorted(stored) == ["a#0", "a#1", "a#2", "a#3", "a#4", "b#0", "b#1"]
    assert stored["a#3"][1] == {
        "title": "A",
        "doc_key": "a",
        "chunk_index": 3,
        "start_char": 30,
        "end_char": 42,
    }
    store.upsert(chunk_rows({"a": 2}, version=20, seed=1))
    stored = _stored(postgres, table)
    assert sorted(stored) == ["a#0", "a#1", "b#0", "b#1"]
    assert {key: v for key, (v, _) in stored.items()} == {
        "a#0": 20,
        "a#1": 20,
        "b#0": 10,
        "b#1": 10,
    }
    store.upsert(chunk_rows({"a": 2}, version=20, seed=1))  # a replay: nothing changes
    assert _stored(postgres, table) == stored


def test_an_older_longer_version_arriving_late_does_not_bring_chunks_back(
    postgres: LocalPostgres, store: PostgresStore, table: str
) -> None:
    store.upsert(chunk_rows({"a": 5}, version=10))
    store.upsert(chunk_rows({"a": 2}, version=30, seed=1))
    store.upsert(chunk_rows({"a": 4}, version=20, seed=2))  # older than the stored, longer
    stored = _stored(postgres, table)
    assert {key: v for key, (v, _) in stored.items()} == {"a#0": 30, "a#1": 30}


@pytest.mark.parametrize("order", ["newer_first", "older_first"])
def test_two_versions_in_one_batch_keep_only_the_newer_ones_chunks(
    postgres: LocalPostgres, store: PostgresStore, table: str, order: str
) -> None:
    store.upsert(chunk_rows({"a": 6}, version=5))
    newer, older = chunk_rows({"a": 2}, version=30, seed=1), chunk_rows({"a": 4}, version=20)
    store.upsert(newer + older if order == "newer_first" else older + newer)
    stored = _stored(postgres, table)
    assert {key: v for key, (v, _) in stored.items()} == {"a#0": 30, "a#1": 30}


def test_several_writers_remove_stale_chunks_of_every_document(
    postgres: LocalPostgres, table: str
) -> None:
    """600 documents of 3 chunks, then of 1: the batch is split between two writers (one
    transaction each); every document's chunks 1 and 2 are gone."""
    spec = parse_target(postgres.dsn, SecretStr(postgres.password))
    store = PostgresStore(spec, table, writers=2)
    store.open()
    try:
        store.create(DIM, "cosine")
        keys = [f"d{i}" for i in range(600)]
        store.upsert(chunk_rows(dict.fromkeys(keys, 3), version=10))
        assert len(_stored(postgres, table)) == 1800
        store.upsert(chunk_rows(dict.fromkeys(keys, 1), version=11))
        stored = _stored(postgres, table)
    finally:
        store.close()
    assert sorted(stored) == sorted(f"{key}#0" for key in keys)
    assert {version for version, _ in stored.values()} == {11}


def plain_rows(docs: dict[str, dict[str, Any]], version: int, request: str = "") -> list[Row]:
    """The rows of one unchunked result: key -> its metadata (``meta.docs[i]``)."""
    result = EmbedResult(
        id=request or f"plain-{version}",
        model="m",
        dim=DIM,
        vectors=np.ones((len(docs), DIM), "<f4").tobytes(),
        tokens=(3,) * len(docs),
        keys=tuple(docs),
        meta={"docs": list(docs.values())},
        requested_ms=version,
    )
    outcome = rows_of(encode_result(result))
    assert isinstance(outcome, RowsOf)
    return outcome.rows


def _versions(postgres: LocalPostgres, table: str) -> dict[str, int]:
    return {key: version for key, (version, _) in _stored(postgres, table).items()}


def test_user_metadata_naming_a_document_neither_blocks_nor_erases_it(
    postgres: LocalPostgres, store: PostgresStore, table: str
) -> None:
    """A row whose own metadata says ``doc_key`` "a" (newer than a's chunks) does not keep
    a's chunks out; one that says ``doc_key`` "b", ``chunk_index`` 5 is not removed by b's
    stale-chunk clean-up. Metadata is data: identity lives in columns."""
    store.upsert(plain_rows({"u1": {"doc_key": "a", "chunk_index": 0}}, version=100))
    store.upsert(plain_rows({"u2": {"doc_key": "b", "chunk_index": 5}}, version=10))
    store.upsert(chunk_rows({"a": 3, "b": 2}, version=50))
    assert _versions(postgres, table) == {
        "u1": 100,
        "u2": 10,
        "a#0": 50,
        "a#1": 50,
        "a#2": 50,
        "b#0": 50,
        "b#1": 50,
    }


def test_a_document_that_changes_form_keeps_only_its_newest_forms_rows(
    postgres: LocalPostgres, store: PostgresStore, table: str
) -> None:
    """Chunked, then unchunked: the chunk rows go; chunked again: the row per input goes;
    an older version of the other form processed late changes nothing."""
    store.upsert(chunk_rows({"a": 3}, version=10))
    store.upsert(plain_rows({"a": {}}, version=20))
    assert _versions(postgres, table) == {"a": 20}
    store.upsert(chunk_rows({"a": 2}, version=30))
    assert _versions(postgres, table) == {"a#0": 30, "a#1": 30}
    store.upsert(plain_rows({"a": {}}, version=25))  # late: older than the chunks
    store.upsert(chunk_rows({"a": 4}, version=15))
    assert _versions(postgres, table) == {"a#0": 30, "a#1": 30}


@pytest.mark.parametrize("order", ["larger_id_first", "larger_id_last"])
def test_two_versions_with_one_requested_ms_never_mix(
    postgres: LocalPostgres, store: PostgresStore, table: str, order: str
) -> None:
    """Two results for document "a" with the same requested_ms, in one batch or in two,
    in either order: every row of "a" comes from the one of the larger request id."""
    small = chunk_rows({"a": 4}, version=7, seed=1)  # request "req-7-1"
    large = chunk_rows({"a": 2}, version=7, seed=2)  # request "req-7-2": wins
    first, second = (large, small) if order == "larger_id_first" else (small, large)
    store.upsert(first + second)
    assert sorted(_versions(postgres, table)) == ["a#0", "a#1"]
    store.upsert(first)
    store.upsert(second)
    stored = _stored(postgres, table)
    assert sorted(stored) == ["a#0", "a#1"]
    with psycopg.connect(postgres.dsn, password=postgres.password, autocommit=True) as conn:
        vectors = conn.execute(
            sql.SQL("SELECT id, vector::real[] FROM {t} ORDER BY id").format(
                t=sql.Identifier(table)
            )
        ).fetchall()
    assert [np.asarray(v, np.float32).tolist() for _, v in vectors] == [
        row.dense.tolist() for row in sorted(large, key=lambda r: r.id)
    ]


def old_table(
    postgres: LocalPostgres, table: str, rows: list[tuple[str, dict[str, Any], int]]
) -> None:
    """A table as an older sink made it (identity in the metadata, no documents table),
    holding ``rows`` (id, metadata, requested_ms)."""
    with psycopg.connect(postgres.dsn, password=postgres.password, autocommit=True) as conn:
        t = sql.Identifier(table)
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute(
            sql.SQL(
                "CREATE TABLE {t} (id text PRIMARY KEY, vector vector(8) NOT NULL, "
                "metadata jsonb NOT NULL DEFAULT '{{}}'::jsonb, model text NOT NULL, "
                "requested_ms bigint NOT NULL DEFAULT 0, "
                "updated_at timestamptz NOT NULL DEFAULT now())"
            ).format(t=t)
        )
        conn.execute(
            sql.SQL(
                "CREATE INDEX {i} ON {t} ((metadata->>'doc_key')) WHERE metadata ? 'doc_key'"
            ).format(i=sql.Identifier(f"{table}_doc_key"), t=t)
        )
        for key, metadata, version in rows:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {t} (id, vector, metadata, model, requested_ms) "
                    "VALUES (%s, %s::vector, %s::jsonb, 'm', %s)"
                ).format(t=t),
                [key, "[" + ",".join(["0.5"] * DIM) + "]", json.dumps(metadata), version],
            )


def test_a_table_made_by_an_older_sink_is_migrated_at_start_up(
    postgres: LocalPostgres, table: str
) -> None:
    """A table of the former shape (identity in the metadata, no documents table) gets
    doc_key and chunk_index from its rows (a user's row whose metadata names a document
    stays its own document), each document its rows' newest version; then writes follow
    the rules: stale chunks go, an older result changes nothing."""
    old_table(
        postgres,
        table,
        [
            *((f"a#{k}", {"doc_key": "a", "chunk_index": k}, 10) for k in range(3)),
            ("u", {"doc_key": "a", "chunk_index": 1}, 40),
            ("p", {"title": "P"}, 30),
        ],
    )
    store = PostgresStore(parse_target(postgres.dsn, SecretStr(postgres.password)), table)
    store.open()
    try:
        store.create(DIM, "cosine")
        store.create(DIM, "cosine")  # a second start-up: nothing left to do
        store.upsert(chunk_rows({"a": 1}, version=20))
        store.upsert(plain_rows({"p": {}, "u": {}}, version=25))  # older than both: ignored
    finally:
        store.close()
    assert _versions(postgres, table) == {"a#0": 20, "u": 40, "p": 30}
    with psycopg.connect(postgres.dsn, password=postgres.password, autocommit=True) as conn:
        identity = conn.execute(
            sql.SQL("SELECT id, doc_key, chunk_index FROM {t} ORDER BY id").format(
                t=sql.Identifier(table)
            )
        ).fetchall()
    assert identity == [("a#0", "a", 0), ("p", "p", None), ("u", "u", None)]
