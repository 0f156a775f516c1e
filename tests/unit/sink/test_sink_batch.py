"""The sink's batch loop with fakes of its ports: what is written, dead-lettered and
committed, and in which order (the order is the delivery guarantee)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import structlog
from aiokafka import errors as kafka_errors

import schemas.headers as hdr
from kembed_cli.commands import sink as sink_cli
from kembed_shared.kafka.commit_errors import FatalCommitError
from kembed_shared.observability.probes import Probes
from kembed_shared.ports import Record, TopicPartition
from kembed_shared.settings import KafkaClientSettings
from schemas import EmbedResult, ErrorCode, ErrorInfo, ErrorResult, encode_result
from sink import app as sink_app
from sink.consumer import Sink
from sink.metrics import SinkMetrics
from sink.rows import Row
from sink.settings import SinkSettings
from sink.store import DimensionMismatchError, Metric, RowsRefusedError, TransientWriteError
from tests.support.kafka import FakePublisher
from tests.support.kafka import FakeSource as SharedSource

TOPIC = "embed.ingest.docs"  # the sink's default results topic


class Log:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []


class FakeSource(SharedSource):
    """The sink's consumer: two partitions, commits noted in the call log."""

    def __init__(self, log: Log) -> None:
        super().__init__({(TOPIC, 0), (TOPIC, 1)})
        self.log = log

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        self.log.calls.append(("commit", dict(offsets)))


def dead_letter_publisher(log: Log) -> FakePublisher:
    """The dead-letter publisher: each message's error code noted in the call log."""

    def noted(topic: str, headers: dict[str, bytes]) -> None:
        log.calls.append(("dead_letter", headers[hdr.DLQ_ERROR_CODE].decode()))

    return FakePublisher(on_send=noted)


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


BULK_LANE = ((hdr.LANE, b"bulk"),)
"""What a worker stamps on the result of a bulk request (the only ones a sink writes)."""


def record(
    offset: int,
    value: bytes,
    partition: int = 0,
    headers: tuple[tuple[str, bytes], ...] = BULK_LANE,
) -> Record:
    return Record(TOPIC, partition, offset, value, headers=headers, timestamp_ms=1)


def make_sink(
    store: FakeStore, log: Log, **settings: Any
) -> tuple[Sink, FakePublisher, SinkMetrics]:
    publisher = dead_letter_publisher(log)
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
    assert store.rows["a"].dense.tolist() == [1.0, 0.25, 0.25]
    topic, value, headers = publisher.sent[0]
    assert topic == f"{TOPIC}.dlq"
    assert value == encode_result(error)
    assert headers[hdr.DLQ_TOPIC] == TOPIC.encode()
    assert (headers[hdr.DLQ_PARTITION], headers[hdr.DLQ_OFFSET]) == (b"0", b"11")
    assert metrics.rows.labels("docs")._value.get() == 3
    assert metrics.dlq_messages.labels("unknown_model")._value.get() == 1


