"""Exactly-once delivery (KEMBED_DELIVERY=exactly_once) survives a worker SIGKILL.

Two exactly-once workers share one consumer group on their own topics; a few hundred
requests are published and one worker is SIGKILLed in the middle of a transaction. A
read_committed reader of the result topic then sees every request id exactly once: the
killed worker's open transaction (results and offsets) is aborted by the broker, and the
surviving worker answers those requests again from the last committed offsets.

A second pair of workers gets bulk requests of very different lengths, which finish out
of order, and one of them is SIGKILLed between two transactions: what its committed
transactions hold must be exactly what their offsets cover.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from loadtest.data import passages, stsb_sentences
from producer_sdk import EmbedClient
from schemas import EmbedRequest, EmbedResult, decode_result, encode_request
from schemas.headers import CORRELATION_ID, DLQ_ERROR_CODE, DLQ_OFFSET, DLQ_TOPIC
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess
from tests.integration.kafka_io import collect, producer

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:6]
REQUESTS, RESULTS, GROUP = f"eos.{TAG}.requests", f"eos.{TAG}.results", f"eos-{TAG}"
SMALL = f"eos.{TAG}.small"  # a reply topic whose max.message.bytes no result fits in
# Each request asks for the result partition numbered like its request partition, so the
# results on a partition come from that request partition's owner alone.
REQUEST_PARTITIONS = RESULT_PARTITIONS = 4
COUNT, INPUTS = 300, 6
DIM = 384
SECRET = "exactly once, whatever happens"  # request text, never to be logged


def _worker(kafka: LocalKafka, log: Path, name: str) -> WorkerProcess:
    return WorkerProcess(
        kafka.bootstrap_servers,
        log,
        delivery="exactly_once",
        requests_topic=REQUESTS,
        bulk_topic="",
        results_topic=RESULTS,
        group_id=GROUP,
        client_id=f"eos-{name}",
        # Short timeouts keep the test quick: the killed worker's partitions move after
        # the session timeout, and its open transaction is aborted after the transaction
        # timeout (until then read_committed readers of its result partitions wait).
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        transaction_timeout_ms=3000,
    )


@pytest.fixture(scope="module")
def workers(
    kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, WorkerProcess]]:
    kafka.create_topics(
        [
            TopicSpec(REQUESTS, REQUEST_PARTITIONS),
            TopicSpec(RESULTS, RESULT_PARTITIONS),
            TopicSpec(SMALL, 1, {"max.message.bytes": "1000"}),
        ]
    )
    logs = tmp_path_factory.mktemp("eos")
    first = _worker(kafka, logs / "first.log", "first")
    second = _worker(kafka, logs / "second.log", "second")
    try:
        first.wait_ready()
        second.wait_ready()
        yield first, second
    finally:
        first.stop()
        second.stop()


def _texts(index: int) -> tuple[str, ...]:
    return tuple(f"request {index} input {j}: {SECRET}" for j in range(INPUTS))


async def _read(
    bootstrap: str,
    isolation_level: str,
    done: Callable[[list[str]], bool],
    timeout: float,
    *,
    topic: str = RESULTS,
    partitions: int = RESULT_PARTITIONS,
) -> list[tuple[str, Any]]:
    """(request id, record) of every result in ``topic``, read from the beginning until
    ``done(ids)`` holds and the reader has caught up with the partitions' ends."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation_level
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        seen: list[tuple[str, Any]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            batches = await consumer.getmany(*tps, timeout_ms=500)
            for records in batches.values():
                for record in records:
                    seen.append((dict(record.headers)[CORRELATION_ID].decode(), record))
            if done([request_id for request_id, _ in seen]):
                ends = await consumer.end_offsets(tps)  # the last stable offsets here
                if all([await consumer.position(tp) >= ends[tp] for tp in tps]):
                    break
        return seen
    finally:
        await consumer.stop()


async def _committed(
    bootstrap: str,
    group: str = GROUP,
    topic: str = REQUESTS,
    partitions: int = REQUEST_PARTITIONS,
) -> dict[int, int | None]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        return {p: await consumer.committed(TopicPartition(topic, p)) for p in range(partitions)}
    finally:
        await consumer.stop()


def _request(index: int) -> EmbedRequest:
    return EmbedRequest(
        id=f"{TAG}-{index:04d}",
        inputs=_texts(index),
        reply_to=RESULTS,
        reply_partition=index % RESULT_PARTITIONS,
    )


async def _feed(
    bootstrap: str, first: int, stop: asyncio.Event
) -> tuple[list[EmbedRequest], dict[int, int]]:
    """Publish a few more requests every 50 ms, numbered from ``first``, until ``stop``
    is set (or 30 * COUNT are out); what was sent and the end offset of each partition
    written to."""
    sent: list[EmbedRequest] = []
    ends: dict[int, int] = {}
    async with producer(bootstrap) as client:
        while not stop.is_set() and len(sent) < 30 * COUNT:
            for _ in range(RESULT_PARTITIONS):
                request = _request(first + len(sent))
                value = encode_request(request)
                meta = await (await client.send(REQUESTS, value, partition=request.reply_partition))
                ends[meta.partition] = meta.offset + 1
                sent.append(request)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)
    return sent, ends


