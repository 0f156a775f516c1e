"""kembed sink end to end, edits, row versions and bulk loads: re-ingested documents
replace their rows in place (across a restart), a result processed late never replaces a
newer row, two versions in one batch keep the newer (PostgreSQL and Milvus Lite), and
index=after builds the HNSW index once the sink has caught up."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from aiokafka import AIOKafkaProducer

from schemas import EmbedResult, encode_result
from scripts.kafka_local import LocalKafka
from scripts.pg_local import LocalPostgres
from tests.conftest import WorkerProcess, load_stsb
from tests.integration.sink_helpers import (
    BULK_LANE,
    create_topics,
    milvus_rows,
    milvus_settings,
    parse_vector,
    pg_settings,
    start_sink,
    submit_docs,
    wait_drained,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def reingest_docs() -> tuple[list[str], list[str], list[str]]:
    """Ids, first texts and changed texts of 60 documents."""
    pairs = load_stsb()[:60]
    ids = [f"doc-{i}" for i in range(len(pairs))]
    return ids, [p.first for p in pairs], [p.second for p in pairs]


def test_reingest_with_changed_text_updates_postgres_rows_in_place(
    kafka: LocalKafka,
    worker: WorkerProcess,
    postgres: LocalPostgres,
    reingest_docs: tuple[list[str], list[str], list[str]],
    tmp_path: Path,
) -> None:
    """The same ids sent again with changed text replace their rows: the same count, no
    duplicates, new vectors, new metadata, a later updated_at."""
    topic, group = "embed.results.reingest-pg", "sink-reingest-pg"
    create_topics(kafka, topic)
    ids, first, second = reingest_docs
    sink = start_sink(
        kafka, tmp_path / "sink.log", **pg_settings(postgres, "reingest", topic, group)
    )
    try:
        sent = asyncio.run(
            submit_docs(
                kafka.bootstrap_servers, first, ids, [{"version": 1}] * len(ids), reply_to=topic
            )
        )
        asyncio.run(wait_drained(kafka.bootstrap_servers, topic, group, sent, sink))
        with psycopg.connect(postgres.dsn, password=postgres.password) as conn:
            before = {
                r[0]: r
                for r in conn.execute("SELECT id, vector::text, metadata, updated_at FROM reingest")
            }
        sent += asyncio.run(
            submit_docs(
                kafka.bootstrap_servers, second, ids, [{"version": 2}] * len(ids), reply_to=topic
            )
        )
        asyncio.run(wait_drained(kafka.bootstrap_servers, topic, group, sent, sink))
    finally:
        sink.stop()
    with psycopg.connect(postgres.dsn, password=postgres.password) as conn:
        after = {
            r[0]: r
            for r in conn.execute("SELECT id, vector::text, metadata, updated_at FROM reingest")
        }
        (count,) = conn.execute("SELECT count(*) FROM reingest").fetchone() or (0,)
    assert sorted(before) == sorted(after) == sorted(ids)
    assert count == len(ids)
    changed = [i for i in ids if before[i][1] != after[i][1]]
    assert len(changed) >= len(ids) - 2  # a few STS-B pairs repeat a sentence
    assert all(after[i][2] == {"version": 2} for i in ids)
    assert all(before[i][2] == {"version": 1} for i in ids)
    assert all(after[i][3] > before[i][3] for i in ids)


def test_reingest_with_changed_text_updates_milvus_rows_in_place(
    kafka: LocalKafka,
    worker: WorkerProcess,
    reingest_docs: tuple[list[str], list[str], list[str]],
    tmp_path: Path,
) -> None:
    """Milvus Lite: re-ingesting the same ids with changed text replaces their rows (one
    row per id, the new vectors and metadata), across a SIGTERM and a restart of the sink."""
    topic, group = "embed.results.reingest-milvus", "sink-reingest-milvus"
    create_topics(kafka, topic)
    ids, first, second = reingest_docs
    path = tmp_path / "docs.db"
    settings = milvus_settings(path, "docs", topic, group)
    bootstrap = kafka.bootstrap_servers
    sink = start_sink(kafka, tmp_path / "first.log", **settings)
    try:
        sent = asyncio.run(
            submit_docs(bootstrap, first, ids, [{"version": 1}] * len(ids), reply_to=topic)
        )
        asyncio.run(wait_drained(bootstrap, topic, group, sent, sink))
    finally:
        assert sink.stop() == 0
    before = milvus_rows(path, "docs")
    sink = start_sink(kafka, tmp_path / "second.log", **settings)
    try:
        sent += asyncio.run(
            submit_docs(bootstrap, second, ids, [{"version": 2}] * len(ids), reply_to=topic)
        )
        asyncio.run(wait_drained(bootstrap, topic, group, sent, sink))
    finally:
        assert sink.stop() == 0
    after = milvus_rows(path, "docs")
    assert sorted(before) == sorted(after) == sorted(ids)
    assert all(before[i]["metadata"] == {"version": 1} for i in ids)
    assert all(after[i]["metadata"] == {"version": 2} for i in ids)
    changed = [i for i in ids if before[i]["vector"] != after[i]["vector"]]
    assert len(changed) >= len(ids) - 2  # a few STS-B pairs repeat a sentence


def _versioned_result(
    request_id: str,
    version: int,
    vector: list[float],
    keys: tuple[str, str] = ("doc-1", "doc-2"),
) -> bytes:
    values = np.array([vector, vector], dtype="<f4")
    return encode_result(
        EmbedResult(
            id=request_id,
            model="m",
            dim=3,
            vectors=values.tobytes(),
            tokens=(3, 3),
            keys=keys,
            meta={"docs": [{"version": version}, {"version": version}]},
            requested_ms=version,
        )
    )


def _versioned_rows(
    target: str, postgres: LocalPostgres | None, path: Path, table: str
) -> dict[str, tuple[list[float], dict[str, Any], int]]:
    """id -> (vector, metadata, requested_ms) of every row the sink wrote."""
    if postgres is not None:
        with psycopg.connect(postgres.dsn, password=postgres.password) as conn:
            return {
                row_id: (parse_vector(vector).tolist(), metadata, version)
                for row_id, vector, metadata, version in conn.execute(
                    f"SELECT id, vector::text, metadata, requested_ms FROM {table}"
                ).fetchall()
            }
    return {
        row_id: (row["vector"], row["metadata"], row["requested_ms"])
        for row_id, row in milvus_rows(path, table).items()
    }


@pytest.mark.parametrize("target", ["postgres", "milvus"])
def test_a_result_processed_late_never_replaces_a_newer_row(
    kafka: LocalKafka, postgres: LocalPostgres, tmp_path: Path, target: str
) -> None:
    """Results travel on different partitions, so a document's older result can be
    processed after its newer one: the row keeps the newest request's vector (by the
    results' requested_ms), and a replay of the same version writes it again."""
    topic, group = f"embed.results.versions-{target}", f"sink-versions-{target}"
    create_topics(kafka, topic)
    settings = (
        pg_settings(postgres, "versions", topic, group)
        if target == "postgres"
        else milvus_settings(tmp_path / "versions.db", "versions", topic, group)
    )
    bootstrap = kafka.bootstrap_servers

    async def produce(value: bytes, partition: int) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(topic, value, partition=partition, headers=BULK_LANE)
        finally:
            await producer.stop()

    sink = start_sink(kafka, tmp_path / "sink.log", **settings)
    try:
        # One at a time, so the sink sees them in this order: newer, its replay, older.
        for count, (name, version, vector) in enumerate(
            [
                ("newer", 2_000, [0.0, 1.0, 0.0]),
                ("replay", 2_000, [0.0, 0.0, 1.0]),
                ("older", 1_000, [1.0, 0.0, 0.0]),
            ],
            start=1,
        ):
            asyncio.run(produce(_versioned_result(name, version, vector), count))
            asyncio.run(wait_drained(bootstrap, topic, group, count, sink))
    finally:
        assert sink.stop() == 0
    rows = _versioned_rows(
        target, postgres if target == "postgres" else None, tmp_path / "versions.db", "versions"
    )
    # The replay of version 2000 was written again; the older result, processed last, not.
    assert rows == {doc: ([0.0, 0.0, 1.0], {"version": 2_000}, 2_000) for doc in ("doc-1", "doc-2")}


