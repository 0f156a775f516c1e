"""The worker's data path: fetch -> decode -> tokenize -> batch -> encode -> publish -> commit.

Three loops share one event loop:

- fetch: polls records, decodes them, tokenizes accepted requests in a thread, and queues
  their inputs in the batcher; pauses all partitions while too many inputs are in flight;
- batch: cuts batches and runs the encoder on its own thread, so heartbeats, fetches and
  publishes go on during inference; a finished request is published by its own task;
- commit: commits, per partition, up to the first record not yet answered (acknowledged by
  the broker), so a crash redelivers rather than loses.

A failure to write a result sends the request to the dead-letter topic; a failure to write
that too is fatal (nothing is committed past it, so the request is redelivered on restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import structlog

from schemas import EmbedRequest, ErrorCode, ErrorInfo
from worker.batcher import Batcher, Item
from worker.decode import Accepted, DeadLetter, Limits, Rejected, decode_record
from worker.encoder import Encoder
from worker.offsets import OffsetTracker
from worker.ports import Publisher, PublishError, Record, Source, TopicPartition
from worker.publish import dead_letter_headers, encode_error, encode_vectors, result_headers
from worker.settings import WorkerSettings
from worker.tokenization import TextTokenizer, Tokenized

__all__ = ["Pipeline"]

log = structlog.get_logger("kembed.worker")


@dataclass(eq=False, slots=True)
class Job:
    """A request whose inputs are being encoded; published when ``remaining`` reaches 0."""

    record: Record
    request: EmbedRequest
    vectors: npt.NDArray[np.float32]
    tokens: list[int]
    remaining: int
    settled: bool = field(default=False)


class Pipeline:
    def __init__(
        self,
        *,
        source: Source,
        publisher: Publisher,
        tokenizer: TextTokenizer,
        encoder: Encoder,
        settings: WorkerSettings,
        model_names: frozenset[str],
    ) -> None:
        self._source = source
        self._publisher = publisher
        self._tokenizer = tokenizer
        self._encoder = encoder
        self._settings = settings
        self._model = encoder.info.name
        self._limits = Limits(
            max_request_bytes=settings.max_request_bytes,
            max_client_batch_size=settings.max_client_batch_size,
            model_names=model_names,
            dim=encoder.info.dim,
        )
        self._batcher: Batcher[Job] = Batcher(settings.max_batch_tokens, settings.max_batch_size)
        self._tracker = OffsetTracker()
        self._committed: dict[TopicPartition, int] = {}
        self._encode_thread = ThreadPoolExecutor(1, thread_name_prefix="kembed-encoder")
        self._tokenize_thread = ThreadPoolExecutor(1, thread_name_prefix="kembed-tokenizer")
        self._work_waiting = asyncio.Event()
        self._progress = asyncio.Event()  # set whenever a record is answered
        self._stopping = asyncio.Event()
        self._failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tasks: set[asyncio.Task[None]] = set()
        self._inflight_inputs = 0
        self._paused = False

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask the pipeline to drain and return from :meth:`run` (signal-handler safe)."""
        self._stopping.set()

    async def run(self) -> None:
        """Serve until :meth:`stop`, then finish in-flight work within the shutdown timeout."""
        loops = [
            asyncio.create_task(self._fetch_loop(), name="fetch"),
            asyncio.create_task(self._batch_loop(), name="batch"),
            asyncio.create_task(self._commit_loop(), name="commit"),
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
            await self._commit()
        finally:
            stopping.cancel()
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            self._encode_thread.shutdown(wait=False, cancel_futures=True)
            self._tokenize_thread.shutdown(wait=False, cancel_futures=True)

    async def on_assigned(self, partitions: set[TopicPartition]) -> None:
        log.info("partitions.assigned", partitions=_names(partitions))
        if self._paused and partitions:
            self._source.pause(partitions)

    async def on_revoked(self, partitions: set[TopicPartition]) -> None:
        """Finish the revoked partitions' requests and commit them before they move."""
        drained = await self._wait_answered(partitions, self._settings.shutdown_timeout_s)
        await self._commit(partitions)
        self._tracker.forget(partitions)
        for tp in partitions:
            self._committed.pop(tp, None)
        if partitions:
            log.info("partitions.revoked", partitions=_names(partitions), drained=drained)

    async def _wait_answered(self, partitions: set[TopicPartition] | None, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._tracker.in_flight(partitions):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), min(remaining, 0.1))
        return True

    # ------------------------------------------------------------------ fetch

    async def _fetch_loop(self) -> None:
        while not self._stopping.is_set():
            records = await self._source.poll(100, self._settings.fetch_max_records)
            if records:
                await self._admit(records)

    async def _admit(self, records: list[Record]) -> None:
        now_ms = int(time.time() * 1000)
        accepted: list[tuple[Record, EmbedRequest]] = []
        for record in records:
            self._tracker.track(record.tp, record.offset)
            decoded = decode_record(record, self._limits, now_ms)
            if isinstance(decoded, Accepted):
                accepted.append((record, decoded.request))
            elif isinstance(decoded, Rejected):
                self._reject(record, decoded)
            else:
                self._dead_letter(record, decoded)
        if accepted:
            await self._tokenize(accepted)
        if self._inflight_inputs > self._settings.max_inflight_inputs and not self._paused:
            self._paused = True
            self._source.pause(self._source.assignment())
            log.info("partitions.paused", in_flight_inputs=self._inflight_inputs)

    async def _tokenize(self, accepted: list[tuple[Record, EmbedRequest]]) -> None:
        texts = [
            (request.prompt or "") + text for _, request in accepted for text in request.inputs
        ]
        loop = asyncio.get_running_loop()
        tokenized = await loop.run_in_executor(self._tokenize_thread, self._tokenizer.encode, texts)
        now = time.monotonic()
        start = 0
        for record, request in accepted:
            pieces = tokenized[start : start + len(request.inputs)]
            start += len(request.inputs)
            self._enqueue(record, request, pieces, now)
        self._work_waiting.set()

    def _enqueue(
        self, record: Record, request: EmbedRequest, pieces: list[Tokenized], now: float
    ) -> None:
        if not request.truncate:
            too_long = next((i for i, piece in enumerate(pieces) if piece.truncated), None)
            if too_long is not None:
                error = ErrorInfo(
                    ErrorCode.INPUT_TOO_LONG,
                    f"input exceeds the model's maximum of {self._tokenizer.max_length} tokens",
                    too_long,
                )
                self._reject(record, _rejection(request, error))
                return
        count = len(pieces)
        job = Job(
            record=record,
            request=request,
            vectors=np.empty((count, self._encoder.info.dim), dtype=np.float32),
            tokens=[len(piece.ids) for piece in pieces],
            remaining=count,
        )
        self._inflight_inputs += count
        for index, piece in enumerate(pieces):
            self._batcher.add(Item(job, index, piece.ids, now))

    # ------------------------------------------------------------------ batch

    async def _batch_loop(self) -> None:
        max_wait = self._settings.max_batch_wait_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            now = time.monotonic()
            oldest = self._batcher.oldest_enqueued()
            if oldest is None or not self._batcher.ready(now, max_wait):
                timeout = None if oldest is None else oldest + max_wait - now
                self._work_waiting.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._work_waiting.wait(), timeout)
                continue
            batch = self._batcher.next_batch()
            try:
                embeddings = await loop.run_in_executor(
                    self._encode_thread, self._encoder.encode, [item.ids for item in batch]
                )
            except Exception:
                log.exception("batch.failed", inputs=len(batch))
                for job in {item.job for item in batch}:
                    self._fail(job, ErrorInfo(ErrorCode.INTERNAL, "inference failed"))
                continue
            self._scatter(batch, embeddings)

    def _scatter(self, batch: list[Item[Job]], embeddings: npt.NDArray[np.float32]) -> None:
        for item, row in zip(batch, embeddings, strict=True):
            job = item.job
            job.vectors[item.index] = row
            job.remaining -= 1
            if job.remaining == 0 and not job.settled:
                job.settled = True
                value = encode_vectors(
                    job.request,
                    job.vectors,
                    job.tokens,
                    self._model,
                    self._settings.max_result_bytes,
                )
                self._spawn(self._answer(job.record, job.request, value, len(job.tokens)))

    def _fail(self, job: Job, error: ErrorInfo) -> None:
        if not job.settled:
            job.settled = True
            value = encode_error(job.request.id, error, job.request.keys, job.request.meta)
            self._spawn(self._answer(job.record, job.request, value, len(job.tokens)))

    # ------------------------------------------------------------------ publish

    def _reject(self, record: Record, rejected: Rejected) -> None:
        log.info(
            "request.rejected",
            request_id=rejected.request_id,
            code=str(rejected.error.code),
            index=rejected.error.index,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
        )
        value = encode_error(rejected.request_id, rejected.error, rejected.keys, rejected.meta)
        target = _Reply(rejected.request_id, rejected.reply_to, rejected.reply_partition)
        self._spawn(self._answer(record, target, value, 0))

    def _dead_letter(self, record: Record, letter: DeadLetter) -> None:
        log.warning(
            "request.dead_lettered",
            code=str(letter.code),
            reason=letter.message,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
        )
        self._spawn(self._dead_letter_answer(record, str(letter.code), letter.message))

    async def _dead_letter_answer(self, record: Record, code: str, message: str) -> None:
        if await self._send_dead_letter(record, code, message):
            self._answered(record, 0)

    async def _answer(
        self, record: Record, reply: EmbedRequest | _Reply, value: bytes, inputs: int
    ) -> None:
        topic = reply.reply_to or self._settings.results_topic
        try:
            await self._publisher.send(
                topic,
                value,
                key=reply.id.encode("utf-8"),
                partition=reply.reply_partition,
                headers=result_headers(reply.id),
            )
        except PublishError as exc:
            log.warning(
                "publish.failed",
                request_id=reply.id,
                reply_to=topic,
                reason=exc.reason,
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
            )
            if not await self._send_dead_letter(record, "reply_failed", exc.reason):
                return
        self._answered(record, inputs)

    async def _send_dead_letter(self, record: Record, code: str, message: str) -> bool:
        try:
            await self._publisher.send(
                self._settings.dlq_topic,
                record.value or b"",
                key=record.key,
                headers=dead_letter_headers(record, code, message),
            )
        except PublishError as exc:
            # Nothing is committed past this record, so a restarted worker retries it.
            log.error("dead_letter.failed", reason=exc.reason, offset=record.offset)
            if not self._failure.done():
                self._failure.set_exception(exc)
            return False
        return True

    def _answered(self, record: Record, inputs: int) -> None:
        self._tracker.done(record.tp, record.offset)
        self._inflight_inputs -= inputs
        self._progress.set()
        if self._paused and self._inflight_inputs <= self._settings.max_inflight_inputs // 2:
            self._paused = False
            self._source.resume(self._source.assignment())
            log.info("partitions.resumed", in_flight_inputs=self._inflight_inputs)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and not self._failure.done():
            self._failure.set_exception(task.exception())  # type: ignore[arg-type]

    # ------------------------------------------------------------------ commit

    async def _commit_loop(self) -> None:
        interval = self._settings.commit_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            await self._commit()

    async def _commit(self, partitions: set[TopicPartition] | None = None) -> None:
        owned = self._source.assignment() if partitions is None else partitions
        offsets = {
            tp: offset
            for tp in owned
            if (offset := self._tracker.committable(tp)) is not None
            and offset != self._committed.get(tp)
        }
        if not offsets:
            return
        try:
            await self._source.commit(offsets)
        except Exception as exc:  # noqa: BLE001 (a rebalance in progress: the next commit catches up)
            log.warning("commit.failed", error=type(exc).__name__, partitions=_names(offsets))
            return
        self._committed.update(offsets)


@dataclass(frozen=True, slots=True)
class _Reply:
    id: str
    reply_to: str | None
    reply_partition: int | None


def _rejection(request: EmbedRequest, error: ErrorInfo) -> Rejected:
    return Rejected(
        request.id, request.reply_to, request.reply_partition, error, request.keys, request.meta
    )


def _names(partitions: Iterable[TopicPartition]) -> list[str]:
    return sorted(f"{topic}-{partition}" for topic, partition in partitions)