async def _publish(bootstrap: str, topic: str, requests: list[EmbedRequest]) -> dict[int, int]:
    """Send ``requests`` (each to the partition numbered like its reply_partition, if it
    has one); the end offset of each partition written to."""
    ends: dict[int, int] = {}
    async with producer(bootstrap) as client:
        for request in requests:
            value = encode_request(request)
            meta = await (await client.send(topic, value, partition=request.reply_partition))
            ends[meta.partition] = max(ends.get(meta.partition, 0), meta.offset + 1)
    return ends


async def _kill_in_a_transaction(
    bootstrap: str, victim: WorkerProcess, *, within_s: float = 120.0
) -> tuple[bool, str]:
    """SIGKILL ``victim`` while a transaction of its own is open: freeze it (SIGSTOP) and
    look at the result partitions only it writes to; a high watermark past the last stable
    offset that stays there longer than a commit takes to complete is its open
    transaction. A transaction is open for a millisecond or two between its results reaching
    the broker and its commit, so the victim is frozen the moment a read_uncommitted watcher
    sees new results there (the commit still has a round trip or more to go), and otherwise
    at random moments. Tries for ``within_s``, then kills it anyway; True if it caught one,
    and what it tried."""
    assigned = [e for e in victim.events() if e.get("event") == "partitions.assigned"]
    mine = [int(name.rsplit("-", 1)[1]) for name in assigned[-1]["partitions"]]
    assert mine, "the victim owns no partition"
    tps = [TopicPartition(RESULTS, p) for p in mine]
    readers = [
        AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=level)
        for level in ("read_uncommitted", "read_committed")
    ]
    watcher = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_uncommitted", fetch_max_wait_ms=100
    )
    for consumer in (*readers, watcher):
        await consumer.start()
    watcher.assign(tps)
    await watcher.seek_to_end(*tps)

    async def open_transaction() -> bool:
        high, stable = [await reader.end_offsets(tps) for reader in readers]
        return any(high[tp] > stable[tp] for tp in tps)

    try:
        deadline = time.monotonic() + within_s
        tries = {"at random": 0, "on new results": 0, "open at first look": 0}
        while time.monotonic() < deadline:
            new = await watcher.getmany(*tps, timeout_ms=random.randint(1, 30))
            victim.process.send_signal(signal.SIGSTOP)
            tries["on new results" if new else "at random"] += 1
            if await open_transaction():
                tries["open at first look"] += 1
                await asyncio.sleep(0.3)  # a commit under way completes meanwhile
                if await open_transaction():
                    victim.process.kill()
                    return True, f"{tries} on partitions {mine}"
            victim.process.send_signal(signal.SIGCONT)
        victim.process.kill()
        return False, f"{tries} on partitions {mine}"
    finally:
        victim.process.wait()
        for consumer in (*readers, watcher):
            await consumer.stop()


