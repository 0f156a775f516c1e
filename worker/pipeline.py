"""The worker's data path: fetch -> decode -> tokenize -> batch -> encode -> publish -> commit.

Three loops share one event loop:

- fetch: polls records, decodes them, tokenizes accepted requests in a thread (interactive
  lane first), and queues their inputs in the lane scheduler; pauses a lane's partitions
  while that lane has too many inputs in flight;
- batch: keeps the encoder thread busy with exactly one batch prepared ahead of it; a
  prepared bulk batch yields to interactive work that becomes ready meanwhile. torch
  releases the GIL, so fetches, heartbeats and publishes go on during inference. A
  finished request is published by its own task. A batch whose encoder call fails is split
  in halves, retried ahead of new batches, until the failing input runs alone: only its
  request is answered ``internal``. Out of memory also lowers that lane's token budget for
  a while (see :class:`worker.batcher.TokenBudget`);
- commit: the delivery strategy's loop (``worker.delivery``): at least once, it commits,
  per partition, up to the first record not yet answered (acknowledged by the broker), so a
  crash redelivers rather than loses; exactly once, it writes answers and offsets together
  in Kafka transactions.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import structlog

from kembed_shared.ports import Publisher, Record, Source, TopicPartition, TransactionalPublisher
from schemas import EmbedRequest, ErrorCode, ErrorInfo, Request, RerankRequest
from schemas.catalog import ModelDescription
from worker.batcher import BULK, INTERACTIVE, Item, LaneScheduler, TokenBudget
from worker.cache import CacheNote, Hit, VectorCache, token_count
from worker.chunking import Chunker, expand_all, input_index
from worker.decode import Accepted, Limits, ModelLimits, Rejected, decode_record
from worker.delivery import make_delivery
from worker.encoder import Encoder, EncoderOutOfMemoryError, ModelInfo, Prepared
from worker.metrics import Metrics
from worker.offsets import OffsetTracker
from worker.publish import encode_error, encode_vectors
from worker.replies import ReplyTo
from worker.rerank import EMBED, RERANK, encode_scores, input_count, request_keys
from worker.settings import WorkerSettings
from worker.tokenization import TextTokenizer, Tokenized

__all__ = ["Pipeline", "ServedModel"]

log = structlog.get_logger("kembed.worker")

# Below this many characters, tokenizing on the event loop (~10 us per short text) beats
# handing the work to the tokenizer thread and back.
_INLINE_TOKENIZE_CHARS = 4096
# Bulk texts tokenized per step (about 10-30 ms of one core).
_BULK_TOKENIZE_TEXTS = 512
_EXPIRED_QUEUED = "deadline passed while queued, before computation"
# After a batch ran out of memory, its lane's token budget stays lowered this long before
# each step back up (TokenBudget).
_BUDGET_RESTORE_S = 60.0


@dataclass(frozen=True, slots=True)
class ServedModel:
    """A model the worker serves, with what it takes to run requests for it."""

    name: str
    """Served name: requests' ``model`` and results' ``model``."""
    encoder: Encoder
    tokenizer: TextTokenizer
    aliases: frozenset[str] = frozenset()
    """Other names requests may use for it."""
    prompts: Mapping[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    requests_topic: str = ""
    bulk_topic: str = ""
    """Its request topics ("": none). Of requests that name no model, it answers those of
    the topics it is the first model of (the first model answers any other topic's)."""
    kind: str = EMBED
    """``embed``: an embedding model (embed requests); ``rerank``: a cross-encoder, whose
    encoder returns one logit per (query, document) pair (rerank requests)."""
    activation: str = "sigmoid"
    """A reranker's activation (``worker.rerank.ACTIVATIONS``), applied to its logits
    unless a request asks for raw scores."""

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(topic for topic in (self.requests_topic, self.bulk_topic) if topic)

    @property
    def description(self) -> ModelDescription:
        """The model as clients see it (its catalog card, the model section of ``/info``),
        as its encoder runs now."""
        info = self.encoder.info
        return ModelDescription(
            name=self.name,
            aliases=tuple(sorted(self.aliases)),
            dim=info.dim,
            max_seq_length=info.max_seq_length,
            pooling=info.pooling,
            dtype=info.dtype,
            quantization=info.quantization or "none",
            device=info.device,
            prompts=dict(self.prompts),
            default_prompt_name=self.default_prompt_name or None,
            requests_topic=self.requests_topic,
            bulk_topic=self.bulk_topic or None,
            kind=self.kind,
        )

    def prompt_for(self, request: EmbedRequest) -> str:
        """The text put before each input: the request's prompt, its named prompt, or the
        model's default prompt."""
        if request.prompt is not None:
            return request.prompt
        name = request.prompt_name or self.default_prompt_name
        return self.prompts[name] if name else ""


@dataclass(eq=False, slots=True)
class Job:
    """A request whose inputs are being encoded; published when ``remaining`` reaches 0."""

    record: Record
    request: Request
    lane: str
    model: ServedModel
    vectors: npt.NDArray[np.float32]
    tokens: list[int]
    remaining: int
    settled: bool = field(default=False)
    cache_notes: list[CacheNote] = field(default_factory=list)
    """Per input, how the vector cache files it once encoded (empty: cache off)."""
    segments: list[int] | None = None
    """A rerank job's pairs: per pair, its first segment's length (token types)."""


@dataclass(slots=True)
class _Batch:
    model: ServedModel
    lane: str
    items: list[Item[Job]]
    prepared: Prepared
    started: float = 0.0
    retry: bool = False
    """Half of a failed batch: it runs before new batches and is never preempted or
    refilled, so that the failing input is isolated in a few steps."""
    ran_as: ModelInfo | None = None
    """The encoder variant that ran it, read on the encoder thread (the vector cache files
    its vectors under it)."""


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
        self._metrics = metrics or Metrics()
        self._models = {model.name: model for model in models}
        self._settings = settings
        self._cache = cache if cache is not None else VectorCache(0)
        for model in models:
            self._cache.watch(model.name)
        self._bulk_topics = frozenset(model.bulk_topic for model in models) - {""}
        self._limits = _limits(models, settings)
        self._scheduler: LaneScheduler[Job] = LaneScheduler(
            settings.max_batch_tokens,
            settings.max_batch_size,
            settings.bulk_every,
            busy_bulk_tokens=settings.busy_bulk_batch_tokens,
            models=[model.name for model in models],
        )
        self._max_wait = settings.max_batch_wait_ms / 1000
        # Halves of failed batches, waiting to run ahead of new batches.
        self._retries: deque[tuple[ServedModel, str, list[Item[Job]]]] = deque()
        self._budgets = {
            (model.name, lane): TokenBudget(
                settings.max_batch_tokens, model.encoder.info.max_seq_length, _BUDGET_RESTORE_S
            )
            for model in models
            for lane in (INTERACTIVE, BULK)
        }
        for (name, lane), budget in self._budgets.items():
            self._metrics.effective_batch_tokens.labels(name, lane).set(budget.tokens)
        for lane in (INTERACTIVE, BULK):  # exposed at 0 from the start, so rate() sees the 1st
            for reason in ("error", "out_of_memory"):
                self._metrics.batch_splits.labels(lane, reason)
        self._chunkers: dict[str, Chunker] = {}  # per model, made on its first chunking
        self._tracker = OffsetTracker()
        self._failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._delivery = make_delivery(
            publisher,
            source=source,
            tracker=self._tracker,
            settings=settings,
            on_fatal=self._fail_worker,
            retry_for_s=settings.publish_retry_s,
            on_retry=self._metrics.publish_retries.inc,
            on_dead_letter=lambda code: self._metrics.dlq_messages.labels(code).inc(),
        )
        # One thread runs every batch: the encoder is not thread-safe, and torch's thread
        # settings (and a compiled model's specializations) belong to that thread.
        self._encode_thread = encode_thread or ThreadPoolExecutor(
            1, thread_name_prefix="kembed-encoder"
        )
        self._tokenize_thread = ThreadPoolExecutor(1, thread_name_prefix="kembed-tokenizer")
        self._work_waiting = asyncio.Event()
        self._progress = asyncio.Event()  # set whenever a record is answered
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._inflight = {INTERACTIVE: 0, BULK: 0}  # inputs accepted and not answered
        self._inflight_tokens = {INTERACTIVE: 0, BULK: 0}  # their tokens, once tokenized
        self._tokens_per_request = {INTERACTIVE: 0.0, BULK: 0.0}  # moving average
        self._paused: set[str] = set()
        self._running_since: float | None = None
        self._lags: dict[TopicPartition, int] = {}
        for lane in (INTERACTIVE, BULK):
            m = self._metrics
            m.inflight_inputs.labels(lane).set_function(partial(self._inflight.__getitem__, lane))
            m.inflight_tokens.labels(lane).set_function(
                partial(self._inflight_tokens.__getitem__, lane)
            )
            m.paused_partitions.labels(lane).set_function(partial(self._paused_count, lane))
            m.backlog_tokens.labels(lane).set_function(partial(self._backlog_tokens, lane))

    # ------------------------------------------------------------------ probes

    def assigned_partitions(self) -> set[TopicPartition]:
        return self._source.assignment()

    def busy_seconds(self) -> float | None:
        started = self._running_since
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
            asyncio.create_task(self._fetch_loop(), name="fetch"),
            asyncio.create_task(self._batch_loop(), name="batch"),
            asyncio.create_task(self._delivery.run(), name="commit"),
            asyncio.create_task(self._lag_loop(), name="lag"),
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
            self._encode_thread.shutdown(wait=False, cancel_futures=True)
            self._tokenize_thread.shutdown(wait=False, cancel_futures=True)

    async def on_assigned(self, partitions: set[TopicPartition]) -> None:
        log.info("partitions.assigned", partitions=_names(partitions))
        paused = {tp for tp in partitions if self._lane(tp[0]) in self._paused}
        if paused:
            self._source.pause(paused)

    async def on_revoked(self, partitions: set[TopicPartition]) -> None:
        """Finish the revoked partitions' requests and commit them before they move."""
        drained = await self._wait_answered(partitions, self._settings.shutdown_timeout_s)
        await self._delivery.commit(partitions)
        self._delivery.forget(partitions)
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

    def _fail_worker(self, error: BaseException) -> None:
        if not self._failure.done():
            self._failure.set_exception(error)

    def _lane(self, topic: str) -> str:
        return BULK if topic in self._bulk_topics else INTERACTIVE

    # ------------------------------------------------------------------ fetch

    async def _fetch_loop(self) -> None:
        while not self._stopping.is_set():
            records = await self._source.poll(100, self._settings.fetch_max_records)
            if records:
                await self._admit(records)

    async def _admit(self, records: list[Record]) -> None:
        now_ms = int(time.time() * 1000)
        accepted: dict[str, list[_Admitted]] = {INTERACTIVE: [], BULK: []}
        for record in records:
            self._delivery.track(record)
            decoded = decode_record(record, self._limits, now_ms)
            if isinstance(decoded, Accepted):
                model = self._models[decoded.model]
                accepted[self._lane(record.topic)].append((record, decoded.request, model))
            elif isinstance(decoded, Rejected):
                self._reject(record, decoded)
            else:
                log.warning(
                    "request.dead_lettered",
                    code=str(decoded.code),
                    reason=decoded.message,
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                )
                self._spawn(self._dead_letter(record, str(decoded.code), decoded.message))
        for lane in (INTERACTIVE, BULK):
            if not accepted[lane]:
                continue
            # Inputs count as in flight from here, so backpressure sees them at once.
            self._inflight[lane] += sum(input_count(request) for _, request, _ in accepted[lane])
            self._apply_backpressure(lane)
            if lane == INTERACTIVE:
                await self._tokenize(lane, accepted[lane])
            else:
                # A large bulk poll must not hold up the next poll's interactive records, nor
                # take the CPU in one long burst: it is tokenized in chunks, in order (one
                # tokenizer thread), each queued for batching as soon as it is ready.
                for chunk in _chunks(accepted[lane], _BULK_TOKENIZE_TEXTS):
                    self._spawn(self._tokenize(lane, chunk))

    async def _tokenize(self, lane: str, accepted: list[_Admitted]) -> None:
        """Tokenize ``accepted`` (in one call per model and truncation side) and queue the
        inputs for batching, in the order the requests came."""
        if any(
            isinstance(request, EmbedRequest) and request.chunking for _, request, _ in accepted
        ):
            accepted = await self._expand(lane, accepted)
        groups: dict[tuple[str, str | None], list[int]] = {}
        for position, (_, request, model) in enumerate(accepted):
            groups.setdefault((model.name, request.truncation_direction), []).append(position)
        tokenized: list[list[Tokenized | Hit]] = [[] for _ in accepted]
        notes: list[list[CacheNote]] = [[] for _ in accepted]
        for (name, direction), positions in groups.items():
            model = self._models[name]
            requests = [accepted[p][1] for p in positions]
            if model.kind == RERANK:  # (query, document) pairs; never cached
                pairs = [
                    (request.query, document)
                    for request in requests
                    if isinstance(request, RerankRequest)
                    for document in request.documents
                ]
                encode_pairs = partial(model.tokenizer.encode_pairs, pairs, direction)
                if sum(len(q) + len(d) for q, d in pairs) <= _INLINE_TOKENIZE_CHARS:
                    scored: list[Tokenized | Hit] = list(encode_pairs())
                else:
                    loop = asyncio.get_running_loop()
                    scored = list(await loop.run_in_executor(self._tokenize_thread, encode_pairs))
                start = 0
                for position, request in zip(positions, requests, strict=True):
                    count = input_count(request)
                    tokenized[position] = scored[start : start + count]
                    start += count
                continue
            texts = [
                model.prompt_for(request) + text
                for request in requests
                if isinstance(request, EmbedRequest)
                for text in request.inputs
            ]
            # Cached texts skip the tokenizer and the encoder.
            side = direction or model.tokenizer.direction
            lookup = self._cache.lookup(model.name, model.encoder.info, side, texts)
            encode = partial(model.tokenizer.encode, lookup.misses, direction)
            if not lookup.misses:
                misses = []
            elif sum(map(len, lookup.misses)) <= _INLINE_TOKENIZE_CHARS:
                misses = encode()  # cheaper than a thread hop
            else:
                loop = asyncio.get_running_loop()
                misses = await loop.run_in_executor(self._tokenize_thread, encode)
            pieces, filed = lookup.complete(misses)
            start = 0
            for position in positions:
                count = input_count(accepted[position][1])
                tokenized[position] = pieces[start : start + count]
                notes[position] = filed[start : start + count]
                start += count
        now = time.monotonic()
        for admitted, pieces, filed in zip(accepted, tokenized, notes, strict=True):
            self._enqueue(lane, *admitted, pieces, now, filed)
        self._work_waiting.set()

    async def _expand(self, lane: str, accepted: list[_Admitted]) -> list[_Admitted]:
        """Chunked requests become requests for their chunk texts (worker.chunking), each
        chunk an input in flight; those that cannot be chunked are answered."""
        chunked = [
            p
            for p, (_, request, _) in enumerate(accepted)
            if isinstance(request, EmbedRequest) and request.chunking
        ]
        work = []
        for _, request, model in (accepted[p] for p in chunked):
            assert isinstance(request, EmbedRequest)
            if model.name not in self._chunkers:
                tokenizer = model.tokenizer
                self._chunkers[model.name] = Chunker(tokenizer.tokenizer, tokenizer.max_length)
            work.append((request, self._chunkers[model.name], model.prompt_for(request)))
        settings = self._settings
        expand = partial(
            expand_all, work, settings.max_client_batch_size, settings.max_chunk_tokens_factor
        )
        chars = sum(len(text) for request, _, _ in work for text in request.inputs)
        if chars <= _INLINE_TOKENIZE_CHARS:
            expanded = expand()  # cheaper than a thread hop
        else:
            expanded = await asyncio.get_running_loop().run_in_executor(
                self._tokenize_thread, expand
            )
        kept: list[_Admitted | None] = list(accepted)
        for position, outcome in zip(chunked, expanded, strict=True):
            record, request, model = accepted[position]
            if isinstance(outcome, ErrorInfo):
                rejection = _rejection(request, outcome)
                self._reject(record, rejection, reserved=input_count(request), model=model.name)
                kept[position] = None
            else:
                self._inflight[lane] += len(outcome.inputs) - input_count(request)
                kept[position] = (record, outcome, model)
        self._apply_backpressure(lane)
        return [admitted for admitted in kept if admitted is not None]

    def _enqueue(
        self,
        lane: str,
        record: Record,
        request: Request,
        model: ServedModel,
        pieces: list[Tokenized | Hit],
        now: float,
        notes: list[CacheNote],
    ) -> None:
        if not request.truncate:
            too_long = next((i for i, piece in enumerate(pieces) if piece.truncated), None)
            if too_long is not None:
                limit = model.tokenizer.max_length
                what = "(query, document) pair" if model.kind == RERANK else "input"
                error = ErrorInfo(
                    ErrorCode.INPUT_TOO_LONG,
                    f"{what} exceeds the model's maximum of {limit} tokens",
                    too_long,
                )
                rejection = _rejection(request, error)
                self._reject(record, rejection, reserved=len(pieces), model=model.name)
                return
        count = len(pieces)
        tokens = [token_count(piece) for piece in pieces]
        self._inflight_tokens[lane] += sum(tokens)
        job = Job(
            record=record,
            request=request,
            lane=lane,
            model=model,
            vectors=np.empty((count, model.encoder.info.dim), dtype=np.float32),
            tokens=tokens,
            remaining=count,
            cache_notes=notes,
        )
        if model.kind == RERANK:
            job.segments = [piece.segment or 0 for piece in pieces if isinstance(piece, Tokenized)]
        for index, piece in enumerate(pieces):
            if isinstance(piece, Hit):
                job.vectors[index] = piece.vector
                job.remaining -= 1
            else:
                self._scheduler.add(lane, Item(job, index, piece.ids, now), model.name)
        if count and not job.remaining:  # every input was cached
            self._settle(job)

    def _apply_backpressure(self, lane: str) -> None:
        if self._inflight[lane] > self._settings.max_inflight_inputs and lane not in self._paused:
            self._paused.add(lane)
            self._source.pause(self._lane_partitions(lane))
            log.info("partitions.paused", lane=lane, in_flight_inputs=self._inflight[lane])

    def _release_backpressure(self, lane: str) -> None:
        if lane in self._paused and self._inflight[lane] <= self._settings.max_inflight_inputs // 2:
            self._paused.discard(lane)
            self._source.resume(self._lane_partitions(lane))
            log.info("partitions.resumed", lane=lane, in_flight_inputs=self._inflight[lane])

    def _paused_count(self, lane: str) -> int:
        return len(self._lane_partitions(lane)) if lane in self._paused else 0

    def _lane_partitions(self, lane: str) -> set[TopicPartition]:
        return {tp for tp in self._source.assignment() if self._lane(tp[0]) == lane}

    # ------------------------------------------------------------------ batch

    async def _batch_loop(self) -> None:
        """Run the encoder back to back, with one batch always prepared ahead of it."""
        prepared: _Batch | None = None
        running: tuple[_Batch, asyncio.Future[npt.NDArray[np.float32]]] | None = None
        while True:
            now = time.monotonic()
            if prepared and prepared.retry:
                pass  # runs as it is, next
            elif prepared and self._scheduler.preemptible(prepared.lane, now, self._max_wait):
                self._scheduler.put_back(prepared.lane, prepared.items, prepared.model.name)
                prepared = None
            elif prepared and self._refillable(prepared):
                model, lane = prepared.model, prepared.lane
                items = self._live(self._scheduler.refill(lane, prepared.items, model.name))
                prepared = (
                    _Batch(model, lane, items, self._prepare(model, items)) if items else None
                )
            if prepared is None:
                prepared = self._cut(now)
            if running is None and prepared is not None:
                running, prepared = self._start(prepared), None
                continue
            waits: list[asyncio.Future[Any]] = []
            if running is not None:
                waits.append(running[1])
            self._work_waiting.clear()
            waits.append(asyncio.ensure_future(self._work_waiting.wait()))
            if prepared is not None and prepared.retry:
                wake = None  # it runs next whatever the clock says
            else:
                wake = self._scheduler.wake_at(prepared.lane if prepared else None, self._max_wait)
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

    def _start(
        self, batch: _Batch
    ) -> tuple[_Batch, asyncio.Future[npt.NDArray[np.float32]]] | None:
        """Run ``batch`` on the encoder thread, without the inputs that expired meanwhile."""
        live = self._live(batch.items)
        if not live:
            return None
        if len(live) < len(batch.items):
            prepared = self._prepare(batch.model, live)
            batch = _Batch(batch.model, batch.lane, live, prepared, retry=batch.retry)
        batch.started = self._running_since = time.monotonic()
        self._observe_batch(batch)
        loop = asyncio.get_running_loop()
        return batch, loop.run_in_executor(self._encode_thread, _run, batch)

    def _observe_batch(self, batch: _Batch) -> None:
        m, lane = self._metrics, batch.lane
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
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                )
                self._settle(job, ErrorInfo(ErrorCode.DEADLINE_EXCEEDED, _EXPIRED_QUEUED))
            if not job.settled:
                live.append(item)
        return live

    def _refillable(self, batch: _Batch) -> bool:
        """A prepared batch less than half full is cut again when new inputs of its lane
        wait (requests trickling in while the encoder is busy); fuller ones run as they are,
        since re-cutting them would cost more than it gains."""
        lane = self._scheduler.lane(batch.lane, batch.model.name)
        return (
            len(lane) > 0
            and batch.prepared.rows * 2 <= self._settings.max_batch_size
            and batch.prepared.padded_tokens * 2 <= lane.max_batch_tokens
        )

    def _cut(self, now: float) -> _Batch | None:
        while self._retries:
            model, lane, items = self._retries.popleft()
            items = self._live(items)
            if items:
                return _Batch(model, lane, items, self._prepare(model, items), retry=True)
        while (chosen := self._scheduler.next_model_batch(now, self._max_wait)) is not None:
            name, lane, items = chosen
            items = self._live(items)
            if items:
                model = self._models[name]
                return _Batch(model, lane, items, self._prepare(model, items))
        return None

    def _prepare(self, model: ServedModel, items: list[Item[Job]]) -> Prepared:
        ids = [item.ids for item in items]
        if model.kind != RERANK:
            return model.encoder.prepare(ids)
        return model.encoder.prepare(ids, [_segment(item) for item in items])

    def _finish(self, batch: _Batch, future: asyncio.Future[npt.NDArray[np.float32]]) -> None:
        if self._running_since == batch.started:
            self._running_since = None
        self._metrics.inference_seconds.labels(batch.lane).observe(time.monotonic() - batch.started)
        error = future.exception()
        if error is not None:
            self._failed(batch, error)
            return
        budget = self._budgets[batch.model.name, batch.lane]
        if budget.succeeded(time.monotonic()):
            self._set_budget(batch, budget)
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
            self._cache.store(
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
                self._settle(job)

    def _failed(self, batch: _Batch, error: BaseException) -> None:
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
            budget = self._budgets[model, lane]
            if budget.out_of_memory(batch.prepared.padded_tokens, time.monotonic()):
                self._set_budget(batch, budget)
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
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
            )
            message = "inference failed" + (" (out of memory)" if oom else "")
            index = item.index
            if isinstance(job.request, EmbedRequest):  # a chunk's: its input's
                index = input_index(job.request, item.index)
            self._settle(job, ErrorInfo(ErrorCode.INTERNAL, message, index))
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
        self._metrics.batch_splits.labels(lane, reason).inc()
        log.info(
            "batch.split",
            model=model,
            lane=lane,
            reason=reason,
            inputs=len(items),
            halves=[len(part) for part in halves],
        )

    def _set_budget(self, batch: _Batch, budget: TokenBudget) -> None:
        model, lane = batch.model.name, batch.lane
        self._scheduler.lane(lane, model).max_batch_tokens = budget.tokens
        self._metrics.effective_batch_tokens.labels(model, lane).set(budget.tokens)

    def _settle(self, job: Job, error: ErrorInfo | None = None) -> None:
        """Publish a job's result (or ``error``) once, whatever happens to its other inputs."""
        if job.settled:
            return
        job.settled = True
        request = job.request
        if error is not None:
            value = encode_error(request.id, error, request_keys(request), request.meta)
        elif isinstance(request, RerankRequest):
            value = encode_scores(
                request,
                job.vectors,
                job.tokens,
                job.model.name,
                job.model.activation,
                self._settings.max_result_bytes,
                requested_ms=job.record.timestamp_ms,
            )
        else:
            value = encode_vectors(
                request,
                job.vectors,
                job.tokens,
                job.model.name,
                self._settings.max_result_bytes,
                requested_ms=job.record.timestamp_ms,
            )
        reply = ReplyTo(request.id, request.reply_to, request.reply_partition, job.lane)
        outcome = "ok" if error is None else str(error.code)
        tokens = sum(job.tokens)
        self._inflight_tokens[job.lane] -= tokens
        average = self._tokens_per_request[job.lane]
        self._tokens_per_request[job.lane] = tokens if not average else 0.9 * average + 0.1 * tokens
        self._spawn(
            self._answer(
                job.record, reply, value, job.lane, job.model.name, len(job.tokens), outcome, tokens
            )
        )

    # ------------------------------------------------------------------ publish

    def _reject(
        self, record: Record, rejected: Rejected, reserved: int = 0, model: str | None = None
    ) -> None:
        """Answer with an error; ``reserved`` inputs of the request were counted in flight.
        ``model``: the request's model, when known (metrics count the error under it)."""
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
        lane = self._lane(record.topic)
        reply = ReplyTo(rejected.request_id, rejected.reply_to, rejected.reply_partition, lane)
        outcome = str(rejected.error.code)
        if model is None:
            default = self._limits.model_for(None, record.topic)
            model = default.name if default is not None else ""
        self._spawn(self._answer(record, reply, value, lane, model, reserved, outcome, 0))

    async def _answer(
        self,
        record: Record,
        reply: ReplyTo,
        value: bytes,
        lane: str,
        model: str,
        inputs: int,
        outcome: str,
        tokens: int,
    ) -> None:
        if await self._delivery.answer(record, reply, value):
            log.debug(
                "request.answered",
                request_id=reply.id,
                inputs=inputs,
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
            )
            self._answered(record, lane, inputs)
            m = self._metrics
            m.requests.labels(model, outcome).inc()
            m.inputs.labels(model, outcome).inc(inputs)
            m.tokens.labels(model, outcome).inc(tokens)
            if record.timestamp_ms is not None and record.timestamp_ms > 0:
                m.latency_seconds.labels(lane).observe(
                    max(0.0, time.time() - record.timestamp_ms / 1000)
                )

    async def _dead_letter(self, record: Record, code: str, message: str) -> None:
        if await self._delivery.dead_letter(record, code, message):
            self._answered(record, self._lane(record.topic), 0)

    def _answered(self, record: Record, lane: str, inputs: int) -> None:
        self._inflight[lane] -= inputs
        self._progress.set()
        self._release_backpressure(lane)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            self._fail_worker(error)

    # ------------------------------------------------------------------ lag

    async def _lag_loop(self, every: float = 1.0) -> None:
        """Refresh the lag and backlog gauges from the consumer's fetch positions."""
        shown: set[TopicPartition] = set()
        while True:
            lags = self._source.lag()
            for tp in shown - lags.keys():
                with contextlib.suppress(KeyError):
                    self._metrics.consumer_lag.remove(tp[0], str(tp[1]))
            for (topic, partition), lag in lags.items():
                self._metrics.consumer_lag.labels(topic, str(partition)).set(lag)
            shown = set(lags)
            self._lags = lags
            await asyncio.sleep(every)

    def _backlog_tokens(self, lane: str) -> float:
        """Tokens waiting for this worker in ``lane``: unfetched requests (lag, as of the last
        refresh) at the average tokens per request seen, plus the tokens in flight now."""
        waiting = sum(lag for tp, lag in self._lags.items() if self._lane(tp[0]) == lane)
        return waiting * self._tokens_per_request[lane] + self._inflight_tokens[lane]


