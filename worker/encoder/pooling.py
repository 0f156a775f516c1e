"""Pooling of token states into one vector, as sentence-transformers' ``Pooling`` module.

The mode comes from the model's ``modules.json`` -> Pooling folder -> ``config.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

__all__ = ["POOLING_MODES", "pool", "read_pooling_mode"]

POOLING_MODES = ("mean", "cls", "max", "lasttoken", "mean_sqrt_len")

_CONFIG_KEYS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
}


def read_pooling_mode(model_dir: Path) -> str:
    """The model's pooling mode; ``mean`` for plain Hugging Face models without one."""
    modules = model_dir / "modules.json"
    if not modules.is_file():
        return "mean"
    for module in json.loads(modules.read_text()):
        if str(module.get("type", "")).endswith("Pooling"):
            config = json.loads((model_dir / module["path"] / "config.json").read_text())
            modes = [mode for key, mode in _CONFIG_KEYS.items() if config.get(key)]
            if len(modes) != 1:
                raise ValueError(f"unsupported pooling configuration {modes or config}")
            return modes[0]
    return "mean"


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
        return hidden[:, 0]
    if mode == "max":
        return hidden.masked_fill(weights == 0, float("-inf")).max(dim=1).values
    if mode == "lasttoken":
        # Right padding: the last real token sits at length - 1.
        last = mask.sum(dim=1).long() - 1
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise ValueError(f"unknown pooling mode {mode!r}; known: {', '.join(POOLING_MODES)}")
