"""SyncEmbedClient's mechanics over a stand-in async client: its own loop on a background
thread, calls from a thread whose loop is running, many threads at once, errors raised in
the caller's thread, close() and the context manager. The real client against Kafka and a
worker: tests/integration/test_sync_client.py."""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from producer_sdk import (
    ChunkedEmbeddings,
    Chunking,
    ClientClosedError,
    EmbedClient,
    EmbedError,
    SyncEmbedClient,
)
from producer_sdk.catalog import CatalogModel
from schemas import Encoding
from tests.support.sdk import FakeClient


class FakeAsyncClient(FakeClient):
    """The shared fake, answering one row per text derived from the text, interleaving
    concurrent calls; ``model="missing"`` is an unknown model, ``model="embedder"`` not a
    reranker."""

    def __init__(self) -> None:
        super().__init__()
        self.model_name = "fake"
        self.vector = lambda t: rows([t])[0]
        self.score = lambda query, document: len(document)
        self.jitter = 0.01
        self.catalog = []
        self.errors = {
            "missing": EmbedError("unknown_model", "no such model", request_id="r1"),
            "embedder": EmbedError("invalid_request", "an embedding model", request_id="r2"),
        }


def rows(texts: Sequence[str]) -> np.ndarray:
    return np.array([[len(t), sum(map(ord, t))] for t in texts], dtype=np.float32)


def make() -> tuple[SyncEmbedClient, FakeAsyncClient]:
    fake = FakeAsyncClient()
    return SyncEmbedClient._wrapping(lambda: fake), fake


def test_calls_run_on_one_background_loop_and_return_the_async_results() -> None:
    client, fake = make()
    try:
        assert fake.started
        vectors = client.embed(["a", "bb"], dimensions=2, prompt_name="query")
        assert np.array_equal(vectors, rows(["a", "bb"]))
        assert client.embed_result(["abc"]).model == "fake"
        assert client.models(timeout=2.5) == fake.catalog
        assert fake.catalog_timeouts == [2.5]
        assert client.submit(["x"], keys=[1], request_id="mine") == "mine"
        assert client.reply_partition == 3
        assert client.config.bootstrap_servers == "fake:9092"
    finally:
        client.close()
    assert threading.get_ident() not in fake.threads
    assert len(fake.threads) == 1  # start, every call and close: the one loop thread
    assert len(fake.loops) == 1
    assert fake.calls[0][1] == {
        "timeout": None,
        "model": None,
        "normalize": True,
        "truncate": True,
        "dimensions": 2,
        "prompt": None,
        "prompt_name": "query",
        "truncation_direction": None,
        "chunking": None,
        "chunk_pooling": "none",
        "encoding": Encoding.FLOAT32,
    }
    assert fake.calls[-1][1]["keys"] == [1]
    assert fake.calls[-1][1]["chunking"] is None
    assert fake.closed


def test_rerank_blocks_and_returns_the_async_clients_scores_and_errors() -> None:
    client, fake = make()
    with client:
        reranked = client.rerank("q", ["a", "ccc", "bb"], top_n=2, model="ce", timeout=4)
        assert reranked.order == (1, 2)
        assert reranked.scores.tolist() == [1, 3, 2]
        assert [r.index for r in reranked.results] == [1, 2]
        with pytest.raises(EmbedError) as caught:
            client.rerank("q", ["a"], model="embedder")
        assert caught.value.code == "invalid_request"
    assert fake.calls[0][1] == {
        "model": "ce",
        "top_n": 2,
        "return_documents": False,
        "raw_scores": False,
        "truncate": True,
        "truncation_direction": None,
        "timeout": 4,
    }
    with pytest.raises(ClientClosedError):
        client.rerank("q", ["a"])


def test_chunked_embed_gives_chunked_embeddings_and_mean_an_array() -> None:
    with make()[0] as client:
        chunked = client.embed(["ab", "cde"], chunking=Chunking(16, 2))
        assert isinstance(chunked, ChunkedEmbeddings)
        assert [item.spans for item in chunked] == [((0, 2),), ((0, 3),)]
        mean = client.embed(["ab", "cde"], chunking=Chunking(16), chunk_pooling="mean")
        assert np.array_equal(mean, rows(["ab", "cde"]))


