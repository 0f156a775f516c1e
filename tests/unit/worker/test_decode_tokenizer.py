"""worker.decode for tokenize and decode requests: any model answers them (a reranker
too), and they meet the limits every request meets, with their own fields checked."""

from __future__ import annotations

from schemas import DecodeRequest, ErrorCode, Kind, TokenizeRequest, encode_request
from tests.unit.worker.test_decode import LIMITS, NOW_MS, decode, record, rejected
from worker.decode import Accepted, Limits, ModelLimits, decode_record

RERANKER = ModelLimits("reranker", 1, kind=Kind.RERANK)
WITH_RERANKER = Limits(
    max_request_bytes=4096,
    max_client_batch_size=4,
    models={**LIMITS.models, "reranker": RERANKER},
    max_input_chars=20,
)


def test_a_text_over_max_input_chars_is_input_too_long() -> None:
    request = TokenizeRequest("t", ("short", "x" * 21))
    result = rejected(decode_record(record(encode_request(request)), WITH_RERANKER, NOW_MS))
    assert (result.error.code, result.error.index) == (ErrorCode.INPUT_TOO_LONG, 1)


def test_tokenize_and_decode_requests_are_accepted_by_any_kind_of_model() -> None:
    for model in ("minilm", "reranker"):
        for request in (
            TokenizeRequest("t", ("a text",), model=model, add_special_tokens=False),
            DecodeRequest("d", ((1, 2), ()), model=model, skip_special_tokens=False),
        ):
            result = decode_record(record(encode_request(request)), WITH_RERANKER, NOW_MS)
            assert isinstance(result, Accepted), result
            assert result.request == request
            assert result.model == model


def test_their_limits_and_fields_are_checked() -> None:
    too_many = rejected(decode(encode_request(DecodeRequest("d", ((1,),) * 5))))
    assert too_many.error.code == ErrorCode.TOO_MANY_INPUTS
    assert "5 sequences" in too_many.error.message
    unknown = rejected(decode(encode_request(TokenizeRequest("t", ("a",), prompt_name="x"))))
    assert unknown.error.code == ErrorCode.INVALID_REQUEST
    assert "prompt_name" in unknown.error.message
    assert "passage, query" in unknown.error.message
    late = TokenizeRequest("t", ("a",), deadline_ms=NOW_MS - 1)
    assert rejected(decode(encode_request(late))).error.code == ErrorCode.DEADLINE_EXCEEDED
    missing = rejected(decode(encode_request(DecodeRequest("d", ((1,),), model="other"))))
    assert missing.error.code == ErrorCode.UNKNOWN_MODEL
