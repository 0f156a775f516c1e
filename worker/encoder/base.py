"""The encoder interface the pipeline depends on (no torch here)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["Encoder", "EncoderOutOfMemoryError", "ModelInfo", "Prepared"]


class EncoderOutOfMemoryError(Exception):
    """A batch did not fit in the device's memory: the same inputs in smaller batches may.

    Encoders raise it in place of their framework's own error (torch's OutOfMemoryError, a
    CPU allocation failure), so that the pipeline can tell "too big" from "broken" without
    importing the framework.
    """


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    path: Path
    dim: int
    max_seq_length: int
    pooling: str
    dtype: str
    device: str
    compiled: bool = False
    quantization: str = "none"
    memory_bytes: int = 0
    include_prompt: bool = True
    """False: the prompt's tokens are left out of the pooling (``Prepared.pool_mask``)."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """A padded batch, ready for the device: token ids and attention mask, (rows, longest),
    and for pairs (a cross-encoder's (query, document)) their token type ids."""

    ids: npt.NDArray[np.int64]
    mask: npt.NDArray[np.int64]
    types: npt.NDArray[np.int64] | None = None
    """Token type ids (0: first text, 1: second text); None: all 0 (single texts)."""
    pool_mask: npt.NDArray[np.int64] | None = None
    """The positions pooled, where they differ from ``mask`` (a model that leaves the
    prompt's tokens out of its pooling); None: ``mask``."""

    @property
    def rows(self) -> int:
        return int(self.ids.shape[0])

    @property
    def padded_tokens(self) -> int:
        return int(self.ids.size)

    @classmethod
    def pad(
        cls,
        batch: Sequence[Sequence[int]],
        pad_id: int,
        segments: Sequence[int] | None = None,
        pooled_from: Sequence[int] | None = None,
    ) -> Prepared:
        """``batch`` right-padded with ``pad_id`` to its longest sequence, with its mask.
        ``segments``: per sequence, the length of its first segment (a pair's query part,
        special tokens included); the tokens after it get type id 1, as a pair's second
        text (padding keeps type 0). ``pooled_from``: per sequence, how many leading
        tokens (a prompt's) the pooling leaves out."""
        longest = max(len(ids) for ids in batch)
        ids = np.full((len(batch), longest), pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), longest), dtype=np.int64)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        if pooled_from is not None:
            pool_mask = mask.copy()
            for row, skip in enumerate(pooled_from):
                pool_mask[row, :skip] = 0
            return cls(ids, mask, pool_mask=pool_mask)
        if segments is None:
            return cls(ids, mask)
        types = np.zeros((len(batch), longest), dtype=np.int64)
        for row, (seq, first) in enumerate(zip(batch, segments, strict=True)):
            types[row, first : len(seq)] = 1
        return cls(ids, mask, types)


class Encoder(Protocol):
    info: ModelInfo

    def prepare(
        self,
        batch: Sequence[Sequence[int]],
        segments: Sequence[int] | None = None,
        pooled_from: Sequence[int] | None = None,
    ) -> Prepared:
        """Pad a batch into arrays; cheap, called on the event loop while the device works.
        ``segments``: for pairs, each sequence's first-segment length; ``pooled_from``: for
        a model that pools without the prompt, each sequence's prompt length (see
        :meth:`Prepared.pad`); None for single texts."""
        ...

    def run(self, prepared: Prepared) -> npt.NDArray[np.float32]:
        """Pooled, unnormalized float32 embeddings, one row per prepared sequence (a
        cross-encoder: its logits, one column).

        Blocking and not thread-safe: the pipeline calls it from one dedicated thread.
        Raises :class:`EncoderOutOfMemoryError` when the batch does not fit in memory.
        """
        ...

    def encode(self, batch: Sequence[Sequence[int]]) -> npt.NDArray[np.float32]:
        """Pooled, unnormalized float32 embeddings, one row per token-id sequence.

        Blocking and not thread-safe: the pipeline calls it from one dedicated thread.
        """
        ...