async def test_only_results_of_the_bulk_lane_are_written_the_rest_dead_lettered() -> None:
    """A result whose request came on the interactive lane (kembed.lane: interactive), or
    that no worker stamped (no kembed.lane: written to the topic by anyone else), is not
    written whatever keys and vectors it holds: dead-lettered with not_bulk_lane, naming
    what it carried, and counted; bulk results around it are written."""
    log = Log()
    store = FakeStore(log)
    sink, publisher, metrics = make_sink(store, log)
    interactive = ((hdr.CORRELATION_ID, b"r2"), (hdr.LANE, b"interactive"))
    await sink._batch(
        [
            record(0, vectors_result("r1", ("a",), 0.5)),
            record(1, vectors_result("r2", ("chosen",), 0.5), headers=interactive),
            record(2, vectors_result("r3", ("forged",), 0.5), headers=()),
            record(3, vectors_result("r4", ("b",), 0.5)),
        ]
    )
    assert log.calls == [
        ("create", (3, "cosine")),
        ("upsert", ["a", "b"]),
        ("dead_letter", "not_bulk_lane"),
        ("dead_letter", "not_bulk_lane"),
        ("commit", {(TOPIC, 0): 4}),
    ]
    assert set(store.rows) == {"a", "b"}
    messages = [headers[hdr.DLQ_ERROR_MESSAGE].decode() for _, _, headers in publisher.sent]
    assert "kembed.lane: interactive" in messages[0]
    assert "no kembed.lane" in messages[1]
    assert metrics.dlq_messages.labels("not_bulk_lane")._value.get() == 2


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
    both partitions' offsets are committed. A key seen twice with one requested_ms keeps
    the row of the larger request id (the tie-break), whatever the order."""
    log = Log()
    store = FakeStore(log, dim=3)
    sink, _, metrics = make_sink(store, log)
    newer = record(7, vectors_result("new", ("a", "b"), 0.5, requested_ms=2_000), partition=1)
    older = record(4, vectors_result("old", ("a", "c"), 0.25, requested_ms=1_000), partition=0)
    tie = record(8, vectors_result("new-tie", ("b",), 0.75, requested_ms=2_000), partition=1)
    await sink._batch([newer, older, tie] if newer_first else [older, tie, newer])
    assert [sorted(ids) for call, ids in log.calls if call == "upsert"] == [["a", "b", "c"]]
    assert store.rows["a"].requested_ms == 2_000
    assert store.rows["a"].dense.tolist() == [1.0, 0.5, 0.5]
    assert store.rows["b"].dense.tolist() == [1.0, 0.75, 0.75]
    assert store.rows["c"].requested_ms == 1_000
    assert log.calls[-1] == ("commit", {(TOPIC, 0): 5, (TOPIC, 1): 9})
    assert metrics.results.labels("written")._value.get() == 3


# ------------------------------------------------------------------ commit failures


class ScriptedSource(FakeSource):
    """Polls return ``batches`` one by one, then nothing (and the sink is told to stop);
    commits raise ``commit_errors`` one by one (None: it succeeds), then succeed.
    ``before_poll[n]`` runs inside the n-th poll (0-based), as a rebalance does in
    aiokafka's."""

    def __init__(
        self,
        log: Log,
        batches: list[list[Record]],
        commit_errors: list[BaseException | None],
    ) -> None:
        super().__init__(log)
        self.batches = batches
        self.commit_errors = commit_errors
        self.stop: Callable[[], None] = lambda: None
        self.before_poll: dict[int, Callable[[], Awaitable[None]]] = {}
        self.polls = 0
        self.attempts = 0
        self.commit_delay_s = 0.0

    async def poll(self, timeout_ms: int, max_records: int) -> list[Record]:
        hook = self.before_poll.get(self.polls)
        self.polls += 1
        if hook is not None:
            await hook()
        if self.batches:
            return self.batches.pop(0)
        self.stop()
        await asyncio.sleep(0)
        return []

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        self.attempts += 1
        await asyncio.sleep(self.commit_delay_s)
        error = self.commit_errors.pop(0) if self.commit_errors else None
        if error is not None:
            self.log.calls.append(("commit_failed", type(error).__name__))
            raise error
        await super().commit(offsets)


def scripted_sink(
    batches: list[list[Record]], commit_errors: list[BaseException | None], **settings: Any
) -> tuple[Sink, ScriptedSource]:
    """A sink over a scripted source, that stops once the script has run out."""
    log = Log()
    source = ScriptedSource(log, batches, commit_errors)
    sink = Sink(
        source=source,
        publisher=dead_letter_publisher(log),
        store=FakeStore(log, dim=3),
        settings=SinkSettings(**{"target": "postgresql://u@h/db", **settings}),
        metrics=SinkMetrics(),
        executor=ThreadPoolExecutor(1),
        table_dim=3,
    )
    source.stop = sink.stop
    return sink, source


def one_result(offset: int) -> list[Record]:
    return [record(offset, vectors_result(f"r{offset}", ("a",), 0.5))]


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """run_sink configures logging for the process: put it back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    config = structlog.get_config()
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.configure(**config)


@pytest.mark.usefixtures("restored_logging")
def test_a_fatal_commit_failure_fails_health_logs_one_error_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The broker refuses the commit for good (the group's ACL was removed): the sink does
    not retry it at every poll. /health fails at once, one error event says what to fix,
    and ``kembed sink`` exits with status 1, for the orchestrator to restart it."""
    sink, source = scripted_sink(
        [one_result(0), one_result(1)],
        [kafka_errors.GroupAuthorizationFailedError("kembed-sink")],
    )
    health: list[tuple[int, dict[str, Any]]] = []

    async def serve(  # run_sink's body, minus Kafka and the database
        settings: SinkSettings,
        kafka: KafkaClientSettings,
        metrics: SinkMetrics,
        probes: Probes,
        info: dict[str, Any],
    ) -> None:
        probes.pipeline, probes.phase = sink, "serving"
        try:
            await sink.run()
        finally:
            status, _type, body = probes.health_response()
            health.append((status, json.loads(body)))

    monkeypatch.setattr(sink_app, "_serve", serve)
    options: dict[str, Any] = {"target": "postgresql://u@h/db", "http_port": 0}
    settings = SinkSettings(**options, log_format="json")
    assert sink_cli.serve(settings, KafkaClientSettings(**{})) == sink_cli.EXIT_FAILED

    assert source.attempts == 1  # not retried
    assert source.log.calls == [
        ("upsert", ["a"]),
        ("commit_failed", "GroupAuthorizationFailedError"),
    ]
    [(status, body)] = health
    assert status == 503
    assert body["problems"] == ["sink failed: FatalCommitError"]
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    ours = [e for e in events if e["logger"].startswith("kembed")]
    alarms = [e for e in ours if e["level"] in ("warning", "error", "critical")]
    assert len(alarms) == 1, alarms
    assert alarms[0]["level"] == "error"
    assert alarms[0]["event"] == "kafka.authorization_failed"
    assert alarms[0]["error"] == "GroupAuthorizationFailedError"
    assert "ACL" in alarms[0]["reason"]
    assert "sink.stopped" not in {e["event"] for e in ours}