@pytest.mark.parametrize("target", ["postgres", "milvus"])
def test_two_versions_of_a_key_in_one_batch_keep_the_newer(
    kafka: LocalKafka, request: pytest.FixtureRequest, tmp_path: Path, target: str
) -> None:
    """A key's older and newer results, on two partitions, both in the sink's first poll:
    whichever partition comes first in the batch, the row is the newer result's. Both
    orders at once: doc-1 and doc-2 have the older result on partition 0 and the newer on
    partition 1, doc-3 and doc-4 the other way round. The results are on the topic before
    the sink starts, and its log shows that it read all four in one batch."""
    topic, group = f"embed.results.batch-versions-{target}", f"sink-batch-versions-{target}"
    create_topics(kafka, topic)
    postgres: LocalPostgres | None = (
        request.getfixturevalue("postgres") if target == "postgres" else None
    )
    settings = (
        pg_settings(postgres, "batch_versions", topic, group)
        if postgres is not None
        else milvus_settings(tmp_path / "batch_versions.db", "batch_versions", topic, group)
    )
    bootstrap = kafka.bootstrap_servers
    older, newer = [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]
    results = [  # (partition, value)
        (0, _versioned_result("older-12", 1_000, older, ("doc-1", "doc-2"))),
        (1, _versioned_result("newer-12", 2_000, newer, ("doc-1", "doc-2"))),
        (0, _versioned_result("newer-34", 2_000, newer, ("doc-3", "doc-4"))),
        (1, _versioned_result("older-34", 1_000, older, ("doc-3", "doc-4"))),
    ]

    async def produce() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for partition, value in results:
                await producer.send_and_wait(topic, value, partition=partition, headers=BULK_LANE)
        finally:
            await producer.stop()

    asyncio.run(produce())
    sink = start_sink(kafka, tmp_path / "sink.log", log_level="debug", **settings)
    try:
        asyncio.run(wait_drained(bootstrap, topic, group, len(results), sink))
    finally:
        assert sink.stop() == 0
    batches = [e for e in sink.events() if e.get("event") == "sink.batch"]
    assert [(e["results"], e["rows"]) for e in batches] == [(4, 8)]  # one poll, all four
    rows = _versioned_rows(target, postgres, tmp_path / "batch_versions.db", "batch_versions")
    assert rows == {
        doc: (newer, {"version": 2_000}, 2_000) for doc in ("doc-1", "doc-2", "doc-3", "doc-4")
    }


