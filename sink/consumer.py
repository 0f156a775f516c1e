"""The sink's batch loop: poll results, decode them into rows, write them, dead-letter
what cannot be written, then commit the batch's offsets (see ``sink.app``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import structlog

from kembed_shared import backoff
from kembed_shared.kafka.commit_errors import CommitFailures, FatalCommitError, log_commit_retried
from kembed_shared.ports import (
    Publisher,
    PublishError,
    Record,
    Source,
    TopicPartition,
)
from kembed_shared.publish_retry import retry_publish
from schemas.headers import CORRELATION_ID, LANE, LANE_BULK, dead_letter_headers
from sink.metrics import SinkMetrics
from sink.rows import Refused, Row, RowsOf, newest, rows_of
from sink.settings import SinkSettings
from sink.shapes import TableShape
from sink.store import (
    IndexBuilder,
    RowsRefusedError,
    TransientWriteError,
    VectorStore,
)

__all__ = ["Sink", "retrying"]

log = structlog.get_logger("kembed.sink")

_T = TypeVar("_T")

WRITE_REFUSED = "write_refused"
WRITE_RETRY = "write_retry"
NOT_BULK_LANE = "not_bulk_lane"
"""Dead-letter code of a result whose request did not come on the bulk lane (no
``kembed.lane: bulk`` header): a client allowed to send interactive requests must not
choose rows of the database."""
_LOGGED_KEYS = 20  # keys named in one log line; the count says how many there were
_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
_MAX_DLQ_MESSAGE = 1000


def _not_bulk(record: Record) -> Refused | None:
    """A result the sink must not write because its request did not come on the bulk lane
    (workers stamp ``kembed.lane`` on every result; results of interactive requests, and
    messages no worker wrote, lack ``bulk``)."""
    headers = dict(record.headers)
    lane = headers.get(LANE)
    if lane == LANE_BULK.encode():
        return None
    request_id = headers.get(CORRELATION_ID, b"").decode("utf-8", "replace")[:256] or None
    found = f"kembed.lane: {lane.decode('utf-8', 'replace')[:40]}" if lane else "no kembed.lane"
    return Refused(
        NOT_BULK_LANE,
        f"not a result of the bulk lane ({found}): the sink writes results of requests sent "
        "to a bulk topic only",
        request_id=request_id,
    )


async def retrying(
    attempt: Callable[[], asyncio.Future[_T]],
    retry_s: float,
    event: str,
    on_retry: Callable[[], None] = lambda: None,
) -> _T:
    """``attempt()`` until it does not raise TransientWriteError, for up to ``retry_s``."""

    def retrying(exc: TransientWriteError, tries: int, wait: float) -> None:
        on_retry()
        log.warning(f"{event}_retry", reason=str(exc), attempt=tries, wait_s=wait)

    return await backoff.retry(
        attempt,
        errors=TransientWriteError,
        delays=backoff.stepped(_BACKOFF_S),
        retry_for_s=retry_s,
        on_retry=retrying,
    )


class Sink:
    """The batch loop over a source (the Kafka consumer), a publisher (dead letters) and a
    store; the ports are kembed_shared.ports' Protocols, so it is unit-tested with fakes."""

    def __init__(
        self,
        *,
        source: Source,
        publisher: Publisher,
        store: VectorStore,
        settings: SinkSettings,
        metrics: SinkMetrics,
        executor: ThreadPoolExecutor,
        table_dim: int | None,
    ) -> None:
        self._source = source
        self._publisher = publisher
        self._store = store
        self._settings = settings
        self._metrics = metrics
        self._executor = executor
        self._dlq_topic = settings.resolved_dlq_topic()
        self._shape = TableShape(store, settings, table_dim, executor)
        self._written_any = False
        # Bulk mode: an index may be pending until the sink has been caught up for a while
        # (in either mode: a sink restarted with index=streaming builds it all the same).
        self._index_pending = isinstance(store, IndexBuilder)
        self._caught_up_since: float | None = None
        self._stopping = asyncio.Event()
        self._busy = asyncio.Lock()
        self._batch_started: float | None = None
        self._pending: dict[TopicPartition, int] = {}
        self._failure: BaseException | None = None
        self._fatal: FatalCommitError | None = None  # met where it cannot be raised
        self._commit_failures = CommitFailures.of_group(
            settings.max_poll_interval_ms, settings.session_timeout_ms, "the sink"
        )

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        self._stopping.set()

    def assigned_partitions(self) -> set[TopicPartition]:
        return self._source.assignment()

    def busy_seconds(self) -> float | None:
        started = self._batch_started
        return None if started is None else time.monotonic() - started

    def failure(self) -> BaseException | None:
        return self._failure

    async def run(self) -> None:
        """Batches until stopped; the batch in progress is finished and committed first."""
        try:
            while not self._stopping.is_set():
                records = await self._source.poll(
                    self._settings.fetch_max_wait_ms, self._settings.max_batch_results
                )
                self._raise_fatal()
                self._update_lag()
                async with self._busy:
                    if records:
                        await self._batch(records)  # commits all pending offsets
                    elif self._pending:  # a commit failed (a rebalance): again after a poll
                        await self._commit()
                    elif self._index_pending:
                        await self._build_index_when_done()
                if records:
                    self._caught_up_since = None
            self._raise_fatal()
        except BaseException as exc:
            self._failure = exc
            raise
        log.info("sink.draining", pending_commits=len(self._pending))

    async def on_revoked(self, partitions: set[TopicPartition]) -> None:
        """The batch in progress finishes and commits before its partitions move."""
        async with self._busy:
            if self._pending:
                try:
                    await self._commit()
                except FatalCommitError as exc:
                    # aiokafka would log and swallow a listener's exception: the batch loop
                    # raises it after its poll, and /health fails from now on.
                    self._fatal = self._failure = exc
        for topic, partition in partitions:
            with contextlib.suppress(KeyError):
                self._metrics.consumer_lag.remove(topic, str(partition))
        if partitions:
            log.info("partitions.revoked", partitions=_names(partitions))

    async def on_assigned(self, partitions: set[TopicPartition]) -> None:
        log.info("partitions.assigned", partitions=_names(partitions))

    async def _build_index_when_done(self) -> None:
        """Bulk mode: the load is done when the sink has been caught up (every partition it
        owns at lag 0, no result written) for ``index_build_idle_s``; then the pending
        index is built, once. The build holds up polling: a build longer than
        max_poll_interval_ms costs a rebalance, harmless with every offset committed."""
        if not self._index_pending:
            return
        owned = self._source.assignment()
        lag = self._source.lag()
        if not owned or not self._shape.exists or any(lag.get(tp) != 0 for tp in owned):
            self._caught_up_since = None
            return
        now = time.monotonic()
        since = self._caught_up_since = self._caught_up_since or now
        if now - since < self._settings.index_build_idle_s:
            return
        assert isinstance(self._store, IndexBuilder)
        builder = self._store
        log.info("sink.caught_up", table=self._store.name, index="building the pending index")
        # Not a batch for /health: a large build may rightly outlast health_stuck_batch_s.
        seconds = await retrying(
            lambda: self._in_db(builder.build_pending_index),
            self._settings.write_retry_s,
            "sink.index_build",
        )
        self._index_pending = False
        if seconds is None:
            log.info("sink.index_present", table=self._store.name)

    # ------------------------------------------------------------------ one batch

    async def _batch(self, records: list[Record]) -> None:
        started = time.monotonic()
        self._batch_started = started
        try:
            owned = self._source.assignment()
            records = [r for r in records if r.tp in owned]  # revoked meanwhile: not ours
            good: list[tuple[Record, RowsOf]] = []
            dead: list[tuple[Record, Refused]] = []
            for record in records:
                outcome = _not_bulk(record) or rows_of(record.value, record.timestamp_ms)
                if isinstance(outcome, Refused):
                    dead.append((record, outcome))
                else:
                    good.append((record, outcome))
            good = await self._shape.matching(good, dead, self._written_any)
            written = await self._write(good, dead)
            for record, refused in dead:
                await self._dead_letter(record, refused)
            for record in records:
                self._pending[record.tp] = max(self._pending.get(record.tp, 0), record.offset + 1)
            await self._commit()
            now = time.time()
            for record, _ in written:
                self._metrics.latency_seconds.observe(max(0.0, now - record.timestamp_ms / 1000))
            rows = sum(len(result.rows) for _, result in written)
            self._metrics.batches.inc()
            self._metrics.batch_rows.observe(rows)
            self._metrics.batch_seconds.observe(time.monotonic() - started)
            log.debug(
                "sink.batch",
                results=len(records),
                rows=rows,
                dead_letters=len(dead),
                seconds=round(time.monotonic() - started, 4),
            )
        finally:
            self._batch_started = None

    async def _write(
        self, good: list[tuple[Record, RowsOf]], dead: list[tuple[Record, Refused]]
    ) -> list[tuple[Record, RowsOf]]:
        """Write every good result's rows (one upsert); the results written."""
        if not good:
            return []
        # A key's results can come from several partitions, in any order: the newest wins.
        rows = newest(row for _, result in good for row in result.rows)
        started = time.monotonic()
        try:
            await self._upsert(rows)
            written = good
        except RowsRefusedError as exc:
            log.warning("sink.batch_refused", reason=str(exc), results=len(good))
            written = []
            for record, result in good:  # one transaction each, to find the culprit(s)
                try:
                    await self._upsert(result.rows)
                    written.append((record, result))
                except RowsRefusedError as one:
                    dead.append((record, _refused_by_db(result, one)))
        self._metrics.write_seconds.observe(time.monotonic() - started)
        for _, result in written:
            self._metrics.rows.labels(self._store.name).inc(len(result.rows))
            self._metrics.results.labels("written").inc()
        self._written_any = self._written_any or bool(written)
        return written

    async def _upsert(self, rows: Sequence[Row]) -> None:
        await retrying(
            lambda: self._in_db(lambda: self._store.upsert(rows)),
            self._settings.write_retry_s,
            "sink.write",
            on_retry=lambda: self._metrics.errors.labels(WRITE_RETRY).inc(),
        )

    def _in_db(self, call: Callable[[], _T]) -> asyncio.Future[_T]:
        return asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def _dead_letter(self, record: Record, refused: Refused) -> None:
        fields: dict[str, Any] = {
            "code": refused.code,
            "request_id": refused.request_id,
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
        }
        if refused.keys:
            fields["keys"] = list(refused.keys[:_LOGGED_KEYS])
            fields["key_count"] = len(refused.keys)
        event = "sink.error_result" if refused.error_result else "sink.refused"
        log.warning(event, reason=refused.message, **fields)
        self._metrics.errors.labels(refused.code).inc()
        self._metrics.results.labels(refused.code).inc()
        headers = dead_letter_headers(record, refused.code, refused.message[:_MAX_DLQ_MESSAGE])
        try:
            await retry_publish(
                lambda: self._publisher.send(
                    self._dlq_topic, record.value or b"", key=record.key, headers=headers
                ),
                delays=backoff.stepped(_BACKOFF_S),
                retry_for_s=self._settings.write_retry_s,
            )
        except PublishError as exc:
            # Nothing is committed past this record: a restart retries it.
            raise TransientWriteError(
                f"cannot write to the dead-letter topic {self._dlq_topic!r}: {exc.reason}"
            ) from None
        self._metrics.dlq_messages.labels(refused.code).inc()

    async def _commit(self) -> None:
        """Commit the pending offsets of the partitions still owned. A failure after which
        the client rejoins its group (a rebalance) is logged and the offsets stay pending:
        the partitions' next owner replays, harmlessly. A failure every later commit would
        repeat (an ACL removed, ...: kembed_shared.kafka.commit_errors) raises FatalCommitError,
        and so do benign failures that outlast a rebalance."""
        offsets = {tp: o for tp, o in self._pending.items() if tp in self._source.assignment()}
        if not offsets:
            self._pending.clear()
            self._commit_failures.succeeded()
            return
        try:
            await self._source.commit(offsets)
        except Exception as exc:
            fatal = self._commit_failures.failed(exc)
            if fatal is not None:
                raise fatal from exc
            log_commit_retried(log, exc, offsets)
            return
        self._pending.clear()
        self._commit_failures.succeeded()

    def _raise_fatal(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    def _update_lag(self) -> None:
        for (topic, partition), lag in self._source.lag().items():
            self._metrics.consumer_lag.labels(topic, str(partition)).set(lag)


def _refused_by_db(result: RowsOf, error: RowsRefusedError) -> Refused:
    return Refused(
        error.code,
        str(error),
        request_id=result.request_id,
        keys=tuple(row.id for row in result.rows),
    )


def _names(partitions: Any) -> list[str]:
    return sorted(f"{topic}-{partition}" for topic, partition in partitions)
