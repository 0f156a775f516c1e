"""Stand-ins for the producer SDK's client: :class:`FakeClient` (no Kafka, no worker, no
wire format: what the gateway, ``ingest()`` and ``SyncEmbedClient`` call, scripted by the
test) and :func:`offline` (the real client over :mod:`producer_sdk.testing`'s in-memory
transport, for tests of the client itself)."""

from __future__ import annotations

import asyncio
import inspect
import random
import re
import threading
import zlib
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from kembed_shared.encodings import LAYOUTS, encode_rows
from producer_sdk import (
    ClientClosedError,
    ClientConfig,
    Decoding,
    EmbedClient,
    Embeddings,
    RequestTooLargeError,
    Reranked,
    Token,
    Tokenization,
)
from producer_sdk.catalog import CatalogModel
from producer_sdk.testing import Answer, InMemoryTransport
from schemas import Encoding
from tests.catalog_models import described

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
ALIAS = "minilm"
RERANKER = "cross-encoder/ms-marco-MiniLM-L-6-v2"
DIM = 8

Call = tuple[list[str], dict[str, Any]]
"""A call's texts (a rerank call's: the query, then the documents) and its keywords, with
the defaults of the real method filled in."""


def catalog_entry(name: str = MODEL, aliases: tuple[str, ...] = (ALIAS,)) -> CatalogModel:
    description = described(name, aliases=aliases, dim=DIM, requests_topic="embed.requests")
    return CatalogModel(
        **description.description_fields(),
        group_id="kembed",
        topics=("embed.requests",),
        workers=1,
        instances=("worker-0",),
        announced_ms=1_760_000_000_000,
        interval_ms=10_000,
    )


def vector_of(text: str) -> npt.NDArray[np.float32]:
    """A distinct, exactly representable vector per text (so order and values can be
    checked)."""
    seed = zlib.crc32(text.encode("utf-8"))
    return np.array([(seed >> shift) % 1024 / 64 - 8 for shift in range(DIM)], dtype=np.float32)


def tokens_of(text: str) -> int:
    return len(text.split()) + 2


def score_of(query: str, document: str) -> float:
    """A float32-exact score per (query, document) pair: distinct for distinct documents."""
    return (zlib.crc32(f"{query}|{document}".encode()) % 4096) / 256 - 8


