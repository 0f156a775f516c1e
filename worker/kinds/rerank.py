"""The rerank kind: (query, document) pairs with their token types become scores.

A cross-encoder (sentence-transformers' ``CrossEncoder`` layout: a Hugging Face sequence
classifier with one label) scores (query, document) pairs. The worker runs each pair as
one input of the token-budget batcher (``worker.pipeline``); the encoder returns logits,
and :func:`encode_scores` applies the model's activation (unless the request asks for raw
scores), orders the documents and writes the result. Pairs are never cached.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import numpy.typing as npt

from schemas import Kind, ModelRequest, RerankRequest, RerankResult, encode_result
from worker.cache import Hit
from worker.encoder import Encoder, Prepared
from worker.kinds.base import Finished, ModelKind, Pieces, Tokenizing, per_request
from worker.publish import within_limit
from worker.tokenization import Tokenized

__all__ = ["ACTIVATIONS", "RERANK", "RerankKind", "activate", "encode_scores", "order_by_score"]

# The activations sentence-transformers' CrossEncoder configs name (torch.nn modules, by
# dotted path), as numpy functions on float32 logits.
ACTIVATIONS: dict[str, Callable[[npt.NDArray[np.float32]], npt.NDArray[np.float32]]] = {
    "sigmoid": lambda x: (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32),
    "identity": lambda x: x,
    "tanh": lambda x: np.tanh(x.astype(np.float64)).astype(np.float32),
}


def activate(name: str, logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    return ACTIVATIONS[name](logits)


def order_by_score(scores: npt.NDArray[np.float32], top_n: int | None) -> tuple[int, ...]:
    """Document indices by score, highest first, equal scores lower index first, cut to
    ``top_n`` (all when None)."""
    order = np.argsort(-scores.astype(np.float64), kind="stable")
    return tuple(int(i) for i in order[:top_n])


def encode_scores(
    request: RerankRequest,
    logits: npt.NDArray[np.float32],
    tokens: Sequence[int],
    model: str,
    activation: str,
    max_bytes: int,
    requested_ms: int | None = None,
) -> bytes:
    """The rerank result message for ``logits`` (one per document, shape (n,) or (n, 1));
    a ``result_too_large`` error if it would exceed ``max_bytes``."""
    raw = np.ascontiguousarray(logits.reshape(-1), dtype=np.float32)
    scores = raw if request.raw_scores else activate(activation, raw)
    order = order_by_score(scores, request.top_n)
    result = RerankResult(
        id=request.id,
        model=model,
        scores=np.ascontiguousarray(scores, dtype="<f4").tobytes(),
        order=order,
        tokens=tuple(tokens),
        documents=tuple(request.documents[i] for i in order) if request.return_documents else None,
        requested_ms=requested_ms if requested_ms else None,  # 0: no timestamp known
        meta=request.meta,
    )
    return within_limit(
        encode_result(result),
        max_bytes,
        "send fewer documents per request, or leave return_documents off",
        request.id,
        None,
        request.meta,
    )


class RerankKind(ModelKind):
    kind = Kind.RERANK
    input_name = "(query, document) pair"

    async def tokenize(self, requests: Sequence[ModelRequest], call: Tokenizing) -> list[Pieces]:
        model = call.model
        pairs = [
            (request.query, document)
            for request in requests
            if isinstance(request, RerankRequest)
            for document in request.documents
        ]
        encode_pairs = partial(model.tokenizer.encode_pairs, pairs, call.direction)
        scored = await call.offload(encode_pairs, sum(len(q) + len(d) for q, d in pairs))
        return per_request(requests, list(scored))

    def segments(self, pieces: Sequence[Tokenized | Hit]) -> list[int] | None:
        return [piece.segment or 0 for piece in pieces if isinstance(piece, Tokenized)]

    def prepare(
        self, encoder: Encoder, ids: Sequence[Sequence[int]], segments: Callable[[], list[int]]
    ) -> Prepared:
        return encoder.prepare(ids, segments())

    def result(self, job: Finished, max_bytes: int) -> bytes:
        request, model = job.request, job.model
        assert isinstance(request, RerankRequest)
        return encode_scores(
            request,
            job.vectors,
            job.tokens,
            model.name,
            model.activation,
            max_bytes,
            requested_ms=job.record.timestamp_ms,
        )


RERANK = RerankKind()
