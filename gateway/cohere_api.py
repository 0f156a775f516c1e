"""Cohere's v2 API, what ``cohere.ClientV2`` calls: ``POST /v2/embed`` and
``POST /v2/rerank``.

``/v2/embed`` takes ``texts``, ``model``, ``input_type``, ``embedding_types``,
``output_dimension`` and ``truncate``, and answers ``{"id", "embeddings": {<type>: rows},
"texts", "meta", "response_type": "embeddings_by_type"}``:

- ``input_type`` picks the model's prompt of that purpose where the catalog lists one
  (:data:`PROMPTS`: ``search_query`` -> ``query``, ``search_document`` -> ``document`` or
  ``passage``...); a model without such a prompt embeds the text as it is (its default
  prompt, if it has one).
- each of ``embedding_types`` is one of kembed's encodings: ``float`` and ``base64``
  float32, ``int8`` and ``uint8`` the int8 codes (``uint8`` = code + 128), ``binary`` and
  ``ubinary`` the packed sign bits (``binary`` = byte - 128, as Cohere and
  sentence-transformers pack them). Types of one encoding cost one request; types of
  several are computed from one float32 request with the workers' own quantizer.
- ``truncate``: ``END`` (the default) cuts the end of a too-long text, ``START`` its
  start, ``NONE`` makes it an error.

``/v2/rerank`` takes ``model``, ``query``, ``documents`` (strings) and ``top_n``, and
answers ``{"id", "results": [{"index", "relevance_score"}], "meta"}``, highest score first.
``max_tokens`` and ``max_tokens_per_doc`` are accepted when they do not ask for less than
the model's maximum length, which is what kembed cuts at. Errors are Cohere's
``{"id", "message"}`` with the status of :data:`gateway.errors.KINDS`.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.common import Service, json_response, refuse_token_ids, texts_of
from gateway.errors import ApiError
from gateway.service import EmbedOptions, RerankOptions
from kembed_shared.encodings import LAYOUTS, encode_rows
from producer_sdk.catalog import CatalogModel
from producer_sdk.encodings import Embeddings
from schemas import Encoding, Kind

__all__ = ["PROMPTS", "CohereEmbedRequest", "CohereRerankRequest", "router"]

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
InputType = Literal["search_document", "search_query", "classification", "clustering", "image"]

PROMPTS: dict[str, tuple[str, ...]] = {
    "search_query": ("search_query", "query"),
    "search_document": ("search_document", "document", "passage"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
"""``input_type`` -> the prompt names that serve it, first found wins."""

_ENCODING: dict[str, Encoding] = {
    "float": Encoding.FLOAT32,
    "base64": Encoding.FLOAT32,
    "int8": Encoding.INT8,
    "uint8": Encoding.INT8,
    "binary": Encoding.BINARY,
    "ubinary": Encoding.BINARY,
}
_META = {"api_version": {"version": "2"}}


class CohereEmbedRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    texts: list[str] | None = Field(None, description="The texts to embed.")
    model: str | None = Field(
        None, description="A model name or alias (default: the gateway's model)."
    )
    input_type: InputType | None = Field(
        None, description="What the texts are for: picks the model's prompt of that purpose."
    )
    embedding_types: list[EmbeddingType] | None = Field(
        None, min_length=1, description="The encodings to answer (default: float)."
    )
    output_dimension: int | None = Field(None, gt=0, description="Keep the first N dimensions.")
    truncate: Literal["NONE", "START", "END"] = Field(
        "END", description="Which end of a too-long text is cut; NONE: an error."
    )
    max_tokens: int | None = Field(
        None, gt=0, description="Accepted when at least the model's maximum length."
    )
    images: list[Any] | None = Field(None, description="Not supported: an error.")
    inputs: list[Any] | None = Field(None, description="Not supported: send texts.")

    _no_token_ids = field_validator("texts", mode="before")(refuse_token_ids)


class CohereRerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    query: str = Field(description="The query every document is scored against.")
    documents: list[str] = Field(description="The documents to score.")
    model: str | None = Field(
        None, description="A reranker's name or alias (default: the gateway's rerank_model)."
    )
    top_n: int | None = Field(None, ge=1, description="Answer the best N documents only.")
    max_tokens_per_doc: int | None = Field(
        None, gt=0, description="Accepted when at least the model's maximum length."
    )


router = APIRouter(prefix="/v2", tags=["Cohere v2"])


@router.post("/embed")
async def embed(body: CohereEmbedRequest, request: Request, gateway: Service) -> Response:
    """Embed ``texts`` in each of ``embedding_types``; one row per text, in order."""
    if body.images or body.inputs:
        field = "images" if body.images else "inputs"
        raise ApiError("invalid_request", f"{field}: only texts can be embedded", param=field)
    if body.input_type == "image":
        raise ApiError(
            "invalid_request", "input_type image: only texts can be embedded", param="input_type"
        )
    texts = texts_of(body.texts or [], request)
    gateway.check_inputs(texts, "texts")
    entry = await gateway.entry(body.model, Kind.EMBED)
    request.state.model = entry.name
    _check_max_tokens(body.max_tokens, entry, "max_tokens")
    types = list(dict.fromkeys(body.embedding_types or ["float"]))
    encodings = {_ENCODING[kind] for kind in types}
    encoding = encodings.pop() if len(encodings) == 1 else Encoding.FLOAT32
    options = EmbedOptions(
        model=entry.name,
        truncate=body.truncate != "NONE",
        truncation_direction="left" if body.truncate == "START" else "right",
        dimensions=body.output_dimension,
        prompt_name=prompt_for(body.input_type, entry.prompts),
        encoding=encoding,
    )
    outcome = await gateway.embed(texts, options, "texts")
    result = outcome.result
    tokens = sum(result.tokens)
    return json_response(
        {
            "id": str(uuid.uuid4()),
            "embeddings": {kind: _rows(result, kind) for kind in types},
            "texts": texts,
            "meta": {**_META, "billed_units": {"input_tokens": tokens}},
            "response_type": "embeddings_by_type",
        }
    )


@router.post("/rerank")
async def rerank(body: CohereRerankRequest, request: Request, gateway: Service) -> Response:
    """Score each document against ``query``; the results highest score first."""
    texts = texts_of(body.documents, request)
    gateway.check_inputs(texts, "documents")
    entry = await gateway.entry(body.model, Kind.RERANK)
    request.state.model = entry.name
    _check_max_tokens(body.max_tokens_per_doc, entry, "max_tokens_per_doc")
    options = RerankOptions(model=entry.name, top_n=body.top_n, truncate=True)
    outcome = await gateway.rerank(body.query, texts, options, "documents")
    results = [
        {"index": index, "relevance_score": score} for index, score, _ in outcome.result.results
    ]
    tokens = sum(outcome.result.tokens)
    return json_response(
        {
            "id": str(uuid.uuid4()),
            "results": results,
            "meta": {
                **_META,
                "billed_units": {"search_units": 1},
                "tokens": {"input_tokens": tokens},
            },
        }
    )


def prompt_for(input_type: str | None, prompts: Mapping[str, str]) -> str | None:
    """The model's prompt for ``input_type`` (:data:`PROMPTS`), None when it has none."""
    for name in PROMPTS.get(input_type or "", ()):
        if name in prompts:
            return name
    return None


