"""Helpers for the sink's integration tests: a real ``kembed sink`` process, document
requests sent through Kafka to the real worker, and waiting until a sink has drained."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from producer_sdk import EmbedClient
from schemas.headers import LANE, LANE_BULK
from scripts.kafka_local import LocalKafka, TopicSpec
from scripts.pg_local import LocalPostgres
from scripts.worker_process import WorkerProcess, variables

BULK_LANE = [(LANE, LANE_BULK.encode())]
"""The header workers stamp on results of bulk requests: the only results a sink writes."""


class SinkProcess(WorkerProcess):
    """A real ``kembed sink`` process (``python -m kembed_cli sink``), its JSON log
    captured; ``settings`` become ``KEMBED_SINK_*`` variables."""

    def __init__(self, bootstrap_servers: str, log_path: Path, **settings: Any) -> None:
        env = {
            "KEMBED_SINK_LOG_FORMAT": "json",
            "KEMBED_SINK_HTTP_PORT": "0",
            # A restarted sink rejoins its group without waiting 45 s for a killed one.
            "KEMBED_SINK_SESSION_TIMEOUT_MS": "6000",
            "KEMBED_SINK_HEARTBEAT_INTERVAL_MS": "1000",
            **variables("KEMBED_SINK_", settings),
        }
        self._run(["kembed_cli", "sink"], bootstrap_servers, log_path, env)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.http_url}/metrics", timeout=10) as response:
            text: str = response.read().decode()
            return text

    def wait_exit(self, timeout: float = 60.0) -> int:
        code = self.process.wait(timeout)
        self._log.close()
        return code


def metric_value(exposition: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus text exposition (0 when absent)."""
    for line in exposition.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        series, value = line.rsplit(" ", 1)
        metric, _, label_text = series.partition("{")
        if metric != name:
            continue
        found = dict(
            part.split("=", 1) for part in label_text.rstrip("}").split(",") if "=" in part
        )
        if all(found.get(k, "").strip('"') == v for k, v in labels.items()):
            return float(value)
    return 0.0


_READ_MILVUS = """
import json, sys
from pymilvus import MilvusClient
client = MilvusClient(sys.argv[1])
client.load_collection(sys.argv[2])
rows = client.query(
    sys.argv[2],
    filter="",
    output_fields=["id", "vector", "metadata", "model", "requested_ms"],
    limit=16384,
)
json.dump([{**row, "vector": [float(x) for x in row["vector"]]} for row in rows], sys.stdout)
"""


def milvus_rows(path: Path, collection: str) -> dict[str, dict[str, Any]]:
    """Every row of a Milvus Lite collection, by id. Read in a child process: Milvus Lite
    holds a file's lock for the life of the process that opened it, and a sink must open
    the file again after this."""
    done = subprocess.run(
        [sys.executable, "-c", _READ_MILVUS, str(path), collection],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return {row["id"]: row for row in json.loads(done.stdout)}


async def submit_docs(
    bootstrap: str,
    texts: Sequence[str],
    keys: Sequence[str | int] | None,
    metadata: Sequence[dict[str, Any]] | None,
    *,
    reply_to: str,
    meta: dict[str, Any] | None = None,
    per_request: int = 50,
    **options: Any,
) -> int:
    """Submit ``texts`` as an ingesting producer does (``EmbedClient.submit``, the bulk
    lane), ``per_request`` documents per request, answered on ``reply_to``: ``keys`` are
    the row ids, ``metadata`` the per-document metadata. Returns the number of requests,
    once the broker has acknowledged all of them."""
    async with EmbedClient(bootstrap) as client:
        requests = 0
        for start in range(0, len(texts), per_request):
            end = start + per_request
            await client.submit(
                texts[start:end],
                keys=None if keys is None else keys[start:end],
                metadata=None if metadata is None else metadata[start:end],
                meta=meta,
                reply_to=reply_to,
                bulk=True,
                **options,
            )
            requests += 1
        return requests


async def end_offsets(bootstrap: str, topic: str) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic)
        while not partitions:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic)
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        ends: dict[TopicPartition, int] = await consumer.end_offsets(tps)
        return ends
    finally:
        await consumer.stop()


async def wait_results(bootstrap: str, topic: str, count: int, timeout: float = 180) -> None:
    """Until ``topic`` holds ``count`` messages (every request answered)."""
    deadline = time.monotonic() + timeout
    while True:
        total = sum((await end_offsets(bootstrap, topic)).values())
        if total >= count:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic} holds {total} results, expected {count}")
        await asyncio.sleep(0.5)


async def committed(bootstrap: str, group: str) -> dict[TopicPartition, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
        return {tp: meta.offset for tp, meta in offsets.items()}
    finally:
        await admin.close()


async def wait_drained(
    bootstrap: str,
    topic: str,
    group: str,
    count: int,
    sink: SinkProcess | None = None,
    timeout: float = 180,
) -> None:
    """Until ``topic`` holds ``count`` results and ``group`` has committed all of them
    (a sink commits only after its database transaction)."""
    await wait_results(bootstrap, topic, count, timeout)
    ends = await end_offsets(bootstrap, topic)
    deadline = time.monotonic() + timeout
    while True:
        done = await committed(bootstrap, group)
        if all(done.get(tp, 0) >= end for tp, end in ends.items() if end > 0):
            return
        if sink is not None and sink.process.poll() is not None:
            raise AssertionError(f"the sink exited ({sink.process.returncode}) before draining")
        if time.monotonic() > deadline:
            raise AssertionError(f"group {group} committed {done}, topic ends at {ends}")
        await asyncio.sleep(0.3)


def create_topics(kafka: LocalKafka, topic: str) -> None:
    kafka.create_topics([TopicSpec(topic, 4), TopicSpec(f"{topic}.dlq", 1)])


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


def pg_rows(postgres: LocalPostgres, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(postgres.dsn, password=postgres.password) as conn:
        return conn.execute(
            f"SELECT id, vector::text, metadata, model FROM {table} ORDER BY id"
        ).fetchall()


def parse_vector(text: str) -> np.ndarray[Any, np.dtype[np.float32]]:
    return np.array(json.loads(text), dtype=np.float32)
