"""Chunked ingestion end to end (real broker, worker, model, sink and PostgreSQL): a
20,000-word document goes through ``kembed ingest --chunk-tokens`` to rows ``{key}#{k}``
whose spans reproduce the text; re-ingesting a shorter version removes the extra chunks;
and retrieval over long STS-B documents finds a sentence's paraphrase's document more
often with chunking than with truncation (both measured in the same run)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from loadtest.chunk_retrieval import build_corpus, long_document, measure
from producer_sdk import Document, EmbedClient, ingest
from schemas import Chunking
from scripts.kafka_local import LocalKafka, TopicSpec
from scripts.pg_local import LocalPostgres
from tests.conftest import ROOT, WorkerProcess
from tests.integration.sink_helpers import SinkProcess, wait_drained

pytestmark = pytest.mark.integration

CHUNKING = Chunking(256, 32)


def _chunk_rows(postgres: LocalPostgres, table: str, key: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(postgres.dsn, password=postgres.password) as conn:
        return conn.execute(
            f"SELECT id, metadata, vector::text, requested_ms FROM {table} "
            "WHERE metadata->>'doc_key' = %s ORDER BY (metadata->>'chunk_index')::int",
            [key],
        ).fetchall()


def _check_spans(rows: list[tuple[Any, ...]], key: str, text: str) -> list[tuple[int, int]]:
    """Rows key#0..n-1 in order; their spans, increasing and overlapping, reproduce the
    text (each chunk's part past the previous chunk's end, concatenated)."""
    assert [row[0] for row in rows] == [f"{key}#{k}" for k in range(len(rows))]
    spans = [(row[1]["start_char"], row[1]["end_char"]) for row in rows]
    assert [row[1]["chunk_index"] for row in rows] == list(range(len(rows)))
    assert spans[0][0] == 0
    assert spans[-1][1] == len(text)
    rebuilt = text[: spans[0][1]]
    for (start, end), (_, before_end) in zip(spans[1:], spans, strict=False):
        assert start < before_end < end  # overlap, and progress
        rebuilt += text[before_end:end]
    assert rebuilt == text
    return spans


def test_a_20000_word_document_round_trips_to_pgvector_and_shrinks(
    kafka: LocalKafka,
    worker: WorkerProcess,
    postgres: LocalPostgres,
    reference_model: Any,
    tmp_path: Path,
) -> None:
    """kembed ingest --chunk-tokens 256 --chunk-overlap 32 of one 20,000-word document:
    rows long#0..n-1 in pgvector with the document's metadata, spans that reproduce the
    text, vectors of the chunk texts; then ingest() of a 2,000-word version of the same id:
    rows long#0..m-1 of the new text only."""
    topic, group, table = "embed.results.chunks20k", "sink-chunks20k", "chunks20k"
    kafka.create_topics([TopicSpec(topic, 2), TopicSpec(f"{topic}.dlq", 1)])
    text = long_document(20_000)
    source = tmp_path / "long.jsonl"
    source.write_text(json.dumps({"id": "long", "text": text, "title": "STS-B"}) + "\n")
    sink = SinkProcess(
        kafka.bootstrap_servers,
        tmp_path / "sink.log",
        target=postgres.dsn,
        target_password=postgres.password,
        table=table,
        results_topic=topic,
        group_id=group,
    )
    try:
        sink.wait_ready(timeout=90)
        done = subprocess.run(
            [
                *(sys.executable, "-m", "kembed_cli", "ingest", str(source)),
                *("--reply-to", topic, "--meta-field", "title"),
                *("--chunk-tokens", "256", "--chunk-overlap", "32"),
            ],
            cwd=ROOT,
            env={**os.environ, "KEMBED_BOOTSTRAP_SERVERS": kafka.bootstrap_servers},
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        asyncio.run(wait_drained(kafka.bootstrap_servers, topic, group, 1, sink))
        long_rows = _chunk_rows(postgres, table, "long")
        shorter = long_document(2_000)

        async def reingest() -> None:
            async with EmbedClient(kafka.bootstrap_servers, read_replies=False) as client:
                await ingest(client, [Document(shorter, "long")], reply_to=topic, chunking=CHUNKING)

        asyncio.run(reingest())
        asyncio.run(wait_drained(kafka.bootstrap_servers, topic, group, 2, sink))
        short_rows = _chunk_rows(postgres, table, "long")
    finally:
        sink.stop()

    spans = _check_spans(long_rows, "long", text)
    assert len(spans) > 100  # ~26,000 tokens in windows of 254
    assert {row[1]["title"] for row in long_rows} == {"STS-B"}
    picked = [0, len(spans) // 2, len(spans) - 1]
    reference = reference_model.encode(
        [text[spans[k][0] : spans[k][1]] for k in picked], normalize_embeddings=True
    )
    stored = np.array([json.loads(long_rows[k][2]) for k in picked], dtype=np.float32)
    assert np.sum(stored * reference, axis=1).min() > 0.9999

    _check_spans(short_rows, "long", shorter)
    assert 5 < len(short_rows) < len(long_rows) // 5
    assert min(row[3] for row in short_rows) > max(row[3] for row in long_rows)
    with psycopg.connect(postgres.dsn, password=postgres.password) as conn:
        (total,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone() or (0,)
    assert total == len(short_rows)  # the longer version's extra chunks are gone


def test_chunking_finds_the_paraphrases_document_more_often_than_truncation(
    kafka: LocalKafka, worker: WorkerProcess, record_property: Callable[[str, object], None]
) -> None:
    """12 documents of 30 STS-B sentences (~300 words, over the model's 256-token window),
    4 paraphrase queries each: top-1 document accuracy with chunking (max-sim over the
    document's chunk rows) exceeds that with truncation (one row per document)."""
    topic = "embed.results.chunking-test"
    kafka.create_topics([TopicSpec(topic, 1)])
    corpus = build_corpus(12, 30, 4, seed=3)
    outcome = asyncio.run(
        measure(kafka.bootstrap_servers, corpus, Chunking(128, 16), results_topic=topic)
    )
    record_property("chunked_top1", outcome.chunked_top1)
    record_property("truncated_top1", outcome.truncated_top1)
    assert outcome.queries == 48
    assert outcome.chunks > outcome.documents
    assert outcome.chunked_top1 > outcome.truncated_top1, outcome
