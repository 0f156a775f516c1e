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
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Unpack, overload

import numpy as np
import numpy.typing as npt

from producer_sdk.answers import KIND_OF, R, check_kind, expected_result
from producer_sdk.catalog import CatalogModel, Lane, ModelRouter
from producer_sdk.chunked import ChunkedEmbeddings
from producer_sdk.config import ClientConfig
from producer_sdk.encodings import Embeddings
from producer_sdk.errors import (
    AuthorizationError,
    ClientClosedError,
    EmbedTimeoutError,
    KembedError,
    UnexpectedEncodingError,
    UnexpectedResultError,
)
from producer_sdk.options import (
    EmbedKeywords,
    EmbedOptions,
    RerankOptions,
    SparseOptions,
    SubmitOptions,
    UnchunkedKeywords,
    check_texts,
)
from producer_sdk.pending import PendingCalls
from producer_sdk.rerank import Reranked
from producer_sdk.sparse import SparseEmbeddings
from producer_sdk.tokens import (
    Decoding,
    Tokenization,
    decode_request,
    texts_of,
    tokenize_request,
    tokens_of,
)
from producer_sdk.transport import ClientTransport, Transport, TransportFactory
from producer_sdk.wire import content_key, encoded
from schemas import (
    Chunking,
    DecodeResult,
    EmbedRequest,
    EmbedResult,
    Encoding,
    Kind,
    Request,
    RerankResult,
    Result,
    SparseRequest,
    SparseResult,
    TokenizeResult,
)
from schemas.headers import routing_headers

__all__ = ["EmbedClient"]


