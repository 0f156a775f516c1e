"""The encoder interface the pipeline depends on (no torch here)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["Encoder", "ModelInfo"]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    path: Path
    dim: int
    max_seq_length: int
    pooling: str
    dtype: str
    device: str


class Encoder(Protocol):
    info: ModelInfo

    def encode(self, batch: Sequence[Sequence[int]]) -> npt.NDArray[np.float32]:
        """Pooled, unnormalized float32 embeddings, one row per token-id sequence.

        Blocking and not thread-safe: the pipeline calls it from one dedicated thread.
        """
        ...
