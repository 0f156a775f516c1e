"""``kembed topics create|check`` against the real broker, topics created wrong on purpose,
and a worker and a sink started before their topics exist (not ready, one error naming the
topics, then serving within seconds of ``kembed topics create``)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from kembed_cli.main import main
from producer_sdk import EmbedClient
from schemas import EmbedRequest, EmbedResult, decode_result, encode_request
from scripts.kafka_local import LocalKafka, TopicSpec, free_port
from tests.conftest import WorkerProcess
from tests.integration.kafka_io import collect, producer
from tests.integration.sink_helpers import SinkProcess
from tests.support.cli import run_kembed

pytestmark = pytest.mark.integration

# Once the topics exist, a waiting worker or sink must serve well within aiokafka's
# 5-minute metadata refresh: a functional bound, generous for a loaded machine.
PICKED_UP_S = 30


def fleet(prefix: str) -> dict[str, str]:
    """A fleet's topic settings, every name under ``prefix`` (unique per test)."""
    return {
        "requests_topic": f"{prefix}.requests",
        "bulk_topic": f"{prefix}.requests.bulk",
        "results_topic": f"{prefix}.results",
        "dlq_topic": f"{prefix}.requests.dlq",
        "catalog_topic": f"{prefix}.models",
    }


def flags(settings: dict[str, str]) -> list[str]:
    return [arg for k, v in settings.items() for arg in (f"--{k.replace('_', '-')}", v)]


