"""What each call expects back: the result type of its request, the model kind that answers
it, and the errors a caller gets for anything else (an error result, another kind of
result, a model of another kind)."""

from __future__ import annotations

from typing import TypeVar

from producer_sdk.catalog import CatalogModel, ModelRouter
from producer_sdk.errors import EmbedError, UnexpectedResultError
from schemas import (
    DecodeRequest,
    DecodeResult,
    EmbedResult,
    ErrorResult,
    Kind,
    Request,
    RerankRequest,
    RerankResult,
    Result,
    SparseResult,
    TokenizeResult,
)

__all__ = ["KIND_OF", "R", "check_kind", "expected_result", "kind_error"]

R = TypeVar("R", EmbedResult, RerankResult, SparseResult, TokenizeResult, DecodeResult)
KIND_OF: dict[type, str] = {
    EmbedResult: Kind.EMBED,
    RerankResult: Kind.RERANK,
    SparseResult: Kind.SPARSE,
}
"""The catalog ``kind`` of the models that answer a call expecting this result (any model
answers tokenize and decode)."""
_WHAT: dict[type, str] = {
    EmbedResult: "vectors",
    RerankResult: "relevance scores (a rerank result)",
    SparseResult: "term weights (a sparse result)",
    TokenizeResult: "tokens (a tokenize result)",
    DecodeResult: "texts (a decode result)",
}
_ITEM: dict[type, str] = {RerankRequest: "document", DecodeRequest: "sequence"}
"""What an error's ``index`` names, by request (default: an input)."""
_MODEL_KINDS: dict[str, str] = {
    Kind.EMBED: "an embedding model",
    Kind.RERANK: "a reranker (a cross-encoder)",
    Kind.SPARSE: "a sparse encoder (SPLADE-style)",
}
_USE: dict[str, str] = {
    Kind.EMBED: "call embed(), not rerank()",
    Kind.RERANK: "call rerank(), not embed()",
    Kind.SPARSE: "call embed_sparse()",
}


def expected_result(request: Request, result: Result, expected: type[R]) -> R:
    """``result`` when it is an ``expected``; EmbedError (with the wire code) for an error
    result, UnexpectedResultError for another kind of result."""
    if isinstance(result, ErrorResult):
        raise EmbedError(
            str(result.error.code),
            result.error.message,
            index=result.error.index,
            request_id=result.id,
            item=_ITEM.get(type(request), "input"),
        )
    if not isinstance(result, expected):
        raise UnexpectedResultError(request.id, _WHAT[expected], _WHAT[type(result)])
    return result


def kind_error(entry: CatalogModel, kind: str, request_id: str) -> EmbedError | None:
    """``invalid_request`` when the catalog's ``entry`` is not of ``kind``."""
    if entry.kind == kind:
        return None
    return EmbedError(
        "invalid_request",
        f"the model {entry.name!r} is {_MODEL_KINDS.get(entry.kind, entry.kind)} "
        f"(kind {entry.kind!r}): {_USE.get(entry.kind, 'use another model')}",
        request_id=request_id,
    )


async def check_kind(router: ModelRouter, request: Request, kind: str) -> None:
    """``invalid_request`` at once when the catalog says the model named is of another
    kind (a reranker asked for vectors, an embedding model for scores); nothing is
    checked for a model pinned by ``model_topics`` or without a catalog."""
    model = request.model
    if model is None or router.pinned(model):
        return
    entry = await router.find(model)
    error = None if entry is None else kind_error(entry, kind, request.id)
    if error is not None:
        raise error
