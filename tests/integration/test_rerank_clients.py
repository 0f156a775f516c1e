"""Reranking from the clients' side, through the real broker and a real worker: the SDK's
``rerank`` (async and sync) and the gateway's ``POST /v1/rerank`` and TEI ``POST /rerank``
with raw HTTP.

The worker serves the bundled embedding model and a cross-encoder built in the test
(random weights, the bundled tokenizer; tests/cross_encoder.py) on its own topic,
announced on this module's catalog, so that clients route by the catalog's name and kind.
Scores are held to sentence-transformers' ``CrossEncoder.predict`` on the same directory
(abs difference < 1e-4 in fp32); orders may differ only by swaps of documents whose
reference scores are within 1e-4 of each other (random weights spread logits over ~+-1).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pytest

from loadtest.data import stsb_sentences
from producer_sdk import EmbedClient, EmbedError, Reranked, SyncEmbedClient
from scripts.kafka_local import CATALOG_TOPIC_CONFIG, LocalKafka, TopicSpec
from scripts.worker_process import WorkerProcess
from tests.cross_encoder import build_cross_encoder
from tests.integration.test_gateway import GatewayProcess

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:6]
RERANKER, RERANKER_ALIAS, EMBEDDER = "rc-ce", "rc-ce-alias", "rc-minilm"
MAX_LENGTH = 128
QUERY = "A man is playing a guitar on a stage."
TOLERANCE = 1e-4


def documents(count: int, seed: int = 7) -> list[str]:
    """``count`` distinct STS-B sentences."""
    return random.Random(seed).sample(stsb_sentences(), count)


LONG = "opening words " + " ".join(documents(60, 3)) + " closing words"
"""A document far over the cross-encoder's 128 tokens, whose two ends differ."""


@dataclass(frozen=True)
class Fleet:
    bootstrap_servers: str
    requests: str
    rerank_topic: str
    catalog: str
    results: str
    model_dir: Path


@pytest.fixture(scope="module")
def fleet(kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One fp32 worker: the embedding model on ``requests``, the cross-encoder (and an
    alias) on ``rerank_topic``, both announced on ``catalog``."""
    root = tmp_path_factory.mktemp("rerank-clients")
    model_dir = build_cross_encoder(root / "ce", max_length=MAX_LENGTH)
    names = ("requests", "rerank", "catalog", "results", "gateway")
    topics = {name: f"test.rc.{name}.{TAG}" for name in names}
    kafka.create_topics(
        [
            TopicSpec(topics["requests"], 1),
            TopicSpec(topics["rerank"], 2),
            TopicSpec(topics["catalog"], 1, CATALOG_TOPIC_CONFIG),
            TopicSpec(topics["results"], 2),
            TopicSpec(topics["gateway"], 2),
        ]
    )
    models = [
        {"model": "sentence-transformers/all-MiniLM-L6-v2", "name": EMBEDDER},
        {
            "model": str(model_dir),
            "name": RERANKER,
            "aliases": [RERANKER_ALIAS],
            "requests_topic": topics["rerank"],
            "bulk_topic": "",
        },
    ]
    worker = WorkerProcess(
        kafka.bootstrap_servers,
        root / "worker.log",
        models=json.dumps(models),
        dtype="float32",
        torch_compile="off",
        requests_topic=topics["requests"],
        bulk_topic="",
        catalog_topic=topics["catalog"],
        group_id=f"rc-{TAG}",
    )
    try:
        worker.wait_ready()
        yield Fleet(
            kafka.bootstrap_servers,
            topics["requests"],
            topics["rerank"],
            topics["catalog"],
            topics["results"],
            model_dir,
        )
    finally:
        assert worker.stop() == 0


@pytest.fixture(scope="module")
def gateway(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """No API keys; no rerank_model: the one reranker of the catalog is the default."""
    process = GatewayProcess.ready(
        fleet.bootstrap_servers,
        tmp_path_factory.mktemp("rc-gateway") / "gateway.log",
        requests_topic=fleet.requests,
        reply_topic=f"test.rc.gateway.{TAG}",
        catalog_topic=fleet.catalog,
        timeout_s=60,
    )
    yield process
    process.stop()


def client_options(fleet: Fleet, **options: Any) -> dict[str, Any]:
    return {
        "requests_topic": fleet.requests,
        "reply_topic": fleet.results,
        "catalog_topic": fleet.catalog,
        "timeout": 60,
        **options,
    }


def reference(
    fleet: Fleet, query: str, texts: Sequence[str], *, raw: bool = False, side: str = "right"
) -> npt.NDArray[np.float32]:
    """sentence-transformers' scores for the pairs, fp32 on the CPU."""
    import torch
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(fleet.model_dir), device="cpu")
    model.tokenizer.truncation_side = side
    options: dict[str, Any] = {"activation_fn": torch.nn.Identity()} if raw else {}
    pairs = [(query, text) for text in texts]
    return np.asarray(model.predict(pairs, batch_size=64, **options), dtype=np.float32)


