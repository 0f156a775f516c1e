"""Ingestion against the real broker and a real worker: ``kembed ingest`` of STS-B
sentences answered once per document, ``submit`` returning before any answer exists, and
the command's fail-fast and skip modes leaving exactly the acknowledged requests in Kafka."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loadtest.data import stsb_dir
from producer_sdk import EmbedClient
from schemas import EmbedResult, Result, decode_result
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import ROOT, WorkerProcess, embed_request
from tests.integration.kafka_io import read_all
from worker.quality import load_pairs

pytestmark = pytest.mark.integration

# `kembed ...` as a process, importing this checkout's code (the installed entry point
# may belong to another checkout).
KEMBED = [sys.executable, "-m", "kembed_cli"]


def _kembed_ingest(
    kafka: LocalKafka, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KEMBED, "ingest", *args],
        cwd=ROOT,
        env={**os.environ, "KEMBED_BOOTSTRAP_SERVERS": kafka.bootstrap_servers},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


async def _results(kafka: LocalKafka, topic: str, count: int, timeout: float = 180) -> list[Result]:
    """Every result on ``topic`` once at least ``count`` are there (or the time is up)."""
    deadline = time.monotonic() + timeout
    while True:
        records = await read_all(kafka.bootstrap_servers, topic)
        if len(records) >= count or time.monotonic() > deadline:
            return [decode_result(record.value) for record in records]
        await asyncio.sleep(0.5)


def _sentences(count: int) -> list[str]:
    pairs = load_pairs(stsb_dir() / "stsb-en-test.csv")
    unique = list(dict.fromkeys(s for p in pairs for s in (p.first, p.second)))
    return unique[:count]


async def test_kembed_ingest_answers_each_document_once_with_its_key_and_metadata(
    kafka: LocalKafka, worker: WorkerProcess, reference_model: Any, tmp_path: Path
) -> None:
    """300 STS-B sentences through `kembed ingest` in requests of 64: one result per
    request on the reply topic, every document id exactly once as a key, its metadata at
    the same row of meta.docs, and vectors matching in-process sentence-transformers."""
    reply_topic = "test.ingest.docs"
    kafka.create_topics([TopicSpec(reply_topic, 3)])
    sentences = _sentences(300)
    path = tmp_path / "docs.jsonl"
    with path.open("w", encoding="utf-8") as file:
        for i, sentence in enumerate(sentences):
            doc = {"id": f"doc-{i:04d}", "body": sentence, "row": i, "source": "stsb-test"}
            file.write(json.dumps(doc) + "\n")

    done = _kembed_ingest(
        kafka,
        str(path),
        "--text-field",
        "body",
        "--meta-field",
        "row",
        "--meta-field",
        "source",
        "--reply-to",
        reply_topic,
        "--batch-size",
        "64",
    )
    assert done.returncode == 0, done.stderr
    assert "ingested 300 documents in 5 requests" in done.stdout
    assert done.stderr == ""  # no progress bar when stderr is not a terminal

    results = await _results(kafka, reply_topic, 5)
    await asyncio.sleep(2)  # anything extra (a duplicate) would arrive by now
    results = await _results(kafka, reply_topic, 5, timeout=0)
    assert len(results) == 5
    texts: dict[str | int, str] = {f"doc-{i:04d}": s for i, s in enumerate(sentences)}
    seen: list[str | int] = []
    rows: list[np.ndarray[Any, Any]] = []
    for result in results:
        assert isinstance(result, EmbedResult), result
        assert result.keys is not None
        assert result.meta is not None
        # The version sinks order rows by: the request's record timestamp (just now).
        assert result.requested_ms is not None
        assert abs(result.requested_ms - time.time() * 1000) < 600_000
        assert result.count == len(result.keys)
        docs = result.meta["docs"]
        assert len(docs) == len(result.keys)
        for key, doc in zip(result.keys, docs, strict=True):
            assert key == f"doc-{doc['row']:04d}"
            assert doc["source"] == "stsb-test"
        seen.extend(result.keys)
        rows.append(np.frombuffer(result.vectors, "<f4").reshape(result.count, result.dim))
    assert sorted(seen) == sorted(texts)  # each document exactly once

    vectors = np.concatenate(rows)
    reference = reference_model.encode(
        [texts[key] for key in seen], batch_size=32, normalize_embeddings=True
    )
    cosines = np.sum(vectors * reference, axis=1)
    assert cosines.min() >= 0.9999, f"worst cosine {cosines.min():.6f}"


async def test_submit_returns_before_the_answer_exists(kafka: LocalKafka, tmp_path: Path) -> None:
    """With no worker on the topics, submit() returns the id of a request that is in Kafka;
    a worker started afterwards answers it on reply_to with its keys and metadata."""
    requests, bulk, replies = "test.later.requests", "test.later.bulk", "test.later.results"
    kafka.create_topics([TopicSpec(requests, 1), TopicSpec(bulk, 2), TopicSpec(replies, 2)])
    async with EmbedClient(kafka.bootstrap_servers, bulk_topic=bulk, read_replies=False) as client:
        request_id = await client.submit(
            ["a first document", "a second document"],
            keys=[11, "twelve"],
            metadata=[{"title": "first"}, None],
            meta={"batch": "b-1"},
            reply_to=replies,
        )
    [sent] = await read_all(kafka.bootstrap_servers, bulk)
    assert embed_request(sent.value).id == request_id
    assert await read_all(kafka.bootstrap_servers, replies) == []

    late_worker = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path / "worker.log",
        dtype="float32",
        requests_topic=requests,
        bulk_topic=bulk,
        group_id="test-ingest-later",
    )
    try:
        late_worker.wait_ready()
        [result] = await _results(kafka, replies, 1, timeout=120)
    finally:
        late_worker.stop()
    assert isinstance(result, EmbedResult), result
    assert result.id == request_id
    assert result.keys == (11, "twelve")
    assert result.meta == {"batch": "b-1", "docs": [{"title": "first"}, {}]}
    assert (result.count, result.dim) == (2, 384)


async def test_kembed_ingest_fails_fast_on_a_bad_line_after_sending_what_came_before(
    kafka: LocalKafka,
) -> None:
    """A bad line stops the command with status 2 and its line number; the batches before
    it were acknowledged, are in the topic, and the message says how many documents."""
    topic = "test.ingest.failfast"
    kafka.create_topics([TopicSpec(topic, 1)])
    lines = [json.dumps({"id": i, "text": f"document {i}"}) for i in range(1, 5)]
    lines.append('{"id": 5, "text": 42}')
    lines.append(json.dumps({"id": 6, "text": "never sent"}))
    done = _kembed_ingest(
        kafka, "-", "--topic", topic, "--batch-size", "2", stdin="\n".join(lines) + "\n"
    )
    assert done.returncode == 2, done.stderr
    assert "<stdin>:5: field 'text' must be a string, got a number" in done.stderr
    assert "4 documents in 2 requests were acknowledged" in done.stderr
    requests = [embed_request(r.value) for r in await read_all(kafka.bootstrap_servers, topic)]
    assert [key for request in requests for key in request.keys or ()] == [1, 2, 3, 4]


async def test_kembed_ingest_skips_bad_lines_when_asked(kafka: LocalKafka) -> None:
    """--skip-invalid sends every good line, exits 0 and reports the skipped ones."""
    topic = "test.ingest.skip"
    kafka.create_topics([TopicSpec(topic, 1)])
    stdin = '{"id": "a", "text": "one"}\nnot json\n{"id": "b"}\n{"id": "c", "text": "three"}\n'
    done = _kembed_ingest(kafka, "-", "--topic", topic, "--skip-invalid", "--quiet", stdin=stdin)
    assert done.returncode == 0, done.stderr
    assert "ingested 2 documents in 1 request " in done.stdout
    assert "skipped 2 invalid lines" in done.stderr
    assert "<stdin>:2: not valid JSON" in done.stderr
    assert "<stdin>:3: no field 'text'" in done.stderr
    [record] = await read_all(kafka.bootstrap_servers, topic)
    assert embed_request(record.value).keys == ("a", "c")
