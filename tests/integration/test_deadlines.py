"""Deadlines: requests that expire while queued are dropped before the encoder."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid

import pytest

from schemas import (
    EmbedRequest,
    EmbedResult,
    ErrorResult,
    Result,
    decode_result,
    encode_request,
)
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess, load_stsb
from tests.integration.kafka_io import producer, read_all
from tests.support.metrics import samples, total

pytestmark = pytest.mark.integration


async def test_inputs_that_expire_in_the_queue_never_reach_the_encoder(
    kafka: LocalKafka, worker: WorkerProcess
) -> None:
    """Requests queued behind a bulk backlog whose deadline passes before their turn are
    answered with deadline_exceeded, without being computed (the worker logs
    request.deadline_exceeded, not a rejection at admission); the backlog itself is answered
    in full.

    The deadline must pass after the worker took the requests in and before their batch is
    cut, whatever the machine's speed: the test waits until the worker holds every input
    (answered or in flight, from its metrics), freezes it (SIGSTOP) until the deadline has
    passed, and lets it go on. The backlog is longer than the window of oldest inputs a
    batch is cut from (1024 by default), so the expiring requests cannot be cut before a
    third of it has run: seconds, far longer than the freeze takes to arrive."""
    replies = f"test.deadlines.{uuid.uuid4().hex[:6]}"
    kafka.create_topics([TopicSpec(replies, 1)])
    sentences = sorted({p.first for p in load_stsb("en")})
    backlog = [
        EmbedRequest(
            id=f"backlog-{i}",
            inputs=tuple(sentences[(i * 100 + j) % len(sentences)] for j in range(100)),
            reply_to=replies,
        )
        for i in range(15)
    ]
    url = worker.http_url
    answered_before = total(samples(url), "kembed_inputs_total")
    async with producer(kafka.bootstrap_servers) as client:
        for request in backlog:
            await client.send("embed.requests.bulk", encode_request(request), partition=0)
        deadline_ms = int(time.time() * 1000) + 4000
        expiring = [
            EmbedRequest(
                id=f"expiring-{uuid.uuid4().hex[:8]}",
                inputs=("queued behind the backlog",),
                reply_to=replies,
                deadline_ms=deadline_ms,
            )
            for _ in range(5)
        ]
        for request in expiring:
            await client.send("embed.requests.bulk", encode_request(request), partition=0)
        await client.flush()
    sent = sum(len(r.inputs) for r in [*backlog, *expiring])
    while True:
        scrape = samples(url)
        held = total(scrape, "kembed_inputs_total") - answered_before
        held += total(scrape, "kembed_inflight_inputs", lane="bulk")
        if held >= sent:
            break
        assert time.time() * 1000 < deadline_ms - 1000, f"the worker took in {held} of {sent}"
        await asyncio.sleep(0.02)
    worker.process.send_signal(signal.SIGSTOP)
    try:
        await asyncio.sleep(max(0.0, deadline_ms / 1000 - time.time()) + 0.3)
    finally:
        worker.process.send_signal(signal.SIGCONT)

    expected = {r.id for r in [*backlog, *expiring]}
    results: dict[str, Result] = {}
    give_up = time.monotonic() + 120
    while not expected <= set(results) and time.monotonic() < give_up:
        results = {
            r.id: r
            for r in (
                decode_result(x.value) for x in await read_all(kafka.bootstrap_servers, replies)
            )
        }
    for request in backlog:
        assert isinstance(results[request.id], EmbedResult), request.id
    queued = {
        e["request_id"] for e in worker.events() if e.get("event") == "request.deadline_exceeded"
    }
    for request in expiring:
        result = results[request.id]
        assert isinstance(result, ErrorResult)
        assert result.error.code == "deadline_exceeded"
        assert "queued" in result.error.message
        assert request.id in queued
