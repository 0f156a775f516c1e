"""The vector cache end to end: the real broker, worker and model answer repeated texts
from the cache (its metrics say so) with the very bytes of the first answer, under every
output option, across a restart with a persisted cache, and in order when a request mixes
cached and new texts; a worker whose cache volume is read-only starts and serves from
memory; a worker restarted on retrained weights of the same size and modification time
does not answer with the old weights' vectors."""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from loadtest.data import stsb_sentences
from producer_sdk import ChunkedEmbeddings, Chunking, EmbedClient
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess
from tests.unit.worker.test_cache_persistence import read_only
from worker.encoder.torch_backend import TorchEncoder
from worker.tokenization import TextTokenizer

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:6]
REQUESTS = f"test.cache.requests.{TAG}"
RESULTS = f"test.cache.results.{TAG}"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"


class CacheWorker:
    """The module's worker (cache on, persisted to ``path``), which a test may restart."""

    def __init__(self, kafka: LocalKafka, folder: Path) -> None:
        self.kafka = kafka
        self.folder = folder
        self.path = folder / "vectors.sqlite"
        self.starts = 0
        self.process = self._start()

    def _start(self) -> WorkerProcess:
        self.starts += 1
        return WorkerProcess.serving(
            self.kafka.bootstrap_servers,
            self.folder / f"worker-{self.starts}.log",
            (REQUESTS, RESULTS),
            cache_bytes=64 * 2**20,
            cache_path=str(self.path),
            group_id=f"cache-{TAG}",
        )

    def restart(self) -> None:
        assert self.process.stop() == 0
        self.process = self._start()

    def info(self) -> dict[str, Any]:
        return info(self.process)

    def counters(self) -> dict[str, float]:
        return counters(self.process)


def counters(process: WorkerProcess) -> dict[str, float]:
    """The cache's metrics of the module's model on ``process``."""
    with urllib.request.urlopen(f"{process.http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = {}
    for name in ("hits_total", "misses_total", "evictions_total", "entries", "bytes"):
        match = re.search(
            rf'^kembed_cache_{name}\{{model="{re.escape(MODEL)}"\}} (\S+)$', text, re.M
        )
        assert match is not None, name
        found[name.removesuffix("_total")] = float(match[1])
    return found


def info(process: WorkerProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"{process.http_url}/info", timeout=10) as response:
        found: dict[str, Any] = json.loads(response.read())
    return found


@pytest.fixture(scope="module")
def cache_worker(
    kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CacheWorker]:
    kafka.create_topics([TopicSpec(REQUESTS, 2), TopicSpec(RESULTS, 2)])
    worker = CacheWorker(kafka, tmp_path_factory.mktemp("cache"))
    yield worker
    assert worker.process.stop() == 0


def _client(kafka: LocalKafka) -> EmbedClient:
    return EmbedClient(kafka.bootstrap_servers, requests_topic=REQUESTS, reply_topic=RESULTS)


def _texts(start: int, count: int) -> list[str]:
    return stsb_sentences()[start : start + count]


OPTIONS: list[dict[str, object]] = [
    {},
    {"normalize": False},
    {"dimensions": 128},
    {"dimensions": 37, "encoding": "int8"},
    {"encoding": "float16"},
    {"encoding": "binary"},
    {"encoding": "int8", "normalize": False},
]


async def test_repeated_texts_come_from_the_cache_with_the_first_answers_bytes(
    kafka: LocalKafka, cache_worker: CacheWorker
) -> None:
    """The same 20 texts sent twice under each output option: every repeat is a cache hit
    (the encoder sees only the first request's texts), and each answer's vectors (and
    int8 scales, and token counts) are the first answer's, byte for byte."""
    texts = _texts(0, 20)
    before = cache_worker.counters()
    async with _client(kafka) as client:
        for options in OPTIONS:
            first = await client.embed_result(texts, timeout=60, **options)  # type: ignore[arg-type]
            again = await client.embed_result(texts, timeout=60, **options)  # type: ignore[arg-type]
            assert again.vectors.dtype == first.vectors.dtype
            assert again.vectors.tobytes() == first.vectors.tobytes(), options
            assert (again.scales is None) == (first.scales is None)
            if first.scales is not None and again.scales is not None:
                assert again.scales.tobytes() == first.scales.tobytes()
            assert again.tokens == first.tokens
    after = cache_worker.counters()
    assert cache_worker.info()["cache"] == {"max_bytes": 64 * 2**20, "persisted": True}
    # Only the very first request missed: every other option reads the same entries.
    assert after["misses"] - before["misses"] == len(texts)
    assert after["hits"] - before["hits"] == len(texts) * (2 * len(OPTIONS) - 1)
    assert after["entries"] - before["entries"] == len(texts)
    assert after["bytes"] > before["bytes"]


async def test_a_request_mixing_cached_and_new_texts_keeps_their_order(
    kafka: LocalKafka, cache_worker: CacheWorker, model_dir: Path
) -> None:
    cached = _texts(100, 3)
    new = _texts(200, 3)
    mixed = [new[0], cached[2], new[1], cached[0], cached[1], new[2]]
    async with _client(kafka) as client:
        first = await client.embed(cached, timeout=60)
        before = cache_worker.counters()
        answer = await client.embed_result(mixed, timeout=60)
    after = cache_worker.counters()
    assert after["hits"] - before["hits"] == 3
    assert after["misses"] - before["misses"] == 3
    for row, position in ((1, 2), (3, 0), (4, 1)):
        assert answer.vectors[row].tobytes() == first[position].tobytes()
    # The new texts are their own vectors (the model in-process), in their places.
    encoder = TorchEncoder(model_dir, "reference")
    tokenizer = TextTokenizer.from_model_dir(model_dir, encoder.info.max_seq_length)
    reference = encoder.encode([t.ids for t in tokenizer.encode(mixed)])
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)
    cosines = np.sum(answer.vectors * reference, axis=1)
    assert cosines.min() > 0.9999, cosines
    assert list(answer.tokens) == [len(t.ids) for t in tokenizer.encode(mixed)]


