"""``kembed sink``: open the store (``sink.registry``), the Kafka consumer and the dead-letter
publisher, and serve the batch loop (``sink.consumer``) until stopped.

The loop takes one batch at a time: poll up to ``max_batch_results`` results, decode them
into rows (``sink.rows``), write all rows (``VectorStore.upsert``: one transaction, or one
per Postgres writer over disjoint ids), send what cannot be written to the dead-letter
topic (acknowledged), and only then commit the batch's offsets. A crash anywhere before
the commit replays the batch, and the upsert by id makes the replay harmless: the end
state is exact.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, cast

import structlog

from kembed_shared.kafka.commit_errors import FatalCommitError
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
)
from kembed_shared.settings import KafkaClientSettings
from sink.consumer import Sink, retrying
from sink.metrics import SinkMetrics
from sink.registry import STORES
from sink.settings import SinkSettings
from sink.store import (
    DimensionMismatchError,
    Metric,
    TargetError,
    TransientWriteError,
    VectorStore,
)
from sink.targets import TargetSpec

__all__ = ["run_sink"]

log = structlog.get_logger("kembed.sink")


class StoreFactory(Protocol):
    """What a ``sink.registry`` entry names: a store class that builds itself from the
    sink's settings."""

    def from_settings(self, spec: TargetSpec, settings: SinkSettings) -> VectorStore: ...


def make_store(settings: SinkSettings) -> VectorStore:
    """The store the target URI names (TargetError when its client is not installed)."""
    spec = settings.target_spec()
    factory = cast(StoreFactory, STORES[spec.kind].load())
    return factory.from_settings(spec, settings)


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
            settings,
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

    return await retrying(
        lambda: loop.run_in_executor(executor, opened), settings.write_retry_s, "sink.connect"
    )


def _info(settings: SinkSettings, kafka: KafkaClientSettings) -> dict[str, Any]:
    """What /info reports (and kembed_sink_info): built field by field, so no secret can
    slip in."""
    spec = settings.target_spec()
    return {
        "target": spec.display,
        "kind": f"{spec.kind}_lite" if spec.lite else spec.kind,
        "table": settings.table,
        "dim": settings.dim,
        "metric": settings.metric,
        "results_topic": settings.results_topic,
        "dlq_topic": settings.resolved_dlq_topic(),
        "group_id": settings.group_id,
        "bootstrap_servers": kafka.bootstrap_servers,
    }
