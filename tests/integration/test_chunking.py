"""Chunking end to end: SDK -> broker -> worker (real model, fp32) -> SDK, for documents
longer than the model's window.

One worker for the module, on its own topics, with ``max_client_batch_size`` 64 so that
a request making too many chunks is cheap to build. Before it starts, a wave of mixed
requests (chunked, mean-pooled, plain, bad numbers) is written to its topic, so that its
first poll holds them all.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt
import pytest

from loadtest.data import stsb_sentences
from producer_sdk import ChunkedEmbeddings, Chunking, EmbedClient, EmbedError
from schemas import EmbedResult, ErrorResult, decode_result
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import ROOT, WorkerProcess
from tests.integration.kafka_io import collect, producer

pytestmark = pytest.mark.integration

MAX_INPUTS = 64


def documents() -> list[str]:
    """Three documents of STS-B sentences (about 1,200, 250 and 40 words), the first with
    paragraphs, and a Chinese one."""
    en, zh = stsb_sentences("en"), stsb_sentences("zh")
    paragraphs = ["  ".join(en[i : i + 8]) for i in range(0, 120, 8)]
    return ["\n\n".join(paragraphs), " ".join(en[200:225]), " ".join(en[300:304]), "".join(zh[:30])]


@dataclass
class ChunkWorker:
    process: WorkerProcess
    requests: str
    replies: str
    wave: dict[str, dict[str, Any]]
    """The requests written before the worker started, by id."""

    def client(self, kafka: LocalKafka) -> EmbedClient:
        return EmbedClient(
            kafka.bootstrap_servers,
            requests_topic=self.requests,
            reply_topic=self.replies,
            catalog_topic=None,
        )


@pytest.fixture(scope="module")
def chunk_worker(
    kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ChunkWorker]:
    tag = uuid.uuid4().hex[:8]
    requests, replies = f"test.chunking.{tag}.requests", f"test.chunking.{tag}.replies"
    kafka.create_topics([TopicSpec(requests, 1), TopicSpec(replies, 1)])
    texts = documents()[1:3]
    base = {"v": 1, "inputs": texts, "reply_to": replies, "reply_partition": 0}
    wave = {
        f"{tag}-chunks": {
            **base,
            "keys": ["a", "b"],
            "chunking": {"max_tokens": 64, "overlap_tokens": 8},
        },
        f"{tag}-mean": {
            **base,
            "chunking": {"max_tokens": 64, "overlap_tokens": 8},
            "chunk_pooling": "mean",
        },
        f"{tag}-plain": {**base},
        f"{tag}-no-room": {**base, "chunking": {"max_tokens": 4, "overlap_tokens": 2}},
        f"{tag}-half": {**base, "chunking": {"max_tokens": 256, "overlap_tokens": 253}},
        f"{tag}-costly": {  # windows of 2 text tokens under 6 others, a token apart
            **base,
            "inputs": ["short", "twenty words make about twenty tokens " * 4],
            "prompt": "a b c d",
            "chunking": {"max_tokens": 8, "overlap_tokens": 1},
        },
        f"{tag}-too-long": {**base, "chunking": {"max_tokens": 512}},
        f"{tag}-too-many": {
            **base,
            "inputs": [" ".join(stsb_sentences("en")[:400])],
            "chunking": {"max_tokens": 32},
        },
    }

    async def write() -> None:  # before the worker starts: its first poll gets them all
        async with producer(kafka.bootstrap_servers) as client:
            for request_id, body in wave.items():
                await client.send(requests, msgpack.packb({**body, "id": request_id}), partition=0)
            await client.flush()

    asyncio.run(write())
    process = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path_factory.mktemp("chunk-worker") / "worker.log",
        dtype="float32",
        requests_topic=requests,
        bulk_topic="",
        group_id=f"chunking-{tag}",
        max_client_batch_size=MAX_INPUTS,
    )
    try:
        process.wait_ready()
        yield ChunkWorker(process, requests, replies, wave)
    finally:
        process.stop()


def reference(model: Any, texts: list[str]) -> npt.NDArray[np.float32]:
    vectors: npt.NDArray[np.float32] = model.encode(
        texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True
    )
    return vectors


def cosines(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    dots = np.sum(a * b, axis=1)
    result: npt.NDArray[np.float64] = dots / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return result


def chunk_texts(texts: list[str], chunked: ChunkedEmbeddings) -> list[str]:
    return [text[s:e] for text, item in zip(texts, chunked, strict=True) for s, e in item.spans]


async def test_chunk_vectors_equal_the_in_process_model_and_mean_is_their_mean(
    kafka: LocalKafka, chunk_worker: ChunkWorker, reference_model: Any
) -> None:
    """Long documents (English with paragraphs, Chinese) chunked at 128 tokens with 16 of
    overlap: every chunk's vector equals the in-process model's on the chunk's text
    (cosine > 0.9999), each chunk has at most 128 tokens, spans cover each document;
    mean pooling gives the normalized mean of those vectors."""
    texts = documents()
    chunking = Chunking(max_tokens=128, overlap_tokens=16)
    async with chunk_worker.client(kafka) as client:
        chunked = await client.embed(texts, chunking=chunking, timeout=120)
        mean = await client.embed(texts, chunking=chunking, chunk_pooling="mean", timeout=120)
    assert isinstance(chunked, ChunkedEmbeddings)
    assert len(chunked) == len(texts)
    assert chunked.chunks[0] >= 10
    assert chunked.chunks[2] == 1
    assert chunked.vectors.shape == (sum(chunked.chunks), 384)
    assert max(chunked.tokens) <= 128
    pieces = chunk_texts(texts, chunked)
    for text, item in zip(texts, chunked, strict=True):
        assert item.spans[0][0] == 0
        assert item.spans[-1][1] == len(text.rstrip())
        assert all(a[0] < b[0] < a[1] for a, b in pairwise(item.spans))
    expected = reference(reference_model, pieces)
    worst = cosines(chunked.vectors, expected).min()
    assert worst > 0.9999, f"worst cosine {worst:.6f}"
    tokenizer = reference_model.tokenizer
    assert [len(tokenizer(p)["input_ids"]) for p in pieces] == list(chunked.tokens)

    assert mean.shape == (len(texts), 384)
    bounds = np.cumsum((0, *chunked.chunks))
    means = np.stack([chunked.vectors[a:b].mean(axis=0) for a, b in pairwise(bounds)])
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    assert cosines(mean, means).min() > 0.99999


async def test_mixed_requests_in_one_poll_are_each_answered(
    kafka: LocalKafka, chunk_worker: ChunkWorker, reference_model: Any
) -> None:
    """The wave written before the worker started (one poll): chunked, mean-pooled and
    plain requests get their vectors; bad numbers get invalid_request naming them; a
    request making more than max_client_batch_size chunks gets too_many_inputs."""
    wave = chunk_worker.wave
    records = await collect(
        kafka.bootstrap_servers,
        chunk_worker.replies,
        lambda rs: len({decode_result(r.value).id for r in rs} & wave.keys()) == len(wave),
    )
    results = {r.id: r for r in (decode_result(record.value) for record in records) if r.id in wave}
    assert results.keys() == wave.keys()
    tag = next(iter(wave)).split("-")[0]
    chunks, mean, plain = (results[f"{tag}-{name}"] for name in ("chunks", "mean", "plain"))
    assert isinstance(chunks, EmbedResult)
    assert isinstance(mean, EmbedResult)
    assert isinstance(plain, EmbedResult)
    texts = wave[f"{tag}-chunks"]["inputs"]
    assert chunks.keys == ("a", "b")
    assert chunks.chunks is not None
    assert chunks.spans is not None
    assert chunks.chunks[0] > 1
    owners = [i for i, count in enumerate(chunks.chunks) for _ in range(count)]
    pieces = [texts[i][s:e] for i, (s, e) in zip(owners, chunks.spans, strict=True)]
    rows = np.frombuffer(chunks.vectors, dtype="<f4").reshape(-1, 384)
    assert cosines(rows, reference(reference_model, pieces)).min() > 0.9999
    assert mean.count == 2
    assert (mean.chunks, mean.spans) == (chunks.chunks, chunks.spans)
    plain_rows = np.frombuffer(plain.vectors, dtype="<f4").reshape(-1, 384)
    assert cosines(plain_rows, reference(reference_model, texts)).min() > 0.9999
    for name, code, words in (
        ("no-room", "invalid_request", "overlap_tokens' 2 must be below the window of 2"),
        ("half", "invalid_request", "at most half of max_tokens 256), not 253"),
        ("costly", "invalid_request", "more than 4 times as many (max_chunk_tokens_factor)"),
        ("too-long", "invalid_request", "exceeds the model's max_seq_length 256"),
        ("too-many", "too_many_inputs", f"more than {MAX_INPUTS} chunks"),
    ):
        error = results[f"{tag}-{name}"]
        assert isinstance(error, ErrorResult), name
        assert error.error.code == code, name
        assert words in error.error.message, (name, error.error.message)


async def test_sdk_errors_for_bad_chunking(kafka: LocalKafka, chunk_worker: ChunkWorker) -> None:
    """Through the SDK: a window over the model's maximum is invalid_request; more chunks
    than max_client_batch_size is too_many_inputs."""
    long = " ".join(stsb_sentences("en")[:300])
    async with chunk_worker.client(kafka) as client:
        with pytest.raises(EmbedError) as too_long:
            await client.embed(["text"], chunking=Chunking(257), timeout=60)
        with pytest.raises(EmbedError) as too_many:
            await client.embed([long], chunking=Chunking(16), timeout=60)
    assert too_long.value.code == "invalid_request"
    assert too_many.value.code == "too_many_inputs"


def test_cli_prints_chunks_and_spans(kafka: LocalKafka, worker: WorkerProcess) -> None:
    """`kembed embed --chunk-tokens 32 --chunk-overlap 4` (to the shared worker on the
    default topics) prints a vector per chunk with its span and tokens."""
    text = " ".join(stsb_sentences("en")[:12])
    output = subprocess.run(
        [
            sys.executable,
            "-m",
            "kembed_cli",
            "embed",
            "--bootstrap-servers",
            kafka.bootstrap_servers,
            "--chunk-tokens",
            "32",
            "--chunk-overlap",
            "4",
            text,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert output.returncode == 0, output.stderr
    printed = json.loads(output.stdout)
    assert printed["chunks"][0] == len(printed["spans"]) == len(printed["vectors"]) > 1
    assert max(printed["tokens"]) <= 32
    assert printed["spans"][0][0] == 0
    assert printed["spans"][-1][1] == len(text)
