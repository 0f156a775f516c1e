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
import functools
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from producer_sdk.client import EmbedClient
from producer_sdk.config import ClientConfig
from producer_sdk.errors import ClientClosedError

__all__ = ["SyncEmbedClient"]

T = TypeVar("T")
P = ParamSpec("P")


def _blocking(
    method: Callable[Concatenate[EmbedClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[SyncEmbedClient, P], T]:
    """``method`` of the async client as a blocking method of :class:`SyncEmbedClient`:
    the same signature (and overloads) and documentation, run on the client's loop."""
    name = method.__name__

    @functools.wraps(method)
    def call(self: SyncEmbedClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        coroutine: Coroutine[Any, Any, T] = getattr(self._client, name)(*args, **kwargs)
        return self._submit(coroutine)

    call.__doc__ = (
        f":meth:`EmbedClient.{name} <producer_sdk.EmbedClient.{name}>`, blocking: the same "
        "options, results and exceptions.\n\n" + (method.__doc__ or "")
    )
    return call


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

    models = _blocking(EmbedClient.models)
    embed = _blocking(EmbedClient.embed)
    embed_result = _blocking(EmbedClient.embed_result)
    rerank = _blocking(EmbedClient.rerank)
    embed_sparse = _blocking(EmbedClient.embed_sparse)
    tokenize = _blocking(EmbedClient.tokenize)
    decode = _blocking(EmbedClient.decode)
    submit = _blocking(EmbedClient.submit)
    submit_sparse = _blocking(EmbedClient.submit_sparse)


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
