"""Reranking, the parts that are not torch: which kind a model is, its activation, and how
a reranker's logits become a rerank result.

A cross-encoder (sentence-transformers' ``CrossEncoder`` layout: a Hugging Face sequence
classifier with one label) scores (query, document) pairs. The worker runs each pair as
one input of the token-budget batcher (``worker.pipeline``); the encoder returns logits,
and :func:`encode_scores` applies the model's activation (unless the request asks for raw
scores), orders the documents and writes the result.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas import EmbedRequest, ErrorCode, ErrorInfo, Request, RerankRequest, RerankResult
from schemas import encode_result as encode_any
from worker.publish import encode_error

__all__ = [
    "ACTIVATIONS",
    "EMBED",
    "KINDS",
    "RERANK",
    "activate",
    "detect_kind",
    "encode_scores",
    "input_count",
    "order_by_score",
    "read_activation",
    "request_kind",
    "wrong_kind",
]

EMBED = "embed"
RERANK = "rerank"
KINDS = (EMBED, RERANK)

# The activations sentence-transformers' CrossEncoder configs name (torch.nn modules, by
# dotted path), as numpy functions on float32 logits.
ACTIVATIONS: dict[str, Callable[[npt.NDArray[np.float32]], npt.NDArray[np.float32]]] = {
    "sigmoid": lambda x: (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32),
    "identity": lambda x: x,
    "tanh": lambda x: np.tanh(x.astype(np.float64)).astype(np.float32),
}
_TORCH_NAMES = {"Sigmoid": "sigmoid", "Identity": "identity", "Tanh": "tanh"}
_TORCH_MODULES = ("torch.nn", "torch.nn.modules.activation", "torch.nn.modules.linear")


def detect_kind(model_dir: Path) -> str:
    """``rerank`` for a sequence classifier (``config.json`` ``architectures`` ending in
    ``ForSequenceClassification``: a cross-encoder), else ``embed``."""
    path = model_dir / "config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    architectures = config.get("architectures") or []
    if any(isinstance(a, str) and a.endswith("ForSequenceClassification") for a in architectures):
        return RERANK
    return EMBED


def read_activation(model_dir: Path) -> str:
    """The activation a reranker's scores go through, as sentence-transformers reads it:
    ``config.json`` ``sentence_transformers.activation_fn`` (or the older
    ``sbert_ce_default_activation_function``), a dotted torch.nn path; none: sigmoid (the
    default for one label). Raises ValueError naming a path it does not support."""
    config = json.loads((model_dir / "config.json").read_text())
    return parse_activation(config)


def parse_activation(config: dict[str, Any]) -> str:
    """See :func:`read_activation` (``config``: the parsed ``config.json``)."""
    section = config.get("sentence_transformers")
    path = section.get("activation_fn") if isinstance(section, dict) else None
    if path is None:
        path = config.get("sbert_ce_default_activation_function")
    if path is None:
        return "sigmoid"
    if isinstance(path, str):
        module, _, name = path.rpartition(".")
        if module in _TORCH_MODULES and name in _TORCH_NAMES:
            return _TORCH_NAMES[name]
    supported = ", ".join(f"torch.nn.{name}" for name in _TORCH_NAMES)
    raise ValueError(f"unsupported reranker activation {path!r}; supported: {supported}")


def activate(name: str, logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    return ACTIVATIONS[name](logits)


def request_kind(request: Request) -> str:
    return RERANK if isinstance(request, RerankRequest) else EMBED


def input_count(request: Request) -> int:
    """The inputs a request puts in flight: its texts, or its documents (pairs)."""
    return len(request.documents if isinstance(request, RerankRequest) else request.inputs)


def wrong_kind(model: str, kind: str) -> ErrorInfo:
    """The ``invalid_request`` for a request of the other kind than ``model``'s."""
    if kind == RERANK:
        message = f"model {model} is a reranker (kind rerank): send rerank requests"
    else:
        message = f"model {model} is an embedding model (kind embed): send embed requests"
    return ErrorInfo(ErrorCode.INVALID_REQUEST, message)


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
    encoded = encode_any(result)
    if len(encoded) <= max_bytes:
        return encoded
    error = ErrorInfo(
        ErrorCode.RESULT_TOO_LARGE,
        f"result of {len(encoded)} bytes exceeds max_result_bytes {max_bytes}; "
        "send fewer documents per request, or leave return_documents off",
    )
    return encode_error(request.id, error, None, request.meta)


def request_keys(request: Request) -> tuple[str | int, ...] | None:
    return request.keys if isinstance(request, EmbedRequest) else None
