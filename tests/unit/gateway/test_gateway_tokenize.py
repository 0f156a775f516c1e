"""TEI's ``POST /tokenize`` and ``POST /decode`` against the fake SDK client of test_gateway:
TEI's request and answer shapes, the model they ask for, and TEI-shaped errors. Against a
real broker and worker (the served model's own tokenizer): tests/integration/
test_gateway_tokenize.py."""

from __future__ import annotations

import pytest

from tests.support.sdk import MODEL
from tests.unit.gateway.test_gateway import served, tei_error


async def test_tokenize_answers_tei_tokens_for_one_text_or_several() -> None:
    """One text or a list: a list of token lists, each token TEI's ``{id, text, special,
    start, stop}`` (null offsets for special tokens); the options reach the SDK."""
    async with served(model=MODEL) as (http, fake):
        one = await http.post("/tokenize", json={"inputs": "hello big world"})
        several = await http.post(
            "/tokenize",
            json={"inputs": ["a b", "c"], "add_special_tokens": False, "prompt_name": "query"},
        )
    assert one.status_code == 200, one.text
    assert one.json() == [
        [
            {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None},
            {"id": 1005, "text": "hello", "special": False, "start": 0, "stop": 5},
            {"id": 1003, "text": "big", "special": False, "start": 6, "stop": 9},
            {"id": 1005, "text": "world", "special": False, "start": 10, "stop": 15},
            {"id": 102, "text": "[SEP]", "special": True, "start": None, "stop": None},
        ]
    ]
    assert several.status_code == 200, several.text
    assert [[t["text"] for t in tokens] for tokens in several.json()] == [["a", "b"], ["c"]]
    (texts, first), (_, second) = fake.calls
    assert texts == ["hello big world"]
    assert (first["model"], first["add_special_tokens"], first["prompt_name"]) == (
        MODEL,
        True,
        None,
    )
    assert (second["add_special_tokens"], second["prompt_name"]) == (False, "query")


async def test_decode_answers_one_text_per_sequence() -> None:
    """A list of ids is one sequence, a list of lists several (an empty list: one empty
    sequence, as in TEI); special tokens are skipped unless asked for."""
    async with served() as (http, fake):
        single = await http.post("/decode", json={"ids": [101, 7, 102]})
        batch = await http.post(
            "/decode", json={"ids": [[101, 7], [8, 9]], "skip_special_tokens": False}
        )
        empty = await http.post("/decode", json={"ids": []})
    assert single.status_code == 200, single.text
    assert single.json() == ["<7>"]
    assert batch.json() == ["<101> <7>", "<8> <9>"]
    assert empty.json() == [""]
    assert [call[1]["skip_special_tokens"] for call in fake.calls] == [True, False, True]


@pytest.mark.parametrize(
    ("path", "body", "status", "error_type"),
    [
        ("/tokenize", {"inputs": []}, 400, "Empty"),
        ("/tokenize", {"inputs": ["a", ""]}, 422, "Validation"),
        ("/tokenize", {"inputs": [1, 2]}, 422, "Validation"),
        ("/tokenize", {}, 422, "Validation"),
        ("/decode", {"ids": [-1]}, 422, "Validation"),
        ("/decode", {"ids": ["a"]}, 422, "Validation"),
        ("/decode", {"ids": [[1], 2]}, 422, "Validation"),
        ("/decode", {}, 422, "Validation"),
    ],
)
async def test_bad_tokenize_and_decode_bodies_get_tei_errors(
    path: str, body: dict[str, object], status: int, error_type: str
) -> None:
    async with served() as (http, fake):
        answer = await http.post(path, json=body)
    assert answer.status_code == status, answer.text
    assert tei_error(answer)["error_type"] == error_type
    assert not fake.calls  # refused before anything was sent


async def test_too_many_inputs_or_sequences_are_413() -> None:
    async with served(max_inputs=2) as (http, fake):
        texts = await http.post("/tokenize", json={"inputs": ["a", "b", "c"]})
        ids = await http.post("/decode", json={"ids": [[1], [2], [3]]})
    for answer in (texts, ids):
        assert answer.status_code == 413, answer.text
        assert tei_error(answer)["error_type"] == "Validation"
    assert not fake.calls
