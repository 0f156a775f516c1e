"""The pipeline's lifecycle: :class:`Pipeline` wires the rooms (admission, in-flight
accounting, batches, settling) around one lane scheduler and one delivery strategy, runs
their loops, drains on stop, and finishes revoked partitions before they move."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

from kembed_shared.observability.logging import partition_names
from kembed_shared.ports import Publisher, Source, TopicPartition, TransactionalPublisher
from worker.batcher import LaneScheduler
from worker.cache import VectorCache
from worker.delivery import make_delivery
from worker.metrics import Metrics
from worker.offsets import OffsetTracker
from worker.pipeline.admit import Admission, limits_for
from worker.pipeline.batches import Batches, encoder_thread
from worker.pipeline.inflight import InFlight
from worker.pipeline.jobs import Job
from worker.pipeline.settle import Settlement
from worker.pipeline.tasks import Tasks
from worker.served import ServedModel
from worker.settings import WorkerSettings

__all__ = ["Pipeline"]

log = structlog.get_logger("kembed.worker")

# After a batch ran out of memory, its lane's token budget stays lowered this long before
# each step back up (TokenBudget).
_BUDGET_RESTORE_S = 60.0


class Pipeline:
    def __init__(
        self,
        *,
        source: Source,
        publisher: Publisher | TransactionalPublisher,
        models: Sequence[ServedModel],
        settings: WorkerSettings,
        encode_thread: ThreadPoolExecutor | None = None,
        metrics: Metrics | None = None,
        cache: VectorCache | None = None,
    ) -> None:
        if not models:
            raise ValueError("a pipeline serves at least one model")
        self._source = source
        metrics = metrics or Metrics()
        served = {model.name: model for model in models}
        self._settings = settings
        cache = cache if cache is not None else VectorCache(0)
        for model in models:
            cache.watch(model.name)
        limits = limits_for(models, settings)
        scheduler: LaneScheduler[Job] = LaneScheduler(
            settings.max_batch_tokens,
            settings.max_batch_size,
            settings.bulk_every,
            busy_bulk_tokens=settings.busy_bulk_batch_tokens,
            models=[model.name for model in models],
            max_seq_lengths={model.name: model.encoder.info.max_seq_length for model in models},
            budget_restore_s=_BUDGET_RESTORE_S,
        )
        self._tracker = OffsetTracker()
        self._failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._delivery = make_delivery(
            publisher,
            source=source,
            tracker=self._tracker,
            settings=settings,
            on_fatal=self._fail_worker,
            retry_for_s=settings.publish_retry_s,
            on_retry=metrics.publish_retries.inc,
            on_dead_letter=lambda code: metrics.dlq_messages.labels(code).inc(),
        )
        tasks = Tasks(self._fail_worker)
        work_waiting = asyncio.Event()
        bulk_topics = frozenset(model.bulk_topic for model in models) - {""}
        self._inflight = InFlight(source, bulk_topics, settings.max_inflight_inputs, metrics)
        settlement = Settlement(
            self._delivery, self._inflight, limits, metrics, tasks, settings.max_result_bytes
        )
        self._batches = Batches(
            models=served,
            scheduler=scheduler,
            settlement=settlement,
            cache=cache,
            metrics=metrics,
            max_batch_size=settings.max_batch_size,
            max_wait_s=settings.max_batch_wait_ms / 1000,
            work_waiting=work_waiting,
            encode_thread=encode_thread or encoder_thread(),
        )
        self._admission = Admission(
            source=source,
            delivery=self._delivery,
            models=served,
            limits=limits,
            scheduler=scheduler,
            inflight=self._inflight,
            cache=cache,
            settlement=settlement,
            tasks=tasks,
            settings=settings,
            work_waiting=work_waiting,
        )
        self._stopping = asyncio.Event()

    # ------------------------------------------------------------------ probes

    def assigned_partitions(self) -> set[TopicPartition]:
        return self._source.assignment()

    def busy_seconds(self) -> float | None:
        started = self._batches.running_since
        return None if started is None else time.monotonic() - started

    def failure(self) -> BaseException | None:
        if self._failure.done() and not self._failure.cancelled():
            return self._failure.exception()
        return None

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask the pipeline to drain and return from :meth:`run` (signal-handler safe)."""
        self._stopping.set()

    async def run(self) -> None:
        """Serve until :meth:`stop`, then finish in-flight work within the shutdown timeout."""
        loops = [
            asyncio.create_task(self._admission.fetch_loop(self._stopping), name="fetch"),
            asyncio.create_task(self._batches.loop(), name="batch"),
            asyncio.create_task(self._delivery.run(), name="commit"),
            asyncio.create_task(self._inflight.lag_loop(), name="lag"),
        ]
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            waiters: list[asyncio.Future[Any]] = [*loops, stopping, self._failure]
            await asyncio.wait(waiters, return_when="FIRST_COMPLETED")
            for task in [*loops, self._failure]:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            self._stopping.set()  # the fetch loop sees it and stops polling
            drained = await self._wait_answered(None, self._settings.shutdown_timeout_s)
            log.info("worker.drained", complete=drained, in_flight=self._tracker.in_flight())
            await self._delivery.commit()
        finally:
            stopping.cancel()
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            self._batches.encode_thread.shutdown(wait=False, cancel_futures=True)
            self._admission.tokenize_thread.shutdown(wait=False, cancel_futures=True)

    async def on_assigned(self, partitions: set[TopicPartition]) -> None:
        log.info("partitions.assigned", partitions=partition_names(partitions))
        paused = {tp for tp in partitions if self._inflight.is_paused(self._inflight.lane(tp[0]))}
        if paused:
            self._source.pause(paused)

    async def on_revoked(self, partitions: set[TopicPartition]) -> None:
        """Finish the revoked partitions' requests and commit them before they move."""
        drained = await self._wait_answered(partitions, self._settings.shutdown_timeout_s)
        await self._delivery.commit(partitions)
        self._delivery.forget(partitions)
        if partitions:
            log.info("partitions.revoked", partitions=partition_names(partitions), drained=drained)

    async def _wait_answered(self, partitions: set[TopicPartition] | None, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        progress = self._inflight.progress
        while self._tracker.in_flight(partitions):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(progress.wait(), min(remaining, 0.1))
        return True

    def _fail_worker(self, error: BaseException) -> None:
        if not self._failure.done():
            self._failure.set_exception(error)
