"""``EmbedClient``: a request/response facade over Kafka.

    async with EmbedClient(bootstrap_servers="localhost:9092") as client:
        vectors = await client.embed(["first text", "second text"], timeout=30)
        codes = await client.embed(["first text"], encoding="int8")  # int8 (1, dim)
        ranked = await client.rerank("a query", ["doc", "other doc"], model="reranker")

Many calls may run concurrently on one client; each is correlated with its result by a
unique request id. Results go to one partition of the reply topic that this client reads
(see ``producer_sdk.transport``), so separate clients do not receive each other's results.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

import msgpack
import numpy as np
import numpy.typing as npt
import structlog

from producer_sdk.catalog import CatalogModel, Lane, ModelRouter, read_catalog
from producer_sdk.chunked import ChunkedEmbeddings
from producer_sdk.config import ClientConfig
from producer_sdk.encodings import Embeddings
from producer_sdk.errors import (
    AuthorizationError,
    ClientClosedError,
    EmbedError,
    EmbedTimeoutError,
    InputTooLongError,
    KembedError,
    RequestTooLargeError,
    UnexpectedEncodingError,
    UnexpectedResultError,
)
from producer_sdk.pending import PendingCalls
from producer_sdk.rerank import Reranked, check_rerank_arguments
from producer_sdk.transport import Transport
from schemas import (
    CHUNK_POOLINGS,
    Chunking,
    EmbedRequest,
    EmbedResult,
    Encoding,
    ErrorResult,
    Request,
    RerankRequest,
    RerankResult,
    Result,
    SchemaError,
    decode_result,
    encode_request,
)
from schemas.codec import is_valid_topic
from schemas.headers import routing_headers
from schemas.v1 import MAX_ID_BYTES

__all__ = ["EmbedClient", "content_key"]

log = structlog.get_logger("kembed.sdk")

_ENCODING_NAMES = frozenset(encoding.value for encoding in Encoding)
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1  # the integers msgpack can carry
DOCS_META_KEY = "docs"
"""The request ``meta`` key that carries per-input metadata (see ``submit``)."""

R = TypeVar("R", EmbedResult, RerankResult)
_KIND_OF: dict[type[EmbedResult | RerankResult], str] = {
    EmbedResult: "embed",
    RerankResult: "rerank",
}
"""The catalog ``kind`` of the models that answer a call expecting this result."""
_WHAT: dict[type[EmbedResult | RerankResult], str] = {
    EmbedResult: "vectors",
    RerankResult: "relevance scores (a rerank result)",
}
_MODEL_KINDS = {"embed": "an embedding model", "rerank": "a reranker (a cross-encoder)"}
_USE = {"embed": "call embed(), not rerank()", "rerank": "call rerank(), not embed()"}


class EmbedClient:
    def __init__(self, bootstrap_servers: str, **options: Any) -> None:
        """Options are the fields of :class:`~producer_sdk.config.ClientConfig`."""
        self.config = ClientConfig(bootstrap_servers=bootstrap_servers, **options)
        self._pending = PendingCalls()
        self._transport = Transport(self.config, self._on_reply, self._on_failure)
        self._router = ModelRouter(
            self.models if self.config.catalog_topic else None,
            refresh_s=self.config.catalog_refresh_s,
            overrides=self.config.model_topics,
        )
        self._started = False

    async def __aenter__(self) -> EmbedClient:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        await self._transport.start()
        self._started = True

    async def close(self) -> None:
        if self._started:
            self._started = False
            self._pending.fail_all(ClientClosedError("the client was closed"))
            await self._router.close()
            await self._transport.stop()

    @property
    def reply_partition(self) -> int:
        return self._transport.reply_partition

    @property
    def dropped_results(self) -> int:
        """Results received but not waited for: late, duplicate, or another client's."""
        return self._pending.dropped

    async def models(self, timeout: float | None = None) -> list[CatalogModel]:
        """The models live workers announce on the catalog topic, one entry per model name
        (merged over its workers), sorted by name. Reads the topic now (and refreshes the
        routing cache with it). Raises CatalogUnavailableError when Kafka does not answer
        within ``timeout`` (default ``catalog_timeout``), ValueError when the client has
        no ``catalog_topic``."""
        models = await read_catalog(self.config, timeout=timeout)
        self._router.update(models)
        return models

    async def request_topic(self, model: str | None, lane: Lane = "interactive") -> str:
        """The topic a request for ``model`` goes to in ``lane``: ``model_topics``, else the
        topic the catalog names for it (by name or alias), else the configured
        ``requests_topic`` (``bulk_topic`` for the bulk lane)."""
        configured = self.config.bulk_topic if lane == "bulk" else self.config.requests_topic
        if model is None:
            return configured
        topic = await self._router.topic_for(model, lane, configured)
        return configured if topic is None else topic

    @overload
    async def embed(
        self,
        texts: Sequence[str],
        *,
        timeout: float | None = ...,
        model: str | None = ...,
        normalize: bool = ...,
        truncate: bool = ...,
        dimensions: int | None = ...,
        prompt: str | None = ...,
        prompt_name: str | None = ...,
        truncation_direction: Literal["right", "left"] | None = ...,
        chunking: None = ...,
        chunk_pooling: Literal["none"] = ...,
        encoding: Literal["float32"] = ...,
    ) -> npt.NDArray[np.float32]: ...

    @overload
    async def embed(
        self,
        texts: Sequence[str],
        *,
        timeout: float | None = ...,
        model: str | None = ...,
        normalize: bool = ...,
        truncate: bool = ...,
        dimensions: int | None = ...,
        prompt: str | None = ...,
        prompt_name: str | None = ...,
        truncation_direction: Literal["right", "left"] | None = ...,
        chunking: None = ...,
        chunk_pooling: Literal["none"] = ...,
        encoding: Literal["float16"],
    ) -> npt.NDArray[np.float16]: ...

    @overload
    async def embed(
        self,
        texts: Sequence[str],
        *,
        timeout: float | None = ...,
        model: str | None = ...,
        normalize: bool = ...,
        truncate: bool = ...,
        dimensions: int | None = ...,
        prompt: str | None = ...,
        prompt_name: str | None = ...,
        truncation_direction: Literal["right", "left"] | None = ...,
        chunking: None = ...,
        chunk_pooling: Literal["none"] = ...,
        encoding: Literal["int8"],
    ) -> npt.NDArray[np.int8]: ...

    @overload
    async def embed(
        self,
        texts: Sequence[str],
        *,
        timeout: float | None = ...,
        model: str | None = ...,
        normalize: bool = ...,
        truncate: bool = ...,
        dimensions: int | None = ...,
        prompt: str | None = ...,
        prompt_name: str | None = ...,
        truncation_direction: Literal["right", "left"] | None = ...,
        chunking: None = ...,
        chunk_pooling: Literal["none"] = ...,
        encoding: Literal["binary"],
    ) -> npt.NDArray[np.uint8]: ...

    @overload
    async def embed(
        self,
        texts: Sequence[str],
        *,
        timeout: float | None = ...,
        model: str | None = ...,
        normalize: bool = ...,
        truncate: bool = ...,
        dimensions: int | None = ...,
        prompt: str | None = ...,
        prompt_name: str | None = ...,
        truncation_direction: Literal["right", "left"] | None = ...,
        chunking: None = ...,
        chunk_pooling: Literal["none"] = ...,
        encoding: Encoding | str,
    ) -> npt.NDArray[Any]: ...

    @overload
    async def embed(
        self,
        texts: Sequence[str],
        *,
        timeout: float | None = ...,
        model: str | None = ...,
        normalize: bool = ...,
        truncate: bool = ...,
        dimensions: int | None = ...,
        prompt: str | None = ...,
        prompt_name: str | None = ...,
        truncation_direction: Literal["right", "left"] | None = ...,
        chunking: Chunking,
        chunk_pooling: Literal["none"] = ...,
        encoding: Encoding | str = ...,
    ) -> ChunkedEmbeddings: ...

    @overload
    async def embed(
        self,
        texts: Sequence[str],
        *,
        timeout: float | None = ...,
        model: str | None = ...,
        normalize: bool = ...,
        truncate: bool = ...,
        dimensions: int | None = ...,
        prompt: str | None = ...,
        prompt_name: str | None = ...,
        truncation_direction: Literal["right", "left"] | None = ...,
        chunking: Chunking,
        chunk_pooling: Literal["mean"],
        encoding: Literal["float32"] = ...,
    ) -> npt.NDArray[np.float32]: ...

    @overload
    async def embed(
        self,
        texts: Sequence[str],
        *,
        timeout: float | None = ...,
        model: str | None = ...,
        normalize: bool = ...,
        truncate: bool = ...,
        dimensions: int | None = ...,
        prompt: str | None = ...,
        prompt_name: str | None = ...,
        truncation_direction: Literal["right", "left"] | None = ...,
        chunking: Chunking,
        chunk_pooling: Literal["mean"],
        encoding: Encoding | str,
    ) -> npt.NDArray[Any]: ...

    async def embed(
        self,
        texts: Sequence[str],
        *,
        timeout: float | None = None,
        model: str | None = None,
        normalize: bool = True,
        truncate: bool = True,
        dimensions: int | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
        truncation_direction: Literal["right", "left"] | None = None,
        chunking: Chunking | None = None,
        chunk_pooling: Literal["none", "mean"] = "none",
        encoding: Encoding | str = Encoding.FLOAT32,
    ) -> npt.NDArray[Any] | ChunkedEmbeddings:
        """Embed ``texts``; one row per text, in input order.

        The array's type follows ``encoding``: float32 (default) and float16 give
        (len(texts), dim) floats, int8 (len(texts), dim) codes (divide by 127 for normalized
        vectors; :meth:`embed_result` also gives the scales), binary (len(texts),
        ceil(dim / 8)) uint8 packed sign bits (:func:`producer_sdk.unpack_bits`).

        ``prompt`` is text put before every input; ``prompt_name`` picks one of the model's
        named prompts instead (see ``client.models()``); with neither, the model's default
        prompt applies, if it has one. ``truncation_direction`` says which end of an input
        longer than the model's maximum is cut (default: the model's setting, usually
        ``right``, keeping the beginning).

        ``chunking`` (a :class:`~schemas.Chunking`) cuts each text into windows of at most
        ``max_tokens`` tokens on the model's own tokenizer instead of truncating it: the
        result is then a :class:`~producer_sdk.ChunkedEmbeddings` (per text, its chunks'
        vectors, character spans and token counts), or with ``chunk_pooling="mean"`` one
        row per text as without chunking, the (re-normalized) mean of its chunks.

        Raises EmbedError (with the wire ``code``) when the worker rejects the request (and
        ``invalid_request`` at once, without sending, when the catalog says ``model`` is a
        reranker), EmbedTimeoutError when no result arrives within ``timeout`` seconds, and
        AuthorizationError at once when this client may not write the request topic (or
        read the reply topic), and InputTooLongError without sending when a text (of a
        request without ``chunking``) has more than ``max_input_chars`` characters.
        """
        result = await self.embed_result(
            texts,
            timeout=timeout,
            model=model,
            normalize=normalize,
            truncate=truncate,
            dimensions=dimensions,
            prompt=prompt,
            prompt_name=prompt_name,
            truncation_direction=truncation_direction,
            chunking=chunking,
            chunk_pooling=chunk_pooling,
            encoding=encoding,
        )
        if chunking is not None and chunk_pooling == "none":
            return ChunkedEmbeddings.from_embeddings(result)
        return result.vectors

    async def embed_result(
        self,
        texts: Sequence[str],
        *,
        timeout: float | None = None,
        model: str | None = None,
        normalize: bool = True,
        truncate: bool = True,
        dimensions: int | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
        truncation_direction: Literal["right", "left"] | None = None,
        chunking: Chunking | None = None,
        chunk_pooling: Literal["none", "mean"] = "none",
        encoding: Encoding | str = Encoding.FLOAT32,
    ) -> Embeddings:
        """Like :meth:`embed`, but the whole result: vectors, int8 scales, tokens, model
        (and with ``chunking``, its ``chunks`` and ``spans``)."""
        request = self._request(
            texts,
            model=model,
            normalize=normalize,
            truncate=truncate,
            dimensions=dimensions,
            prompt=prompt,
            prompt_name=prompt_name,
            truncation_direction=truncation_direction,
            chunking=chunking,
            chunk_pooling=chunk_pooling,
            encoding=encoding,
        )
        result = await self._answer(request, timeout, EmbedResult)
        if result.dtype != request.encoding:
            raise UnexpectedEncodingError(request.id, str(request.encoding), str(result.dtype))
        return Embeddings.from_result(result)

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        model: str | None = None,
        top_n: int | None = None,
        return_documents: bool = False,
        raw_scores: bool = False,
        truncate: bool = True,
        truncation_direction: Literal["right", "left"] | None = None,
        timeout: float | None = None,
    ) -> Reranked:
        """Score each of ``documents`` against ``query`` with a cross-encoder (a model whose
        catalog ``kind`` is ``rerank``): a :class:`~producer_sdk.Reranked` with ``scores``
        (float32, one per document, in their order), ``order`` (document indices by score,
        highest first; the best ``top_n`` only, when given) and ``results`` ((index, score,
        document) per entry of ``order``; the documents' texts with ``return_documents``).

        ``raw_scores`` gives the model's logits instead of its activation (sigmoid for a
        one-label cross-encoder). A (query, document) pair longer than the model's maximum is
        cut longest-first at ``truncation_direction``'s end (default: the model's); with
        ``truncate=False`` it is an error instead (``input_too_long``, ``index`` the
        document).

        Raises what :meth:`embed` raises: EmbedError (with the wire ``code``; and at once,
        ``invalid_request`` without sending, when the catalog says ``model`` is an embedding
        model), EmbedTimeoutError, AuthorizationError, InputTooLongError (the query or a
        document over ``max_input_chars`` characters; nothing sent); UnexpectedResultError
        when the worker answers anything but the scores of these documents.
        """
        check_rerank_arguments(query, documents, top_n, truncation_direction)
        check_lengths([query], self.config.max_input_chars, "query")
        check_lengths(documents, self.config.max_input_chars, "document")
        request = RerankRequest(
            id=uuid.uuid4().hex,
            query=query,
            documents=tuple(documents),
            model=model or self.config.model,
            top_n=top_n,
            return_documents=return_documents,
            raw_scores=raw_scores,
            truncate=truncate,
            truncation_direction=truncation_direction,
        )
        result = await self._answer(request, timeout, RerankResult)
        if result.count != len(documents):
            got = f"scores for {result.count} documents"
            raise UnexpectedResultError(request.id, f"{len(documents)} scores", got)
        return Reranked.from_result(result)

    async def _answer(self, request: Request, timeout: float | None, expected: type[R]) -> R:
        """Send ``request`` on the interactive lane and wait for its result, which must be
        an ``expected``; the one path of :meth:`embed_result` and :meth:`rerank`."""
        self._check_started()
        if not self.config.read_replies:
            raise KembedError(
                "this client reads no replies (read_replies=False): it can submit(), not "
                "embed() or rerank()"
            )
        if (failure := self._transport.failure) is not None:
            raise AuthorizationError(failure.principal, failure.operation, failure.topic)
        wait = self.config.timeout if timeout is None else timeout
        request = dataclasses.replace(
            request,
            deadline_ms=int((time.time() + wait) * 1000),
            reply_to=self.config.reply_topic,
            reply_partition=self.reply_partition,
        )
        await self._check_kind(request, _KIND_OF[expected])
        topic = await self.request_topic(request.model)
        result = await self._call(request, wait, topic)
        if isinstance(result, ErrorResult):
            raise EmbedError(
                str(result.error.code),
                result.error.message,
                index=result.error.index,
                request_id=result.id,
                item="document" if isinstance(request, RerankRequest) else "input",
            )
        if not isinstance(result, expected):
            raise UnexpectedResultError(request.id, _WHAT[expected], _WHAT[type(result)])
        return result

    async def _check_kind(self, request: Request, kind: str) -> None:
        """``invalid_request`` at once when the catalog says the model named is of another
        kind (a reranker asked for vectors, an embedding model for scores); nothing is
        checked for a model pinned by ``model_topics`` or without a catalog."""
        model = request.model
        if model is None or model in self.config.model_topics:
            return
        entry = await self._router.find(model)
        if entry is not None and entry.kind != kind:
            raise EmbedError(
                "invalid_request",
                f"the model {entry.name!r} is {_MODEL_KINDS.get(entry.kind, entry.kind)} "
                f"(kind {entry.kind!r}): {_USE.get(entry.kind, 'use another model')}",
                request_id=request.id,
            )

    async def submit(
        self,
        texts: Sequence[str],
        *,
        keys: Sequence[str | int] | None = None,
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
        meta: Mapping[str, Any] | None = None,
        reply_to: str | None = None,
        model: str | None = None,
        bulk: bool = True,
        prompt: str | None = None,
        prompt_name: str | None = None,
        normalize: bool = True,
        dimensions: int | None = None,
        encoding: str = "float32",
        request_id: str | None = None,
        affinity: bool = False,
        chunking: Chunking | None = None,
        chunk_pooling: Literal["none", "mean"] = "none",
    ) -> str:
        """Send one request without waiting for its result; return its request id once the
        broker has acknowledged it (acks=all).

        The worker answers on ``reply_to`` (default: this client's ``reply_topic``), spread
        over that topic's partitions by request id, for whoever reads it (a sink). ``keys``
        (one per text) are copied to the result; ``metadata`` (one map or None per text)
        travels as ``meta["docs"]``, next to the request-level ``meta`` keys, and comes
        back in the result's ``meta`` (see schemas/README.md, "Ingestion conventions").
        ``bulk=True`` sends to ``bulk_topic`` (the bulk lane), ``bulk=False`` to
        ``requests_topic``. The request carries no deadline: it waits in Kafka for a worker
        as long as the topic keeps it. ``chunking`` and ``chunk_pooling`` ask the worker to
        cut each text into chunks as for :meth:`embed`; the result then carries ``chunks``
        and ``spans`` (a sink writes one row per chunk, see schemas/README.md).
        ``affinity=True`` keys the message by a hash of its content (:func:`content_key`),
        so that the same texts sent again reach the same partition, hence the worker whose
        vector cache holds them.

        Raises TypeError or ValueError for invalid arguments, RequestTooLargeError when the
        encoded request exceeds ``max_request_bytes``, InputTooLongError when a text (without
        ``chunking``) exceeds ``max_input_chars``, ClientClosedError when the client is
        not started, AuthorizationError when the request topic may not be written, and
        EmbedError ``invalid_request`` when the catalog says ``model`` is a reranker; in all
        of these cases nothing was sent.
        """
        _check_texts(texts)
        request = self._request(
            texts,
            model=model,
            normalize=normalize,
            dimensions=dimensions,
            prompt=prompt,
            prompt_name=prompt_name,
            encoding=encoding,
            reply_to=reply_to or self.config.reply_topic,
            keys=_check_keys(keys, len(texts)),
            meta=_combined_meta(meta, metadata, len(texts)),
            request_id=request_id,
            chunking=chunking,
            chunk_pooling=chunk_pooling,
        )
        if not all(request.inputs):
            index = request.inputs.index("")
            raise ValueError(f"texts[{index}] is empty; the worker refuses empty inputs")
        if dimensions is not None and (isinstance(dimensions, bool) or dimensions < 1):
            raise ValueError(f"dimensions must be a positive integer, not {dimensions!r}")
        self._check_started()
        await self._check_kind(request, "embed")
        topic = await self.request_topic(request.model, "bulk" if bulk else "interactive")
        await self._send(request, topic, content_key(request) if affinity else None)
        return request.id

    def _request(
        self,
        texts: Sequence[str],
        *,
        model: str | None,
        normalize: bool,
        dimensions: int | None,
        prompt: str | None,
        encoding: Encoding | str,
        truncate: bool = True,
        prompt_name: str | None = None,
        truncation_direction: str | None = None,
        reply_to: str | None = None,
        keys: tuple[str | int, ...] | None = None,
        meta: dict[str, Any] | None = None,
        request_id: str | None = None,
        chunking: Chunking | None = None,
        chunk_pooling: str = "none",
    ) -> EmbedRequest:
        """The one place requests are built (``embed`` and ``submit``), texts checked."""
        _check_texts(texts)
        if encoding not in _ENCODING_NAMES:
            raise ValueError(f"encoding must be one of {', '.join(Encoding)}, not {encoding!r}")
        if request_id is not None and (
            not isinstance(request_id, str)
            or not 0 < len(request_id.encode("utf-8")) <= MAX_ID_BYTES
        ):
            raise ValueError(f"request_id must be 1 to {MAX_ID_BYTES} bytes of UTF-8")
        if reply_to is not None and not is_valid_topic(reply_to):
            raise ValueError(f"reply_to {reply_to!r} is not a valid Kafka topic name")
        if prompt is not None and prompt_name is not None:
            raise ValueError("give prompt (the text) or prompt_name (a model's prompt), not both")
        if truncation_direction not in (None, "right", "left"):
            raise ValueError(
                f"truncation_direction must be 'right' or 'left', not {truncation_direction!r}"
            )
        _check_chunking(chunking, chunk_pooling)
        if chunking is None:  # chunks use all of a text: no cap
            check_lengths(texts, self.config.max_input_chars)
        return EmbedRequest(
            id=request_id or uuid.uuid4().hex,
            inputs=tuple(texts),
            model=model or self.config.model,
            normalize=normalize,
            truncate=truncate,
            dimensions=dimensions,
            encoding=Encoding(encoding),
            prompt=prompt,
            prompt_name=prompt_name,
            truncation_direction=truncation_direction,
            reply_to=reply_to,
            keys=keys,
            meta=meta,
            chunking=chunking,
            chunk_pooling=chunk_pooling,
        )

    def _check_started(self) -> None:
        if not self._started:
            raise ClientClosedError("the client is not started; use 'async with'")

    def _encode(self, request: Request) -> bytes:
        try:
            value = encode_request(request)
        except (TypeError, ValueError, OverflowError) as exc:  # msgpack: not serializable
            raise TypeError(f"the request cannot be encoded as msgpack: {_where(request)}") from exc
        if len(value) > self.config.max_request_bytes:
            raise RequestTooLargeError(len(value), self.config.max_request_bytes)
        return value

    async def _send(self, request: Request, topic: str, key: bytes | None = None) -> None:
        """Encode, check the size and send; return once the broker acknowledged it."""
        value = self._encode(request)
        headers = routing_headers(request.id, request.reply_to, request.reply_partition)
        await self._transport.send(value, headers, topic, key)

    async def _call(self, request: Request, timeout: float, topic: str | None = None) -> Result:
        future = self._pending.add(request.id)
        try:
            async with asyncio.timeout(timeout):
                await self._send(request, topic or self.config.requests_topic)
                return await future
        except TimeoutError:
            raise EmbedTimeoutError(request.id, timeout) from None
        finally:
            self._pending.discard(request.id)

    def _on_failure(self, error: AuthorizationError) -> None:
        self._pending.fail_all(error)

    def _on_reply(self, request_id: str | None, value: bytes) -> None:
        if request_id is not None and request_id not in self._pending:
            self._pending.dropped += 1  # someone else's, or late: skip without decoding
            return
        try:
            result = decode_result(value)
        except SchemaError as exc:
            log.warning("result.malformed", error=exc.message)
            return
        self._pending.resolve(result)


