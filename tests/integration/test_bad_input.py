"""Bad messages never stop the worker: each is answered with an error or dead-lettered."""

from __future__ import annotations

import uuid
from typing import Any

import msgpack
import pytest

from schemas import EmbedResult, ErrorResult, decode_result
from schemas.headers import (
    CORRELATION_ID,
    DLQ_ERROR_CODE,
    DLQ_OFFSET,
    DLQ_PARTITION,
    DLQ_TOPIC,
    routing_headers,
)
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess
from tests.integration.kafka_io import collect, producer

pytestmark = pytest.mark.integration

REPLIES = "test.bad-input.replies"


def _request(request_id: str, **fields: Any) -> bytes:
    body = {"v": 1, "id": request_id, "inputs": ["a valid text"], "reply_to": REPLIES, **fields}
    packed: bytes = msgpack.packb(body)
    return packed


async def test_bad_messages_are_answered_or_dead_lettered(
    kafka: LocalKafka, worker: WorkerProcess
) -> None:
    """Not msgpack, missing id, empty inputs, a non-string input and an unsupported v: those
    with an id get an error result with the documented code, the others land on the DLQ
    with origin headers, and the valid request sent after them is answered."""
    kafka.create_topics([TopicSpec(REPLIES, 1)])
    tag = uuid.uuid4().hex[:8]
    answered = {
        f"{tag}-not-msgpack-with-headers": (
            b"\xc1\xff not msgpack",
            routing_headers(f"{tag}-not-msgpack-with-headers", REPLIES),
            "invalid_request",
        ),
        f"{tag}-empty": (_request(f"{tag}-empty", inputs=[]), [], "invalid_request"),
        f"{tag}-non-string": (
            _request(f"{tag}-non-string", inputs=["ok", 7]),
            [],
            "invalid_request",
        ),
        f"{tag}-version": (_request(f"{tag}-version", v=2), [], "unsupported_version"),
    }
    dead = {
        "not-msgpack": b"\xc1\xff not msgpack " + tag.encode(),
        "missing-id": msgpack.packb({"v": 1, "inputs": ["x"], "reply_to": REPLIES, "t": tag}),
    }
    valid_id = f"{tag}-valid"

    async with producer(kafka.bootstrap_servers) as client:
        origins: dict[str, tuple[int, int]] = {}
        for name, value in dead.items():
            meta = await client.send_and_wait("embed.requests", value, partition=0)
            origins[name] = (meta.partition, meta.offset)
        for value, headers, _ in answered.values():
            await client.send_and_wait("embed.requests", value, headers=headers, partition=0)
        await client.send_and_wait("embed.requests", _request(valid_id), partition=0)

    # Answers are published concurrently, so they may arrive in any order: wait for all.
    expected = {*answered, valid_id}
    replies = await collect(
        kafka.bootstrap_servers,
        REPLIES,
        lambda records: (
            expected <= {dict(r.headers).get(CORRELATION_ID, b"").decode() for r in records}
        ),
    )
    results = {r.id: r for r in (decode_result(record.value) for record in replies)}

    for request_id, (_, _, code) in answered.items():
        result = results[request_id]
        assert isinstance(result, ErrorResult), request_id
        assert result.error.code == code, (request_id, result.error)
    assert results[f"{tag}-non-string"].error.index == 1  # type: ignore[union-attr]
    assert isinstance(results[valid_id], EmbedResult)

    def origin(record: Any) -> tuple[int, int]:
        headers = dict(record.headers)
        return int(headers[DLQ_PARTITION]), int(headers[DLQ_OFFSET])

    dlq = await collect(
        kafka.bootstrap_servers,
        "embed.requests.dlq",
        lambda records: set(origins.values()) <= {origin(r) for r in records},
    )
    by_origin = {origin(r): r for r in dlq}
    dead_events = [e for e in worker.events() if "dead_letter" in str(e.get("event"))]
    for name, where in origins.items():
        assert where in by_origin, (name, where, sorted(by_origin), dead_events)
        letter = by_origin[where]
        letter_headers = dict(letter.headers)
        assert letter_headers[DLQ_TOPIC] == b"embed.requests"
        assert letter_headers[DLQ_ERROR_CODE] == b"invalid_request"
        assert letter.value == dead[name]
    assert worker.process.poll() is None, "the worker must keep running"
