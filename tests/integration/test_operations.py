"""The operations surface of a real worker: /ready, /health, /metrics, /info and its logs."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from producer_sdk import EmbedClient, EmbedError
from schemas import EmbedRequest, encode_request
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess
from tests.integration.kafka_io import producer
from tests.support.metrics import samples, total
from worker.metrics import METRIC_NAMES

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:6]
REQUESTS, BULK, RESULTS = f"ops.{TAG}", f"ops.{TAG}.bulk", f"ops.{TAG}.results"
DLQ = f"ops.{TAG}.dlq"


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), bytes(error.read())


@pytest.fixture(scope="module")
def ops_worker(
    kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, list[tuple[int, dict[str, Any]]]]]:
    """A worker with its own topics, and the /ready answers seen while it started."""
    kafka.create_topics(
        [TopicSpec(REQUESTS, 2), TopicSpec(BULK, 2), TopicSpec(RESULTS, 1), TopicSpec(DLQ, 1)]
    )
    worker = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path_factory.mktemp("ops") / "worker.log",
        dtype="float32",
        requests_topic=REQUESTS,
        bulk_topic=BULK,
        results_topic=RESULTS,
        dlq_topic=DLQ,
        group_id=f"ops-{TAG}",
        max_batch_tokens=3072,
    )
    try:
        base = worker.http_url
        seen: list[tuple[int, dict[str, Any]]] = []
        give_up = time.monotonic() + 180
        while time.monotonic() < give_up:
            status, body = get(f"{base}/ready")
            seen.append((status, json.loads(body)))
            if status == 200:
                break
            time.sleep(0.05)
        yield worker, seen
    finally:
        worker.stop()


def test_ready_only_after_warm_up_and_partition_assignment(
    ops_worker: tuple[WorkerProcess, list[tuple[int, dict[str, Any]]]],
) -> None:
    """/ready answers 503 while the model loads and warms up, 200 once partitions are
    assigned; /health is 200 all along."""
    worker, seen = ops_worker
    assert seen[0][0] == 503
    assert seen[0][1]["status"] in {"connecting", "loading", "warming", "joining"}
    assert seen[-1][0] == 200, seen[-3:]
    assert seen[-1][1]["partitions"], seen[-1]
    events = [e["event"] for e in worker.events()]
    assert "model.loaded" in events
    assert "partitions.assigned" in events
    status, body = get(f"{worker.http_url}/health")
    assert status == 200
    assert json.loads(body)["status"] == "ok"


def test_info_matches_the_settings(
    ops_worker: tuple[WorkerProcess, list[tuple[int, dict[str, Any]]]],
) -> None:
    worker, _ = ops_worker
    status, body = get(f"{worker.http_url}/info")
    assert status == 200
    info = json.loads(body)
    assert info["model"].pop("memory_bytes") > 20 * 2**20
    assert info["model"] == {
        "name": "sentence-transformers/all-MiniLM-L6-v2",
        "dim": 384,
        "dtype": "float32",
        "device": "cpu",
        "compiled": False,
        "quantization": "none",
        "max_seq_length": 256,
        "pooling": "mean",
        "aliases": ["all-MiniLM-L6-v2"],
        "truncation_direction": "right",
        "prompts": {},
        "default_prompt_name": None,
        "requests_topic": REQUESTS,
        "bulk_topic": BULK,
        "kind": "embed",
        "tuning": None,  # explicit dtype and torch_compile: nothing to measure
    }
    assert info["models"] == [info["model"] | {"memory_bytes": info["models"][0]["memory_bytes"]}]
    assert info["batching"]["max_batch_tokens"] == 3072
    assert info["topics"] == {"requests": REQUESTS, "bulk": BULK, "results": RESULTS, "dlq": DLQ}
    assert info["group_id"] == f"ops-{TAG}"
    assert info["version"]
    assert "password" not in body.decode().lower()


async def test_metrics_count_a_known_workload_and_lag_drains_to_zero(
    kafka: LocalKafka, ops_worker: tuple[WorkerProcess, list[tuple[int, dict[str, Any]]]]
) -> None:
    """After N sequential single-text requests (one batch each), one unknown_model request
    and one message without an id: the counters equal what was sent, every metric family is
    exposed, and after a burst of bulk requests drains, lag, backlog and in-flight are 0."""
    worker, _ = ops_worker
    base = worker.http_url
    count = 12
    async with EmbedClient(
        kafka.bootstrap_servers, requests_topic=REQUESTS, reply_topic=RESULTS
    ) as client:
        for i in range(count):
            await client.embed([f"operations text number {i}"], timeout=60)
        with pytest.raises(EmbedError):
            await client.embed(["x"], model="not/served", timeout=60)
    async with producer(kafka.bootstrap_servers) as raw:
        await raw.send_and_wait(REQUESTS, msgpack.packb({"v": 1, "inputs": ["no id"]}))

    scrape: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    give_up = time.monotonic() + 30
    while time.monotonic() < give_up:  # the dead letter is acknowledged asynchronously
        scrape = await asyncio.to_thread(samples, base)
        if total(scrape, "kembed_dlq_messages_total") >= 1:
            break
        await asyncio.sleep(0.2)
    model = "sentence-transformers/all-MiniLM-L6-v2"
    assert total(scrape, "kembed_requests_total", model=model, outcome="ok") == count
    assert total(scrape, "kembed_requests_total", outcome="unknown_model") == 1
    assert total(scrape, "kembed_inputs_total", outcome="ok") == count
    assert total(scrape, "kembed_tokens_total", outcome="ok") >= 5 * count
    assert total(scrape, "kembed_batch_size_count") == count
    assert total(scrape, "kembed_batch_size_sum") == count
    assert total(scrape, "kembed_inference_seconds_count") == count
    assert total(scrape, "kembed_queue_seconds_count") == count
    assert total(scrape, "kembed_request_latency_seconds_count") == count + 1
    assert total(scrape, "kembed_dlq_messages_total", code="invalid_request") == 1
    assert total(scrape, "kembed_batch_padding_ratio_count") == count
    assert total(scrape, "kembed_batch_padding_ratio_sum") == 0, "one text: no padding"
    assert total(scrape, "kembed_model_load_seconds") > 0
    assert total(scrape, "kembed_warmup_seconds") > 0
    assert total(scrape, "kembed_ready") == 1

    burst = [
        EmbedRequest(id=f"burst-{i}", inputs=tuple(f"burst {i} text {j}" for j in range(16)))
        for i in range(150)
    ]
    async with producer(kafka.bootstrap_servers) as raw:
        for request in burst:
            await raw.send(BULK, encode_request(request))
        await raw.flush()
    give_up = time.monotonic() + 120
    lags: list[float] = []
    while time.monotonic() < give_up:
        scrape = await asyncio.to_thread(samples, base)
        lags = [v for (n, _), v in scrape.items() if n == "kembed_consumer_lag"]
        answered = total(scrape, "kembed_requests_total", outcome="ok")
        drained = total(scrape, "kembed_backlog_tokens") == 0
        if answered >= count + len(burst) and lags and not any(lags) and drained:
            break
        await asyncio.sleep(0.5)
    assert total(scrape, "kembed_requests_total", outcome="ok") == count + len(burst)
    assert len(lags) == 4, "one lag gauge per assigned partition"
    assert not any(lags), lags
    assert total(scrape, "kembed_backlog_tokens") == 0
    assert total(scrape, "kembed_inflight_inputs") == 0
    assert total(scrape, "kembed_inflight_tokens") == 0
    assert total(scrape, "kembed_batch_size_count", lane="bulk") >= 1
    exposed = {name for name, _ in scrape}
    # Candidates' speeds exist only where dtype/compile auto timed several; this worker's
    # settings are explicit.
    for name in set(METRIC_NAMES) - {"kembed_tuning_texts_per_second"}:
        assert {name, f"{name}_count"} & exposed, f"{name} is not exposed"


def test_worker_log_is_json_lines(
    ops_worker: tuple[WorkerProcess, list[tuple[int, dict[str, Any]]]],
) -> None:
    """Every line the worker wrote is one JSON object with an event, a level and a time."""
    worker, _ = ops_worker
    lines = Path(worker.log_path).read_text().splitlines()
    assert len(lines) > 5
    for line in lines:
        event = json.loads(line)
        assert isinstance(event, dict)
        assert {"event", "level", "timestamp"} <= event.keys(), event