def check_order(order: Sequence[int], expected: npt.NDArray[np.float32]) -> None:
    """``order`` sorts ``expected`` highest first, but for swaps of near-equal scores."""
    ranked = [float(expected[i]) for i in order]
    for earlier, later in itertools.pairwise(ranked):
        assert earlier >= later - TOLERANCE, (earlier, later)


def check_top(order: Sequence[int], n: int, expected: npt.NDArray[np.float32]) -> None:
    """``order`` is the best ``n`` by ``expected``, highest first (near-ties aside): each
    call batches its pairs its own way, so scores differ in the last float32 bits."""
    assert len(order) == n == len(set(order))
    check_order(order, expected)
    others = [float(expected[i]) for i in range(len(expected)) if i not in order]
    assert min(float(expected[i]) for i in order) >= max(others) - TOLERANCE


def rerank(fleet: Fleet, *calls: tuple[str, Sequence[str], dict[str, Any]]) -> list[Reranked]:
    async def run() -> list[Reranked]:
        async with EmbedClient(fleet.bootstrap_servers, **client_options(fleet)) as client:
            return list(
                await asyncio.gather(
                    *(client.rerank(query, texts, **options) for query, texts, options in calls)
                )
            )

    return asyncio.run(run())


# ---------------------------------------------------------------------- the SDK


def test_sdk_rerank_matches_crossencoder_predict_for_1_and_100_documents(fleet: Fleet) -> None:
    hundred = documents(100)
    one, many, top, raw = rerank(
        fleet,
        (QUERY, hundred[:1], {"model": RERANKER}),
        (QUERY, hundred, {"model": RERANKER_ALIAS}),
        (QUERY, hundred, {"model": RERANKER, "top_n": 5, "return_documents": True}),
        (QUERY, hundred, {"model": RERANKER, "raw_scores": True}),
    )
    expected = reference(fleet, QUERY, hundred)
    assert one.model == RERANKER
    assert one.scores.shape == (1,)
    assert abs(float(one.scores[0]) - float(expected[0])) < TOLERANCE
    assert many.scores.dtype == np.float32
    assert np.max(np.abs(many.scores - expected)) < TOLERANCE
    assert sorted(many.order) == list(range(100))
    check_order(many.order, expected)
    assert len(many.tokens) == 100
    assert all(3 <= tokens <= MAX_LENGTH for tokens in many.tokens)
    check_top(top.order, 5, expected)
    assert [(r.index, r.document) for r in top.results] == [
        (index, hundred[index]) for index in top.order
    ]
    assert np.max(np.abs(top.scores - expected)) < TOLERANCE  # every document scored
    logits = reference(fleet, QUERY, hundred, raw=True)
    assert np.max(np.abs(raw.scores - logits)) < TOLERANCE
    np.testing.assert_allclose(1 / (1 + np.exp(-raw.scores)), many.scores, atol=1e-6)


def test_sdk_truncation_both_sides_and_the_too_long_error(fleet: Fleet) -> None:
    texts = [LONG, "a short document about partitions"]
    right, left = rerank(
        fleet,
        (QUERY, texts, {"model": RERANKER}),
        (QUERY, texts, {"model": RERANKER, "truncation_direction": "left"}),
    )
    expected_right = reference(fleet, QUERY, texts)
    expected_left = reference(fleet, QUERY, texts, side="left")
    assert abs(float(expected_right[0]) - float(expected_left[0])) > TOLERANCE  # sides differ
    assert np.max(np.abs(right.scores - expected_right)) < TOLERANCE
    assert np.max(np.abs(left.scores - expected_left)) < TOLERANCE
    assert right.tokens[0] == MAX_LENGTH
    with pytest.raises(EmbedError) as caught:
        rerank(fleet, (QUERY, texts, {"model": RERANKER, "truncate": False}))
    assert (caught.value.code, caught.value.index) == ("input_too_long", 0)


def test_models_show_the_kind_and_the_wrong_kind_fails_before_or_at_the_worker(
    fleet: Fleet,
) -> None:
    async def run() -> tuple[dict[str, str], list[EmbedError]]:
        errors: list[EmbedError] = []
        async with EmbedClient(fleet.bootstrap_servers, **client_options(fleet)) as client:
            kinds = {model.name: model.kind for model in await client.models()}
            for call in (
                client.rerank(QUERY, ["d"], model=EMBEDDER),
                client.embed(["text"], model=RERANKER_ALIAS),
            ):
                with pytest.raises(EmbedError) as caught:
                    await call
                errors.append(caught.value)
        # Without a catalog the SDK cannot tell: the worker answers invalid_request.
        blind = client_options(fleet, catalog_topic=None, requests_topic=fleet.rerank_topic)
        async with EmbedClient(fleet.bootstrap_servers, **blind) as client:
            with pytest.raises(EmbedError) as caught:
                await client.embed(["text"], model=RERANKER)
            errors.append(caught.value)
        return kinds, errors

    kinds, (rerank_embedder, embed_reranker, at_worker) = asyncio.run(run())
    assert kinds == {EMBEDDER: "embed", RERANKER: "rerank"}
    assert rerank_embedder.code == embed_reranker.code == at_worker.code == "invalid_request"
    assert "embedding model" in rerank_embedder.message
    assert "reranker" in embed_reranker.message
    assert "rerank" in at_worker.message  # the worker's message names the model's kind


