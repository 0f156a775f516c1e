"""The routes other clients call, against the fake SDK client of test_gateway: Cohere's v2
API (``POST /v2/embed``, ``/v2/rerank``, Cohere-shaped errors) and TEI's ``POST /``,
``/similarity`` and ``GET /info``; and one error shape per API on every path (handlers,
validation, body parsing, 404/405, keys, limits), over raw HTTP. With the real clients
(``cohere.ClientV2``, ``huggingface_hub.InferenceClient``) against a real broker and
worker: tests/integration/test_gateway_clients.py."""

from __future__ import annotations

import base64
import re
from dataclasses import replace
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pytest

from kembed_shared.encodings import quantize_int8
from tests.support.sdk import MODEL, RERANKER, FakeClient, catalog_entry, score_of, tokens_of
from tests.unit.gateway.test_gateway import DOCS, KEY, bearer, openai_error, served, tei_error
from tests.unit.gateway.test_gateway_rerank import with_reranker

TEXTS = ["What is Kafka?", "A distributed log.", "Paris is in France."]
QUERY = "What is Kafka?"
DOCUMENTS = ["Kafka is a distributed log.", "Paris is in France.", "A broker stores records."]


def unit_vector(text: str) -> npt.NDArray[np.float32]:
    """A distinct L2-normalized vector per text, with both signs."""
    rng = np.random.default_rng(abs(hash(text)) % (1 << 32))
    row = rng.standard_normal(8).astype(np.float32)
    return (row / np.linalg.norm(row)).astype(np.float32)


def with_unit_vectors(fake: FakeClient) -> npt.NDArray[np.float32]:
    fake.vector = unit_vector
    return np.stack([unit_vector(text) for text in TEXTS])


def cohere_error(answer: httpx.Response, status: int) -> str:
    """The message of a Cohere-shaped error, checked: its status and body shape."""
    assert answer.status_code == status, answer.text
    body: dict[str, Any] = answer.json()
    assert set(body) == {"id", "message"}, body
    assert isinstance(body["id"], str)
    assert body["id"]
    message: str = body["message"]
    return message


# ---------------------------------------------------------------------- /v2/embed


async def test_v2_embed_answers_cohere_shape_with_the_prompt_of_its_input_type() -> None:
    """Float rows in order, the texts, billed input tokens; ``input_type`` picks the
    catalog's prompt for that purpose (search_query: query; search_document: passage), and
    none where the model has no such prompt."""
    async with served() as (http, fake):
        fake.catalog = [replace(catalog_entry(), prompts={"query": "q: ", "passage": "p: "})]
        expected = with_unit_vectors(fake)
        query = await http.post(
            "/v2/embed", json={"model": MODEL, "texts": TEXTS, "input_type": "search_query"}
        )
        document = await http.post(
            "/v2/embed", json={"model": MODEL, "texts": TEXTS, "input_type": "search_document"}
        )
        other = await http.post(
            "/v2/embed", json={"model": MODEL, "texts": TEXTS, "input_type": "clustering"}
        )
    assert query.status_code == 200, query.text
    body = query.json()
    assert set(body) == {"id", "embeddings", "texts", "meta", "response_type"}
    assert body["response_type"] == "embeddings_by_type"
    assert body["texts"] == TEXTS
    assert list(body["embeddings"]) == ["float"]
    np.testing.assert_array_equal(np.array(body["embeddings"]["float"], np.float32), expected)
    assert body["meta"]["billed_units"]["input_tokens"] == sum(tokens_of(t) for t in TEXTS)
    assert body["meta"]["api_version"] == {"version": "2"}
    assert document.status_code == other.status_code == 200
    prompts = [call[1]["prompt_name"] for call in fake.calls]
    assert prompts == ["query", "passage", None]
    assert {call[1]["model"] for call in fake.calls} == {MODEL}


