"""``producer_sdk.testing``: code under test gets a real client whose requests are answered
in memory by a hook: vectors, scores, error results, exceptions, no answer."""

from __future__ import annotations

import re
import textwrap
from typing import Any

import numpy as np
import pytest

from producer_sdk import AuthorizationError, EmbedError, EmbedTimeoutError
from producer_sdk.testing import InMemoryTransport, answer_error, answer_scores, answer_vectors
from schemas import EmbedRequest, Request, RerankRequest, Result
from tests.conftest import ROOT
from tests.support.sdk import ALIAS, catalog_entry


def answer(request: Request) -> Result | BaseException | None:
    if isinstance(request, RerankRequest):
        return answer_scores(request, [float(len(d)) for d in request.documents])
    assert isinstance(request, EmbedRequest)
    if request.inputs[0] == "bad":
        return answer_error(request, "invalid_request", "not this one", index=0)
    if request.inputs[0] == "silent":
        return None
    if request.inputs[0] == "denied":
        return AuthorizationError("User:me", "write", "embed.requests")
    return answer_vectors(request, [[len(t), 1.0] for t in request.inputs])


async def test_a_real_client_is_answered_in_memory() -> None:
    transport = InMemoryTransport(answer)
    async with transport.client(model="m") as client:
        vectors = await client.embed(["a", "bbb"])
        assert vectors.dtype == np.float32
        assert vectors.tolist() == [[1.0, 1.0], [3.0, 1.0]]
        reranked = await client.rerank("q", ["x", "xyz"])
        assert reranked.order == (1, 0)
        with pytest.raises(EmbedError) as caught:
            await client.embed(["bad"])
        assert (caught.value.code, caught.value.index) == ("invalid_request", 0)
        with pytest.raises(EmbedTimeoutError):
            await client.embed(["silent"], timeout=0.05)
        with pytest.raises(AuthorizationError):
            await client.embed(["denied"])
        assert await client.submit(["s"], keys=[7], request_id="mine") == "mine"
    assert transport.started is False  # stopped on leaving the block
    sent = transport.sent
    assert len(sent) == 6
    first = sent[0].request
    assert isinstance(first, EmbedRequest)
    assert (first.inputs, first.model, sent[0].topic) == (("a", "bbb"), "m", "embed.requests")
    assert sent[0].headers["kafka_correlationId"] == first.id.encode()
    assert sent[-1].topic == "embed.requests.bulk"


def test_the_sync_client_over_it() -> None:
    with InMemoryTransport(answer).sync_client() as client:
        assert client.embed(["ab"]).tolist() == [[2.0, 1.0]]


async def test_an_unreadable_reply_topic_fails_the_waiting_calls() -> None:
    transport = InMemoryTransport()
    async with transport.client() as client:
        transport.fail_replies(AuthorizationError("User:me", "read", "embed.results"))
        with pytest.raises(AuthorizationError):
            await client.embed(["x"])


async def test_the_catalog_is_what_models_reads_and_routes_by() -> None:
    entry = catalog_entry()
    transport = InMemoryTransport(answer, catalog=[entry])
    async with transport.client() as client:
        assert await client.models() == [entry]
        await client.embed(["a"], model=ALIAS)
    assert transport.sent[0].topic == entry.requests_topic
    async with InMemoryTransport().client() as client:
        with pytest.raises(ValueError, match="no catalog topic"):
            await client.models()


def readme_example() -> str:
    """The code block of README.md's section on ``producer_sdk.testing``."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Testing your code: `producer_sdk.testing`", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None
    return match.group(1)


async def test_the_readme_example_runs_as_written() -> None:
    namespace: dict[str, Any] = {}
    body = textwrap.indent(readme_example(), "    ")
    exec(f"async def example():\n{body}    return vectors\n", namespace)
    vectors = await namespace["example"]()
    assert vectors.dtype == np.float32
    assert vectors.tolist() == [[np.float32(0.6), np.float32(0.8)]]
