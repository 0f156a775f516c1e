"""The torch cross-encoder: a Hugging Face sequence classifier with one label (a reranker in
sentence-transformers' ``CrossEncoder`` layout), scoring (query, document) pairs.

It reuses :class:`~worker.encoder.torch_backend.TorchEncoder` whole (variants, dtype,
compilation, quantization, out-of-memory handling); only the model class, the output (one
logit per pair, before the activation: requests may ask for raw scores) and the length
limit differ. The activation is applied when results are written (``worker.rerank``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification

from worker.encoder.folder import ModelFolder
from worker.encoder.models import read_activation
from worker.encoder.torch_backend import TorchEncoder

__all__ = ["TorchCrossEncoder"]


class TorchCrossEncoder(TorchEncoder):
    """Rows of one column: each pair's logit, float32. ``info``: dim 1, pooling ``none``."""

    def __init__(self, model_dir: Path, name: str, **options: Any) -> None:
        labels = _num_labels(model_dir)
        if labels != 1:
            raise ValueError(
                f"{model_dir}: a reranker must have one label (a relevance score); "
                f"its config.json has {labels}"
            )
        self.activation = read_activation(model_dir)
        options.pop("pooling", None)
        super().__init__(model_dir, name, pooling="none", **options)

    def _read_folder(self) -> ModelFolder:
        """A cross-encoder's folder has no embedding modules: nothing after the logits."""
        return ModelFolder(pooling="none", modules=("Transformer",))

    def _load_module(self, dtype: torch.dtype) -> torch.nn.Module:
        model: torch.nn.Module = AutoModelForSequenceClassification.from_pretrained(
            str(self._model_dir), dtype=dtype
        )
        return model

    def _model_limit(self, config: Any) -> int:
        """The tokenizer's ``model_max_length`` (what CrossEncoder truncates at), capped by
        the model's position embeddings."""
        positions = int(getattr(config, "max_position_embeddings", 512))
        path = self._model_dir / "tokenizer_config.json"
        if path.is_file():
            value = json.loads(path.read_text()).get("model_max_length")
            if isinstance(value, int) and 0 < value < positions:
                return value
        return positions

    def _pooling_mode(self, pooling: str) -> str:
        return "none"

    def _output_dim(self, config: Any) -> int:
        return 1

    def _rows(
        self, forward: Any, inputs: dict[str, torch.Tensor], pooled: torch.Tensor | None
    ) -> torch.Tensor:
        logits: torch.Tensor = forward(**inputs).logits
        return logits.float()


def _num_labels(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    labels = config.get("num_labels")
    if isinstance(labels, int):
        return labels
    id2label = config.get("id2label")
    return len(id2label) if isinstance(id2label, dict) else 2