async def test_v2_embed_types_of_one_encoding_are_one_request_in_that_encoding() -> None:
    """int8 and uint8 are the workers' int8 codes (uint8 = code + 128); binary and ubinary
    their packed sign bits (binary = byte - 128): one request each, in that encoding."""
    async with served() as (http, fake):
        expected = with_unit_vectors(fake)
        ints = await http.post(
            "/v2/embed",
            json={"model": MODEL, "texts": TEXTS, "embedding_types": ["int8", "uint8"]},
        )
        bits = await http.post(
            "/v2/embed",
            json={"model": MODEL, "texts": TEXTS, "embedding_types": ["ubinary", "binary"]},
        )
    assert [call[1]["encoding"] for call in fake.calls] == ["int8", "binary"]
    codes, _ = quantize_int8(expected, normalized=True)
    packed = np.packbits(expected > 0, axis=1).astype(np.int16)
    assert ints.json()["embeddings"] == {
        "int8": codes.tolist(),
        "uint8": (codes.astype(np.int16) + 128).tolist(),
    }
    assert bits.json()["embeddings"] == {
        "ubinary": packed.tolist(),
        "binary": (packed - 128).tolist(),
    }
    assert all(0 <= v <= 255 for row in ints.json()["embeddings"]["uint8"] for v in row)


async def test_v2_embed_types_of_several_encodings_come_from_one_float32_request() -> None:
    """float, base64, int8 and ubinary together: one float32 request; the others computed
    from it exactly as the workers encode (same int8 codes, same bits)."""
    async with served() as (http, fake):
        expected = with_unit_vectors(fake)
        answer = await http.post(
            "/v2/embed",
            json={
                "model": MODEL,
                "texts": TEXTS,
                "embedding_types": ["float", "base64", "int8", "ubinary"],
            },
        )
    assert [call[1]["encoding"] for call in fake.calls] == ["float32"]
    embeddings = answer.json()["embeddings"]
    assert list(embeddings) == ["float", "base64", "int8", "ubinary"]
    decoded = [np.frombuffer(base64.b64decode(text), "<f4") for text in embeddings["base64"]]
    np.testing.assert_array_equal(np.stack(decoded), expected)
    assert embeddings["int8"] == quantize_int8(expected, normalized=True)[0].tolist()
    assert embeddings["ubinary"] == np.packbits(expected > 0, axis=1).tolist()


async def test_v2_embed_truncate_dimension_and_default_model() -> None:
    """truncate END cuts the end, START the start, NONE is an error for a too-long text;
    output_dimension is dimensions; no model: the gateway's model."""
    async with served(model=MODEL) as (http, fake):
        for truncate in ("END", "START", "NONE"):
            answer = await http.post(
                "/v2/embed", json={"texts": TEXTS, "truncate": truncate, "output_dimension": 4}
            )
            assert answer.status_code == 200, answer.text
            assert len(answer.json()["embeddings"]["float"][0]) == 4
    sides = [(call[1]["truncate"], call[1]["truncation_direction"]) for call in fake.calls]
    assert sides == [(True, "right"), (True, "left"), (False, "right")]
    assert {call[1]["dimensions"] for call in fake.calls} == {4}
    assert {call[1]["model"] for call in fake.calls} == {MODEL}


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v2/embed", {"model": MODEL}, 400, "texts must not be empty"),
        ("/v2/embed", {"model": MODEL, "texts": []}, 400, "texts must not be empty"),
        ("/v2/embed", {"model": MODEL, "texts": ["a", ""]}, 400, "texts[1] is empty"),
        ("/v2/embed", {"model": MODEL, "texts": [1, 2]}, 400, "token ids"),
        ("/v2/embed", {"model": "nope", "texts": TEXTS}, 404, "does not exist"),
        (
            "/v2/embed",
            {"model": MODEL, "texts": TEXTS, "embedding_types": ["int4"]},
            400,
            "embedding_types",
        ),
        ("/v2/embed", {"model": MODEL, "texts": TEXTS, "input_type": "image"}, 400, "only texts"),
        ("/v2/embed", {"model": MODEL, "images": ["data:image/png;base64,AA"]}, 400, "only texts"),
        ("/v2/embed", {"model": MODEL, "texts": TEXTS, "max_tokens": 16}, 400, "max_tokens 16"),
        ("/v2/embed", {"model": MODEL, "texts": TEXTS, "truncate": "MIDDLE"}, 400, "truncate"),
        ("/v2/embed", {"model": RERANKER, "texts": TEXTS}, 400, "reranker"),
        ("/v2/rerank", {"query": QUERY, "documents": []}, 400, "documents must not be empty"),
        ("/v2/rerank", {"query": "", "documents": DOCUMENTS}, 400, "query is empty"),
        ("/v2/rerank", {"documents": DOCUMENTS}, 400, "query"),
        (
            "/v2/rerank",
            {"model": MODEL, "query": QUERY, "documents": DOCUMENTS},
            400,
            "embedding model",
        ),
        (
            "/v2/rerank",
            {"model": "nope", "query": QUERY, "documents": DOCUMENTS},
            404,
            "does not exist",
        ),
        (
            "/v2/rerank",
            {"query": QUERY, "documents": DOCUMENTS, "max_tokens_per_doc": 8},
            400,
            "below",
        ),
    ],
)
async def test_v2_refusals_are_cohere_shaped_and_send_nothing(
    path: str, body: dict[str, Any], status: int, words: str
) -> None:
    async with with_reranker() as (http, fake):
        answer = await http.post(path, json=body)
    assert words in cohere_error(answer, status)
    assert not fake.calls


