"""Chunk rows in Milvus Lite (the same store code as a Milvus server): one row per chunk;
a shorter version removes the extra chunks; an older, longer one arriving late does not
bring them back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sink.milvus import MilvusStore
from sink.registry import parse_target
from tests.integration.test_sink_chunks_postgres import DIM, chunk_rows, plain_rows

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


def test_milvus_user_metadata_naming_a_document_neither_blocks_nor_erases_it(
    store: MilvusStore,
) -> None:
    """As in Postgres: identity is in the doc_key and chunk_index fields, not metadata."""
    store.upsert(plain_rows({"u1": {"doc_key": "a", "chunk_index": 0}}, version=100))
    store.upsert(plain_rows({"u2": {"doc_key": "b", "chunk_index": 5}}, version=10))
    store.upsert(chunk_rows({"a": 3, "b": 2}, version=50))
    assert _stored(store) == {
        "u1": 100,
        "u2": 10,
        **{f"a#{k}": 50 for k in range(3)},
        **{f"b#{k}": 50 for k in range(2)},
    }


def test_milvus_a_document_that_changes_form_keeps_only_its_newest_forms_rows(
    store: MilvusStore,
) -> None:
    store.upsert(chunk_rows({"a": 3}, version=10))
    store.upsert(plain_rows({"a": {}}, version=20))
    assert _stored(store) == {"a": 20}
    store.upsert(chunk_rows({"a": 2}, version=30))
    assert _stored(store) == {"a#0": 30, "a#1": 30}
    store.upsert(plain_rows({"a": {}}, version=25))  # late: older than the chunks
    store.upsert(chunk_rows({"a": 4}, version=15))
    assert _stored(store) == {"a#0": 30, "a#1": 30}


@pytest.mark.parametrize("order", ["larger_id_first", "larger_id_last"])
def test_milvus_two_versions_with_one_requested_ms_never_mix(
    store: MilvusStore, order: str
) -> None:
    small = chunk_rows({"a": 4}, version=7, seed=1)
    large = chunk_rows({"a": 2}, version=7, seed=2)  # the larger request id: wins
    first, second = (large, small) if order == "larger_id_first" else (small, large)
    store.upsert(first + second)
    assert _stored(store) == {"a#0": 7, "a#1": 7}
    store.upsert(first)
    store.upsert(second)
    assert _stored(store) == {"a#0": 7, "a#1": 7}


def test_milvus_keys_with_every_control_character_are_read_written_and_removed(
    store: MilvusStore,
) -> None:
    """Keys with each ASCII control character, a backslash, quotes: written, replaced by
    a newer version, their stale chunks removed (the filters quote them exactly)."""
    keys = [f"k{chr(code)}x" for code in range(32)] + ["k\x7f", "b\\s", 'q"t', "s't", "\\"]
    store.upsert(chunk_rows(dict.fromkeys(keys, 3), version=10))
    store.upsert(chunk_rows(dict.fromkeys(keys, 1), version=20, seed=1))
    assert _stored(store) == {f"{key}#0": 20 for key in keys}
