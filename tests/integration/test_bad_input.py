"""Bad messages never stop the worker: each is answered with an error or dead-lettered."""

from __future__ import annotations

import asyncio
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

import schemas.headers as hdr
from schemas import EmbedResult, ErrorResult, Result, decode_result
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess
from tests.integration.kafka_io import collect, producer, read_all
from worker.settings import DEFAULT_REPLY_TOPICS

pytestmark = pytest.mark.integration

REPLIES = "test.bad-input.replies"


def _request(request_id: str, **fields: Any) -> bytes:
    body = {"v": 1, "id": request_id, "inputs": ["a valid text"], "reply_to": REPLIES, **fields}
    packed: bytes = msgpack.packb(body)
    return packed


async def _answers(kafka: LocalKafka, expected: set[str]) -> dict[str, Result]:
    """The results on REPLIES, by id, once every id of ``expected`` has one (answers are
    published concurrently, so they arrive in any order)."""
    replies = await collect(
        kafka.bootstrap_servers,
        REPLIES,
        lambda records: (
            expected <= {dict(r.headers).get(hdr.CORRELATION_ID, b"").decode() for r in records}
        ),
    )
    return {r.id: r for r in (decode_result(record.value) for record in replies)}


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
            hdr.routing_headers(f"{tag}-not-msgpack-with-headers", REPLIES),
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
    results = await _answers(kafka, expected)

    for request_id, (_, _, code) in answered.items():
        result = results[request_id]
        assert isinstance(result, ErrorResult), request_id
        assert result.error.code == code, (request_id, result.error)
    assert results[f"{tag}-non-string"].error.index == 1  # type: ignore[union-attr]
    assert isinstance(results[valid_id], EmbedResult)

    def origin(record: Any) -> tuple[int, int]:
        headers = dict(record.headers)
        return int(headers[hdr.DLQ_PARTITION]), int(headers[hdr.DLQ_OFFSET])

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
        assert letter_headers[hdr.DLQ_TOPIC] == b"embed.requests"
        assert letter_headers[hdr.DLQ_ERROR_CODE] == b"invalid_request"
        assert letter.value == dead[name]
    assert worker.process.poll() is None, "the worker must keep running"


def _invalid_utf8_request(request_id: str) -> bytes:
    """A request whose second input is not valid UTF-8 (msgpack str with bytes 0xff 0xfe)."""
    valid = _request(request_id, inputs=["fine", "ab"])
    assert valid.count(b"\xa2ab") == 1
    return valid.replace(b"\xa2ab", b"\xa2\xff\xfe")


