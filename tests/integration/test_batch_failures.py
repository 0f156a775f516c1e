"""A failing batch costs only the request whose input fails alone, in the real worker.

Each test runs a real worker process (real broker, real model, fp32) in a consumer group
and on topics of its own, sends requests of mixed lengths to three partitions so that they
share one batch, and checks the caller's view: each request answered exactly once, every
request but the failing one with vectors equal to the in-process sentence-transformers
model's, and the group's offsets committed to the end.

- Out of memory is genuine: once the worker has warmed up, the test lowers the worker
  process's address-space limit (``RLIMIT_AS``, through ``prlimit``) to what it uses plus a
  margin, so that torch's CPU allocator really fails on the big batch, and smaller ones fit.
- A batch failing on one input needs an input the model fails on, and the real model has
  none (every text tokenizes to ids it can embed). That worker alone runs with
  ``tests/integration/fault_injection`` on its PYTHONPATH, whose ``sitecustomize`` makes the
  encoder's forward pass raise on batches holding one marker token; everything else is
  real.
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from schemas import (
    EmbedRequest,
    EmbedResult,
    ErrorCode,
    ErrorResult,
    Result,
    decode_result,
)
from schemas.codec import encode_request
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import ROOT, WorkerProcess, load_stsb
from tests.integration.fault_injection.marker import MARKER_TOKEN_ID, MARKER_WORD
from tests.integration.kafka_io import collect, producer, read_all

pytestmark = pytest.mark.integration

SENTENCES = sorted({p.first for p in load_stsb("en")})
PARTITIONS = 3
FAULT_INJECTION = ROOT / "tests" / "integration" / "fault_injection"


@dataclass
class Group:
    """Topics and a consumer group of its own, and the one worker started in it."""

    kafka: LocalKafka
    logs: Path
    requests: str = field(default_factory=lambda: f"batch-failures.{uuid.uuid4().hex[:6]}")
    worker: WorkerProcess | None = None
    sent: dict[str, EmbedRequest] = field(default_factory=dict)

    @property
    def replies(self) -> str:
        return f"{self.requests}.replies"

    @property
    def group_id(self) -> str:
        return f"group-{self.requests}"

    def start_worker(self, **settings: Any) -> WorkerProcess:
        self.kafka.create_topics(
            [
                TopicSpec(self.requests, PARTITIONS),
                TopicSpec(f"{self.requests}.bulk", 1),
                TopicSpec(self.replies, 1),
            ]
        )
        defaults: dict[str, Any] = {
            "dtype": "float32",
            "requests_topic": self.requests,
            "bulk_topic": f"{self.requests}.bulk",
            "results_topic": self.replies,
            "group_id": self.group_id,
            "session_timeout_ms": 10000,
            "heartbeat_interval_ms": 1000,
            # Inputs wait up to 3 s for company while the encoder is idle: requests sent
            # together share one batch.
            "max_batch_wait_ms": 3000,
        }
        self.worker = WorkerProcess(
            self.kafka.bootstrap_servers, self.logs / "worker.log", **(defaults | settings)
        )
        self.worker.wait_ready(timeout=300)
        return self.worker

    async def send(self, requests: list[EmbedRequest]) -> None:
        """Send ``requests`` over the partitions in turn, all at once."""
        async with producer(self.kafka.bootstrap_servers, linger_ms=50) as client:
            sent = []
            for n, request in enumerate(requests):
                self.sent[request.id] = request
                value = encode_request(request)
                sent.append(await client.send(self.requests, value, partition=n % PARTITIONS))
            await asyncio.gather(*sent)

    async def answers(self, ids: set[str]) -> dict[str, Result]:
        def answered(records: list[Any]) -> bool:
            return ids <= {decode_result(record.value).id for record in records}

        records = await collect(self.kafka.bootstrap_servers, self.replies, answered, timeout=300)
        results = {r.id: r for r in (decode_result(record.value) for record in records)}
        assert ids <= set(results), ids - set(results)
        return {request_id: results[request_id] for request_id in ids}

    async def check_answered_once_and_committed(self) -> None:
        """The group's offsets reach the end of every request partition, and the reply
        topic holds one answer per request sent, no more."""
        partitions = [TopicPartition(self.requests, p) for p in range(PARTITIONS)]
        ends = await _end_offsets(self.kafka.bootstrap_servers, partitions)
        deadline = time.monotonic() + 60
        committed: dict[TopicPartition, int] = {}
        while time.monotonic() < deadline:
            committed = await _committed(self.kafka.bootstrap_servers, self.group_id, partitions)
            if committed == ends:
                break
            await asyncio.sleep(0.5)
        assert committed == ends
        replies = await read_all(self.kafka.bootstrap_servers, self.replies)
        counts = Counter(decode_result(record.value).id for record in replies)
        assert counts == Counter(set(self.sent)), {i: n for i, n in counts.items() if n != 1}


@pytest.fixture
def group(kafka: LocalKafka, tmp_path: Path) -> Iterator[Group]:
    created = Group(kafka, tmp_path)
    try:
        yield created
    finally:
        if created.worker is not None:
            created.worker.stop()


async def _end_offsets(bootstrap: str, partitions: list[TopicPartition]) -> dict[Any, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        ends = await consumer.end_offsets(partitions)
        return {tp: int(offset) for tp, offset in ends.items()}
    finally:
        await consumer.stop()


async def _committed(
    bootstrap: str, group_id: str, partitions: list[TopicPartition]
) -> dict[TopicPartition, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group_id, partitions=partitions)
    finally:
        await admin.close()
    return {tp: int(meta.offset) for tp, meta in offsets.items() if meta.offset >= 0}


def _check_vectors(result: EmbedResult, texts: tuple[str, ...], reference_model: Any) -> None:
    vectors = np.frombuffer(result.vectors, dtype=np.float32).reshape(-1, result.dim)
    reference = reference_model.encode(list(texts), convert_to_numpy=True)
    cosines = np.sum(vectors * reference, axis=1) / (
        np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference, axis=1)
    )
    assert cosines.min() > 0.9999, (result.id, cosines)


async def _all_embedded(group: Group, results: dict[str, Result], reference_model: Any) -> None:
    """Each of ``results`` holds its inputs' vectors; every request sent was answered once
    and its offset committed."""
    for request_id, result in results.items():
        assert isinstance(result, EmbedResult), result
        _check_vectors(result, group.sent[request_id].inputs, reference_model)
    await group.check_answered_once_and_committed()


def _mixed_requests(tag: str, count: int, long_texts: list[str]) -> list[EmbedRequest]:
    """``count`` requests of one to three inputs: STS-B sentences and, in every third
    request, a long passage (truncated to the model's 256 tokens)."""
    requests = []
    for n in range(count):
        inputs = [SENTENCES[(7 * n + i) % len(SENTENCES)] for i in range(1 + n % 3)]
        if n % 3 == 2:
            inputs[0] = long_texts[n % len(long_texts)]
        requests.append(EmbedRequest(id=f"{tag}-{n}", inputs=tuple(inputs)))
    return requests


def _passages(words: int) -> list[str]:
    out, current = [], []
    for sentence in SENTENCES:
        current.append(sentence)
        if sum(len(s.split()) for s in current) >= words:
            out.append(" ".join(current))
            current = []
    return out


def _cap_address_space(pid: int, margin: int) -> int:
    """Limit process ``pid``'s address space to what it has mapped now plus ``margin``
    bytes; returns the hard limit, to lift the cap with."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmSize:\s+(\d+) kB", status)
    assert match is not None
    used = int(match.group(1)) * 1024
    _, hard = resource.prlimit(pid, resource.RLIMIT_AS)
    resource.prlimit(pid, resource.RLIMIT_AS, (used + margin, hard))
    return hard


def _metric(worker: WorkerProcess, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"{worker.http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_a_batch_failing_on_one_input_answers_every_other_request(
    group: Group, reference_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """24 requests of mixed lengths on three partitions share one batch with a request
    whose second input the (fault-injected) encoder fails on. The worker halves the batch
    until that input runs alone: only its request gets ``internal`` (index 1); every other
    request gets vectors equal to the in-process model's; each is answered exactly once and
    every offset is committed."""
    tokens = reference_model.tokenizer(MARKER_WORD, add_special_tokens=False)["input_ids"]
    assert tokens == [MARKER_TOKEN_ID]
    assert not any(MARKER_WORD in s.lower() for s in SENTENCES)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAULT_INJECTION), str(ROOT)]))
    worker = group.start_worker(max_batch_tokens=16384)

    tag = uuid.uuid4().hex[:6]
    requests = _mixed_requests(tag, 24, _passages(60))
    marked = EmbedRequest(
        id=f"{tag}-marked",
        inputs=(SENTENCES[1], f"The {MARKER_WORD} flew over the town.", SENTENCES[2]),
    )
    requests.insert(10, marked)
    await group.send(requests)
    results = await group.answers({request.id for request in requests})

    failure = results.pop(marked.id)
    assert isinstance(failure, ErrorResult), failure
    assert failure.error.code == ErrorCode.INTERNAL
    assert failure.error.index == 1
    await _all_embedded(group, results, reference_model)

    events = worker.events()
    failed = [e for e in events if e.get("event") == "batch.failed"]
    inputs = sum(len(request.inputs) for request in requests)
    assert failed[0]["inputs"] == inputs, "the requests did not share one batch"
    assert {e["reason"] for e in failed} == {"error"}
    assert [e for e in events if e.get("event") == "batch.split"]
    (alone,) = [e for e in events if e.get("event") == "request.failed"]
    assert (alone["request_id"], alone["index"]) == (marked.id, 1)
    assert MARKER_WORD not in worker.log_path.read_text(), "the log holds request text"
    assert _metric(worker, "kembed_batch_splits_total", reason="error") >= 1
    assert worker.process.poll() is None


async def test_a_batch_out_of_memory_is_split_and_the_lane_budget_lowered(
    group: Group, reference_model: Any
) -> None:
    """A genuine out-of-memory error: the worker's address space is capped at what it uses
    plus 160 MiB once it has warmed up, and 45 requests of mixed lengths (a third of them
    256-token passages) on three partitions then form one batch that needs more. The batch
    is split until the parts fit; every request gets vectors equal to the in-process
    model's, exactly once; the lane's token budget is lowered (metric and log event) and
    the worker keeps serving."""
    # On the CPU, where the address space bounds what torch's allocator gets (device
    # memory would not be).
    worker = group.start_worker(device="cpu", max_batch_tokens=65536, max_batch_size=512)
    long_texts = _passages(300)
    # Warm-up under no limit: the tokenizer's thread and the encoder's threads start here.
    await group.send([EmbedRequest(id="warm-up", inputs=tuple(long_texts[:8]))])
    await group.answers({"warm-up"})

    pid = worker.process.pid
    hard = _cap_address_space(pid, 160 << 20)

    tag = uuid.uuid4().hex[:6]
    requests = _mixed_requests(tag, 45, long_texts)
    await group.send(requests)
    results = await group.answers({request.id for request in requests})
    resource.prlimit(pid, resource.RLIMIT_AS, (hard, hard))

    await _all_embedded(group, results, reference_model)

    events = worker.events()
    failed = [e for e in events if e.get("event") == "batch.failed"]
    assert failed, "nothing ran out of memory"
    assert failed[0]["inputs"] == sum(len(r.inputs) for r in requests)
    assert {e["reason"] for e in failed} == {"out_of_memory"}
    assert {e["error"] for e in failed} == {"EncoderOutOfMemoryError"}
    lowered = [e for e in events if e.get("event") == "batch.budget_lowered"]
    assert lowered
    assert lowered[0]["tokens"] <= failed[0]["padded_tokens"] // 2
    assert not [e for e in events if e.get("event") == "request.failed"]
    budget = _metric(worker, "kembed_effective_batch_tokens", lane="interactive")
    assert 0 < budget == lowered[-1]["tokens"] < 65536
    assert _metric(worker, "kembed_batch_splits_total", reason="out_of_memory") >= 1
    assert worker.process.poll() is None