def content_key(request: EmbedRequest) -> bytes:
    """A Kafka message key for ``request`` from what decides its vectors (model, prompt,
    truncation side, texts): the same content sent again lands on the same partition."""
    digest = hashlib.blake2b(digest_size=16, person=b"kembed-affinity")
    options = (request.model, request.prompt, request.prompt_name, request.truncation_direction)
    for part in (*options, *request.inputs):
        data = b"\xff" if part is None else part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.digest()


def _check_texts(texts: Sequence[str]) -> None:
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must be a sequence of strings")
    if not texts:
        raise ValueError("texts must not be empty")


def check_lengths(texts: Sequence[str], limit: int, item: str = "input") -> None:
    """InputTooLongError for the first of ``texts`` over ``limit`` characters (``item``:
    what they are; "query": one text, named without an index)."""
    for index, text in enumerate(texts):
        if len(text) > limit:
            raise InputTooLongError(len(text), limit, None if item == "query" else index, item)


def _check_chunking(chunking: Chunking | None, pooling: str) -> None:
    if chunking is not None and not isinstance(chunking, Chunking):
        raise TypeError(
            f"chunking must be a Chunking(max_tokens, overlap_tokens), not {chunking!r}"
        )
    if pooling not in CHUNK_POOLINGS:
        raise ValueError(f"chunk_pooling must be 'none' or 'mean', not {pooling!r}")
    if pooling != "none" and chunking is None:
        raise ValueError(f"chunk_pooling {pooling!r} needs chunking")