_Admitted = tuple[Record, Request, ServedModel]


def _run(batch: _Batch) -> npt.NDArray[np.float32]:
    """Run ``batch`` (on the encoder thread), noting the variant that ran it: the tuner
    installs variants on this thread, between batches."""
    encoder = batch.model.encoder
    rows = encoder.run(batch.prepared)
    batch.ran_as = encoder.info
    return rows


def _limits(models: Sequence[ServedModel], settings: WorkerSettings) -> Limits:
    """What decoding checks requests against: every served name and alias, and which model
    answers each topic's requests that name none."""
    names: dict[str, ModelLimits] = {}
    topics: dict[str, str] = {}
    for model in models:
        info = model.encoder.info
        limits = ModelLimits(
            model.name, info.dim, frozenset(model.prompts), info.max_seq_length, model.kind
        )
        for name in (model.name, *sorted(model.aliases)):
            names.setdefault(name, limits)
        for topic in model.topics:
            topics.setdefault(topic, model.name)
    return Limits(
        max_request_bytes=settings.max_request_bytes,
        max_client_batch_size=settings.max_client_batch_size,
        models=names,
        topic_models=topics,
        reply_allowed=settings.reply_topic_allowed,
        ingest_topic=settings.ingest_topic,
        bulk_topics=frozenset(model.bulk_topic for model in models) - {""},
        max_input_chars=settings.max_input_chars,
    )


def _rejection(request: Request, error: ErrorInfo) -> Rejected:
    return Rejected(
        request.id,
        request.reply_to,
        request.reply_partition,
        error,
        request_keys(request),
        request.meta,
    )


def _segment(item: Item[Job]) -> int:
    segments = item.job.segments
    return segments[item.index] if segments else len(item.ids)


def _chunks(accepted: list[_Admitted], max_texts: int) -> Iterator[list[_Admitted]]:
    """Whole requests, grouped into chunks of about ``max_texts`` inputs."""
    chunk: list[_Admitted] = []
    texts = 0
    for pair in accepted:
        chunk.append(pair)
        texts += input_count(pair[1])
        if texts >= max_texts:
            yield chunk
            chunk, texts = [], 0
    if chunk:
        yield chunk


def _names(partitions: Iterable[TopicPartition]) -> list[str]:
    return sorted(f"{topic}-{partition}" for topic, partition in partitions)
