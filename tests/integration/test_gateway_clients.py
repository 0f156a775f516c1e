"""The gateway from the clients people already have, through the real broker, worker and
models: Hugging Face's ``InferenceClient`` (TEI's ``POST /``: ``feature_extraction`` and
``sentence_similarity``) and Cohere's ``ClientV2`` (``POST /v2/embed``, ``/v2/rerank``),
each held to sentence-transformers within 1e-4; the errors those clients raise;
``/v1/models`` listing names, never a model's directory; and TEI's ``/tokenize`` and
``/decode`` (and the SDK's ``tokenize``/``decode``), held to transformers' tokenizers.

The fleet is test_rerank_clients's: one fp32 worker serving the bundled embedding model
(``rc-minilm``, the default on the gateway's requests topic) and a random-weight
cross-encoder from a local directory (``rc-ce``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pytest

from tests.integration.test_gateway import GatewayProcess
from tests.integration.test_rerank_clients import (
    EMBEDDER,
    LONG,
    QUERY,
    RERANKER,
    TOLERANCE,
    Fleet,
    check_top,
    client_options,
    documents,
    reference,
)
from tests.integration.test_rerank_clients import fleet as fleet
from tests.integration.test_rerank_clients import gateway as gateway

pytestmark = pytest.mark.integration

TEXTS = documents(5, seed=11)


@pytest.fixture
def hf_client_online(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub refuses every HTTP request while HF_HUB_OFFLINE is set (as the test
    command sets it, so that nothing reaches a model hub); its client's requests here go
    to the gateway on the loopback address only."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def expected(reference_model: Any, texts: list[str]) -> npt.NDArray[np.float32]:
    """sentence-transformers' normalized vectors, fp32 on the CPU."""
    vectors = reference_model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    return np.asarray(vectors, dtype=np.float32)


@pytest.mark.usefixtures("hf_client_online")
def test_huggingface_inference_client_feature_extraction(
    gateway: GatewayProcess, reference_model: Any
) -> None:
    """``InferenceClient(model=<gateway>)`` posts TEI's /embed body to ``/``: a batch and one
    text come back as sentence-transformers' vectors."""
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=gateway.url, timeout=60)
    batch = client.feature_extraction(TEXTS)
    single = client.feature_extraction(TEXTS[0])
    want = expected(reference_model, TEXTS)
    assert batch.shape == want.shape
    np.testing.assert_allclose(batch, want, atol=TOLERANCE)
    np.testing.assert_allclose(np.asarray(single).reshape(-1), want[0], atol=TOLERANCE)


@pytest.mark.usefixtures("hf_client_online")
def test_huggingface_inference_client_sentence_similarity(
    gateway: GatewayProcess, reference_model: Any
) -> None:
    """``sentence_similarity`` through ``/`` and through ``/similarity`` (the URL as the
    model): the cosine of the first text to each other one, as sentence-transformers'."""
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=gateway.url, timeout=60)
    by_root = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    by_route = client.sentence_similarity(
        TEXTS[0], other_sentences=TEXTS[1:], model=f"{gateway.url}/similarity"
    )
    want = expected(reference_model, TEXTS)
    cosines = want[1:] @ want[0]
    np.testing.assert_allclose(by_root, cosines, atol=TOLERANCE)
    np.testing.assert_allclose(by_route, cosines, atol=TOLERANCE)


@pytest.mark.usefixtures("hf_client_online")
def test_huggingface_inference_client_raises_on_teis_error_body(
    gateway: GatewayProcess,
) -> None:
    from huggingface_hub import InferenceClient
    from huggingface_hub.errors import HfHubHTTPError

    client = InferenceClient(model=gateway.url, timeout=60)
    with pytest.raises(HfHubHTTPError) as caught:
        client.feature_extraction([])
    assert caught.value.response.status_code == 400
    assert caught.value.response.json()["error_type"] == "Empty"


def test_cohere_client_v2_embed_in_three_types(
    gateway: GatewayProcess, reference_model: Any
) -> None:
    """``ClientV2.embed``: float equal to sentence-transformers; int8 the codes of those
    values (within one step of round(x * 127)); ubinary their packed signs (where a value
    is not within rounding of zero); the texts and billed tokens come back."""
    import cohere

    client = cohere.ClientV2(api_key="unused", base_url=gateway.url, timeout=60)
    answer = client.embed(
        model=EMBEDDER,
        texts=TEXTS,
        input_type="search_document",
        embedding_types=["float", "int8", "ubinary"],
    )
    want = expected(reference_model, TEXTS)
    floats = np.asarray(answer.embeddings.float_, dtype=np.float32)
    np.testing.assert_allclose(floats, want, atol=TOLERANCE)
    codes = np.asarray(answer.embeddings.int8)
    assert codes.shape == want.shape
    assert np.abs(codes - np.rint(want * 127)).max() <= 1
    bits = np.unpackbits(np.asarray(answer.embeddings.ubinary, dtype=np.uint8), axis=1)
    clear = np.abs(want) > 1e-3
    assert np.array_equal(bits[clear], (want > 0)[clear])
    assert answer.texts == TEXTS
    assert answer.meta is not None
    assert answer.meta.billed_units is not None
    assert (answer.meta.billed_units.input_tokens or 0) > len(TEXTS)


def test_cohere_client_v2_rerank(fleet: Fleet, gateway: GatewayProcess) -> None:
    """``ClientV2.rerank`` with ``top_n``: the best three, highest first, with
    sentence-transformers' CrossEncoder scores."""
    import cohere

    docs = documents(12)
    client = cohere.ClientV2(api_key="unused", base_url=gateway.url, timeout=60)
    answer = client.rerank(model=RERANKER, query=QUERY, documents=docs, top_n=3)
    want = reference(fleet, QUERY, docs)
    order = [result.index for result in answer.results]
    check_top(order, 3, want)
    for result in answer.results:
        assert abs(result.relevance_score - float(want[result.index])) < TOLERANCE


