"""Unit tests for the SDK's side of chunking: ChunkedEmbeddings over a result the worker's
publish stage wrote (through the real codec), argument checks, and the return types mypy
sees for embed(..., chunking=...)."""

from __future__ import annotations

from typing import Any, assert_type

import numpy as np
import numpy.typing as npt
import pytest

from producer_sdk import (
    ChunkedEmbeddings,
    Chunking,
    EmbedClient,
    Embeddings,
    InputChunks,
    SyncEmbedClient,
)
from schemas import EmbedResult, Encoding, decode_result
from worker.chunking import ChunkedRequest
from worker.publish import encode_vectors

CHUNKS = (2, 1, 3)
SPANS = ((0, 10), (8, 20), (0, 5), (0, 9), (7, 15), (12, 30))


def chunked_result(
    pooling: str = "none", encoding: Encoding = Encoding.FLOAT32
) -> tuple[Embeddings, npt.NDArray[np.float32]]:
    """A worker's answer to a request of 3 inputs in 2 + 1 + 3 chunks, as the SDK reads
    it, and the raw chunk rows it was made of."""
    raw = np.random.default_rng(1).normal(size=(6, 8)).astype(np.float32)
    request = ChunkedRequest(
        id="r",
        inputs=tuple("abcdef"),
        encoding=encoding,
        chunking=Chunking(16, 2),
        chunk_pooling=pooling,
        chunks=CHUNKS,
        spans=SPANS,
    )
    value = encode_vectors(request, raw, [5, 6, 7, 8, 9, 10], "m", 1 << 20)
    result = decode_result(value)
    assert isinstance(result, EmbedResult)
    return Embeddings.from_result(result), raw


def test_chunked_embeddings_are_ragged_per_input_and_flat() -> None:
    embeddings, raw = chunked_result()
    chunked = ChunkedEmbeddings.from_embeddings(embeddings)
    assert len(chunked) == 3
    assert chunked.vectors.shape == (6, 8)
    normalized = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    np.testing.assert_allclose(chunked.vectors, normalized, rtol=1e-6)
    assert chunked.spans == SPANS
    assert chunked.tokens == (5, 6, 7, 8, 9, 10)
    assert chunked.chunks == CHUNKS
    assert chunked.inputs.tolist() == [0, 0, 1, 2, 2, 2]
    last = chunked[2]
    assert isinstance(last, InputChunks)
    assert len(last) == 3
    np.testing.assert_array_equal(last.vectors, chunked.vectors[3:])
    assert last.spans == SPANS[3:]
    assert last.tokens == (8, 9, 10)
    assert chunked[-3].spans == SPANS[:2]
    assert [len(item) for item in chunked] == list(CHUNKS)
    with pytest.raises(IndexError):
        chunked[3]


def test_int8_chunks_keep_their_scales() -> None:
    embeddings, _ = chunked_result(encoding=Encoding.INT8)
    chunked = ChunkedEmbeddings.from_embeddings(embeddings)
    assert chunked.vectors.dtype == np.int8
    assert chunked.scales is not None
    middle = chunked[1]
    assert middle.scales is not None
    np.testing.assert_array_equal(middle.scales, chunked.scales[2:3])


def test_mean_pooled_result_is_one_row_per_input() -> None:
    embeddings, raw = chunked_result("mean")
    assert embeddings.vectors.shape == (3, 8)
    assert embeddings.tokens == (11, 7, 27)
    assert embeddings.chunks == CHUNKS
    normalized = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    first = normalized[:2].mean(axis=0)
    np.testing.assert_allclose(embeddings.vectors[0], first / np.linalg.norm(first), rtol=1e-5)
    with pytest.raises(ValueError, match="mean pooling"):
        ChunkedEmbeddings.from_embeddings(embeddings)


def test_a_result_without_chunking_has_no_chunks() -> None:
    embeddings, _ = chunked_result()
    plain = Embeddings(embeddings.vectors, Encoding.FLOAT32, 8, None, (1,) * 6, "m")
    assert plain.chunks is None
    with pytest.raises(ValueError, match="no chunks"):
        ChunkedEmbeddings.from_embeddings(plain)


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        pytest.param({"chunk_pooling": "mean"}, ValueError, "needs chunking", id="mean alone"),
        pytest.param(
            {"chunking": Chunking(8), "chunk_pooling": "max"},
            ValueError,
            "'none' or 'mean'",
            id="unknown pooling",
        ),
        pytest.param({"chunking": {"max_tokens": 8}}, TypeError, "a Chunking", id="a dict"),
    ],
)
async def test_bad_chunking_arguments_are_refused_before_sending(
    options: dict[str, Any], error: type[Exception], words: str
) -> None:
    client = EmbedClient(bootstrap_servers="localhost:9")  # never started: nothing is sent
    with pytest.raises(error, match=words):
        await client.embed(["text"], **options)
    with pytest.raises(error, match=words):
        await client.submit(["text"], **options)


def test_chunking_numbers_are_checked_when_made() -> None:
    with pytest.raises(ValueError, match="overlap_tokens"):
        Chunking(8, 8)


async def _return_types(client: EmbedClient, sync: SyncEmbedClient) -> None:
    """Checked by mypy (not run): what embed() returns with and without chunking."""
    chunking = Chunking(256, 32)
    assert_type(await client.embed(["a"]), npt.NDArray[np.float32])
    assert_type(await client.embed(["a"], chunking=chunking), ChunkedEmbeddings)
    assert_type(await client.embed(["a"], chunking=chunking, encoding="int8"), ChunkedEmbeddings)
    mean = await client.embed(["a"], chunking=chunking, chunk_pooling="mean")
    assert_type(mean, npt.NDArray[np.float32])
    coded = await client.embed(["a"], chunking=chunking, chunk_pooling="mean", encoding="int8")
    assert_type(coded, npt.NDArray[Any])
    assert_type(await client.embed(["a"], encoding="int8"), npt.NDArray[np.int8])
    assert_type(sync.embed(["a"]), npt.NDArray[np.float32])
    assert_type(sync.embed(["a"], chunking=chunking), ChunkedEmbeddings)
    assert_type(sync.embed(["a"], chunking=chunking, chunk_pooling="mean"), npt.NDArray[np.float32])
