"""The producer SDK against the real broker and worker: errors, timeouts, late results, CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer

from producer_sdk import EmbedClient, EmbedError, EmbedTimeoutError
from schemas import EmbedResult, encode_result
from schemas.headers import routing_headers
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import ROOT, WorkerProcess

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("call", "code", "index"),
    [
        ({"texts": ["short", "word " * 400], "truncate": False}, "input_too_long", 1),
        ({"texts": ["text"], "model": "no-such-model"}, "unknown_model", None),
        ({"texts": ["text"] * 513}, "too_many_inputs", None),
        ({"texts": ["text"], "dimensions": 1000}, "invalid_request", None),
    ],
)
async def test_error_results_raise_embed_error_with_the_wire_code(
    kafka: LocalKafka, worker: WorkerProcess, call: dict[str, object], code: str, index: int | None
) -> None:
    """A request the worker rejects raises EmbedError carrying the wire code and input index,
    and the worker keeps serving."""
    texts = call.pop("texts")
    async with EmbedClient(kafka.bootstrap_servers) as client:
        with pytest.raises(EmbedError) as caught:
            await client.embed(texts, timeout=60, **call)  # type: ignore[call-overload]
        assert caught.value.code == code
        assert caught.value.index == index
        assert caught.value.message
        assert not caught.value.retriable
        assert (await client.embed(["still serving"], timeout=60)).shape == (1, 384)


async def test_long_input_is_truncated_by_default(kafka: LocalKafka, worker: WorkerProcess) -> None:
    """Without truncate=false an over-long input is cut to the model's limit, not refused."""
    async with EmbedClient(kafka.bootstrap_servers) as client:
        vectors = await client.embed(["word " * 400], timeout=60)
    assert vectors.shape == (1, 384)
    assert abs(float(np.linalg.norm(vectors[0])) - 1.0) < 1e-5


async def test_options_dimensions_and_normalize(kafka: LocalKafka, worker: WorkerProcess) -> None:
    """dimensions keeps the leading values re-normalized; normalize=False keeps raw norms."""
    async with EmbedClient(kafka.bootstrap_servers) as client:
        full = await client.embed(["a sentence about Kafka"], timeout=60)
        short = await client.embed(["a sentence about Kafka"], timeout=60, dimensions=64)
        raw = await client.embed(["a sentence about Kafka"], timeout=60, normalize=False)
    assert short.shape == (1, 64)
    expected = full[0, :64] / np.linalg.norm(full[0, :64])
    assert np.allclose(short[0], expected, atol=1e-5)
    assert np.linalg.norm(raw[0]) > 1.5  # MiniLM's unnormalized mean-pooled norms are ~3-7
    assert np.allclose(raw[0] / np.linalg.norm(raw[0]), full[0], atol=1e-5)


async def test_timeout_raises_and_a_late_result_is_dropped(kafka: LocalKafka) -> None:
    """With no worker on the requests topic a call raises EmbedTimeoutError promptly; a
    result arriving afterwards for that request is dropped, not delivered or raised."""
    kafka.create_topics([TopicSpec("test.unserved.requests", 1)])
    async with EmbedClient(kafka.bootstrap_servers, requests_topic="test.unserved.requests") as c:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(EmbedTimeoutError) as caught:
            await c.embed(["nobody answers"], timeout=1.0)
        assert loop.time() - started < 10
        assert isinstance(caught.value, TimeoutError)
        late = EmbedResult(
            id=caught.value.request_id, model="m", dim=1, vectors=b"\x00\x00\x80\x3f", tokens=(3,)
        )
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
        await producer.start()
        try:
            await producer.send_and_wait(
                "embed.results",
                encode_result(late),
                partition=c.reply_partition,
                headers=routing_headers(late.id),
            )
        finally:
            await producer.stop()
        for _ in range(100):
            if c.dropped_results:
                break
            await asyncio.sleep(0.1)
        assert c.dropped_results == 1


def test_cli_embed_prints_json_vectors(kafka: LocalKafka, worker: WorkerProcess) -> None:
    """`kembed embed TEXT...` prints one normalized vector per text as JSON."""
    env = {**os.environ, "KEMBED_BOOTSTRAP_SERVERS": kafka.bootstrap_servers}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "kembed"), "embed", "first text", "second text"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["dim"] == 384
    vectors = np.array(result["vectors"])
    assert vectors.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
