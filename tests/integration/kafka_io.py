"""Small aiokafka helpers for tests that read or write topics directly."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from schemas import Result, decode_result


@asynccontextmanager
async def producer(bootstrap: str, **config: Any) -> AsyncIterator[Any]:
    client = AIOKafkaProducer(bootstrap_servers=bootstrap, **config)
    await client.start()
    try:
        yield client
    finally:
        await client.stop()


async def collect(
    bootstrap: str,
    topic: str,
    until: Callable[[list[Any]], bool],
    *,
    partition: int = 0,
    timeout: float = 60,
    isolation_level: str = "read_uncommitted",
) -> list[Any]:
    """Every record of one partition from its beginning, read until ``until(records)``
    holds or ``timeout`` seconds pass (the caller's assertions then say what is missing)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation_level
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        records: list[Any] = []
        deadline = time.monotonic() + timeout
        while not until(records) and time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=500)
            records.extend(batch.get(tp, []))
        return records
    finally:
        await consumer.stop()


def answered(ids: set[str]) -> Callable[[list[Any]], bool]:
    """An ``until`` for :func:`collect`: every request of ``ids`` has a result among the
    records."""
    return lambda records: ids <= {decode_result(record.value).id for record in records}


async def results_for(
    bootstrap: str, topic: str, ids: set[str], *, timeout: float = 60
) -> list[Result]:
    """The results on partition 0 of ``topic``, decoded, read until each of ``ids`` has
    one or ``timeout`` seconds pass."""
    records = await collect(bootstrap, topic, answered(ids), timeout=timeout)
    return [decode_result(record.value) for record in records]


async def read_all(bootstrap: str, topic: str, **config: Any) -> list[Any]:
    """Every record of every partition of ``topic``, up to the end offsets at the time of the
    call (``config``: consumer options, e.g. isolation_level)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **config)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(await _partitions(consumer, topic))]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        records: list[Any] = []
        while True:
            positions = [await consumer.position(tp) for tp in partitions]
            if all(pos >= ends[tp] for pos, tp in zip(positions, partitions, strict=True)):
                return records
            batch = await consumer.getmany(*partitions, timeout_ms=500)
            records.extend(r for rs in batch.values() for r in rs)
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    partitions: set[int] | None = consumer.partitions_for_topic(topic)
    while not partitions:
        await consumer._client.force_metadata_update()
        partitions = consumer.partitions_for_topic(topic)
    return partitions
