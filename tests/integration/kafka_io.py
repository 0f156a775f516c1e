"""Small aiokafka helpers for tests that read or write topics directly."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition


@asynccontextmanager
async def producer(bootstrap: str) -> AsyncIterator[Any]:
    client = AIOKafkaProducer(bootstrap_servers=bootstrap)
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