def test_an_error_is_raised_in_the_callers_thread_with_its_class_and_fields() -> None:
    with make()[0] as client:
        with pytest.raises(EmbedError) as caught:
            client.embed(["text"], model="missing")
        assert caught.value.code == "unknown_model"
        assert caught.value.request_id == "r1"
        assert client.embed(["still"]).shape == (1, 2)  # the client keeps working


def test_works_where_an_event_loop_is_running_in_the_callers_thread() -> None:
    """As in Jupyter: the calling thread runs a loop; the call blocks it and returns."""

    async def notebook_cell() -> np.ndarray:
        asyncio.get_running_loop()  # a loop is running here
        with make()[0] as client:
            return client.embed(["from a running loop"])

    assert np.array_equal(asyncio.run(notebook_cell()), rows(["from a running loop"]))


def test_threads_share_one_client_and_each_gets_its_own_vectors() -> None:
    client, fake = make()
    failures: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(25):
                texts = [f"t{seed}-" + "w" * rng.randint(0, 40) for _ in range(rng.randint(1, 9))]
                assert np.array_equal(client.embed(texts), rows(texts))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    with client:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failures == []
    assert len(fake.calls) == 100
    assert len(fake.threads) == 1


def test_after_close_every_call_raises_client_closed_and_the_thread_ends() -> None:
    client, fake = make()
    with client:
        client.embed(["x"])
    assert client.closed
    assert fake.closed
    assert not client._thread.is_alive()
    for call in (
        lambda: client.embed(["x"]),
        lambda: client.submit(["x"]),
        lambda: client.models(),
    ):
        with pytest.raises(ClientClosedError, match="closed"):
            call()
    client.close()  # again: nothing happens


def test_close_ends_a_call_that_is_still_waiting() -> None:
    """A call waiting in another thread raises ClientClosedError once close() runs, rather
    than waiting forever on a stopped loop."""
    client, fake = make()
    fake.gate = asyncio.Event()  # never set: the call waits until cancelled
    caught: list[BaseException] = []
    entered = threading.Event()

    def wait() -> None:
        entered.set()
        try:
            client.embed(["never answered"])
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    entered.wait()
    while not fake.calls:  # the call reached the async client
        threading.Event().wait(0.001)
    client.close()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert len(caught) == 1
    assert isinstance(caught[0], ClientClosedError)


def test_a_failed_start_raises_its_error_and_leaves_no_thread() -> None:
    class Refused(FakeAsyncClient):
        async def start(self) -> None:
            raise ConnectionRefusedError("no broker")

    before = threading.active_count()
    with pytest.raises(ConnectionRefusedError, match="no broker"):
        SyncEmbedClient._wrapping(lambda: Refused())
    assert threading.active_count() == before


def test_invalid_options_raise_what_the_async_client_raises() -> None:
    with pytest.raises(ValueError, match="security_protocol"):
        SyncEmbedClient("localhost:9092", security_protocol="NOPE")


@pytest.mark.parametrize("name", ["embed", "embed_result", "rerank", "submit", "models"])
def test_methods_mirror_the_async_signatures(name: str) -> None:
    """Every keyword of the async method, with its type and default, spelled out (so type
    checkers and IDEs see them); only the return is no longer awaitable."""
    sync = inspect.signature(getattr(SyncEmbedClient, name))
    async_ = inspect.signature(getattr(EmbedClient, name))
    assert list(sync.parameters.values()) == list(async_.parameters.values())
    assert sync.return_annotation == async_.return_annotation
    assert not inspect.iscoroutinefunction(getattr(SyncEmbedClient, name))


def test_a_call_from_the_clients_own_loop_raises_instead_of_waiting_forever() -> None:
    client = make()[0]
    inner: list[BaseException] = []

    class Reentrant(FakeAsyncClient):
        async def models(self, timeout: float | None = None) -> list[CatalogModel]:
            try:
                client.embed(["from the loop thread"])
            except RuntimeError as exc:
                inner.append(exc)
            return []

    with client:
        client._client = Reentrant()
        assert client.models() == []
    assert len(inner) == 1
    assert "own event loop" in str(inner[0])
