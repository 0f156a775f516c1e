"""The hot routes' fast path (gateway.fast_path): plain bodies of ``POST /v1/embeddings``
and TEI's ``POST /embed`` skip FastAPI, others go its way; either way the answer (status,
body, headers of interest) is the one the app gives without the fast path."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from gateway.app import Guard, create_app
from gateway.openai_api import FAST_EMBEDDINGS, EmbeddingRequest
from gateway.tei_api import FAST_EMBED, TeiEmbedRequest
from kembed_shared.settings import KafkaClientSettings
from tests.support.sdk import MODEL, FakeClient
from tests.unit.gateway.test_gateway import gateway_settings

JSON = "application/json"
OPENAI_BODIES: list[tuple[str, Any]] = [
    (JSON, {"model": MODEL, "input": "a text"}),
    (JSON, {"model": MODEL, "input": ["a", "b c"], "encoding_format": "base64"}),
    (JSON, {"model": MODEL, "input": ["a"], "dimensions": 4, "user": "u-1"}),
    ("application/vnd.api+json", {"model": MODEL, "input": "a"}),
    (JSON, {"model": MODEL, "input": []}),
    (JSON, {"model": "no-such-model", "input": "a"}),
    (JSON, {"model": MODEL, "input": [1, 2]}),
    (JSON, {"model": MODEL, "input": "a", "dimensions": True}),
    (JSON, {"model": MODEL, "input": "a", "dimensions": 0}),
    (JSON, {"model": MODEL, "input": "a", "dimensions": 4.0}),
    (JSON, {"model": MODEL, "input": "a", "encoding_format": "bits"}),
    (JSON, {"model": MODEL, "input": "a", "encoding_format": None}),
    (JSON, {"input": "a"}),
    (JSON, [{"model": MODEL, "input": "a"}]),
    ("text/plain", {"model": MODEL, "input": "a"}),
    (JSON, b'{"model": "x", "input": '),
    (JSON, b'{"model": "x", "input": "\xff"}'),
]
TEI_BODIES: list[tuple[str, Any]] = [
    (JSON, {"inputs": "a text"}),
    (JSON, {"inputs": ["a", "b"], "normalize": False, "truncate": True}),
    (JSON, {"inputs": "a", "truncation_direction": "Left", "prompt_name": "query"}),
    (JSON, {"inputs": "a", "dimensions": 3}),
    (JSON, {"inputs": []}),
    (JSON, {"inputs": "a", "truncation_direction": "middle"}),
    (JSON, {"inputs": "a", "normalize": 1}),
    (JSON, {"inputs": [[1, 2]]}),
    (JSON, {}),
]


@asynccontextmanager
async def app_client(fast: bool) -> AsyncIterator[httpx.AsyncClient]:
    FakeClient.made.clear()
    app = create_app(
        gateway_settings(),
        KafkaClientSettings.model_validate({"bootstrap_servers": "kafka:9092"}),
        client_factory=FakeClient,
    )
    if not fast:  # before the middleware stack is built, at the first request
        (guard,) = [m for m in app.user_middleware if m.cls is Guard]  # type: ignore[comparison-overlap]
        guard.kwargs["fast"] = {}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield http


async def answers(fast: bool, path: str, bodies: list[tuple[str, Any]]) -> list[Any]:
    out = []
    async with app_client(fast) as http:
        for content_type, body in bodies:
            raw = body if isinstance(body, bytes) else httpx.Request("POST", "/", json=body).content
            answer = await http.post(path, content=raw, headers={"content-type": content_type})
            out.append((answer.status_code, answer.headers.get("content-type"), answer.content))
    return out


@pytest.mark.parametrize(
    ("path", "bodies"), [("/v1/embeddings", OPENAI_BODIES), ("/embed", TEI_BODIES)]
)
async def test_the_fast_path_answers_as_the_app_does_without_it(
    path: str, bodies: list[tuple[str, Any]]
) -> None:
    with_fast, without = await answers(True, path, bodies), await answers(False, path, bodies)
    for (content_type, body), fast, slow in zip(bodies, with_fast, without, strict=True):
        assert fast == slow, (content_type, body)
    assert {status for status, _, _ in with_fast} >= {200, 400 if path != "/embed" else 422}


def test_only_plain_bodies_take_the_fast_path() -> None:
    """Plain bodies become the route's model as pydantic would make it; anything pydantic
    would coerce, refuse or word an error about is left to it."""
    for content_type, body in OPENAI_BODIES[:4]:
        raw = httpx.Request("POST", "/", json=body).content
        parsed = FAST_EMBEDDINGS.parse(raw, content_type)
        assert parsed == EmbeddingRequest.model_validate(body)
    for content_type, body in OPENAI_BODIES[6:]:
        raw = body if isinstance(body, bytes) else httpx.Request("POST", "/", json=body).content
        assert FAST_EMBEDDINGS.parse(raw, content_type) is None, body
    for content_type, body in TEI_BODIES[:4]:
        raw = httpx.Request("POST", "/", json=body).content
        assert FAST_EMBED.parse(raw, content_type) == TeiEmbedRequest.model_validate(body)
    for content_type, body in TEI_BODIES[5:]:
        raw = httpx.Request("POST", "/", json=body).content
        assert FAST_EMBED.parse(raw, content_type) is None, body
