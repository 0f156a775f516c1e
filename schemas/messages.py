"""The requests and results of the kinds other than embed (``rerank``, ``tokenize``,
``decode``) as maps: what :mod:`schemas.codec` packs, and what it hands over to read once
it has seen the ``kind``. Their layout is in ``schemas/README.md`` ("Reranking",
"Tokenize and decode")."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from schemas.fields import (
    binary,
    boolean,
    check_docs,
    direction,
    fail,
    flag,
    ids_lists,
    input_keys,
    inputs_list,
    int_list,
    keys_list,
    meta_map,
    non_empty,
    non_negative,
    optional,
    positive,
    put,
    required,
    str_list,
    string,
    tokens_lists,
    topic_name,
)
from schemas.kinds import Kind
from schemas.v1 import (
    VERSION,
    DecodeRequest,
    DecodeResult,
    RerankRequest,
    RerankResult,
    SparseRequest,
    SparseResult,
    TokenizeRequest,
    TokenizeResult,
    TokenizerRequest,
)

__all__ = [
    "rerank_request",
    "rerank_request_body",
    "rerank_result",
    "rerank_result_body",
    "sparse_request",
    "sparse_request_body",
    "sparse_result",
    "sparse_result_body",
    "tokenizer_request",
    "tokenizer_request_body",
    "tokenizer_result",
    "tokenizer_result_body",
]

TokenizerResult = TokenizeResult | DecodeResult


def tokenizer_request_body(request: TokenizerRequest) -> dict[str, Any]:
    """The request's map, keys in the canonical order, defaults left out."""
    body: dict[str, Any] = {"v": VERSION, "id": request.id}
    if isinstance(request, TokenizeRequest):
        body["kind"] = "tokenize"
        body["inputs"] = list(request.inputs)
        put(body, "model", request.model)
        if not request.add_special_tokens:
            body["add_special_tokens"] = False
        put(body, "prompt_name", request.prompt_name)
    else:
        body["kind"] = "decode"
        body["ids"] = [list(sequence) for sequence in request.ids]
        put(body, "model", request.model)
        if not request.skip_special_tokens:
            body["skip_special_tokens"] = False
    return _with_routing(body, request)


def tokenizer_result_body(result: TokenizerResult) -> dict[str, Any]:
    body: dict[str, Any] = {"v": VERSION, "id": result.id}
    body["kind"] = "tokenize" if isinstance(result, TokenizeResult) else "decode"
    body["model"] = result.model
    if isinstance(result, TokenizeResult):
        body["tokens"] = [[list(token) for token in tokens] for tokens in result.tokens]
    else:
        body["texts"] = list(result.texts)
    put(body, "requested_ms", result.requested_ms)
    put(body, "meta", result.meta)
    return body


def tokenizer_request(body: dict[str, Any], kind: str, request_id: str) -> TokenizerRequest:
    """The request of ``kind`` (``tokenize`` or ``decode``) in ``body``, whose version and
    id are checked; raises SchemaError for a field that is not valid."""
    routing = _routing(body)
    if kind == "tokenize":
        return TokenizeRequest(
            id=request_id,
            inputs=required(body, "inputs", inputs_list),
            model=optional(body, "model", non_empty),
            add_special_tokens=flag(body, "add_special_tokens"),
            prompt_name=optional(body, "prompt_name", non_empty),
            **routing,
        )
    return DecodeRequest(
        id=request_id,
        ids=required(body, "ids", ids_lists),
        model=optional(body, "model", non_empty),
        skip_special_tokens=flag(body, "skip_special_tokens"),
        **routing,
    )


def tokenizer_result(
    body: dict[str, Any], kind: str, result_id: str, meta: dict[str, Any] | None
) -> TokenizerResult:
    model = required(body, "model", string)
    requested_ms = optional(body, "requested_ms", non_negative)
    if kind == "tokenize":
        tokens = required(body, "tokens", tokens_lists)
        return TokenizeResult(result_id, model, tokens, requested_ms, meta)
    texts = tuple(required(body, "texts", str_list))
    return DecodeResult(result_id, model, texts, requested_ms, meta)


def rerank_request_body(request: RerankRequest) -> dict[str, Any]:
    body: dict[str, Any] = {
        "v": VERSION,
        "id": request.id,
        "kind": Kind.RERANK.value,
        "query": request.query,
        "documents": list(request.documents),
    }
    put(body, "model", request.model)
    put(body, "top_n", request.top_n)
    if request.return_documents:
        body["return_documents"] = True
    if request.raw_scores:
        body["raw_scores"] = True
    if not request.truncate:
        body["truncate"] = False
    put(body, "truncation_direction", request.truncation_direction)
    return _with_routing(body, request)


def rerank_result_body(result: RerankResult) -> dict[str, Any]:
    body: dict[str, Any] = {"v": VERSION, "id": result.id, "kind": Kind.RERANK.value}
    body["model"] = result.model
    body["scores"] = result.scores
    body["order"] = list(result.order)
    body["tokens"] = list(result.tokens)
    put(body, "documents", None if result.documents is None else list(result.documents))
    put(body, "requested_ms", result.requested_ms)
    put(body, "meta", result.meta)
    return body


