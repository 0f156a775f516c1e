"""Bulk ingestion: stream documents into ``submit`` calls (JSONL files: ``producer_sdk.jsonl``).

    async with EmbedClient(servers, read_replies=False) as client:
        summary = await ingest(
            client, JsonlReader("docs.jsonl", meta_fields=["title"]), reply_to="embed.ingest.docs"
        )

``ingest`` takes any iterable or async iterable of :class:`Document` and never holds more
than ``max_in_flight + 1`` batches of it: it reads the next batch only while fewer than
``max_in_flight`` requests await the broker's acknowledgement. It returns when every
request is acknowledged (not answered: the answers go to ``reply_to`` for a sink to read).
A plain iterable is read on the event loop, between sends: it should be quick to advance
(a file is); wrap a slow source in an async iterable.

With ``chunking`` the worker cuts each document into windows of ``max_tokens`` tokens and
answers with one vector per chunk (``chunk_pooling="none"``, a sink writes rows
``{id}#{k}``) or one per document (``"mean"``). A request's chunks count against the
workers' ``max_client_batch_size`` and its result (chunks x vector bytes) against their
``max_result_bytes``, so a request then holds documents up to an estimated
``chunks_per_request`` chunks (at most ``batch_size`` documents; a document alone may
exceed it), the estimate taking 3 characters per token (most text has more, so it errs on
the small side).

With ``sparse_model`` each batch is also sent as a sparse request (``submit_sparse``: the
same keys, metadata, ``reply_to`` and ``meta``; ``sparse_top_k`` caps each document's
terms), so a sink writes both kinds of each document (one row per key in PostgreSQL);
``dense=False`` sends the sparse requests only. Sparse requests are not chunked: one
sparse vector per document, over its first window (truncated).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from producer_sdk.errors import IngestError, RequestTooLargeError
from schemas import Chunking

__all__ = [
    "Document",
    "IngestSummary",
    "Submitter",
    "check_chunk_options",
    "estimated_chunks",
    "ingest",
]

CHARS_PER_TOKEN = 3
"""The chunk estimate's characters per token: fewer than most text has, so it overestimates."""
CHUNK_POOLING_META = "chunk_pooling"
"""The request-level ``meta`` key that tells a sink the vectors are pooled per document
(``"mean"``): set by ``ingest`` (schemas/README.md, "Ingestion conventions")."""


class Document(NamedTuple):
    """One document: its text, its id (the row id a sink writes) and optional metadata."""

    text: str
    id: str | int
    metadata: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class IngestSummary:
    """What the broker has acknowledged so far (progress) or in all (the end)."""

    documents: int
    requests: int
    bytes: int
    """UTF-8 bytes of the documents' texts."""
    seconds: float

    @property
    def documents_per_second(self) -> float:
        return self.documents / self.seconds if self.seconds > 0 else 0.0


class Submitter(Protocol):
    """What ``ingest`` sends through: :class:`~producer_sdk.EmbedClient` is one."""

    @property
    def submit(self) -> Callable[..., Awaitable[str]]:
        """``submit(texts, keys=..., metadata=..., **options)``, the options ``ingest``
        takes from its own (see :meth:`producer_sdk.EmbedClient.submit`)."""
        ...

    @property
    def submit_sparse(self) -> Callable[..., Awaitable[str]]:
        """``submit_sparse(texts, keys=..., metadata=..., **options)``, with
        ``sparse_model`` (see :meth:`producer_sdk.EmbedClient.submit_sparse`)."""
        ...


ProgressCallback = Callable[[IngestSummary], None]


