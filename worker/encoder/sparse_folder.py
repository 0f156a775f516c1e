"""A sparse encoder's folder (sentence-transformers' ``SparseEncoder`` layout), read without
torch: a masked-LM transformer (``MLMTransformer``, or version 6's ``Transformer`` with
``transformer_task`` ``fill-mask``) and ``SpladePooling``.

SPLADE turns each token position's masked-LM logits into term weights,
``log(1 + relu(logit))`` (``log1p_relu`` takes ``log1p`` once more), and pools them over the
text's tokens by ``max`` (SPLADE v2 and later) or ``sum`` (the first SPLADE): one weight per
vocabulary term, most of them zero. ``max_active_dims`` in
``config_sentence_transformers.json`` keeps only each text's largest weights. Any other
module of a sparse encoder (``SparseAutoEncoder``, ``SparseStaticEmbedding``, a router) is
refused with one line naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.encoder.folder import UnsupportedModelError, length_limit

__all__ = ["SPLADE_ACTIVATIONS", "SPLADE_STRATEGIES", "SparseFolder", "is_sparse", "read_sparse"]

SPLADE_STRATEGIES = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")
_MODULES = ("MLMTransformer", "SpladePooling")


@dataclass(frozen=True, slots=True)
class SparseFolder:
    strategy: str = "max"
    """How term weights pool over a text's tokens: ``max`` or ``sum``."""
    activation: str = "relu"
    """``relu`` (log(1 + relu)), or ``log1p_relu`` (log(1 + log(1 + relu)))."""
    max_active_dims: int | None = None
    """Only the largest this many weights of each text are kept (None: all)."""
    max_seq_length: int | None = None


def is_sparse(model_dir: Path) -> bool:
    """Whether ``model_dir`` is a sentence-transformers sparse encoder (no torch)."""
    return _json(model_dir / "config_sentence_transformers.json").get("model_type") == (
        "SparseEncoder"
    ) or any(str(e.get("type", "")).endswith(".SpladePooling") for e in _modules(model_dir))


def read_sparse(model_dir: Path) -> SparseFolder:
    """The folder's SPLADE settings; UnsupportedModelError for any other module stack."""
    entries = _modules(model_dir)
    names = [str(entry.get("type", "")).rpartition(".")[2] for entry in entries]
    types = [str(entry.get("type", "")) for entry in entries]
    unknown = [t for t, n in zip(types, names, strict=True) if n not in (*_MODULES, "Transformer")]
    if unknown:
        raise UnsupportedModelError(
            f"{model_dir.name}: the sparse encoder module {unknown[0]!r} is not supported; "
            "kembed runs MLMTransformer -> SpladePooling"
        )
    if names[:1] == ["Transformer"]:  # sentence-transformers 6's name for a masked LM
        task = _json(model_dir / "sentence_bert_config.json").get("transformer_task")
        if task != "fill-mask":
            raise UnsupportedModelError(
                f"{model_dir.name}: a sparse encoder's Transformer must be a masked LM "
                f"(transformer_task fill-mask), not {task!r}"
            )
        names[0] = "MLMTransformer"
    if names != list(_MODULES):
        raise UnsupportedModelError(
            f"{model_dir.name}: sparse encoder modules {' -> '.join(names) or 'none'} are not "
            "supported; kembed runs MLMTransformer -> SpladePooling"
        )
    pooling = _json(model_dir / str(entries[1].get("path", "")) / "config.json")
    strategy = pooling.get("pooling_strategy", "max")
    activation = pooling.get("activation_function", "relu")
    if strategy not in SPLADE_STRATEGIES or activation not in SPLADE_ACTIVATIONS:
        raise UnsupportedModelError(
            f"{model_dir.name}: SpladePooling {strategy!r} / {activation!r} is not supported "
            f"(pooling_strategy {', '.join(SPLADE_STRATEGIES)}; activation_function "
            f"{', '.join(SPLADE_ACTIVATIONS)})"
        )
    top = _json(model_dir / "config_sentence_transformers.json").get("max_active_dims")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise UnsupportedModelError(f"{model_dir.name}: max_active_dims must be a positive int")
    return SparseFolder(strategy, activation, top, length_limit(model_dir))


def _modules(model_dir: Path) -> list[dict[str, Any]]:
    path = model_dir / "modules.json"
    value = json.loads(path.read_text()) if path.is_file() else []
    return [entry for entry in value if isinstance(entry, dict)] if isinstance(value, list) else []


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text())
    return value if isinstance(value, dict) else {}
