"""text-embeddings-inference's ``POST /embed`` and ``POST /rerank``.

TEI serves one model, so a request names none: ``/embed`` asks for the gateway's
configured ``model`` (``KEMBED_GATEWAY_MODEL``), or the workers' default when that is
unset; ``/rerank`` for its ``rerank_model``, or the one reranker in the catalog. ``/embed``
answers a list of float lists, one per input, in order; ``/rerank`` a list of ``{index,
score}`` (and ``text`` with ``return_text``), one per text, highest score first. Errors
are TEI's ``{"error": ..., "error_type": ...}``.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.common import Service, json_response, refuse_token_ids, texts_of
from gateway.service import EmbedOptions, RerankOptions

__all__ = ["TeiEmbedRequest", "TeiRank", "TeiRerankRequest", "router"]

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


class TeiRank(BaseModel):
    index: int
    score: float
    text: str | None = None


router = APIRouter(tags=["text-embeddings-inference"])


def _direction(value: Direction) -> Literal["right", "left"]:
    return "left" if value.lower() == "left" else "right"


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
    rows = outcome.result.vectors.tolist()
    return json_response(rows)


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
