"""`kembed status` against the real broker and a real worker: backlog while no worker runs,
then the member, its assignment and zero lag once the worker has answered everything."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from schemas import EmbedRequest, decode_result, encode_request
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess
from tests.integration.kafka_io import collect, producer
from tests.support.cli import run_kembed, without_kembed_env

pytestmark = pytest.mark.integration

PARTITIONS = 3
REQUESTS = 11


def kembed_status(kafka: LocalKafka, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m kembed_cli status ...` in its own process, as an operator runs it."""
    return run_kembed(
        "status",
        "--bootstrap-servers",
        kafka.bootstrap_servers,
        *args,
        env=without_kembed_env(),
        timeout=60,
    )


def status_json(kafka: LocalKafka, group: str, topics: list[str]) -> dict[str, Any]:
    done = kembed_status(kafka, "--group", group, "--topics", ",".join(topics), "--json")
    assert done.returncode == 0, done.stderr
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


def lag_by_topic(status: dict[str, Any]) -> dict[str, int]:
    lags: dict[str, int] = {}
    for p in status["partitions"]:
        lags[p["topic"]] = lags.get(p["topic"], 0) + p["lag"]
    return lags


async def test_status_shows_the_backlog_then_the_member_and_no_lag(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """With the worker stopped, N requests published to its topic show as lag summing to N,
    in JSON and in the table; a topic that does not exist is named (alone: exit 2). Started
    again, the worker answers them all; status then shows it as the one member, holding
    every partition of both lanes, with lag 0 everywhere."""
    requests = f"status.{uuid.uuid4().hex[:6]}"
    bulk, results, group = f"{requests}.bulk", f"{requests}.results", f"group-{requests}"
    topics = [requests, bulk]
    kafka.create_topics(
        [TopicSpec(requests, PARTITIONS), TopicSpec(bulk, 1), TopicSpec(results, 1)]
    )
    settings: dict[str, Any] = {
        "requests_topic": requests,
        "bulk_topic": bulk,
        "results_topic": results,
        "group_id": group,
        "client_id": "status-worker",
    }
    first = WorkerProcess(kafka.bootstrap_servers, tmp_path / "first.log", **settings)
    try:
        first.wait_ready()
    finally:
        assert first.stop() == 0

    async with producer(kafka.bootstrap_servers, acks="all") as client:
        for i in range(REQUESTS):
            request = EmbedRequest(id=f"r{i}", inputs=(f"text number {i}",))
            await client.send_and_wait(requests, encode_request(request), partition=i % PARTITIONS)

    waiting = status_json(kafka, group, topics)
    assert waiting["group"] == group
    assert waiting["state"] == "Empty"
    assert waiting["members"] == []
    assert [p["partition"] for p in waiting["partitions"] if p["topic"] == requests] == [0, 1, 2]
    assert all(p["member_id"] is None for p in waiting["partitions"])
    assert lag_by_topic(waiting) == {requests: REQUESTS, bulk: 0}
    assert sum(p["end"] for p in waiting["partitions"]) == REQUESTS
    assert waiting["topics"][requests] == {
        "partitions": PARTITIONS,
        "assigned": 0,
        "end": REQUESTS,
        "lag": REQUESTS,
    }
    assert waiting["backlog"] == {"messages": REQUESTS, "tokens": None, "tokens_from": []}

    table = kembed_status(kafka, "--group", group, "--topics", ",".join(topics))
    assert table.returncode == 0, table.stderr
    assert f"backlog: {REQUESTS} messages" in table.stdout
    assert "no members" in table.stdout
    assert "backlog tokens: not read" in table.stdout

    absent = f"{requests}.absent"
    partly = status_json(kafka, group, [*topics, absent])
    assert partly["missing_topics"] == [absent]
    assert lag_by_topic(partly) == {requests: REQUESTS, bulk: 0}
    only_absent = kembed_status(kafka, "--group", group, "--topics", absent)
    assert only_absent.returncode == 2
    assert absent in only_absent.stderr

    second = WorkerProcess(kafka.bootstrap_servers, tmp_path / "second.log", **settings)
    try:
        second.wait_ready()
        answered = await collect(
            kafka.bootstrap_servers, results, lambda rs: len(rs) >= REQUESTS, timeout=120
        )
        assert sorted(decode_result(r.value).id for r in answered) == sorted(
            f"r{i}" for i in range(REQUESTS)
        )
        # Offsets are committed every commit_interval_ms after the answers are acknowledged.
        deadline = time.monotonic() + 30
        while True:
            serving = status_json(kafka, group, topics)
            if sum(lag_by_topic(serving).values()) == 0 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    finally:
        assert second.stop() == 0

    assert serving["state"] == "Stable"
    assert lag_by_topic(serving) == {requests: 0, bulk: 0}
    (member,) = serving["members"]
    assert member["client_id"] == "status-worker"
    assert member["host"]
    assert sorted((p["topic"], p["partition"]) for p in member["partitions"]) == [
        (requests, 0),
        (requests, 1),
        (requests, 2),
        (bulk, 0),
    ]
    assert all(p["member_id"] == member["member_id"] for p in serving["partitions"])
    assert all(p["committed"] == p["end"] for p in serving["partitions"] if p["end"])
    assert serving["topics"][requests]["assigned"] == PARTITIONS
    assert serving["backlog"]["messages"] == 0


def test_status_of_an_unknown_group_exits_2_without_a_traceback(kafka: LocalKafka) -> None:
    """A group the cluster has never seen is an error for people: exit 2, one clear line."""
    done = kembed_status(kafka, "--group", f"no-such-group-{uuid.uuid4().hex[:6]}")
    assert done.returncode == 2
    assert "unknown" in done.stderr
    assert "--group" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