async def test_v2_embed_max_tokens_at_the_models_length_is_accepted() -> None:
    async with served() as (http, fake):
        answer = await http.post(
            "/v2/embed",
            json={"model": MODEL, "texts": TEXTS, "max_tokens": catalog_entry().max_seq_length},
        )
    assert answer.status_code == 200, answer.text
    assert len(fake.calls) == 1


# ---------------------------------------------------------------------- /v2/rerank


async def test_v2_rerank_answers_cohere_shape_highest_score_first() -> None:
    async with with_reranker() as (http, fake):
        answer = await http.post(
            "/v2/rerank",
            json={"model": RERANKER, "query": QUERY, "documents": DOCUMENTS, "top_n": 2},
        )
        default = await http.post("/v2/rerank", json={"query": QUERY, "documents": DOCUMENTS})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert set(body) == {"id", "results", "meta"}
    scores = [score_of(QUERY, d) for d in DOCUMENTS]
    best = sorted(range(3), key=lambda i: -scores[i])
    assert [r["index"] for r in body["results"]] == best[:2]
    for result in body["results"]:
        assert set(result) == {"index", "relevance_score"}
        assert result["relevance_score"] == pytest.approx(scores[result["index"]])
    assert [r["index"] for r in default.json()["results"]] == best
    assert [call[1]["model"] for call in fake.calls] == [RERANKER, RERANKER]
    assert fake.calls[0][1]["top_n"] == 2


async def test_v2_rerank_with_no_reranker_served_is_404() -> None:
    async with served() as (http, _):
        answer = await http.post("/v2/rerank", json={"query": QUERY, "documents": DOCUMENTS})
    assert "no live worker serves a reranker" in cohere_error(answer, 404)


# ---------------------------------------------------------------------- TEI's other routes


