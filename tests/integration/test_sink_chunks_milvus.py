"""Chunk rows in Milvus Lite (the same store code as a Milvus server): one row per chunk;
a shorter version removes the extra chunks; an older, longer one arriving late does not
bring them back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sink.milvus import MilvusStore
from sink.targets import parse_target
from tests.integration.test_sink_chunks_postgres import DIM, chunk_rows

pytestmark = pytest.mark.integration


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MilvusStore]:
    store = MilvusStore(parse_target(f"milvus://{tmp_path / 'chunks.db'}", None), "docs")
    store.open()
    store.create(DIM, "cosine")
    yield store
    store.close()


def _stored(store: MilvusStore) -> dict[str, int]:
    client = store._connected()
    hits = client.query("docs", filter='id != ""', output_fields=["requested_ms"])
    return {hit["id"]: int(hit["requested_ms"]) for hit in hits}


def test_milvus_chunks_shrink_and_an_older_version_does_not_resurrect_them(
    store: MilvusStore,
) -> None:
    store.upsert(chunk_rows({"a": 5, "b": 2}, version=10) + chunk_rows({7: 3}, version=10, seed=3))
    assert sorted(_stored(store)) == [f"7#{k}" for k in range(3)] + [
        *(f"a#{k}" for k in range(5)),
        *("b#0", "b#1"),
    ]
    store.upsert(chunk_rows({"a": 2}, version=20, seed=1) + chunk_rows({7: 1}, version=20, seed=4))
    assert _stored(store) == {"a#0": 20, "a#1": 20, "b#0": 10, "b#1": 10, "7#0": 20}
    store.upsert(chunk_rows({"a": 4}, version=15, seed=2))  # older and longer, processed late
    assert _stored(store) == {"a#0": 20, "a#1": 20, "b#0": 10, "b#1": 10, "7#0": 20}
