"""Test code that uses the SDK without Kafka: a transport that answers requests in memory.

    def answer(request: Request) -> Result | BaseException | None:
        return answer_vectors(request, [[0.5, 0.5]] * len(request.inputs))

    transport = InMemoryTransport(answer)
    async with transport.client(model="minilm") as client:  # a real EmbedClient
        vectors = await client.embed(["a text"])
    [sent] = transport.sent                                  # what went to "Kafka"

The client is the real one (its checks, its routing, the wire codec, its waiting calls);
only Kafka is replaced. ``answer`` (a hook the test sets, and may change between calls)
is called with each request as a worker would decode it and returns its result (see
:func:`answer_vectors`, :func:`answer_scores`, :func:`answer_error`), an exception to raise
from the send (an AuthorizationError, a Kafka error), or None to answer nothing (the call
then times out). ``catalog`` is what the model catalog holds (None: the client has no
catalog). :meth:`InMemoryTransport.sync_client` gives a :class:`~producer_sdk.SyncEmbedClient`.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from producer_sdk.catalog import CatalogModel
from producer_sdk.client import EmbedClient
from producer_sdk.config import ClientConfig
from producer_sdk.errors import AuthorizationError
from producer_sdk.sync import SyncEmbedClient
from producer_sdk.transport import FailureHandler, ReplyHandler
from schemas import (
    EmbedRequest,
    EmbedResult,
    ErrorInfo,
    ErrorResult,
    Request,
    RerankRequest,
    RerankResult,
    Result,
    decode_request,
    encode_result,
)
from schemas.v1 import pack_float32

__all__ = [
    "Answer",
    "InMemoryTransport",
    "Sent",
    "answer_error",
    "answer_scores",
    "answer_vectors",
]

Answer = Callable[[Request], Result | BaseException | None]
"""What the transport answers a request with (see the module's description)."""


@dataclass(frozen=True, slots=True)
class Sent:
    """One request the client sent: decoded, and as Kafka would have carried it."""

    request: Request
    value: bytes
    topic: str
    headers: dict[str, bytes]
    key: bytes | None


class InMemoryTransport:
    """Stands for the client's Kafka transport: records each request in ``sent`` and
    answers it with ``answer`` through the client's own reply path."""

    def __init__(
        self,
        answer: Answer | None = None,
        *,
        catalog: Iterable[CatalogModel] | None = None,
        reply_partition: int = 0,
    ) -> None:
        self.answer = answer
        self.catalog = None if catalog is None else list(catalog)
        self.reply_partition = reply_partition
        self.sent: list[Sent] = []
        self.failure: AuthorizationError | None = None
        self.started = False
        self._config: ClientConfig | None = None
        self._on_reply: ReplyHandler | None = None
        self._on_failure: FailureHandler | None = None

    def client(self, **options: Any) -> EmbedClient:
        """An :class:`~producer_sdk.EmbedClient` over this transport, not started (use
        ``async with``); ``options`` are :class:`~producer_sdk.ClientConfig` fields."""
        if self.catalog is None:
            options.setdefault("catalog_topic", None)
        return EmbedClient("in-memory", transport=self.connect, **options)

    def sync_client(self, **options: Any) -> SyncEmbedClient:
        """A started :class:`~producer_sdk.SyncEmbedClient` over this transport."""
        return SyncEmbedClient._wrapping(lambda: self.client(**options))

    def connect(
        self, config: ClientConfig, on_reply: ReplyHandler, on_failure: FailureHandler
    ) -> InMemoryTransport:
        """Bind this transport to a client (a :data:`~producer_sdk.transport.TransportFactory`)."""
        self._config = config
        self._on_reply = on_reply
        self._on_failure = on_failure
        return self

    def fail_replies(self, error: AuthorizationError) -> None:
        """Act as if the reply topic turned out unreadable: waiting calls raise ``error``."""
        self.failure = error
        if self._on_failure is not None:
            self._on_failure(error)

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    async def send(
        self,
        value: bytes,
        headers: Sequence[tuple[str, bytes]],
        topic: str | None = None,
        key: bytes | None = None,
    ) -> None:
        if self._config is None or self._on_reply is None:
            raise RuntimeError("the transport is not connected to a client")
        request = decode_request(value)
        topic = topic or self._config.requests_topic
        self.sent.append(Sent(request, value, topic, dict(headers), key))
        result = None if self.answer is None else self.answer(request)
        if isinstance(result, BaseException):
            raise result
        if result is not None:
            # Later, as from Kafka: the call is waiting for it by then.
            asyncio.get_running_loop().call_soon(self._on_reply, request.id, encode_result(result))

    async def read_catalog(self, timeout: float | None) -> list[CatalogModel]:
        if self.catalog is None:
            raise ValueError("no catalog topic: the client's catalog_topic is None")
        return list(self.catalog)


def answer_vectors(
    request: EmbedRequest, vectors: Sequence[Sequence[float]], model: str = "in-memory"
) -> EmbedResult:
    """The float32 result of ``request``: one row of ``vectors`` per input, each input
    counted as one token per word plus two."""
    dim = len(vectors[0]) if vectors else 0
    values = array("f", [value for row in vectors for value in row])
    return EmbedResult(
        id=request.id,
        model=model,
        dim=dim,
        vectors=pack_float32(values),
        tokens=tuple(len(text.split()) + 2 for text in request.inputs),
        keys=request.keys,
        meta=request.meta,
    )


def answer_scores(
    request: RerankRequest, scores: Sequence[float], model: str = "in-memory"
) -> RerankResult:
    """The result of ``request`` with one score per document: ``order`` by score (ties:
    the lower index first), cut to ``top_n``, the documents' texts if asked for."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[: request.top_n]
    documents = tuple(request.documents[i] for i in order) if request.return_documents else None
    return RerankResult(
        id=request.id,
        model=model,
        scores=pack_float32(array("f", scores)),
        order=tuple(order),
        tokens=tuple(len(document.split()) + 3 for document in request.documents),
        documents=documents,
    )


def answer_error(
    request: Request, code: str, message: str, index: int | None = None
) -> ErrorResult:
    """A worker's error result for ``request`` (``code``: a wire error code)."""
    return ErrorResult(id=request.id, error=ErrorInfo(code, message, index))