def _assert_once(seen: list[tuple[str, Any]], wanted: set[str], inputs: int) -> None:
    counts = Counter(request_id for request_id, _ in seen)
    missing = wanted - counts.keys()
    duplicated = {request_id: n for request_id, n in counts.items() if n > 1}
    assert not missing, f"{len(missing)} requests never answered"
    assert not duplicated, f"read_committed saw duplicates: {duplicated}"
    assert counts.keys() == wanted
    for _, record in seen:
        result = decode_result(record.value)
        assert isinstance(result, EmbedResult), result
        vectors = np.frombuffer(result.vectors, dtype="<f4").reshape(result.count, result.dim)
        assert vectors.shape == (inputs, DIM)
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-3)


async def test_read_committed_sees_each_request_once_after_a_worker_is_killed(
    kafka: LocalKafka, workers: tuple[WorkerProcess, WorkerProcess]
) -> None:
    """SIGKILL one of two exactly-once workers in the middle of a transaction: a
    read_committed reader sees every request id exactly once, each with a (6, 384) vector
    block, while a read_uncommitted reader sees the killed transaction's answers as well;
    the group's committed offsets (written only inside transactions) reach the end of every
    request partition; and the surviving worker keeps serving read_committed SDK calls."""
    victim, survivor = workers
    requests = [_request(i) for i in range(COUNT)]
    ends = await _publish(kafka.bootstrap_servers, REQUESTS, requests)

    # Once a tenth of the answers are visible, kill the victim inside a transaction. More
    # requests keep arriving meanwhile, so the victim is never idle (with no transaction
    # open) however far it got through the first ones on a fast or a slow machine.
    await _read(
        kafka.bootstrap_servers,
        "read_uncommitted",
        lambda ids: len(set(ids) & {r.id for r in requests}) >= COUNT // 10,
        timeout=120,
    )
    killed = asyncio.Event()
    feeder = asyncio.create_task(_feed(kafka.bootstrap_servers, COUNT, killed))
    try:
        caught, tried = await _kill_in_a_transaction(kafka.bootstrap_servers, victim)
    finally:
        killed.set()
        fed, fed_ends = await feeder
    assert caught, f"never caught the victim with a transaction open: {tried}"
    requests += fed
    ends = {p: max(ends.get(p, 0), fed_ends.get(p, 0)) for p in ends.keys() | fed_ends.keys()}
    wanted = {request.id for request in requests}

    seen = await _read(
        kafka.bootstrap_servers,
        "read_committed",
        lambda ids: wanted <= set(ids),
        timeout=180,
    )
    _assert_once(seen, wanted, INPUTS)

    # Offsets travel inside the transactions: the group has committed every request.
    committed = await _committed(kafka.bootstrap_servers)
    assert committed == {p: ends.get(p) for p in range(REQUEST_PARTITIONS)}

    # The aborted transaction's answers are in the log, and their requests were answered
    # again: read_uncommitted readers see those twice, read_committed readers never.
    everything = await _read(
        kafka.bootstrap_servers, "read_uncommitted", lambda ids: wanted <= set(ids), timeout=60
    )
    twice = [i for i, n in Counter(i for i, _ in everything).items() if n > 1]
    assert twice, "the killed transaction held answers"

    assert survivor.process.poll() is None
    taken = [e for e in survivor.events() if e.get("event") == "partitions.assigned"]
    assert len(taken[-1]["partitions"]) == REQUEST_PARTITIONS, "the survivor took over"
    async with EmbedClient(
        kafka.bootstrap_servers,
        requests_topic=REQUESTS,
        reply_topic=RESULTS,
        isolation_level="read_committed",
    ) as sdk:
        vector = await asyncio.wait_for(sdk.embed(["still served"], timeout=60), 90)
    assert vector.shape == (1, DIM)
    # The log never carries request text.
    assert SECRET not in survivor.log_path.read_text()


