"""Several real ``kembed sink`` processes in one group on one results topic, writing one
PostgreSQL table: the versions of each document sit on different partitions (so in
different sinks' batches, written concurrently), in both orders, one sink is killed and
replaced mid-stream, and every document must end as exactly its newest version: its
chunks, no more (no chunk of an older, longer version comes back), no fewer."""

from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from aiokafka import AIOKafkaProducer
from psycopg import sql

from schemas import EmbedResult, encode_result
from scripts.kafka_local import LocalKafka, TopicSpec
from scripts.pg_local import LocalPostgres
from tests.integration.sink_helpers import BULK_LANE, SinkProcess, wait_drained
from tests.integration.test_sink_chunks_postgres import old_table

pytestmark = pytest.mark.integration

DIM = 8
PARTITIONS = 6
DOCS = 800
VERSIONS = (10, 20, 30, 40)


def _result(doc: str, version: int, chunks: int) -> EmbedResult:
    """Version ``version`` of document ``doc`` in ``chunks`` chunks (0: unchunked, one
    row); each vector's first value is the version, so the table shows which version a
    row came from."""
    vectors = np.full((max(chunks, 1), DIM), 0.5, "<f4")
    vectors[:, 0] = version
    vectors[:, 1] = np.arange(max(chunks, 1))
    if not chunks:
        return EmbedResult(
            id=f"{doc}-v{version}",
            model="m",
            dim=DIM,
            vectors=vectors.tobytes(),
            tokens=(5,),
            keys=(doc,),
            requested_ms=version,
        )
    return EmbedResult(
        id=f"{doc}-v{version}",
        model="m",
        dim=DIM,
        vectors=vectors.tobytes(),
        tokens=(5,) * chunks,
        keys=(doc,),
        meta={"docs": [{"version": version}]},
        requested_ms=version,
        chunks=(chunks,),
        spans=tuple((10 * k, 10 * k + 10) for k in range(chunks)),
    )


def _plan(
    seed: int, mixed: bool
) -> tuple[list[tuple[int, EmbedResult]], dict[str, dict[str, int]]]:
    """Every version of every document, each on its own partition at about the same
    offset (so two sinks meet it at the same time), older first for half the documents
    and newer first for the others, with chunk counts that rise and fall, and (``mixed``)
    some versions unchunked (the document changes form). Returns the
    (partition, result) sequence to produce and each document's newest rows (id ->
    version)."""
    rng = random.Random(seed)
    sends: list[tuple[int, EmbedResult]] = []
    expected: dict[str, dict[str, int]] = {}
    for index in range(DOCS):
        doc = f"doc-{index}"
        low = 0 if mixed else 1
        counts = {version: rng.randint(low, 6) for version in VERSIONS}
        order = list(VERSIONS) if index % 2 == 0 else list(reversed(VERSIONS))
        partitions = rng.sample(range(PARTITIONS), len(VERSIONS))
        for version, partition in zip(order, partitions, strict=True):
            sends.append((partition, _result(doc, version, counts[version])))
        newest = max(VERSIONS)
        chunks = counts[newest]
        expected[doc] = {f"{doc}#{k}": newest for k in range(chunks)} if chunks else {doc: newest}
    return sends, expected