def kembed_topics(kafka: LocalKafka, *args: str) -> tuple[int, str]:
    """``kembed topics ...`` in this process (quicker than a subprocess): status, output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(["topics", *args, "--bootstrap-servers", kafka.bootstrap_servers])
    return code, out.getvalue()


def problems(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("problem: ")]


async def describe(kafka: LocalKafka, names: list[str]) -> dict[str, tuple[int, dict[str, str]]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        topics = await admin.describe_topics(names)
        resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
        (response,) = await admin.describe_configs(resources)
    finally:
        await admin.close()
    configs = {r[3]: {e[0]: e[1] for e in r[4]} for r in response.resources}
    return {t["topic"]: (len(t["partitions"]), configs[t["topic"]]) for t in topics}


def test_create_makes_every_topic_as_planned_check_agrees_and_create_again_changes_nothing(
    kafka: LocalKafka,
) -> None:
    """The command line as an operator runs it: ``python -m kembed_cli topics ...``, the
    worker's settings as KEMBED_* variables, sink results topics as --results."""
    settings = fleet(f"t{uuid.uuid4().hex[:8]}")
    docs = f"{settings['results_topic']}.docs"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEMBED_")}
    env |= {f"KEMBED_{k.upper()}": v for k, v in settings.items()}
    env |= {"KEMBED_BOOTSTRAP_SERVERS": kafka.bootstrap_servers}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_kembed("topics", *args, env=env)

    created = run("create", "--results", docs, "--partitions", "3")
    assert created.returncode == 0, created.stdout + created.stderr
    planned = [*settings.values(), docs, f"{docs}.dlq"]
    for name in planned:
        assert f"created {name} " in created.stdout
    assert "7 topic(s): 7 created, 0 already as required, 0 problem(s)" in created.stdout

    found = asyncio.run(describe(kafka, planned))
    assert {name: count for name, (count, _) in found.items()} == {
        settings["requests_topic"]: 3,
        settings["bulk_topic"]: 3,
        settings["results_topic"]: 3,
        settings["dlq_topic"]: 1,
        settings["catalog_topic"]: 1,
        docs: 3,
        f"{docs}.dlq": 1,
    }
    assert found[settings["requests_topic"]][1]["max.message.bytes"] == str(8 * 1024 * 1024)
    for name in (settings["requests_topic"], settings["bulk_topic"]):
        assert found[name][1]["message.timestamp.type"] == "LogAppendTime"
    assert int(found[docs][1]["max.message.bytes"]) > 1_000_000
    for name in (docs, f"{docs}.dlq"):  # the only copy of the vectors until a sink writes them
        assert found[name][1]["retention.ms"] == str(7 * 24 * 3600 * 1000)
        assert found[name][1]["retention.bytes"] == "-1"
    assert found[settings["catalog_topic"]][1]["cleanup.policy"] == "compact,delete"

    checked = run("check", "--results", docs, "--partitions", "3", "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    assert report["problems"] == []
    assert report["created"] == []
    assert sorted(report["ok"]) == sorted(planned)
    assert report["replication_factor"] == 1  # one broker: min(3, brokers)

    again = run("create", "--results", docs, "--partitions", "3")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "7 topic(s): 0 created, 7 already as required, 0 problem(s)" in again.stdout


def test_topics_created_wrong_are_one_problem_line_each_and_exit_1(kafka: LocalKafka) -> None:
    settings = fleet(f"w{uuid.uuid4().hex[:8]}")
    stamped = {"message.timestamp.type": "LogAppendTime"}
    docs = f"{settings['results_topic']}.docs"
    kafka.create_topics(
        [
            TopicSpec(
                settings["requests_topic"], 1, {"max.message.bytes": str(8 * 1024 * 1024)}
            ),  # and the producers' timestamps (CreateTime, Kafka's default)
            TopicSpec(settings["bulk_topic"], 2, {"max.message.bytes": str(1024 * 1024)} | stamped),
            TopicSpec(settings["catalog_topic"], 1),  # cleanup.policy=delete
            TopicSpec(docs, 2, {"retention.ms": "3600000"}),  # a sink's input, kept 1 hour
        ]
    )
    args = [*flags(settings), "--results", docs, "--partitions", "2"]
    code, output = kembed_topics(kafka, "create", *args)
    assert code == 1, output
    # the others are created; those that were there are reported, never changed
    assert f"created {settings['results_topic']} " in output
    expected = [
        f"problem: requests topic '{settings['requests_topic']}' has 1 partition(s), fewer "
        "than the 2 planned",
        f"problem: requests topic '{settings['requests_topic']}' has message.timestamp.type="
        "CreateTime, not LogAppendTime: its producers set the timestamps that sinks take as "
        "their rows' versions",
        f"problem: bulk requests topic '{settings['bulk_topic']}' has max.message.bytes="
        f"{1024 * 1024}, below the {4 * 1024 * 1024 + 16 * 1024} that "
        f"max_request_bytes={4 * 1024 * 1024} needs",
        f"problem: model catalog topic '{settings['catalog_topic']}' has cleanup.policy=delete, "
        "not compacted (needs cleanup.policy=compact,delete)",
        f"problem: sink results topic '{docs}' has retention.ms=3600000, below the 604800000 "
        "planned: results a sink has not written by then are deleted",
    ]
    assert problems(output) == expected
    code, output = kembed_topics(kafka, "check", *args)
    assert (code, problems(output)) == (1, expected)
    # without --partitions, check leaves partition counts alone
    code, output = kembed_topics(kafka, "check", *flags(settings), "--results", docs)
    assert (code, problems(output)) == (1, expected[1:])
    # a sink that may be down for less than an hour asks for less
    code, output = kembed_topics(
        kafka, "check", *flags(settings), "--results", docs, "--results-retention-ms", "3600000"
    )
    assert (code, problems(output)) == (1, expected[1:-1])
    # a missing topic is a problem too
    code, output = kembed_topics(kafka, "check", *flags(settings), "--results", "absent.x")
    assert code == 1
    assert "problem: sink results topic 'absent.x' is missing" in problems(output)
    assert "problem: sink dead letters topic 'absent.x.dlq' is missing" in problems(output)


async def test_a_requests_version_is_the_brokers_time_whatever_its_producer_stamped(
    kafka: LocalKafka, worker: WorkerProcess
) -> None:
    """On a request topic as planned (LogAppendTime), the broker sets the record's
    timestamp: a producer that stamps its request in 2100 does not get rows that no later
    version can replace. The worker copies the record's timestamp as the result's
    requested_ms (the rows' version), the broker's time, on both lanes."""
    reply = f"test.stamped.{uuid.uuid4().hex[:8]}"
    kafka.create_topics([TopicSpec(reply, 1)])
    forged = 4_102_444_800_000  # 2100-01-01T00:00:00Z
    sent: dict[str, Any] = {}
    async with producer(kafka.bootstrap_servers) as client:
        for lane in ("embed.requests", "embed.requests.bulk"):
            request = EmbedRequest(id=f"stamped-{lane}", inputs=("a text",), reply_to=reply)
            sent[request.id] = await client.send_and_wait(
                lane, encode_request(request), partition=0, timestamp_ms=forged
            )
    records = await collect(kafka.bootstrap_servers, reply, lambda found: len(found) >= 2)
    results = {r.id: r for r in (decode_result(record.value) for record in records)}
    assert set(results) == set(sent)
    for request_id, appended in sent.items():
        assert appended.timestamp_type == 1  # LogAppendTime: the broker's clock
        assert appended.timestamp < forged
        result = results[request_id]
        assert isinstance(result, EmbedResult), result
        assert result.requested_ms == appended.timestamp


def ready(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{url}/ready", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def wait_missing(process: WorkerProcess, topics: list[str], timeout: float) -> dict[str, Any]:
    """The /ready body once it names ``topics`` as missing."""
    deadline = time.monotonic() + timeout
    url = process.http_url
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status, body = ready(url)
        if body.get("missing_topics"):
            assert status == 503
            assert body["status"] == "missing topics"
            assert body["missing_topics"] == topics
            return body
        assert process.process.poll() is None, process.log_path.read_text()[-3000:]
        time.sleep(0.3)
    raise AssertionError(f"/ready never named the missing topics: {body}")


def wait_ready(process: WorkerProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    url = process.http_url
    while time.monotonic() < deadline:
        status, body = ready(url)
        if status == 200:
            return
        time.sleep(0.2)
    raise AssertionError(f"not ready {timeout} s after its topics were created: {body}")


def missing_events(process: WorkerProcess) -> list[dict[str, Any]]:
    return [e for e in process.events() if e.get("event") == "kafka.topics_missing"]


@pytest.fixture
def late_worker(
    kafka: LocalKafka, tmp_path: Path
) -> Iterator[tuple[WorkerProcess, dict[str, str]]]:
    settings = fleet(f"l{uuid.uuid4().hex[:8]}") | {"catalog_topic": ""}
    options: dict[str, Any] = settings
    worker = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path / "worker.log",
        dtype="float32",
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        **options,
    )
    try:
        yield worker, settings
    finally:
        worker.stop()


def test_a_worker_started_before_its_topics_waits_not_ready_then_serves_once_created(
    kafka: LocalKafka, late_worker: tuple[WorkerProcess, dict[str, str]]
) -> None:
    worker, settings = late_worker
    reads = [settings["requests_topic"], settings["bulk_topic"]]
    wait_missing(worker, reads, timeout=180)
    time.sleep(2.5)  # it keeps looking (every second) without saying it again
    (event,) = missing_events(worker)
    assert event["level"] == "error"
    assert event["topics"] == reads
    assert event["create"] == "kembed topics create"
    assert not any("not found in cluster metadata" in str(e) for e in worker.events())

    code, output = kembed_topics(kafka, "create", *flags(settings), "--partitions", "2")
    assert code == 0, output
    created = time.monotonic()
    wait_ready(worker, PICKED_UP_S)
    assert time.monotonic() - created < PICKED_UP_S
    found = worker.wait_for("kafka.topics_found", timeout=5)
    assert found["topics"] == reads
    assert len(missing_events(worker)) == 1

    async def embed() -> Any:
        async with EmbedClient(
            kafka.bootstrap_servers,
            requests_topic=settings["requests_topic"],
            reply_topic=settings["results_topic"],
            catalog_topic="",
        ) as client:
            return await client.embed(["a topic created after the worker"], timeout=PICKED_UP_S)

    assert asyncio.run(embed()).shape == (1, 384)


def sink_reading(kafka: LocalKafka, postgres: Any, log: Path, topic: str) -> SinkProcess:
    """A sink into its own table and group, reading ``topic``."""
    unique = uuid.uuid4().hex[:8]
    return SinkProcess(
        kafka.bootstrap_servers,
        log,
        target=postgres.dsn,
        target_password=postgres.password,
        table=f"late_{unique}",
        results_topic=topic,
        group_id=f"sink-{unique}",
    )


def test_a_sink_started_before_its_results_topic_waits_not_ready_then_joins_once_created(
    kafka: LocalKafka, postgres: Any, tmp_path: Path
) -> None:
    sink: SinkProcess | None = None
    never = f"s{uuid.uuid4().hex[:8]}.never"
    stopped = sink_reading(kafka, postgres, tmp_path / "stopped.log", never)
    try:
        # SIGTERM while waiting for topics: a clean stop
        wait_missing(stopped, [never], timeout=90)
        stopped.process.send_signal(signal.SIGTERM)
        assert stopped.wait_exit(30) == 0
        stopped.wait_for("sink.stopped", timeout=5)

        # (one sink at a time: two opening a fresh database at once race on its pgvector
        # extension)
        topic = f"s{uuid.uuid4().hex[:8]}.results"
        sink = sink_reading(kafka, postgres, tmp_path / "sink.log", topic)

        wait_missing(sink, [topic], timeout=90)
        (event,) = missing_events(sink)
        assert event["topics"] == [topic]
        assert event["create"] == f"kembed topics create --results {topic}"
        code, output = kembed_topics(kafka, "create", "--results", topic, "--partitions", "2")
        assert code == 0, output
        wait_ready(sink, PICKED_UP_S)
        assert len(missing_events(sink)) == 1
    finally:
        stopped.stop()
        if sink is not None:
            sink.stop()


def test_kafka_unreachable_or_refusing_is_exit_2_with_one_line(kafka: LocalKafka) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        port = free_port()
        code = main(
            ["topics", "check", "--bootstrap-servers", f"127.0.0.1:{port}", "--timeout", "2"]
        )
    assert code == 2
    assert out.getvalue().startswith(
        f"kembed topics check: no answer from Kafka at 127.0.0.1:{port}"
    )
    assert "KafkaConnectionError" in out.getvalue()
    # more replicas than brokers: refused at once, not retried until the timeout
    prefix = f"r{uuid.uuid4().hex[:8]}"
    code, output = kembed_topics(
        kafka, "create", *flags(fleet(prefix)), "--replication-factor", "3", "--timeout", "30"
    )
    assert code == 2
    assert "replication factor 3 is more than the cluster's 1 broker(s)" in output
    assert len(output.strip().splitlines()) == 1
