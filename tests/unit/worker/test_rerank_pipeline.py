"""Rerank requests through the pipeline (its loops, batcher, delivery) over the fakes of
test_batch_failures: a reranker whose fake cross-encoder scores a pair from its token ids
and token types, next to an embedding model, so that scores, order, token types, errors
(index = document) and metrics can be checked exactly."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kembed_shared.ports import Record
from schemas import (
    Chunking,
    EmbedRequest,
    EmbedResult,
    ErrorCode,
    ErrorResult,
    Kind,
    Request,
    RerankRequest,
    RerankResult,
    decode_result,
    encode_request,
)
from tests.support.kafka import FakePublisher, FakeSource
from tests.unit.worker.test_batch_failures import (
    MAX_SEQ,
    POISON,
    TOPIC,
    FakeEncoder,
    fails_on_poison,
    word_tokenizer,
)
from worker.encoder import ModelInfo, Prepared
from worker.metrics import Metrics
from worker.pipeline import Pipeline, ServedModel
from worker.settings import WorkerSettings

REPLIES = "test.replies"


def expected_logit(ids: Sequence[int], types: Sequence[int]) -> float:
    """The fake cross-encoder's logit: depends on every id and on the token types."""
    return float(sum(ids) % 97) / 10 + 0.5 * sum(types) - 0.01 * len(ids)


class FakeCrossEncoder:
    """One logit per pair (:func:`expected_logit`); raises on a batch holding ``poison``."""

    def __init__(self) -> None:
        self.info = ModelInfo("ce", Path("ce"), 1, MAX_SEQ, "none", "float32", "cpu")
        self.segments_seen: list[int] = []

    def prepare(
        self,
        batch: Sequence[Sequence[int]],
        segments: Sequence[int] | None = None,
        pooled_from: Sequence[int] | None = None,
    ) -> Prepared:
        assert segments is not None, "a reranker's batch must carry its token types"
        return Prepared.pad(batch, 0, segments)

    def run(self, prepared: Prepared) -> npt.NDArray[np.float32]:
        assert prepared.types is not None
        rows = []
        for ids, mask, types in zip(prepared.ids, prepared.mask, prepared.types, strict=True):
            real = mask == 1
            if POISON in ids[real]:
                raise RuntimeError("device-side assert triggered")
            rows.append([expected_logit(ids[real].tolist(), types[real].tolist())])
        return np.array(rows, dtype=np.float32)

    def encode(self, batch: Sequence[Sequence[int]]) -> npt.NDArray[np.float32]:
        return self.run(self.prepare(batch, [len(ids) for ids in batch]))


def _sigmoid(x: float) -> np.float32:
    return np.float32(1 / (1 + np.exp(-np.float64(np.float32(x)))))


async def _run(
    requests: list[Request], max_client_batch_size: int, **more: Any
) -> dict[str, object]:
    source = FakeSource({(TOPIC, 0)})
    publisher = FakePublisher()
    tokenizer = word_tokenizer()
    models = [
        ServedModel("ce", FakeCrossEncoder(), tokenizer, requests_topic=TOPIC, kind=Kind.RERANK),
        ServedModel("fake", FakeEncoder(fails_on_poison), tokenizer, requests_topic=TOPIC),
    ]
    metrics = Metrics()
    settings: dict[str, Any] = {
        "requests_topic": TOPIC,
        "bulk_topic": "",
        "commit_interval_ms": 10,
        "max_client_batch_size": max_client_batch_size,
        **more,
    }
    pipeline = Pipeline(
        source=source,
        publisher=publisher,
        models=models,
        settings=WorkerSettings(**settings),
        metrics=metrics,
    )
    task = asyncio.create_task(pipeline.run())
    wave = [
        Record(TOPIC, 0, offset, encode_request(request), timestamp_ms=5)
        for offset, request in enumerate(requests)
    ]
    source.waves.put_nowait(wave)
    async with asyncio.timeout(20):
        while len(publisher.sent) < len(requests):
            publisher.more.clear()
            await publisher.more.wait()
    await asyncio.sleep(0.05)
    pipeline.stop()
    await asyncio.wait_for(task, 30)
    results = [decode_result(value) for _, value, _ in publisher.sent]
    assert len(results) == len({r.id for r in results}) == len(requests)
    out: dict[str, object] = {r.id: r for r in results}
    out["_metrics"] = metrics
    return out


def _rerank(request_id: str, documents: Sequence[str], **fields: Any) -> RerankRequest:
    return RerankRequest(
        id=request_id,
        query="w1 w2 w3",
        documents=tuple(documents),
        reply_to=REPLIES,
        **fields,
    )


