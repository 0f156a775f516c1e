"""The SDK's character cap (``ClientConfig.max_input_chars``): a text over it raises
InputTooLongError before anything is sent, naming the input, document or query; chunked
inputs have no cap; the default is the workers'."""

from __future__ import annotations

from typing import Any

import pytest

from producer_sdk import ClientConfig, InputTooLongError
from schemas import DEFAULT_MAX_INPUT_CHARS, Chunking
from tests.unit.producer_sdk.test_sdk_rerank import offline, vectors_result
from worker.settings import WorkerSettings

LIMIT = 20


def test_the_default_is_the_workers() -> None:
    assert ClientConfig("k:9092").max_input_chars == DEFAULT_MAX_INPUT_CHARS
    assert WorkerSettings.model_fields["max_input_chars"].default == DEFAULT_MAX_INPUT_CHARS
    with pytest.raises(ValueError, match="max_input_chars"):
        ClientConfig("k:9092", max_input_chars=0)


@pytest.mark.parametrize(
    ("query", "documents", "index", "item"),
    [
        ("q" * (LIMIT + 1), ["d"], None, "query"),
        ("q", ["d", "e", "x" * (LIMIT + 1)], 2, "document"),
    ],
)
async def test_a_long_query_or_document_is_refused_before_sending(
    query: str, documents: list[str], index: int | None, item: str
) -> None:
    client, transport = offline(max_input_chars=LIMIT)
    with pytest.raises(InputTooLongError) as caught:
        await client.rerank(query, documents)
    assert (caught.value.index, caught.value.item) == (index, item)
    assert (caught.value.length, caught.value.limit) == (LIMIT + 1, LIMIT)
    what = "the query" if index is None else f"document {index}"
    assert str(caught.value).startswith(f"{what} has 21 characters, above max_input_chars (20)")
    assert transport.sent == []
    await client.rerank("q" * LIMIT, ["d" * LIMIT])  # at the limit: sent
    assert len(transport.sent) == 1


async def test_a_long_input_is_refused_unless_chunked() -> None:
    answer: Any = vectors_result
    client, transport = offline(answer, max_input_chars=LIMIT)
    texts = ["short", "y" * (LIMIT + 1)]
    with pytest.raises(InputTooLongError) as caught:
        await client.embed(texts)
    assert (caught.value.index, caught.value.item) == (1, "input")
    with pytest.raises(InputTooLongError):
        await client.submit(texts)
    assert isinstance(caught.value, ValueError)
    assert transport.sent == []
    await client.submit(texts, chunking=Chunking(16))  # chunks use all of a text
    assert len(transport.sent) == 1