async def test_tei_root_embeds_reranks_or_compares_by_the_body() -> None:
    """``POST /`` (and ``/invocations``) with ``inputs``: /embed's answer; with ``query``
    and ``texts``: /rerank's; with ``inputs.source_sentence``: /similarity's."""
    async with with_reranker() as (http, fake):
        fake.vector = unit_vector
        embedded = await http.post("/", json={"inputs": TEXTS, "normalize": False})
        single = await http.post("/invocations", json={"inputs": TEXTS[0]})
        ranked = await http.post("/", json={"query": QUERY, "texts": DOCUMENTS})
        compared = await http.post(
            "/", json={"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}
        )
        direct = await http.post("/embed", json={"inputs": TEXTS, "normalize": False})
    assert embedded.status_code == 200, embedded.text
    assert embedded.json() == direct.json()
    # float32 values as their shortest text: each reads back as the same float32
    np.testing.assert_array_equal(np.float32(single.json()), [unit_vector(TEXTS[0])])
    scores = [score_of(QUERY, d) for d in DOCUMENTS]
    assert [r["index"] for r in ranked.json()] == sorted(range(3), key=lambda i: -scores[i])
    assert compared.json() == pytest.approx(
        [float(unit_vector(TEXTS[0]) @ unit_vector(t)) for t in TEXTS[1:]], abs=1e-6
    )
    assert fake.calls[0][1]["normalize"] is False


async def test_tei_similarity_is_the_cosine_to_each_sentence_with_its_parameters() -> None:
    async with served(model=MODEL) as (http, fake):
        fake.vector = unit_vector
        answer = await http.post(
            "/similarity",
            json={
                "inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]},
                "parameters": {"truncate": True, "truncation_direction": "Left"},
            },
        )
        empty = await http.post(
            "/similarity", json={"inputs": {"source_sentence": "a", "sentences": []}}
        )
        malformed = await http.post("/similarity", json={"inputs": {"sentences": ["a"]}})
    source = unit_vector(TEXTS[0])
    assert answer.json() == pytest.approx([float(source @ unit_vector(t)) for t in TEXTS[1:]])
    options = fake.calls[0][1]
    assert fake.calls[0][0] == TEXTS
    assert (options["model"], options["truncate"]) == (MODEL, True)
    assert options["truncation_direction"] == "left"
    assert empty.status_code == 400
    assert tei_error(empty) == {
        "error": "`inputs.sentences` cannot be empty",
        "error_type": "Empty",
    }
    assert malformed.status_code == 422
    assert tei_error(malformed)["error"].startswith("inputs: ")


async def test_tei_info_describes_the_gateways_model_in_teis_shape() -> None:
    async with with_reranker() as (http, _):
        answer = await http.get("/info")
    info = answer.json()
    assert answer.status_code == 200
    entry = catalog_entry()
    assert info["model_id"] == info["served_model_name"] == entry.name
    assert info["model_type"] == {"embedding": {"pooling": entry.pooling}}
    assert info["max_input_length"] == entry.max_seq_length
    assert info["model_dtype"] == entry.dtype
    assert isinstance(info["max_client_batch_size"], int)
    assert {m["name"]: m["kind"] for m in info["served_models"]} == {
        MODEL: "embed",
        RERANKER: "rerank",
    }


# ---------------------------------------------------------------------- one shape per API

_PATHS = {
    "openai": ["/v1/embeddings", "/v1/rerank"],
    "cohere": ["/v2/embed", "/v2/rerank"],
    "tei": ["/", "/embed", "/rerank", "/similarity"],
}


def tei_or_cohere(shape: str, answer: httpx.Response, status: int, tei_status: int) -> None:
    """An error in Cohere's shape with ``status``, or in TEI's with ``tei_status``."""
    if shape == "cohere":
        cohere_error(answer, status)
    else:
        assert answer.status_code == tei_status, answer.text
        tei_error(answer)


@pytest.mark.parametrize(("shape", "path"), [(s, p) for s, ps in _PATHS.items() for p in ps])
async def test_every_path_answers_its_apis_error_shape(shape: str, path: str) -> None:
    """Not JSON, not UTF-8, not an object, a wrong method, no key, too large: each in the
    path's API's shape (OpenAI 400/405/401/413, Cohere the same statuses, TEI 422/405/401/413),
    never FastAPI's ``{"detail": ...}``."""
    async with with_reranker(api_keys=KEY, max_body_bytes=4096) as (http, _):
        key = bearer(KEY)
        json_type = {**key, "content-type": "application/json"}
        answers = [
            (await http.post(path, content=b'{"texts": [', headers=json_type), 400, 422),
            (await http.post(path, content=b'\xff\xfe{"a": 1}', headers=json_type), 400, 422),
            (await http.post(path, content=b"[1, 2]", headers=json_type), 400, 422),
            (await http.get(path, headers=key), 405, 405),
            (await http.post(path, json={"inputs": "a"}), 401, 401),
            (await http.post(path, content=b"x" * 5000, headers=json_type), 413, 413),
        ]
    for answer, status, tei_status in answers:
        assert "detail" not in answer.text
        if shape == "openai":
            assert answer.status_code == status, answer.text
            assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
        else:
            tei_or_cohere(shape, answer, status, tei_status)


@pytest.mark.parametrize(
    ("path", "shape"),
    [("/v1/nothing", "openai"), ("/v2/embedz", "cohere"), ("/nothing", "openai")],
)
async def test_an_unknown_route_is_404_in_its_prefixs_shape(path: str, shape: str) -> None:
    async with served() as (http, _):
        answer = await http.post(path, json={})
    assert answer.status_code == 404
    if shape == "cohere":
        assert "no endpoint" in cohere_error(answer, 404)
    else:
        assert openai_error(answer, 404, "not_found", "invalid_request_error")


def test_every_route_is_in_the_gateway_docs() -> None:
    """Each API route of the app has its section in docs/gateway.md."""
    from gateway.app import API_ENDPOINTS

    heading_lines = [line for line in DOCS.splitlines() if line.startswith("#")]
    headings = {
        path for line in heading_lines for path in re.findall(r"`(?:GET|POST) ([^`]+)`", line)
    }
    assert headings >= API_ENDPOINTS, API_ENDPOINTS - headings
