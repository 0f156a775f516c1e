"""text-embeddings-inference's routes: ``POST /embed``, ``/embed_sparse``, ``/rerank``,
``/similarity``, ``/tokenize``, ``/decode`` and ``/`` (and ``/invocations``, SageMaker's
name for it), and ``GET /info``.

TEI serves one model, so a request names none: ``/embed`` and ``/similarity`` ask for the
gateway's configured ``model`` (``KEMBED_GATEWAY_MODEL``), or the workers' default when
that is unset; ``/rerank`` for its ``rerank_model``, or the one reranker in the catalog.
``/embed`` answers a list of float lists, one per input, in order; ``/rerank`` a list of
``{index, score}`` (and ``text`` with ``return_text``), one per text, highest score first;
``/similarity`` the cosine similarity of ``source_sentence`` to each of ``sentences``;
``/embed_sparse`` (its ``sparse_model``, or the one sparse encoder in the catalog) per input
a list of ``{index, value}``, its nonzero term weights, vocabulary ids ascending.
TEI's ``POST /`` is the route of the model it serves; kembed serves both kinds, so ``/``
answers by the body: ``query`` and ``texts`` rerank, ``inputs`` holding ``source_sentence``
is a similarity, any other ``inputs`` embeds (what ``huggingface_hub.InferenceClient``
sends for ``feature_extraction`` and ``sentence_similarity``). ``/tokenize`` and
``/decode`` are answered by a worker serving the gateway's model, from the tokenizer that
model is served with (so the tokens are those the worker encodes, before truncation).
``/info`` describes the model ``/embed`` uses, in TEI's shape. Errors are TEI's
``{"error": ..., "error_type": ...}``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Body, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.common import Service, json_response, refuse_token_ids, texts_of
from gateway.errors import ApiError, from_sdk
from gateway.fast_path import FastRoute, optional_of, plain_texts
from gateway.service import EmbedOptions, RerankOptions, SparseOptions
from kembed_shared.version import kembed_version
from producer_sdk.errors import KembedError
from schemas import Kind

__all__ = [
    "FAST_EMBED",
    "TeiEmbedRequest",
    "TeiEmbedSparseRequest",
    "TeiSparseValue",
    "TeiRank",
    "TeiRerankRequest",
    "TeiDecodeRequest",
    "TeiSimilarityRequest",
    "TeiToken",
    "TeiTokenizeRequest",
    "router",
]

Direction = Literal["Right", "Left", "right", "left"]


class TeiEmbedRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    inputs: str | list[str] = Field(description="A text or a list of texts (not token ids).")
    normalize: bool = Field(True, description="L2-normalize the vectors.")
    truncate: bool = Field(
        False, description="Cut inputs over the model's maximum length; false: an error."
    )
    truncation_direction: Direction = Field(
        "Right", description="Which end of a too-long input is cut (Right keeps the start)."
    )
    prompt_name: str | None = Field(None, description="One of the model's named prompts.")
    dimensions: int | None = Field(None, gt=0, description="Keep the first N dimensions.")

    _no_token_ids = field_validator("inputs", mode="before")(refuse_token_ids)


class TeiEmbedSparseRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    inputs: str | list[str] = Field(description="A text or a list of texts (not token ids).")
    truncate: bool = Field(
        False, description="Cut inputs over the model's maximum length; false: an error."
    )
    truncation_direction: Direction = Field(
        "Right", description="Which end of a too-long input is cut (Right keeps the start)."
    )
    prompt_name: str | None = Field(None, description="One of the model's named prompts.")

    _no_token_ids = field_validator("inputs", mode="before")(refuse_token_ids)


class TeiSparseValue(BaseModel):
    index: int
    value: float


class TeiRerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    query: str = Field(description="The query every text is scored against.")
    texts: list[str] = Field(description="The texts to score (one (query, text) pair each).")
    raw_scores: bool = Field(False, description="The model's logits, not its activation.")
    return_text: bool = Field(False, description="Each rank carries its text.")
    truncate: bool = Field(
        False, description="Cut pairs over the model's maximum length; false: an error."
    )
    truncation_direction: Direction = Field(
        "Right", description="Which end of a too-long pair is cut (Right keeps the start)."
    )


class SimilarityInputs(BaseModel):
    model_config = ConfigDict(extra="ignore")

    source_sentence: str = Field(description="The text the others are compared with.")
    sentences: list[str] = Field(description="The texts compared with source_sentence.")


class SimilarityParameters(BaseModel):
    model_config = ConfigDict(extra="ignore")

    truncate: bool | None = Field(
        None, description="Cut inputs over the model's maximum length; false: an error."
    )
    truncation_direction: Direction = Field("Right", description="Which end is cut.")
    prompt_name: str | None = Field(None, description="One of the model's named prompts.")


class TeiSimilarityRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    inputs: SimilarityInputs
    parameters: SimilarityParameters | None = None


class TeiTokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    inputs: str | list[str] = Field(description="A text or a list of texts.")
    add_special_tokens: bool = Field(True, description="Add the model's special tokens.")
    prompt_name: str | None = Field(
        None, description="One of the model's named prompts, prepended to each text."
    )


class TeiDecodeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    ids: list[Annotated[int, Field(ge=0)]] | list[list[Annotated[int, Field(ge=0)]]] = Field(
        description="Token ids: one sequence, or a list of sequences."
    )
    skip_special_tokens: bool = Field(True, description="Leave the special tokens out.")


class TeiToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class TeiRank(BaseModel):
    index: int
    score: float
    text: str | None = None


router = APIRouter(tags=["text-embeddings-inference"])


def _direction(value: Direction) -> Literal["right", "left"]:
    return "left" if value.lower() == "left" else "right"


@router.post("/", response_model=list[list[float]] | list[TeiRank] | list[float])
@router.post("/invocations", response_model=list[list[float]] | list[TeiRank] | list[float])
async def root(
    body: Annotated[dict[str, Any], Body()], request: Request, gateway: Service
) -> Response:
    """TEI's route of its model, by the body: ``query`` and ``texts`` rerank (as
    ``/rerank``), ``inputs.source_sentence`` compares (as ``/similarity``), other
    ``inputs`` embed (as ``/embed``)."""
    try:
        if "query" in body and "texts" in body:
            return await rerank(TeiRerankRequest.model_validate(body), request, gateway)
        if isinstance(body.get("inputs"), dict):
            asked = TeiSimilarityRequest.model_validate(body)
            return await similarity(asked, request, gateway)
        return await embed(TeiEmbedRequest.model_validate(body), request, gateway)
    except ValidationError as error:  # answered as a body FastAPI validated
        raise RequestValidationError(error.errors()) from None


@router.post("/embed", response_model=list[list[float]])
async def embed(body: TeiEmbedRequest, request: Request, gateway: Service) -> Response:
    """Embed ``inputs`` with the gateway's model; one vector per input, in order."""
    texts = texts_of(body.inputs, request)
    options = EmbedOptions(
        model=gateway.settings.model,
        normalize=body.normalize,
        truncate=body.truncate,
        dimensions=body.dimensions,
        prompt_name=body.prompt_name,
        truncation_direction=_direction(body.truncation_direction),
    )
    outcome = await gateway.embed(texts, options)
    request.state.model = outcome.model
    return json_response(np.ascontiguousarray(outcome.result.vectors))


