"""End-to-end scenarios through the real broker and a real worker process.

- bulk: texts sent as requests of ``k`` texts to the bulk lane, as an ingestion job would,
  timed from the first send to the last result;
- interactive: single-text ``EmbedClient.embed()`` calls arriving as a Poisson process at a
  fixed offered rate (open loop: a slow answer does not slow the arrivals), alone or while
  a bulk backlog drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from producer_sdk import EmbedClient
from schemas import EmbedRequest, EmbedResult, decode_result, encode_request
from schemas.headers import CORRELATION_ID

__all__ = ["BulkRun", "bulk", "interactive", "reading_replies"]


@dataclass
class BulkRun:
    texts: int
    tokens: int = 0
    errors: int = 0
    seconds: float = 0.0

    @property
    def texts_per_s(self) -> float:
        return self.texts / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


@contextlib.asynccontextmanager
async def reading_replies(
    consumer: AIOKafkaConsumer, producer: AIOKafkaProducer
) -> AsyncIterator[None]:
    """Start both, with ``consumer`` positioned at the end of its topic (only the answers
    to what is sent from here count); stop both on the way out."""
    await consumer.start()
    await producer.start()
    try:
        await consumer.seek_to_end()
        for tp in consumer.assignment():
            await consumer.position(tp)
        yield
    finally:
        await producer.stop()
        await consumer.stop()


async def bulk(
    bootstrap: str,
    texts: list[str],
    per_request: int,
    *,
    topic: str,
    reply_topic: str,
    progress: Callable[[int], None] | None = None,
    timeout: float = 900,
    isolation_level: str = "read_uncommitted",
) -> BulkRun:
    """Publish ``texts`` in requests of ``per_request`` and wait for every result
    (TimeoutError after ``timeout`` seconds: a benchmark must never hang); results are read
    at ``isolation_level`` (read_committed for exactly-once workers)."""
    requests = [
        EmbedRequest(
            id=uuid.uuid4().hex,
            inputs=tuple(texts[i : i + per_request]),
            reply_to=reply_topic,
        )
        for i in range(0, len(texts), per_request)
    ]
    pending = {request.id for request in requests}
    run = BulkRun(texts=len(texts))
    consumer = AIOKafkaConsumer(
        reply_topic, bootstrap_servers=bootstrap, group_id=None, isolation_level=isolation_level
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    async with reading_replies(consumer, producer):
        started = time.perf_counter()
        for request in requests:
            await producer.send(topic, encode_request(request))
        await producer.flush()
        while pending:
            if time.perf_counter() - started > timeout:
                raise TimeoutError(f"{len(pending)} bulk requests unanswered after {timeout} s")
            batches = await consumer.getmany(timeout_ms=1000)
            for records in batches.values():
                for record in records:
                    if dict(record.headers).get(CORRELATION_ID, b"").decode() not in pending:
                        continue
                    result = decode_result(record.value)
                    pending.discard(result.id)
                    if isinstance(result, EmbedResult):
                        run.tokens += sum(result.tokens)
                        if progress:
                            progress(result.count)
                    else:
                        run.errors += 1
        run.seconds = time.perf_counter() - started
    return run


async def interactive(
    client: EmbedClient,
    texts: list[str],
    rate: float,
    duration: float,
    *,
    until: asyncio.Future[Any] | None = None,
    seed: int = 7,
) -> list[float]:
    """Latencies (ms) of single-text embed() calls offered at ``rate`` per second for
    ``duration`` seconds, or until ``until`` is done if that comes first."""
    rng = random.Random(seed)
    latencies: list[float] = []
    calls: list[asyncio.Task[Any]] = []

    async def one(text: str) -> None:
        started = time.perf_counter()
        await client.embed([text], timeout=30)
        latencies.append((time.perf_counter() - started) * 1000)

    loop = asyncio.get_running_loop()
    end = loop.time() + duration
    next_at = loop.time()
    while loop.time() < end and not (until is not None and until.done()):
        next_at += rng.expovariate(rate)
        await asyncio.sleep(max(0.0, next_at - loop.time()))
        calls.append(asyncio.create_task(one(texts[rng.randrange(len(texts))])))
    await asyncio.gather(*calls)
    return latencies