async def test_a_result_its_reply_topic_refuses_is_dead_lettered(
    kafka: LocalKafka, workers: tuple[WorkerProcess, WorkerProcess]
) -> None:
    """A reply topic that exists but refuses the result (here: smaller max.message.bytes
    than the result) does not fail an exactly-once worker: the transaction is aborted and
    retried with that result dead-lettered (reason reply_failed), and a request behind it
    is answered."""
    alive = [w for w in workers if w.process.poll() is None]
    poison = EmbedRequest(id=f"{TAG}-poison", inputs=("too large for its topic",), reply_to=SMALL)
    after = EmbedRequest(id=f"{TAG}-after", inputs=("answered anyway",), reply_to=RESULTS)
    async with producer(kafka.bootstrap_servers) as client:
        origin = await (await client.send(REQUESTS, encode_request(poison), partition=0))
        await (await client.send(REQUESTS, encode_request(after), partition=0))

    def where(record: Any) -> tuple[str, str]:
        headers = dict(record.headers)
        return headers.get(DLQ_TOPIC, b"").decode(), headers.get(DLQ_OFFSET, b"").decode()

    wanted = (REQUESTS, str(origin.offset))
    letters = await collect(
        kafka.bootstrap_servers,
        "embed.requests.dlq",
        lambda records: wanted in {where(r) for r in records},
        timeout=90,
        isolation_level="read_committed",
    )
    [letter] = [record for record in letters if where(record) == wanted]
    assert dict(letter.headers)[DLQ_ERROR_CODE] == b"reply_failed"
    assert letter.value == encode_request(poison)
    answered = await _read(
        kafka.bootstrap_servers, "read_committed", lambda ids: after.id in ids, timeout=90
    )
    assert after.id in {request_id for request_id, _ in answered}
    for worker in alive:
        assert worker.process.poll() is None, "no worker failed"
        assert not [e for e in worker.events() if e.get("event") == "transaction.failed"]
    aborted = [e for w in alive for e in w.events() if e.get("event") == "transaction.aborted"]
    assert any(e["error"] == "MessageSizeTooLargeError" for e in aborted)


