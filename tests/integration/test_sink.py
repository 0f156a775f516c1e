"""kembed sink end to end: documents through Kafka, the real worker and model, into a real
PostgreSQL with pgvector and a real Milvus Lite, by real ``kembed sink`` processes."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg
import pytest
from pydantic import SecretStr
from pymilvus import MilvusClient

from scripts.kafka_local import LocalKafka
from scripts.pg_local import LocalPostgres
from sink.postgres import PostgresStore
from sink.registry import parse_target
from tests.conftest import StsPair, WorkerProcess, load_stsb
from tests.integration.sink_helpers import (
    SinkProcess,
    committed,
    create_topics,
    metric_value,
    milvus_rows,
    parse_vector,
    pg_rows,
    pg_settings,
    start_sink,
    submit_docs,
    wait_drained,
)

pytestmark = pytest.mark.integration

STSB_TOPIC = "embed.results.stsb"
PER_REQUEST = 20  # 2,758 sentences in 138 requests: a stream of results, not a few


@dataclass(frozen=True)
class StsDocs:
    topic: str
    requests: int
    pairs: list[StsPair]

    @property
    def ids(self) -> list[str]:
        return [f"{row}.{part}" for row in range(len(self.pairs)) for part in (1, 2)]


@pytest.fixture(scope="module")
def stsb(kafka: LocalKafka, worker: WorkerProcess) -> StsDocs:
    """Every sentence of STS-B test (English), its row number (and 1 or 2) as id, embedded
    by the real worker; the results wait on their topic for each sink to read."""
    pairs = load_stsb()
    create_topics(kafka, STSB_TOPIC)
    texts = [text for pair in pairs for text in (pair.first, pair.second)]
    metadata = [
        {"row": row, "part": part, "score": pair.score}
        for row, pair in enumerate(pairs)
        for part in (1, 2)
    ]
    docs = StsDocs(STSB_TOPIC, 0, pairs)
    requests = asyncio.run(
        submit_docs(
            kafka.bootstrap_servers,
            texts,
            docs.ids,
            metadata,
            reply_to=STSB_TOPIC,
            meta={"source": "stsb-en-test"},
            per_request=PER_REQUEST,
        )
    )
    return StsDocs(STSB_TOPIC, requests, pairs)


def high_pairs(docs: StsDocs) -> list[tuple[str, str, str]]:
    """(sentence 1, sentence 2, a random other sentence) ids of each pair with gold >= 4."""
    rng = random.Random(7)
    ids = docs.ids
    triples = []
    for row, pair in enumerate(docs.pairs):
        if pair.score >= 4:
            other = rng.choice([i for i in ids if not i.startswith(f"{row}.")])
            triples.append((f"{row}.1", f"{row}.2", other))
    return triples


# ------------------------------------------------------------------ PostgreSQL


@dataclass(frozen=True)
class PgRun:
    table: str
    metrics: str
    exit_code: int


@pytest.fixture(scope="module")
def stsb_pg(
    kafka: LocalKafka,
    postgres: LocalPostgres,
    stsb: StsDocs,
    tmp_path_factory: pytest.TempPathFactory,
) -> PgRun:
    """One uninterrupted sink run over the STS-B results into Postgres, stopped by SIGTERM
    once its group has committed every result."""
    group = "sink-stsb-pg"
    sink = start_sink(
        kafka,
        tmp_path_factory.mktemp("sink") / "sink.log",
        **pg_settings(postgres, "stsb", stsb.topic, group),
        max_batch_results=16,
    )
    try:
        asyncio.run(wait_drained(kafka.bootstrap_servers, stsb.topic, group, stsb.requests, sink))
        metrics = sink.metrics()
    finally:
        code = sink.stop()
    return PgRun("stsb", metrics, code)


def test_stsb_into_postgres_one_row_per_id_and_neighbours_rank_pairs(
    postgres: LocalPostgres,
    stsb: StsDocs,
    stsb_pg: PgRun,
    record_property: Callable[[str, object], None],
) -> None:
    """Every STS-B test sentence, ingested with its row number as id, is exactly one row;
    a nearest-neighbour query from sentence 1 ranks sentence 2 above a random other sentence
    for >= 95% of the pairs with gold >= 4; the HNSW index uses inner product (the vectors
    are normalized) and serves nearest-neighbour queries."""
    rows = pg_rows(postgres, stsb_pg.table)
    assert [r[0] for r in rows] == sorted(stsb.ids)
    assert len(rows) == 2 * len(stsb.pairs)
    first = rows[0]
    assert first[3] == "sentence-transformers/all-MiniLM-L6-v2"
    by_id = {r[0]: r for r in rows}
    assert by_id["5.2"][2] == {
        "source": "stsb-en-test",
        "row": 5,
        "part": 2,
        "score": stsb.pairs[5].score,
    }
    for row in rows[:50]:
        assert abs(float(np.linalg.norm(parse_vector(row[1]))) - 1.0) < 1e-5
    with psycopg.connect(postgres.dsn, password=postgres.password) as conn:
        (indexdef,) = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'stsb' AND indexdef LIKE '%hnsw%'"
        ).fetchone() or (None,)
        assert indexdef is not None
        assert "vector_ip_ops" in indexdef
        triples = high_pairs(stsb)
        ranked = 0
        for first_id, second_id, other_id in triples:
            (top,) = conn.execute(
                "SELECT id FROM stsb WHERE id = ANY(%s) "
                "ORDER BY vector <#> (SELECT vector FROM stsb WHERE id = %s) LIMIT 1",
                [[second_id, other_id], first_id],
            ).fetchone() or (None,)
            ranked += top == second_id
        assert len(triples) > 300
        record_property("ranked", f"{ranked}/{len(triples)}")  # reported by --junitxml
        assert ranked / len(triples) >= 0.95, (ranked, len(triples))
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(
            line
            for (line,) in conn.execute(
                "EXPLAIN SELECT id FROM stsb ORDER BY vector <#> "
                "(SELECT vector FROM stsb WHERE id = '0.1') LIMIT 5"
            ).fetchall()
        )
        assert "stsb_vector_hnsw" in plan
        nearest = conn.execute(
            "SELECT id, vector <#> (SELECT vector FROM stsb WHERE id = '0.1') FROM stsb "
            "ORDER BY vector <#> (SELECT vector FROM stsb WHERE id = '0.1') LIMIT 5"
        ).fetchall()
        assert len(nearest) == 5
        assert nearest[0][1] == pytest.approx(-1.0, abs=1e-5)  # itself (inner product 1)


def test_sink_metrics_count_rows_batches_and_results(stsb: StsDocs, stsb_pg: PgRun) -> None:
    """The scrape of an uninterrupted run: every row upserted once, every result written,
    no errors, batches and their timings recorded, no lag left; SIGTERM exits 0."""
    text = stsb_pg.metrics
    assert metric_value(text, "kembed_sink_rows_upserted_total", table="stsb") == len(stsb.ids)
    assert metric_value(text, "kembed_sink_results_total", outcome="written") == stsb.requests
    assert metric_value(text, "kembed_sink_batches_total") >= stsb.requests / 16
    assert metric_value(text, "kembed_sink_write_seconds_count") >= 1
    assert metric_value(text, "kembed_sink_latency_seconds_count") == stsb.requests
    assert metric_value(text, "kembed_sink_ready") == 1
    assert "kembed_sink_errors_total{" not in text
    assert "kembed_sink_dlq_messages_total{" not in text
    lags = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("kembed_sink_consumer_lag{")
    ]
    assert lags
    assert max(lags) == 0
    assert stsb_pg.exit_code == 0


def test_sigkill_mid_stream_then_restart_gives_the_same_table(
    kafka: LocalKafka,
    postgres: LocalPostgres,
    stsb: StsDocs,
    stsb_pg: PgRun,
    tmp_path: Path,
) -> None:
    """A sink killed with SIGKILL in the middle of the stream and started again (same group,
    same table) ends with exactly the rows and vectors of the uninterrupted run: batches
    written but not committed are replayed, and the upserts make the replay harmless."""
    group = "sink-stsb-killed"
    settings = {**pg_settings(postgres, "stsb_killed", stsb.topic, group), "max_batch_results": 1}
    sink = start_sink(kafka, tmp_path / "first.log", **settings)
    total = len(stsb.ids)
    seen = 0
    deadline = time.monotonic() + 120
    with psycopg.connect(postgres.dsn, password=postgres.password, autocommit=True) as conn:
        while time.monotonic() < deadline:
            if conn.execute("SELECT to_regclass('stsb_killed')").fetchone() != (None,):
                (seen,) = conn.execute("SELECT count(*) FROM stsb_killed").fetchone() or (0,)
                if seen >= total // 4:
                    break
            time.sleep(0.01)
    sink.process.kill()
    sink.wait_exit()
    assert 0 < seen < total, f"killed after {seen} of {total} rows: not mid-stream"
    killed_at = asyncio.run(committed(kafka.bootstrap_servers, group))
    assert sum(killed_at.values()) < stsb.requests

    restarted = start_sink(kafka, tmp_path / "second.log", **settings)
    try:
        asyncio.run(
            wait_drained(kafka.bootstrap_servers, stsb.topic, group, stsb.requests, restarted)
        )
        replayed = metric_value(
            restarted.metrics(), "kembed_sink_rows_upserted_total", table="stsb_killed"
        )
    finally:
        assert restarted.stop() == 0
    assert replayed + seen >= total
    assert pg_rows(postgres, "stsb_killed") == pg_rows(postgres, stsb_pg.table)


def test_dimension_mismatch_with_an_existing_table_is_a_startup_error(
    kafka: LocalKafka, postgres: LocalPostgres, stsb: StsDocs, tmp_path: Path
) -> None:
    """A table of another dimension stops the sink with status 2 and a clear message:
    at start-up when --dim says so, else at the first batch, before any offset is
    committed."""
    store = PostgresStore(parse_target(postgres.dsn, SecretStr(postgres.password)), "dim8")
    store.open()
    store.create(8, "cosine")
    store.close()

    settings = pg_settings(postgres, "dim8", stsb.topic, "sink-dim8")
    at_start = SinkProcess(kafka.bootstrap_servers, tmp_path / "start.log", **settings, dim=384)
    assert at_start.wait_exit(60) == 2
    event = at_start.wait_for("sink.dimension_mismatch", timeout=5)
    assert "dimension 8" in event["reason"]
    assert "dimension 384" in event["reason"]
    assert not any(e.get("event") == "partitions.assigned" for e in at_start.events())

    first_batch = SinkProcess(kafka.bootstrap_servers, tmp_path / "batch.log", **settings)
    assert first_batch.wait_exit(90) == 2
    event = first_batch.wait_for("sink.dimension_mismatch", timeout=5)
    assert "dimension 8" in event["reason"]
    assert "dimension 384" in event["reason"]
    assert asyncio.run(committed(kafka.bootstrap_servers, "sink-dim8")) == {}
    assert pg_rows(postgres, "dim8") == []
    assert postgres.password not in (tmp_path / "start.log").read_text()


# ------------------------------------------------------------------ Milvus Lite


def test_stsb_into_milvus_lite_one_row_per_id_and_neighbours_rank_pairs(
    kafka: LocalKafka,
    postgres: LocalPostgres,
    stsb: StsDocs,
    stsb_pg: PgRun,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """The same STS-B stream into a Milvus Lite file: one row per id, the very vectors the
    Postgres table holds, and nearest-neighbour search ranks sentence 2 above a random
    other sentence for >= 95% of the pairs with gold >= 4."""
    path = tmp_path / "stsb.db"
    group = "sink-stsb-milvus"
    sink = start_sink(
        kafka,
        tmp_path / "sink.log",
        target=f"milvus://{path}",
        table="stsb",
        results_topic=stsb.topic,
        group_id=group,
        max_batch_results=32,
    )
    try:
        asyncio.run(wait_drained(kafka.bootstrap_servers, stsb.topic, group, stsb.requests, sink))
    finally:
        assert sink.stop() == 0  # SIGTERM: the Lite file is free for this process afterwards
    rows = milvus_rows(path, "stsb")
    assert sorted(rows) == sorted(stsb.ids)
    assert rows["5.2"]["metadata"] == {
        "source": "stsb-en-test",
        "row": 5,
        "part": 2,
        "score": stsb.pairs[5].score,
    }
    postgres_vectors = {r[0]: parse_vector(r[1]) for r in pg_rows(postgres, stsb_pg.table)}
    for key, row in rows.items():
        np.testing.assert_array_equal(np.array(row["vector"], np.float32), postgres_vectors[key])

    client = MilvusClient(str(path))
    try:
        client.load_collection("stsb")
        (index,) = client.list_indexes("stsb")
        assert client.describe_index("stsb", index)["metric_type"] == "IP"
        triples = high_pairs(stsb)
        ranked = 0
        for first_id, second_id, other_id in triples:
            (hits,) = client.search(
                "stsb",
                data=[rows[first_id]["vector"]],
                filter=f'id in ["{second_id}", "{other_id}"]',
                limit=1,
                output_fields=["id"],
                # Milvus Lite filters HNSW's ef candidates afterwards: a filter that keeps two
                # rows needs candidates from the whole collection.
                search_params={"params": {"ef": len(rows)}},
            )
            ranked += hits[0]["id"] == second_id
        record_property("ranked", f"{ranked}/{len(triples)}")  # reported by --junitxml
        assert ranked / len(triples) >= 0.95, (ranked, len(triples))
    finally:
        client.close()
