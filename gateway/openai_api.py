"""OpenAI's embeddings API: ``POST /v1/embeddings`` and ``GET /v1/models``.

Request and answer follow OpenAI's shapes, so the official client, LangChain's
``OpenAIEmbeddings`` and anything else written for OpenAI works with ``base_url`` pointed
here. ``encoding_format=base64`` is each vector's little-endian float32 bytes, base64
encoded (what the official client asks for by default, and decodes). An input over the
model's maximum length is an error (400 ``input_too_long``), as with OpenAI.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.common import Service, json_response, refuse_token_ids, texts_of
from gateway.errors import from_sdk
from gateway.fast_path import FastRoute, optional_of, plain_texts
from gateway.service import EmbedOptions
from producer_sdk.errors import KembedError

__all__ = [
    "FAST_EMBEDDINGS",
    "EmbeddingData",
    "EmbeddingRequest",
    "EmbeddingResponse",
    "ModelEntry",
    "ModelList",
    "Usage",
    "router",
]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input: str | list[str] = Field(description="A text, or an array of texts (not token ids).")
    model: str = Field(description="A model name or alias the catalog knows (GET /v1/models).")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: arrays of numbers; base64: little-endian float32 bytes."
    )
    dimensions: int | None = Field(
        None, gt=0, description="Keep the first N dimensions (normalized again)."
    )
    user: str | None = Field(None, description="Accepted and ignored.")

    _no_token_ids = field_validator("input", mode="before")(refuse_token_ids)


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage


class ModelEntry(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelEntry]


router = APIRouter(prefix="/v1", tags=["OpenAI"])


def _plain_embedding_request(data: dict[str, Any]) -> EmbeddingRequest | None:
    """The body of ``POST /v1/embeddings`` when every field has its plain type."""
    texts, model = data.get("input"), data.get("model")
    encoding_format = optional_of(data, "encoding_format", str, "float")
    dimensions = optional_of(data, "dimensions", int)
    user = optional_of(data, "user", str)
    if (
        not plain_texts(texts)
        or not isinstance(model, str)
        or encoding_format not in ("float", "base64")
        or dimensions is ...
        or (dimensions is not None and dimensions <= 0)
        or user is ...
    ):
        return None
    return EmbeddingRequest.model_construct(
        input=texts,
        model=model,
        encoding_format=encoding_format,
        dimensions=dimensions,
        user=user,
    )


@router.post("/embeddings", response_model=EmbeddingResponse)
async def create_embeddings(body: EmbeddingRequest, request: Request, gateway: Service) -> Response:
    """Embed ``input`` with ``model``; one embedding per input, in order."""
    texts = texts_of(body.input, request)
    # truncate false: an input over the model's limit is an error, as with OpenAI
    options = EmbedOptions(model=body.model, truncate=False, dimensions=body.dimensions)
    outcome = await gateway.embed(texts, options)
    request.state.model = outcome.model
    vectors = outcome.result.vectors
    rows: list[Any]
    if body.encoding_format == "base64":
        little = vectors.astype("<f4", copy=False)
        rows = [base64.b64encode(row.tobytes()).decode("ascii") for row in little]
    else:  # float32 rows, serialized from the array (gateway.common.json_response)
        rows = list(np.ascontiguousarray(vectors, dtype=np.float32))
    tokens = sum(outcome.result.tokens)
    answer = {
        "object": "list",
        "data": [
            {"object": "embedding", "index": index, "embedding": row}
            for index, row in enumerate(rows)
        ],
        "model": outcome.model or body.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return json_response(answer)


FAST_EMBEDDINGS = FastRoute(_plain_embedding_request, create_embeddings)
"""``POST /v1/embeddings``'s fast path (gateway.fast_path)."""


@router.get("/models", response_model=ModelList)
async def list_models(gateway: Service) -> ModelList:
    """The models live workers serve, from the model catalog: each name and each alias."""
    try:
        models = await gateway.catalog.models()
    except KembedError as exc:
        raise from_sdk(exc) from None
    entries = []
    for model in models:
        created = model.announced_ms // 1000
        entries += [
            ModelEntry(id=name, created=created, owned_by="kembed")
            for name in (model.name, *model.aliases)
        ]
    return ModelList(data=entries)
