"""What :meth:`EmbedClient.embed_sparse <producer_sdk.EmbedClient.embed_sparse>` returns: a
sparse (SPLADE-style) encoder's term weights per text.

    weights = await client.embed_sparse(["what is kafka?"], model="splade")
    indices, values = weights[0]          # uint32 vocabulary ids (ascending), float32 weights
    weights.as_dicts()                    # [{id: weight, ...}] per text
    weights.to_dense()                    # float32 (texts, vocab), for small vocabularies

The wire result is in ``schemas/README.md``, "Sparse embeddings".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from schemas import SparseResult

__all__ = ["SparseEmbeddings", "SparseVector"]


class SparseVector(NamedTuple):
    """One text's nonzero term weights: vocabulary ids, ascending, and their weights."""

    indices: npt.NDArray[np.uint32]
    values: npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class SparseEmbeddings:
    """The term weights of one embed_sparse call, one :class:`SparseVector` per text in
    the texts' order (CSR-like: ``indptr`` delimits each text's entries of ``indices`` and
    ``values``)."""

    indptr: npt.NDArray[np.int64]
    indices: npt.NDArray[np.uint32]
    values: npt.NDArray[np.float32]
    vocab: int
    """The vocabulary's size: the vectors' dimension."""
    tokens: tuple[int, ...]
    """Tokens per text after truncation, special tokens included."""
    model: str

    @classmethod
    def from_result(cls, result: SparseResult) -> SparseEmbeddings:
        indptr = np.zeros(len(result.counts) + 1, dtype=np.int64)
        np.cumsum(result.counts, out=indptr[1:])
        return cls(
            indptr=indptr,
            indices=np.frombuffer(result.indices, dtype="<u4").astype(np.uint32),
            values=np.frombuffer(result.values, dtype="<f4").astype(np.float32),
            vocab=result.vocab,
            tokens=result.tokens,
            model=result.model,
        )

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> SparseVector:
        if not -len(self) <= index < len(self):
            raise IndexError(f"text {index} of {len(self)}")
        index %= len(self)
        start, stop = int(self.indptr[index]), int(self.indptr[index + 1])
        return SparseVector(self.indices[start:stop], self.values[start:stop])

    def as_dicts(self) -> list[dict[int, float]]:
        """Per text, ``{vocabulary id: weight}`` (Python ints and floats)."""
        return [
            dict(zip(ids.tolist(), weights.tolist(), strict=True))
            for ids, weights in (self[i] for i in range(len(self)))
        ]

    def to_dense(self) -> npt.NDArray[np.float32]:
        """float32 (texts, vocab): zero where a text has no weight."""
        dense = np.zeros((len(self), self.vocab), dtype=np.float32)
        rows = np.repeat(np.arange(len(self)), np.diff(self.indptr))
        dense[rows, self.indices] = self.values
        return dense