def test_cohere_client_raises_its_errors_from_the_gateways_bodies(
    gateway: GatewayProcess,
) -> None:
    """An unknown model is the client's NotFoundError, an embedding model named for a
    rerank its BadRequestError, each with Cohere's body (id and message)."""
    import cohere
    from cohere.errors import BadRequestError, NotFoundError

    client = cohere.ClientV2(api_key="unused", base_url=gateway.url, timeout=60)
    with pytest.raises(NotFoundError) as missing:
        client.embed(model="no-such-model", texts=TEXTS, input_type="search_query")
    with pytest.raises(BadRequestError) as wrong_kind:
        client.rerank(model=EMBEDDER, query=QUERY, documents=TEXTS)
    assert set(missing.value.body) == {"id", "message"}
    assert "does not exist" in missing.value.body["message"]
    assert "embedding model" in wrong_kind.value.body["message"]


def test_models_lists_names_and_never_a_models_directory(
    fleet: Fleet, gateway: GatewayProcess
) -> None:
    """The cross-encoder is configured by its directory: /v1/models lists its name and
    alias, not the path (the worker used to add its configured value to the names)."""
    listed = httpx.get(f"{gateway.url}/v1/models", timeout=30).json()
    ids = {entry["id"] for entry in listed["data"]}
    assert {EMBEDDER, RERANKER} <= ids
    assert not [name for name in ids if name.startswith("/") or str(fleet.model_dir) in name]
    info = httpx.get(f"{gateway.url}/info", timeout=30).json()
    assert info["model_id"] == EMBEDDER
    assert {m["name"] for m in info["served_models"]} == {EMBEDDER, RERANKER}


# ---------------------------------------------------------------------- /tokenize, /decode


def test_tei_tokenize_and_decode_use_the_served_models_tokenizer(
    gateway: GatewayProcess, model_dir: Path
) -> None:
    """``POST /tokenize`` answers the ids transformers' tokenizer of the served model makes
    (not truncated: a text far over the model's 256 tokens keeps them all), each text
    token the input's bytes at its offsets; a text within the limit has as many tokens as
    its embedding is billed (OpenAI's usage). ``POST /decode`` of those ids is
    transformers' decode."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    texts = [*TEXTS[:3], "Héllo wörld — 日本語 ok", LONG]
    answer = httpx.post(f"{gateway.url}/tokenize", json={"inputs": texts}, timeout=60)
    assert answer.status_code == 200, answer.text
    tokens = answer.json()
    ids = [[token["id"] for token in each] for each in tokens]
    assert ids == [tokenizer(text)["input_ids"] for text in texts]
    assert len(ids[-1]) > 256
    for text, each in zip(texts, tokens, strict=True):
        raw = text.encode("utf-8")
        for token in each:
            if token["special"]:
                assert (token["start"], token["stop"]) == (None, None)
            else:
                assert raw[token["start"] : token["stop"]].decode("utf-8") == token["text"]
    billed = httpx.post(
        f"{gateway.url}/v1/embeddings", json={"model": EMBEDDER, "input": texts[:4]}, timeout=60
    ).json()["usage"]["prompt_tokens"]
    assert billed == sum(len(each) for each in ids[:4])
    decoded = httpx.post(f"{gateway.url}/decode", json={"ids": ids[:4]}, timeout=60)
    assert decoded.status_code == 200, decoded.text
    assert decoded.json() == [tokenizer.decode(each, skip_special_tokens=True) for each in ids[:4]]
    bad = httpx.post(f"{gateway.url}/decode", json={"ids": [[101], [10**6]]}, timeout=60)
    assert bad.status_code == 422, bad.text
    assert bad.json()["error_type"] == "Validation"
    assert "vocabulary" in bad.json()["error"]


def test_sdk_tokenize_and_decode_answer_for_a_reranker_too(fleet: Fleet) -> None:
    """Any model's tokenizer answers: the cross-encoder's tokens of a text, with and
    without special tokens, are its transformers tokenizer's; an id outside its
    vocabulary is EmbedError ``invalid_request`` naming the sequence."""
    from transformers import AutoTokenizer

    from producer_sdk import EmbedClient, EmbedError

    tokenizer = AutoTokenizer.from_pretrained(str(fleet.model_dir))

    async def run() -> tuple[Any, Any, Any, EmbedError]:
        async with EmbedClient(fleet.bootstrap_servers, **client_options(fleet)) as client:
            with_special = await client.tokenize([QUERY, *TEXTS[:2]], model=RERANKER)
            plain = await client.tokenize([QUERY], model=RERANKER, add_special_tokens=False)
            ids = [[token.id for token in each] for each in with_special.tokens]
            decoded = await client.decode(ids, model=RERANKER)
            with pytest.raises(EmbedError) as caught:
                await client.decode([[1], [10**6]], model=RERANKER)
            return with_special, plain, decoded, caught.value

    with_special, plain, decoded, error = asyncio.run(run())
    assert with_special.model == RERANKER
    texts = [QUERY, *TEXTS[:2]]
    assert [[t.id for t in each] for each in with_special.tokens] == [
        tokenizer(text)["input_ids"] for text in texts
    ]
    assert [t.id for t in plain.tokens[0]] == tokenizer(QUERY, add_special_tokens=False)[
        "input_ids"
    ]
    assert decoded.texts == [
        tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) for text in texts
    ]
    assert (error.code, error.index) == ("invalid_request", 1)
