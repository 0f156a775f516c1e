"""``EmbedClient.rerank`` offline: the wire request it sends, the ``Reranked`` it returns,
the errors it raises (error results, results of the other kind, the catalog's ``kind``
checked before sending, invalid arguments). Kafka is replaced by the in-memory transport
of ``producer_sdk.testing``, which answers each request with a scripted result through the
client's own reply path (the real codec, the real pending-call table). Through a broker
and a worker: tests/integration/test_rerank_clients.py."""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from producer_sdk import (
    EmbedClient,
    EmbedError,
    KembedError,
    RankedDocument,
    Reranked,
    UnexpectedResultError,
)
from producer_sdk.catalog import CatalogModel
from producer_sdk.testing import InMemoryTransport, answer_scores
from schemas import (
    EmbedRequest,
    EmbedResult,
    ErrorInfo,
    ErrorResult,
    RerankRequest,
    RerankResult,
    Result,
)
from schemas.v1 import pack_float32
from tests.support import sdk
from tests.support.sdk import catalog_entry

Answer = Callable[[Any], Result | None]


def scores_of(request: RerankRequest) -> list[float]:
    """A distinct, float32-exact score per document, from its text (so that order and
    values can be checked): longer documents score higher."""
    return [len(document) / 4 - 0.5 for document in request.documents]


def rerank_result(request: RerankRequest) -> RerankResult:
    """The result a worker would give, computed plainly: scores in the documents' order,
    ``order`` by score (ties: lower index first), cut to ``top_n``."""
    return answer_scores(request, scores_of(request), model="cross-encoder")


def vectors_result(request: Any) -> EmbedResult:
    count = len(request.inputs) if isinstance(request, EmbedRequest) else 1
    return EmbedResult(
        id=request.id,
        model="minilm",
        dim=2,
        dtype="float32",
        vectors=pack_float32(array("f", [0.5] * (2 * count))),
        tokens=(3,) * count,
    )


def offline(
    answer: Answer = rerank_result,
    catalog: list[CatalogModel] | None = None,
    **options: Any,
) -> tuple[EmbedClient, InMemoryTransport]:
    return sdk.offline(answer, catalog, **options)


def reranker(name: str = "ms-marco", topic: str = "rerank.requests") -> CatalogModel:
    entry = catalog_entry(name, aliases=("ce",))
    return replace(entry, kind="rerank", requests_topic=topic, topics=(topic,))


DOCUMENTS = ["a cat", "a much longer document", "dog", "medium text"]


# ---------------------------------------------------------------------- the call


async def test_rerank_sends_a_rerank_request_and_returns_scores_in_document_order() -> None:
    client, transport = offline(model="ms-marco")
    reranked = await client.rerank("what animal?", DOCUMENTS, timeout=7)
    (sent,) = transport.sent
    request, topic, headers = sent.request, sent.topic, sent.headers
    assert isinstance(request, RerankRequest)
    assert (request.query, request.documents) == ("what animal?", tuple(DOCUMENTS))
    assert request.model == "ms-marco"  # the client's model option
    assert (request.top_n, request.return_documents, request.raw_scores) == (None, False, False)
    assert (request.truncate, request.truncation_direction) == (True, None)
    assert request.reply_to == "embed.results"
    assert request.reply_partition == 5
    assert request.deadline_ms is not None
    assert topic == "embed.requests"
    assert headers["kafka_correlationId"] == request.id.encode()
    expected = np.array(scores_of(request), dtype=np.float32)
    assert reranked.scores.dtype == np.float32
    np.testing.assert_array_equal(reranked.scores, expected)
    assert reranked.order == (1, 3, 0, 2)
    assert reranked.results == [
        RankedDocument(1, float(expected[1]), None),
        RankedDocument(3, float(expected[3]), None),
        RankedDocument(0, float(expected[0]), None),
        RankedDocument(2, float(expected[2]), None),
    ]
    index, score, document = reranked.results[0]  # unpacks as a tuple
    assert (index, score, document) == (1, 5.0, None)
    assert reranked.tokens == (5, 7, 4, 5)
    assert reranked.model == "cross-encoder"
    assert len(reranked) == 4
    assert reranked.scores.flags.writeable


async def test_top_n_return_documents_raw_scores_and_truncation_reach_the_wire() -> None:
    client, transport = offline()
    reranked = await client.rerank(
        "q",
        DOCUMENTS,
        model="ce",
        top_n=2,
        return_documents=True,
        raw_scores=True,
        truncate=False,
        truncation_direction="left",
    )
    request = transport.sent[0].request
    assert isinstance(request, RerankRequest)
    assert (request.model, request.top_n, request.return_documents) == ("ce", 2, True)
    assert (request.raw_scores, request.truncate, request.truncation_direction) == (
        True,
        False,
        "left",
    )
    assert reranked.order == (1, 3)
    assert len(reranked.scores) == 4  # every document is scored whatever top_n is
    assert [(r.index, r.document) for r in reranked.results] == [
        (1, "a much longer document"),
        (3, "medium text"),
    ]


async def test_concurrent_calls_each_get_their_own_scores() -> None:
    client, _ = offline()
    queries = [[f"doc {i}" + "x" * j for j in range(i + 1)] for i in range(8)]
    answers = await asyncio.gather(*(client.rerank("q", docs) for docs in queries))
    for docs, reranked in zip(queries, answers, strict=True):
        assert len(reranked) == len(docs)
        assert reranked.order[0] == len(docs) - 1


# ---------------------------------------------------------------------- errors


