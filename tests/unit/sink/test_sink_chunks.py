"""The sink's rows for chunked results: one row per chunk, or one per input when pooled."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
from pydantic import SecretStr

from schemas import EmbedResult, encode_result
from sink.postgres import PostgresStore, copy_data
from sink.registry import parse_target
from sink.rows import Refused, Row, RowsOf, newest, rows_of
from sink.store import RowsRefusedError, TargetError, TransientWriteError

# Input "a" in two chunks, input 7 in one: three vectors, one per chunk.
CHUNK_VECTORS = np.array([[0.6, 0.8, 0.0], [0.0, -1.0, 0.0], [1.0, 0.0, 0.0]], np.float32)


def chunked(**fields: object) -> bytes:
    base: dict[str, object] = {
        "id": "req-c",
        "model": "m",
        "dim": 3,
        "vectors": CHUNK_VECTORS.astype("<f4").tobytes(),
        "tokens": (8, 6, 5),
        "keys": ("a", 7),
        "meta": {"source": "s", "docs": [{"title": "A", "chunk_index": "mine"}, None]},
        "chunks": (2, 1),
        "spans": ((0, 40), (30, 61), (0, 12)),
        "requested_ms": 1_000,
    }
    base.update(fields)
    return encode_result(EmbedResult(**base))  # type: ignore[arg-type]


def test_a_chunked_result_is_one_row_per_chunk_named_key_hash_index() -> None:
    """Chunk k of input i: row {keys[i]}#{k}, the chunk's vector, the input's metadata plus
    doc_key (the key as sent), chunk_index, start_char, end_char (these win over the
    document's own fields of those names); the row knows its document's chunk count."""
    outcome = rows_of(chunked())
    assert isinstance(outcome, RowsOf)
    assert [row.id for row in outcome.rows] == ["a#0", "a#1", "7#0"]
    for row, vector in zip(outcome.rows, CHUNK_VECTORS, strict=True):
        np.testing.assert_array_equal(row.vector, vector)
        assert row.requested_ms == 1_000
    assert outcome.rows[1].metadata == {
        "source": "s",
        "title": "A",
        "doc_key": "a",
        "chunk_index": 1,
        "start_char": 30,
        "end_char": 61,
    }
    assert outcome.rows[2].metadata == {
        "source": "s",
        "doc_key": 7,
        "chunk_index": 0,
        "start_char": 0,
        "end_char": 12,
    }
    assert [(row.doc_key, row.chunks) for row in outcome.rows] == [
        ("a", 2),
        ("a", 2),
        ("7", 1),
    ]


def test_a_mean_pooled_chunked_result_is_one_row_per_key() -> None:
    """chunk_pooling mean: one vector per input, written under keys[i] as without chunking."""
    outcome = rows_of(chunked(vectors=CHUNK_VECTORS[:2].astype("<f4").tobytes(), tokens=(14, 5)))
    assert isinstance(outcome, RowsOf)
    assert [row.id for row in outcome.rows] == ["a", "7"]
    assert outcome.rows[0].metadata == {"source": "s", "title": "A", "chunk_index": "mine"}
    assert [(row.doc_key, row.chunk_index) for row in outcome.rows] == [("a", None), ("7", None)]


@pytest.mark.parametrize(("pooled", "ids"), [(False, ["a#0", "7#0"]), (True, ["a", "7"])])
def test_single_chunk_inputs_are_told_apart_by_the_producers_meta(
    pooled: bool, ids: list[str]
) -> None:
    """Every input one chunk: the counts agree either way, so meta chunk_pooling says mean
    (ingest() sets it); it is not part of any row's metadata."""
    meta = {"chunk_pooling": "mean"} if pooled else None
    outcome = rows_of(
        chunked(
            vectors=CHUNK_VECTORS[:2].astype("<f4").tobytes(),
            tokens=(8, 5),
            chunks=(1, 1),
            spans=((0, 40), (0, 12)),
            meta=meta,
        )
    )
    assert isinstance(outcome, RowsOf)
    assert [row.id for row in outcome.rows] == ids
    assert all("chunk_pooling" not in row.metadata for row in outcome.rows)


@pytest.mark.parametrize(
    "fields",
    [
        {"keys": ("a", 7, "b")},  # keys for three inputs, chunks for two
        {"chunks": (2, 2), "spans": ((0, 1), (1, 2), (0, 1), (1, 2))},  # 3 vectors, 4 chunks
        {"meta": {"docs": [{}, {}, {}]}},  # docs per chunk, not per input
    ],
)
def test_inconsistent_chunked_results_are_refused(fields: dict[str, object]) -> None:
    outcome = rows_of(chunked(**fields))
    assert isinstance(outcome, Refused)
    assert outcome.code == "invalid_result"


def test_newest_keeps_only_the_chunks_of_a_documents_newest_version() -> None:
    """A batch with a newer, shorter version of "a" (1 chunk), an older, longer one (3) and
    a still older unchunked row "a": only the newer one's chunk stays, or the older's chunks
    1 and 2 (or its other form) would come back."""

    def chunk(key: str, index: int, chunks: int, version: int) -> Row:
        vector = np.zeros(3, np.float32)
        return Row(f"{key}#{index}", vector, {}, "m", version, doc_key=key, chunks=chunks)

    rows = [chunk("a", 0, 1, 20)] + [chunk("a", k, 3, 10) for k in range(3)]
    rows += [chunk("b", 0, 1, 5), Row("a", np.zeros(3, np.float32), {}, "m", 1)]
    kept = newest(rows)
    assert sorted((row.id, row.requested_ms) for row in kept) == [("a#0", 20), ("b#0", 5)]


def test_copy_data_adds_the_identity_columns_only_when_asked() -> None:
    """The staging copy has two more fields, doc_key (the document: the key) and
    chunk_index (NULL for a row per input); the plain form (bulk loads) keeps five."""
    rows = [
        Row("a#0", np.ones(3, np.float32), {}, "m", 1, doc_key="a", chunks=1, chunk_index=0),
        Row("b", np.ones(3, np.float32), {}, "m", 1),
    ]
    plain, staged = copy_data(rows), copy_data(rows, identity=True)
    # "a" and chunk 0 (lengths, then the text and an int4), then "b" and NULL's -1
    assert len(staged) - len(plain) == (4 + 1) + (4 + 4) + (4 + 1) + 4
    header = 19  # signature, flags, extension length
    assert (plain[header : header + 2], staged[header : header + 2]) == (b"\x00\x05", b"\x00\x07")


@pytest.mark.parametrize(("pooling", "ids"), [("mean", ["a", "7"]), ("none", ["a#0", "7#0"])])
def test_the_results_chunk_pooling_decides_rows_per_input_or_per_chunk(
    pooling: str, ids: list[str]
) -> None:
    """Every input one chunk, no ``meta`` hint: the result's own ``chunk_pooling`` says
    which rows, so a pooled document stays row "a" whether it has one chunk or more."""
    vectors = CHUNK_VECTORS[:2]
    one_each = chunked(
        vectors=vectors.astype("<f4").tobytes(),
        tokens=(8, 5),
        meta=None,
        chunks=(1, 1),
        spans=((0, 40), (0, 12)),
        chunk_pooling=pooling,
    )
    outcome = rows_of(one_each)
    assert isinstance(outcome, RowsOf)
    assert [row.id for row in outcome.rows] == ids
    if pooling == "mean":
        grown = rows_of(
            chunked(
                vectors=vectors.astype("<f4").tobytes(),
                tokens=(14, 5),
                meta=None,
                chunk_pooling="mean",
            )
        )
        assert isinstance(grown, RowsOf)
        assert [row.id for row in grown.rows] == ids


@pytest.mark.parametrize("key", ["a#1", "#", "doc#"])
def test_a_key_with_the_chunk_separator_is_refused(key: str) -> None:
    """``a#1`` would be chunk 1 of ``a``: such keys are refused (invalid_key), chunked or
    not, so one row id never names two things."""
    plain = encode_result(
        EmbedResult(id="r", model="m", dim=3, vectors=bytes(12), tokens=(1,), keys=(key,))
    )
    for message in (plain, chunked(keys=(key, 7))):
        outcome = rows_of(message)
        assert isinstance(outcome, Refused)
        assert outcome.code == "invalid_key"
        assert "'#'" in outcome.message


@pytest.mark.parametrize(
    ("error", "kind", "code"),
    [
        (psycopg.errors.DeadlockDetected, TransientWriteError, None),
        (psycopg.errors.SerializationFailure, TransientWriteError, None),
        (psycopg.errors.AdminShutdown, TransientWriteError, None),
        (psycopg.errors.TooManyConnections, TransientWriteError, None),
        (psycopg.errors.DiskFull, TransientWriteError, None),
        (psycopg.errors.ConnectionFailure, TransientWriteError, None),
        (psycopg.OperationalError, TransientWriteError, None),  # lost, no SQLSTATE
        (psycopg.errors.ProgramLimitExceeded, RowsRefusedError, "limit_exceeded"),
        (psycopg.errors.UntranslatableCharacter, RowsRefusedError, "invalid_value"),
        (psycopg.errors.CheckViolation, RowsRefusedError, "constraint_violation"),
        (psycopg.errors.DatatypeMismatch, RowsRefusedError, "statement_refused"),
        (psycopg.errors.InsufficientPrivilege, TargetError, None),
        (psycopg.errors.UndefinedTable, TargetError, None),
    ],
)
def test_postgres_write_failures_are_classified_by_sqlstate(
    error: type[psycopg.Error], kind: type[Exception], code: str | None
) -> None:
    """Retry what passes (connection, rollbacks and deadlocks, resources, shutdowns),
    dead-letter what the data causes with a code naming the cause, stop on the rest."""
    store = PostgresStore(parse_target("postgresql://u@db:5432/x", SecretStr("pw")), "t")
    classified = store._classified(0, error("refused"))
    assert type(classified) is kind
    if code is not None:
        assert isinstance(classified, RowsRefusedError)
        assert classified.code == code
    assert "pw" not in str(classified)