# ------------------------------------------------------------------ bulk mode


def test_bulk_mode_builds_the_index_once_the_sink_has_caught_up(
    kafka: LocalKafka, postgres: LocalPostgres, tmp_path: Path
) -> None:
    """index=after: the sink creates the table without its HNSW index, loads the results
    already on the topic, and builds the index once it has been caught up for
    index_build_idle_s; a search through the index then finds each document itself."""
    topic, group = "embed.results.bulk-index", "sink-bulk-index"
    create_topics(kafka, topic)
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((4, 64, 16)).astype("<f4")
    vectors /= np.linalg.norm(vectors, axis=2, keepdims=True)
    values = [
        encode_result(
            EmbedResult(
                id=f"bulk-{r}",
                model="m",
                dim=16,
                vectors=vectors[r].tobytes(),
                tokens=(3,) * 64,
                keys=tuple(f"doc-{r}-{i}" for i in range(64)),
                requested_ms=1_000 + r,
            )
        )
        for r in range(4)
    ]

    async def produce() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
        await producer.start()
        try:
            for r, value in enumerate(values):
                await producer.send_and_wait(topic, value, partition=r % 4, headers=BULK_LANE)
        finally:
            await producer.stop()

    asyncio.run(produce())
    settings = {
        **pg_settings(postgres, "bulk_index", topic, group),
        "index": "after",
        "index_build_idle_s": 1,
    }
    sink = start_sink(kafka, tmp_path / "sink.log", **settings)
    try:
        asyncio.run(wait_drained(kafka.bootstrap_servers, topic, group, len(values), sink))
        deadline = time.monotonic() + 60
        while not [e for e in sink.events() if e.get("event") == "sink.index_built"]:
            assert time.monotonic() < deadline, "no sink.index_built event"
            time.sleep(0.3)
    finally:
        assert sink.stop() == 0
    created = [e for e in sink.events() if e.get("event") == "sink.table_created"]
    assert [e["index"] for e in created] == ["after the load"]
    assert len([e for e in sink.events() if e.get("event") == "sink.index_built"]) == 1
    with psycopg.connect(postgres.dsn, password=postgres.password) as conn:
        assert conn.execute("SELECT count(*) FROM bulk_index").fetchone() == (256,)
        assert conn.execute(
            "SELECT obj_description('bulk_index'::regclass, 'pg_class')"
        ).fetchone() == (None,)
        conn.execute("SET enable_seqscan = off")
        for r, i in ((0, 0), (1, 17), (3, 63)):
            literal = "[" + ",".join(map(repr, vectors[r, i].tolist())) + "]"
            query = "SELECT id FROM bulk_index ORDER BY vector <#> %s::vector LIMIT 1"
            plan = " ".join(row[0] for row in conn.execute("EXPLAIN " + query, [literal]))
            assert "bulk_index_vector_hnsw" in plan
            assert conn.execute(query, [literal]).fetchone() == (f"doc-{r}-{i}",)
