"""Chunk rows in a real PostgreSQL with pgvector: one row per chunk ``{key}#{k}`` with its
span in the metadata; re-ingesting a shorter document removes the chunks it no longer
has; an older, longer version processed late does not bring them back (in a later batch
or in the same one); replays change nothing; several writers remove stale chunks too."""

from __future__ import annotations

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
from sink.rows import Row, RowsOf, rows_of
from sink.targets import parse_target

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
