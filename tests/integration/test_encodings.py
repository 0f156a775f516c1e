"""Output encodings end to end: the real worker and model answer float16, int8 and binary
requests, the SDK decodes them, and they agree with the float32 vectors."""

from __future__ import annotations

import asyncio
import json
import uuid

import msgpack
import numpy as np
import numpy.typing as npt
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from scipy.stats import spearmanr

from producer_sdk import (
    EmbedClient,
    EmbedError,
    UnexpectedEncodingError,
    hamming_distances,
    unpack_bits,
)
from schemas import EmbedResult, ErrorResult, decode_result, encode_result
from schemas.headers import routing_headers
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import StsPair, WorkerProcess, embed_request, load_stsb
from tests.integration.kafka_io import collect, producer
from tests.support.cli import run_kembed

pytestmark = pytest.mark.integration

DIM = 384
# Values this close to zero may take either sign between two computations of one text
# (float32 sums in another order); the sign-bit comparison leaves them out.
SIGN_MARGIN = 1e-5


def sts_pairs(count: int) -> list[StsPair]:
    """``count`` STS-B test pairs spread over the whole score range (every k-th by score)."""
    pairs = sorted(load_stsb("en"), key=lambda pair: (pair.score, pair.first))
    step = len(pairs) // count
    return pairs[::step][:count]


def cosines(first: npt.NDArray[np.float64], second: npt.NDArray[np.float64]) -> list[float]:
    norms = np.linalg.norm(first, axis=1) * np.linalg.norm(second, axis=1)
    return list(np.sum(first * second, axis=1) / norms)