async def test_every_documented_bad_input_gets_its_error_code(
    kafka: LocalKafka, worker: WorkerProcess
) -> None:
    """Each kind of bad request in schemas/README.md is answered with its stable code (and
    the failing input's index where there is one), the worker keeps serving, and the valid
    request sent last is answered. A reply topic that cannot be written sends the request
    to the DLQ with reason reply_failed."""
    kafka.create_topics([TopicSpec(REPLIES, 1)])
    tag = uuid.uuid4().hex[:8]
    now_ms = int(time.time() * 1000)
    oversized_id = f"{tag}-oversized"
    cases: dict[str, tuple[Callable[[str], bytes], str, int | None]] = {
        "empty-string": (lambda i: _request(i, inputs=["ok", ""]), "invalid_request", 1),
        "inputs-not-a-list": (lambda i: _request(i, inputs="one text"), "invalid_request", None),
        "truncate-not-bool": (lambda i: _request(i, truncate="yes"), "invalid_request", None),
        "invalid-utf8": (_invalid_utf8_request, "invalid_request", 1),
        "too-long": (
            lambda i: _request(i, inputs=["short", "word " * 600], truncate=False),
            "input_too_long",
            1,
        ),
        "too-many": (lambda i: _request(i, inputs=["t"] * 513), "too_many_inputs", None),
        "unknown-model": (lambda i: _request(i, model="no/such-model"), "unknown_model", None),
        "unsupported-version": (lambda i: _request(i, v=9), "unsupported_version", None),
        "deadline-passed": (
            lambda i: _request(i, deadline_ms=now_ms - 1000),
            "deadline_exceeded",
            None,
        ),
        "dimensions-zero": (lambda i: _request(i, dimensions=0), "invalid_request", None),
        "dimensions-too-big": (lambda i: _request(i, dimensions=385), "invalid_request", None),
    }
    bodies = {
        f"{tag}-{name}": (build(f"{tag}-{name}"), code, index)
        for name, (build, code, index) in cases.items()
    }
    unwritable_id = f"{tag}-unwritable"
    unwritable = _request(unwritable_id, reply_to="no.such.reply.topic")
    valid_id = f"{tag}-valid"
    # Over max_request_bytes (4 MiB): only the headers can say whom to answer.
    oversized = _request(oversized_id, inputs=["x" * (5 * 1024 * 1024)])

    async with producer(kafka.bootstrap_servers, max_request_size=9 * 1024 * 1024) as client:
        for value, _, _ in bodies.values():
            await client.send_and_wait("embed.requests", value, partition=1)
        await client.send_and_wait(
            "embed.requests",
            oversized,
            headers=hdr.routing_headers(oversized_id, REPLIES),
            partition=1,
        )
        sent = await client.send_and_wait("embed.requests", unwritable, partition=1)
        await client.send_and_wait("embed.requests", _request(valid_id), partition=1)

    expected = {*bodies, oversized_id, valid_id}
    results = await _answers(kafka, expected)
    for request_id, (_, code, index) in bodies.items():
        result = results.get(request_id)
        assert isinstance(result, ErrorResult), (request_id, result)
        assert (result.error.code, result.error.index) == (code, index), (request_id, result)
        assert result.error.message
    too_large = results[oversized_id]
    assert isinstance(too_large, ErrorResult)
    assert too_large.error.code == "message_too_large"
    assert isinstance(results[valid_id], EmbedResult)

    dlq = await collect(
        kafka.bootstrap_servers,
        "embed.requests.dlq",
        lambda records: any(
            dict(r.headers).get(hdr.DLQ_OFFSET) == b"%d" % sent.offset
            and dict(r.headers).get(hdr.DLQ_PARTITION) == b"1"
            for r in records
        ),
    )
    letters = [
        r
        for r in dlq
        if dict(r.headers).get(hdr.DLQ_OFFSET) == b"%d" % sent.offset
        and dict(r.headers).get(hdr.DLQ_PARTITION) == b"1"
    ]
    assert len(letters) == 1, "the unanswerable request is dead-lettered once"
    headers = dict(letters[0].headers)
    assert headers[hdr.DLQ_ERROR_CODE] == b"reply_failed"
    assert b"no.such.reply.topic" in headers[hdr.DLQ_ERROR_MESSAGE]
    assert letters[0].value == unwritable
    assert worker.process.poll() is None, "the worker must keep running"


async def test_a_reply_topic_outside_the_allow_list_is_dead_lettered(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """A worker with the default KEMBED_REPLY_TOPICS: requests naming another reply topic
    (in the body, or in Spring's kafka_replyTopic header only) are not computed, land in
    the request DLQ with code reply_forbidden and are counted, and nothing is written to
    the topic they named; the requests around them are answered on embed.results.*, the
    header-only one on the partition its header names."""
    tag = uuid.uuid4().hex[:8]
    requests, forbidden = f"test.forbid.{tag}.requests", f"test.forbid.{tag}.replies"
    allowed = f"embed.results.forbid-{tag}"
    kafka.create_topics([TopicSpec(requests, 1), TopicSpec(forbidden, 1), TopicSpec(allowed, 2)])
    worker = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path / "worker.log",
        dtype="float32",
        requests_topic=requests,
        bulk_topic="",
        group_id=f"forbid-{tag}",
        reply_topics=DEFAULT_REPLY_TOPICS,  # not the test suite's permissive default
    )
    try:
        worker.wait_ready()
        plain = {"v": 1, "inputs": ["a valid text"]}
        to_allowed = {"reply_to": allowed, "reply_partition": 0}
        async with producer(kafka.bootstrap_servers) as client:
            await client.send_and_wait(
                requests, msgpack.packb({**plain, "id": f"{tag}-before", **to_allowed})
            )
            in_body = await client.send_and_wait(
                requests, msgpack.packb({**plain, "id": f"{tag}-body", "reply_to": forbidden})
            )
            in_header = await client.send_and_wait(
                requests,
                msgpack.packb({**plain, "id": f"{tag}-header"}),
                headers=hdr.routing_headers(f"{tag}-header", forbidden),
            )
            # Spring-style: routed by headers alone, to an allowed topic and partition.
            await client.send_and_wait(
                requests,
                msgpack.packb({**plain, "id": f"{tag}-spring"}),
                headers=hdr.routing_headers(f"{tag}-spring", allowed, 1),
            )
            await client.send_and_wait(
                requests, msgpack.packb({**plain, "id": f"{tag}-after", **to_allowed})
            )

        def ids(records: list[Any]) -> set[str]:
            return {dict(r.headers).get(hdr.CORRELATION_ID, b"").decode() for r in records}

        both = {f"{tag}-before", f"{tag}-after"}
        first = await collect(kafka.bootstrap_servers, allowed, lambda rs: both <= ids(rs))
        second = await collect(
            kafka.bootstrap_servers, allowed, lambda rs: f"{tag}-spring" in ids(rs), partition=1
        )
        assert both <= ids(first)
        assert ids(second) == {f"{tag}-spring"}, "the header partition is honoured"
        for record in (*first, *second):
            assert isinstance(decode_result(record.value), EmbedResult)

        offsets = {b"%d" % in_body.offset, b"%d" % in_header.offset}

        def letters(records: list[Any]) -> list[Any]:
            return [
                r
                for r in records
                if dict(r.headers).get(hdr.DLQ_TOPIC) == requests.encode()
                and dict(r.headers).get(hdr.DLQ_OFFSET) in offsets
            ]

        dlq = await collect(
            kafka.bootstrap_servers, "embed.requests.dlq", lambda rs: len(letters(rs)) >= 2
        )
        found = letters(dlq)
        assert len(found) == 2
        for letter in found:
            headers = dict(letter.headers)
            assert headers[hdr.DLQ_ERROR_CODE] == b"reply_forbidden"
            assert forbidden.encode() in headers[hdr.DLQ_ERROR_MESSAGE]
        assert await read_all(kafka.bootstrap_servers, forbidden) == []
        metrics = await asyncio.to_thread(_get, f"{worker.http_url}/metrics")
        assert 'kembed_dlq_messages_total{code="reply_forbidden"} 2.0' in metrics
        assert worker.process.poll() is None, "the worker keeps serving"
    finally:
        worker.stop()


