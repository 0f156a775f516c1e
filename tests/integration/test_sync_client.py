"""SyncEmbedClient against the real broker and a real worker: the async client's vectors and
errors, from inside a running event loop, from four threads at once, and after close."""

from __future__ import annotations

import asyncio
import random
import threading

import numpy as np
import numpy.typing as npt
import pytest

from loadtest.data import passages, stsb_sentences
from producer_sdk import ClientClosedError, EmbedClient, EmbedError, SyncEmbedClient
from scripts.kafka_local import LocalKafka
from tests.conftest import WorkerProcess

pytestmark = pytest.mark.integration


def cosines(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    dots = np.sum(a64 * b64, axis=1)
    norms = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    result: npt.NDArray[np.float64] = dots / norms
    return result


async def test_same_vectors_and_errors_as_the_async_client_inside_a_running_loop(
    kafka: LocalKafka, worker: WorkerProcess
) -> None:
    """Called where an event loop is running (this test's, as in Jupyter), the synchronous
    client returns the async client's vectors, options included, and raises the same
    exception classes with the same wire codes."""
    asyncio.get_running_loop()
    texts = stsb_sentences()[:24]
    async with EmbedClient(kafka.bootstrap_servers) as async_client:
        expected = await async_client.embed(texts, timeout=60)
        expected_short = await async_client.embed(texts[:3], timeout=60, dimensions=64)
        with pytest.raises(EmbedError) as many_async:
            await async_client.embed(["text"] * 513, timeout=60)
        with pytest.raises(EmbedError) as unknown_async:
            await async_client.embed(["text"], timeout=60, model="no-such-model")
    async_errors = {"too_many_inputs": many_async.value, "unknown_model": unknown_async.value}

    with SyncEmbedClient(kafka.bootstrap_servers) as client:
        vectors = client.embed(texts, timeout=60)
        short = client.embed(texts[:3], timeout=60, dimensions=64)
        with pytest.raises(EmbedError) as too_many:
            client.embed(["text"] * 513, timeout=60)
        with pytest.raises(EmbedError) as unknown:
            client.embed(["text"], timeout=60, model="no-such-model")
        result = client.embed_result(texts[:2], timeout=60, encoding="int8")

    assert vectors.dtype == np.float32
    assert vectors.shape == expected.shape == (24, 384)
    assert cosines(vectors, expected).min() > 0.9999
    assert short.shape == (3, 64)
    assert cosines(short, expected_short).min() > 0.9999
    for error, name in ((too_many.value, "too_many_inputs"), (unknown.value, "unknown_model")):
        assert type(error) is type(async_errors[name])
        assert error.code == async_errors[name].code == name
    assert result.vectors.dtype == np.int8
    assert cosines(result.to_float32(), expected[:2]).min() > 0.99


def test_four_threads_with_mixed_lengths_each_get_their_own_vectors(
    kafka: LocalKafka, worker: WorkerProcess
) -> None:
    """Four threads share one client, each sending requests of one to eight texts mixing
    sentences and ~200-token passages; every row matches that text's own vector."""
    sentences = stsb_sentences()[:120]
    pool = sentences[:60] + passages(sentences[60:], words=120)
    with SyncEmbedClient(kafka.bootstrap_servers) as client:
        reference = dict(zip(pool, client.embed(pool, timeout=120), strict=True))
        failures: list[BaseException] = []
        counts = [0] * 4

        def work(index: int) -> None:
            rng = random.Random(index)
            try:
                for _ in range(12):
                    texts = rng.sample(pool, rng.randint(1, 8))
                    vectors = client.embed(texts, timeout=120)
                    expected = np.stack([reference[t] for t in texts])
                    assert cosines(vectors, expected).min() > 0.9999
                    counts[index] += len(texts)
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    assert failures == []
    assert all(count > 0 for count in counts)
    assert not any(thread.is_alive() for thread in threads)


def test_close_and_the_context_manager(kafka: LocalKafka, worker: WorkerProcess) -> None:
    """Leaving the with block closes the client: its thread ends and a later call raises
    ClientClosedError; close() works without the with block and may be called twice."""
    with SyncEmbedClient(kafka.bootstrap_servers) as client:
        assert client.embed(["before close"], timeout=60).shape == (1, 384)
        assert client.submit(["fire and forget"], bulk=False)
    assert client.closed
    with pytest.raises(ClientClosedError):
        client.embed(["after close"], timeout=60)

    plain = SyncEmbedClient(kafka.bootstrap_servers)
    assert plain.embed(["plain"], timeout=60).shape == (1, 384)
    plain.close()
    plain.close()
    with pytest.raises(ClientClosedError):
        plain.embed(["after close"], timeout=60)
