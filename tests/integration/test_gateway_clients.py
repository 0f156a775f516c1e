"""The gateway from the clients people already have, through the real broker, worker and
models: Hugging Face's ``InferenceClient`` (TEI's ``POST /``: ``feature_extraction`` and
``sentence_similarity``) and Cohere's ``ClientV2`` (``POST /v2/embed``, ``/v2/rerank``),
each held to sentence-transformers within 1e-4; the errors those clients raise; and
``/v1/models`` listing names, never a model's directory.

The fleet is test_rerank_clients's: one fp32 worker serving the bundled embedding model
(``rc-minilm``, the default on the gateway's requests topic) and a random-weight
cross-encoder from a local directory (``rc-ce``).
"""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pytest

from tests.integration.test_gateway import GatewayProcess
from tests.integration.test_rerank_clients import (
    EMBEDDER,
    QUERY,
    RERANKER,
    TOLERANCE,
    Fleet,
    check_top,
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
