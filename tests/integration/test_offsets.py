"""Commits never pass an unanswered request, even when later requests finish first."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from schemas import EmbedRequest, EmbedResult, decode_result, encode_request
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess, load_stsb
from tests.integration.kafka_io import producer, read_all

pytestmark = pytest.mark.integration

PARTITION = 3


async def _committed(bootstrap: str, group: str, tp: TopicPartition) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group, partitions=[tp])
    finally:
        await admin.close()
    meta = offsets.get(tp)
    return -1 if meta is None else int(meta.offset)


async def test_commit_stops_at_the_first_unanswered_request(
    kafka: LocalKafka, worker: WorkerProcess
) -> None:
    """A long request followed by a short one on the same partition: the short one is
    answered first, yet the group's committed offset stays at the long one until it is
    answered too, and then moves past both."""
    replies = f"test.offsets.{uuid.uuid4().hex[:6]}"
    kafka.create_topics([TopicSpec(replies, 1)])
    sentences = sorted({p.first for p in load_stsb("en")})
    # 512 inputs of ~200 tokens: several seconds of fp32 work, so the committed offset can
    # be sampled between the two answers.
    long_texts = tuple(" ".join(sentences[i : i + 12]) for i in range(512))
    slow = EmbedRequest(id=f"slow-{uuid.uuid4().hex[:6]}", inputs=long_texts, reply_to=replies)
    fast = EmbedRequest(id=f"fast-{uuid.uuid4().hex[:6]}", inputs=("quick",), reply_to=replies)
    tp = TopicPartition("embed.requests", PARTITION)
    async with producer(kafka.bootstrap_servers) as client:
        slow_at = await client.send_and_wait(
            "embed.requests", encode_request(slow), partition=PARTITION
        )
        fast_at = await client.send_and_wait(
            "embed.requests", encode_request(fast), partition=PARTITION
        )

    seen_while_slow_pending: list[int] = []
    answered: dict[str, int] = {}  # request id -> position of its answer on the topic
    give_up = time.monotonic() + 120
    while slow.id not in answered and time.monotonic() < give_up:
        ids = [r.key.decode() for r in await read_all(kafka.bootstrap_servers, replies)]
        answered = {request_id: position for position, request_id in enumerate(ids)}
        if fast.id in answered and slow.id not in answered:
            seen_while_slow_pending.append(
                await _committed(kafka.bootstrap_servers, "kembed-workers", tp)
            )
        await asyncio.sleep(0.2)
    assert answered.get(fast.id, len(answered)) < answered[slow.id], (
        "the short request finished first"
    )
    assert seen_while_slow_pending, "the committed offset was sampled while the long one ran"
    assert max(seen_while_slow_pending) <= slow_at.offset, (seen_while_slow_pending, slow_at)

    moved = -1
    give_up = time.monotonic() + 30
    while moved <= fast_at.offset and time.monotonic() < give_up:
        moved = await _committed(kafka.bootstrap_servers, "kembed-workers", tp)
        await asyncio.sleep(0.2)
    assert moved == fast_at.offset + 1
    results = [decode_result(r.value) for r in await read_all(kafka.bootstrap_servers, replies)]
    assert sorted(r.id for r in results) == sorted([fast.id, slow.id])
    assert all(isinstance(r, EmbedResult) for r in results)