async def test_an_error_result_is_an_embed_error_with_its_code_and_index() -> None:
    def refuse(request: Any) -> Result:
        info = ErrorInfo("input_too_long", "pair 2 is 700 tokens, above 512", index=2)
        return ErrorResult(id=request.id, error=info)

    client, _ = offline(refuse)
    with pytest.raises(EmbedError) as caught:
        await client.rerank("q", DOCUMENTS, truncate=False)
    assert (caught.value.code, caught.value.index) == ("input_too_long", 2)
    assert str(caught.value).endswith("(document 2)"), "the index names a document"
    assert not caught.value.retriable


async def test_vectors_answering_a_rerank_call_are_a_clear_error() -> None:
    client, _ = offline(vectors_result)
    with pytest.raises(UnexpectedResultError, match="asked for relevance scores") as caught:
        await client.rerank("q", DOCUMENTS)
    assert caught.value.got == "vectors"


async def test_scores_answering_an_embed_call_are_a_clear_error_not_a_crash() -> None:
    """A rerank result under an embed call's id (a worker serving a reranker on the embed
    topic, a reused id) raises UnexpectedResultError, not AttributeError."""

    def scores(request: Any) -> Result:
        fake = RerankRequest(id=request.id, query="q", documents=("x",))
        return rerank_result(fake)

    client, _ = offline(scores)
    with pytest.raises(UnexpectedResultError, match="asked for vectors") as caught:
        await client.embed(["text"])
    assert "rerank result" in caught.value.got
    assert isinstance(caught.value, KembedError)


async def test_scores_for_another_number_of_documents_are_refused() -> None:
    def short(request: Any) -> Result:
        return rerank_result(replace(request, documents=request.documents[:-1]))

    client, _ = offline(short)
    with pytest.raises(UnexpectedResultError, match="4 scores"):
        await client.rerank("q", DOCUMENTS)


# ---------------------------------------------------------------------- the catalog


async def test_rerank_is_routed_to_the_rerankers_topic_by_the_catalog() -> None:
    client, transport = offline(catalog=[catalog_entry(), reranker()])
    await client.rerank("q", ["d"], model="ce")
    assert transport.sent[0].topic == "rerank.requests"
    models = await client._router.find("ms-marco")
    assert models is not None
    assert models.kind == "rerank"


async def test_the_wrong_kind_fails_before_sending_when_the_catalog_knows_the_model() -> None:
    client, transport = offline(vectors_result, catalog=[catalog_entry(), reranker()])
    with pytest.raises(EmbedError, match="is an embedding model") as caught:
        await client.rerank("q", ["d"], model="minilm")  # an alias of the embedding model
    assert caught.value.code == "invalid_request"
    assert "rerank()" in str(caught.value)
    with pytest.raises(EmbedError, match="is a reranker") as caught:
        await client.embed(["text"], model="ms-marco")
    assert caught.value.code == "invalid_request"
    assert "call rerank(), not embed()" in str(caught.value)
    with pytest.raises(EmbedError, match="is a reranker"):
        await client.submit(["text"], model="ce")
    assert transport.sent == []
    # the right kind goes through
    assert (await client.embed(["text"], model="minilm")).shape == (1, 2)


async def test_no_kind_check_for_a_pinned_or_unknown_model() -> None:
    """A model pinned by model_topics is sent as configured; one the catalog lacks goes to
    the requests topic, where a worker answers (here: with scores)."""
    pinned, transport = offline(catalog=[catalog_entry()], model_topics={"minilm": "pinned.topic"})
    await pinned.rerank("q", ["d"], model="minilm")
    assert transport.sent[0].topic == "pinned.topic"
    unknown, transport = offline(catalog=[catalog_entry()])
    await unknown.rerank("q", ["d"], model="elsewhere")
    assert transport.sent[0].topic == "embed.requests"


@pytest.mark.parametrize(
    ("query", "documents", "options", "error", "match"),
    [
        ("", ["d"], {}, ValueError, "query must not be empty"),
        (b"q", ["d"], {}, TypeError, "query must be a string"),
        ("q", [], {}, ValueError, "documents must not be empty"),
        ("q", "one string", {}, TypeError, "sequence of strings"),
        ("q", ["d", 3], {}, TypeError, "sequence of strings"),
        ("q", ["d", ""], {}, ValueError, r"documents\[1\] is empty"),
        ("q", ["d"], {"top_n": 0}, ValueError, "top_n"),
        ("q", ["d"], {"top_n": True}, ValueError, "top_n"),
        ("q", ["d"], {"truncation_direction": "Left"}, ValueError, "truncation_direction"),
    ],
)
async def test_invalid_arguments_raise_before_anything_is_sent(
    query: Any, documents: Any, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    client, transport = offline()
    with pytest.raises(error, match=match):
        await client.rerank(query, documents, **options)
    assert transport.sent == []


async def test_a_client_that_reads_no_replies_cannot_rerank() -> None:
    client, transport = offline(read_replies=False)
    with pytest.raises(KembedError, match="rerank"):
        await client.rerank("q", ["d"])
    assert transport.sent == []


def test_reranked_results_without_documents_and_with() -> None:
    reranked = Reranked(
        scores=np.array([0.1, 0.9, 0.5], dtype=np.float32),
        order=(1, 2),
        tokens=(4, 5, 6),
        model="m",
        documents=("b", "c"),
    )
    assert reranked.results == [
        RankedDocument(1, float(np.float32(0.9)), "b"),
        RankedDocument(2, float(np.float32(0.5)), "c"),
    ]
    assert [r.document for r in replace(reranked, documents=None).results] == [None, None]
