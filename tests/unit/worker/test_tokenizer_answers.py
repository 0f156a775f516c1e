"""Tokenize and decode requests answered from the served model's tokenizer
(``worker.tokenizer_answers``), held to Hugging Face transformers' tokenizer of the same
model directory: the same ids (untruncated), token texts at TEI's UTF-8 byte offsets, the
same decoded texts; and the errors a caller can act on."""

from __future__ import annotations

from typing import Any, cast

import pytest

from schemas import (
    DecodeRequest,
    DecodeResult,
    ErrorResult,
    TokenizeRequest,
    TokenizeResult,
    decode_result,
)
from worker.encoder.models import resolve_model_dir
from worker.served import ServedModel
from worker.tokenization import TextTokenizer
from worker.tokenizer_answers import answer_tokenizer

TEXTS = ["Héllo wörld, how are you?", "Kafka 日本語 ok", "plain ascii text"]
LONG = " ".join(["tokens"] * 600)  # far over the model's 256


@pytest.fixture(scope="module")
def model() -> ServedModel:
    directory = resolve_model_dir("sentence-transformers/all-MiniLM-L6-v2")
    tokenizer = TextTokenizer.from_model_dir(directory, 256)
    # The encoder plays no part in these answers.
    return ServedModel("minilm", cast(Any, None), tokenizer, prompts={"query": "query: "})


@pytest.fixture(scope="module")
def reference() -> Any:
    from transformers import AutoTokenizer

    directory = resolve_model_dir("sentence-transformers/all-MiniLM-L6-v2")
    return AutoTokenizer.from_pretrained(str(directory))


def tokenized(model: ServedModel, request: TokenizeRequest) -> TokenizeResult:
    value, outcome = answer_tokenizer(request, model, 1 << 20, 123)
    result = decode_result(value)
    assert isinstance(result, TokenizeResult), result
    assert outcome == "ok"
    return result


def test_tokens_are_transformers_ids_with_texts_at_byte_offsets(
    model: ServedModel, reference: Any
) -> None:
    result = tokenized(model, TokenizeRequest("r", (*TEXTS, LONG)))
    assert (result.model, result.requested_ms) == ("minilm", 123)
    for text, tokens in zip((*TEXTS, LONG), result.tokens, strict=True):
        assert [t[0] for t in tokens] == reference(text)["input_ids"]  # not truncated
        raw = text.encode("utf-8")
        for token_id, piece, special, start, stop in tokens:
            if special:
                assert (start, stop) == (None, None)
                assert piece == reference.convert_ids_to_tokens(token_id)
            else:
                assert start is not None
                assert stop is not None
                assert raw[start:stop].decode("utf-8") == piece
    assert len(result.tokens[-1]) == 1202  # "token" "s" 600 times, [CLS], [SEP]: over 256


def test_without_special_tokens_and_with_a_prompt(model: ServedModel, reference: Any) -> None:
    plain = tokenized(model, TokenizeRequest("r", ("a query",), add_special_tokens=False))
    assert [t[0] for t in plain.tokens[0]] == reference("a query", add_special_tokens=False)[
        "input_ids"
    ]
    assert not any(t[2] for t in plain.tokens[0])
    prompted = tokenized(model, TokenizeRequest("r", ("a query",), prompt_name="query"))
    assert [t[0] for t in prompted.tokens[0]] == reference("query: a query")["input_ids"]
    assert prompted.tokens[0][1][1:] == ("query", False, 0, 5)  # offsets count the prompt


def test_decode_is_transformers_decode(model: ServedModel, reference: Any) -> None:
    ids = [reference(text)["input_ids"] for text in TEXTS]
    for skip in (True, False):
        value, outcome = answer_tokenizer(
            DecodeRequest("d", tuple(map(tuple, ids)), skip_special_tokens=skip),
            model,
            1 << 20,
            None,
        )
        result = decode_result(value)
        assert isinstance(result, DecodeResult), result
        assert outcome == "ok"
        assert list(result.texts) == [reference.decode(i, skip_special_tokens=skip) for i in ids]


def test_an_id_outside_the_vocabulary_is_an_invalid_request_naming_its_sequence(
    model: ServedModel,
) -> None:
    vocab = model.tokenizer.vocab_size
    request = DecodeRequest("d", ((101, 102), (5, vocab)), meta={"k": 1})
    value, outcome = answer_tokenizer(request, model, 1 << 20, None)
    result = decode_result(value)
    assert isinstance(result, ErrorResult)
    assert (outcome, result.error.code, result.error.index) == ("invalid_request",) * 2 + (1,)
    assert str(vocab) in result.error.message
    assert result.meta == {"k": 1}


def test_a_result_over_max_result_bytes_is_result_too_large(model: ServedModel) -> None:
    value, outcome = answer_tokenizer(TokenizeRequest("r", (LONG,)), model, 1000, None)
    result = decode_result(value)
    assert isinstance(result, ErrorResult)
    assert outcome == result.error.code == "result_too_large"
    assert "max_result_bytes 1000" in result.error.message
