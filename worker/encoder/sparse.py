"""The torch sparse encoder: a masked-LM transformer with SPLADE pooling
(:mod:`worker.encoder.sparse_folder` reads the folder), one weight per vocabulary term.

It reuses :class:`~worker.encoder.torch_backend.TorchEncoder` whole (variants, dtype,
compilation, quantization, out-of-memory handling), as the cross-encoder does; the model
class (``AutoModelForMaskedLM``), the output and the length limit differ. Each row is the
text's dense vocabulary-sized weight vector, as sentence-transformers' ``SparseEncoder``
computes it before it keeps the nonzero entries; ``worker.kinds.sparse`` keeps a text's
nonzero (or its ``max_active_dims`` largest) weights when the result is written.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForMaskedLM

from worker.encoder.folder import ModelFolder, usable_positions
from worker.encoder.sparse_folder import SparseFolder, read_sparse
from worker.encoder.torch_backend import TorchEncoder

__all__ = ["TorchSparseEncoder", "splade"]


def splade(
    logits: torch.Tensor, mask: torch.Tensor, strategy: str, activation: str
) -> torch.Tensor:
    """SPLADE pooling of ``logits`` (batch, tokens, vocabulary) over the positions ``mask``
    holds: ``log(1 + relu(logit))`` (twice ``log1p`` for ``log1p_relu``), then the max or
    the sum over tokens, in float32."""
    weights = torch.log1p(torch.relu(logits.float() * mask.unsqueeze(-1).float()))
    if activation == "log1p_relu":
        weights = torch.log1p(weights)
    return weights.amax(dim=1) if strategy == "max" else weights.sum(dim=1)


class TorchSparseEncoder(TorchEncoder):
    """Rows of the vocabulary's width: each text's term weights, float32. ``info``: dim the
    vocabulary size, pooling ``splade_max`` or ``splade_sum``."""

    def __init__(self, model_dir: Any, name: str, **options: Any) -> None:
        self.sparse: SparseFolder = read_sparse(model_dir)
        options.pop("pooling", None)
        super().__init__(model_dir, name, pooling="none", **options)

    def _read_folder(self) -> ModelFolder:
        """Nothing after the pooling: the weights are the output."""
        return ModelFolder(pooling="none", modules=("Transformer",))

    def _load_module(self, dtype: torch.dtype) -> torch.nn.Module:
        model: torch.nn.Module = AutoModelForMaskedLM.from_pretrained(
            str(self._model_dir), dtype=dtype
        )
        return model

    def _model_limit(self, config: Any) -> int:
        usable = usable_positions(config.to_dict())
        limits = [value for value in (self.sparse.max_seq_length, usable) if value]
        return min(limits) if limits else 512

    def _pooling_mode(self, pooling: str) -> str:
        return f"splade_{self.sparse.strategy}"

    def _output_dim(self, config: Any) -> int:
        return int(config.vocab_size)

    def _rows(
        self, forward: Any, inputs: dict[str, torch.Tensor], pooled: torch.Tensor | None
    ) -> torch.Tensor:
        logits: torch.Tensor = forward(**inputs).logits
        mask = inputs["attention_mask"] if pooled is None else pooled
        return splade(logits, mask, self.sparse.strategy, self.sparse.activation)
