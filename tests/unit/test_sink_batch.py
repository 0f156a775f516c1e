"""The sink's batch loop with fakes of its ports: what is written, dead-lettered and
committed, and in which order (the order is the delivery guarantee)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from schemas import EmbedResult, ErrorCode, ErrorInfo, ErrorResult, encode_result
from schemas.headers import DLQ_ERROR_CODE, DLQ_OFFSET, DLQ_PARTITION, DLQ_TOPIC
from sink.app import Sink
from sink.metrics import SinkMetrics
from sink.rows import Row
from sink.settings import SinkSettings
from sink.store import DimensionMismatchError, Metric, RowsRefusedError, TransientWriteError
from worker.ports import Record, TopicPartition

TOPIC = "embed.results.docs"


class Log:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []


class FakeSource:
    def __init__(self, log: Log) -> None:
        self.log = log

    async def poll(self, timeout_ms: int, max_records: int) -> list[Record]:
        return []

    def assignment(self) -> set[TopicPartition]:
        return {(TOPIC, 0), (TOPIC, 1)}

    def pause(self, partitions: set[TopicPartition]) -> None: ...

    def resume(self, partitions: set[TopicPartition]) -> None: ...

    def lag(self) -> dict[TopicPartition, int]:
        return {}

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        self.log.calls.append(("commit", dict(offsets)))

    def in_group(self) -> bool:
        return True


class FakePublisher:
    def __init__(self, log: Log) -> None:
        self.log = log
        self.sent: list[tuple[str, bytes, dict[str, bytes]]] = []

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        self.log.calls.append(("dead_letter", dict(headers)[DLQ_ERROR_CODE].decode()))
        self.sent.append((topic, value, dict(headers)))


class FakeStore:
    """Refuses any batch holding the id "bad"; fails transiently ``transient`` times."""

    def __init__(self, log: Log, dim: int | None = None, transient: int = 0) -> None:
        self.log = log
        self.dim = dim
        self.transient = transient
        self.rows: dict[str, Row] = {}

    @property
    def name(self) -> str:
        return "docs"

    def open(self) -> None: ...

    def table_dim(self) -> int | None:
        return self.dim

    def create(self, dim: int, metric: Metric) -> None:
        self.log.calls.append(("create", (dim, metric)))
        self.dim = dim

    def upsert(self, rows: Sequence[Row]) -> None:
        if self.transient:
            self.transient -= 1
            raise TransientWriteError("connection lost")
        if any(row.id == "bad" for row in rows):
            raise RowsRefusedError("invalid byte sequence")
        self.log.calls.append(("upsert", [row.id for row in rows]))
        self.rows.update((row.id, row) for row in rows)

    def close(self) -> None: ...


def vectors_result(
    request_id: str,
    keys: tuple[str, ...],
    value: float,
    dim: int = 3,
    requested_ms: int | None = None,
) -> bytes:
    vectors = np.full((len(keys), dim), value, "<f4")
    vectors[:, 0] = 1.0  # not unit length unless value == 0
    return encode_result(
        EmbedResult(
            id=request_id,
            model="m",
            dim=dim,
            vectors=vectors.tobytes(),
            tokens=(3,) * len(keys),
            keys=keys,
            requested_ms=requested_ms,
        )
    )


def record(offset: int, value: bytes, partition: int = 0) -> Record:
    return Record(TOPIC, partition, offset, value, timestamp_ms=1)


def make_sink(
    store: FakeStore, log: Log, **settings: Any
) -> tuple[Sink, FakePublisher, SinkMetrics]:
    publisher = FakePublisher(log)
    metrics = SinkMetrics()
    sink = Sink(
        source=FakeSource(log),
        publisher=publisher,
        store=store,
        settings=SinkSettings(**{"target": "postgresql://u@h/db", "write_retry_s": 5, **settings}),
        metrics=metrics,
        executor=ThreadPoolExecutor(1),
        table_dim=store.dim,
    )
    return sink, publisher, metrics


async def test_one_write_then_dead_letters_then_the_commit() -> None:
    """A batch: the table is created from the first result, all rows go in one upsert (a
    key seen twice keeps the later result's row), error results and garbage are
    dead-lettered with origin headers, and only then are the offsets committed."""
    log = Log()
    store = FakeStore(log)
    sink, publisher, metrics = make_sink(store, log)
    error = ErrorResult("r2", ErrorInfo(ErrorCode.UNKNOWN_MODEL, "no such model"), keys=("c",))
    await sink._batch(
        [
            record(10, vectors_result("r1", ("a", "b"), 0.5)),
            record(11, encode_result(error)),
            record(12, vectors_result("r3", ("a",), 0.25)),
            record(3, b"\xc1", partition=1),
        ]
    )
    assert log.calls == [
        ("create", (3, "cosine")),  # the vectors are not unit length
        ("upsert", ["a", "b"]),
        ("dead_letter", "unknown_model"),
        ("dead_letter", "invalid_result"),
        ("commit", {(TOPIC, 0): 13, (TOPIC, 1): 4}),
    ]
    assert store.rows["a"].vector.tolist() == [1.0, 0.25, 0.25]
    topic, value, headers = publisher.sent[0]
    assert topic == f"{TOPIC}.dlq"
    assert value == encode_result(error)
    assert headers[DLQ_TOPIC] == TOPIC.encode()
    assert (headers[DLQ_PARTITION], headers[DLQ_OFFSET]) == (b"0", b"11")
    assert metrics.rows.labels("docs")._value.get() == 3
    assert metrics.dlq_messages.labels("unknown_model")._value.get() == 1


async def test_refused_rows_are_found_result_by_result_and_dead_lettered() -> None:
    log = Log()
    store = FakeStore(log, dim=3)
    sink, _, metrics = make_sink(store, log)
    await sink._batch(
        [
            record(0, vectors_result("r1", ("a",), 0.5)),
            record(1, vectors_result("r2", ("bad", "c"), 0.5)),
            record(2, vectors_result("r3", ("d",), 0.5)),
        ]
    )
    assert log.calls == [
        ("upsert", ["a"]),
        ("upsert", ["d"]),
        ("dead_letter", "write_refused"),
        ("commit", {(TOPIC, 0): 3}),
    ]
    assert metrics.errors.labels("write_refused")._value.get() == 1


async def test_transient_write_failures_are_retried_before_anything_is_committed() -> None:
    log = Log()
    store = FakeStore(log, dim=3, transient=2)
    sink, _, metrics = make_sink(store, log)
    await sink._batch([record(0, vectors_result("r1", ("a",), 0.5))])
    assert log.calls == [("upsert", ["a"]), ("commit", {(TOPIC, 0): 1})]
    assert metrics.errors.labels("write_retry")._value.get() == 2


async def test_write_failing_past_write_retry_s_commits_nothing() -> None:
    log = Log()
    store = FakeStore(log, dim=3, transient=100)
    sink, _, _ = make_sink(store, log, write_retry_s=0)
    with pytest.raises(TransientWriteError):
        await sink._batch([record(0, vectors_result("r1", ("a",), 0.5))])
    assert log.calls == []


async def test_first_batch_of_another_dimension_stops_the_sink_uncommitted() -> None:
    log = Log()
    sink, _, _ = make_sink(FakeStore(log, dim=8), log)
    with pytest.raises(DimensionMismatchError, match="dimension 8"):
        await sink._batch([record(0, vectors_result("r1", ("a",), 0.5))])
    assert log.calls == []


async def test_later_results_of_another_dimension_are_dead_lettered() -> None:
    log = Log()
    sink, _, _ = make_sink(FakeStore(log, dim=3), log)
    await sink._batch([record(0, vectors_result("r1", ("a",), 0.5))])
    await sink._batch([record(1, vectors_result("r2", ("b",), 0.5, dim=4))])
    assert log.calls[-2:] == [("dead_letter", "dimension_mismatch"), ("commit", {(TOPIC, 0): 2})]


async def test_unit_vectors_get_an_inner_product_index_and_binary_is_refused() -> None:
    log = Log()
    sink, _, _ = make_sink(FakeStore(log), log)
    await sink._batch([record(0, vectors_result("r1", ("a",), 0.0))])
    binary = EmbedResult("r2", "m", 3, b"\x80", (3,), dtype="binary", keys=("b",))
    await sink._batch([record(1, encode_result(binary))])
    assert log.calls == [
        ("create", (3, "inner_product")),
        ("upsert", ["a"]),
        ("commit", {(TOPIC, 0): 1}),
        ("dead_letter", "unsupported_dtype"),
        ("commit", {(TOPIC, 0): 2}),
    ]


@pytest.mark.parametrize("newer_first", [True, False], ids=["newer-first", "older-first"])
async def test_the_newest_version_of_a_key_wins_inside_one_batch(newer_first: bool) -> None:
    """Two versions of a key in one poll, from two partitions, in either order: the store
    is handed the newer (larger requested_ms) only, so its never-older rule can keep it;
    both partitions' offsets are committed. A key seen twice in one version (a replay)
    keeps the later row."""
    log = Log()
    store = FakeStore(log, dim=3)
    sink, _, metrics = make_sink(store, log)
    newer = record(7, vectors_result("new", ("a", "b"), 0.5, requested_ms=2_000), partition=1)
    older = record(4, vectors_result("old", ("a", "c"), 0.25, requested_ms=1_000), partition=0)
    replay = record(8, vectors_result("again", ("b",), 0.75, requested_ms=2_000), partition=1)
    await sink._batch([newer, older, replay] if newer_first else [older, newer, replay])
    assert [sorted(ids) for call, ids in log.calls if call == "upsert"] == [["a", "b", "c"]]
    assert store.rows["a"].requested_ms == 2_000
    assert store.rows["a"].vector.tolist() == [1.0, 0.5, 0.5]
    assert store.rows["b"].vector.tolist() == [1.0, 0.75, 0.75]
    assert store.rows["c"].requested_ms == 1_000
    assert log.calls[-1] == ("commit", {(TOPIC, 0): 5, (TOPIC, 1): 9})
    assert metrics.results.labels("written")._value.get() == 3
