"""Tokenize and decode requests (``kind`` ``tokenize``/``decode``): answered from the
model's tokenizer alone, never batched or encoded. Tokens come untruncated, as TEI's
``/tokenize`` gives them, so a caller sees how far over the model's limit a text is."""

from __future__ import annotations

from schemas import (
    DecodeRequest,
    DecodeResult,
    ErrorCode,
    ErrorInfo,
    TokenizeRequest,
    TokenizeResult,
    TokenizerRequest,
    encode_result,
)
from worker.publish import encode_error, within_limit
from worker.served import ServedModel

__all__ = ["answer_tokenizer", "tokenizer_chars"]


def tokenizer_chars(request: TokenizerRequest) -> int:
    """About how much work ``request`` is, in characters (ids count as a few each)."""
    if isinstance(request, TokenizeRequest):
        return sum(map(len, request.inputs))
    return 4 * sum(map(len, request.ids))


def answer_tokenizer(
    request: TokenizerRequest, model: ServedModel, max_bytes: int, requested_ms: int | None
) -> tuple[bytes, str]:
    """The result message of ``request`` (or its error result), and its outcome for the
    metrics (``ok`` or the error code)."""
    tokenizer = model.tokenizer
    if isinstance(request, TokenizeRequest):
        prompt = model.prompts[request.prompt_name] if request.prompt_name else ""
        texts = [prompt + text for text in request.inputs]
        tokens = tokenizer.tokens(texts, request.add_special_tokens)
        value = encode_result(
            TokenizeResult(request.id, model.name, tuple(tokens), requested_ms, request.meta)
        )
    else:
        error = _unknown_id(request, tokenizer.vocab_size)
        if error is not None:
            return encode_error(request.id, error, None, request.meta), str(error.code)
        texts = tokenizer.decode(request.ids, request.skip_special_tokens)
        value = encode_result(
            DecodeResult(request.id, model.name, tuple(texts), requested_ms, request.meta)
        )
    advice = (
        "send fewer or shorter texts"
        if isinstance(request, TokenizeRequest)
        else ("send fewer ids")
    )
    answer = within_limit(value, max_bytes, advice, request.id, None, request.meta)
    return answer, "ok" if answer is value else str(ErrorCode.RESULT_TOO_LARGE)


def _unknown_id(request: DecodeRequest, vocab_size: int) -> ErrorInfo | None:
    for index, ids in enumerate(request.ids):
        bad = next((i for i in ids if i >= vocab_size), None)
        if bad is not None:
            return ErrorInfo(
                ErrorCode.INVALID_REQUEST,
                f"token id {bad} is not in the model's vocabulary (ids 0..{vocab_size - 1})",
                index,
            )
    return None
