"""Chunked requests through the pipeline (its loops, scheduler, delivery and offsets as in
the worker) over the fake source, publisher and encoder of test_batch_failures: chunk
texts are batched like inputs, results are assembled per chunk or mean-pooled per input,
and the errors (a failing chunk, bad numbers, too many chunks) name the right things."""

from __future__ import annotations

import random
from itertools import pairwise

import numpy as np
import numpy.typing as npt

from schemas import Chunking, EmbedRequest, EmbedResult, ErrorCode, ErrorResult
from tests.unit.worker.test_batch_failures import (
    MAX_SEQ,
    REPLIES,
    TOPIC,
    FakeEncoder,
    Harness,
    expected_vector,
    fails_on_poison,
    text,
    word_tokenizer,
)


def rows(result: EmbedResult) -> npt.NDArray[np.float32]:
    return np.frombuffer(result.vectors, dtype=np.float32).reshape(-1, result.dim)


def chunk_vectors(texts: list[str]) -> npt.NDArray[np.float32]:
    ids = [piece.ids for piece in word_tokenizer().encode(texts)]
    return np.stack([expected_vector(i) for i in ids])


async def test_chunked_plain_and_failing_requests_in_one_poll() -> None:
    """One wave: a chunked request (a row per chunk), the same mean-pooled, a plain
    request, a chunked request whose second input has a failing chunk, one asking for
    more tokens than the model takes, and one making too many chunks. Each is answered
    once, as the contract says, every offset is committed, nothing stays in flight."""
    rng = random.Random(3)
    encoder = FakeEncoder(fails_on_poison)
    long_texts = (text(rng, 40), "w1 w2 w3", "  " + text(rng, 23) + "\n")
    chunking = Chunking(max_tokens=8, overlap_tokens=2)
    requests = [
        EmbedRequest(id="chunks", inputs=long_texts, keys=("a", "b", "c"), chunking=chunking),
        EmbedRequest(id="mean", inputs=long_texts, chunking=chunking, chunk_pooling="mean"),
        EmbedRequest(id="plain", inputs=("w5 w6", text(rng, 12))),
        EmbedRequest(
            id="poisoned",
            inputs=(text(rng, 20), text(rng, 10) + " poison " + text(rng, 10)),
            chunking=chunking,
        ),
        EmbedRequest(id="too-long", inputs=("w1",), chunking=Chunking(MAX_SEQ + 1)),
        EmbedRequest(id="overlap", inputs=("w1",), chunking=Chunking(8, 4)),
        EmbedRequest(  # a window of 1 text token under 4 of prompt: 5 tokens per token
            id="costly",
            inputs=("w1 w2", text(rng, 30)),
            prompt="w1 w2 w3 w4",
            chunking=Chunking(5),
        ),
        EmbedRequest(id="too-many", inputs=(text(rng, 150), text(rng, 150)), chunking=chunking),
    ]
    async with Harness(encoder, max_client_batch_size=40, max_batch_size=256) as h:
        h.send([(request, (TOPIC, n % 3)) for n, request in enumerate(requests)])
        results = await h.answers()
        inflight = dict(h.pipeline._inflight.inputs)
    assert inflight == {"interactive": 0, "bulk": 0}
    assert h.committed() == h.offsets

    chunked = results["chunks"]
    assert isinstance(chunked, EmbedResult)
    assert chunked.chunks is not None
    assert chunked.spans is not None
    assert chunked.keys == ("a", "b", "c")
    assert chunked.chunks[1] == 1
    assert chunked.count == sum(chunked.chunks) == len(chunked.spans)
    texts: list[str] = []
    for text_, count in zip(long_texts, chunked.chunks, strict=True):
        texts += [text_[s:e] for s, e in chunked.spans[len(texts) : len(texts) + count]]
    assert all(len(t.split()) <= 8 for t in texts)
    assert list(chunked.tokens) == [len(t.split()) for t in texts]
    np.testing.assert_allclose(rows(chunked), chunk_vectors(texts), rtol=1e-6)

    mean = results["mean"]
    assert isinstance(mean, EmbedResult)
    assert (mean.chunks, mean.spans) == (chunked.chunks, chunked.spans)
    assert mean.count == 3
    per_chunk = rows(chunked)
    bounds = np.cumsum((0, *chunked.chunks))
    expected = np.stack([per_chunk[a:b].mean(axis=0) for a, b in pairwise(bounds)])
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(rows(mean), expected, rtol=1e-5)
    assert list(mean.tokens) == [sum(chunked.tokens[a:b]) for a, b in pairwise(bounds)]

    plain = results["plain"]
    assert isinstance(plain, EmbedResult)
    assert (plain.chunks, plain.spans) == (None, None)
    h.check_vectors(plain)

    poisoned = results["poisoned"]
    assert isinstance(poisoned, ErrorResult)
    assert (poisoned.error.code, poisoned.error.index) == (ErrorCode.INTERNAL, 1)

    for name, code, words in (
        ("too-long", ErrorCode.INVALID_REQUEST, "exceeds the model's max_seq_length 32"),
        ("too-many", ErrorCode.TOO_MANY_INPUTS, "more than 40 chunks"),
    ):
        error = results[name]
        assert isinstance(error, ErrorResult)
        assert error.error.code == code
        assert words in error.error.message
    overlap = results["overlap"]
    assert isinstance(overlap, EmbedResult)  # no special tokens here: window 8, overlap 4
    assert overlap.chunks == (1,)
    costly = results["costly"]
    assert isinstance(costly, ErrorResult)
    assert costly.error.code == ErrorCode.INVALID_REQUEST
    assert costly.error.index == 1
    assert "max_chunk_tokens_factor" in costly.error.message