async def ingest(
    client: Submitter,
    documents: Iterable[Document] | AsyncIterable[Document],
    *,
    batch_size: int = 256,
    max_in_flight: int = 4,
    on_progress: ProgressCallback | None = None,
    reply_to: str | None = None,
    model: str | None = None,
    bulk: bool = True,
    meta: Mapping[str, Any] | None = None,
    prompt: str | None = None,
    normalize: bool = True,
    dimensions: int | None = None,
    encoding: str = "float32",
    affinity: bool = False,
    chunking: Chunking | None = None,
    chunk_pooling: str = "none",
    chunks_per_request: int = 256,
    sparse_model: str | None = None,
    sparse_top_k: int | None = None,
    dense: bool = True,
) -> IngestSummary:
    """Submit ``documents`` in requests of ``batch_size`` (the last may be smaller), with at
    most ``max_in_flight`` requests awaiting the broker at once; return the totals.

    With ``chunking`` (``chunk_pooling`` ``"none"`` or ``"mean"``), a request holds at most
    ``batch_size`` documents and about ``chunks_per_request`` chunks (see
    :func:`estimated_chunks`); keep that at or below the workers'
    ``KEMBED_MAX_CLIENT_BATCH_SIZE``, and its result (chunks x the vector's bytes: 1536
    for 384 float32 values) below their ``KEMBED_MAX_RESULT_BYTES`` (1 MB by default).

    ``on_progress`` is called after each acknowledged request with the totals so far. A
    batch whose request would exceed the client's ``max_request_bytes`` is split in halves
    until it fits. The other arguments go to every ``submit`` call (``meta`` is the
    request-level meta of each request; ``affinity=True`` keys each request by its content,
    so that re-ingesting the same documents in the same batches reaches the workers whose
    vector caches hold them). Keep ``batch_size`` at or below the workers'
    ``KEMBED_MAX_CLIENT_BATCH_SIZE`` (default 512).

    Raises ValueError for bad arguments before anything is read, and IngestError (with the
    ``summary`` of what was acknowledged, and the ``cause``) when a document is invalid,
    the iterable raises, or a submit fails. Requests already in flight then finish first,
    so the summary is exact.
    """
    if isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}")
    if isinstance(max_in_flight, bool) or max_in_flight < 1:
        raise ValueError(f"max_in_flight must be a positive integer, not {max_in_flight!r}")
    if isinstance(chunks_per_request, bool) or chunks_per_request < 1:
        raise ValueError(
            f"chunks_per_request must be a positive integer, not {chunks_per_request!r}"
        )
    check_chunk_options(chunking, chunk_pooling)
    if not dense and sparse_model is None:
        raise ValueError("dense=False needs sparse_model: nothing would be sent")
    if sparse_top_k is not None and sparse_model is None:
        raise ValueError("sparse_top_k needs sparse_model")
    sparse_options: dict[str, Any] = {
        "reply_to": reply_to,
        "model": sparse_model,
        "bulk": bulk,
        "meta": meta,
        "prompt": prompt,
        "top_k": sparse_top_k,
    }
    if chunk_pooling == "mean":
        meta = {**(meta or {}), CHUNK_POOLING_META: "mean"}
    options: dict[str, Any] = {
        "reply_to": reply_to,
        "model": model,
        "bulk": bulk,
        "meta": meta,
        "prompt": prompt,
        "normalize": normalize,
        "dimensions": dimensions,
        "encoding": encoding,
        "affinity": affinity,
    }
    if chunking is not None:
        options.update(chunking=chunking, chunk_pooling=chunk_pooling)

    totals = _Totals(time.monotonic())

    async def send(batch: list[Document]) -> None:
        requests = await _submit(client.submit, batch, options) if dense else 0
        if sparse_model is not None:
            requests += await _submit(client.submit_sparse, batch, sparse_options)
        totals.add(batch, requests)
        if on_progress is not None:
            on_progress(totals.summary())

    in_flight: set[asyncio.Task[None]] = set()
    failure: BaseException | None = None

    async def wait_for_one() -> None:
        nonlocal failure
        done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            in_flight.discard(task)
            if failure is None and (error := task.exception()) is not None:
                failure = error

    try:
        async for batch in _batches(documents, batch_size, chunking, chunks_per_request):
            while len(in_flight) >= max_in_flight and failure is None:
                await wait_for_one()
            if failure is not None:
                break
            in_flight.add(asyncio.create_task(send(batch), name="kembed-ingest-submit"))
            await asyncio.sleep(0)  # let it start sending while the next batch is read
    except asyncio.CancelledError:
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
        raise
    except Exception as exc:  # noqa: BLE001 (a bad document or the iterable's own error)
        failure = exc
    while in_flight:
        await wait_for_one()
    if failure is not None:
        raise IngestError(totals.summary(), failure) from failure
    return totals.summary()