async def test_a_commit_refused_by_a_rebalance_is_retried_and_the_sink_goes_on() -> None:
    """A rebalance (CommitFailedError: aiokafka rejoins by itself) is benign: the offsets
    stay pending and the next commit takes them; the sink stays healthy."""
    sink, source = scripted_sink([one_result(0), one_result(1)], [kafka_errors.CommitFailedError()])
    await sink.run()
    assert source.log.calls == [
        ("upsert", ["a"]),
        ("commit_failed", "CommitFailedError"),
        ("upsert", ["a"]),
        ("commit", {(TOPIC, 0): 2}),
    ]
    assert sink.failure() is None


async def test_benign_commit_failures_that_outlast_a_rebalance_are_fatal() -> None:
    """Commits that keep failing "because the group rebalanced" for longer than a rebalance
    may take (max_poll_interval_ms + session_timeout_ms) stop the sink too."""
    sink, source = scripted_sink(
        [one_result(0), [], []],
        [kafka_errors.CommitFailedError()] * 10,
        max_poll_interval_ms=1,
        session_timeout_ms=1,
    )
    source.commit_delay_s = 0.01  # each failing commit outlasts the 2 ms "rebalance"
    with pytest.raises(FatalCommitError, match="longer than a rebalance") as caught:
        await sink.run()
    assert caught.value.kind == "commit"
    assert source.attempts == 2
    assert sink.failure() is caught.value


async def test_a_fatal_commit_failure_at_revocation_stops_the_batch_loop() -> None:
    """aiokafka logs and swallows a rebalance listener's exception: a fatal commit failure
    met while partitions are revoked fails /health at once, and the loop raises it after
    the poll in which the rebalance ran."""
    sink, source = scripted_sink(
        [one_result(0), one_result(1)],
        [kafka_errors.CommitFailedError(), kafka_errors.TopicAuthorizationFailedError(TOPIC)],
    )

    async def revoke() -> None:
        await sink.on_revoked({(TOPIC, 0)})  # returns: the failure is kept, not raised
        assert isinstance(sink.failure(), FatalCommitError)

    source.before_poll[1] = revoke  # after the first batch's commit failed benignly
    with pytest.raises(FatalCommitError) as caught:
        await sink.run()
    assert caught.value.kind == "authorization"
    assert source.log.calls == [
        ("upsert", ["a"]),
        ("commit_failed", "CommitFailedError"),
        ("commit_failed", "TopicAuthorizationFailedError"),
    ]


class BulkStore(FakeStore):
    """A store in bulk mode: an index is pending until built."""

    def __init__(self, log: Log, dim: int | None = None) -> None:
        super().__init__(log, dim)
        self.pending = True

    def build_pending_index(self) -> float | None:
        self.log.calls.append(("build_index", self.pending))
        was, self.pending = self.pending, False
        return 1.5 if was else None


class LaggingSource(FakeSource):
    def __init__(self, log: Log, lag: int) -> None:
        super().__init__(log)
        self.lag_value = lag

    def lag(self) -> dict[TopicPartition, int]:
        return dict.fromkeys(self.assignment(), self.lag_value)


async def test_bulk_mode_builds_the_index_once_when_caught_up_for_the_idle_time() -> None:
    log = Log()
    store = BulkStore(log, dim=3)
    source = LaggingSource(log, lag=5)
    sink = Sink(
        source=source,
        publisher=dead_letter_publisher(log),
        store=store,
        settings=SinkSettings.model_validate(
            {"target": "postgresql://u@h/db", "index": "after", "index_build_idle_s": 0.05}
        ),
        metrics=SinkMetrics(),
        executor=ThreadPoolExecutor(1),
        table_dim=3,
    )
    await sink._build_index_when_done()  # behind: no build
    source.lag_value = 0
    await sink._build_index_when_done()  # caught up from now on
    assert log.calls == []
    await asyncio.sleep(0.06)
    await sink._build_index_when_done()
    await asyncio.sleep(0.06)
    await sink._build_index_when_done()  # once only
    assert log.calls == [("build_index", True)]


def test_bulk_mode_is_for_postgres_targets_only() -> None:
    with pytest.raises(ValueError, match="Postgres targets only"):
        SinkSettings.model_validate({"target": "milvus:///tmp/x.db", "index": "after"})


async def test_a_pending_index_is_built_in_streaming_mode_too() -> None:
    """A sink restarted with index=streaming on a bulk-loaded table still builds it."""
    log = Log()
    sink = Sink(
        source=LaggingSource(log, lag=0),
        publisher=dead_letter_publisher(log),
        store=BulkStore(log, dim=3),
        settings=SinkSettings.model_validate(
            {"target": "postgresql://u@h/db", "index_build_idle_s": 0}
        ),
        metrics=SinkMetrics(),
        executor=ThreadPoolExecutor(1),
        table_dim=3,
    )
    await sink._build_index_when_done()
    assert log.calls == [("build_index", True)]
