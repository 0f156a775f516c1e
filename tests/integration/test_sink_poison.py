"""Results a database refuses for good, against a real ``kembed sink`` and a real
PostgreSQL (and a real Milvus Lite): each goes to the sink's dead-letter topic with a code
naming the cause, and the results after it are written; the sink keeps running."""

from __future__ import annotations

import asyncio
import random
import string
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from aiokafka import AIOKafkaProducer
from psycopg import sql
from pydantic import SecretStr

from schemas import EmbedResult, encode_result
from schemas.headers import DLQ_ERROR_CODE
from scripts.kafka_local import LocalKafka, TopicSpec
from scripts.pg_local import LocalPostgres
from sink.postgres import PostgresStore
from sink.registry import parse_target
from tests.integration.kafka_io import read_all
from tests.integration.sink_helpers import BULK_LANE, SinkProcess, milvus_rows, wait_drained

pytestmark = pytest.mark.integration

DIM = 8


def _result(key: str, model: str = "m", **metadata: Any) -> EmbedResult:
    return EmbedResult(
        id=f"req-{key}",
        model=model,
        dim=DIM,
        vectors=np.full((1, DIM), 0.25, "<f4").tobytes(),
        tokens=(3,),
        keys=(key,),
        meta={"docs": [metadata]},
        requested_ms=1_000,
    )


async def _produce(bootstrap: str, topic: str, results: list[EmbedResult]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for result in results:  # one partition: the bad ones sit between good ones
            await producer.send_and_wait(
                topic, encode_result(result), key=result.id.encode(), partition=0, headers=BULK_LANE
            )
    finally:
        await producer.stop()


def _dead_codes(bootstrap: str, topic: str) -> dict[str, str]:
    dead = asyncio.run(read_all(bootstrap, f"{topic}.dlq"))
    return {(r.key or b"").decode(): dict(r.headers)[DLQ_ERROR_CODE].decode() for r in dead}


def _sink_through(
    kafka: LocalKafka,
    tmp_path: Path,
    topic: str,
    group: str,
    results: list[EmbedResult],
    **settings: Any,
) -> None:
    """A sink process (``settings``) takes every result of ``results`` from ``topic``,
    keeps running while it does, and stops cleanly."""
    sink = SinkProcess(
        kafka.bootstrap_servers,
        tmp_path / "sink.log",
        results_topic=topic,
        group_id=group,
        write_retry_s=5,
        **settings,
    )
    try:
        sink.wait_ready(timeout=90)
        asyncio.run(_produce(kafka.bootstrap_servers, topic, results))
        asyncio.run(wait_drained(kafka.bootstrap_servers, topic, group, len(results), sink))
        assert sink.process.poll() is None
    finally:
        assert sink.stop() == 0


def test_postgres_refusals_are_dead_lettered_by_cause_and_the_next_results_written(
    kafka: LocalKafka, postgres: LocalPostgres, tmp_path: Path
) -> None:
    """The operator's own index on ``metadata->>'title'`` makes a result with a long title
    an index row too large (SQLSTATE 54000), a CHECK constraint refuses a model (23514),
    jsonb refuses a NUL character (22P05): each is dead-lettered (``limit_exceeded``,
    ``constraint_violation``, ``invalid_value``) and the good results around them are
    written, in one run of the sink."""
    topic, group, table = "embed.results.poison", "sink-poison", "poison"
    kafka.create_topics([TopicSpec(topic, 2), TopicSpec(f"{topic}.dlq", 1)])
    store = PostgresStore(parse_target(postgres.dsn, SecretStr(postgres.password)), table)
    store.open()
    store.create(DIM, "l2")
    store.close()
    with psycopg.connect(postgres.dsn, password=postgres.password, autocommit=True) as conn:
        t = sql.Identifier(table)
        conn.execute(sql.SQL("CREATE INDEX poison_title ON {t} ((metadata->>'title'))").format(t=t))
        conn.execute(
            sql.SQL(
                "ALTER TABLE {t} ADD CONSTRAINT no_forbidden CHECK (model <> 'forbidden')"
            ).format(t=t)
        )
    rng = random.Random(5)
    long_title = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(40_000))
    results = [
        _result("good-1", title="fine"),
        _result("too-long", title=long_title),
        _result("good-2"),
        _result("refused-model", model="forbidden"),
        _result("good-3"),
        _result("nul", title="a\x00b"),
        _result("good-4"),
    ]
    _sink_through(
        kafka,
        tmp_path,
        topic,
        group,
        results,
        target=postgres.dsn,
        target_password=postgres.password,
        table=table,
    )
    with psycopg.connect(postgres.dsn, password=postgres.password, autocommit=True) as conn:
        stored = conn.execute(
            sql.SQL("SELECT id FROM {t} ORDER BY id").format(t=sql.Identifier(table))
        ).fetchall()
    assert [key for (key,) in stored] == ["good-1", "good-2", "good-3", "good-4"]
    assert _dead_codes(kafka.bootstrap_servers, topic) == {
        "req-too-long": "limit_exceeded",
        "req-refused-model": "constraint_violation",
        "req-nul": "invalid_value",
    }


def test_milvus_keys_with_backslashes_newlines_and_control_characters_are_written(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """Keys that a filter built from JSON text cannot hold (a backslash, a newline, a
    control character, quotes) are written and replaced like any other, chunked or not;
    the sink keeps running and dead-letters nothing."""
    topic, group, collection = "embed.results.milvus_keys", "sink-milvus-keys", "odd_keys"
    kafka.create_topics([TopicSpec(topic, 2), TopicSpec(f"{topic}.dlq", 1)])
    path = tmp_path / "keys.db"
    odd = ["back\\slash", "new\nline", "bell\x07", 'quo"te', "it's", "tab\tend"]
    first = [_result(key, title="v1") for key in odd]
    second = [
        EmbedResult(
            id=f"req2-{key}",
            model="m",
            dim=DIM,
            vectors=np.full((2, DIM), 0.5, "<f4").tobytes(),
            tokens=(3, 3),
            keys=(key,),
            requested_ms=2_000,
            chunks=(2,),
            spans=((0, 5), (3, 9)),
            chunk_pooling="none",
        )
        for key in odd[:3]
    ]
    results = [*first, *second, _result("after", title="ok")]
    _sink_through(
        kafka, tmp_path, topic, group, results, target=f"milvus:///{path}", table=collection
    )
    stored = milvus_rows(path, collection)
    want = {f"{key}#{k}": 2_000 for key in odd[:3] for k in range(2)}
    want |= {key: 1_000 for key in odd[3:]}
    want |= {"after": 1_000}
    assert {key: row["requested_ms"] for key, row in stored.items()} == want
    assert _dead_codes(kafka.bootstrap_servers, topic) == {}