async def test_a_fenced_worker_exits_and_a_restart_answers_the_rest_once(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """A worker whose transactions fail (here: fenced, as another producer took its
    transactional id) aborts, logs transaction.failed and exits non-zero; a restarted
    worker with the same id answers what was left, and a read_committed reader sees every
    request exactly once."""
    requests_topic, results_topic = f"fence.{TAG}.requests", f"fence.{TAG}.results"
    group, transactional_id = f"fence-{TAG}", f"kembed-fence-{TAG}"
    kafka.create_topics([TopicSpec(requests_topic, 2), TopicSpec(results_topic, 1)])
    settings: dict[str, Any] = {
        "delivery": "exactly_once",
        "transactional_id": transactional_id,
        "transaction_timeout_ms": 3000,
        "requests_topic": requests_topic,
        "bulk_topic": "",
        "group_id": group,
    }
    requests = [
        EmbedRequest(id=f"fence-{TAG}-{i:03d}", inputs=_texts(i)[:2], reply_to=results_topic)
        for i in range(40)
    ]
    first_half, second_half = {r.id for r in requests[:20]}, {r.id for r in requests}

    def read(wanted: set[str], timeout: float) -> Any:
        return _read(
            kafka.bootstrap_servers,
            "read_committed",
            lambda ids: wanted <= set(ids),
            timeout,
            topic=results_topic,
            partitions=1,
        )

    first = WorkerProcess(kafka.bootstrap_servers, tmp_path / "first.log", **settings)
    try:
        first.wait_ready()
        await _publish(kafka.bootstrap_servers, requests_topic, requests[:20])
        assert first_half <= {request_id for request_id, _ in await read(first_half, 120)}

        fence = AIOKafkaProducer(
            bootstrap_servers=kafka.bootstrap_servers, transactional_id=transactional_id
        )
        await fence.start()  # a new epoch for the id: the worker's producer is fenced
        try:
            ends = await _publish(kafka.bootstrap_servers, requests_topic, requests[20:])
            exit_code = await asyncio.to_thread(first.process.wait, 120)
        finally:
            await fence.stop()
    finally:
        first.stop()
    assert exit_code != 0
    assert any(e.get("event") == "transaction.failed" for e in first.events())

    second = WorkerProcess(kafka.bootstrap_servers, tmp_path / "second.log", **settings)
    try:
        seen = await read(second_half, 180)
    finally:
        assert second.stop() == 0
    _assert_once(seen, second_half, 2)
    committed = await _committed(kafka.bootstrap_servers, group, requests_topic, 2)
    assert all(committed[p] == end for p, end in ends.items())


async def _kill_between_transactions(
    bootstrap: str, victim: WorkerProcess, requests: str, results: str
) -> bool:
    """SIGKILL ``victim`` while no transaction of its own is open: freeze it (SIGSTOP) and
    look at the partitions of ``results`` only it writes to (numbered like its partitions
    of ``requests``); if every one's high watermark equals its last stable offset, nothing
    of the victim's is in flight. Tries for a while, then kills it anyway; True if it
    caught such a moment."""
    assigned = [e for e in victim.events() if e.get("event") == "partitions.assigned"]
    names = assigned[-1]["partitions"]
    mine = [int(n.rsplit("-", 1)[1]) for n in names if n.rsplit("-", 1)[0] == requests]
    assert mine, "the victim owns partitions of the request topic"
    tps = [TopicPartition(results, p) for p in mine]
    readers = [
        AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=level)
        for level in ("read_uncommitted", "read_committed")
    ]
    for reader in readers:
        await reader.start()
    try:
        for _ in range(500):
            victim.process.send_signal(signal.SIGSTOP)
            await asyncio.sleep(0.3)  # a commit under way completes meanwhile
            high, stable = [await reader.end_offsets(tps) for reader in readers]
            if all(high[tp] == stable[tp] for tp in tps):
                victim.process.kill()
                return True
            victim.process.send_signal(signal.SIGCONT)
            await asyncio.sleep(random.uniform(0, 0.05))
        victim.process.kill()
        return False
    finally:
        victim.process.wait()
        for reader in readers:
            await reader.stop()


MIXED_COUNT, MIXED_INPUTS, MIXED_PARTITIONS = 600, 4, 4


def _mixed_requests(topic: str) -> list[EmbedRequest]:
    """Bulk requests of four STS-B texts each: every third request holds passages of
    ~120 words, the others the shortest sentences, so that length-sorted batches finish
    later requests before earlier ones."""
    sentences = stsb_sentences()
    short = sorted(sentences, key=len)[:300]
    long = passages(sentences, words=120)
    requests = []
    for i in range(MIXED_COUNT):
        pool = long if i % 3 == 0 else short
        inputs = tuple(pool[(MIXED_INPUTS * i + j) % len(pool)] for j in range(MIXED_INPUTS))
        requests.append(
            EmbedRequest(
                id=f"{topic}-{i:04d}",
                inputs=inputs,
                reply_to=f"{topic}.results",
                reply_partition=i % MIXED_PARTITIONS,
            )
        )
    return requests


