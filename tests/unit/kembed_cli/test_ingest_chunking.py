"""Chunked ingestion, without Kafka: ``ingest(chunking=...)`` sizes requests by their
estimated chunks and puts the options on every request; ``submit`` writes them on the
wire; ``kembed ingest --chunk-tokens`` passes them through."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from kembed_cli.commands.ingest import IngestCommand, run_ingest_command
from kembed_cli.main import build_parser
from producer_sdk import Document, ingest
from producer_sdk.ingest import estimated_chunks
from schemas import Chunking
from tests.conftest import embed_request
from tests.support.sdk import FakeClient, offline


def test_estimated_chunks_take_three_characters_per_token_and_the_overlap() -> None:
    """Windows of max_tokens - 2 text tokens, each next one starting window - overlap on."""
    chunking = Chunking(128, 16)  # window 126, step 110
    assert estimated_chunks("x" * 3, chunking) == 1
    assert estimated_chunks("x" * 378, chunking) == 1  # 126 tokens: one window
    assert estimated_chunks("x" * 381, chunking) == 2  # 127
    assert estimated_chunks("x" * 3000, chunking) == 1 + 8  # 1000 tokens: 874 more, 110 a step
    assert estimated_chunks("x" * 3000, Chunking(128)) == 1 + 7  # 874 / 126


async def test_chunked_ingest_sizes_requests_by_estimated_chunks() -> None:
    """Documents of 9 estimated chunks, a budget of 20: two per request (the third would
    make 27); a short one fills up; a document over the budget goes alone."""
    client = FakeClient(delay=0)
    docs = [Document("x" * 3000, i) for i in range(5)] + [Document("short", 5)]
    docs.append(Document("x" * 30_000, 6))
    summary = await ingest(
        client, docs, chunking=Chunking(128, 16), chunks_per_request=20, meta={"source": "s"}
    )
    assert [call["keys"] for _, call in client.calls] == [[0, 1], [2, 3], [4, 5], [6]]
    assert summary.documents == 7
    assert {call["chunking"] for _, call in client.calls} == {Chunking(128, 16)}
    assert {call["chunk_pooling"] for _, call in client.calls} == {"none"}
    assert client.calls[0][1]["meta"] == {"source": "s"}


async def test_mean_pooled_ingest_tells_the_sink_in_meta() -> None:
    """chunk_pooling mean: meta chunk_pooling "mean" on every request (the sink then writes
    one row per document even when every document is a single chunk)."""
    client = FakeClient(delay=0)
    await ingest(
        client, [Document("a", 1)], chunking=Chunking(64), chunk_pooling="mean", meta={"s": 1}
    )
    assert client.calls[0][1]["meta"] == {"s": 1, "chunk_pooling": "mean"}
    assert client.calls[0][1]["chunk_pooling"] == "mean"


async def test_unchunked_ingest_is_batched_by_documents_as_before() -> None:
    client = FakeClient(delay=0)
    await ingest(client, [Document("x" * 30_000, i) for i in range(5)], batch_size=2)
    assert [len(call["keys"]) for _, call in client.calls] == [2, 2, 1]
    assert {call["chunking"] for _, call in client.calls} == {None}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"chunk_pooling": "mean"}, "chunk_pooling needs chunking"),
        ({"chunking": Chunking(64), "chunk_pooling": "max"}, "'none' or 'mean'"),
        ({"chunking": Chunking(64), "chunks_per_request": 0}, "chunks_per_request"),
    ],
)
async def test_ingest_refuses_bad_chunk_options(options: dict[str, Any], message: str) -> None:
    client = FakeClient(delay=0)
    with pytest.raises(ValueError, match=message):
        await ingest(client, [Document("a", 1)], **options)
    assert client.calls == []


async def test_submit_writes_chunking_on_the_wire() -> None:
    client, transport = offline()
    await client.submit(["a long text"], keys=["k"], chunking=Chunking(64, 8))
    await client.submit(["b"], keys=["k"], chunking=Chunking(32), chunk_pooling="mean")
    await client.submit(["c"], keys=["k"])
    first, second, plain = (embed_request(sent.value) for sent in transport.sent)
    assert (first.chunking, first.chunk_pooling) == (Chunking(64, 8), "none")
    assert (second.chunking, second.chunk_pooling) == (Chunking(32), "mean")
    assert (plain.chunking, plain.chunk_pooling) == (None, "none")
    with pytest.raises(ValueError, match="needs chunking"):
        await client.submit(["d"], chunk_pooling="mean")
    assert len(transport.sent) == 3


def test_cli_chunk_flags_reach_the_command() -> None:
    args = build_parser("ingest").parse_args(
        [
            *("ingest", "docs.jsonl", "--chunk-tokens", "256", "--chunk-overlap", "32"),
            *("--chunk-pooling", "mean", "--chunks-per-request", "100"),
        ]
    )
    assert (args.chunk_tokens, args.chunk_overlap, args.chunk_pooling) == (256, 32, "mean")
    assert args.chunks_per_request == 100
    plain = build_parser("ingest").parse_args(["ingest", "docs.jsonl"])
    assert (plain.chunk_tokens, plain.chunk_overlap, plain.chunk_pooling) == (None, 0, "none")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"chunk_overlap": 8}, "need --chunk-tokens"),
        ({"chunk_pooling": "mean"}, "need --chunk-tokens"),
        ({"chunk_tokens": 16, "chunk_overlap": 16}, "overlap_tokens"),
    ],
)
def test_cli_refuses_inconsistent_chunk_flags(
    tmp_path: Path, fields: dict[str, Any], message: str
) -> None:
    source = tmp_path / "docs.jsonl"
    source.write_text('{"id": 1, "text": "a"}\n')
    err = io.StringIO()
    command = IngestCommand(str(source), quiet=True, **fields)
    assert run_ingest_command(command, "127.0.0.1:1", {}, stderr=err) == 2
    assert message in err.getvalue()
