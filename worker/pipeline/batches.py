"""Batches: keeps the encoder thread busy with exactly one batch prepared ahead of it.

A prepared bulk batch yields to interactive work that becomes ready meanwhile, and one less
than half full is cut again when more of its lane waits. A batch whose encoder call fails
is split in halves, retried ahead of new batches, until the failing input runs alone: only
its request is answered ``internal``. Out of memory also lowers that lane's token budget
for a while (the lane scheduler's :class:`worker.batcher.TokenBudget`). Finished rows go
into their jobs, and a job whose last input is done is settled.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import structlog

from kembed_shared.observability.logging import record_fields
from schemas import ErrorCode, ErrorInfo
from worker.batcher import BULK, INTERACTIVE, Item, LaneScheduler, TokenBudget
from worker.cache import VectorCache
from worker.encoder import EncoderOutOfMemoryError, Prepared
from worker.kinds import kind_of
from worker.metrics import Metrics
from worker.pipeline.jobs import Batch, Job
from worker.pipeline.settle import Settlement
from worker.served import ServedModel

__all__ = ["Batches", "encoder_thread"]

log = structlog.get_logger("kembed.worker")

_EXPIRED_QUEUED = "deadline passed while queued, before computation"


def encoder_thread() -> ThreadPoolExecutor:
    """The thread that runs every batch: the encoder is not thread-safe, and torch's thread
    settings (and a compiled model's specializations) belong to that thread."""
    return ThreadPoolExecutor(1, thread_name_prefix="kembed-encoder")


@dataclass(slots=True, eq=False, kw_only=True)
class Batches:
    models: Mapping[str, ServedModel]
    scheduler: LaneScheduler[Job]
    settlement: Settlement
    cache: VectorCache
    metrics: Metrics
    max_batch_size: int
    max_wait_s: float
    work_waiting: asyncio.Event
    encode_thread: ThreadPoolExecutor = field(default_factory=encoder_thread)
    # Halves of failed batches, waiting to run ahead of new batches.
    _retries: deque[tuple[ServedModel, str, list[Item[Job]]]] = field(
        init=False, default_factory=deque
    )
    running_since: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        for (name, lane), budget in self.scheduler.budgets.items():
            self.metrics.effective_batch_tokens.labels(name, lane).set(budget.tokens)
        for lane in (INTERACTIVE, BULK):  # exposed at 0 from the start, so rate() sees the 1st
            for reason in ("error", "out_of_memory"):
                self.metrics.batch_splits.labels(lane, reason)

    async def loop(self) -> None:
        """Run the encoder back to back, with one batch always prepared ahead of it."""
        prepared: Batch | None = None
        running: tuple[Batch, asyncio.Future[npt.NDArray[np.float32]]] | None = None
        while True:
            now = time.monotonic()
            if prepared and prepared.retry:
                pass  # runs as it is, next
            elif prepared and self.scheduler.preemptible(prepared.lane, now, self.max_wait_s):
                self.scheduler.put_back(prepared.lane, prepared.items, prepared.model.name)
                prepared = None
            elif prepared and self._refillable(prepared):
                model, lane = prepared.model, prepared.lane
                items = self._live(self.scheduler.refill(lane, prepared.items, model.name))
                prepared = Batch(model, lane, items, self._prepare(model, items)) if items else None
            if prepared is None:
                prepared = self._cut(now)
            if running is None and prepared is not None:
                running, prepared = self._start(prepared), None
                continue
            waits: list[asyncio.Future[Any]] = []
            if running is not None:
                waits.append(running[1])
            self.work_waiting.clear()
            waits.append(asyncio.ensure_future(self.work_waiting.wait()))
            if prepared is not None and prepared.retry:
                wake = None  # it runs next whatever the clock says
            else:
                wake = self.scheduler.wake_at(prepared.lane if prepared else None, self.max_wait_s)
            timeout = None if wake is None else max(0.0, wake - now)
            await asyncio.wait(waits, timeout=timeout, return_when="FIRST_COMPLETED")
            waits[-1].cancel()
            if running is not None and running[1].done():
                finished, running = running, None
                failed = finished[1].exception() is not None
                if failed:  # settle first: the prepared batch then skips what it answered
                    self._finish(*finished)
                if prepared is not None:  # keep the encoder busy: start, then scatter
                    running, prepared = self._start(prepared), None
                if not failed:
                    self._finish(*finished)

    def _start(self, batch: Batch) -> tuple[Batch, asyncio.Future[npt.NDArray[np.float32]]] | None:
        """Run ``batch`` on the encoder thread, without the inputs that expired meanwhile."""
        live = self._live(batch.items)
        if not live:
            return None
        if len(live) < len(batch.items):
            prepared = self._prepare(batch.model, live)
            batch = Batch(batch.model, batch.lane, live, prepared, retry=batch.retry)
        batch.started = self.running_since = time.monotonic()
        self._observe(batch)
        loop = asyncio.get_running_loop()
        return batch, loop.run_in_executor(self.encode_thread, _run, batch)

    def _observe(self, batch: Batch) -> None:
        m, lane = self.metrics, batch.lane
        padded = batch.prepared.padded_tokens
        real = sum(len(item.ids) for item in batch.items)
        m.batch_size.labels(lane).observe(len(batch.items))
        m.batch_padded_tokens.labels(lane).observe(padded)
        m.batch_padding_ratio.labels(lane).observe(1 - real / padded if padded else 0.0)
        if batch.retry:
            return  # its inputs' queue time was observed when they first ran
        queue = m.queue_seconds.labels(lane)
        for item in batch.items:
            queue.observe(batch.started - item.enqueued)

    def _live(self, items: list[Item[Job]]) -> list[Item[Job]]:
        """``items`` without inputs of requests already answered or past their deadline; the
        latter are answered now with deadline_exceeded. Neither reaches the encoder."""
        now_ms = int(time.time() * 1000)
        live = []
        for item in items:
            job = item.job
            deadline = job.request.deadline_ms
            if not job.settled and deadline is not None and deadline <= now_ms:
                record = job.record
                log.info(
                    "request.deadline_exceeded",
                    request_id=job.request.id,
                    **record_fields(record),
                )
                self.settlement.settle(job, ErrorInfo(ErrorCode.DEADLINE_EXCEEDED, _EXPIRED_QUEUED))
            if not job.settled:
                live.append(item)
        return live

    def _refillable(self, batch: Batch) -> bool:
        """A prepared batch less than half full is cut again when new inputs of its lane
        wait (requests trickling in while the encoder is busy); fuller ones run as they are,
        since re-cutting them would cost more than it gains."""
        lane = self.scheduler.lane(batch.lane, batch.model.name)
        return (
            len(lane) > 0
            and batch.prepared.rows * 2 <= self.max_batch_size
            and batch.prepared.padded_tokens * 2 <= lane.max_batch_tokens
        )

    def _cut(self, now: float) -> Batch | None:
        while self._retries:
            model, lane, items = self._retries.popleft()
            items = self._live(items)
            if items:
                return Batch(model, lane, items, self._prepare(model, items), retry=True)
        while (chosen := self.scheduler.next_model_batch(now, self.max_wait_s)) is not None:
            name, lane, items = chosen
            items = self._live(items)
            if items:
                model = self.models[name]
                return Batch(model, lane, items, self._prepare(model, items))
        return None

    def _prepare(self, model: ServedModel, items: list[Item[Job]]) -> Prepared:
        return kind_of(model).prepare(
            model.encoder, [item.ids for item in items], lambda: [_segment(i) for i in items]
        )

    def _finish(self, batch: Batch, future: asyncio.Future[npt.NDArray[np.float32]]) -> None:
        if self.running_since == batch.started:
            self.running_since = None
        self.metrics.inference_seconds.labels(batch.lane).observe(time.monotonic() - batch.started)
        error = future.exception()
        if error is not None:
            self._failed(batch, error)
            return
        budget = self.scheduler.succeeded(batch.lane, batch.model.name, time.monotonic())
        if budget is not None:
            self._show_budget(batch, budget)
            log.info(
                "batch.budget_restored",
                model=batch.model.name,
                lane=batch.lane,
                tokens=budget.tokens,
                max_batch_tokens=budget.ceiling,
            )
        log.debug(
            "batch.encoded",
            model=batch.model.name,
            lane=batch.lane,
            inputs=len(batch.items),
            padded_tokens=batch.prepared.padded_tokens,
        )
        rows = future.result()
        if batch.ran_as is not None:
            self.cache.store(
                batch.model.name,
                batch.ran_as,
                (
                    (item.job.cache_notes[item.index], row, item.job.tokens[item.index])
                    for item, row in zip(batch.items, rows, strict=True)
                    if item.job.cache_notes
                ),
            )
        for item, row in zip(batch.items, rows, strict=True):
            job = item.job
            job.vectors[item.index] = row
            job.remaining -= 1
            if job.remaining == 0:
                self.settlement.settle(job)

    def _failed(self, batch: Batch, error: BaseException) -> None:
        """The encoder raised on ``batch``: split it in halves to retry (ahead of new
        batches), until the input at fault runs alone; only that input's request is then
        answered ``internal``. Out of memory also lowers the lane's token budget."""
        model, lane = batch.model.name, batch.lane
        oom = isinstance(error, EncoderOutOfMemoryError | MemoryError)
        reason = "out_of_memory" if oom else "error"
        log.warning(
            "batch.failed",
            model=model,
            lane=lane,
            inputs=len(batch.items),
            padded_tokens=batch.prepared.padded_tokens,
            reason=reason,
            error=type(error).__name__,
        )
        if oom:
            padded = batch.prepared.padded_tokens
            budget = self.scheduler.out_of_memory(lane, model, padded, time.monotonic())
            if budget is not None:
                self._show_budget(batch, budget)
                log.warning(
                    "batch.budget_lowered",
                    model=model,
                    lane=lane,
                    tokens=budget.tokens,
                    max_batch_tokens=budget.ceiling,
                    restore_after_s=budget.restore_after_s,
                )
        if len(batch.items) == 1:
            (item,) = batch.items
            job, record = item.job, item.job.record
            if job.settled:  # answered meanwhile (its deadline passed)
                return
            log.error(
                "request.failed",
                request_id=job.request.id,
                index=item.index,
                reason=reason,
                error=type(error).__name__,
                **record_fields(record),
            )
            message = "inference failed" + (" (out of memory)" if oom else "")
            index = kind_of(job.model).error_index(job.request, item.index)
            self.settlement.settle(job, ErrorInfo(ErrorCode.INTERNAL, message, index))
            return
        # Inputs of requests answered meanwhile need no retry. Halves in length order: out
        # of memory, the shorter half is the likelier to fit, and it runs first.
        items = sorted((it for it in batch.items if not it.job.settled), key=lambda it: it.length)
        if len(items) <= 1:  # one input left: it failed in company, so it runs once alone
            self._retries.extend((batch.model, lane, [item]) for item in items)
            return
        half = (len(items) + 1) // 2
        halves = [items[:half], items[half:]]
        self._retries.extend((batch.model, lane, part) for part in halves)
        self.metrics.batch_splits.labels(lane, reason).inc()
        log.info(
            "batch.split",
            model=model,
            lane=lane,
            reason=reason,
            inputs=len(items),
            halves=[len(part) for part in halves],
        )

    def _show_budget(self, batch: Batch, budget: TokenBudget) -> None:
        self.metrics.effective_batch_tokens.labels(batch.model.name, batch.lane).set(budget.tokens)


def _run(batch: Batch) -> npt.NDArray[np.float32]:
    """Run ``batch`` (on the encoder thread), noting the variant that ran it: the tuner
    installs variants on this thread, between batches."""
    encoder = batch.model.encoder
    rows = encoder.run(batch.prepared)
    batch.ran_as = encoder.info
    return rows


def _segment(item: Item[Job]) -> int:
    segments = item.job.segments
    return segments[item.index] if segments else len(item.ids)
