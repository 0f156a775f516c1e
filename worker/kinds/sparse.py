"""The sparse kind: texts become term weights (SPLADE-style sparse encoders).

The encoder (``worker.encoder.sparse``) returns each text's vocabulary-sized weight row;
:func:`sparsify` keeps its nonzero weights (or, with ``top_k`` or the model's
``max_active_dims``, only the largest that many), as sentence-transformers'
``SparseEncoder.encode`` does, and the result carries them as ascending vocabulary ids and
float32 weights. Prompts work as for embeddings (a SparseEncoder folder names ``query`` and
``document``); weights are never cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np
import numpy.typing as npt

from schemas import Kind, ModelRequest, SparseRequest, SparseResult, encode_result
from worker.kinds.base import Finished, ModelKind, Pieces, Tokenizing, per_request
from worker.publish import within_limit

__all__ = ["SPARSE", "SparseKind", "encode_weights", "sparsify"]


def sparsify(
    rows: npt.NDArray[np.float32], top_k: int | None
) -> tuple[list[int], npt.NDArray[np.uint32], npt.NDArray[np.float32]]:
    """Per row its count of kept weights, and all rows' vocabulary ids (ascending within a
    row) and weights, concatenated: the nonzero weights, or the ``top_k`` largest of them."""
    counts: list[int] = []
    ids: list[npt.NDArray[np.intp]] = []
    for row in rows:
        keep = np.flatnonzero(row > 0)
        if top_k is not None and keep.size > top_k:
            # The top_k largest; equal weights: the lower id first (a stable order).
            order = np.argsort(-row[keep], kind="stable")[:top_k]
            keep = np.sort(keep[order])
        counts.append(int(keep.size))
        ids.append(keep)
    flat = np.concatenate(ids) if ids else np.empty(0, dtype=np.intp)
    starts = np.repeat(np.arange(len(rows)), counts)
    return counts, flat.astype("<u4"), rows[starts, flat].astype("<f4")


def encode_weights(
    request: SparseRequest,
    rows: npt.NDArray[np.float32],
    tokens: Sequence[int],
    model: str,
    top_k: int | None,
    max_bytes: int,
    requested_ms: int | None = None,
) -> bytes:
    """The sparse result message for ``rows`` (one weight row per input); a
    ``result_too_large`` error if it would exceed ``max_bytes``."""
    counts, ids, weights = sparsify(rows, request.top_k or top_k)
    result = SparseResult(
        id=request.id,
        model=model,
        vocab=int(rows.shape[1]),
        counts=tuple(counts),
        indices=ids.tobytes(),
        values=weights.tobytes(),
        tokens=tuple(tokens),
        requested_ms=requested_ms if requested_ms else None,  # 0: no timestamp known
        keys=request.keys,
        meta=request.meta,
    )
    return within_limit(
        encode_result(result),
        max_bytes,
        "send fewer inputs per request, or ask for fewer weights with top_k",
        request.id,
        request.keys,
        request.meta,
    )


class SparseKind(ModelKind):
    kind = Kind.SPARSE
    input_name = "input"

    async def tokenize(self, requests: Sequence[ModelRequest], call: Tokenizing) -> list[Pieces]:
        model = call.model
        texts = [
            model.prompt_for(request) + text
            for request in requests
            if isinstance(request, SparseRequest)
            for text in request.inputs
        ]
        encode = partial(model.tokenizer.encode, texts, call.direction)
        return per_request(requests, list(await call.offload(encode, sum(map(len, texts)))))

    def result(self, job: Finished, max_bytes: int) -> bytes:
        request = job.request
        assert isinstance(request, SparseRequest)
        return encode_weights(
            request,
            job.vectors,
            job.tokens,
            job.model.name,
            job.model.max_active_dims,
            max_bytes,
            requested_ms=job.record.timestamp_ms,
        )


SPARSE = SparseKind()