async def _produce(bootstrap: str, topic: str, sends: list[tuple[int, EmbedResult]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                encode_result(result),
                key=result.id.encode(),
                partition=partition,
                headers=BULK_LANE,
            )
            for partition, result in sends
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def _table(postgres: LocalPostgres, table: str) -> dict[str, tuple[int, float]]:
    with psycopg.connect(postgres.dsn, password=postgres.password, autocommit=True) as conn:
        found = conn.execute(
            sql.SQL("SELECT id, requested_ms, (vector::real[])[1] FROM {t}").format(
                t=sql.Identifier(table)
            )
        ).fetchall()
    return {key: (version, first) for key, version, first in found}


def _settings(postgres: LocalPostgres, table: str, topic: str, **more: Any) -> dict[str, Any]:
    """A sink of group ``sink-<table>`` writing ``topic`` into ``table``."""
    return {
        "target": postgres.dsn,
        "target_password": postgres.password,
        "table": table,
        "results_topic": topic,
        "group_id": f"sink-{table}",
        **more,
    }


@pytest.mark.parametrize(
    ("sinks", "forms"), [(2, "chunked"), (3, "chunked"), (2, "mixed"), (3, "mixed")]
)
def test_concurrent_sinks_leave_every_document_at_its_newest_version(
    kafka: LocalKafka, postgres: LocalPostgres, tmp_path: Path, sinks: int, forms: str
) -> None:
    name = f"race{sinks}{forms}"
    topic, group, table = f"embed.results.{name}", f"sink-{name}", name
    kafka.create_topics([TopicSpec(topic, PARTITIONS), TopicSpec(f"{topic}.dlq", 1)])
    settings = _settings(postgres, table, topic, max_batch_results=25, dim=DIM, metric="l2")
    bootstrap = kafka.bootstrap_servers
    running = [SinkProcess(bootstrap, tmp_path / f"sink{n}.log", **settings) for n in range(sinks)]
    try:
        for sink in running:
            sink.wait_ready(timeout=90)
        sends, expected = _plan(seed=sinks, mixed=forms == "mixed")
        half = len(sends) // 2
        # The sinks wait (stopped, within their session timeout) while the first half is
        # produced, then start on it together: their batches meet each document at once.
        for sink in running:
            sink.process.send_signal(signal.SIGSTOP)
        try:
            asyncio.run(_produce(bootstrap, topic, sends[:half]))
        finally:
            for sink in running:
                sink.process.send_signal(signal.SIGCONT)
        asyncio.run(_produce(bootstrap, topic, sends[half:]))
        # A sink dies between (or in) batches; a new one takes its partitions over.
        running[0].process.kill()
        running[0].wait_exit()
        running[0] = SinkProcess(bootstrap, tmp_path / "replacement.log", **settings)
        asyncio.run(wait_drained(bootstrap, topic, group, len(sends), timeout=300))
    finally:
        for sink in running:
            sink.stop()
    stored = _table(postgres, table)
    want = {
        key: (version, float(version))
        for rows in expected.values()
        for key, version in rows.items()
    }
    wrong = {
        key: (stored.get(key), want.get(key))
        for key in stored.keys() | want.keys()
        if stored.get(key) != want.get(key)
    }
    assert not wrong, (
        f"{len(wrong)} rows differ from the newest versions: {sorted(wrong.items())[:10]}"
    )


def test_sinks_started_on_a_table_of_an_older_sink_migrate_it_and_write(
    kafka: LocalKafka, postgres: LocalPostgres, tmp_path: Path
) -> None:
    """Two sinks start together on a table of the former shape (chunks of "a" at version
    10, identity in the metadata): they migrate it at start-up, one at a time, and then a
    shorter version of "a" replaces its chunks and an older result of "p" changes
    nothing."""
    topic, group, table = "embed.results.migrated", "sink-migrated", "migrated"
    kafka.create_topics([TopicSpec(topic, 2), TopicSpec(f"{topic}.dlq", 1)])
    old_table(
        postgres,
        table,
        [
            *((f"a#{k}", {"doc_key": "a", "chunk_index": k}, 10) for k in range(3)),
            ("p", {"title": "P"}, 30),
        ],
    )
    bootstrap = kafka.bootstrap_servers
    settings = _settings(postgres, table, topic)
    sinks = [SinkProcess(bootstrap, tmp_path / f"sink{n}.log", **settings) for n in range(2)]
    sends = [(0, _result("a", 20, 1)), (1, _result("p", 25, 0))]
    try:
        for sink in sinks:
            sink.wait_ready(timeout=90)
        asyncio.run(_produce(bootstrap, topic, sends))
        asyncio.run(wait_drained(bootstrap, topic, group, len(sends)))
    finally:
        for sink in sinks:
            assert sink.stop() == 0
    assert _table(postgres, table) == {"a#0": (20, 20.0), "p": (30, 0.5)}
