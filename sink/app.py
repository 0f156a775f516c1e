"""``kembed sink``: consume results, upsert their vectors into a database, commit offsets.

One loop, one batch at a time: poll up to ``max_batch_results`` results, decode them into
rows (``sink.rows``), write all rows (``VectorStore.upsert``: one transaction, or one per
Postgres writer over disjoint ids), send what
cannot be written to the dead-letter topic (acknowledged), and only then commit the
batch's offsets. A crash anywhere before the commit replays the batch, and the upsert by
id makes the replay harmless: the end state is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import structlog

from kembed_shared import backoff
from kembed_shared.kafka.commit_errors import CommitFailures, FatalCommitError, log_commit_retried
from kembed_shared.kafka.publisher import KafkaPublisher
from kembed_shared.kafka.security import client_options
from kembed_shared.kafka.source import KafkaSource
from kembed_shared.observability.logging import configure_logging, redacted
from kembed_shared.observability.probes import Probes
from kembed_shared.observability.service import (
    http_endpoints,
    missing_topics_reporter,
    stop_on_signals,
)
from kembed_shared.ports import (
    KafkaAccessError,
    Publisher,
    PublishError,
    Record,
    Source,
    TopicPartition,
)
from kembed_shared.settings import KafkaClientSettings
from schemas.headers import CORRELATION_ID, LANE, LANE_BULK, dead_letter_headers
from sink.metrics import SinkMetrics
from sink.registry import make_store
from sink.rows import DIMENSION_MISMATCH, Refused, Row, RowsOf, newest, rows_of
from sink.settings import SinkSettings
from sink.store import (
    DimensionMismatchError,
    IndexBuilder,
    Metric,
    RowsRefusedError,
    TargetError,
    TransientWriteError,
    VectorStore,
)

__all__ = ["Sink", "run_sink"]

log = structlog.get_logger("kembed.sink")

_T = TypeVar("_T")

WRITE_REFUSED = "write_refused"
WRITE_RETRY = "write_retry"
NOT_BULK_LANE = "not_bulk_lane"
"""Dead-letter code of a result whose request did not come on the bulk lane (no
``kembed.lane: bulk`` header): a client allowed to send interactive requests must not
choose rows of the database."""
_LOGGED_KEYS = 20  # keys named in one log line; the count says how many there were
_UNIT_NORM_TOLERANCE = 1e-2  # int8 codes of a unit vector are unit length to within ~1e-3
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


async def run_sink(settings: SinkSettings, kafka: KafkaClientSettings) -> None:
    """Serve until SIGTERM. Raises KafkaAccessError (Kafka refused the login, a right, or
    an offset commit for good: FatalCommitError),
    TargetError (the target cannot be used as configured: exit 2) or TransientWriteError
    (the database stayed unreachable for ``write_retry_s``), each logged first."""
    configure_logging(settings.log_level, settings.log_format)
    for chatty in ("faiss", "milvus_lite", "pymilvus"):  # Milvus Lite's start-up info lines
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))
    spec = settings.target_spec()
    log.info(
        "sink.starting",
        target=spec.display,
        kind=spec.kind,
        settings=redacted(settings.model_dump(exclude={"target"})),
        kafka=redacted(kafka.model_dump()),
    )
    metrics = SinkMetrics()
    probes = Probes(
        stuck_batch_s=settings.health_stuck_batch_s, phase="starting", busy="sink", name="sink"
    )
    info = _info(settings, kafka)
    metrics.info.info({k: str(v) for k, v in info.items() if not isinstance(v, dict)})
    async with http_endpoints(
        settings.http_host,
        settings.http_port,
        probes=probes,
        metrics=metrics,
        info=lambda: info,
        log=log,
    ):
        try:
            await _serve(settings, kafka, metrics, probes, info)
        except FatalCommitError as exc:
            log.error(f"kafka.{exc.kind}_failed", reason=exc.reason, error=exc.error)
            raise
        except KafkaAccessError as exc:
            log.error(f"kafka.{exc.kind}_failed", reason=exc.reason)
            raise
        except DimensionMismatchError as exc:
            log.error("sink.dimension_mismatch", reason=str(exc))
            raise
        except TargetError as exc:
            log.error("sink.target_failed", reason=str(exc))
            raise
        except TransientWriteError as exc:
            log.error("sink.write_failed", reason=str(exc))
            raise
    log.info("sink.stopped")


async def _serve(
    settings: SinkSettings,
    kafka: KafkaClientSettings,
    metrics: SinkMetrics,
    probes: Probes,
    info: dict[str, Any],
) -> None:
    security = client_options(kafka)
    dlq_topic = settings.resolved_dlq_topic()
    publisher = KafkaPublisher(
        kafka.bootstrap_servers,
        client_id=settings.client_id,
        linger_ms=0,
        max_request_size=8 * 1024 * 1024,
        security=security,
    )
    probes.phase = "connecting"
    await publisher.start()
    executor = ThreadPoolExecutor(1, thread_name_prefix="kembed-sink-db")
    store = make_store(settings)
    try:
        await publisher.check_access(
            {settings.results_topic: {"read"}, dlq_topic: {"write"}}, settings.group_id
        )
        table_dim = await _open_store(store, settings, executor)
        if table_dim is not None and settings.dim is not None and table_dim != settings.dim:
            raise DimensionMismatchError(
                store.name, table_dim, settings.dim, "the setting dim (--dim) asks for"
            )
        info["dim"] = table_dim or settings.dim
        source = KafkaSource(
            kafka.bootstrap_servers,
            [settings.results_topic],
            group_id=settings.group_id,
            client_id=settings.client_id,
            max_poll_interval_ms=settings.max_poll_interval_ms,
            session_timeout_ms=settings.session_timeout_ms,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
            fetch_max_wait_ms=min(settings.fetch_max_wait_ms, 500),
            security=security,
        )
        sink = Sink(
            source=source,
            publisher=publisher,
            store=store,
            settings=settings,
            metrics=metrics,
            executor=executor,
            table_dim=table_dim,
        )
        stop_on_signals(sink, probes, log, "sink")
        probes.phase = "joining"
        await source.start(
            sink.on_revoked,
            sink.on_assigned,
            on_missing=missing_topics_reporter(
                probes, log, f"kembed topics create --results {settings.results_topic}"
            ),
            stopped=lambda: probes.phase == "draining",
        )
        probes.phase = "serving"
        log.info(
            "sink.started",
            topic=settings.results_topic,
            group_id=settings.group_id,
            table=store.name,
            dim=table_dim or settings.dim,
            dlq_topic=dlq_topic,
        )
        try:
            await sink.run()
        finally:
            await source.stop()  # leave the group: the partitions move at once
    finally:
        await asyncio.get_running_loop().run_in_executor(executor, store.close)
        executor.shutdown(wait=False)
        await publisher.stop()


async def _open_store(
    store: VectorStore, settings: SinkSettings, executor: ThreadPoolExecutor
) -> int | None:
    """Connect (retrying a database that is not up yet) and read the table's dimension. An
    existing table is brought to the current shape (``create`` of an existing table of
    that dimension migrates a table made by an older sink, and does nothing otherwise)."""
    loop = asyncio.get_running_loop()

    def opened() -> int | None:
        store.open()
        dim = store.table_dim()
        if dim is not None and (settings.dim is None or settings.dim == dim):
            metric: Metric = "cosine" if settings.metric == "auto" else settings.metric
            store.create(dim, metric)  # the metric only matters for a new table
        return dim

    return await _retrying(
        lambda: loop.run_in_executor(executor, opened), settings.write_retry_s, "sink.connect"
    )


async def _retrying(
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
        self._table_exists = table_dim is not None
        self._dim = table_dim or settings.dim
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
        if not owned or not self._table_exists or any(lag.get(tp) != 0 for tp in owned):
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
        seconds = await _retrying(
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
            if good:
                await self._ensure_table(good)
                matching = [(r, res) for r, res in good if res.dim == self._dim]
                if not matching and not self._written_any:
                    raise DimensionMismatchError(
                        self._store.name,
                        self._dim or 0,
                        good[0][1].dim,
                        f"the results on {self._settings.results_topic!r} have",
                    )
                for record, result in good:
                    if result.dim != self._dim:
                        dead.append((record, _mismatch(result, self._dim)))
                good = matching
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

    async def _ensure_table(self, good: list[tuple[Record, RowsOf]]) -> None:
        """Create the table at the first batch that needs it: of the configured dimension,
        or the first result's, and the metric the settings or the vectors call for."""
        if self._table_exists:
            return
        dim = self._dim or good[0][1].dim
        metric = self._metric([result for _, result in good if result.dim == dim])
        await self._in_db(lambda: self._store.create(dim, metric))
        self._table_exists, self._dim = True, dim

    def _metric(self, results: list[RowsOf]) -> Metric:
        if self._settings.metric != "auto":
            return self._settings.metric
        vectors = np.stack([row.vector for result in results for row in result.rows])
        norms = np.linalg.norm(vectors, axis=1)
        unit = bool(np.all(np.abs(norms - 1.0) <= _UNIT_NORM_TOLERANCE))
        return "inner_product" if unit else "cosine"

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
        await _retrying(
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
            await backoff.retry(
                lambda: self._publisher.send(
                    self._dlq_topic, record.value or b"", key=record.key, headers=headers
                ),
                errors=PublishError,
                delays=backoff.stepped(_BACKOFF_S),
                retry_for_s=self._settings.write_retry_s,
                retriable=lambda exc: exc.retriable,
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


def _mismatch(result: RowsOf, dim: int | None) -> Refused:
    return Refused(
        DIMENSION_MISMATCH,
        f"vectors of dimension {result.dim}; the table holds dimension {dim}",
        request_id=result.request_id,
        keys=tuple(row.id for row in result.rows),
    )


def _refused_by_db(result: RowsOf, error: RowsRefusedError) -> Refused:
    return Refused(
        error.code,
        str(error),
        request_id=result.request_id,
        keys=tuple(row.id for row in result.rows),
    )


def _names(partitions: Any) -> list[str]:
    return sorted(f"{topic}-{partition}" for topic, partition in partitions)


def _info(settings: SinkSettings, kafka: KafkaClientSettings) -> dict[str, Any]:
    """What /info reports (and kembed_sink_info): built field by field, so no secret can
    slip in."""
    spec = settings.target_spec()
    return {
        "target": spec.display,
        "kind": "milvus_lite" if spec.lite else spec.kind,
        "table": settings.table,
        "dim": settings.dim,
        "metric": settings.metric,
        "results_topic": settings.results_topic,
        "dlq_topic": settings.resolved_dlq_topic(),
        "group_id": settings.group_id,
        "bootstrap_servers": kafka.bootstrap_servers,
    }