def _plain_embed_request(data: dict[str, Any]) -> TeiEmbedRequest | None:
    """The body of TEI's ``POST /embed`` when every field has its plain type."""
    fields = {
        "normalize": optional_of(data, "normalize", bool, True),
        "truncate": optional_of(data, "truncate", bool, False),
        "truncation_direction": optional_of(data, "truncation_direction", str, "Right"),
        "prompt_name": optional_of(data, "prompt_name", str),
        "dimensions": optional_of(data, "dimensions", int),
    }
    texts = data.get("inputs")
    if (
        not plain_texts(texts)
        or ... in fields.values()
        or fields["truncation_direction"] not in ("Right", "Left", "right", "left")
        or (fields["dimensions"] is not None and fields["dimensions"] <= 0)
    ):
        return None
    return TeiEmbedRequest.model_construct(inputs=texts, **fields)


FAST_EMBED = FastRoute(_plain_embed_request, embed)
"""TEI's ``POST /embed``'s fast path (gateway.fast_path)."""


@router.post("/embed_sparse", response_model=list[list[TeiSparseValue]])
async def embed_sparse(body: TeiEmbedSparseRequest, request: Request, gateway: Service) -> Response:
    """The term weights of ``inputs`` by the gateway's sparse encoder: per input, its
    nonzero weights as ``{index, value}`` (vocabulary id, weight), ids ascending."""
    texts = texts_of(body.inputs, request)
    options: SparseOptions = {
        "model": gateway.settings.sparse_model,
        "truncate": body.truncate,
        "prompt_name": body.prompt_name,
        "truncation_direction": _direction(body.truncation_direction),
    }
    outcome = await gateway.embed_sparse(texts, options)
    request.state.model = outcome.model
    weights = outcome.result
    return json_response(
        [
            [{"index": i, "value": v} for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
            for ids, values in (weights[row] for row in range(len(weights)))
        ]
    )


@router.post("/rerank", response_model=list[TeiRank], response_model_exclude_none=True)
async def rerank(body: TeiRerankRequest, request: Request, gateway: Service) -> Response:
    """Score each of ``texts`` against ``query`` with the gateway's reranker; one rank per
    text, highest score first."""
    texts = texts_of(body.texts, request)
    options = RerankOptions(
        raw_scores=body.raw_scores,
        truncate=body.truncate,
        truncation_direction=_direction(body.truncation_direction),
    )
    outcome = await gateway.rerank(body.query, texts, options, "texts")
    request.state.model = outcome.model
    ranks = []
    for index, score, _ in outcome.result.results:
        rank: dict[str, object] = {"index": index, "score": score}
        if body.return_text:
            rank["text"] = texts[index]
        ranks.append(rank)
    return json_response(ranks)


@router.post("/similarity", response_model=list[float])
async def similarity(body: TeiSimilarityRequest, request: Request, gateway: Service) -> Response:
    """The cosine similarity of ``inputs.source_sentence`` to each of ``inputs.sentences``,
    in order, from the gateway's model's vectors."""
    sentences = body.inputs.sentences
    if not sentences:
        raise ApiError("empty_input", "`inputs.sentences` cannot be empty", param="sentences")
    texts = texts_of([body.inputs.source_sentence, *sentences], request)
    parameters = body.parameters or SimilarityParameters.model_validate({})
    options = EmbedOptions(
        model=gateway.settings.model,
        normalize=True,
        truncate=bool(parameters.truncate),
        prompt_name=parameters.prompt_name,
        truncation_direction=_direction(parameters.truncation_direction),
    )
    outcome = await gateway.embed(texts, options, "sentences")
    request.state.model = outcome.model
    vectors = outcome.result.vectors.astype(np.float32, copy=False)
    scores = vectors[1:] @ vectors[0]  # unit vectors: the cosine
    return json_response(scores)


@router.post("/tokenize", response_model=list[list[TeiToken]])
async def tokenize(body: TeiTokenizeRequest, request: Request, gateway: Service) -> Response:
    """The tokens of each of ``inputs`` (not truncated): id, text, whether special, and a
    text token's UTF-8 byte offsets (``start``/``stop``; null for a special token)."""
    texts = texts_of(body.inputs, request)
    outcome = await gateway.tokenize(texts, body.add_special_tokens, body.prompt_name)
    request.state.model = outcome.model
    return json_response(
        [
            [
                {"id": t.id, "text": t.text, "special": t.special, "start": t.start, "stop": t.stop}
                for t in tokens
            ]
            for tokens in outcome.result.tokens
        ]
    )


@router.post("/decode", response_model=list[str])
async def decode(body: TeiDecodeRequest, request: Request, gateway: Service) -> Response:
    """The text of each sequence of ``ids`` (one list of ids is one sequence)."""
    ids = body.ids
    sequences: list[list[int]] = (
        [ids] if not ids or isinstance(ids[0], int) else ids  # type: ignore[list-item]
    )
    request.state.inputs = len(sequences)
    outcome = await gateway.decode(sequences, body.skip_special_tokens)
    request.state.model = outcome.model
    return json_response(outcome.result.texts)


@router.get("/info")
async def info(gateway: Service) -> dict[str, Any]:
    """The model ``/embed`` uses, in TEI's ``Info`` shape (what the catalog knows of it;
    ``served_models`` lists every model the fleet serves)."""
    entry = await gateway.entry(gateway.settings.model, Kind.EMBED)
    try:
        models = await gateway.catalog.models()
    except KembedError as exc:
        raise from_sdk(exc) from None
    return {
        "model_id": entry.name,
        "model_sha": None,
        "model_dtype": entry.dtype,
        "served_model_name": entry.name,
        "model_type": {"embedding": {"pooling": entry.pooling}},
        "max_concurrent_requests": gateway.settings.max_in_flight,
        "max_input_length": entry.max_seq_length,
        "max_batch_tokens": None,
        "max_batch_requests": None,
        "max_client_batch_size": gateway.settings.max_inputs,
        "auto_truncate": False,
        "tokenization_workers": None,
        "version": kembed_version(),
        "sha": None,
        "docker_label": None,
        "served_models": [{"name": model.name, "kind": model.kind} for model in models],
    }