class EmbedClient:
    def __init__(self, bootstrap_servers: str, **options: Any) -> None:
        """Options are the fields of :class:`~producer_sdk.config.ClientConfig`, and
        ``transport``, a :data:`~producer_sdk.transport.TransportFactory` that makes what
        carries requests and results (default Kafka; in tests, the in-memory transport of
        :mod:`producer_sdk.testing`)."""
        transport: TransportFactory = options.pop("transport", Transport)
        self.config = ClientConfig(bootstrap_servers=bootstrap_servers, **options)
        self._pending = PendingCalls()
        self._transport: ClientTransport = transport(
            self.config, self._pending.receive, self._pending.fail_all
        )
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
        models = await self._transport.read_catalog(timeout)
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
        encoding: Literal["float32"] = ...,
        **options: Unpack[UnchunkedKeywords],
    ) -> npt.NDArray[np.float32]: ...

    @overload
    async def embed(
        self,
        texts: Sequence[str],
        *,
        encoding: Literal["float16"],
        **options: Unpack[UnchunkedKeywords],
    ) -> npt.NDArray[np.float16]: ...

    @overload
    async def embed(
        self,
        texts: Sequence[str],
        *,
        encoding: Literal["int8"],
        **options: Unpack[UnchunkedKeywords],
    ) -> npt.NDArray[np.int8]: ...

    @overload
    async def embed(
        self,
        texts: Sequence[str],
        *,
        encoding: Literal["binary"],
        **options: Unpack[UnchunkedKeywords],
    ) -> npt.NDArray[np.uint8]: ...

    @overload
    async def embed(
        self,
        texts: Sequence[str],
        *,
        encoding: Encoding | str,
        **options: Unpack[UnchunkedKeywords],
    ) -> npt.NDArray[Any]: ...

    @overload
    async def embed(
        self,
        texts: Sequence[str],
        *,
        chunking: Chunking,
        chunk_pooling: Literal["none"] = ...,
        encoding: Encoding | str = ...,
        **options: Unpack[EmbedKeywords],
    ) -> ChunkedEmbeddings: ...

    @overload
    async def embed(
        self,
        texts: Sequence[str],
        *,
        chunking: Chunking,
        chunk_pooling: Literal["mean"],
        encoding: Literal["float32"] = ...,
        **options: Unpack[EmbedKeywords],
    ) -> npt.NDArray[np.float32]: ...

    @overload
    async def embed(
        self,
        texts: Sequence[str],
        *,
        chunking: Chunking,
        chunk_pooling: Literal["mean"],
        encoding: Encoding | str,
        **options: Unpack[EmbedKeywords],
    ) -> npt.NDArray[Any]: ...

    async def embed(
        self,
        texts: Sequence[str],
        *,
        chunking: Chunking | None = None,
        chunk_pooling: Literal["none", "mean"] = "none",
        encoding: Encoding | str = Encoding.FLOAT32,
        **options: Unpack[EmbedKeywords],
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
            texts, chunking=chunking, chunk_pooling=chunk_pooling, encoding=encoding, **options
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
        check_texts(texts)
        embedding = EmbedOptions(
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
        request = embedding.request(texts, self.config.max_input_chars, self.config.model)
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
        reranking = RerankOptions(
            model=model,
            top_n=top_n,
            return_documents=return_documents,
            raw_scores=raw_scores,
            truncate=truncate,
            truncation_direction=truncation_direction,
        )
        request = reranking.request(
            query, documents, self.config.max_input_chars, self.config.model
        )
        result = await self._answer(request, timeout, RerankResult)
        if result.count != len(documents):
            got = f"scores for {result.count} documents"
            raise UnexpectedResultError(request.id, f"{len(documents)} scores", got)
        return Reranked.from_result(result)

    async def embed_sparse(
        self,
        texts: Sequence[str],
        *,
        model: str | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
        top_k: int | None = None,
        truncate: bool = True,
        truncation_direction: Literal["right", "left"] | None = None,
        timeout: float | None = None,
    ) -> SparseEmbeddings:
        """The term weights of each of ``texts`` by a sparse (SPLADE-style) encoder (a
        model whose catalog ``kind`` is ``sparse``): a :class:`~producer_sdk.SparseEmbeddings`,
        per text its nonzero weights as ascending vocabulary ids and float32 values (equal
        to sentence-transformers' ``SparseEncoder.encode``). ``top_k`` keeps each text's
        largest that many (default: the model's ``max_active_dims``, else all); prompts and
        truncation as for :meth:`embed`.

        Raises what :meth:`embed` raises (``invalid_request`` at once when the catalog says
        ``model`` is of another kind); UnexpectedResultError when the worker answers
        anything but the weights of these texts.
        """
        options = SparseOptions(
            model=model,
            prompt=prompt,
            prompt_name=prompt_name,
            top_k=top_k,
            truncate=truncate,
            truncation_direction=truncation_direction,
        )
        request = options.request(texts, self.config.max_input_chars, self.config.model)
        result = await self._answer(request, timeout, SparseResult)
        if result.count != len(texts):
            got = f"weights for {result.count} texts"
            raise UnexpectedResultError(request.id, f"weights for {len(texts)} texts", got)
        return SparseEmbeddings.from_result(result)

    async def tokenize(
        self,
        texts: Sequence[str],
        *,
        model: str | None = None,
        add_special_tokens: bool = True,
        prompt_name: str | None = None,
        timeout: float | None = None,
    ) -> Tokenization:
        """Per text, the tokens the model's tokenizer makes of it (``prompt_name``: one of
        the model's prompts first), not truncated: ``tokens``, lists of
        :class:`~producer_sdk.Token` (id, text, special, UTF-8 byte offsets). Any model
        answers, embedding model or reranker, from its tokenizer alone. Raises what
        :meth:`embed` raises."""
        default = self.config.model
        request = tokenize_request(
            texts, model or default, add_special_tokens, prompt_name, self.config.max_input_chars
        )
        return tokens_of(request, await self._answer(request, timeout, TokenizeResult))

    async def decode(
        self,
        ids: Sequence[Sequence[int]],
        *,
        model: str | None = None,
        skip_special_tokens: bool = True,
        timeout: float | None = None,
    ) -> Decoding:
        """``texts``: the text of each sequence of token ids, as the model's tokenizer decodes it
        (special tokens left out unless ``skip_special_tokens=False``). An id outside the
        model's vocabulary is EmbedError ``invalid_request`` (``index``: the sequence)."""
        request = decode_request(ids, model or self.config.model, skip_special_tokens)
        return texts_of(request, await self._answer(request, timeout, DecodeResult))

    async def _answer(self, request: Request, timeout: float | None, expected: type[R]) -> R:
        """Send ``request`` on the interactive lane and wait for its result, which must be
        an ``expected``; the one path of :meth:`embed_result`, :meth:`rerank`,
        :meth:`tokenize` and :meth:`decode`."""
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
        if expected in KIND_OF:
            await check_kind(self._router, request, KIND_OF[expected])
        topic = await self.request_topic(request.model)
        return expected_result(request, await self._call(request, wait, topic), expected)

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
        check_texts(texts)
        embedding = EmbedOptions(
            model=model,
            normalize=normalize,
            dimensions=dimensions,
            prompt=prompt,
            prompt_name=prompt_name,
            encoding=encoding,
            chunking=chunking,
            chunk_pooling=chunk_pooling,
        )
        sending = SubmitOptions(
            reply_to or self.config.reply_topic, meta, bulk, request_id, affinity
        )
        request = sending.request(
            texts, embedding, self.config.max_input_chars, self.config.model, keys, metadata
        )
        return await self._submit(request, sending, Kind.EMBED)

    async def submit_sparse(
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
        top_k: int | None = None,
        request_id: str | None = None,
    ) -> str:
        """:meth:`submit` for a sparse encoder: send one sparse request without waiting,
        return its id once the broker has acknowledged it. The result on ``reply_to`` is a
        sparse result carrying ``keys`` and ``meta`` (``metadata`` as ``meta["docs"]``)
        like an embed result; options as for :meth:`embed_sparse`. Raises what
        :meth:`submit` raises (``invalid_request`` when the catalog says ``model`` is not a
        sparse encoder)."""
        check_texts(texts)
        sparse = SparseOptions(model=model, prompt=prompt, prompt_name=prompt_name, top_k=top_k)
        sending = SubmitOptions(reply_to or self.config.reply_topic, meta, bulk, request_id)
        request = sending.sparse_request(
            texts, sparse, self.config.max_input_chars, self.config.model, keys, metadata
        )
        return await self._submit(request, sending, Kind.SPARSE)

    async def _submit(
        self, request: EmbedRequest | SparseRequest, sending: SubmitOptions, kind: Kind
    ) -> str:
        """Send a request that no one here waits for, to its model's topic of the lane."""
        self._check_started()
        await check_kind(self._router, request, kind)
        topic = await self.request_topic(request.model, "bulk" if sending.bulk else "interactive")
        key = None
        if sending.affinity and isinstance(request, EmbedRequest):
            key = content_key(request)  # sparse requests have no affinity: never cached
        await self._send(request, topic, key)
        return request.id

    def _check_started(self) -> None:
        if not self._started:
            raise ClientClosedError("the client is not started; use 'async with'")

    async def _send(self, request: Request, topic: str, key: bytes | None = None) -> None:
        """Encode, check the size and send; return once the broker acknowledged it."""
        value = encoded(request, self.config.max_request_bytes)
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