class FakeClient(EmbedClient):
    """What callers use of :class:`~producer_sdk.EmbedClient`, scripted by the test.

    Each call is recorded in ``calls`` (see :data:`Call`), with the thread and event loop
    that ran it. ``embed_result`` answers one ``vector`` row per text (cut to
    ``dimensions``; with ``chunking`` each text one chunk), ``rerank`` one ``score`` per
    document, ``submit`` the request id (``r<n>`` when none is given) after ``delay``
    seconds; ``models()`` returns ``catalog``. ``error`` is raised by every embed and
    rerank call, ``errors[model]`` by those naming ``model``, ``catalog_error`` by
    ``models()``; with ``gate`` set, embed and rerank calls wait for it (each puts an item
    in ``arrivals`` first). ``embed()`` is the real method, over ``embed_result``.
    """

    made: ClassVar[list[FakeClient]] = []
    reply_partition = 3
    dropped_results = 0

    def __init__(
        self,
        bootstrap_servers: str = "fake:9092",
        *,
        delay: float = 0.01,
        max_bytes: int | None = None,
        **options: Any,
    ) -> None:
        self.config = ClientConfig(bootstrap_servers=bootstrap_servers)
        self.bootstrap_servers = bootstrap_servers
        self.options = options
        self.catalog: list[CatalogModel] = [catalog_entry()]
        self.catalog_error: BaseException | None = None
        self.catalog_reads = 0
        self.catalog_timeouts: list[float | None] = []
        self.error: BaseException | None = None
        self.errors: dict[str, BaseException] = {}
        self.gate: asyncio.Event | None = None
        self.arrivals: asyncio.Queue[None] = asyncio.Queue()
        """One item per call that reached the gate."""
        self.jitter = 0.0
        """Up to this many seconds of random delay per embed call (to interleave them)."""
        self.model_name = MODEL
        """The model embed results name."""
        self.vector: Callable[[str], npt.NDArray[np.float32]] = vector_of
        self.score: Callable[[str, str], float] = score_of
        self.delay = delay
        self.max_bytes = max_bytes
        """submit() raises RequestTooLargeError for texts of more characters in all."""
        self.fail_on: int | None = None
        """The number (from 0) of the submit call that fails after its delay."""
        self.in_flight = self.peak = 0
        self.calls: list[Call] = []
        self.methods: list[str] = []
        """The method of each call in ``calls``."""
        self.threads: set[int] = set()
        self.loops: set[int] = set()
        self.started = self.closed = False
        FakeClient.made.append(self)

    def _record(self) -> None:
        self.threads.add(threading.get_ident())
        self.loops.add(id(asyncio.get_running_loop()))

    def _called(self, method: str, texts: list[str], options: dict[str, Any]) -> dict[str, Any]:
        """Record a call of ``method`` with its keywords bound as the real method binds
        them (unknown keywords raise TypeError), defaults included."""
        self._record()
        bound = inspect.signature(getattr(EmbedClient, method)).bind_partial(**options)
        # Only the keywords: the positional parameters have no defaults to fill in.
        bound.apply_defaults()
        self.calls.append((texts, bound.arguments))
        self.methods.append(method)
        return bound.arguments

    async def _answering(self, options: dict[str, Any]) -> None:
        model = options.get("model")
        if model is not None and model in self.errors:
            raise self.errors[model]
        if self.gate is not None:
            self.arrivals.put_nowait(None)
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        if self.jitter:
            await asyncio.sleep(random.uniform(0, self.jitter))

    async def start(self) -> None:
        self._record()
        self.started = True

    async def close(self) -> None:
        self._record()
        self.closed = True

    async def models(self, timeout: float | None = None) -> list[CatalogModel]:
        self._record()
        self.catalog_reads += 1
        self.catalog_timeouts.append(timeout)
        if self.catalog_error is not None:
            raise self.catalog_error
        return list(self.catalog)

    async def embed_result(self, texts: Sequence[str], **options: Any) -> Embeddings:
        keywords = self._called("embed_result", list(texts), options)
        await self._answering(keywords)
        rows = [self.vector(text) for text in texts]
        dims = keywords["dimensions"] or len(rows[0])
        chunked = keywords["chunking"] is not None
        vectors: npt.NDArray[Any] = np.stack([row[:dims] for row in rows])
        encoding, scales = Encoding(keywords["encoding"]), None
        if encoding != Encoding.FLOAT32:  # packed as a worker packs them
            blob, scale_blob = encode_rows(vectors, encoding, normalized=keywords["normalize"])
            vectors = np.frombuffer(blob, LAYOUTS[encoding].wire).reshape(len(texts), -1)
            scales = None if scale_blob is None else np.frombuffer(scale_blob, "<f4")
        return Embeddings(
            vectors=vectors,
            encoding=encoding,
            dim=dims,
            scales=scales,
            tokens=tuple(tokens_of(text) for text in texts),
            model=self.model_name,
            chunks=(1,) * len(texts) if chunked else None,
            spans=tuple((0, len(text)) for text in texts) if chunked else None,
        )

    async def rerank(self, query: str, documents: Sequence[str], **options: Any) -> Reranked:
        keywords = self._called("rerank", [query, *documents], options)
        await self._answering(keywords)
        scores = np.array([self.score(query, d) for d in documents], dtype=np.float32)
        order = sorted(range(len(documents)), key=lambda i: (-scores[i], i))
        return Reranked(
            scores=scores,
            order=tuple(order[: keywords["top_n"]]),
            tokens=tuple(tokens_of(query) + tokens_of(d) for d in documents),
            model=RERANKER,
        )

    async def tokenize(self, texts: Sequence[str], **options: Any) -> Tokenization:
        """Per text, its words as tokens (byte offsets), between [CLS] and [SEP] unless
        ``add_special_tokens`` is false."""
        keywords = self._called("tokenize", list(texts), options)
        await self._answering(keywords)
        special = keywords["add_special_tokens"]
        tokens = []
        for text in texts:
            words = [
                Token(1000 + len(m.group()), m.group(), False, m.start(), m.end())
                for m in re.finditer(r"\S+", text)
            ]
            ends = (
                [Token(101, "[CLS]", True, None, None)],
                [Token(102, "[SEP]", True, None, None)],
            )
            tokens.append([*ends[0], *words, *ends[1]] if special else words)
        return Tokenization(self.model_name, tokens)

    async def decode(self, ids: Sequence[Sequence[int]], **options: Any) -> Decoding:
        """Per sequence, its ids written out, ``<101>`` and ``<102>`` left out unless
        ``skip_special_tokens`` is false."""
        keywords = self._called("decode", [str(list(i)) for i in ids], options)
        await self._answering(keywords)
        skip = {101, 102} if keywords["skip_special_tokens"] else set()
        texts = [" ".join(f"<{i}>" for i in sequence if i not in skip) for sequence in ids]
        return Decoding(self.model_name, texts)

    async def submit(self, texts: Sequence[str], **options: Any) -> str:
        return await self._submitted("submit", texts, options)

    async def submit_sparse(self, texts: Sequence[str], **options: Any) -> str:
        """As :meth:`submit`, recorded as ``submit_sparse``."""
        return await self._submitted("submit_sparse", texts, options)

    async def _submitted(self, method: str, texts: Sequence[str], options: dict[str, Any]) -> str:
        size = sum(len(text) for text in texts)
        if self.max_bytes is not None and size > self.max_bytes:
            raise RequestTooLargeError(size, self.max_bytes)
        number = len(self.calls)
        keywords = self._called(method, list(texts), options)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            if number == self.fail_on:
                raise ClientClosedError("the broker went away")
        finally:
            self.in_flight -= 1
        request_id: str | None = keywords["request_id"]
        return request_id or f"r{number}"


def offline(
    answer: Answer | None = None,
    catalog: list[CatalogModel] | None = None,
    **options: Any,
) -> tuple[EmbedClient, InMemoryTransport]:
    """The real client over an in-memory transport that answers with ``answer``, started,
    reading reply partition 5."""
    transport = InMemoryTransport(answer, catalog=catalog, reply_partition=5)
    client = transport.client(**options)
    client._started = True  # the in-memory transport has nothing to start
    return client, transport
