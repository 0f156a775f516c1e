"""Faults under load: killed workers, rebalances, a restarted broker, SIGTERM, long batches.

Each test runs real worker processes in their own consumer group on their own topics, and
drives them through the SDK. What is checked is the caller's view: every ``embed()`` call
returns exactly once, with the right vectors or a timeout, and no request is lost.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from producer_sdk import EmbedClient, EmbedTimeoutError
from schemas import decode_result
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess, load_stsb
from tests.integration.kafka_io import read_all

pytestmark = pytest.mark.integration

SENTENCES = sorted({p.first for p in load_stsb("en")})


@dataclass
class Group:
    """Topics and a consumer group of its own, and workers started in it."""

    kafka: LocalKafka
    logs: Path
    requests: str = field(default_factory=lambda: f"faults.{uuid.uuid4().hex[:6]}")
    workers: list[WorkerProcess] = field(default_factory=list)

    @property
    def results(self) -> str:
        return f"{self.requests}.results"

    def create_topics(self) -> None:
        self.kafka.create_topics(
            [
                TopicSpec(self.requests, 4),
                TopicSpec(f"{self.requests}.bulk", 1),
                TopicSpec(self.results, 2),
            ]
        )

    def start_worker(self, **settings: Any) -> WorkerProcess:
        defaults: dict[str, Any] = {
            # fp32: the fastest precision on CPUs without bf16 (AVX2 only), and fast enough
            # on those with it; the faults here do not depend on the precision served.
            "dtype": "float32",
            "requests_topic": self.requests,
            "bulk_topic": f"{self.requests}.bulk",
            "results_topic": self.results,
            "group_id": f"group-{self.requests}",
            "session_timeout_ms": 6000,
            "heartbeat_interval_ms": 1000,
        }
        worker = WorkerProcess(
            self.kafka.bootstrap_servers,
            self.logs / f"worker-{len(self.workers)}.log",
            **(defaults | settings),
        )
        self.workers.append(worker)
        return worker

    def client(self, **options: Any) -> EmbedClient:
        return EmbedClient(
            self.kafka.bootstrap_servers,
            requests_topic=self.requests,
            reply_topic=self.results,
            **options,
        )


@pytest.fixture
def group(kafka: LocalKafka, tmp_path: Path) -> Iterator[Group]:
    created = Group(kafka, tmp_path)
    created.create_topics()
    try:
        yield created
    finally:
        for worker in created.workers:
            worker.stop()


@dataclass
class Call:
    texts: list[str]
    started: float = 0.0
    seconds: float = 0.0
    vectors: np.ndarray | None = None
    error: BaseException | None = None


async def drive(client: EmbedClient, calls: list[Call], rate: float, timeout: float) -> None:
    """Start ``calls`` at ``rate`` per second, all running concurrently; each records its
    outcome (vectors or exception) and how long it took."""

    async def one(call: Call) -> None:
        call.started = time.monotonic()
        try:
            call.vectors = await client.embed(call.texts, timeout=timeout)
        except Exception as exc:
            call.error = exc
        call.seconds = time.monotonic() - call.started

    tasks = []
    for call in calls:
        tasks.append(asyncio.create_task(one(call)))
        await asyncio.sleep(1 / rate)
    await asyncio.gather(*tasks)


def make_calls(count: int, size: int) -> list[Call]:
    return [
        Call([SENTENCES[(i * size + j) % len(SENTENCES)] for j in range(size)])
        for i in range(count)
    ]


def assert_correct(calls: list[Call], reference_model: Any) -> None:
    """Every call returned vectors, and they are the reference model's (cosine >= 0.99 to
    sentence-transformers)."""
    failed = [(i, repr(c.error)) for i, c in enumerate(calls) if c.vectors is None]
    assert not failed, failed[:5]
    texts = sorted({t for c in calls for t in c.texts})
    reference = dict(
        zip(texts, reference_model.encode(texts, normalize_embeddings=True), strict=True)
    )
    for call in calls:
        assert call.vectors is not None
        assert call.vectors.shape == (len(call.texts), 384)
        expected = np.stack([reference[t] for t in call.texts])
        cosine = np.sum(call.vectors * expected, axis=1)
        assert cosine.min() >= 0.99, cosine.min()


async def test_sigkill_of_one_of_two_workers_loses_no_request(
    group: Group, reference_model: Any
) -> None:
    """Two workers share the load; one is SIGKILLed mid-stream. Its unacknowledged requests
    are redelivered to the survivor after the session timeout; every call returns once, with
    the right vectors (duplicate results are dropped by the client)."""
    first, second = group.start_worker(), group.start_worker()
    first.wait_ready()
    second.wait_ready()
    calls = make_calls(240, 4)
    async with group.client() as client:
        load = asyncio.create_task(drive(client, calls, rate=40, timeout=90))
        await asyncio.sleep(2)
        first.process.kill()
        await load
    assert first.process.wait() == -9
    assert_correct(calls, reference_model)
    assert second.process.poll() is None


async def test_workers_joining_and_leaving_under_load_lose_nothing(
    group: Group, reference_model: Any
) -> None:
    """A worker joins while requests flow, then the first one leaves (SIGTERM). Both
    rebalances hand partitions over without losing a request: the first worker answers
    what it holds and leaves the group (revoked, drained complete), so its partitions go
    to the second at once rather than after its session timed out, and the second ends up
    with every partition. (How long the calls took depends on the CPU and is not checked:
    on a 2-core machine without AVX-512 the joining worker's start-up alone makes calls of
    10 s and more.)"""
    first = group.start_worker(session_timeout_ms=10_000)
    first.wait_ready()
    calls = make_calls(300, 2)
    async with group.client() as client:
        load = asyncio.create_task(drive(client, calls, rate=25, timeout=60))
        await asyncio.sleep(1)
        second = group.start_worker(session_timeout_ms=10_000)
        await asyncio.to_thread(second.wait_ready)
        await asyncio.sleep(1)
        assert await asyncio.to_thread(first.stop) == 0
        await load
    assert_correct(calls, reference_model)
    assert second.process.poll() is None
    first_events = first.events()
    assert any(e.get("event") == "partitions.revoked" for e in first_events)
    drained = [e for e in first_events if e.get("event") == "worker.drained"]
    assert drained, "the first worker never drained"
    assert drained[-1]["complete"] is True, drained[-1]
    owned = [e["partitions"] for e in first_events if e.get("event") == "partitions.assigned"]
    taken = [e["partitions"] for e in second.events() if e.get("event") == "partitions.assigned"]
    assert owned, "the first worker was never assigned partitions"
    assert taken, "the second worker was never assigned partitions"
    assert set(taken[-1]) == set(owned[0]), (owned[0], taken[-1])


async def test_sigterm_drains_commits_and_leaves_the_group(group: Group) -> None:
    """SIGTERM: the worker stops fetching, finishes and publishes what it took, commits,
    leaves the group and exits 0 within shutdown_timeout_s. A worker started afterwards
    answers only what was left, so every request is answered exactly once."""
    worker = group.start_worker(shutdown_timeout_s=20, max_inflight_inputs=600)
    worker.wait_ready()
    calls = make_calls(150, 16)
    async with group.client() as client:
        load = asyncio.create_task(drive(client, calls, rate=500, timeout=120))
        await asyncio.sleep(1.0)
        stopped_at = time.monotonic()
        code = await asyncio.to_thread(worker.stop)
        stop_seconds = time.monotonic() - stopped_at
        assert code == 0
        assert stop_seconds < 20 + 5
        drained = [e for e in worker.events() if e.get("event") == "worker.drained"]
        assert [e["complete"] for e in drained] == [True]
        assert await _members(group) == [], "the worker left the group"
        successor = group.start_worker()
        await asyncio.to_thread(successor.wait_ready)
        await load
    failed = [repr(c.error) for c in calls if c.vectors is None]
    assert not failed, failed[:3]
    counts = Counter(await _result_ids(group))
    assert len(counts) == len(calls)
    duplicates = [i for i, n in counts.items() if n > 1]
    assert not duplicates, f"answered twice (offsets not committed on SIGTERM): {duplicates}"


async def _members(group: Group) -> list[Any]:
    admin = AIOKafkaAdminClient(bootstrap_servers=group.kafka.bootstrap_servers)
    await admin.start()
    try:
        (response,) = await admin.describe_consumer_groups([f"group-{group.requests}"])
    finally:
        await admin.close()
    # (error_code, group_id, state, protocol_type, protocol, members, ...)
    members: list[Any] = response.groups[0][5]
    return members


async def _result_ids(group: Group) -> list[str]:
    """Ids of every result on the group's result topic."""
    records = await read_all(group.kafka.bootstrap_servers, group.results)
    return [decode_result(r.value).id for r in records]


