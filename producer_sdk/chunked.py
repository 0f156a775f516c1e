"""``ChunkedEmbeddings``: the ragged result of ``embed(texts, chunking=...)``, per input its
chunks' vectors, character spans and token counts (``schemas/README.md``, "Chunking").

    result = await client.embed(documents, chunking=Chunking(max_tokens=256, overlap_tokens=32))
    for document, chunks in zip(documents, result):
        for vector, (start, end) in zip(chunks.vectors, chunks.spans):
            index(vector, document[start:end])
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from producer_sdk.encodings import Embeddings
from schemas import Encoding
from schemas.v1 import Span

__all__ = ["ChunkedEmbeddings", "InputChunks"]


@dataclass(frozen=True, slots=True)
class InputChunks:
    """One input's chunks, in text order."""

    vectors: npt.NDArray[Any]
    """(chunks, dim) in the result's encoding (as :class:`Embeddings.vectors`)."""
    spans: tuple[Span, ...]
    """Per chunk, ``[start, end)`` in the input: ``text[start:end]`` is the chunk's text."""
    tokens: tuple[int, ...]
    """Per chunk, its tokens (special and prompt tokens included)."""
    scales: npt.NDArray[np.float32] | None = None
    """int8 only: one scale per chunk vector."""

    def __len__(self) -> int:
        return len(self.spans)


@dataclass(frozen=True, slots=True)
class ChunkedEmbeddings:
    """Every chunk of every input: flat (``vectors``, ``spans``, ``tokens``, one entry per
    chunk, inputs in order) and per input (``len()`` is the number of inputs;
    ``result[i]`` is input ``i``'s :class:`InputChunks`)."""

    vectors: npt.NDArray[Any]
    """(all chunks, dim) in ``encoding``."""
    spans: tuple[Span, ...]
    tokens: tuple[int, ...]
    chunks: tuple[int, ...]
    """Per input, how many chunks it has (each >= 1)."""
    encoding: Encoding
    dim: int
    scales: npt.NDArray[np.float32] | None
    model: str

    @classmethod
    def from_embeddings(cls, result: Embeddings) -> ChunkedEmbeddings:
        """The chunks of a result of a request with ``chunking`` and pooling ``none``."""
        if result.chunks is None or result.spans is None:
            raise ValueError("the result has no chunks: its request had no chunking")
        if len(result.tokens) != sum(result.chunks):
            raise ValueError("the result has one vector per input, not per chunk (mean pooling)")
        return cls(
            vectors=result.vectors,
            spans=result.spans,
            tokens=result.tokens,
            chunks=result.chunks,
            encoding=result.encoding,
            dim=result.dim,
            scales=result.scales,
            model=result.model,
        )

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, index: int) -> InputChunks:
        if not -len(self.chunks) <= index < len(self.chunks):
            raise IndexError(f"input {index} of {len(self.chunks)}")
        index %= len(self.chunks)
        start = sum(self.chunks[:index])
        end = start + self.chunks[index]
        return InputChunks(
            vectors=self.vectors[start:end],
            spans=self.spans[start:end],
            tokens=self.tokens[start:end],
            scales=None if self.scales is None else self.scales[start:end],
        )

    def __iter__(self) -> Iterator[InputChunks]:
        return (self[index] for index in range(len(self.chunks)))

    @property
    def inputs(self) -> npt.NDArray[np.int64]:
        """Per chunk, the index of the input it belongs to."""
        return np.repeat(np.arange(len(self.chunks), dtype=np.int64), self.chunks)