async def test_chunks_share_batches_and_count_as_inputs() -> None:
    """Chunk texts are batched with other work (one encoder call here) and counted as
    inputs in the metrics, with a request's other fields copied as for any request."""
    rng = random.Random(5)
    encoder = FakeEncoder(lambda prepared, rows: None)
    request = EmbedRequest(
        id="c",
        inputs=(text(rng, 30),),
        chunking=Chunking(10, 0),
        meta={"docs": [{"title": "x"}]},
        reply_to=REPLIES,
        dimensions=2,
    )
    async with Harness(encoder, max_batch_size=256, max_batch_tokens=8192) as h:
        h.send([(request, (TOPIC, 0)), (EmbedRequest(id="p", inputs=("w1",)), (TOPIC, 1))])
        results = await h.answers()
    result = results["c"]
    assert isinstance(result, EmbedResult)
    assert result.chunks == (3,)
    assert result.meta == {"docs": [{"title": "x"}]}
    assert result.dim == 2
    assert len(encoder.calls) == 1
    assert len(encoder.calls[0][0]) == 4
    assert h.sample("kembed_inputs_total", model="fake", outcome="ok") == 4


async def test_long_texts_are_cut_on_the_tokenizer_thread() -> None:
    """Texts over the inline limit are cut on the tokenizer thread, with the same result:
    a 1,500-word text in windows of 32 with 4 of overlap."""
    rng = random.Random(9)
    long = text(rng, 1500)
    assert len(long) > 4096
    request = EmbedRequest(id="long", inputs=(long,), chunking=Chunking(32, 4))
    async with Harness(FakeEncoder(lambda prepared, rows: None)) as h:
        h.send([(request, (TOPIC, 0))])
        results = await h.answers()
    result = results["long"]
    assert isinstance(result, EmbedResult)
    assert result.chunks == (54,)  # 1 + ceil((1500 - 32) / 28)
    assert result.spans is not None
    pieces = [long[s:e] for s, e in result.spans]
    np.testing.assert_allclose(rows(result), chunk_vectors(pieces), rtol=1e-6)
    assert result.spans[-1][1] == len(long)