async def test_broker_restart_during_load_loses_nothing(
    tmp_path: Path, reference_model: Any
) -> None:
    """The broker restarts while requests flow. Worker and client reconnect by themselves;
    each call returns vectors or raises EmbedTimeoutError within its timeout (none hangs),
    every request still gets an answer on the result topic, and calls after the restart
    succeed."""
    with LocalKafka(tmp_path / "kafka") as kafka:
        group = Group(kafka, tmp_path)
        group.create_topics()
        worker = group.start_worker()
        try:
            worker.wait_ready()
            calls = make_calls(200, 2)
            async with group.client() as client:
                load = asyncio.create_task(drive(client, calls, rate=20, timeout=20))
                await asyncio.sleep(2)
                await asyncio.to_thread(kafka.restart)
                await load
                after = await client.embed(["after the restart"], timeout=60)
            assert after.shape == (1, 384)
            for call in calls:
                assert call.vectors is not None or isinstance(call.error, EmbedTimeoutError), repr(
                    call.error
                )
                assert call.seconds < 20 + 5, "a call outlived its timeout"
            assert_correct([c for c in calls if c.vectors is not None], reference_model)
            timed_out = {
                c.error.request_id for c in calls if isinstance(c.error, EmbedTimeoutError)
            }
            # Timed-out calls were not lost: their answers (vectors, or deadline_exceeded
            # when they expired before computation) reach the result topic later.
            answered: set[str] = set()
            for _ in range(30):  # late answers may still be on their way
                answered = set(await _result_ids(group))
                if timed_out <= answered:
                    break
                await asyncio.sleep(1)
            assert timed_out <= answered, sorted(timed_out - answered)[:5]
            assert worker.process.poll() is None, "the worker survived the restart"
        finally:
            worker.stop()


async def test_a_batch_longer_than_the_poll_interval_keeps_the_worker_in_its_group(
    group: Group,
) -> None:
    """Inference runs on its own thread while the event loop keeps polling, so a batch that
    takes longer than max.poll.interval.ms (and the session timeout) does not get the worker
    evicted: no revocation, and the request is answered by the same worker."""
    worker = group.start_worker(
        dtype="float32",
        max_poll_interval_ms=2000,
        max_batch_tokens=256 * 256,
        max_batch_size=256,
    )
    worker.wait_ready()
    long_texts = [" ".join(SENTENCES[i : i + 12]) for i in range(256)]
    async with group.client() as client:
        started = time.monotonic()
        vectors = await client.embed(long_texts, timeout=120)
        took = time.monotonic() - started
        assert vectors.shape == (256, 384)
        again = await client.embed(["still in the group"], timeout=30)
        assert again.shape == (1, 384)
    assert took > 2.0, "the test needs a batch that outlasts max.poll.interval.ms"
    revoked = [e for e in worker.events() if e.get("event") == "partitions.revoked"]
    assert not revoked, revoked