@pytest.mark.parametrize("dimensions", [None, 128, 37])
async def test_each_encoding_agrees_with_the_float32_vectors(
    kafka: LocalKafka, worker: WorkerProcess, dimensions: int | None
) -> None:
    """For each encoding and dimensions: the SDK returns the documented dtype and shape,
    float16 is within 1e-3 of float32, int8 / 127 within half a step (0.5 / 127), and the
    binary bits are the signs of the float32 values (37 dimensions: 5 bytes per vector, the
    last one padded with zero bits)."""
    texts = [pair.first for pair in sts_pairs(6)]
    dim = dimensions or DIM
    async with EmbedClient(kafka.bootstrap_servers) as client:
        reference = await client.embed(texts, timeout=60, dimensions=dimensions)
        halves = await client.embed(texts, timeout=60, dimensions=dimensions, encoding="float16")
        codes = await client.embed(texts, timeout=60, dimensions=dimensions, encoding="int8")
        bits = await client.embed(texts, timeout=60, dimensions=dimensions, encoding="binary")

    assert reference.dtype == np.float32
    assert reference.shape == (len(texts), dim)
    assert np.allclose(np.linalg.norm(reference, axis=1), 1.0, atol=1e-5)

    assert halves.dtype == np.float16
    assert halves.shape == (len(texts), dim)
    assert np.max(np.abs(halves.astype(np.float32) - reference)) <= 1e-3

    assert codes.dtype == np.int8
    assert codes.shape == (len(texts), dim)
    assert np.max(np.abs(codes.astype(np.int32))) <= 127
    assert np.max(np.abs(codes / 127 - reference)) <= 0.5 / 127 + 1e-6  # half a step

    assert bits.dtype == np.uint8
    assert bits.shape == (len(texts), (dim + 7) // 8)
    unpacked = unpack_bits(bits, dim)
    clear = np.abs(reference) > SIGN_MARGIN
    assert clear.mean() > 0.99
    np.testing.assert_array_equal(unpacked[clear], (reference > 0)[clear])
    padding = np.unpackbits(bits, axis=1)[:, dim:]
    assert not padding.any()


async def test_int8_without_normalize_carries_scales_that_restore_the_values(
    kafka: LocalKafka, worker: WorkerProcess
) -> None:
    """normalize=False with int8: one scale per vector (max |x| / 127), and codes x scales
    give the raw float32 vectors back to half a step; tokens and model come along."""
    texts = [pair.first for pair in sts_pairs(4)]
    async with EmbedClient(kafka.bootstrap_servers) as client:
        raw = await client.embed(texts, timeout=60, normalize=False, dimensions=100)
        result = await client.embed_result(
            texts, timeout=60, normalize=False, dimensions=100, encoding="int8"
        )
    assert result.vectors.dtype == np.int8
    assert result.vectors.shape == (4, 100)
    assert result.scales is not None
    assert result.scales.dtype == np.float32
    assert result.scales.shape == (4,)
    assert np.allclose(result.scales, np.max(np.abs(raw), axis=1) / 127, rtol=1e-4)
    assert np.all(np.max(np.abs(result.vectors.astype(np.int32)), axis=1) == 127)
    restored = result.to_float32()
    assert np.all(np.abs(restored - raw) <= result.scales[:, None] * 0.5 + 1e-5)
    assert len(result.tokens) == 4
    assert all(tokens > 2 for tokens in result.tokens)
    assert result.model == "sentence-transformers/all-MiniLM-L6-v2"


@pytest.mark.parametrize("dimensions", [None, 128])
async def test_cosine_rankings_survive_every_encoding(
    kafka: LocalKafka, worker: WorkerProcess, dimensions: int | None
) -> None:
    """Over 100 STS-B pairs spread across the score range, the pair similarities computed
    from float16, int8 and binary vectors rank the pairs like the float32 cosines do
    (Spearman), and correlate with the human scores about as well."""
    pairs = sts_pairs(100)
    texts = [pair.first for pair in pairs] + [pair.second for pair in pairs]
    gold = [pair.score for pair in pairs]
    n = len(pairs)
    async with EmbedClient(kafka.bootstrap_servers) as client:
        full = (await client.embed(texts, timeout=120, dimensions=dimensions)).astype(np.float64)
        halves = await client.embed(texts, timeout=120, dimensions=dimensions, encoding="float16")
        codes = await client.embed(texts, timeout=120, dimensions=dimensions, encoding="int8")
        bits = await client.embed(texts, timeout=120, dimensions=dimensions, encoding="binary")
    dim = dimensions or DIM

    reference = cosines(full[:n], full[n:])
    similarities = {
        "float16": cosines(halves[:n].astype(np.float64), halves[n:].astype(np.float64)),
        "int8": cosines(codes[:n].astype(np.float64), codes[n:].astype(np.float64)),
        "binary": [
            1 - float(hamming_distances(bits[i : i + 1], bits[n + i : n + i + 1])[0, 0]) / dim
            for i in range(n)
        ],
    }
    reference_vs_gold = spearmanr(reference, gold).statistic
    assert reference_vs_gold > 0.7  # 0.77 measured for these pairs
    floors = {"float16": 0.999, "int8": 0.99, "binary": 0.9}
    losses = {"float16": 0.005, "int8": 0.01, "binary": 0.06}
    for name, values in similarities.items():
        assert spearmanr(values, reference).statistic >= floors[name], name
        assert spearmanr(values, gold).statistic >= reference_vs_gold - losses[name], name


async def test_unknown_encoding_is_refused_by_the_sdk_and_by_the_worker(
    kafka: LocalKafka, worker: WorkerProcess
) -> None:
    """The SDK refuses an unknown encoding before sending; a raw request with one gets an
    invalid_request error result from the worker, which keeps serving."""
    replies = "test.encodings.replies"
    kafka.create_topics([TopicSpec(replies, 1)])
    async with EmbedClient(kafka.bootstrap_servers) as client:
        with pytest.raises(ValueError, match="float32, float16, int8, binary"):
            await client.embed(["text"], timeout=60, encoding="int4")
        request_id = f"bad-encoding-{uuid.uuid4().hex[:8]}"
        body = {"v": 1, "id": request_id, "inputs": ["text"], "encoding": "int4"}
        async with producer(kafka.bootstrap_servers) as raw:
            await raw.send_and_wait(
                "embed.requests", msgpack.packb({**body, "reply_to": replies}), partition=0
            )
        records = await collect(
            kafka.bootstrap_servers,
            replies,
            lambda rs: any(decode_result(r.value).id == request_id for r in rs),
        )
        answers = [decode_result(r.value) for r in records]
        answer = next(a for a in answers if a.id == request_id)
        assert isinstance(answer, ErrorResult)
        assert answer.error.code == "invalid_request"
        assert "encoding" in answer.error.message
        assert (await client.embed(["still serving"], timeout=60, encoding="int8")).shape == (
            1,
            DIM,
        )


async def test_a_worker_that_ignores_encoding_raises_unexpected_encoding(
    kafka: LocalKafka,
) -> None:
    """A worker that predates encodings ignores the field and answers float32; the SDK
    raises UnexpectedEncodingError instead of handing back float32 as int8."""
    topic = "test.encodings.old-worker"
    kafka.create_topics([TopicSpec(topic, 1)])
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, group_id=None)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        await consumer.position(tp)  # pinned before the request goes out

        async def old_worker() -> None:
            record = await consumer.getone()
            request = embed_request(record.value)
            assert request.encoding == "int8"  # the field reached the worker...
            answer = EmbedResult(  # ...which answers float32 anyway, as old workers do
                id=request.id,
                model="m",
                dim=2,
                vectors=np.zeros((1, 2), "<f4").tobytes(),
                tokens=(3,),
            )
            async with producer(kafka.bootstrap_servers) as out:
                await out.send_and_wait(
                    request.reply_topic,
                    encode_result(answer),
                    partition=request.reply_partition,
                    headers=routing_headers(request.id),
                )

        async with EmbedClient(kafka.bootstrap_servers, requests_topic=topic) as client:
            serving = asyncio.create_task(old_worker())
            with pytest.raises(UnexpectedEncodingError) as caught:
                await client.embed(["text"], timeout=60, encoding="int8")
            await serving
        assert caught.value.asked == "int8"
        assert caught.value.got == "float32"
        assert not isinstance(caught.value, EmbedError)
    finally:
        await consumer.stop()


def test_cli_embed_prints_int8_codes_and_scales(kafka: LocalKafka, worker: WorkerProcess) -> None:
    """`kembed embed --encoding int8` prints the codes and one scale per text as JSON."""
    out = run_kembed(
        "embed",
        "--bootstrap-servers",
        kafka.bootstrap_servers,
        "--encoding",
        "int8",
        "--dimensions",
        "16",
        "first text",
        "second text",
    )
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    assert printed["encoding"] == "int8"
    assert printed["dim"] == 16
    codes = np.array(printed["vectors"])
    assert codes.shape == (2, 16)
    assert np.all(np.abs(codes) <= 127)
    assert printed["scales"] == pytest.approx([1 / 127, 1 / 127])
