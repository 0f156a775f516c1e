"""The gateway's rerank endpoints against the fake SDK client of test_gateway: ``POST
/v1/rerank`` (Cohere/Jina shape, OpenAI-shaped errors) and TEI's ``POST /rerank``: every
shape, the model choice, the kind check, every error status and body, limits, API keys
and metrics. Against a real broker and worker: tests/integration/test_rerank_clients.py."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import httpx
import numpy as np
import pytest
import structlog

from producer_sdk.catalog import CatalogModel
from producer_sdk.errors import (
    CatalogUnavailableError,
    EmbedError,
    EmbedTimeoutError,
    RequestTooLargeError,
)
from tests.support.sdk import MODEL, RERANKER, FakeClient, catalog_entry, score_of, tokens_of
from tests.unit.gateway.test_gateway import (
    DOCS,
    KEY,
    WIRE_ERRORS,
    bearer,
    metric_value,
    openai_error,
    served,
    tei_error,
)
from tests.unit.gateway.test_gateway import _no_gateway_env as _no_gateway_env

QUERY = "What is Kafka?"
DOCUMENTS = ["Kafka is a distributed log.", "Paris is in France.", "A broker stores records."]


def reranker_entry(name: str = RERANKER, aliases: tuple[str, ...] = ("ms-marco",)) -> CatalogModel:
    return replace(catalog_entry(name, aliases=aliases), kind="rerank")


@asynccontextmanager
async def with_reranker(
    catalog: list[CatalogModel] | None = None, **settings: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, FakeClient]]:
    """The app over the fake client, whose catalog holds an embedding model and a reranker
    (or ``catalog``)."""
    async with served(**settings) as (http, fake):
        fake.catalog = [catalog_entry(), reranker_entry()] if catalog is None else catalog
        yield http, fake


def ranked(query: str, documents: list[str]) -> list[int]:
    """The documents' indices by the fake's score, highest first."""
    scores = [np.float32(score_of(query, d)) for d in documents]
    return sorted(range(len(documents)), key=lambda i: (-scores[i], i))


# ---------------------------------------------------------------------- POST /v1/rerank


async def test_v1_rerank_answers_cohere_and_jinas_shape_highest_score_first() -> None:
    documents = [f"document number {i}" for i in range(20)]
    async with with_reranker() as (http, fake):
        answer = await http.post(
            "/v1/rerank", json={"model": "ms-marco", "query": QUERY, "documents": documents}
        )
        again = await http.post(
            "/v1/rerank", json={"model": "ms-marco", "query": QUERY, "documents": documents}
        )
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert set(body) == {"id", "model", "results", "usage"}
    assert re.fullmatch(r"rerank-[0-9a-f]{32}", body["id"])
    assert body["id"] != again.json()["id"]
    assert body["model"] == RERANKER
    assert [r["index"] for r in body["results"]] == ranked(QUERY, documents)
    for result in body["results"]:
        assert set(result) == {"index", "relevance_score"}
        expected = float(np.float32(score_of(QUERY, documents[result["index"]])))
        assert result["relevance_score"] == expected
    tokens = sum(tokens_of(QUERY) + tokens_of(d) for d in documents)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    ((sent, options), _) = fake.calls
    assert sent == [QUERY, *documents]
    assert options["model"] == "ms-marco"
    assert options["top_n"] is None
    assert options["truncate"] is True  # pairs are cut, as Cohere and Jina do
    assert options["timeout"] == pytest.approx(30.0, abs=1.0)


async def test_top_n_and_return_documents_with_cohere_document_objects() -> None:
    documents: list[Any] = [DOCUMENTS[0], {"text": DOCUMENTS[1], "id": "x"}, {"text": DOCUMENTS[2]}]
    async with with_reranker() as (http, fake):
        answer = await http.post(
            "/v1/rerank",
            json={
                "model": RERANKER,
                "query": QUERY,
                "documents": documents,
                "top_n": 2,
                "return_documents": True,
                "max_tokens_per_doc": 512,  # Cohere's: ignored
            },
        )
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    best = ranked(QUERY, DOCUMENTS)[:2]
    assert [r["index"] for r in results] == best
    assert [r["document"] for r in results] == [{"text": DOCUMENTS[i]} for i in best]
    assert fake.calls[0][0] == [QUERY, *DOCUMENTS]
    assert fake.calls[0][1]["top_n"] == 2


async def test_without_a_model_the_one_reranker_or_the_setting_is_asked() -> None:
    async with with_reranker() as (http, fake):
        only = await http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
    assert only.status_code == 200, only.text
    assert fake.calls[0][1]["model"] == RERANKER
    two = [catalog_entry(), reranker_entry(), reranker_entry("bge-reranker", aliases=())]
    async with with_reranker(two, rerank_model="bge-reranker") as (http, fake):
        configured = await http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
        tei = await http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS})
    assert (configured.status_code, tei.status_code) == (200, 200)
    assert [options["model"] for _, options in fake.calls] == ["bge-reranker"] * 2


async def test_with_no_reranker_or_several_and_no_setting_the_model_must_be_named() -> None:
    body = {"query": QUERY, "documents": DOCUMENTS}
    async with with_reranker([catalog_entry()]) as (http, fake):
        none = await http.post("/v1/rerank", json=body)
        tei_none = await http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS})
    error = openai_error(none, 404, "model_not_found", "invalid_request_error", param="model")
    assert "no live worker serves a reranker" in error["message"]
    assert (tei_none.status_code, tei_error(tei_none)["error_type"]) == (503, "Unhealthy")
    two = [reranker_entry(), reranker_entry("bge-reranker", aliases=())]
    async with with_reranker(two) as (http, fake):
        several = await http.post("/v1/rerank", json=body)
        tei_several = await http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS})
    error = openai_error(several, 400, "invalid_request", "invalid_request_error", param="model")
    assert "KEMBED_GATEWAY_RERANK_MODEL" in error["message"]
    assert RERANKER in error["message"]
    assert (tei_several.status_code, tei_error(tei_several)["error_type"]) == (422, "Validation")
    assert fake.calls == []


async def test_an_unreadable_catalog_is_503_when_the_default_reranker_is_looked_up() -> None:
    async with with_reranker() as (http, fake):
        fake.catalog_error = CatalogUnavailableError("no broker answered")
        answer = await http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
        tei = await http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS})
    openai_error(answer, 503, "kafka_unavailable", "server_error")
    assert (tei.status_code, tei_error(tei)["error_type"]) == (503, "Unhealthy")
    assert fake.calls == []


async def test_a_model_of_the_other_kind_is_400_before_anything_is_sent() -> None:
    async with with_reranker() as (http, fake):
        rerank_embedder = await http.post(
            "/v1/rerank", json={"model": "minilm", "query": QUERY, "documents": DOCUMENTS}
        )
        embed_reranker = await http.post("/v1/embeddings", json={"model": "ms-marco", "input": "x"})
    error = openai_error(
        rerank_embedder, 400, "invalid_request", "invalid_request_error", param="model"
    )
    assert error["message"].startswith(f"the model {MODEL!r} is an embedding model (kind embed)")
    error = openai_error(
        embed_reranker, 400, "invalid_request", "invalid_request_error", param="model"
    )
    assert error["message"].startswith(f"the model {RERANKER!r} is a reranker")
    assert "POST /v1/rerank" in error["message"]
    async with with_reranker(rerank_model=MODEL, model=RERANKER) as (http, fake):
        tei_rerank = await http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS})
        tei_embed = await http.post("/embed", json={"inputs": "x"})
        scrape = await http.get("/metrics")
    for tei in (tei_rerank, tei_embed):
        assert (tei.status_code, tei_error(tei)["error_type"]) == (422, "Validation")
    assert "kind" in tei_error(tei_rerank)["error"]
    assert fake.calls == []
    count = "kembed_gateway_requests_total"
    assert metric_value(scrape, count, endpoint="/rerank", model=MODEL, status="422") == 1


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"query": QUERY, "documents": []}, "empty_input", "documents"),
        ({"query": "", "documents": ["d"]}, "invalid_request", "query"),
        ({"query": QUERY, "documents": ["d", ""]}, "invalid_request", "documents"),
        ({"query": QUERY, "documents": ["d", {"txt": "d"}]}, "invalid_request", "documents"),
        ({"query": QUERY, "documents": [1, 2]}, "invalid_request", "documents"),
        ({"query": QUERY, "documents": "one string"}, "invalid_request", "documents"),
        ({"documents": ["d"]}, "invalid_request", "query"),
        ({"query": QUERY, "documents": ["d"], "top_n": 0}, "invalid_request", "top_n"),
        ({"query": QUERY, "documents": ["d"], "return_documents": "SECRET"}, "invalid_request",
         "return_documents"),
    ],
)  # fmt: skip
async def test_invalid_v1_rerank_requests_are_400_naming_the_field(
    body: dict[str, Any], code: str, param: str
) -> None:
    async with with_reranker() as (http, fake):
        answer = await http.post("/v1/rerank", json={"model": RERANKER, **body})
    openai_error(answer, 400, code, "invalid_request_error", param=param)
    assert "SECRET" not in answer.text
    assert fake.calls == []


async def test_a_lone_surrogate_in_the_query_is_400_and_not_repeated() -> None:
    body = b'{"query": "\\udc80 private words", "documents": ["d"]}'
    async with with_reranker() as (http, fake):
        answer = await http.post(
            "/v1/rerank", content=body, headers={"content-type": "application/json"}
        )
    error = openai_error(answer, 400, "invalid_request", "invalid_request_error", param="query")
    assert "surrogate" in error["message"]
    assert "private" not in answer.text
    assert fake.calls == []


# ---------------------------------------------------------------------- POST /rerank (TEI)


async def test_tei_rerank_answers_a_list_of_ranks_highest_score_first() -> None:
    async with with_reranker() as (http, fake):
        answer = await http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS})
        with_text = await http.post(
            "/rerank",
            json={
                "query": QUERY,
                "texts": DOCUMENTS,
                "return_text": True,
                "raw_scores": True,
                "truncate": True,
                "truncation_direction": "Left",
            },
        )
    assert answer.status_code == 200, answer.text
    order = ranked(QUERY, DOCUMENTS)
    assert answer.json() == [
        {"index": i, "score": float(np.float32(score_of(QUERY, DOCUMENTS[i])))} for i in order
    ]
    assert [rank["text"] for rank in with_text.json()] == [DOCUMENTS[i] for i in order]
    defaults, options = fake.calls[0][1], fake.calls[1][1]
    assert defaults["model"] == RERANKER  # the one reranker of the catalog
    assert (defaults["raw_scores"], defaults["truncate"]) == (False, False)  # TEI's defaults
    assert defaults["truncation_direction"] == "right"
    assert defaults.get("top_n") is None  # every text is ranked
    assert (options["raw_scores"], options["truncate"]) == (True, True)
    assert options["truncation_direction"] == "left"


@pytest.mark.parametrize(
    ("body", "status", "kind"),
    [
        ({"query": QUERY, "texts": []}, 400, "Empty"),
        ({"query": QUERY, "texts": ["ok", ""]}, 422, "Validation"),
        ({"query": "", "texts": ["ok"]}, 422, "Validation"),
        ({"texts": ["ok"]}, 422, "Validation"),
        ({"query": QUERY, "texts": "ok"}, 422, "Validation"),
        ({"query": QUERY, "texts": ["ok"], "truncation_direction": "Middle"}, 422, "Validation"),
    ],
)
async def test_invalid_tei_rerank_requests_are_teis_statuses(
    body: dict[str, Any], status: int, kind: str
) -> None:
    async with with_reranker() as (http, fake):
        answer = await http.post("/rerank", json=body)
    assert (answer.status_code, tei_error(answer)["error_type"]) == (status, kind)
    assert fake.calls == []


# ---------------------------------------------------------------------- errors of the SDK


@pytest.mark.parametrize(("wire", "status", "code", "kind", "tei_status", "tei_kind"), WIRE_ERRORS)
async def test_a_workers_error_result_is_the_documented_status_for_both_endpoints(
    wire: str, status: int, code: str, kind: str, tei_status: int, tei_kind: str
) -> None:
    async with with_reranker() as (http, fake):
        fake.error = EmbedError(wire, "the worker's words", index=1)
        answer = await http.post(
            "/v1/rerank", json={"model": RERANKER, "query": QUERY, "documents": DOCUMENTS}
        )
        tei = await http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS})
    error = openai_error(answer, status, code, kind)
    assert (tei.status_code, tei_error(tei)["error_type"]) == (tei_status, tei_kind)
    if status < 500:
        assert error["message"] == "the worker's words (document 1)"
        assert error["param"] == "documents"
        assert tei_error(tei)["error"] == "the worker's words (text 1)"


async def test_timeouts_and_oversized_requests() -> None:
    async with with_reranker(timeout_s=2.5) as (http, fake):
        fake.error = EmbedTimeoutError("r1", 2.5)
        slow = await http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
        tei_slow = await http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS})
        fake.error = RequestTooLargeError(5_000_000, 4_194_304)
        large = await http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
    openai_error(slow, 504, "deadline_exceeded", "server_error")
    assert (tei_slow.status_code, tei_error(tei_slow)["error_type"]) == (504, "Unhealthy")
    openai_error(large, 413, "request_too_large", "invalid_request_error", param="documents")
    assert fake.calls[0][1]["timeout"] == pytest.approx(2.5, abs=0.5)


# ---------------------------------------------------------------------- limits, keys, metrics


async def test_limits_apply_to_documents_and_bodies() -> None:
    async with with_reranker(max_inputs=3, max_body_bytes=2_000) as (http, fake):
        many = await http.post("/v1/rerank", json={"query": QUERY, "documents": ["d"] * 4})
        tei_many = await http.post("/rerank", json={"query": QUERY, "texts": ["d"] * 4})
        big = await http.post("/v1/rerank", json={"query": QUERY, "documents": ["d" * 3_000]})
        tei_big = await http.post("/rerank", json={"query": QUERY, "texts": ["d" * 3_000]})
        three = await http.post("/v1/rerank", json={"query": QUERY, "documents": ["d"] * 3})
    error = openai_error(many, 400, "too_many_inputs", "invalid_request_error", param="documents")
    assert error["message"] == "4 documents, above this gateway's limit of 3"
    assert (tei_many.status_code, tei_error(tei_many)["error_type"]) == (413, "Validation")
    openai_error(big, 413, "request_too_large", "invalid_request_error")
    assert (tei_big.status_code, tei_error(tei_big)["error_type"]) == (413, "Validation")
    assert three.status_code == 200
    assert len(fake.calls) == 1


async def test_past_max_in_flight_a_rerank_is_429_with_retry_after() -> None:
    async with with_reranker(max_in_flight=1) as (http, fake):
        fake.gate = asyncio.Event()
        body = {"query": QUERY, "documents": DOCUMENTS}
        waiting = asyncio.create_task(http.post("/v1/rerank", json=body))
        await fake.arrivals.get()
        refused = await http.post("/v1/rerank", json=body)
        tei = await http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS})
        fake.gate.set()
        done = await waiting
    openai_error(refused, 429, "overloaded", "rate_limit_error")
    assert refused.headers["retry-after"] == "1"
    assert (tei.status_code, tei_error(tei)["error_type"]) == (429, "Overloaded")
    assert done.status_code == 200


async def test_rerank_needs_the_api_key_and_is_counted_in_the_metrics() -> None:
    v1 = {"query": QUERY, "documents": DOCUMENTS}
    tei = {"query": QUERY, "texts": DOCUMENTS}
    async with with_reranker(api_keys=KEY) as (http, fake):
        missing = await http.post("/v1/rerank", json=v1)
        tei_wrong = await http.post("/rerank", json=tei, headers=bearer("sk-wrong"))
        assert fake.calls == []
        for _ in range(2):
            ok = await http.post("/v1/rerank", json=v1, headers=bearer(KEY))
            assert ok.status_code == 200
        tei_ok = await http.post("/rerank", json=tei, headers=bearer(KEY))
        scrape = await http.get("/metrics")
    openai_error(missing, 401, "invalid_api_key", "invalid_request_error")
    assert (tei_wrong.status_code, tei_error(tei_wrong)["error_type"]) == (401, "Validation")
    assert tei_ok.status_code == 200
    count = "kembed_gateway_requests_total"
    assert metric_value(scrape, count, endpoint="/v1/rerank", model=RERANKER, status="200") == 2
    assert metric_value(scrape, count, endpoint="/v1/rerank", model="", status="401") == 1
    assert metric_value(scrape, count, endpoint="/rerank", model=RERANKER, status="200") == 1
    seconds = "kembed_gateway_request_seconds_count"
    assert metric_value(scrape, seconds, endpoint="/v1/rerank") == 3


async def test_logs_hold_neither_the_query_nor_the_documents() -> None:
    secret = "confidential patient note 4711"
    with structlog.testing.capture_logs() as logs:
        async with with_reranker() as (http, fake):
            await http.post("/v1/rerank", json={"query": secret, "documents": [secret]})
            fake.error = RuntimeError("boom")
            await http.post("/rerank", json={"query": secret, "texts": [secret]})
    events = [entry["event"] for entry in logs]
    assert "gateway.request" in events
    assert "gateway.embed_failed" in events
    assert "patient" not in repr(logs)


async def test_both_endpoints_are_in_the_openapi_document_and_the_docs() -> None:
    async with with_reranker() as (http, _):
        document = (await http.get("/openapi.json")).json()
    assert {"/v1/rerank", "/rerank"} <= set(document["paths"])
    for heading in ("### `POST /v1/rerank`", "### `POST /rerank`"):
        assert heading in DOCS


async def test_a_query_or_document_over_max_input_chars_is_input_too_long() -> None:
    """The query or a document over max_input_chars: 400 input_too_long naming it (OpenAI's
    shape), 422 Validation (TEI's); nothing is sent."""
    async with with_reranker(max_input_chars=30) as (http, fake):
        query = await http.post("/v1/rerank", json={"query": "q" * 31, "documents": DOCUMENTS})
        document = await http.post(
            "/v1/rerank", json={"query": QUERY, "documents": [*DOCUMENTS[:1], "x" * 31]}
        )
        tei = await http.post("/rerank", json={"query": QUERY, "texts": ["y" * 31]})
        assert fake.calls == []
    error = openai_error(query, 400, "input_too_long", "invalid_request_error", param="query")
    assert "query has 31 characters" in error["message"]
    error = openai_error(document, 400, "input_too_long", "invalid_request_error")
    assert "documents[1] has 31 characters" in error["message"]
    assert tei.status_code == 422
    assert "texts[0] has 31 characters" in tei_error(tei)["error"]
