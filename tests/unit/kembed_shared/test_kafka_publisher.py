"""Unit tests for kembed_shared.kafka.publisher that need no broker."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import TopicPartition as KafkaTP
from aiokafka.errors import KafkaConnectionError, NotEnoughReplicasError, NotLeaderForPartitionError

import kembed_shared.kafka.publisher as publisher_module
from kembed_shared.kafka.publisher import (
    DEFAULT_BATCH_BYTES,
    KafkaPublisher,
    KafkaTransactionalPublisher,
    _ExpectedRetries,
)
from kembed_shared.ports import PublishError, Record
from tests.support.kafka import FakeSource, FakeTransactions
from worker.replies import Replier, ReplyTo
from worker.settings import WorkerSettings


def _retry_warning(error: type[Exception]) -> logging.LogRecord:
    return logging.LogRecord(
        "aiokafka.producer.sender",
        logging.WARNING,
        __file__,
        1,
        "Got error produce response on topic-partition %s, retrying. Error: %s",
        ("TopicPartition(topic='embed.results', partition=0)", error),
        None,
    )


def test_only_the_expected_transactional_retry_warning_is_dropped() -> None:
    """The transactional producer's NOT_ENOUGH_REPLICAS retry (a produce racing the previous
    transaction's completion) is not logged; other produce retries still are."""
    expected = _ExpectedRetries()
    assert expected.filter(_retry_warning(NotEnoughReplicasError)) is False
    assert expected.filter(_retry_warning(NotLeaderForPartitionError)) is True
    other = logging.LogRecord("x", logging.WARNING, __file__, 1, "something else", None, None)
    assert expected.filter(other) is True


# -- destination checks: a slow metadata answer is transient, only the broker's "no" is not --


class _Cluster:
    def __init__(self) -> None:
        self.known: dict[str, set[int]] = {}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self.known.get(topic)


class _Response:
    def __init__(self, topics: list[tuple[int, str]], brokers: bool = True) -> None:
        self.brokers = [(1, "127.0.0.1", 9092, None)] if brokers else []
        self.topics: list[tuple[int, str, bool, list[object]]] = [
            (code, name, False, []) for code, name in topics
        ]


class _Client:
    """The parts of aiokafka's client that the destination check uses."""

    def __init__(self) -> None:
        self.cluster = _Cluster()
        self.answers: list[_Response | BaseException] = []  # one per metadata request
        self.asked = 0

    def get_random_node(self) -> int | None:
        return 1

    async def send(self, node: int, request: object) -> _Response:
        self.asked += 1
        answer = self.answers.pop(0) if self.answers else _Response([])
        if isinstance(answer, BaseException):
            raise answer
        return answer


class _FakeProducer:
    """An aiokafka producer whose metadata waits and sends the test controls."""

    def __init__(self) -> None:
        self.client = _Client()
        self.slow_metadata = 0  # partitions_for hangs this many times (a broker restarting)
        self.topics: dict[str, set[int]] = {"embed.results": {0, 1}, "embed.requests.dlq": {0}}
        self.sent: list[tuple[str, bytes, int | None]] = []
        self.keys: list[bytes | None] = []
        self.headers: list[list[tuple[str, bytes]]] = []

    async def partitions_for(self, topic: str) -> set[int]:
        if self.slow_metadata:
            self.slow_metadata -= 1
            await asyncio.sleep(3600)
        self.client.cluster.known[topic] = self.topics[topic]
        return self.topics[topic]

    async def send(self, topic: str, value: bytes, **options: Any) -> asyncio.Future[None]:
        """aiokafka's ``send``: ``key``, ``partition`` and ``headers`` are noted."""
        self.sent.append((topic, value, options.get("partition")))
        self.keys.append(options.get("key"))
        self.headers.append(list(options.get("headers") or []))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def stop(self) -> None:
        pass


def _replier(
    producer: _FakeProducer,
    fatal: list[BaseException],
    dead: list[str],
    retry_for_s: float,
    on_retry: Callable[[], None] = lambda: None,
) -> Replier:
    """The worker's replier over ``producer``; failures and dead letters noted in the lists."""
    return Replier(
        _publisher(producer),
        results_topic="embed.results",
        dlq_topic="embed.requests.dlq",
        on_fatal=fatal.append,
        retry_for_s=retry_for_s,
        on_retry=on_retry,
        on_dead_letter=dead.append,
    )


def _publisher(producer: _FakeProducer) -> KafkaPublisher:
    publisher = KafkaPublisher(
        "127.0.0.1:1", client_id="test", linger_ms=0, max_request_size=1_000_000
    )
    publisher._producer = producer
    return publisher


