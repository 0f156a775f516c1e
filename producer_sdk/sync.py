"""``SyncEmbedClient``: the same client without asyncio, for scripts, notebooks and web
frameworks that have no event loop of their own.

    with SyncEmbedClient("localhost:9092") as client:
        vectors = client.embed(["first text", "second text"], timeout=30)
        ranked = client.rerank("a query", ["doc", "other doc"], model="reranker")

It owns an :class:`~producer_sdk.EmbedClient` that lives on its own event loop in a
background thread; every method hands its call to that loop and blocks the calling thread
until it ends. The options, return values and exceptions are the async client's (an
exception raised there is raised again, the same object, in the caller's thread). Because
the loop is not the caller's, it works where a loop is already running in the calling
thread (Jupyter, an ``async def`` handler), although the call then blocks that loop while
it waits; in async code, ``await`` the async client instead. Any number of threads may call
one client at once: their calls run concurrently on the one connection, each matched to
its own result.

The constructor connects (the async client's ``start()``); ``close()`` (or leaving the
``with`` block) disconnects and stops the thread. A call still waiting then raises
ClientClosedError, and so does every call made after ``close()``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

import numpy as np
import numpy.typing as npt

from producer_sdk.catalog import CatalogModel
from producer_sdk.chunked import ChunkedEmbeddings
from producer_sdk.client import EmbedClient
from producer_sdk.config import ClientConfig
from producer_sdk.encodings import Embeddings
from producer_sdk.errors import ClientClosedError
from producer_sdk.rerank import Reranked
from schemas import Chunking, Encoding

__all__ = ["SyncEmbedClient"]

T = TypeVar("T")


class SyncEmbedClient:
    def __init__(self, bootstrap_servers: str, **options: Any) -> None:
        """Options are the fields of :class:`~producer_sdk.config.ClientConfig`, as for
        :class:`~producer_sdk.EmbedClient`. Connects before returning: raises what the async
        client's ``start()`` raises (e.g. AuthenticationError) and ValueError or TypeError
        for invalid options."""
        self._setup(lambda: EmbedClient(bootstrap_servers, **options))

    @classmethod
    def _wrapping(cls, make: Callable[[], EmbedClient]) -> SyncEmbedClient:
        """A client over what ``make`` builds (called on the background loop)."""
        client = cls.__new__(cls)
        client._setup(make)
        return client

    def _setup(self, make: Callable[[], EmbedClient]) -> None:
        self._state = threading.Lock()
        self._closed = False
        self._loop = asyncio.new_event_loop()
        # The thread's target holds the loop, not this object: an unclosed client that is
        # garbage collected leaves an idle daemon thread, not a cycle through self.
        self._thread = threading.Thread(
            target=_run_loop, args=(self._loop,), name="kembed-sync-client", daemon=True
        )
        self._thread.start()

        async def start() -> EmbedClient:
            client = make()  # on the loop: anything it binds to a loop binds to this one
            await client.start()
            return client

        try:
            self._client = self._submit(start())
        except BaseException:
            self._stop()
            raise

    # -- the loop ----------------------------------------------------------------------

    def _submit(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the client's loop; block until it ends; return its value or
        raise its exception."""
        if threading.get_ident() == self._thread.ident:
            coroutine.close()
            raise RuntimeError(
                "a SyncEmbedClient method was called from its own event loop (a callback "
                "it runs); that would wait forever"
            )
        with self._state:  # close() cannot slip in between the check and the scheduling
            if self._closed:
                coroutine.close()
                raise ClientClosedError("the client is closed")
            future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self._closed:  # close() cancelled the call while it waited
                raise ClientClosedError("the client was closed while the call waited") from None
            raise
        except BaseException:
            future.cancel()  # KeyboardInterrupt in the caller: do not leave the call running
            raise

    def close(self) -> None:
        """Disconnect and stop the background thread. Calls still waiting raise
        ClientClosedError; so does any later call. Closing again does nothing."""
        with self._state:
            if self._closed:
                return
            self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result()
        finally:
            self._stop()

    async def _shutdown(self) -> None:
        try:
            await self._client.close()  # fails the calls waiting for a result
        finally:
            # Calls at another stage (sending, reading the catalog) end here.
            current = asyncio.current_task()
            others = [task for task in asyncio.all_tasks() if task is not current]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

    def _stop(self) -> None:
        self._closed = True
        if self._thread.is_alive():
            # Scheduled before run_forever starts, it still stops the loop at once.
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> SyncEmbedClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the async client's API, blocking --------------------------------------------------

    @property
    def config(self) -> ClientConfig:
        return self._client.config

    @property
    def reply_partition(self) -> int:
        return self._client.reply_partition

    @property
    def dropped_results(self) -> int:
        """Results received but not waited for: late, duplicate, or another client's."""
        return self._client.dropped_results

    def models(self, timeout: float | None = None) -> list[CatalogModel]:
        """:meth:`EmbedClient.models <producer_sdk.EmbedClient.models>`, blocking."""
        return self._submit(self._client.models(timeout=timeout))

    @overload
    def embed(
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
    def embed(
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
    def embed(
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
    def embed(
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
    def embed(
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
    def embed(
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
    def embed(
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
    def embed(
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

    def embed(
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
        """:meth:`EmbedClient.embed <producer_sdk.EmbedClient.embed>`, blocking: one row
        per text, in input order (with ``chunking``, a :class:`ChunkedEmbeddings`, unless
        ``chunk_pooling`` is ``mean``); the same options and exceptions."""
        result = self.embed_result(
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

    def embed_result(
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
        """:meth:`EmbedClient.embed_result <producer_sdk.EmbedClient.embed_result>`,
        blocking: vectors, int8 scales, tokens, model."""
        return self._submit(
            self._client.embed_result(
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
        )

    def rerank(
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
        """:meth:`EmbedClient.rerank <producer_sdk.EmbedClient.rerank>`, blocking: a score
        per document and the documents by score; the same options and exceptions."""
        return self._submit(
            self._client.rerank(
                query,
                documents,
                model=model,
                top_n=top_n,
                return_documents=return_documents,
                raw_scores=raw_scores,
                truncate=truncate,
                truncation_direction=truncation_direction,
                timeout=timeout,
            )
        )

    def submit(
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
        """:meth:`EmbedClient.submit <producer_sdk.EmbedClient.submit>`, blocking: send one
        request without waiting for its result; return its id once the broker has it."""
        return self._submit(
            self._client.submit(
                texts,
                keys=keys,
                metadata=metadata,
                meta=meta,
                reply_to=reply_to,
                model=model,
                bulk=bulk,
                prompt=prompt,
                prompt_name=prompt_name,
                normalize=normalize,
                dimensions=dimensions,
                encoding=encoding,
                request_id=request_id,
                affinity=affinity,
                chunking=chunking,
                chunk_pooling=chunk_pooling,
            )
        )


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        # Whatever close() did not end (a failed start, an interrupted close) ends here.
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
