"""``EmbedClient``: a request/response facade over Kafka.

    async with EmbedClient(bootstrap_servers="localhost:9092") as client:
        vectors = await client.embed(["first text", "second text"], timeout=30)
        codes = await client.embed(["first text"], encoding="int8")  # int8 (1, dim)

Many calls may run concurrently on one client; each is correlated with its result by a
unique request id. Results go to one partition of the reply topic that this client reads
(see ``producer_sdk.transport``), so separate clients do not receive each other's results.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt
import structlog

from producer_sdk.catalog import CatalogModel, Lane, ModelRouter, read_catalog
from producer_sdk.config import ClientConfig
from producer_sdk.encodings import Embeddings
from producer_sdk.errors import (
    AuthorizationError,
    ClientClosedError,
    EmbedError,
    EmbedTimeoutError,
    UnexpectedEncodingError,
)
from producer_sdk.pending import PendingCalls
from producer_sdk.transport import Transport
from schemas import (
    EmbedRequest,
    Encoding,
    ErrorResult,
    SchemaError,
    decode_result,
    encode_request,
)
from schemas.headers import routing_headers

__all__ = ["EmbedClient"]

log = structlog.get_logger("kembed.sdk")

_ENCODING_NAMES = frozenset(encoding.value for encoding in Encoding)


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
        """The topic a request for ``model`` goes to: ``model_topics``, else the topic the
        catalog names for it (by name or alias), else the configured ``requests_topic``."""
        if model is not None:
            current = self.config.requests_topic
            if (topic := await self._router.topic_for(model, lane, current)) is not None:
                return topic
        return self.config.requests_topic

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
        encoding: Encoding | str = Encoding.FLOAT32,
    ) -> npt.NDArray[Any]:
        """Embed ``texts``; one row per text, in input order.

        The array's type follows ``encoding``: float32 (default) and float16 give
        (len(texts), dim) floats, int8 (len(texts), dim) codes (divide by 127 for normalized
        vectors; :meth:`embed_result` also gives the scales), binary (len(texts),
        ceil(dim / 8)) uint8 packed sign bits (:func:`producer_sdk.unpack_bits`).

        Raises EmbedError (with the wire ``code``) when the worker rejects the request,
        EmbedTimeoutError when no result arrives within ``timeout`` seconds, and
        AuthorizationError at once when this client may not write the request topic (or
        read the reply topic).
        """
        result = await self.embed_result(
            texts,
            timeout=timeout,
            model=model,
            normalize=normalize,
            truncate=truncate,
            dimensions=dimensions,
            prompt=prompt,
            encoding=encoding,
        )
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
        encoding: Encoding | str = Encoding.FLOAT32,
    ) -> Embeddings:
        """Like :meth:`embed`, but the whole result: vectors, int8 scales, tokens, model."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a sequence of strings")
        if not texts:
            raise ValueError("texts must not be empty")
        if encoding not in _ENCODING_NAMES:
            raise ValueError(f"encoding must be one of {', '.join(Encoding)}, not {encoding!r}")
        if not self._started:
            raise ClientClosedError("the client is not started; use 'async with'")
        if (failure := self._transport.failure) is not None:
            raise AuthorizationError(failure.principal, failure.operation, failure.topic)
        wait = self.config.timeout if timeout is None else timeout
        request = EmbedRequest(
            id=uuid.uuid4().hex,
            inputs=tuple(texts),
            model=model or self.config.model,
            normalize=normalize,
            truncate=truncate,
            dimensions=dimensions,
            encoding=Encoding(encoding),
            prompt=prompt,
            deadline_ms=int((time.time() + wait) * 1000),
            reply_to=self.config.reply_topic,
            reply_partition=self.reply_partition,
        )
        topic = await self.request_topic(request.model)
        result = await self._call(request, wait, topic)
        if isinstance(result, ErrorResult):
            raise EmbedError(
                str(result.error.code),
                result.error.message,
                index=result.error.index,
                request_id=result.id,
            )
        if result.dtype != request.encoding:
            raise UnexpectedEncodingError(request.id, str(request.encoding), str(result.dtype))
        return Embeddings.from_result(result)

    async def _call(self, request: EmbedRequest, timeout: float, topic: str | None = None) -> Any:
        future = self._pending.add(request.id)
        headers = routing_headers(request.id, request.reply_to, request.reply_partition)
        try:
            async with asyncio.timeout(timeout):
                await self._transport.send(encode_request(request), headers, topic)
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
