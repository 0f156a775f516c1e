"""Ingestion of sparse vectors, without Kafka: ``ingest(sparse_model=...)`` sends each
batch as a sparse request too (same keys, metadata, reply topic and meta), ``dense=False``
the sparse requests only, and ``kembed ingest --sparse-model`` passes its flags through."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kembed_cli.commands import ingest as ingest_command
from kembed_cli.main import main
from producer_sdk import Document, ingest
from schemas import Chunking
from tests.support.sdk import FakeClient


def _documents(count: int) -> list[Document]:
    return [Document(f"text {i}", i, {"n": i} if i % 2 else None) for i in range(count)]


async def test_each_batch_goes_dense_then_sparse_with_the_same_keys() -> None:
    client = FakeClient(delay=0)
    summary = await ingest(
        client,
        _documents(10),
        batch_size=4,
        reply_to="embed.ingest.docs",
        meta={"source": "s"},
        model="minilm",
        sparse_model="splade",
        sparse_top_k=64,
    )
    assert client.methods == ["submit", "submit_sparse"] * 3
    assert (summary.documents, summary.requests) == (10, 6)
    dense, sparse = client.calls[0::2], client.calls[1::2]
    for (dense_texts, d), (sparse_texts, s) in zip(dense, sparse, strict=True):
        assert dense_texts == sparse_texts
        assert (d["keys"], d["metadata"]) == (s["keys"], s["metadata"])
        assert d["reply_to"] == s["reply_to"] == "embed.ingest.docs"
        assert d["meta"] == s["meta"] == {"source": "s"}
        assert (d["model"], s["model"], s["top_k"], s["bulk"]) == ("minilm", "splade", 64, True)
    assert [key for _, call in sparse for key in call["keys"]] == list(range(10))


async def test_dense_false_sends_the_sparse_requests_only() -> None:
    client = FakeClient(delay=0)
    summary = await ingest(client, _documents(5), batch_size=2, sparse_model="splade", dense=False)
    assert client.methods == ["submit_sparse"] * 3
    assert summary.requests == 3


async def test_a_pooled_chunked_ingestion_keeps_its_convention_off_the_sparse_requests() -> None:
    client = FakeClient(delay=0)
    await ingest(
        client,
        _documents(2),
        chunking=Chunking(64),
        chunk_pooling="mean",
        sparse_model="splade",
    )
    dense, sparse = client.calls
    assert dense[1]["meta"] == {"chunk_pooling": "mean"}
    assert dense[1]["chunking"] == Chunking(64)
    assert sparse[1]["meta"] is None
    assert "chunking" not in sparse[1]


async def test_a_sparse_batch_too_large_is_split_like_a_dense_one() -> None:
    client = FakeClient(delay=0, max_bytes=14)  # two texts of 6 characters fit, not four
    summary = await ingest(client, _documents(4), batch_size=4, sparse_model="splade")
    assert client.methods == ["submit"] * 2 + ["submit_sparse"] * 2
    assert [len(texts) for texts, _ in client.calls] == [2, 2, 2, 2]
    assert summary.requests == 4


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dense": False}, "dense=False needs sparse_model"),
        ({"sparse_top_k": 8}, "sparse_top_k needs sparse_model"),
    ],
)
async def test_sparse_options_without_a_sparse_model_are_refused(
    options: dict[str, Any], message: str
) -> None:
    client = FakeClient(delay=0)
    with pytest.raises(ValueError, match=message):
        await ingest(client, _documents(1), **options)
    assert client.calls == []


def test_the_cli_passes_the_sparse_flags_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": 1, "text": "a"}\n', encoding="utf-8")
    commands: list[ingest_command.IngestCommand] = []

    def run(command: ingest_command.IngestCommand, *args: Any, **kwargs: Any) -> int:
        commands.append(command)
        return 0

    monkeypatch.setattr(ingest_command, "run_ingest_command", run)
    argv = ["ingest", str(path), "--sparse-model", "splade", "--sparse-top-k", "256"]
    assert main(argv) == 0
    assert main([*argv, "--no-dense"]) == 0
    assert [(c.sparse_model, c.sparse_top_k, c.dense) for c in commands] == [
        ("splade", 256, True),
        ("splade", 256, False),
    ]
    assert main(["ingest", str(path)]) == 0
    assert (commands[-1].sparse_model, commands[-1].dense) == (None, True)
