"""The local KRaft broker of scripts/kafka_local: topics, durability across restart, shutdown.

Plain sync tests that drive aiokafka through ``asyncio.run``, so they need no async plugin.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from scripts.kafka_local import DEFAULT_TOPICS, LocalKafka

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    kafka = LocalKafka(tmp_path_factory.mktemp("kafka"))
    kafka.start()
    yield kafka
    kafka.stop()


async def _partition_counts(bootstrap: str) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        topics = await admin.describe_topics([spec.name for spec in DEFAULT_TOPICS])
    finally:
        await admin.close()
    return {topic["topic"]: len(topic["partitions"]) for topic in topics}


async def _produce(bootstrap: str, topic: str, key: bytes, value: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key, partition=0)
    finally:
        await producer.stop()


async def _first_record(bootstrap: str, topic: str) -> tuple[bytes, bytes]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        record = await asyncio.wait_for(consumer.getone(), timeout=20)
    finally:
        await consumer.stop()
    return record.key, record.value


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_default_topics_exist_with_their_partition_counts(broker: LocalKafka) -> None:
    """start() returns only once every DEFAULT_TOPICS topic exists with its partition count."""
    counts = asyncio.run(_partition_counts(broker.bootstrap_servers))

    assert counts == {spec.name: spec.partitions for spec in DEFAULT_TOPICS}


def test_message_survives_restart_on_same_address(broker: LocalKafka) -> None:
    """A produced message is consumable, and still is after restart() on the same address."""
    address = broker.bootstrap_servers
    asyncio.run(_produce(address, "embed.requests", b"k1", b"hello"))
    assert asyncio.run(_first_record(address, "embed.requests")) == (b"k1", b"hello")

    broker.restart()

    assert broker.bootstrap_servers == address
    assert asyncio.run(_first_record(address, "embed.requests")) == (b"k1", b"hello")


def test_stop_ends_the_broker_process(tmp_path: Path) -> None:
    """Leaving the context manager stops the JVM and removes the pid file; stop() is idempotent."""
    with LocalKafka(tmp_path, topics=()) as kafka:
        pid = kafka.pid
        assert pid is not None
        assert _process_exists(pid)

    assert not _process_exists(pid)
    assert not (tmp_path / "broker.pid").exists()
    kafka.stop()


def test_failed_start_reports_the_broker_log(tmp_path: Path) -> None:
    """A broker that exits during start makes start() raise with the broker's own error."""
    with socket.socket() as taken:
        # Bound but not listening: the broker cannot bind it, and nothing answers on it.
        taken.bind(("127.0.0.1", 0))
        kafka = LocalKafka(tmp_path, port=taken.getsockname()[1], topics=())

        with pytest.raises(RuntimeError, match="exited with status") as failure:
            kafka.start(timeout=60)

    assert "Address already in use" in str(failure.value)
    assert not kafka.running