async def test_scores_order_and_errors_through_the_pipeline() -> None:
    tokenizer = word_tokenizer()
    documents = ["w5 w6", "w7", "w8 w9 w10 w11", "w5 w6", "w12 w13 w14"]
    long_document = " ".join(f"w{i}" for i in range(40))
    requests: list[Request] = [
        _rerank("ok", documents, top_n=3, return_documents=True),
        _rerank("raw", documents[:3], raw_scores=True),
        _rerank("poisoned", ["w5", "w6", "w7 poison", "w8"]),
        _rerank("too-long", ["w5", long_document], truncate=False),
        _rerank("truncated", ["w5", long_document]),
        _rerank("too-many", ["w1"] * 9),
        _rerank("late", ["w1"], deadline_ms=1),
        EmbedRequest(id="embed", inputs=("w1 w2", "w3"), model="fake", reply_to=REPLIES),
        EmbedRequest(id="embed-default", inputs=("w1",), reply_to=REPLIES),
        EmbedRequest(id="embed-to-ce", inputs=("w1",), model="ce", reply_to=REPLIES),
        _rerank("rerank-to-fake", ["w1"], model="fake"),
    ]
    results = await _run(requests, max_client_batch_size=8)
    metrics = results.pop("_metrics")
    assert isinstance(metrics, Metrics)

    def expected(query: str, docs: Sequence[str]) -> list[float]:
        pieces = tokenizer.encode_pairs([(query, d) for d in docs])
        logits = []
        for piece in pieces:
            assert piece.segment is not None
            types = [0] * piece.segment + [1] * (len(piece.ids) - piece.segment)
            logits.append(expected_logit(piece.ids, types))
        return logits

    ok = results["ok"]
    assert isinstance(ok, RerankResult), ok
    scores = ok.score_values()
    assert list(scores) == [_sigmoid(x) for x in expected("w1 w2 w3", documents)]
    ranked = sorted(range(5), key=lambda i: (-scores[i], i))
    assert list(ok.order) == ranked[:3]
    assert ok.documents == tuple(documents[i] for i in ok.order)
    assert scores[0] == scores[3]  # equal pairs: equal scores, the lower index first
    assert ok.tokens == tuple(
        len(p.ids) for p in tokenizer.encode_pairs([("w1 w2 w3", d) for d in documents])
    )
    assert ok.requested_ms == 5

    raw = results["raw"]
    assert isinstance(raw, RerankResult)
    assert list(raw.score_values()) == [np.float32(x) for x in expected("w1 w2 w3", documents[:3])]

    truncated = results["truncated"]
    assert isinstance(truncated, RerankResult)
    assert truncated.tokens[1] == MAX_SEQ

    for request_id, code, index in [
        ("poisoned", ErrorCode.INTERNAL, 2),
        ("too-long", ErrorCode.INPUT_TOO_LONG, 1),
        ("too-many", ErrorCode.TOO_MANY_INPUTS, None),
        ("late", ErrorCode.DEADLINE_EXCEEDED, None),
        ("embed-to-ce", ErrorCode.INVALID_REQUEST, None),
        ("embed-default", ErrorCode.INVALID_REQUEST, None),  # the topic's first model: ce
        ("rerank-to-fake", ErrorCode.INVALID_REQUEST, None),
    ]:
        error = results[request_id]
        assert isinstance(error, ErrorResult), (request_id, error)
        assert (error.error.code, error.error.index) == (code, index), request_id
    embed_to_ce = results["embed-to-ce"]
    assert isinstance(embed_to_ce, ErrorResult)
    assert "kind rerank" in embed_to_ce.error.message
    assert isinstance(results["embed"], EmbedResult)

    def sample(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, labels) or 0.0

    # Inputs of a rerank request are its documents (pairs).
    assert sample("kembed_inputs_total", model="ce", outcome="ok") == 5 + 3 + 2
    assert sample("kembed_requests_total", model="ce", outcome="ok") == 3
    assert sample("kembed_requests_total", model="ce", outcome="internal") == 1


async def test_texts_over_max_input_chars_are_input_too_long() -> None:
    """With max_input_chars 50: a longer query is input_too_long without an index, a longer
    document or (unchunked) input names itself, a text of exactly 50 is scored, and a
    chunked input may be longer (its chunks use all of it)."""
    long_text = " ".join(["w1"] * 17)  # 50 characters
    longer = long_text + " w2"
    requests: list[Request] = [
        RerankRequest(id="query", query=longer, documents=("w5",), reply_to=REPLIES),
        _rerank("document", ["w5", "w6", longer]),
        _rerank("fits", [long_text]),
        EmbedRequest(id="input", inputs=("w1", longer), model="fake", reply_to=REPLIES),
        EmbedRequest(
            id="chunked", inputs=(longer,), model="fake", reply_to=REPLIES, chunking=Chunking(8)
        ),
    ]
    results = await _run(requests, max_client_batch_size=8, max_input_chars=50)
    for request_id, index, what in [("query", None, "query"), ("document", 2, "document")]:
        error = results[request_id]
        assert isinstance(error, ErrorResult), (request_id, error)
        assert (error.error.code, error.error.index) == (ErrorCode.INPUT_TOO_LONG, index)
        assert f"the {what} has 53 characters, above the worker's max_input_chars 50" in (
            error.error.message
        )
    error = results["input"]
    assert isinstance(error, ErrorResult)
    assert (error.error.code, error.error.index) == (ErrorCode.INPUT_TOO_LONG, 1)
    assert isinstance(results["fits"], RerankResult)
    chunked = results["chunked"]
    assert isinstance(chunked, EmbedResult)
    assert chunked.chunks is not None