def test_the_sync_client_reranks_as_the_async_one(fleet: Fleet) -> None:
    texts = documents(20, seed=11)
    (expected,) = rerank(fleet, (QUERY, texts, {"model": RERANKER, "top_n": 3}))
    with SyncEmbedClient(fleet.bootstrap_servers, **client_options(fleet)) as client:
        got = client.rerank(QUERY, texts, model=RERANKER, top_n=3)
        with pytest.raises(EmbedError, match="embedding model"):
            client.rerank(QUERY, texts, model=EMBEDDER)
    assert np.max(np.abs(got.scores - expected.scores)) < TOLERANCE
    check_top(got.order, 3, reference(fleet, QUERY, texts))


# ---------------------------------------------------------------------- the gateway


def test_gateway_v1_rerank_in_cohere_and_jinas_shape(fleet: Fleet, gateway: GatewayProcess) -> None:
    texts = documents(40, seed=5)
    expected = reference(fleet, QUERY, texts)
    with httpx.Client(base_url=gateway.url, timeout=90) as http:
        named = http.post(
            "/v1/rerank", json={"model": RERANKER_ALIAS, "query": QUERY, "documents": texts}
        )
        default = http.post(
            "/v1/rerank",
            json={
                "query": QUERY,
                "documents": [{"text": text} for text in texts],
                "top_n": 3,
                "return_documents": True,
            },
        )
        wrong_kind = http.post(
            "/v1/rerank", json={"model": EMBEDDER, "query": QUERY, "documents": texts}
        )
        embed_reranker = http.post("/v1/embeddings", json={"model": RERANKER, "input": "x"})
    assert named.status_code == 200, named.text
    body = named.json()
    assert set(body) == {"id", "model", "results", "usage"}
    assert body["model"] == RERANKER
    results = body["results"]
    assert sorted(r["index"] for r in results) == list(range(40))
    for result in results:
        assert set(result) == {"index", "relevance_score"}
        assert abs(result["relevance_score"] - float(expected[result["index"]])) < TOLERANCE
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    check_order([r["index"] for r in results], expected)
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] > 40 * 3
    assert default.status_code == 200, default.text
    top = default.json()["results"]
    check_top([r["index"] for r in top], 3, expected)
    assert [r["document"] for r in top] == [{"text": texts[r["index"]]} for r in top]
    assert wrong_kind.status_code == 400
    assert wrong_kind.json()["error"]["code"] == "invalid_request"
    assert "embedding model" in wrong_kind.json()["error"]["message"]
    assert embed_reranker.status_code == 400
    assert "reranker" in embed_reranker.json()["error"]["message"]


def test_gateway_tei_rerank(fleet: Fleet, gateway: GatewayProcess) -> None:
    texts = [*documents(10, seed=9), LONG]
    with httpx.Client(base_url=gateway.url, timeout=90) as http:
        ranks = http.post("/rerank", json={"query": QUERY, "texts": texts[:10]})
        raw = http.post(
            "/rerank",
            json={
                "query": QUERY,
                "texts": texts,
                "raw_scores": True,
                "return_text": True,
                "truncate": True,
                "truncation_direction": "Left",
            },
        )
        too_long = http.post("/rerank", json={"query": QUERY, "texts": texts})
        empty = http.post("/rerank", json={"query": QUERY, "texts": []})
    assert ranks.status_code == 200, ranks.text
    expected = reference(fleet, QUERY, texts[:10])
    answer = ranks.json()
    assert [set(rank) for rank in answer] == [{"index", "score"}] * 10
    for rank in answer:
        assert abs(rank["score"] - float(expected[rank["index"]])) < TOLERANCE
    check_order([rank["index"] for rank in answer], expected)
    assert raw.status_code == 200, raw.text
    logits = reference(fleet, QUERY, texts, raw=True, side="left")
    for rank in raw.json():
        assert abs(rank["score"] - float(logits[rank["index"]])) < TOLERANCE
        assert rank["text"] == texts[rank["index"]]
    assert too_long.status_code == 422  # TEI's truncate defaults to false
    assert too_long.json()["error_type"] == "Validation"
    assert (empty.status_code, empty.json()["error_type"]) == (400, "Empty")
