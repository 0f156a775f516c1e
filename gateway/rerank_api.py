"""The rerank API of Cohere, Jina, vLLM and Infinity: ``POST /v1/rerank``.

Request: ``query``, ``documents`` (strings, or Cohere's ``{"text": ...}`` objects),
``model`` (optional: the gateway's ``rerank_model``, else the one reranker in the
catalog), ``top_n``, ``return_documents``; other keys (``max_tokens_per_doc``,
``rank_fields``) are ignored. Answer: ``{"id", "model", "results": [{"index",
"relevance_score", "document": {"text"}}], "usage": {"prompt_tokens", "total_tokens"}}``,
results highest score first (the best ``top_n``), as vLLM and Jina answer; ``document``
only with ``return_documents``. Pairs over the model's maximum length are cut (as these
APIs do); errors are OpenAI-shaped, as for every ``/v1`` endpoint.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from gateway.common import Service, json_response, texts_of
from gateway.service import RerankOptions

__all__ = ["RerankDocument", "RerankRequest", "RerankResponse", "router"]


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    query: str = Field(description="The query every document is scored against.")
    documents: list[str | RerankDocument] = Field(
        description='The documents to score: strings, or objects {"text": ...}.'
    )
    model: str | None = Field(
        None,
        description="A reranker's name or alias (kembed models); default: the gateway's "
        "rerank_model, else the one reranker the catalog lists.",
    )
    top_n: int | None = Field(
        None, ge=1, description="Answer the best N documents only (default: all)."
    )
    return_documents: bool = Field(False, description="Each result carries its document.")


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage


router = APIRouter(prefix="/v1", tags=["Rerank (Cohere, Jina)"])


@router.post("/rerank", response_model=RerankResponse, response_model_exclude_none=True)
async def rerank(body: RerankRequest, request: Request, gateway: Service) -> Response:
    """Score each document against ``query`` with a cross-encoder; the results highest
    score first."""
    texts = texts_of([d if isinstance(d, str) else d.text for d in body.documents], request)
    options = RerankOptions(model=body.model, top_n=body.top_n, truncate=True)
    outcome = await gateway.rerank(body.query, texts, options, "documents")
    request.state.model = outcome.model
    results: list[dict[str, Any]] = []
    for index, score, _ in outcome.result.results:
        result: dict[str, Any] = {"index": index, "relevance_score": score}
        if body.return_documents:
            result["document"] = {"text": texts[index]}
        results.append(result)
    tokens = sum(outcome.result.tokens)
    return json_response(
        {
            "id": f"rerank-{uuid.uuid4().hex}",
            "model": outcome.model or body.model,
            "results": results,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )
