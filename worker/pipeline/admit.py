"""Admission: records come in, are decoded (accepted, rejected or dead-lettered), counted in
flight, chunked when asked, tokenized (their kind's way: through the vector cache for
texts, as pairs for a reranker) and queued in the lane scheduler, interactive first."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import numpy as np

from kembed_shared.ports import Record, Source
from schemas import (
    DecodeRequest,
    EmbedRequest,
    ErrorCode,
    ErrorInfo,
    ModelRequest,
    TokenizeRequest,
    TokenizerRequest,
)
from worker.batcher import BULK, INTERACTIVE, Item, LaneScheduler
from worker.cache import CacheNote, Hit, VectorCache, token_count
from worker.chunking import Chunker, expand_all
from worker.decode import Accepted, Limits, ModelLimits, Rejected, decode_record
from worker.delivery import Delivery
from worker.kinds import Tokenizing, kind_of
from worker.kinds.requests import input_count, request_keys
from worker.pipeline.inflight import InFlight
from worker.pipeline.jobs import Admitted, Job
from worker.pipeline.settle import Settlement
from worker.pipeline.tasks import Tasks
from worker.served import ServedModel
from worker.settings import WorkerSettings
from worker.tokenization import Tokenized
from worker.tokenizer_answers import answer_tokenizer, tokenizer_chars

__all__ = ["Admission", "limits_for"]

_T = TypeVar("_T")

# Below this many characters, tokenizing on the event loop (~10 us per short text) beats
# handing the work to the tokenizer thread and back.
_INLINE_TOKENIZE_CHARS = 4096
# Bulk texts tokenized per step (about 10-30 ms of one core).
_BULK_TOKENIZE_TEXTS = 512


@dataclass(slots=True, eq=False, kw_only=True)
class Admission:
    source: Source
    delivery: Delivery
    models: Mapping[str, ServedModel]
    limits: Limits
    scheduler: LaneScheduler[Job]
    inflight: InFlight
    cache: VectorCache
    settlement: Settlement
    tasks: Tasks
    settings: WorkerSettings
    work_waiting: asyncio.Event
    # Per model, made on its first chunking.
    _chunkers: dict[str, Chunker] = field(init=False, default_factory=dict)
    tokenize_thread: ThreadPoolExecutor = field(
        init=False,
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="kembed-tokenizer"),
    )
    # Bulk chunks are tokenized in turn: a short one done inline must not be queued before
    # a longer one still on the tokenizer thread (the oldest input is batched first).
    _bulk_turn: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)

    async def fetch_loop(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            records = await self.source.poll(100, self.settings.fetch_max_records)
            if records:
                await self.admit(records)

    async def admit(self, records: list[Record]) -> None:
        now_ms = int(time.time() * 1000)
        accepted: dict[str, list[Admitted]] = {INTERACTIVE: [], BULK: []}
        for record in records:
            self.delivery.track(record)
            decoded = decode_record(record, self.limits, now_ms)
            if isinstance(decoded, Accepted):
                model = self.models[decoded.model]
                request = decoded.request
                if isinstance(request, TokenizeRequest | DecodeRequest):
                    self.tasks.spawn(self._answer_tokenizer(record, request, model))
                    continue
                accepted[self.inflight.lane(record.topic)].append((record, request, model))
            elif isinstance(decoded, Rejected):
                self.settlement.reject(record, decoded)
            else:
                self.settlement.dead_letter(record, str(decoded.code), decoded.message)
        for lane in (INTERACTIVE, BULK):
            if not accepted[lane]:
                continue
            # Inputs count as in flight from here, so backpressure sees them at once.
            self.inflight.admit(lane, sum(input_count(request) for _, request, _ in accepted[lane]))
            if lane == INTERACTIVE:
                await self._tokenize(lane, accepted[lane])
            else:
                # A large bulk poll must not hold up the next poll's interactive records, nor
                # take the CPU in one long burst: it is tokenized in chunks, in order (one
                # tokenizer thread), each queued for batching as soon as it is ready.
                for chunk in _chunks(accepted[lane], _BULK_TOKENIZE_TEXTS):
                    self.tasks.spawn(self._tokenize_in_turn(lane, chunk))

    async def _tokenize_in_turn(self, lane: str, accepted: list[Admitted]) -> None:
        """:meth:`_tokenize` once the chunks spawned before this one are queued (the lock
        is fair: tasks wait in the order they were spawned)."""
        async with self._bulk_turn:
            await self._tokenize(lane, accepted)

    async def _answer_tokenizer(
        self, record: Record, request: TokenizerRequest, model: ServedModel
    ) -> None:
        """A tokenize or decode request: answered from the tokenizer, not batched."""
        work = partial(
            answer_tokenizer,
            request,
            model,
            self.settlement.max_result_bytes,
            record.timestamp_ms,
        )
        value, outcome = await self._offload(work, tokenizer_chars(request))
        self.settlement.answer(record, request, value, model.name, outcome)

    async def _offload(self, work: Callable[[], _T], chars: int) -> _T:
        if chars <= _INLINE_TOKENIZE_CHARS:
            return work()  # cheaper than a thread hop
        return await asyncio.get_running_loop().run_in_executor(self.tokenize_thread, work)

    async def _tokenize(self, lane: str, accepted: list[Admitted]) -> None:
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
            model = self.models[name]
            requests = [accepted[p][1] for p in positions]
            call = Tokenizing(model, direction, self.cache, self._offload)
            pieces = await kind_of(model).tokenize(requests, call)
            for position, (inputs, filed) in zip(positions, pieces, strict=True):
                tokenized[position] = inputs
                notes[position] = filed
        now = time.monotonic()
        for admitted, inputs, filed in zip(accepted, tokenized, notes, strict=True):
            self._enqueue(lane, *admitted, inputs, now, filed)
        self.work_waiting.set()

    async def _expand(self, lane: str, accepted: list[Admitted]) -> list[Admitted]:
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
        settings = self.settings
        expand = partial(
            expand_all, work, settings.max_client_batch_size, settings.max_chunk_tokens_factor
        )
        chars = sum(len(text) for request, _, _ in work for text in request.inputs)
        expanded = await self._offload(expand, chars)
        kept: list[Admitted | None] = list(accepted)
        for position, outcome in zip(chunked, expanded, strict=True):
            record, request, model = accepted[position]
            if isinstance(outcome, ErrorInfo):
                rejection = rejection_of(request, outcome)
                self.settlement.reject(
                    record, rejection, reserved=input_count(request), model=model.name
                )
                kept[position] = None
            else:
                self.inflight.inputs[lane] += len(outcome.inputs) - input_count(request)
                kept[position] = (record, outcome, model)
        self.inflight.apply_backpressure(lane)
        return [admitted for admitted in kept if admitted is not None]

    def _enqueue(
        self,
        lane: str,
        record: Record,
        request: ModelRequest,
        model: ServedModel,
        pieces: list[Tokenized | Hit],
        now: float,
        notes: list[CacheNote],
    ) -> None:
        kind = kind_of(model)
        if not request.truncate:
            too_long = next((i for i, piece in enumerate(pieces) if piece.truncated), None)
            if too_long is not None:
                limit = model.tokenizer.max_length
                error = ErrorInfo(
                    ErrorCode.INPUT_TOO_LONG,
                    f"{kind.input_name} exceeds the model's maximum of {limit} tokens",
                    too_long,
                )
                rejection = rejection_of(request, error)
                self.settlement.reject(record, rejection, reserved=len(pieces), model=model.name)
                return
        count = len(pieces)
        tokens = [token_count(piece) for piece in pieces]
        self.inflight.tokens[lane] += sum(tokens)
        job = Job(
            record=record,
            request=request,
            lane=lane,
            model=model,
            vectors=np.empty((count, model.encoder.info.dim), dtype=np.float32),
            tokens=tokens,
            remaining=count,
            cache_notes=notes,
            segments=kind.segments(pieces),
        )
        for index, piece in enumerate(pieces):
            if isinstance(piece, Hit):
                job.vectors[index] = piece.vector
                job.remaining -= 1
            else:
                self.scheduler.add(lane, Item(job, index, piece.ids, now), model.name)
        if count and not job.remaining:  # every input was cached
            self.settlement.settle(job)


def limits_for(models: Sequence[ServedModel], settings: WorkerSettings) -> Limits:
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


def rejection_of(request: ModelRequest, error: ErrorInfo) -> Rejected:
    return Rejected(
        request.id,
        request.reply_to,
        request.reply_partition,
        error,
        request_keys(request),
        request.meta,
    )


def _chunks(accepted: list[Admitted], max_texts: int) -> Iterator[list[Admitted]]:
    """Whole requests, grouped into chunks of about ``max_texts`` inputs."""
    chunk: list[Admitted] = []
    texts = 0
    for pair in accepted:
        chunk.append(pair)
        texts += input_count(pair[1])
        if texts >= max_texts:
            yield chunk
            chunk, texts = [], 0
    if chunk:
        yield chunk
