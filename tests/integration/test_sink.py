"""kembed sink end to end: documents through Kafka, the real worker and model, into a real
PostgreSQL with pgvector and a real Milvus Lite, by real ``kembed sink`` processes."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from aiokafka import AIOKafkaProducer
from pydantic import SecretStr
from pymilvus import MilvusClient

import schemas.headers as hdr
from producer_sdk import EmbedClient
from schemas import EmbedResult, encode_result
from scripts.kafka_local import LocalKafka, TopicSpec
from scripts.pg_local import LocalPostgres
from sink.postgres import PostgresStore
from sink.registry import parse_target
from tests.conftest import StsPair, WorkerProcess, load_stsb
from tests.integration.kafka_io import read_all
from tests.integration.sink_helpers import (
    SinkProcess,
    committed,
    metric_value,
    milvus_rows,
    submit_docs,
    wait_drained,
    wait_results,
)

pytestmark = pytest.mark.integration

BULK = [(hdr.LANE, b"bulk")]
"""The header a worker stamps on results of bulk requests: results written here directly
carry it, as the sink writes only those."""

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


def create_topics(kafka: LocalKafka, topic: str) -> None:
    kafka.create_topics([TopicSpec(topic, 4), TopicSpec(f"{topic}.dlq", 1)])


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


def start_sink(kafka: LocalKafka, log: Path, **settings: Any) -> SinkProcess:
    sink = SinkProcess(kafka.bootstrap_servers, log, **settings)
    sink.wait_ready(timeout=90)
    return sink


def pg_settings(postgres: LocalPostgres, table: str, topic: str, group: str) -> dict[str, Any]:
    return {
        "target": postgres.dsn,
        "target_password": postgres.password,
        "table": table,
        "results_topic": topic,
        "group_id": group,
    }


def milvus_settings(path: Path, table: str, topic: str, group: str) -> dict[str, Any]:
    """A sink writing ``topic`` into collection ``table`` of the Milvus Lite file ``path``."""
    return {"target": f"milvus://{path}", "table": table, "results_topic": topic, "group_id": group}


def _ones_result(request_id: str, dim: int, key: str) -> EmbedResult:
    """A float32 result of one vector of ones, for ``key``."""
    return EmbedResult(
        id=request_id,
        model="m",
        dim=dim,
        vectors=np.ones((1, dim), "<f4").tobytes(),
        tokens=(3,),
        keys=(key,),
    )


def pg_rows(postgres: LocalPostgres, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(postgres.dsn, password=postgres.password) as conn:
        return conn.execute(
            f"SELECT id, vector::text, metadata, model FROM {table} ORDER BY id"
        ).fetchall()


def parse_vector(text: str) -> np.ndarray[Any, np.dtype[np.float32]]:
    return np.array(json.loads(text), dtype=np.float32)


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


def test_error_results_and_unusable_messages_go_to_the_sink_dlq(
    kafka: LocalKafka,
    worker: WorkerProcess,
    postgres: LocalPostgres,
    tmp_path: Path,
) -> None:
    """Error results (invalid_request, unknown_model), binary vectors, results without keys,
    undecodable messages and vectors of another dimension are counted, logged with their ids
    (never texts) and copied to the sink's dead-letter topic with origin headers; none of
    them becomes a row, and the sink keeps writing the good ones."""
    topic, group = "embed.results.errors", "sink-errors"
    create_topics(kafka, topic)
    secret_text = "confidential words that must never reach a log " * 60
    sink = start_sink(kafka, tmp_path / "sink.log", **pg_settings(postgres, "errors", topic, group))
    bootstrap = kafka.bootstrap_servers
    try:
        sent = asyncio.run(
            submit_docs(bootstrap, ["good one", "good two"], ["g1", "g2"], None, reply_to=topic)
        )
        asyncio.run(wait_drained(bootstrap, topic, group, sent, sink))

        async def bad_messages() -> int:
            count = await submit_docs(
                bootstrap,
                ["fine", secret_text],
                ["wide-1", "wide-2"],
                None,
                reply_to=topic,
                dimensions=1000,
            )
            count += await submit_docs(
                bootstrap, ["x"], ["unknown-1"], None, reply_to=topic, model="no-such-model"
            )
            count += await submit_docs(
                bootstrap, ["bits"], ["binary-1"], None, reply_to=topic, encoding="binary"
            )
            count += await submit_docs(bootstrap, ["no keys here"], None, None, reply_to=topic)
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
            await producer.start()
            try:
                await producer.send_and_wait(topic, b"\xc1 not msgpack", partition=0, headers=BULK)
                small = _ones_result("dim-8", 8, "dim8-1")
                await producer.send_and_wait(topic, encode_result(small), partition=1, headers=BULK)
                # a valid result no worker stamped (written by anyone else)
                unstamped = _ones_result("forged", 384, "forged-1")
                await producer.send_and_wait(topic, encode_result(unstamped), partition=0)
            finally:
                await producer.stop()
            # an interactive request answered on the sink's input: stamped interactive
            async with EmbedClient(bootstrap) as client:
                await client.submit(["chosen row"], keys=["chosen-1"], reply_to=topic, bulk=False)
            return count + 4

        sent += asyncio.run(bad_messages())
        asyncio.run(wait_drained(bootstrap, topic, group, sent, sink))
        metrics = sink.metrics()
    finally:
        assert sink.stop() == 0
    assert [r[0] for r in pg_rows(postgres, "errors")] == ["g1", "g2"]
    dead = asyncio.run(read_all(bootstrap, f"{topic}.dlq"))
    codes = sorted(dict(r.headers)[hdr.DLQ_ERROR_CODE].decode() for r in dead)
    assert codes == sorted(
        [
            "invalid_request",
            "unknown_model",
            "unsupported_dtype",
            "missing_keys",
            "invalid_result",
            "dimension_mismatch",
            "not_bulk_lane",
            "not_bulk_lane",
        ]
    )
    for record in dead:
        headers = dict(record.headers)
        assert headers[hdr.DLQ_TOPIC] == topic.encode()
        assert int(headers[hdr.DLQ_PARTITION]) >= 0
        assert int(headers[hdr.DLQ_OFFSET]) >= 0
        assert headers[hdr.DLQ_ERROR_MESSAGE]
    garbage = [r for r in dead if dict(r.headers)[hdr.DLQ_ERROR_CODE] == b"invalid_result"]
    assert garbage[0].value == b"\xc1 not msgpack"
    for code in ("invalid_request", "unknown_model", "unsupported_dtype", "missing_keys"):
        assert metric_value(metrics, "kembed_sink_errors_total", kind=code) == 1
        assert metric_value(metrics, "kembed_sink_dlq_messages_total", code=code) == 1
    assert metric_value(metrics, "kembed_sink_dlq_messages_total", code="dimension_mismatch") == 1
    # not of the bulk lane: the worker's interactive answer, and one no worker wrote
    assert metric_value(metrics, "kembed_sink_dlq_messages_total", code="not_bulk_lane") == 2
    lanes = sorted(
        (
            dict(r.headers).get(hdr.LANE, b"").decode(),
            dict(r.headers)[hdr.DLQ_ERROR_MESSAGE].decode(),
        )
        for r in dead
        if dict(r.headers)[hdr.DLQ_ERROR_CODE] == b"not_bulk_lane"
    )
    assert [lane for lane, _ in lanes] == ["", "interactive"]
    assert "no kembed.lane" in lanes[0][1]
    assert "kembed.lane: interactive" in lanes[1][1]
    assert metric_value(metrics, "kembed_sink_rows_upserted_total", table="errors") == 2
    log = (tmp_path / "sink.log").read_text()
    assert "confidential words" not in log
    events = [e for e in sink.events() if e.get("event") == "sink.error_result"]
    assert {tuple(e["keys"]) for e in events} == {("wide-1", "wide-2"), ("unknown-1",)}
    refused = {e["code"]: e for e in sink.events() if e.get("event") == "sink.refused"}
    assert refused["unsupported_dtype"]["keys"] == ["binary-1"]
    assert refused["dimension_mismatch"]["keys"] == ["dim8-1"]


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


def test_database_restart_is_retried_and_loses_nothing(
    kafka: LocalKafka, worker: WorkerProcess, postgres: LocalPostgres, tmp_path: Path
) -> None:
    """Postgres going down while results arrive: the sink retries the write, reconnecting
    with backoff, commits nothing meanwhile, and writes every row once it is back."""
    topic, group = "embed.results.pg-restart", "sink-pg-restart"
    create_topics(kafka, topic)
    bootstrap = kafka.bootstrap_servers
    pairs = load_stsb()[:40]
    ids = [f"r-{i}" for i in range(len(pairs))]
    texts = [pair.first for pair in pairs]
    sink = start_sink(
        kafka,
        tmp_path / "sink.log",
        **pg_settings(postgres, "restarted", topic, group),
        write_retry_s=120,
    )
    try:
        sent = asyncio.run(submit_docs(bootstrap, texts[:20], ids[:20], None, reply_to=topic))
        asyncio.run(wait_drained(bootstrap, topic, group, sent, sink))
        before = asyncio.run(committed(bootstrap, group))
        postgres.stop_server()
        try:
            sent += asyncio.run(
                submit_docs(bootstrap, texts[20:], ids[20:], None, reply_to=topic, per_request=5)
            )
            asyncio.run(wait_results(bootstrap, topic, sent))
            sink.wait_for("sink.write_retry", timeout=60)
            assert asyncio.run(committed(bootstrap, group)) == before
        finally:
            postgres.start_server()
        asyncio.run(wait_drained(bootstrap, topic, group, sent, sink))
        metrics = sink.metrics()
    finally:
        assert sink.stop() == 0
    assert [r[0] for r in pg_rows(postgres, "restarted")] == sorted(ids)
    assert metric_value(metrics, "kembed_sink_errors_total", kind="write_retry") >= 1
    assert metric_value(metrics, "kembed_sink_rows_upserted_total", table="restarted") == len(ids)


def test_wrong_database_password_exits_1_and_is_never_logged(
    kafka: LocalKafka, postgres: LocalPostgres, tmp_path: Path
) -> None:
    """A rejected login ends the sink with status 1 (after write_retry_s), saying why with
    the target's URI, and the password appears nowhere in its output."""
    wrong = "wrong-pw-4711"
    sink = SinkProcess(
        kafka.bootstrap_servers,
        tmp_path / "sink.log",
        target=f"postgresql://{postgres.user}:{wrong}@127.0.0.1:{postgres.port}/postgres",
        results_topic="embed.results",
        group_id="sink-bad-password",
        write_retry_s=0,
    )
    assert sink.wait_exit(60) == 1
    event = sink.wait_for("sink.write_failed", timeout=5)
    assert "password authentication failed" in event["reason"]
    assert f"postgresql://{postgres.user}@127.0.0.1:{postgres.port}/postgres" in event["reason"]
    assert wrong not in (tmp_path / "sink.log").read_text()


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


# ------------------------------------------------------------------ versions


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
            await producer.send_and_wait(topic, value, partition=partition, headers=BULK)
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
                await producer.send_and_wait(topic, value, partition=partition, headers=BULK)
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
                await producer.send_and_wait(topic, value, partition=r % 4, headers=BULK)
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