def rerank_request(body: dict[str, Any], request_id: str) -> RerankRequest:
    return RerankRequest(
        id=request_id,
        query=required(body, "query", non_empty),
        documents=required(body, "documents", inputs_list),
        model=optional(body, "model", non_empty),
        top_n=optional(body, "top_n", positive),
        return_documents=optional(body, "return_documents", boolean) or False,
        raw_scores=optional(body, "raw_scores", boolean) or False,
        truncate=flag(body, "truncate"),
        truncation_direction=optional(body, "truncation_direction", direction),
        **_routing(body),
    )


def rerank_result(body: dict[str, Any], result_id: str, meta: Any) -> RerankResult:
    scores = required(body, "scores", binary)
    tokens = tuple(required(body, "tokens", int_list))
    if len(scores) != 4 * len(tokens):
        fail(f"'scores' holds {len(scores)} bytes, expected {len(tokens)} float32")
    order = tuple(required(body, "order", int_list))
    if len(set(order)) != len(order) or any(not 0 <= i < len(tokens) for i in order):
        fail(f"'order' must hold distinct document indices in 0..{len(tokens) - 1}")
    documents = optional(body, "documents", str_list)
    if documents is not None and len(documents) != len(order):
        fail(f"'documents' has {len(documents)} entries for {len(order)} in 'order'")
    return RerankResult(
        id=result_id,
        model=required(body, "model", string),
        scores=scores,
        order=order,
        tokens=tokens,
        documents=documents,
        requested_ms=optional(body, "requested_ms", non_negative),
        meta=meta,
    )


def sparse_request_body(request: SparseRequest) -> dict[str, Any]:
    body: dict[str, Any] = {
        "v": VERSION,
        "id": request.id,
        "kind": Kind.SPARSE.value,
        "inputs": list(request.inputs),
    }
    put(body, "model", request.model)
    if not request.truncate:
        body["truncate"] = False
    put(body, "truncation_direction", request.truncation_direction)
    put(body, "prompt", request.prompt)
    put(body, "prompt_name", request.prompt_name)
    put(body, "top_k", request.top_k)
    put(body, "keys", None if request.keys is None else list(request.keys))
    return _with_routing(body, request)


def sparse_result_body(result: SparseResult) -> dict[str, Any]:
    body: dict[str, Any] = {"v": VERSION, "id": result.id, "kind": Kind.SPARSE.value}
    body["model"] = result.model
    body["vocab"] = result.vocab
    body["counts"] = list(result.counts)
    body["indices"] = result.indices
    body["values"] = result.values
    body["tokens"] = list(result.tokens)
    put(body, "requested_ms", result.requested_ms)
    put(body, "keys", None if result.keys is None else list(result.keys))
    put(body, "meta", result.meta)
    return body


def sparse_request(body: dict[str, Any], request_id: str) -> SparseRequest:
    prompt = optional(body, "prompt", string)
    prompt_name = optional(body, "prompt_name", non_empty)
    if prompt is not None and prompt_name is not None:
        fail("'prompt' and 'prompt_name' are exclusive: give the text or the name")
    inputs = required(body, "inputs", inputs_list)
    keys = input_keys(body, len(inputs))
    routing = _routing(body)
    check_docs(routing["meta"], len(inputs))
    return SparseRequest(
        id=request_id,
        inputs=inputs,
        model=optional(body, "model", non_empty),
        truncate=flag(body, "truncate"),
        truncation_direction=optional(body, "truncation_direction", direction),
        prompt=prompt,
        prompt_name=prompt_name,
        top_k=optional(body, "top_k", positive),
        keys=keys,
        **routing,
    )


def sparse_result(body: dict[str, Any], result_id: str, meta: Any) -> SparseResult:
    vocab = required(body, "vocab", positive)
    counts = tuple(required(body, "counts", int_list))
    tokens = tuple(required(body, "tokens", int_list))
    indices = required(body, "indices", binary)
    values = required(body, "values", binary)
    if len(counts) != len(tokens):
        fail(f"'counts' has {len(counts)} entries for {len(tokens)} in 'tokens'")
    total = sum(counts)
    if any(n < 0 or n > vocab for n in counts):
        fail(f"'counts' must each be in 0..{vocab}")
    if len(indices) != 4 * total or len(values) != 4 * total:
        fail(f"'indices' and 'values' must hold {total} uint32 and {total} float32")
    result = SparseResult(
        id=result_id,
        model=required(body, "model", string),
        vocab=vocab,
        counts=counts,
        indices=indices,
        values=values,
        tokens=tokens,
        requested_ms=optional(body, "requested_ms", non_negative),
        keys=optional(body, "keys", keys_list),
        meta=meta,
    )
    for ids, _ in result.rows():
        if any(a >= b for a, b in pairwise(ids)) or (len(ids) and ids[-1] >= vocab):
            fail(f"'indices' must ascend within each input and stay below 'vocab' {vocab}")
    return result


def _with_routing(
    body: dict[str, Any], request: RerankRequest | SparseRequest | TokenizerRequest
) -> dict[str, Any]:
    """``body`` with the keys every kind of request ends with: deadline, reply, meta."""
    put(body, "deadline_ms", request.deadline_ms)
    put(body, "reply_to", request.reply_to)
    put(body, "reply_partition", request.reply_partition)
    put(body, "meta", request.meta)
    return body


def _routing(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "deadline_ms": optional(body, "deadline_ms", non_negative),
        "reply_to": optional(body, "reply_to", topic_name),
        "reply_partition": optional(body, "reply_partition", non_negative),
        "meta": optional(body, "meta", meta_map),
    }
