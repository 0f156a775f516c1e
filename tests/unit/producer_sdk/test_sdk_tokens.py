"""``EmbedClient.tokenize`` and ``decode`` (and the blocking client's) over the in-memory
transport: the requests they send, what they return, and the errors a caller gets."""

from __future__ import annotations

import pytest

from producer_sdk import (
    EmbedError,
    InputTooLongError,
    SyncEmbedClient,
    Token,
    UnexpectedResultError,
)
from producer_sdk.testing import InMemoryTransport, answer_error
from schemas import (
    DecodeRequest,
    DecodeResult,
    Request,
    Result,
    TokenizeRequest,
    TokenizeResult,
)
from tests.support.sdk import offline


def answer(request: Request) -> Result:
    """Tokens: one per word (its byte offsets); texts: the ids joined."""
    if isinstance(request, TokenizeRequest):
        tokens = tuple(
            tuple((len(w), w, False, 0, len(w.encode())) for w in text.split())
            for text in request.inputs
        )
        return TokenizeResult(request.id, "m", tokens)
    if isinstance(request, DecodeRequest):
        if any(7 in ids for ids in request.ids):
            return answer_error(request, "invalid_request", "id 7 is not known", index=1)
        return DecodeResult(request.id, "m", tuple(" ".join(map(str, i)) for i in request.ids))
    return DecodeResult(request.id, "m", ("not what was asked",))


async def test_tokenize_sends_its_options_and_returns_tokens() -> None:
    client, transport = offline(answer, model="default-model")
    tokenized = await client.tokenize(["a bc", "dé"], add_special_tokens=False, prompt_name="q")
    assert tokenized.model == "m"
    assert tokenized.tokens == [
        [Token(1, "a", False, 0, 1), Token(2, "bc", False, 0, 2)],
        [Token(2, "dé", False, 0, 3)],
    ]
    (sent,) = transport.sent
    request = sent.request
    assert isinstance(request, TokenizeRequest)
    assert request.inputs == ("a bc", "dé")
    assert (request.model, request.add_special_tokens, request.prompt_name) == (
        "default-model",
        False,
        "q",
    )
    assert request.deadline_ms is not None
    assert request.reply_partition == 5


async def test_decode_returns_one_text_per_sequence_and_names_a_bad_one() -> None:
    client, transport = offline(answer)
    decoded = await client.decode([[1, 2], []], model="other", skip_special_tokens=False)
    assert decoded.texts == ["1 2", ""]
    request = transport.sent[0].request
    assert isinstance(request, DecodeRequest)
    assert (request.ids, request.model, request.skip_special_tokens) == (
        ((1, 2), ()),
        "other",
        False,
    )
    with pytest.raises(EmbedError) as caught:
        await client.decode([[1], [7]])
    assert (caught.value.code, caught.value.index) == ("invalid_request", 1)
    assert "sequence 1" in str(caught.value)


async def test_bad_arguments_are_refused_before_sending() -> None:
    client, transport = offline(answer, max_input_chars=5)
    with pytest.raises(ValueError, match="empty"):
        await client.tokenize([])
    with pytest.raises(ValueError, match="empty strings"):
        await client.tokenize(["a", ""])
    with pytest.raises(TypeError):
        await client.tokenize("not a list")
    with pytest.raises(InputTooLongError):
        await client.tokenize(["123456"])
    with pytest.raises(ValueError, match="non-empty"):
        await client.decode([])
    with pytest.raises(TypeError):
        await client.decode([[1, -2]])
    with pytest.raises(TypeError):
        await client.decode([[True]])
    assert not transport.sent


async def test_an_answer_of_another_kind_is_unexpected() -> None:
    client, _ = offline(lambda request: DecodeResult(request.id, "m", ("x",)))
    with pytest.raises(UnexpectedResultError, match="tokens"):
        await client.tokenize(["a"])
    client, _ = offline(lambda request: DecodeResult(request.id, "m", ("x",)))
    with pytest.raises(UnexpectedResultError, match="2 texts"):
        await client.decode([[1], [2]])


def test_the_blocking_client_tokenizes_and_decodes() -> None:
    transport = InMemoryTransport(answer)
    with SyncEmbedClient._wrapping(lambda: transport.client()) as client:
        assert client.tokenize(["x y"]).tokens == [
            [Token(1, "x", False, 0, 1), Token(1, "y", False, 0, 1)]
        ]
        assert client.decode([[3]]).texts == ["3"]