async def test_a_restarted_worker_answers_from_its_persisted_cache(
    kafka: LocalKafka, cache_worker: CacheWorker
) -> None:
    texts = _texts(300, 25)
    async with _client(kafka) as client:
        first = await client.embed_result(texts, timeout=60)
        raw = await client.embed_result(texts, timeout=60, normalize=False, encoding="int8")
    cache_worker.restart()
    started = cache_worker.counters()
    assert started["entries"] >= len(texts), "the restarted worker read the file back"
    assert started["hits"] == started["misses"] == 0
    async with _client(kafka) as client:
        again = await client.embed_result(texts, timeout=60)
        raw_again = await client.embed_result(texts, timeout=60, normalize=False, encoding="int8")
    after = cache_worker.counters()
    assert after["hits"] == 2 * len(texts)
    assert after["misses"] == 0
    assert again.vectors.tobytes() == first.vectors.tobytes()
    assert raw_again.vectors.tobytes() == raw.vectors.tobytes()
    assert raw_again.scales is not None
    assert raw.scales is not None
    assert raw_again.scales.tobytes() == raw.scales.tobytes()
    assert again.tokens == first.tokens


async def test_chunks_are_cached_as_the_inputs_they_become(
    kafka: LocalKafka, cache_worker: CacheWorker
) -> None:
    """A long document chunked twice: the second time every chunk is a hit, and the chunk
    vectors, spans and token counts are the first answer's; mean pooling over the cached
    chunks needs no encoder either."""
    document = " ".join(_texts(400, 60))
    chunking = Chunking(max_tokens=64, overlap_tokens=8)
    async with _client(kafka) as client:
        first = await client.embed([document], chunking=chunking, timeout=60)
        before = cache_worker.counters()
        again = await client.embed([document], chunking=chunking, timeout=60)
        pooled = await client.embed([document], chunking=chunking, chunk_pooling="mean", timeout=60)
    after = cache_worker.counters()
    assert isinstance(first, ChunkedEmbeddings)
    assert isinstance(again, ChunkedEmbeddings)
    chunks = sum(first.chunks)
    assert chunks >= 5
    assert after["hits"] - before["hits"] == 2 * chunks
    assert after["misses"] == before["misses"]
    assert again.vectors.tobytes() == first.vectors.tobytes()
    assert again.spans == first.spans
    assert again.tokens == first.tokens
    mean = first.vectors.astype(np.float64).mean(axis=0)
    assert float(np.asarray(pooled)[0] @ (mean / np.linalg.norm(mean))) > 0.9999


def _worker(
    kafka: LocalKafka, log: Path, topics: tuple[str, str], **settings: Any
) -> WorkerProcess:
    return WorkerProcess.serving(
        kafka.bootstrap_servers, log, topics, cache_bytes=16 * 2**20, **settings
    )


