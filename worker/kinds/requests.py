"""What the worker asks of any request, whatever its kind: how many inputs it puts in flight,
its keys, its kind, and the error for a request sent to a model of another kind. Imports the
wire format only, so decoding can use it without the kinds' machinery."""

from __future__ import annotations

from schemas import (
    DecodeRequest,
    EmbedRequest,
    ErrorCode,
    ErrorInfo,
    Kind,
    Request,
    RerankRequest,
    SparseRequest,
    TokenizeRequest,
)

__all__ = ["input_count", "request_keys", "request_kind", "wrong_kind"]


def request_kind(request: Request) -> str:
    """The request's ``kind``: a model kind, or ``tokenize``/``decode`` (any model's)."""
    if isinstance(request, TokenizeRequest):
        return "tokenize"
    if isinstance(request, DecodeRequest):
        return "decode"
    if isinstance(request, SparseRequest):
        return Kind.SPARSE
    return Kind.RERANK if isinstance(request, RerankRequest) else Kind.EMBED


def input_count(request: Request) -> int:
    """The inputs a request puts in flight: its texts, its documents (pairs), or its
    sequences of ids."""
    if isinstance(request, RerankRequest):
        return len(request.documents)
    if isinstance(request, DecodeRequest):
        return len(request.ids)
    return len(request.inputs)


def request_keys(request: Request) -> tuple[str | int, ...] | None:
    """The caller's ids for the inputs (embed and sparse requests may carry them)."""
    return request.keys if isinstance(request, EmbedRequest | SparseRequest) else None


def wrong_kind(model: str, kind: str) -> ErrorInfo:
    """The ``invalid_request`` for a request of the other kind than ``model``'s."""
    if kind == Kind.RERANK:
        message = f"model {model} is a reranker (kind rerank): send rerank requests"
    elif kind == Kind.SPARSE:
        message = f"model {model} is a sparse encoder (kind sparse): send sparse requests"
    else:
        message = f"model {model} is an embedding model (kind embed): send embed requests"
    return ErrorInfo(ErrorCode.INVALID_REQUEST, message)