@pytest.fixture
def short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Metadata waits of 50 ms instead of 10 s."""
    monkeypatch.setattr(publisher_module, "_TOPIC_WAIT_S", 0.05)


async def test_a_metadata_wait_that_runs_out_is_transient(short_wait: None) -> None:
    """The reply topic's metadata taking longer than the wait (a broker restarting) is a
    retriable failure, not a permanent one."""
    producer = _FakeProducer()
    producer.client.answers = [_Response([(5, "embed.results")])]  # LEADER_NOT_AVAILABLE
    producer.slow_metadata = 1
    with pytest.raises(PublishError) as caught:
        await _publisher(producer).send("embed.results", b"v")
    assert caught.value.retriable, caught.value.reason
    assert producer.sent == []


async def test_no_broker_answering_is_transient(short_wait: None) -> None:
    """Metadata requests that time out or find no broker that knows the cluster (just
    restarted) are retriable."""
    producer = _FakeProducer()
    producer.client.answers = [KafkaConnectionError("connection refused")]
    publisher = _publisher(producer)
    with pytest.raises(PublishError) as caught:
        await publisher.send("embed.results", b"v")
    assert caught.value.retriable
    producer.client.answers = [_Response([], brokers=False)]
    with pytest.raises(PublishError) as caught:
        await publisher.send("embed.results", b"v")
    assert caught.value.retriable


@pytest.mark.parametrize(
    ("code", "why"),
    [(3, "does not exist"), (29, "may not be written"), (17, "not a valid topic name")],
)
async def test_what_the_broker_refuses_is_permanent_at_once(code: int, why: str) -> None:
    """A topic the broker says does not exist, may not be written, or has an invalid name
    fails for good, without waiting for metadata."""
    producer = _FakeProducer()
    producer.client.answers = [_Response([(code, "no.such.topic")])]
    producer.slow_metadata = 1  # would hang: the broker's answer must be enough
    with pytest.raises(PublishError) as caught:
        await asyncio.wait_for(_publisher(producer).send("no.such.topic", b"v"), 5)
    assert not caught.value.retriable
    assert why in caught.value.reason


async def test_a_missing_partition_is_permanent() -> None:
    producer = _FakeProducer()
    producer.client.answers = [_Response([(0, "embed.results")])]
    with pytest.raises(PublishError) as caught:
        await _publisher(producer).send("embed.results", b"v", partition=7)
    assert not caught.value.retriable
    assert "partition 7" in caught.value.reason


async def test_replier_retries_a_slow_metadata_wait_instead_of_dead_lettering(
    short_wait: None,
) -> None:
    """At least once: a result whose reply topic's metadata is slow to come is retried
    within publish_retry_s and then delivered; nothing is dead-lettered."""
    producer = _FakeProducer()
    producer.client.answers = [_Response([(5, "embed.results")]), _Response([(0, "embed.results")])]
    producer.slow_metadata = 1
    retries: list[None] = []
    dead: list[str] = []
    fatal: list[BaseException] = []
    replier = _replier(producer, fatal, dead, 30, on_retry=lambda: retries.append(None))
    record = Record("embed.requests", 0, 5, b"request")
    assert await replier.answer(record, ReplyTo("id-1", None, None), b"result")
    assert producer.sent == [("embed.results", b"result", None)]
    assert dead == []
    assert fatal == []
    assert len(retries) == 1


async def test_replier_gives_up_on_a_transient_failure_by_failing_the_worker(
    short_wait: None,
) -> None:
    """When the retries run out, the worker fails (its requests are redelivered) rather than
    dead-letter a request whose reply topic may well exist."""
    producer = _FakeProducer()
    producer.client.answers = [KafkaConnectionError("down")] * 100
    dead: list[str] = []
    fatal: list[BaseException] = []
    replier = _replier(producer, fatal, dead, 0.2)
    record = Record("embed.requests", 0, 5, b"request")
    assert not await replier.answer(record, ReplyTo("id-1", None, None), b"result")
    assert dead == []
    assert producer.sent == []
    assert len(fatal) == 1
    assert isinstance(fatal[0], PublishError)
    assert fatal[0].retriable


def _exactly_once(producer: FakeTransactions, retry_for_s: float) -> tuple[Any, list[Any]]:
    from worker.exactly_once import ExactlyOnce
    from worker.offsets import OffsetTracker

    fatal: list[BaseException] = []
    delivery = ExactlyOnce(
        producer,
        FakeSource({("embed.requests", 0)}),
        OffsetTracker(),
        group_id="g",
        results_topic="embed.results",
        dlq_topic="embed.requests.dlq",
        interval_s=0.0,
        timeout_s=5.0,
        on_fatal=fatal.append,
        settle_s=0.0,
        retry_for_s=retry_for_s,
    )
    return delivery, fatal


async def test_exactly_once_retries_a_transient_destination_check() -> None:
    """Exactly once: a reply topic whose metadata is slow (retriable) is checked again
    within publish_retry_s, and the answer is then committed to it, not dead-lettered."""
    slow = PublishError("topic 'embed.results' is not available yet", retriable=True)
    producer = FakeTransactions(destination_failures=[slow, slow])
    delivery, fatal = _exactly_once(producer, retry_for_s=30)
    record = Record("embed.requests", 0, 0, b"request")
    delivery.track(record)
    loop = asyncio.create_task(delivery.run())
    try:
        answered = await asyncio.wait_for(
            delivery.answer(record, ReplyTo("id-1", None, None), b"result"), 10
        )
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert answered
    assert producer.checked == 3
    assert producer.sent_topics() == ["embed.results"]
    assert fatal == []


async def test_exactly_once_fails_the_worker_when_the_retries_run_out() -> None:
    """Exactly once: a destination still unavailable after publish_retry_s fails the worker
    rather than dead-letter the request."""
    slow = PublishError("topic 'embed.results' is not available yet", retriable=True)
    producer = FakeTransactions(destination_failures=[slow] * 100)
    delivery, fatal = _exactly_once(producer, retry_for_s=0.2)
    record = Record("embed.requests", 0, 0, b"request")
    delivery.track(record)
    assert not await delivery.answer(record, ReplyTo("id-1", None, None), b"result")
    assert producer.sent_topics() == []
    assert len(fatal) == 1


# -- what a client may rely on: the result's key, and the partition chosen from it ----------


async def test_a_result_is_keyed_by_its_request_id() -> None:
    """A result's Kafka key is the request id (UTF-8), its kafka_correlationId header too,
    and without a reply_partition the producer picks the partition (by that key)."""
    producer = _FakeProducer()
    producer.client.cluster.known["embed.results"] = {0, 1}
    replier = _replier(producer, [], [], 300.0)
    record = Record("embed.requests", 0, 5, b"request")
    assert await replier.answer(record, ReplyTo("req-\u00fc", None, None), b"result")
    assert producer.sent == [("embed.results", b"result", None)]
    assert producer.keys == ["req-\u00fc".encode()]
    assert producer.headers == [[("kafka_correlationId", "req-\u00fc".encode())]]


# org.apache.kafka.common.utils.Utils.murmur2 of these UTF-8 keys, as the Java client computes it
_JAVA_MURMUR2 = {
    "1": -1993445489,
    "12": 126087238,
    "123": -267702483,
    "1234": -1614185708,
    "12345": -1188365604,
}


@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 12])
async def test_the_result_partition_is_the_java_clients_default_for_its_key(
    partitions: int,
) -> None:
    """Without reply_partition, a result lands where Kafka's Java client would put a record
    with the same key: toPositive(murmur2(key)) % partitions, so a client can tell which
    partition its answer will be on."""
    publisher = KafkaPublisher(
        "127.0.0.1:1", client_id="test", linger_ms=0, max_request_size=1_000_000
    )
    choose = publisher._producer._partitioner  # the partitioner the worker's producer uses
    every = list(range(partitions))
    for key, java_hash in _JAVA_MURMUR2.items():
        expected = (java_hash & 0x7FFFFFFF) % partitions
        assert choose(key.encode(), every, every) == expected, key
        assert choose(key.encode(), every, every[:1]) == expected, "even if some are down"


# -- batching: results finished together leave together ---------------------------------------


@pytest.mark.parametrize("transactional", [False, True])
async def test_results_of_one_partition_share_a_batch(transactional: bool) -> None:
    """Three results of 32 MiniLM vectors (49 KiB each) bound for one partition join one
    producer batch at once; with aiokafka's default 16 KiB batch each had a batch of its
    own, and the second waited for the first to be sent."""
    publisher: KafkaPublisher | KafkaTransactionalPublisher
    if transactional:
        publisher = KafkaTransactionalPublisher(
            "127.0.0.1:1",
            client_id="test",
            linger_ms=0,
            max_request_size=5_000_000,
            transactional_id="t",
            transaction_timeout_ms=10_000,
        )
    else:
        publisher = KafkaPublisher(
            "127.0.0.1:1", client_id="test", linger_ms=0, max_request_size=5_000_000
        )
    accumulator = publisher._producer._message_accumulator
    accumulator._txn_manager = None  # no transaction to join without a broker
    tp = KafkaTP("embed.results", 0)
    result = bytes(32 * 384 * 4)
    for _ in range(3):
        await asyncio.wait_for(accumulator.add_message(tp, None, result, timeout=1), 1)
    assert len(accumulator._batches[tp]) == 1
    assert 3 * len(result) <= DEFAULT_BATCH_BYTES


async def test_the_worker_batches_results_within_max_result_bytes() -> None:
    """A batch is never larger than max_result_bytes, which the reply topics accept."""
    from worker.app import _publisher

    for limit in (200_000, 50_000_000):
        settings = WorkerSettings.model_validate({"max_result_bytes": limit})
        publisher = _publisher(settings, {})
        batch = publisher._producer._message_accumulator._batch_size
        assert batch == min(limit, DEFAULT_BATCH_BYTES)
