"""kembed sink under faults end to end: error results and unusable messages to the
dead-letter topic, a database restart, a rejected login; real Kafka, worker, PostgreSQL
and ``kembed sink`` processes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer

import schemas.headers as hdr
from producer_sdk import EmbedClient
from schemas import EmbedResult, encode_result
from scripts.kafka_local import LocalKafka
from scripts.pg_local import LocalPostgres
from tests.conftest import WorkerProcess, load_stsb
from tests.integration.kafka_io import read_all
from tests.integration.sink_helpers import (
    BULK_LANE,
    SinkProcess,
    committed,
    create_topics,
    metric_value,
    pg_rows,
    pg_settings,
    start_sink,
    submit_docs,
    wait_drained,
    wait_results,
)

pytestmark = pytest.mark.integration


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
                await producer.send_and_wait(
                    topic, b"\xc1 not msgpack", partition=0, headers=BULK_LANE
                )
                small = _ones_result("dim-8", 8, "dim8-1")
                await producer.send_and_wait(
                    topic, encode_result(small), partition=1, headers=BULK_LANE
                )
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
