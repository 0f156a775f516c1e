"""The torch encoder: a Hugging Face transformer plus sentence-transformers-style pooling.

The only module of the worker that imports torch and transformers. It is driven from one
dedicated thread; torch releases the GIL inside its kernels, so the event loop keeps
fetching, heartbeating and publishing while a batch runs.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from transformers import AutoModel
from transformers.utils import logging as hf_logging

from worker.encoder.base import ModelInfo
from worker.encoder.pooling import pool, read_pooling_mode

__all__ = ["TorchEncoder", "resolve_device", "resolve_dtype"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        # fp16 on GPUs (fast everywhere there); fp32 on CPUs until measured otherwise.
        return torch.float16 if device.type == "cuda" else torch.float32
    return _DTYPES[dtype]


def _max_seq_length(model_dir: Path, config_limit: int) -> int:
    """sentence-transformers' max_seq_length when present, else the model's positions."""
    st_config = model_dir / "sentence_bert_config.json"
    if st_config.is_file():
        value = json.loads(st_config.read_text()).get("max_seq_length")
        if isinstance(value, int) and value > 0:
            return min(value, config_limit)
    return config_limit


class TorchEncoder:
    def __init__(
        self,
        model_dir: Path,
        name: str,
        *,
        device: str = "auto",
        dtype: str = "float32",
        max_seq_length: int | None = None,
        pad_id: int = 0,
        threads: int | None = None,
    ) -> None:
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # not a log line
        if threads:
            torch.set_num_threads(threads)
        self._device = resolve_device(device)
        self._dtype = resolve_dtype(dtype, self._device)
        model = AutoModel.from_pretrained(str(model_dir), dtype=self._dtype)
        self._model = model.to(self._device).eval()
        config = self._model.config
        positions = int(getattr(config, "max_position_embeddings", 512))
        limit = _max_seq_length(model_dir, positions)
        self._pooling = read_pooling_mode(model_dir)
        self._pad_id = pad_id
        self._uses_token_types = "token_type_ids" in inspect.signature(model.forward).parameters
        self.info = ModelInfo(
            name=name,
            path=model_dir,
            dim=int(config.hidden_size),
            max_seq_length=min(limit, max_seq_length or limit),
            pooling=self._pooling,
            dtype=str(self._dtype).removeprefix("torch."),
            device=str(self._device),
        )

    def encode(self, batch: Sequence[Sequence[int]]) -> npt.NDArray[np.float32]:
        longest = max(len(ids) for ids in batch)
        ids = np.full((len(batch), longest), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), longest), dtype=np.int64)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        input_ids = torch.from_numpy(ids).to(self._device)
        attention = torch.from_numpy(mask).to(self._device)
        kwargs = {"input_ids": input_ids, "attention_mask": attention}
        if self._uses_token_types:
            kwargs["token_type_ids"] = torch.zeros_like(input_ids)
        with torch.inference_mode():
            hidden = self._model(**kwargs).last_hidden_state
            pooled = pool(hidden, attention, self._pooling)
        out: npt.NDArray[np.float32] = pooled.cpu().numpy().astype(np.float32, copy=False)
        return out