class _Totals:
    def __init__(self, started: float) -> None:
        self.started = started
        self.documents = self.requests = self.bytes = 0

    def add(self, batch: Sequence[Document], requests: int) -> None:
        self.documents += len(batch)
        self.requests += requests
        self.bytes += sum(len(doc.text.encode("utf-8")) for doc in batch)

    def summary(self) -> IngestSummary:
        seconds = time.monotonic() - self.started
        return IngestSummary(self.documents, self.requests, self.bytes, seconds)


async def _submit(
    submit: Callable[..., Awaitable[str]], batch: list[Document], options: dict[str, Any]
) -> int:
    """Submit one batch, halving it while its request is too large; return the requests."""
    has_metadata = any(doc.metadata is not None for doc in batch)
    try:
        await submit(
            [doc.text for doc in batch],
            keys=[doc.id for doc in batch],
            metadata=[doc.metadata for doc in batch] if has_metadata else None,
            **options,
        )
    except RequestTooLargeError as exc:
        if len(batch) == 1:
            raise RequestTooLargeError(
                exc.size, exc.limit, f" for document {batch[0].id!r} alone"
            ) from None
        half = len(batch) // 2
        return await _submit(submit, batch[:half], options) + await _submit(
            submit, batch[half:], options
        )
    return 1


def check_chunk_options(chunking: Chunking | None, chunk_pooling: str) -> None:
    """Raise ValueError unless ``chunk_pooling`` is ``"none"``, or ``"mean"`` with
    ``chunking`` (a ``Chunking``)."""
    if chunking is not None and not isinstance(chunking, Chunking):
        raise TypeError(f"chunking must be a Chunking, not {type(chunking).__name__}")
    if chunk_pooling not in ("none", "mean"):
        raise ValueError(f"chunk_pooling must be 'none' or 'mean', not {chunk_pooling!r}")
    if chunk_pooling != "none" and chunking is None:
        raise ValueError("chunk_pooling needs chunking")


def estimated_chunks(text: str, chunking: Chunking) -> int:
    """About how many chunks the worker will cut ``text`` into, erring on the high side:
    ``CHARS_PER_TOKEN`` characters per token, windows of ``max_tokens`` less two special
    tokens, advancing by the window less the overlap."""
    window = max(1, chunking.max_tokens - 2)
    step = max(1, window - chunking.overlap_tokens)
    tokens = -(-len(text) // CHARS_PER_TOKEN)
    return 1 + max(0, -(-(tokens - window) // step))


async def _batches(
    documents: Iterable[Document] | AsyncIterable[Document],
    size: int,
    chunking: Chunking | None,
    chunk_budget: int,
) -> AsyncIterator[list[Document]]:
    """Batches of at most ``size`` documents, and with ``chunking`` of at most about
    ``chunk_budget`` chunks (a document over it alone)."""
    batch: list[Document] = []
    budget = size if chunking is None else chunk_budget
    weight = 0
    position = 0
    async for doc in _aiter(documents):
        position += 1
        _check_document(doc, position)
        cost = 1 if chunking is None else estimated_chunks(doc.text, chunking)
        if batch and weight + cost > budget:
            yield batch
            batch, weight = [], 0
        batch.append(doc)
        weight += cost
        if len(batch) == size or weight >= budget:
            yield batch
            batch, weight = [], 0
    if batch:
        yield batch


async def _aiter(
    documents: Iterable[Document] | AsyncIterable[Document],
) -> AsyncIterator[Document]:
    if isinstance(documents, AsyncIterable):
        async for doc in documents:
            yield doc
    else:
        for doc in documents:
            yield doc


def _check_document(doc: object, position: int) -> None:
    """Fail on a bad document with its position (1-based) rather than in a whole request."""
    if not isinstance(doc, tuple) or not 2 <= len(doc) <= 3:
        raise TypeError(f"document {position} is not a Document(text, id, metadata)")
    text, doc_id = doc[0], doc[1]
    where = f"document {position} (id {doc_id!r})"
    if not isinstance(text, str):
        raise TypeError(f"{where}: text must be a string, not {type(text).__name__}")
    if not text:
        raise ValueError(f"{where}: text is empty")
    if isinstance(doc_id, bool) or not isinstance(doc_id, str | int):
        raise TypeError(f"document {position}: id must be a string or an integer, not {doc_id!r}")
    metadata = doc[2] if len(doc) == 3 else None
    if metadata is not None and not isinstance(metadata, Mapping):
        raise TypeError(f"{where}: metadata must be a map or None")
