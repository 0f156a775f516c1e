"""text-embeddings-inference's ``POST /embed``.

TEI serves one model, so the request names none: the gateway asks for its configured
``model`` (``KEMBED_GATEWAY_MODEL``), or the workers' default when that is unset. The
answer is a list of float lists, one per input, in order; errors are TEI's
``{"error": ..., "error_type": ...}``.
"""

from __future__ import annotations

import json
from typing import Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.common import Service, refuse_token_ids, texts_of
from gateway.service import EmbedOptions

__all__ = ["TeiEmbedRequest", "router"]


class TeiEmbedRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    inputs: str | list[str] = Field(description="A text or a list of texts (not token ids).")
    normalize: bool = Field(True, description="L2-normalize the vectors.")
    truncate: bool = Field(
        False, description="Cut inputs over the model's maximum length; false: an error."
    )
    truncation_direction: Literal["Right", "Left", "right", "left"] = Field(
        "Right", description="Which end of a too-long input is cut (Right keeps the start)."
    )
    prompt_name: str | None = Field(None, description="One of the model's named prompts.")
    dimensions: int | None = Field(None, gt=0, description="Keep the first N dimensions.")

    _no_token_ids = field_validator("inputs", mode="before")(refuse_token_ids)


router = APIRouter(tags=["text-embeddings-inference"])


@router.post("/embed", response_model=list[list[float]])
async def embed(body: TeiEmbedRequest, request: Request, gateway: Service) -> Response:
    """Embed ``inputs`` with the gateway's model; one vector per input, in order."""
    texts = texts_of(body.inputs, request)
    direction: Literal["right", "left"] = (
        "left" if body.truncation_direction.lower() == "left" else "right"
    )
    options = EmbedOptions(
        model=gateway.settings.model,
        normalize=body.normalize,
        truncate=body.truncate,
        dimensions=body.dimensions,
        prompt_name=body.prompt_name,
        truncation_direction=direction,
    )
    outcome = await gateway.embed(texts, options)
    request.state.model = outcome.model
    rows = outcome.embeddings.vectors.tolist()
    return Response(json.dumps(rows, separators=(",", ":")), media_type="application/json")
