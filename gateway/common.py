"""What the APIs' routes share: the running :class:`~gateway.service.Gateway` as a
FastAPI dependency, the refusal of token-id inputs, and compact JSON answers (orjson)."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import Depends, Request, Response

from gateway.errors import ApiError
from gateway.service import Gateway

__all__ = [
    "TOKEN_IDS_REFUSED",
    "Service",
    "gateway_of",
    "json_response",
    "refuse_token_ids",
    "texts_of",
]

TOKEN_IDS_REFUSED = (
    "arrays of token ids are not supported: send text (LangChain's OpenAIEmbeddings: "
    "check_embedding_ctx_length=False)"
)


async def gateway_of(request: Request) -> Gateway:
    """The gateway of the running app (set when its lifespan started). A coroutine, so that
    FastAPI calls it on the event loop rather than in its thread pool on every request."""
    gateway: Gateway | None = getattr(request.app.state, "gateway", None)
    if gateway is None:
        raise ApiError("kafka_unavailable", "the gateway is not connected to Kafka yet")
    return gateway


Service = Annotated[Gateway, Depends(gateway_of)]


def refuse_token_ids(value: Any) -> Any:
    """A ``mode="before"`` validator of an input field: arrays of numbers (token ids, one
    list or a list of lists) are refused with a message that says what to send instead."""
    if isinstance(value, list) and any(isinstance(item, int | float | list) for item in value):
        raise ValueError(TOKEN_IDS_REFUSED)
    return value


def texts_of(inputs: str | list[str], request: Request) -> list[str]:
    """The inputs as a list (one string is one input), counted for the request's log line."""
    texts = [inputs] if isinstance(inputs, str) else inputs
    request.state.inputs = len(texts)
    return texts


def json_response(answer: Any) -> Response:
    """``answer`` as compact JSON, numpy arrays in it written straight from their buffers
    (float32 values as the shortest text that reads back as the same float32, as TEI
    writes them). Built by hand rather than by a response model: validating thousands of
    floats per answer through pydantic, or turning them into Python floats first, would
    cost more than the request."""
    return Response(orjson.dumps(answer, option=_NUMPY), media_type="application/json")


_NUMPY = orjson.OPT_SERIALIZE_NUMPY