def _check_max_tokens(value: int | None, entry: CatalogModel, field: str) -> None:
    if value is not None and value < entry.max_seq_length:
        raise ApiError(
            "invalid_request",
            f"{field} {value} is below the maximum length of {entry.name!r} "
            f"({entry.max_seq_length} tokens), where kembed cuts; omit it",
            param=field,
        )


def _rows(result: Embeddings, kind: str) -> list[Any]:
    """``result``'s rows as Cohere's ``kind`` of embedding (computed from float32 rows
    where the request asked for several encodings)."""
    vectors = result.vectors
    if result.encoding == Encoding.FLOAT32 and kind not in ("float", "base64"):
        vectors = _encode(vectors, _ENCODING[kind])
    if kind == "base64":
        little = vectors.astype("<f4", copy=False)
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in little]
    if kind in ("uint8", "binary"):  # int8 codes + 128; packed bytes - 128
        vectors = vectors.astype(np.int16) + (128 if kind == "uint8" else -128)
    return list(np.ascontiguousarray(vectors))  # rows, serialized from the array


def _encode(vectors: npt.NDArray[np.float32], encoding: Encoding) -> npt.NDArray[Any]:
    """float32 rows (normalized, as this API asks for them) in ``encoding``, by the code
    the workers encode with."""
    blob, _ = encode_rows(vectors, encoding, normalized=True)
    return np.frombuffer(blob, dtype=LAYOUTS[encoding].wire).reshape(len(vectors), -1)