async def test_answers_finished_out_of_order_are_committed_once_after_a_kill(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """Two exactly-once workers share bulk requests of mixed lengths on four partitions,
    which finish out of order (the results of a partition are not in request order); one
    worker is SIGKILLed between two of its transactions once a quarter of the requests
    are answered. A read_committed reader sees every request exactly once: no committed
    transaction held an answer above its partition's committed offset, which the
    survivor would have answered again. The workers run with a small in-flight limit, so
    their bulk partitions are paused and resumed while answers wait behind unfinished
    requests; the survivor still answers everything."""
    topic = f"eosmix.{uuid.uuid4().hex[:6]}"
    results = f"{topic}.results"
    kafka.create_topics(
        [
            TopicSpec(topic, 1),
            TopicSpec(f"{topic}.bulk", MIXED_PARTITIONS),
            TopicSpec(results, MIXED_PARTITIONS),
        ]
    )
    settings: dict[str, Any] = {
        "delivery": "exactly_once",
        "requests_topic": topic,
        "bulk_topic": f"{topic}.bulk",
        "results_topic": results,
        "group_id": topic,
        "session_timeout_ms": 6000,
        "heartbeat_interval_ms": 1000,
        "transaction_timeout_ms": 3000,
        "max_inflight_inputs": 512,
    }
    victim = WorkerProcess(kafka.bootstrap_servers, tmp_path / "victim.log", **settings)
    survivor = WorkerProcess(kafka.bootstrap_servers, tmp_path / "survivor.log", **settings)
    try:
        victim.wait_ready()
        survivor.wait_ready()
        for worker in (victim, survivor):  # both hold bulk partitions
            await asyncio.to_thread(_wait_assigned, worker, f"{topic}.bulk", MIXED_PARTITIONS // 2)
        requests = _mixed_requests(topic)
        wanted = {request.id for request in requests}
        ends = await _publish(kafka.bootstrap_servers, f"{topic}.bulk", requests)

        await _read(
            kafka.bootstrap_servers,
            "read_committed",
            lambda ids: len(set(ids) & wanted) >= MIXED_COUNT // 4,
            timeout=300,
            topic=results,
            partitions=MIXED_PARTITIONS,
        )
        assert await _kill_between_transactions(
            kafka.bootstrap_servers, victim, f"{topic}.bulk", results
        ), "never caught the victim between transactions"

        seen = await _read(
            kafka.bootstrap_servers,
            "read_committed",
            lambda ids: wanted <= set(ids),
            timeout=600,
            topic=results,
            partitions=MIXED_PARTITIONS,
        )
        assert survivor.process.poll() is None
    finally:
        victim.stop()
        survivor.stop()

    counts = Counter(request_id for request_id, _ in seen)
    assert not wanted - counts.keys(), f"{len(wanted - counts.keys())} requests never answered"
    twice = sorted(request_id for request_id, n in counts.items() if n > 1)
    assert not twice, f"read_committed saw {len(twice)} requests twice: {twice[:20]}"
    for _, record in seen:
        result = decode_result(record.value)
        assert isinstance(result, EmbedResult), result
        assert (result.count, result.dim) == (MIXED_INPUTS, DIM)
    # Requests finished out of order: some result partition is not in request order.
    order: dict[int, list[str]] = {}
    for request_id, record in seen:
        order.setdefault(record.partition, []).append(request_id)
    assert any(ids != sorted(ids) for ids in order.values()), "completion was in order"
    # Backpressure paused the bulk partitions while answers were held.
    events = [e.get("event") for w in (victim, survivor) for e in w.events()]
    assert "partitions.paused" in events
    assert "partitions.resumed" in events
    committed = await _committed(kafka.bootstrap_servers, topic, f"{topic}.bulk", MIXED_PARTITIONS)
    assert committed == {p: ends.get(p) for p in range(MIXED_PARTITIONS)}


def _wait_assigned(worker: WorkerProcess, topic: str, count: int, timeout: float = 120) -> None:
    """Wait until ``worker``'s latest assignment holds ``count`` partitions of ``topic``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assigned = [e for e in worker.events() if e.get("event") == "partitions.assigned"]
        names = assigned[-1]["partitions"] if assigned else []
        if sum(name.startswith(f"{topic}-") for name in names) == count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{worker.log_path.name}: never held {count} partitions of {topic}")
