"""Pooling of token states into one vector, as sentence-transformers' ``Pooling`` module.

The mode comes from the model's ``modules.json`` -> Pooling folder -> ``config.json``
(``worker.encoder.folder``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from worker.encoder.folder import POOLING_MODES, read_folder

__all__ = ["POOLING_MODES", "pool", "read_pooling_mode"]


def read_pooling_mode(model_dir: Path) -> str:
    """The model's pooling mode (:func:`worker.encoder.folder.read_folder`); ``mean`` for
    plain Hugging Face models without one."""
    return read_folder(model_dir).pooling


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Pool ``hidden`` (batch, seq, dim) under ``mask`` (batch, seq) into float32 (batch, dim).

    Sums run in float32 whatever the model's dtype, so bf16/fp16 models lose no precision
    to the reduction itself.
    """
    hidden = hidden.float()
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    if mode in ("mean", "mean_sqrt_len"):
        total = (hidden * weights).sum(dim=1)
        count = weights.sum(dim=1).clamp(min=1e-9)
        return total / (count.sqrt() if mode == "mean_sqrt_len" else count)
    if mode == "cls":
        # The first pooled position: 0, or the first after a prompt left out of the pooling.
        first = mask.argmax(dim=1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), first]
    if mode == "max":
        return hidden.masked_fill(weights == 0, float("-inf")).max(dim=1).values
    if mode == "lasttoken":
        # Right padding: the last pooled position (a row with none pools to zeros, as in
        # sentence-transformers).
        seq = mask.shape[1]
        last = seq - 1 - mask.flip(1).argmax(dim=1)
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        return hidden[rows, last] * weights[rows, last]
    raise ValueError(f"unknown pooling mode {mode!r}; known: {', '.join(POOLING_MODES)}")