async def test_a_worker_on_a_read_only_cache_volume_starts_and_serves_from_memory(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """KEMBED_CACHE_PATH on a read-only volume holding a cache file: the worker starts
    (one warning), caches in memory (the repeat is a hit), says it is not persisted, and
    leaves the file as it was."""
    topics = (f"test.cache.ro.{TAG}", f"test.cache.ro.results.{TAG}")
    kafka.create_topics([TopicSpec(topics[0], 1), TopicSpec(topics[1], 1)])
    texts = _texts(500, 8)
    with read_only(tmp_path / "volume", fill=True) as volume:
        path = volume / "cache.sqlite"
        before = path.read_bytes()
        process = _worker(kafka, tmp_path / "worker.log", topics, cache_path=str(path))
        try:
            client = EmbedClient(
                kafka.bootstrap_servers, requests_topic=topics[0], reply_topic=topics[1]
            )
            async with client:
                first = await client.embed_result(texts, timeout=60)
                again = await client.embed_result(texts, timeout=60)
            assert again.vectors.tobytes() == first.vectors.tobytes()
            found = counters(process)
            assert (found["misses"], found["hits"]) == (len(texts), len(texts))
            assert info(process)["cache"] == {"max_bytes": 16 * 2**20, "persisted": False}
        finally:
            assert process.stop() == 0
        off = [e for e in process.events() if e.get("event") == "cache.persistence_off"]
        assert len(off) == 1, off
        assert off[0]["level"] == "warning"
        assert path.read_bytes() == before


async def test_retrained_weights_of_the_same_size_and_time_are_not_answered_from_the_file(
    kafka: LocalKafka, model_dir: Path, tmp_path: Path
) -> None:
    """A copy of the model, embedded with a persisted cache; then its weights are replaced
    by retrained ones of the same size (a few weights changed) with the old modification
    time, as ``cp -p`` of a reproducible build leaves them. The restarted worker reads no
    entry back and answers with the new weights' vectors."""
    topics = (f"test.cache.retrained.{TAG}", f"test.cache.retrained.results.{TAG}")
    kafka.create_topics([TopicSpec(topics[0], 1), TopicSpec(topics[1], 1)])
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    texts = _texts(600, 8)
    settings = {"model": str(model), "model_name": MODEL, "cache_path": str(tmp_path / "c.db")}

    async def embed(process: WorkerProcess) -> npt.NDArray[np.float32]:
        client = EmbedClient(
            kafka.bootstrap_servers, requests_topic=topics[0], reply_topic=topics[1]
        )
        async with client:
            vectors: npt.NDArray[np.float32] = (
                await client.embed_result(texts, timeout=60)
            ).vectors
        return vectors

    process = _worker(kafka, tmp_path / "worker-1.log", topics, **settings)
    try:
        old = await embed(process)
    finally:
        assert process.stop() == 0
    weights = model / "model.safetensors"
    stat = weights.stat()
    _retrain(weights)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (weights.stat().st_size, weights.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)

    process = _worker(kafka, tmp_path / "worker-2.log", topics, **settings)
    try:
        opened = process.wait_for("cache.opened")
        new = await embed(process)
        found = counters(process)
    finally:
        assert process.stop() == 0
    assert opened["entries"] == 0, "the old weights' entries were not read back"
    assert (found["hits"], found["misses"]) == (0, len(texts))
    assert new.tobytes() != old.tobytes()
    cosines = np.sum(new * old, axis=1)
    assert cosines.min() > 0.5, "still the same model, a little retrained"


def _retrain(weights: Path) -> None:
    """Scale the word embeddings of ``weights`` (a safetensors file) by 1.5, in place: the
    same size, other bytes, other vectors."""
    header = int.from_bytes(weights.read_bytes()[:8], "little")
    tensors = json.loads(weights.read_bytes()[8 : 8 + header])
    (name,) = [n for n in tensors if n.endswith("word_embeddings.weight")]
    assert tensors[name]["dtype"] == "F32"
    start, end = (8 + header + offset for offset in tensors[name]["data_offsets"])
    with weights.open("r+b") as file:
        file.seek(start)
        values = np.frombuffer(file.read(end - start), dtype=np.float32) * np.float32(1.5)
        file.seek(start)
        file.write(values.tobytes())
