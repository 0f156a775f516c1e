"""Tokenize and decode calls: the tokens a served model's tokenizer makes of texts, and the
texts of token ids, answered by a worker from the tokenizer alone (no encoding).

    tokenized = await client.tokenize(["a text"])  # .tokens: [[Token(101, '[CLS]', ...), ...]]
    decoded = await client.decode([[7592, 2088]])  # .texts: ['hello world']
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from producer_sdk.errors import UnexpectedResultError
from producer_sdk.options import check_lengths, check_texts
from schemas import DecodeRequest, DecodeResult, TokenizeRequest, TokenizeResult

__all__ = [
    "Decoding",
    "Token",
    "Tokenization",
    "decode_request",
    "texts_of",
    "tokenize_request",
    "tokens_of",
]


class Token(NamedTuple):
    """One token, as TEI's ``/tokenize`` gives it: ``start``/``stop`` are its UTF-8 byte
    offsets in the text as tokenized (the prompt first, when one was named); None for a
    special token, whose ``text`` is the token itself."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


@dataclass(frozen=True, slots=True)
class Tokenization:
    """What :meth:`~producer_sdk.EmbedClient.tokenize` answers: per text, its tokens."""

    model: str
    """The served name of the model whose tokenizer answered."""
    tokens: list[list[Token]]


@dataclass(frozen=True, slots=True)
class Decoding:
    """What :meth:`~producer_sdk.EmbedClient.decode` answers: per sequence, its text."""

    model: str
    texts: list[str]


def tokenize_request(
    texts: Sequence[str],
    model: str | None,
    add_special_tokens: bool,
    prompt_name: str | None,
    max_input_chars: int,
) -> TokenizeRequest:
    check_texts(texts)
    if any(not text for text in texts):
        raise ValueError("texts must not be empty strings")
    check_lengths(texts, max_input_chars)
    return TokenizeRequest(
        uuid.uuid4().hex, tuple(texts), model, add_special_tokens, prompt_name or None
    )


def decode_request(
    ids: Sequence[Sequence[int]], model: str | None, skip_special_tokens: bool
) -> DecodeRequest:
    if not ids:
        raise ValueError("ids must be a non-empty sequence of sequences of token ids")
    sequences = []
    for sequence in ids:
        if isinstance(sequence, str | bytes) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in sequence
        ):
            raise TypeError("each sequence of ids must hold integers >= 0")
        sequences.append(tuple(int(i) for i in sequence))
    return DecodeRequest(uuid.uuid4().hex, tuple(sequences), model, skip_special_tokens)


def tokens_of(request: TokenizeRequest, result: TokenizeResult) -> Tokenization:
    if result.count != len(request.inputs):
        raise UnexpectedResultError(
            request.id, f"tokens of {len(request.inputs)} texts", f"tokens of {result.count}"
        )
    return Tokenization(result.model, [[Token(*token) for token in ts] for ts in result.tokens])


def texts_of(request: DecodeRequest, result: DecodeResult) -> Decoding:
    if result.count != len(request.ids):
        raise UnexpectedResultError(
            request.id, f"{len(request.ids)} texts", f"{result.count} texts"
        )
    return Decoding(result.model, list(result.texts))