def _check_keys(keys: Sequence[str | int] | None, count: int) -> tuple[str | int, ...] | None:
    if keys is None:
        return None
    if isinstance(keys, str | bytes):
        raise TypeError("keys must be a sequence of strings or integers, one per text")
    checked = tuple(keys)
    if len(checked) != count:
        raise ValueError(f"keys has {len(checked)} entries for {count} texts; give one per text")
    for index, key in enumerate(checked):
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise TypeError(f"keys[{index}] must be a string or an integer, not {key!r}")
        if isinstance(key, int) and not _INT64_MIN <= key <= _UINT64_MAX:
            raise ValueError(f"keys[{index}] does not fit in 64 bits")
    return checked


def _combined_meta(
    meta: Mapping[str, Any] | None,
    metadata: Sequence[Mapping[str, Any] | None] | None,
    count: int,
) -> dict[str, Any] | None:
    """The request's ``meta``: the request-level keys, and ``docs`` for per-input maps."""
    combined = _string_keyed(meta, "meta") if meta is not None else {}
    if metadata is not None:
        if DOCS_META_KEY in combined:
            raise ValueError(
                f"meta[{DOCS_META_KEY!r}] is reserved for the per-input metadata; "
                "pass those as metadata="
            )
        if isinstance(metadata, Mapping | str | bytes):
            raise TypeError("metadata must be a sequence of maps (or None), one per text")
        docs = [
            {} if item is None else _string_keyed(item, f"metadata[{index}]")
            for index, item in enumerate(metadata)
        ]
        if len(docs) != count:
            raise ValueError(
                f"metadata has {len(docs)} entries for {count} texts; give one per text"
            )
        combined[DOCS_META_KEY] = docs
    return combined or None


def _string_keyed(value: object, name: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a map with string keys, not {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise TypeError(f"{name} must have string keys, not {key!r}")
    return dict(value)


def _where(request: Request) -> str:
    """Which part of a request msgpack cannot encode (its meta is the only free-form part)."""
    meta = request.meta or {}
    for index, doc in enumerate(meta.get(DOCS_META_KEY) or ()):
        if not _packable(doc):
            return f"metadata[{index}] holds a value msgpack cannot encode"
    for key, value in meta.items():
        if key != DOCS_META_KEY and not _packable(value):
            return f"meta[{key!r}] holds a value msgpack cannot encode"
    return "a field holds a value msgpack cannot encode"


def _packable(value: object) -> bool:
    try:
        msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return False
    return True