async def test_only_the_bulk_lane_answers_on_an_ingestion_topic_and_results_say_their_lane(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """A worker with the default KEMBED_REPLY_TOPICS and KEMBED_INGEST_TOPICS: a bulk
    request naming embed.ingest.* (a sink's input) is answered there, its result stamped
    kembed.lane: bulk; an interactive one naming it, in its body or in Spring's header,
    is not computed: its error result reply_forbidden there says why (and is stamped
    interactive, so a sink dead-letters it); interactive replies on embed.results.* flow."""
    tag = uuid.uuid4().hex[:8]
    requests, bulk = f"test.lane.{tag}.requests", f"test.lane.{tag}.requests.bulk"
    ingest, replies = f"embed.ingest.lane-{tag}", f"embed.results.lane-{tag}"
    kafka.create_topics([TopicSpec(t, 1) for t in (requests, bulk, ingest, replies)])
    worker = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path / "worker.log",
        dtype="float32",
        requests_topic=requests,
        bulk_topic=bulk,
        group_id=f"lane-{tag}",
        reply_topics=DEFAULT_REPLY_TOPICS,  # not the test suite's permissive default
    )
    try:
        worker.wait_ready()
        plain = {"v": 1, "inputs": ["a valid text"], "keys": ["row-1"]}
        async with producer(kafka.bootstrap_servers) as client:
            await client.send_and_wait(
                bulk, msgpack.packb({**plain, "id": "b", "reply_to": ingest})
            )
            await client.send_and_wait(
                requests, msgpack.packb({**plain, "id": "i-body", "reply_to": ingest})
            )
            await client.send_and_wait(
                requests,
                msgpack.packb({**plain, "id": "i-header"}),
                headers=hdr.routing_headers("i-header", ingest),
            )
            await client.send_and_wait(
                requests, msgpack.packb({**plain, "id": "i-reply", "reply_to": replies})
            )

        def by_id(records: list[Any]) -> dict[str, Any]:
            return {dict(r.headers)[hdr.CORRELATION_ID].decode(): r for r in records}

        on_ingest = by_id(
            await collect(kafka.bootstrap_servers, ingest, lambda rs: len(by_id(rs)) >= 3)
        )
        on_replies = by_id(await collect(kafka.bootstrap_servers, replies, lambda rs: bool(rs)))
        assert set(on_ingest) == {"b", "i-body", "i-header"}
        assert dict(on_ingest["b"].headers)[hdr.LANE] == b"bulk"
        assert isinstance(decode_result(on_ingest["b"].value), EmbedResult)
        for name in ("i-body", "i-header"):
            assert dict(on_ingest[name].headers)[hdr.LANE] == b"interactive"
            refused = decode_result(on_ingest[name].value)
            assert isinstance(refused, ErrorResult), refused
            assert refused.error.code == "reply_forbidden"
            assert "bulk lane only" in refused.error.message
            assert bulk in refused.error.message
        assert set(on_replies) == {"i-reply"}
        assert dict(on_replies["i-reply"].headers)[hdr.LANE] == b"interactive"
        assert isinstance(decode_result(on_replies["i-reply"].value), EmbedResult)
        assert worker.process.poll() is None, "the worker keeps serving"
    finally:
        worker.stop()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        text: str = response.read().decode()
    return text
