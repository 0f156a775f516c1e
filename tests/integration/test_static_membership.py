"""Static membership (KEMBED_GROUP_INSTANCE_ID): a restarted worker takes its partitions
back without a rebalance of the other members.

Two real worker processes share a group on four request partitions. One is stopped with
SIGTERM and started again with the same settings. With instance ids, the other member
keeps its member id, its assignment and its generation (it logs no revocation and no new
assignment), and the restarted worker gets the same partitions in the same generation;
the control run, without instance ids, shows the rebalance that static membership avoids.
Requests published across all partitions afterwards are all answered.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kembed_shared.fleet import FleetStatus
from kembed_shared.kafka.group_status import read_fleet_status
from schemas import EmbedRequest, EmbedResult, decode_result, encode_request
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess
from tests.integration.kafka_io import answered, collect, producer, results_for

pytestmark = pytest.mark.integration

PARTITIONS = 4
# Long enough for a worker to stop, load its model and join again on a busy machine: a
# static member is expelled (and the group rebalanced) only when its session expires.
SESSION_TIMEOUT_MS = 180_000


@dataclass(frozen=True)
class Restart:
    """What one restart of one of two workers did to the group."""

    generation_before: int
    generation_after: int  # the restarted worker's, when it got its partitions back
    stopped_partitions: tuple[str, ...]
    restarted_partitions: tuple[str, ...]
    other_member_before: tuple[str, tuple[tuple[str, int], ...]]
    other_member_after: tuple[str, tuple[tuple[str, int], ...]] | None
    other_events_after: list[str]  # the other worker's group events during the restart
    members_after: int


def _joined(worker: WorkerProcess) -> list[dict[str, Any]]:
    return [e for e in worker.events() if e.get("event") == "group.joined"]


def _group_events(events: list[dict[str, Any]]) -> list[str]:
    names = {"group.joined", "partitions.assigned", "partitions.revoked"}
    return [e["event"] for e in events if e.get("event") in names]


async def _fleet(kafka: LocalKafka, group: str, topic: str) -> FleetStatus:
    return await read_fleet_status(kafka.bootstrap_servers, group, [topic])


async def _settled(kafka: LocalKafka, group: str, topic: str, timeout: float) -> FleetStatus:
    """The group once Stable with two members holding two partitions each."""
    deadline = time.monotonic() + timeout
    while True:
        status = await _fleet(kafka, group, topic)
        sizes = sorted(len(m.partitions) for m in status.members)
        if status.state == "Stable" and sizes == [2, 2]:
            return status
        assert time.monotonic() < deadline, f"group never settled: {status}"
        await asyncio.sleep(0.5)


async def _restart_one_of_two(kafka: LocalKafka, tmp_path: Path, *, static: bool) -> Restart:
    tag = uuid.uuid4().hex[:6]
    requests_topic, replies = f"static.{tag}.requests", f"static.{tag}.replies"
    group = f"static-{tag}"
    kafka.create_topics([TopicSpec(requests_topic, PARTITIONS), TopicSpec(replies, 1)])

    def start(name: str, log: str) -> WorkerProcess:
        settings: dict[str, Any] = {
            "requests_topic": requests_topic,
            "bulk_topic": "",
            "group_id": group,
            "client_id": f"static-{name}",
            "session_timeout_ms": SESSION_TIMEOUT_MS,
            "heartbeat_interval_ms": 1000,
        }
        if static:
            settings["group_instance_id"] = f"{group}-{name}"
        return WorkerProcess(kafka.bootstrap_servers, tmp_path / log, **settings)

    first = start("first", "first.log")
    other = None
    restarted = None
    try:
        first.wait_ready(timeout=300)
        other = start("other", "other.log")
        other.wait_ready(timeout=300)
        before = await _settled(kafka, group, requests_topic, timeout=120)
        # Both have logged the generation that holds this assignment.
        generation = _joined(other)[-1]["generation"]
        deadline = time.monotonic() + 60
        while _joined(first)[-1]["generation"] != generation:
            assert time.monotonic() < deadline, "the workers never agreed on a generation"
            await asyncio.sleep(0.2)
        stopped_partitions = tuple(_joined(first)[-1]["partitions"])
        (other_before,) = [m for m in before.members if m.client_id == "static-other"]
        seen = len(other.events())

        assert first.stop() == 0
        restarted = start("first", "restarted.log")
        restarted.wait_ready(timeout=300)
        after = await _settled(kafka, group, requests_topic, timeout=120)
        other_after = [m for m in after.members if m.client_id == "static-other"]

        # Every partition is served: requests on all of them are answered.
        requests = [
            EmbedRequest(
                id=f"{tag}-{i:02d}",
                inputs=("a restart " * (1 + i % 7),) * (1 + i % 3),
                reply_to=replies,
            )
            for i in range(4 * PARTITIONS)
        ]
        async with producer(kafka.bootstrap_servers) as client:
            for i, request in enumerate(requests):
                await client.send_and_wait(
                    requests_topic, encode_request(request), partition=i % PARTITIONS
                )
        wanted = {r.id for r in requests}
        answers = await results_for(kafka.bootstrap_servers, replies, wanted, timeout=120)
        assert wanted <= {a.id for a in answers if isinstance(a, EmbedResult)}

        return Restart(
            generation_before=generation,
            generation_after=_joined(restarted)[-1]["generation"],
            stopped_partitions=stopped_partitions,
            restarted_partitions=tuple(_joined(restarted)[-1]["partitions"]),
            other_member_before=(other_before.member_id, other_before.partitions),
            other_member_after=(
                (other_after[0].member_id, other_after[0].partitions) if other_after else None
            ),
            other_events_after=_group_events(other.events()[seen:]),
            members_after=len(after.members),
        )
    finally:
        for worker in (first, other, restarted):
            if worker is not None:
                worker.stop()


async def test_a_worker_restarted_with_its_instance_id_causes_no_rebalance(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """With group instance ids, a worker stopped (SIGTERM) and started again within the
    session timeout gets its own partitions back in the same generation, and the other
    member is untouched: same member id, same assignment, no revocation, no new
    assignment."""
    restart = await _restart_one_of_two(kafka, tmp_path, static=True)
    assert restart.generation_after == restart.generation_before
    assert restart.restarted_partitions == restart.stopped_partitions
    assert restart.other_member_after == restart.other_member_before
    assert restart.other_events_after == []
    assert restart.members_after == 2


async def test_without_instance_ids_a_restart_rebalances_the_group(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """The control: dynamic members. The stopped worker leaves the group and the restarted
    one joins as a new member, so the other member's partitions are revoked and assigned
    twice, in new generations."""
    restart = await _restart_one_of_two(kafka, tmp_path, static=False)
    assert restart.generation_after > restart.generation_before
    assert "partitions.revoked" in restart.other_events_after
    assert restart.other_events_after.count("group.joined") >= 2
    assert restart.members_after == 2


async def test_a_restarted_exactly_once_worker_fences_its_predecessor_by_default(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """Exactly once with a group instance id and no KEMBED_TRANSACTIONAL_ID: the default
    transactional id is derived from the group and the instance id, so a worker started
    with the same instance id while its predecessor still runs (a zombie: frozen, or cut
    off) fences it when its producer starts. The predecessor's next transaction fails, it
    exits non-zero, and the successor, taking the instance's membership over, answers
    the rest; a read_committed reader sees every request exactly once."""
    tag = uuid.uuid4().hex[:6]
    requests_topic, results_topic = f"zombie.{tag}.requests", f"zombie.{tag}.results"
    group = f"zombie-{tag}"
    kafka.create_topics([TopicSpec(requests_topic, 2), TopicSpec(results_topic, 1)])
    settings: dict[str, Any] = {
        "delivery": "exactly_once",
        "group_instance_id": "kembed-worker-0",
        "transaction_timeout_ms": 3000,
        "session_timeout_ms": SESSION_TIMEOUT_MS,
        "heartbeat_interval_ms": 1000,
        "requests_topic": requests_topic,
        "bulk_topic": "",
        "results_topic": results_topic,
        "group_id": group,
    }
    sent: list[str] = []

    async def publish(count: int) -> None:
        async with producer(kafka.bootstrap_servers) as client:
            for _ in range(count):
                request = EmbedRequest(
                    id=f"{tag}-{len(sent):03d}",
                    inputs=("a zombie " * (1 + len(sent) % 5),) * (1 + len(sent) % 3),
                )
                await client.send_and_wait(
                    requests_topic, encode_request(request), partition=len(sent) % 2
                )
                sent.append(request.id)

    async def committed_ids(wanted: set[str], timeout: float) -> list[str]:
        records = await collect(
            kafka.bootstrap_servers,
            results_topic,
            answered(wanted),
            timeout=timeout,
            isolation_level="read_committed",
        )
        return [decode_result(r.value).id for r in records]

    first = WorkerProcess(kafka.bootstrap_servers, tmp_path / "first.log", **settings)
    second = None
    try:
        first.wait_ready(timeout=300)
        await publish(10)
        assert set(sent) <= set(await committed_ids(set(sent), 120))

        second = WorkerProcess(kafka.bootstrap_servers, tmp_path / "second.log", **settings)
        # Its producer is initialized before the model loads: the predecessor is fenced.
        second.wait_for("model.loaded", timeout=300)
        ids = {
            w.wait_for("transactions.enabled", timeout=5)["transactional_id"]
            for w in (first, second)
        }
        assert ids == {f"kembed-{group}-kembed-worker-0"}
        # Whichever of the two holds the partitions when a request comes, the predecessor
        # gets some sooner or later, and its transaction fails.
        deadline = time.monotonic() + 180
        while first.process.poll() is None and time.monotonic() < deadline:
            await publish(2)
            await asyncio.sleep(0.5)
        exit_code = first.process.poll()
        assert exit_code is not None, "the predecessor was never fenced"
        assert exit_code != 0
        failed = [e for e in first.events() if e.get("event") == "transaction.failed"]
        assert failed, "the predecessor's transaction failed"
        assert failed[-1]["error"] == "ProducerFenced"

        await publish(4)
        seen = await committed_ids(set(sent), 240)
        assert second.process.poll() is None, "the successor still serves"
    finally:
        first.stop()
        if second is not None:
            assert second.stop() == 0
    assert set(sent) <= set(seen)
    duplicates = {i: n for i, n in Counter(seen).items() if n > 1}
    assert duplicates == {}, f"answered more than once: {duplicates}"
